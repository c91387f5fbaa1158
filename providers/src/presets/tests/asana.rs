//! `preset = "asana_tasks"` against an emulation of Asana's "Get multiple tasks": a bearer
//! token, records in `data` keyed by string `gid`s, the body's `next_page.offset` sent back
//! as `offset` with the same parameters (`next_page` null on the last page), and
//! `{"errors": [{"message"}]}` errors.

use serde_json::json;
use wiremock::matchers::{header, method, path};
use wiremock::Mock;

use super::*;

const TASKS: &str = "/api/1.0/tasks";
const PROJECT: &str = "1200000000000001";

fn user_table(server: &MockServer) -> String {
    format!(
        "preset = \"asana_tasks\"\nbase_url = \"{}/api/1.0\"\nquery = {{ project = \"{PROJECT}\" }}\n",
        server.uri()
    )
}

fn asana(server: &MockServer) -> Box<dyn Provider> {
    provider(&user_table(server))
}

/// The fields the preset asks for, as it sends them.
fn opt_fields(server: &MockServer) -> String {
    match config(&user_table(server)).unwrap() {
        ProviderConfig::Rest(rest) => rest.query["opt_fields"].clone(),
        other => panic!("expected a rest config, got {other:?}"),
    }
}

fn tasks(gids_and_times: &[(&str, &str)], next: Option<&str>) -> Json {
    let data: Vec<Json> = gids_and_times
        .iter()
        .map(|(gid, modified_at)| {
            json!({"gid": gid, "resource_type": "task", "name": "Ship it", "completed": false, "modified_at": modified_at})
        })
        .collect();
    let next_page = next.map(|offset| {
        json!({
            "offset": offset,
            "path": format!("/tasks?project={PROJECT}&limit=100&offset={offset}"),
            "uri": format!("https://app.asana.com/api/1.0/tasks?project={PROJECT}&limit=100&offset={offset}"),
        })
    });
    json!({ "data": data, "next_page": next_page })
}

#[tokio::test]
async fn asana_tasks_send_next_page_offset_back_until_next_page_is_null() {
    let server = MockServer::start().await;
    let fields = opt_fields(&server);
    let bearer = || header("Authorization", format!("Bearer {TOKEN}").as_str());
    let base = [
        ("project", PROJECT),
        ("opt_fields", fields.as_str()),
        ("limit", "100"),
    ];
    Mock::given(method("GET"))
        .and(path(TASKS))
        .and(bearer())
        .and(exact_query(&base))
        .respond_with(json(tasks(
            &[
                ("1200000000000010", "2024-03-02T09:00:00.123Z"),
                ("1200000000000011", "2024-03-01T09:00:00.000Z"),
            ],
            Some("eyJ0eXAiOJiKV1iQLCJhbGciOiJIUzI1NiJ9"),
        )))
        .expect(1)
        .mount(&server)
        .await;
    for (offset, gid, next) in [
        (
            "eyJ0eXAiOJiKV1iQLCJhbGciOiJIUzI1NiJ9",
            "1200000000000012",
            Some("eyJ0eXAiOJiKV1iQLCJhbGciOiJIUzI1NiJ8"),
        ),
        (
            "eyJ0eXAiOJiKV1iQLCJhbGciOiJIUzI1NiJ8",
            "1200000000000013",
            None,
        ),
    ] {
        let mut query = base.to_vec();
        query.push(("offset", offset));
        Mock::given(method("GET"))
            .and(path(TASKS))
            .and(bearer())
            .and(exact_query(&query))
            .respond_with(json(tasks(&[(gid, "2024-02-01T09:00:00.000Z")], next)))
            .expect(1)
            .mount(&server)
            .await;
    }

    let walk = walk(asana(&server).as_ref(), TOKEN, None).await.unwrap();
    assert_eq!(
        walk.ids,
        [
            "1200000000000010",
            "1200000000000011",
            "1200000000000012",
            "1200000000000013"
        ]
    );
    assert_eq!(walk.pages, 3);
    assert_eq!(
        walk.watermark,
        Some(Watermark::Time(time("2024-03-02T09:00:00.123Z")))
    );
}

#[tokio::test]
async fn asana_tasks_wait_out_retry_after_on_429() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(TASKS))
        .respond_with(
            ResponseTemplate::new(429)
                .insert_header("Retry-After", "1")
                .set_body_json(json!({"errors": [{"message": "You've made too many requests and hit a rate limit. Please retry after the given amount of time."}]})),
        )
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(TASKS))
        .respond_with(json(tasks(&[("1", "2024-03-01T09:00:00.000Z")], None)))
        .mount(&server)
        .await;
    assert_waits_out_429(asana(&server).as_ref(), TOKEN, &["1"]).await;
    assert_eq!(requests(&server).await, 2);
}

#[tokio::test]
async fn asana_tasks_surface_the_errors_messages_of_a_401() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(TASKS))
        .respond_with(
            ResponseTemplate::new(401)
                .set_body_json(json!({"errors": [{"message": "Not Authorized"}]})),
        )
        .expect(1)
        .mount(&server)
        .await;
    let message = unauthorized(asana(&server).as_ref(), "wrong").await;
    assert!(message.contains("Not Authorized"), "{message}");
}

#[tokio::test]
async fn asana_tasks_incremental_run_sends_modified_since() {
    let server = MockServer::start().await;
    let fields = opt_fields(&server);
    Mock::given(method("GET"))
        .and(path(TASKS))
        .and(header("Authorization", format!("Bearer {TOKEN}").as_str()))
        .and(exact_query(&[
            ("project", PROJECT),
            ("opt_fields", fields.as_str()),
            ("limit", "100"),
            ("modified_since", "2024-03-01T15:00:00Z"),
        ]))
        .respond_with(json(tasks(
            &[("1200000000000099", "2024-03-07T10:00:00.500Z")],
            None,
        )))
        .expect(1)
        .mount(&server)
        .await;
    let walk = walk(
        asana(&server).as_ref(),
        TOKEN,
        Some(time("2024-03-01T15:00:00Z")),
    )
    .await
    .unwrap();
    assert_eq!(walk.ids, ["1200000000000099"]);
    assert_eq!(
        walk.watermark,
        Some(Watermark::Time(time("2024-03-07T10:00:00.500Z")))
    );
}
