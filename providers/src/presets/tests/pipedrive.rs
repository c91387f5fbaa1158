//! `preset = "pipedrive_deals"` against an emulation of Pipedrive's API v2 deal list: the
//! token in `x-api-token`, records in `data`, `additional_data.next_cursor` sent back as
//! `cursor` with the same parameters (null on the last page), the `x-ratelimit-*` headers,
//! a 429 without `Retry-After` and a spent window, both waited out until
//! `x-ratelimit-reset`, and `{"success": false, "error", "errorCode", "error_info"}`
//! errors.

use serde_json::json;
use wiremock::matchers::{header, method, path};
use wiremock::Mock;

use super::*;

const DEALS: &str = "/api/v2/deals";
const FIRST: [(&str, &str); 3] = [
    ("sort_by", "update_time"),
    ("sort_direction", "asc"),
    ("limit", "500"),
];

fn pipedrive(server: &MockServer) -> Box<dyn Provider> {
    provider(&format!(
        "preset = \"pipedrive_deals\"\nbase_url = \"{}/api/v2\"\n",
        server.uri()
    ))
}

fn deals(ids_and_times: &[(u64, &str)], next_cursor: Option<&str>) -> Json {
    let data: Vec<Json> = ids_and_times
        .iter()
        .map(|(id, update_time)| json!({"id": id, "title": "Big deal", "status": "open", "update_time": update_time}))
        .collect();
    json!({
        "success": true,
        "data": data,
        "additional_data": { "next_cursor": next_cursor },
    })
}

/// An answer with Pipedrive's rate-limit headers: the burst window's limit, what is left
/// of it and the seconds until it resets. (`x-daily-requests-left` comes only on POST and
/// PUT.)
fn answer(body: Json) -> ResponseTemplate {
    json(body)
        .insert_header("x-ratelimit-limit", "40")
        .insert_header("x-ratelimit-remaining", "39")
        .insert_header("x-ratelimit-reset", "2")
}

/// Pipedrive's error body.
fn error(message: &str, code: u16) -> Json {
    json!({
        "success": false,
        "error": message,
        "errorCode": code,
        "error_info": "Please check developers.pipedrive.com for more information about Pipedrive API."
    })
}

#[tokio::test]
async fn pipedrive_deals_send_next_cursor_back_until_it_is_null() {
    let server = MockServer::start().await;
    let token = || header("x-api-token", TOKEN);
    Mock::given(method("GET"))
        .and(path(DEALS))
        .and(token())
        .and(exact_query(&FIRST))
        .respond_with(answer(deals(
            &[(1, "2024-01-01T09:00:00Z"), (2, "2024-02-01T09:00:00Z")],
            Some("eyJmaWVsZCI6ImlkIiwiZmllbGRWYWx1ZSI6Mn0"),
        )))
        .expect(1)
        .mount(&server)
        .await;
    for (cursor, id, at, next) in [
        (
            "eyJmaWVsZCI6ImlkIiwiZmllbGRWYWx1ZSI6Mn0",
            3,
            "2024-03-01T09:00:00Z",
            Some("eyJmaWVsZCI6ImlkIiwiZmllbGRWYWx1ZSI6M30"),
        ),
        (
            "eyJmaWVsZCI6ImlkIiwiZmllbGRWYWx1ZSI6M30",
            4,
            "2024-03-02T09:00:00Z",
            None,
        ),
    ] {
        let mut query = FIRST.to_vec();
        query.push(("cursor", cursor));
        Mock::given(method("GET"))
            .and(path(DEALS))
            .and(token())
            .and(exact_query(&query))
            .respond_with(answer(deals(&[(id, at)], next)))
            .expect(1)
            .mount(&server)
            .await;
    }

    let walk = walk(pipedrive(&server).as_ref(), TOKEN, None)
        .await
        .unwrap();
    assert_eq!(walk.ids, ["1", "2", "3", "4"]);
    assert_eq!(walk.pages, 3);
    assert_eq!(
        walk.watermark,
        Some(Watermark::Time(time("2024-03-02T09:00:00Z")))
    );
}

/// Pipedrive's 429 carries no `Retry-After`, only the burst window's `x-ratelimit-*`
/// headers: the preset's `rate_limit` waits for `x-ratelimit-reset`.
#[tokio::test]
async fn pipedrive_deals_wait_for_the_burst_window_to_reset_on_429() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(DEALS))
        .respond_with(
            ResponseTemplate::new(429)
                .insert_header("x-ratelimit-limit", "40")
                .insert_header("x-ratelimit-remaining", "0")
                .insert_header("x-ratelimit-reset", "1")
                .set_body_json(error("Request over limit", 429)),
        )
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(DEALS))
        .and(exact_query(&FIRST))
        .respond_with(answer(deals(&[(1, "2024-03-01T09:00:00Z")], None)))
        .mount(&server)
        .await;
    assert_waits_out_429(pipedrive(&server).as_ref(), TOKEN, &["1"]).await;
    assert_eq!(requests(&server).await, 2);
}

/// A page that spends the burst window holds the next request back until it resets,
/// rather than running into the 429.
#[tokio::test]
async fn pipedrive_deals_wait_out_a_spent_window_before_the_next_page() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(DEALS))
        .and(exact_query(&FIRST))
        .respond_with(
            json(deals(&[(1, "2024-03-01T09:00:00Z")], Some("c2")))
                .insert_header("x-ratelimit-limit", "40")
                .insert_header("x-ratelimit-remaining", "0")
                .insert_header("x-ratelimit-reset", "1"),
        )
        .expect(1)
        .mount(&server)
        .await;
    let mut second = FIRST.to_vec();
    second.push(("cursor", "c2"));
    Mock::given(method("GET"))
        .and(path(DEALS))
        .and(exact_query(&second))
        .respond_with(answer(deals(&[(2, "2024-03-02T09:00:00Z")], None)))
        .expect(1)
        .mount(&server)
        .await;
    let started = Instant::now();
    let walk = walk(pipedrive(&server).as_ref(), TOKEN, None)
        .await
        .unwrap();
    assert_eq!(walk.ids, ["1", "2"]);
    assert_waited_a_second(started, "the second page");
}

/// A 429 that outlasts the retries (the daily budget spent, no reset to wait for) ends
/// the fetch quoting Pipedrive's error.
#[tokio::test]
async fn pipedrive_deals_quote_the_error_of_a_429_that_outlasts_the_retries() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(DEALS))
        .respond_with(
            ResponseTemplate::new(429).set_body_json(error("Daily request limit reached", 429)),
        )
        .mount(&server)
        .await;
    let error = walk(pipedrive(&server).as_ref(), TOKEN, None)
        .await
        .unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("429") && message.contains("Daily request limit reached"),
        "{message}"
    );
    assert_eq!(
        requests(&server).await,
        3,
        "the first try and fast()'s two retries"
    );
}

#[tokio::test]
async fn pipedrive_deals_surface_the_error_of_a_401() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(DEALS))
        .respond_with(ResponseTemplate::new(401).set_body_json(error("unauthorized access", 401)))
        .expect(1)
        .mount(&server)
        .await;
    let message = unauthorized(pipedrive(&server).as_ref(), "wrong").await;
    assert!(message.contains("unauthorized access"), "{message}");
}

#[tokio::test]
async fn pipedrive_deals_incremental_run_sends_updated_since() {
    let server = MockServer::start().await;
    let mut query = FIRST.to_vec();
    query.push(("updated_since", "2024-03-01T15:00:00Z"));
    Mock::given(method("GET"))
        .and(path(DEALS))
        .and(header("x-api-token", TOKEN))
        .and(exact_query(&query))
        .respond_with(answer(deals(&[(5, "2024-03-08T12:00:00Z")], None)))
        .expect(1)
        .mount(&server)
        .await;
    let walk = walk(
        pipedrive(&server).as_ref(),
        TOKEN,
        Some(time("2024-03-01T15:00:00Z")),
    )
    .await
    .unwrap();
    assert_eq!(walk.ids, ["5"]);
    assert_eq!(
        walk.watermark,
        Some(Watermark::Time(time("2024-03-08T12:00:00Z")))
    );
}
