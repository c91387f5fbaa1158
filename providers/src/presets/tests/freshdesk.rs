//! `preset = "freshdesk_tickets"` against an emulation of Freshdesk's API v2 ticket list:
//! basic auth with the API key as the user and `X` as the password, `page`/`per_page`
//! pages linked by a `Link` header that the last page lacks, the `X-Ratelimit-*` headers,
//! and `{"code", "message"}` errors.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde_json::json;
use wiremock::matchers::{header, method, path};
use wiremock::Mock;

use super::*;

const TICKETS: &str = "/api/v2/tickets";
/// A connection's token: the API key and Freshdesk's dummy password.
const KEY_TOKEN: &str = "Abc123ApiKey:X";
/// What a full pass sends: the preset's `incremental.start`.
const START: &str = "2000-01-01T00:00:00Z";

fn freshdesk(server: &MockServer) -> Box<dyn Provider> {
    provider(&format!(
        "preset = \"freshdesk_tickets\"\nbase_url = \"{}\"\n",
        server.uri()
    ))
}

fn basic() -> String {
    format!("Basic {}", STANDARD.encode(KEY_TOKEN))
}

fn tickets(ids_and_times: &[(u64, &str)]) -> Json {
    ids_and_times
        .iter()
        .map(|(id, updated_at)| {
            json!({"id": id, "subject": "Printer on fire", "status": 2, "updated_at": updated_at})
        })
        .collect()
}

fn query(since: &str, page: Option<&str>) -> Vec<(&'static str, String)> {
    let mut query = vec![
        ("order_by", "updated_at".to_string()),
        ("order_type", "desc".to_string()),
        ("per_page", "100".to_string()),
        ("updated_since", since.to_string()),
    ];
    if let Some(page) = page {
        query.push(("page", page.to_string()));
    }
    query
}

fn matcher(query: &[(&'static str, String)]) -> ExactQuery {
    let pairs: Vec<(&str, &str)> = query.iter().map(|(k, v)| (*k, v.as_str())).collect();
    exact_query(&pairs)
}

/// An answer with Freshdesk's rate-limit headers and, unless it is the last page, the
/// link to page `next`.
fn answer(server: &MockServer, body: Json, next: Option<u32>) -> ResponseTemplate {
    let answer = json(body)
        .insert_header("X-Ratelimit-Total", "700")
        .insert_header("X-Ratelimit-Remaining", "699")
        .insert_header("X-Ratelimit-Used-CurrentRequest", "1");
    match next {
        Some(page) => answer.insert_header(
            "Link",
            format!(
                "<{}{TICKETS}?order_by=updated_at&order_type=desc&page={page}&per_page=100&updated_since={START}>;rel=\"next\"",
                server.uri()
            )
            .as_str(),
        ),
        None => answer,
    }
}

#[tokio::test]
async fn freshdesk_tickets_follow_the_link_header_until_the_last_page() {
    let server = MockServer::start().await;
    let auth = || header("Authorization", basic().as_str());
    Mock::given(method("GET"))
        .and(path(TICKETS))
        .and(auth())
        .and(matcher(&query(START, None)))
        .respond_with(answer(
            &server,
            tickets(&[(20, "2024-03-02T09:00:00Z"), (19, "2024-03-01T09:00:00Z")]),
            Some(2),
        ))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(TICKETS))
        .and(auth())
        .and(matcher(&query(START, Some("2"))))
        .respond_with(answer(
            &server,
            tickets(&[(18, "2024-02-20T09:00:00Z")]),
            Some(3),
        ))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(TICKETS))
        .and(auth())
        .and(matcher(&query(START, Some("3"))))
        .respond_with(answer(
            &server,
            tickets(&[(3, "2023-01-20T09:00:00Z")]),
            None,
        ))
        .expect(1)
        .mount(&server)
        .await;

    let walk = walk(freshdesk(&server).as_ref(), KEY_TOKEN, None)
        .await
        .unwrap();
    assert_eq!(walk.ids, ["20", "19", "18", "3"]);
    assert_eq!(walk.pages, 3);
    assert_eq!(
        walk.watermark,
        Some(Watermark::Time(time("2024-03-02T09:00:00Z")))
    );
}

#[tokio::test]
async fn freshdesk_tickets_wait_out_retry_after_on_429() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(TICKETS))
        .respond_with(
            ResponseTemplate::new(429)
                .insert_header("Retry-After", "1")
                .insert_header("X-Ratelimit-Total", "700")
                .insert_header("X-Ratelimit-Remaining", "0")
                .insert_header("X-Ratelimit-Used-CurrentRequest", "1"),
        )
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(TICKETS))
        .and(matcher(&query(START, None)))
        .respond_with(answer(
            &server,
            tickets(&[(1, "2024-03-01T09:00:00Z")]),
            None,
        ))
        .mount(&server)
        .await;
    assert_waits_out_429(freshdesk(&server).as_ref(), KEY_TOKEN, &["1"]).await;
    assert_eq!(requests(&server).await, 2);
}

#[tokio::test]
async fn freshdesk_tickets_surface_the_code_and_message_of_a_401() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(TICKETS))
        .respond_with(ResponseTemplate::new(401).set_body_json(json!({
            "code": "invalid_credentials",
            "message": "You have to be logged in to perform this action."
        })))
        .expect(1)
        .mount(&server)
        .await;
    let message = unauthorized(freshdesk(&server).as_ref(), "wrong-key:X").await;
    assert!(message.contains("invalid_credentials"), "{message}");
    assert!(message.contains("You have to be logged in"), "{message}");
}

#[tokio::test]
async fn freshdesk_tickets_incremental_run_sends_updated_since() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(TICKETS))
        .and(header("Authorization", basic().as_str()))
        .and(matcher(&query("2024-03-01T15:00:00Z", None)))
        .respond_with(answer(
            &server,
            tickets(&[(21, "2024-03-03T08:00:00Z")]),
            None,
        ))
        .expect(1)
        .mount(&server)
        .await;
    let walk = walk(
        freshdesk(&server).as_ref(),
        KEY_TOKEN,
        Some(time("2024-03-01T15:00:00Z")),
    )
    .await
    .unwrap();
    assert_eq!(walk.ids, ["21"]);
    assert_eq!(
        walk.watermark,
        Some(Watermark::Time(time("2024-03-03T08:00:00Z")))
    );
}
