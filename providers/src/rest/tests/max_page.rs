//! `pagination.max_page`: a page-numbered listing the API caps (Freshdesk serves no page
//! past 300) is read by the newest change: each page asks from the newest change read
//! before it, so no page number grows past the cap and a record moved to the end of the
//! listing during the walk pushes none past a page boundary. It stops with the reason when
//! records sharing one time fill every page the API serves.

use std::sync::Mutex;

use serde_json::json;
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use super::{credentials, invalid_rest, provider, queries, walk};
use crate::rest::RestProvider;
use crate::test_support::{assert_stops_after, query_value};
use crate::{FetchContext, PagePosition, Provider, Watermark};

/// An API listing oldest change first, `updated_since` inclusive, two a page, that
/// refuses any page past the second as Freshdesk refuses page 301. With `moves`, the
/// first record changes right after the first request: it moves to the end.
struct Capped {
    records: Mutex<Vec<(&'static str, &'static str)>>,
    moves: Option<&'static str>,
}

impl Respond for Capped {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let mut records = self.records.lock().unwrap();
        let param = |name: &str| query_value(request, name);
        let page: usize = param("page").unwrap().parse().unwrap();
        if page > 2 {
            return ResponseTemplate::new(400).set_body_json(json!({
                "description": "Validation failed",
                "errors": [{"field": "page", "message": "Has to be less than 301",
                            "code": "invalid_value"}]
            }));
        }
        let since = param("updated_since").unwrap();
        let data: Vec<_> = records
            .iter()
            .filter(|(_, at)| *at >= since.as_str())
            .skip((page - 1) * 2)
            .take(2)
            .map(|(id, at)| json!({"id": id, "updated_at": at}))
            .collect();
        if let Some(to) = self.moves.filter(|_| records[0].0 == "a") {
            let moved = (records.remove(0).0, to);
            records.push(moved);
        }
        ResponseTemplate::new(200).set_body_json(json!({ "data": data }))
    }
}

fn capped(server: &MockServer) -> RestProvider {
    provider(
        server,
        json!({"pagination": {"type": "page", "page_size_param": "per_page", "page_size": 2,
                              "max_page": 2},
               "incremental": {"cursor_field": "updated_at", "param": "updated_since",
                               "start": "2024-01-01T00:00:00Z"}}),
    )
}

async fn mount(
    server: &MockServer,
    records: Vec<(&'static str, &'static str)>,
    moves: Option<&'static str>,
) {
    Mock::given(wiremock::matchers::method("GET"))
        .respond_with(Capped {
            records: Mutex::new(records),
            moves,
        })
        .mount(server)
        .await;
}

fn since(time: &str) -> Watermark {
    Watermark::Time(time.parse().unwrap())
}

#[tokio::test]
async fn each_page_asks_from_the_newest_change_read_and_ties_go_on_by_page_number() {
    let server = MockServer::start().await;
    mount(
        &server,
        vec![
            ("a", "2024-03-01T00:00:00Z"),
            ("b", "2024-03-02T00:00:00Z"),
            ("c", "2024-03-03T00:00:00Z"),
            ("d", "2024-03-04T00:00:00Z"),
            ("e", "2024-03-04T00:00:00Z"),
            ("f", "2024-03-05T00:00:00Z"),
            ("g", "2024-03-06T00:00:00Z"),
        ],
        None,
    )
    .await;
    let (ids, positions) = walk(&capped(&server), &credentials()).await.unwrap();
    // Asked inclusively, each page starts with the last one read before (the key absorbs
    // it). d and e share a time that fills a page: the next page number follows.
    assert_eq!(ids, ["a", "b", "b", "c", "c", "d", "d", "e", "f", "g", "g"]);
    let restarted = |page, time| {
        Some(PagePosition::RestartedPage {
            page,
            since: since(time),
        })
    };
    assert_eq!(
        positions,
        [
            None,
            restarted(1, "2024-03-02T00:00:00Z"),
            restarted(1, "2024-03-03T00:00:00Z"),
            restarted(1, "2024-03-04T00:00:00Z"),
            restarted(2, "2024-03-04T00:00:00Z"),
            restarted(1, "2024-03-06T00:00:00Z"),
        ]
    );
    let query = |since: &str, page| format!("per_page=2&updated_since={since}&page={page}");
    assert_eq!(
        queries(&server).await,
        [
            query("2024-01-01T00%3A00%3A00Z", 1),
            query("2024-03-02T00%3A00%3A00Z", 1),
            query("2024-03-03T00%3A00%3A00Z", 1),
            query("2024-03-04T00%3A00%3A00Z", 1),
            query("2024-03-04T00%3A00%3A00Z", 2),
            query("2024-03-06T00%3A00%3A00Z", 1),
        ],
        "no page past max_page is asked for"
    );
}

#[tokio::test]
async fn a_record_moved_to_the_end_during_the_walk_pushes_none_past_a_page() {
    let server = MockServer::start().await;
    mount(
        &server,
        vec![
            ("a", "2024-03-01T00:00:00Z"),
            ("b", "2024-03-02T00:00:00Z"),
            ("c", "2024-03-03T00:00:00Z"),
            ("d", "2024-03-04T00:00:00Z"),
        ],
        Some("2024-03-09T00:00:00Z"),
    )
    .await;
    let (ids, _) = walk(&capped(&server), &credentials()).await.unwrap();
    // Page numbers alone would have asked for page 2 after a left page 1, and c, now
    // second, would have been skipped. Here a is read again at its new place.
    assert_eq!(ids, ["a", "b", "b", "c", "c", "d", "d", "a", "a"]);
}

#[tokio::test]
async fn a_listing_that_cannot_move_past_max_page_stops_with_the_reason() {
    let server = MockServer::start().await;
    mount(
        &server,
        vec![
            ("a", "2024-03-01T00:00:00Z"),
            ("b", "2024-03-02T00:00:00Z"),
            ("c", "2024-03-02T00:00:00Z"),
            ("d", "2024-03-02T00:00:00Z"),
            ("e", "2024-03-02T00:00:00Z"),
            ("f", "2024-03-02T00:00:00Z"),
        ],
        None,
    )
    .await;
    let provider = capped(&server);
    let restarted = PagePosition::RestartedPage {
        page: 2,
        since: since("2024-03-02T00:00:00Z"),
    };
    let page = provider
        .fetch_page(
            &FetchContext::full(&credentials(), "records"),
            Some(&restarted),
        )
        .await
        .unwrap();
    assert_stops_after(
        &page,
        &["d", "e"],
        "pages 1 to 2 (pagination.max_page, the last the API serves) hold only records \
         changed at 2024-03-02T00:00:00Z: more records share that time than the API serves \
         pages, so the listing cannot go on",
    );
    assert_eq!(
        queries(&server).await,
        ["per_page=2&updated_since=2024-03-02T00%3A00%3A00Z&page=2"]
    );
}

#[test]
fn max_page_is_validated_naming_the_key() {
    let incremental = json!({"cursor_field": "updated_at", "param": "updated_since"});
    let cases = [
        (
            json!({"pagination": {"type": "link", "max_page": 300}, "incremental": incremental}),
            r#"pagination.max_page is set, but pagination.type = "link" does not use it"#,
        ),
        (
            json!({"pagination": {"type": "page", "first_page": 1, "max_page": 0},
                   "incremental": incremental}),
            "pagination.max_page must be at least pagination.first_page (1), got 0",
        ),
        (
            json!({"pagination": {"type": "page", "max_page": 300}}),
            "pagination.max_page starts the listing over from the newest \
             incremental.cursor_field read, so it needs incremental.param",
        ),
    ];
    for (extra, expected) in cases {
        let message = invalid_rest(extra.clone());
        assert!(message.contains(expected), "{extra}: {message}");
    }
}

#[tokio::test]
async fn pages_each_of_one_time_start_over_at_max_page_from_the_newest() {
    let server = MockServer::start().await;
    mount(
        &server,
        vec![
            ("a", "2024-03-01T00:00:00Z"),
            ("b", "2024-03-01T00:00:00Z"),
            ("c", "2024-03-02T00:00:00Z"),
            ("d", "2024-03-02T00:00:00Z"),
            ("e", "2024-03-03T00:00:00Z"),
        ],
        None,
    )
    .await;
    let (ids, positions) = walk(&capped(&server), &credentials()).await.unwrap();
    assert_eq!(ids, ["a", "b", "c", "d", "c", "d", "e"]);
    let from_c = since("2024-03-02T00:00:00Z");
    assert_eq!(
        positions,
        [
            None,
            Some(PagePosition::Page { page: 2 }),
            Some(PagePosition::RestartedPage {
                page: 1,
                since: from_c.clone()
            }),
            Some(PagePosition::RestartedPage {
                page: 2,
                since: from_c
            }),
        ]
    );
}
