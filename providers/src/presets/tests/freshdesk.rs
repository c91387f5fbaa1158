//! `preset = "freshdesk_tickets"` against an emulation of Freshdesk's API v2 ticket list:
//! basic auth with the API key as the user and `X` as the password, `updated_since`
//! (inclusive) with `order_by`/`order_type`, `page`/`per_page` pages with a `Link` header
//! that the last page lacks, no page past 300 (a 400 with Freshdesk's validation body),
//! the `X-Ratelimit-*` headers, and `{"code", "message"}` errors.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde_json::json;
use wiremock::matchers::{method, path};
use wiremock::{Mock, Respond};

use super::*;
use crate::test_support::query_value;

const TICKETS: &str = "/api/v2/tickets";
/// A connection's token: the API key and Freshdesk's dummy password.
const KEY_TOKEN: &str = "Abc123ApiKey:X";
/// What a full pass sends: the preset's `incremental.start`.
const START: &str = "2000-01-01T00:00:00Z";
/// The last page Freshdesk serves.
const LAST_PAGE: usize = 300;

fn freshdesk(server: &MockServer) -> Box<dyn Provider> {
    provider(&format!(
        "preset = \"freshdesk_tickets\"\nbase_url = \"{}\"\n",
        server.uri()
    ))
}

/// The help desk: tickets (id, `updated_at`), listed as Freshdesk lists them.
struct HelpDesk {
    tickets: Vec<(u64, DateTime<Utc>)>,
}

impl HelpDesk {
    async fn mount(server: &MockServer, tickets: Vec<(u64, DateTime<Utc>)>) {
        Mock::given(method("GET"))
            .and(path(TICKETS))
            .respond_with(HelpDesk { tickets })
            .mount(server)
            .await;
    }
}

/// `count` tickets from id `first`, each changed a minute after the one before, from
/// `from`; `same_time` gives them all `from`.
fn tickets(first: u64, count: u64, from: &str, same_time: bool) -> Vec<(u64, DateTime<Utc>)> {
    (0..count)
        .map(|n| {
            let minutes = if same_time { 0 } else { n as i64 };
            (first + n, time(from) + chrono::TimeDelta::minutes(minutes))
        })
        .collect()
}

impl Respond for HelpDesk {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let expected = format!("Basic {}", STANDARD.encode(KEY_TOKEN));
        if request.headers.get("authorization").map(|v| v.as_bytes()) != Some(expected.as_bytes()) {
            return ResponseTemplate::new(401).set_body_json(json!({
                "code": "invalid_credentials",
                "message": "You have to be logged in to perform this action."
            }));
        }
        let param = |name: &str| query_value(request, name);
        let page: usize = param("page").map_or(1, |page| page.parse().unwrap());
        let per_page: usize = param("per_page").map_or(30, |size| size.parse().unwrap());
        if page > LAST_PAGE {
            return ResponseTemplate::new(400).set_body_json(json!({
                "description": "Validation failed",
                "errors": [{"field": "page", "message": "It should be less than or equal to 300",
                            "code": "invalid_value"}]
            }));
        }
        let since = param("updated_since").map(|since| time(&since));
        let mut listed: Vec<(u64, DateTime<Utc>)> = self
            .tickets
            .iter()
            .filter(|(_, at)| since.is_none_or(|since| *at >= since))
            .copied()
            .collect();
        listed.sort_by_key(|(id, at)| (*at, *id));
        if param("order_type").as_deref() != Some("asc") {
            listed.reverse();
        }
        let more = listed.len() > page * per_page;
        let body: Json = listed
            .iter()
            .skip((page - 1) * per_page)
            .take(per_page)
            .map(|(id, at)| {
                json!({"id": id, "subject": "Printer on fire", "status": 2,
                       "updated_at": at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)})
            })
            .collect();
        let answer = json(body)
            .insert_header("X-Ratelimit-Total", "700")
            .insert_header("X-Ratelimit-Remaining", "699")
            .insert_header("X-Ratelimit-Used-CurrentRequest", "1");
        if !more {
            return answer;
        }
        let mut next = request.url.clone();
        next.query_pairs_mut()
            .clear()
            .extend_pairs(request.url.query_pairs().filter(|(name, _)| name != "page"))
            .append_pair("page", &(page + 1).to_string());
        answer.insert_header("Link", format!("<{next}>; rel=\"next\"").as_str())
    }
}

/// The query of each request `server` received, as (updated_since, page).
async fn asked(server: &MockServer) -> Vec<(String, String)> {
    let requests = server.received_requests().await.unwrap_or_default();
    requests
        .iter()
        .map(|request| {
            let pairs: Vec<(String, String)> = request.url.query_pairs().into_owned().collect();
            let mut fixed: Vec<&(String, String)> = pairs
                .iter()
                .filter(|(name, _)| name != "updated_since" && name != "page")
                .collect();
            fixed.sort();
            assert_eq!(
                fixed,
                [
                    &("order_by".to_string(), "updated_at".to_string()),
                    &("order_type".to_string(), "asc".to_string()),
                    &("per_page".to_string(), "100".to_string()),
                ]
            );
            let value = |name: &str| {
                pairs
                    .iter()
                    .find(|(own, _)| own == name)
                    .map(|(_, value)| value.clone())
                    .unwrap_or_default()
            };
            (value("updated_since"), value("page"))
        })
        .collect()
}

fn asked_from(since: &str, page: u32) -> (String, String) {
    (since.to_string(), page.to_string())
}

#[tokio::test]
async fn freshdesk_tickets_ask_each_page_from_the_newest_updated_at_read() {
    let server = MockServer::start().await;
    HelpDesk::mount(&server, tickets(1, 250, "2024-03-01T00:00:00Z", false)).await;
    let walk = walk(freshdesk(&server).as_ref(), KEY_TOKEN, None)
        .await
        .unwrap();
    let mut ids = walk.ids.clone();
    ids.dedup();
    assert_eq!(ids.len(), 250, "every ticket, each boundary one read twice");
    assert_eq!(walk.ids.len(), 252);
    assert_eq!(
        asked(&server).await,
        [
            asked_from(START, 1),
            // Ticket 100 was changed 99 minutes after the first.
            asked_from("2024-03-01T01:39:00Z", 1),
            asked_from("2024-03-01T03:18:00Z", 1),
        ]
    );
    assert_eq!(
        walk.watermark,
        Some(Watermark::Time(time("2024-03-01T04:09:00Z")))
    );
}

#[tokio::test]
async fn freshdesk_tickets_that_share_a_time_go_on_by_page_number() {
    let server = MockServer::start().await;
    HelpDesk::mount(&server, tickets(1, 150, "2024-03-01T00:00:00Z", true)).await;
    let walk = walk(freshdesk(&server).as_ref(), KEY_TOKEN, None)
        .await
        .unwrap();
    let mut ids = walk.ids.clone();
    ids.sort_by_key(|id| id.parse::<u64>().unwrap());
    ids.dedup();
    assert_eq!(ids.len(), 150);
    assert_eq!(
        asked(&server).await,
        [asked_from(START, 1), asked_from(START, 2)],
        "a page of one time only goes on by page number"
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
    HelpDesk::mount(&server, tickets(1, 1, "2024-03-01T09:00:00Z", false)).await;
    assert_waits_out_429(freshdesk(&server).as_ref(), KEY_TOKEN, &["1"]).await;
    assert_eq!(requests(&server).await, 2);
}

#[tokio::test]
async fn freshdesk_tickets_surface_the_code_and_message_of_a_401() {
    let server = MockServer::start().await;
    HelpDesk::mount(&server, tickets(1, 1, "2024-03-01T09:00:00Z", false)).await;
    let message = unauthorized(freshdesk(&server).as_ref(), "wrong-key:X").await;
    assert!(message.contains("invalid_credentials"), "{message}");
    assert!(message.contains("You have to be logged in"), "{message}");
}

#[tokio::test]
async fn freshdesk_tickets_incremental_run_sends_updated_since() {
    let server = MockServer::start().await;
    let mut desk = tickets(1, 3, "2024-03-01T09:00:00Z", false);
    desk.extend(tickets(21, 1, "2024-03-03T08:00:00Z", false));
    HelpDesk::mount(&server, desk).await;
    let walk = walk(
        freshdesk(&server).as_ref(),
        KEY_TOKEN,
        Some(time("2024-03-01T09:01:00Z")),
    )
    .await
    .unwrap();
    assert_eq!(
        walk.ids,
        ["2", "3", "21"],
        "inclusive: ticket 2 is the cursor's tie"
    );
    assert_eq!(
        asked(&server).await,
        [asked_from("2024-03-01T09:01:00Z", 1)]
    );
    assert_eq!(
        walk.watermark,
        Some(Watermark::Time(time("2024-03-03T08:00:00Z")))
    );
}

#[test]
fn freshdesk_tickets_never_ask_past_page_300() {
    let ProviderConfig::Rest(config) =
        config("preset = \"freshdesk_tickets\"\nbase_url = \"https://example.freshdesk.com\"\n")
            .unwrap()
    else {
        panic!("a rest config");
    };
    assert_eq!(config.pagination.max_page, Some(LAST_PAGE as u64));
}
