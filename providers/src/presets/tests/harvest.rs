//! `preset = "harvest_time_entries"` against an emulation of Harvest's API v2 time entry
//! list: a bearer token with the `Harvest-Account-Id` header the user sets, pages linked by
//! the body's `links.next` (cursor URLs, null on the last page), and OAuth-style
//! `{"error", "error_description"}` errors.

use serde_json::json;
use wiremock::matchers::{header, method, path};
use wiremock::Mock;

use super::*;

const ENTRIES: &str = "/v2/time_entries";
const ACCOUNT: &str = "123456";

fn harvest(server: &MockServer) -> Box<dyn Provider> {
    provider(&format!(
        "preset = \"harvest_time_entries\"\nbase_url = \"{}/v2\"\n\
         headers = {{ \"Harvest-Account-Id\" = \"{ACCOUNT}\" }}\n",
        server.uri()
    ))
}

fn link(server: &MockServer, query: &str) -> Json {
    json!(format!("{}{ENTRIES}?{query}", server.uri()))
}

/// A page as Harvest lists it: the entries, the page counts, and the links.
fn page(server: &MockServer, ids_and_times: &[(u64, &str)], next: Option<&str>) -> Json {
    let entries: Vec<Json> = ids_and_times
        .iter()
        .map(|(id, updated_at)| json!({"id": id, "spent_date": "2024-03-01", "hours": 1.5, "updated_at": updated_at}))
        .collect();
    json!({
        "time_entries": entries,
        "per_page": 2000,
        "total_pages": 3,
        "total_entries": 4,
        "next_page": null,
        "previous_page": null,
        "page": null,
        "links": {
            "first": link(server, "page=1&per_page=2000&ref=first"),
            "next": next.map(|cursor| link(server, &format!("cursor={cursor}&per_page=2000&ref=next_cursor"))),
            "previous": null,
            "last": link(server, "page=3&per_page=2000&ref=last"),
        }
    })
}

#[tokio::test]
async fn harvest_time_entries_follow_links_next_until_it_is_null() {
    let server = MockServer::start().await;
    let bearer = || header("Authorization", format!("Bearer {TOKEN}").as_str());
    let account = || header("Harvest-Account-Id", ACCOUNT);
    Mock::given(method("GET"))
        .and(path(ENTRIES))
        .and(bearer())
        .and(account())
        .and(exact_query(&[]))
        .respond_with(json(page(
            &server,
            &[
                (636709355, "2024-03-02T09:00:00Z"),
                (636708723, "2024-03-01T09:00:00Z"),
            ],
            Some("eyJhZnRlciI6eyJpZCI6MX19"),
        )))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(ENTRIES))
        .and(bearer())
        .and(account())
        .and(exact_query(&[
            ("cursor", "eyJhZnRlciI6eyJpZCI6MX19"),
            ("per_page", "2000"),
            ("ref", "next_cursor"),
        ]))
        .respond_with(json(page(
            &server,
            &[(636708000, "2024-02-01T09:00:00Z")],
            Some("eyJhZnRlciI6eyJpZCI6Mn19"),
        )))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(ENTRIES))
        .and(bearer())
        .and(account())
        .and(exact_query(&[
            ("cursor", "eyJhZnRlciI6eyJpZCI6Mn19"),
            ("per_page", "2000"),
            ("ref", "next_cursor"),
        ]))
        .respond_with(json(page(
            &server,
            &[(636707000, "2024-01-01T09:00:00Z")],
            None,
        )))
        .expect(1)
        .mount(&server)
        .await;

    let walk = walk(harvest(&server).as_ref(), TOKEN, None).await.unwrap();
    assert_eq!(
        walk.ids,
        ["636709355", "636708723", "636708000", "636707000"]
    );
    assert_eq!(walk.pages, 3);
    assert_eq!(
        walk.watermark,
        Some(Watermark::Time(time("2024-03-02T09:00:00Z")))
    );
}

#[tokio::test]
async fn harvest_time_entries_wait_out_retry_after_on_429() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(ENTRIES))
        .respond_with(ResponseTemplate::new(429).insert_header("Retry-After", "1"))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(ENTRIES))
        .and(exact_query(&[]))
        .respond_with(json(page(&server, &[(1, "2024-03-01T09:00:00Z")], None)))
        .mount(&server)
        .await;
    assert_waits_out_429(harvest(&server).as_ref(), TOKEN, &["1"]).await;
    assert_eq!(requests(&server).await, 2);
}

#[tokio::test]
async fn harvest_time_entries_surface_the_error_description_of_a_401() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(ENTRIES))
        .respond_with(ResponseTemplate::new(401).set_body_json(json!({
            "error": "invalid_token",
            "error_description": "The access token provided is expired, revoked, malformed or invalid for other reasons."
        })))
        .expect(1)
        .mount(&server)
        .await;
    let message = unauthorized(harvest(&server).as_ref(), "wrong").await;
    assert!(message.contains("invalid_token"), "{message}");
    assert!(message.contains("expired, revoked, malformed"), "{message}");
}

#[tokio::test]
async fn harvest_time_entries_incremental_run_sends_updated_since() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(ENTRIES))
        .and(header("Harvest-Account-Id", ACCOUNT))
        .and(exact_query(&[("updated_since", "2024-03-01T15:00:00Z")]))
        .respond_with(json(page(&server, &[(9, "2024-03-06T11:30:00Z")], None)))
        .expect(1)
        .mount(&server)
        .await;
    let walk = walk(
        harvest(&server).as_ref(),
        TOKEN,
        Some(time("2024-03-01T15:00:00Z")),
    )
    .await
    .unwrap();
    assert_eq!(walk.ids, ["9"]);
    assert_eq!(
        walk.watermark,
        Some(Watermark::Time(time("2024-03-06T11:30:00Z")))
    );
}
