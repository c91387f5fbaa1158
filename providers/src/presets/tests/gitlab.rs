//! `preset = "gitlab_issues"` against an emulation of GitLab's group Issues API on a
//! self-managed host: `PRIVATE-TOKEN`, offset pages linked by `Link` headers that repeat
//! every parameter, the `x-*` page headers and `RateLimit-*` headers, a plain-text 429
//! with `Retry-After`, and `{"message": ...}` errors.

use serde_json::json;
use wiremock::matchers::{header, method, path};
use wiremock::Mock;

use super::*;

const ISSUES: &str = "/api/v4/groups/7/issues";

fn gitlab(server: &MockServer) -> Box<dyn Provider> {
    provider(&format!(
        "preset = \"gitlab_issues\"\nbase_url = \"{}/api/v4\"\npath = \"/groups/7/issues\"\n",
        server.uri()
    ))
}

fn issues(ids_and_times: &[(u64, &str)]) -> Json {
    ids_and_times
        .iter()
        .map(|(id, updated_at)| {
            json!({"id": id, "iid": id % 100, "project_id": 8, "state": "opened", "updated_at": updated_at})
        })
        .collect()
}

/// The query of page `page`, as GitLab writes it into its links.
const FIRST: [(&str, &str); 4] = [
    ("scope", "all"),
    ("order_by", "updated_at"),
    ("sort", "desc"),
    ("per_page", "100"),
];

fn page_url(server: &MockServer, page: u32) -> String {
    format!(
        "{}{ISSUES}?order_by=updated_at&page={page}&per_page=100&scope=all&sort=desc",
        server.uri()
    )
}

/// An answer with GitLab's pagination and rate-limit headers.
fn answer(server: &MockServer, body: Json, page: u32, last: u32) -> ResponseTemplate {
    let mut links = Vec::new();
    if page > 1 {
        links.push(format!("<{}>; rel=\"prev\"", page_url(server, page - 1)));
    }
    if page < last {
        links.push(format!("<{}>; rel=\"next\"", page_url(server, page + 1)));
    }
    links.push(format!("<{}>; rel=\"first\"", page_url(server, 1)));
    links.push(format!("<{}>; rel=\"last\"", page_url(server, last)));
    let next = if page < last {
        (page + 1).to_string()
    } else {
        String::new()
    };
    json(body)
        .insert_header("Link", links.join(", ").as_str())
        .insert_header("x-page", page.to_string().as_str())
        .insert_header("x-next-page", next.as_str())
        .insert_header("x-per-page", "100")
        .insert_header("x-total-pages", last.to_string().as_str())
        .insert_header("RateLimit-Limit", "2000")
        .insert_header("RateLimit-Observed", page.to_string().as_str())
        .insert_header("RateLimit-Remaining", (2000 - page).to_string().as_str())
        .insert_header("RateLimit-Reset", "1709300000")
}

#[tokio::test]
async fn gitlab_issues_follow_link_headers_until_there_is_no_next() {
    let server = MockServer::start().await;
    let token = || header("PRIVATE-TOKEN", TOKEN);
    Mock::given(method("GET"))
        .and(path(ISSUES))
        .and(token())
        .and(exact_query(&FIRST))
        .respond_with(answer(
            &server,
            issues(&[
                (76, "2024-03-02T09:00:00.000Z"),
                (75, "2024-03-01T09:00:00.000Z"),
            ]),
            1,
            3,
        ))
        .expect(1)
        .mount(&server)
        .await;
    for (page, id, at) in [
        (2, 74, "2024-02-28T09:00:00.000Z"),
        (3, 73, "2024-02-27T09:00:00.000Z"),
    ] {
        let page_text = page.to_string();
        let mut query = FIRST.to_vec();
        query.push(("page", &page_text));
        Mock::given(method("GET"))
            .and(path(ISSUES))
            .and(token())
            .and(exact_query(&query))
            .respond_with(answer(&server, issues(&[(id, at)]), page, 3))
            .expect(1)
            .mount(&server)
            .await;
    }

    let walk = walk(gitlab(&server).as_ref(), TOKEN, None).await.unwrap();
    assert_eq!(walk.ids, ["76", "75", "74", "73"]);
    assert_eq!(walk.pages, 3);
    assert_eq!(
        walk.watermark,
        Some(Watermark::Time(time("2024-03-02T09:00:00Z")))
    );
}

#[tokio::test]
async fn gitlab_issues_wait_out_retry_after_on_429() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(ISSUES))
        .respond_with(
            ResponseTemplate::new(429)
                .insert_header("Retry-After", "1")
                .insert_header("RateLimit-Limit", "2000")
                .insert_header("RateLimit-Observed", "2001")
                .insert_header("RateLimit-Remaining", "0")
                .insert_header("RateLimit-Reset", "1709300000")
                .insert_header("RateLimit-ResetTime", "Fri, 01 Mar 2024 13:33:20 GMT")
                .set_body_string("Retry later"),
        )
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(ISSUES))
        .and(exact_query(&FIRST))
        .respond_with(answer(
            &server,
            issues(&[(1, "2024-03-01T09:00:00.000Z")]),
            1,
            1,
        ))
        .mount(&server)
        .await;
    assert_waits_out_429(gitlab(&server).as_ref(), TOKEN, &["1"]).await;
    assert_eq!(requests(&server).await, 2);
}

#[tokio::test]
async fn gitlab_issues_surface_the_message_of_a_401() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(ISSUES))
        .respond_with(
            ResponseTemplate::new(401).set_body_json(json!({"message": "401 Unauthorized"})),
        )
        .expect(1)
        .mount(&server)
        .await;
    let message = unauthorized(gitlab(&server).as_ref(), "wrong").await;
    assert!(message.contains("401 Unauthorized"), "{message}");
}

#[tokio::test]
async fn gitlab_issues_incremental_run_sends_updated_after() {
    let server = MockServer::start().await;
    let mut query = FIRST.to_vec();
    query.push(("updated_after", "2024-03-01T15:00:00Z"));
    Mock::given(method("GET"))
        .and(path(ISSUES))
        .and(header("PRIVATE-TOKEN", TOKEN))
        .and(exact_query(&query))
        .respond_with(answer(
            &server,
            issues(&[(80, "2024-03-04T10:00:00.000Z")]),
            1,
            1,
        ))
        .expect(1)
        .mount(&server)
        .await;
    let walk = walk(
        gitlab(&server).as_ref(),
        TOKEN,
        Some(time("2024-03-01T15:00:00Z")),
    )
    .await
    .unwrap();
    assert_eq!(walk.ids, ["80"]);
    assert_eq!(
        walk.watermark,
        Some(Watermark::Time(time("2024-03-04T10:00:00Z")))
    );
}

#[tokio::test]
async fn gitlab_issues_keep_a_url_encoded_group_path_as_written() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/api/v4/groups/acme%2Fplatform/issues"))
        .and(exact_query(&FIRST))
        .respond_with(answer(
            &server,
            issues(&[(1, "2024-03-01T09:00:00.000Z")]),
            1,
            1,
        ))
        .expect(1)
        .mount(&server)
        .await;
    let provider = provider(&format!(
        "preset = \"gitlab_issues\"\nbase_url = \"{}/api/v4\"\n\
         path = \"/groups/acme%2Fplatform/issues\"\n",
        server.uri()
    ));
    let walk = walk(provider.as_ref(), TOKEN, None).await.unwrap();
    assert_eq!(walk.ids, ["1"]);
}

/// A page that spends the window (`RateLimit-Remaining: 0`) holds the next request back
/// until `RateLimit-Reset`, a Unix time.
#[tokio::test]
async fn gitlab_issues_wait_out_a_spent_window_before_the_next_page() {
    let server = MockServer::start().await;
    let reset = (chrono::Utc::now().timestamp() + 2).to_string();
    Mock::given(method("GET"))
        .and(path(ISSUES))
        .and(exact_query(&FIRST))
        .respond_with(
            answer(&server, issues(&[(2, "2024-03-02T09:00:00.000Z")]), 1, 2)
                .insert_header("RateLimit-Remaining", "0")
                .insert_header("RateLimit-Reset", reset.as_str()),
        )
        .expect(1)
        .mount(&server)
        .await;
    let mut second = FIRST.to_vec();
    second.push(("page", "2"));
    Mock::given(method("GET"))
        .and(path(ISSUES))
        .and(exact_query(&second))
        .respond_with(answer(
            &server,
            issues(&[(1, "2024-03-01T09:00:00.000Z")]),
            2,
            2,
        ))
        .expect(1)
        .mount(&server)
        .await;
    let started = Instant::now();
    let walk = walk(gitlab(&server).as_ref(), TOKEN, None).await.unwrap();
    assert_eq!(walk.ids, ["2", "1"]);
    assert_waited_a_second(started, "the second page");
}

#[tokio::test]
async fn gitlab_names_the_tokens_user_by_its_numeric_id() {
    let server = MockServer::start().await;
    // GET /user answers the authenticated user; `id` is a number.
    Mock::given(method("GET"))
        .and(path("/api/v4/user"))
        .and(header("PRIVATE-TOKEN", TOKEN))
        .respond_with(json(
            json!({"id": 1, "username": "john_smith", "name": "John Smith", "state": "active"}),
        ))
        .expect(1)
        .mount(&server)
        .await;
    let account = gitlab(&server)
        .account_id(&credentials(TOKEN))
        .await
        .unwrap();
    assert_eq!(account.as_deref(), Some("1"));
}
