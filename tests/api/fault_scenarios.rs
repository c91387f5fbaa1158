//! Scripted API faults, one scenario per test and one with all of them at once: 429s with
//! `Retry-After`, bursts of 5xx, answers slower than the client's timeout, connections
//! dropped without an answer, bodies cut short in transit, truncated JSON, and records
//! repeated across page boundaries (as a listing shifts while it is paged). Every scenario
//! ends with every good record stored exactly once and every bad one in `run_errors` with
//! its payload.
//!
//! The listing has four cursor pages of good records, and two bad records: one without an
//! id on page 1 and one whose id is an array on page 3.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tributary::entities::run_error::Stage;
use tributary::entities::sync_run::RunStatus;
use tributary::pipeline::RunOutcome;

use crate::helpers::{connections, spawn_app, TestApp};
use crate::scripted::{Reply, ScriptedApi, Seen};

const PAGES: usize = 4;
const GOOD_PER_PAGE: usize = 5;
/// The client's whole-request timeout. Every answer that is not meant to be slow must
/// arrive within it, on a machine as loaded as a full suite makes it, because the tests
/// count every request: one good answer timed out is one retry more.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a slow answer takes: well past [`CLIENT_TIMEOUT`], so the client always gives
/// up first.
const SLOW_ANSWER: Duration = Duration::from_secs(10);

/// The good records of page `page` (0-based).
fn good(page: usize) -> Vec<Value> {
    (0..GOOD_PER_PAGE)
        .map(|i| json!({"id": format!("f{page}_{i}"), "page": page, "title": format!("record {i} of page {page}")}))
        .collect()
}

/// The bad records and the stage each must be reported at.
fn bad(page: usize) -> Option<(Value, &'static str)> {
    match page {
        1 => Some((json!({"title": "no id at all", "page": 1}), "validate")),
        3 => Some((json!({"id": [1, 2], "page": 3}), "validate")),
        _ => None,
    }
}

/// How the listing looks.
#[derive(Clone, Copy)]
struct Listing {
    /// Each page after the first starts with the last good record of the page before it.
    overlap: bool,
}

impl Listing {
    fn page_body(self, page: usize) -> Value {
        let mut data = Vec::new();
        if self.overlap && page > 0 {
            data.push(good(page - 1).pop().unwrap());
        }
        let mut records = good(page);
        if let Some((record, _)) = bad(page) {
            records.insert(2, record);
        }
        data.extend(records);
        let next = (page + 1 < PAGES).then(|| format!("c{}", page + 1));
        json!({"data": data, "next_cursor": next})
    }

    /// Records fetched in one walk of the whole listing.
    fn fetched(self) -> u64 {
        let repeats = if self.overlap { PAGES - 1 } else { 0 };
        (PAGES * GOOD_PER_PAGE + 2 + repeats) as u64
    }
}

fn page_of(seen: &Seen) -> usize {
    seen.query("cursor")
        .map(|cursor| {
            cursor
                .trim_start_matches('c')
                .parse()
                .expect("a page cursor")
        })
        .unwrap_or(0)
}

/// A fault to inject instead of the page's answer, by (page, attempt at that page).
type Faults = Arc<dyn Fn(usize, usize) -> Option<Reply> + Send + Sync>;

fn scripted_api(listing: Listing, faults: Faults) -> ScriptedApi {
    ScriptedApi::start(move |seen| {
        let page = page_of(&seen);
        let reply =
            faults(page, seen.attempt).unwrap_or_else(|| Reply::json(&listing.page_body(page)));
        async move { reply }
    })
}

/// The provider on `api`: a [`CLIENT_TIMEOUT`] and three fast retries.
fn provider(api: &ScriptedApi) -> String {
    format!(
        r#"
[providers.acme]
kind = "rest"
base_url = "{}"
path = "/v1/items"
schedule = "0 */15 * * * *"
records_path = "data"
auth = "bearer"

[providers.acme.http]
timeout = "{}ms"
max_retries = 3
retry_initial_delay = "1ms"
retry_max_delay = "5ms"

[providers.acme.pagination]
type = "cursor"
cursor_path = "next_cursor"
cursor_param = "cursor"
{}"#,
        api.uri(),
        CLIENT_TIMEOUT.as_millis(),
        connections("acme", &["alice"])
    )
}

/// How many requests asked for `page`.
fn requests_for(api: &ScriptedApi, page: usize) -> usize {
    api.requests().iter().filter(|r| page_of(r) == page).count()
}

/// The promise of every scenario: the records table holds each good record exactly once,
/// with the content served, and the error reports of `runs` (which walked the listing
/// once between them) hold each bad record once with its stage and payload, plus any
/// `extra` page-level errors as (stage, payload).
async fn assert_good_stored_once_and_bad_reported(
    app: &TestApp,
    runs: &[i64],
    extra: &[(&str, String)],
) {
    let mut expected: Vec<Value> = (0..PAGES).flat_map(good).collect();
    expected.sort_by_key(|record| record["id"].as_str().unwrap().to_string());
    let records = app.records().await;
    let stored: Vec<(&str, &str, String)> = records
        .iter()
        .map(|r| {
            (
                r.user_id.as_str(),
                r.external_id.as_str(),
                r.payload.clone(),
            )
        })
        .collect();
    let wanted: Vec<(&str, &str, String)> = expected
        .iter()
        .map(|record| ("alice", record["id"].as_str().unwrap(), record.to_string()))
        .collect();
    assert_eq!(stored, wanted, "every good record exactly once");

    let mut reported: Vec<(String, String)> = Vec::new();
    for run in runs {
        for error in app.run_errors(*run).await {
            reported.push((error.stage.to_string(), error.payload));
        }
    }
    let mut wanted: Vec<(String, String)> = (0..PAGES)
        .filter_map(bad)
        .map(|(record, stage)| (stage.to_string(), record.to_string()))
        .chain(
            extra
                .iter()
                .map(|(stage, body)| (stage.to_string(), body.clone())),
        )
        .collect();
    reported.sort();
    wanted.sort();
    assert_eq!(
        reported, wanted,
        "every bad record (and page) in run_errors"
    );
}

/// Syncs alice once.
async fn sync(app: &TestApp, api: &ScriptedApi) -> RunOutcome {
    let settings = app.settings(&provider(api)).await;
    app.sync_one(&settings).await
}

/// One sync of the plain listing through `faults`: the whole listing is walked, page `p`
/// was asked for `requests[p]` times, every good record is stored exactly once and every
/// bad one reported.
async fn sync_through(faults: impl Fn(Listing) -> Faults, requests: [usize; PAGES]) {
    let app = spawn_app().await;
    let listing = Listing { overlap: false };
    let api = scripted_api(listing, faults(listing));
    let run = sync(&app, &api).await;
    assert_walked_whole_listing(&run, listing);
    assert_eq!(
        (0..PAGES)
            .map(|p| requests_for(&api, p))
            .collect::<Vec<_>>(),
        requests
    );
    assert_good_stored_once_and_bad_reported(&app, &[run.run_id], &[]).await;
}

/// One walk that succeeds despite the faults: partial (the two bad records), every page
/// fetched once in the run's count.
fn assert_walked_whole_listing(run: &RunOutcome, listing: Listing) {
    assert_eq!(run.status, RunStatus::Partial, "{run:?}");
    assert_eq!(run.error, None);
    assert_eq!(run.counts.pages_fetched, PAGES as u64);
    assert_eq!(run.counts.fetched, listing.fetched());
    assert_eq!(run.counts.inserted, (PAGES * GOOD_PER_PAGE) as u64);
    assert_eq!(run.counts.failed, 2);
}

#[tokio::test]
async fn rate_limits_with_retry_after_are_waited_out() {
    sync_through(
        |_| {
            Arc::new(|page, attempt| match (page, attempt) {
                (1, 0) => Some(Reply::status(429, "slow down").with_header("retry-after", "1")),
                (2, 0 | 1) => Some(Reply::status(429, "slow down").with_header("retry-after", "0")),
                _ => None,
            })
        },
        [1, 2, 3, 1],
    )
    .await;
}

#[tokio::test]
async fn a_burst_of_server_errors_is_retried() {
    sync_through(
        |_| {
            Arc::new(|page, attempt| match (page, attempt) {
                (0, 0) => Some(Reply::status(500, "internal error")),
                (0, 1) => Some(Reply::status(502, "bad gateway")),
                (0, 2) => Some(Reply::status(503, "unavailable")),
                (3, 0) => Some(Reply::status(504, "gateway timeout")),
                _ => None,
            })
        },
        [4, 1, 1, 2],
    )
    .await;
}

#[tokio::test]
async fn answers_slower_than_the_client_timeout_are_retried() {
    sync_through(
        |listing| {
            Arc::new(move |page, attempt| {
                let slow = matches!((page, attempt), (1, 0) | (2, 0) | (2, 1));
                slow.then(|| Reply::json(&listing.page_body(page)).after(SLOW_ANSWER))
            })
        },
        [1, 2, 3, 1],
    )
    .await;
}

#[tokio::test]
async fn connections_dropped_without_an_answer_are_retried() {
    sync_through(
        |_| {
            Arc::new(|page, attempt| {
                matches!((page, attempt), (0, 0) | (2, 0..=2)).then_some(Reply::Drop)
            })
        },
        [2, 1, 4, 1],
    )
    .await;
}

#[tokio::test]
async fn bodies_cut_short_and_truncated_json_are_retried() {
    sync_through(
        |listing| {
            Arc::new(move |page, attempt| {
                let body = listing.page_body(page).to_string().into_bytes();
                match (page, attempt) {
                    // The connection closes before the declared length arrives.
                    (1, 0) => Some(Reply::CutShort {
                        status: 200,
                        sent: body.len() / 2,
                        body,
                    }),
                    // A whole HTTP answer whose JSON stops in the middle.
                    (3, 0 | 1) => Some(Reply::raw_json(body[..body.len() - 7].to_vec())),
                    _ => None,
                }
            })
        },
        [1, 2, 1, 3],
    )
    .await;
}

#[tokio::test]
async fn a_record_repeated_across_a_page_boundary_is_stored_once() {
    let app = spawn_app().await;
    let listing = Listing { overlap: true };
    let api = scripted_api(listing, Arc::new(|_, _| None));
    let run = sync(&app, &api).await;
    assert_walked_whole_listing(&run, listing);
    // The repeat on the next page is found by that page's lookup, unchanged.
    assert_eq!(
        (run.counts.unchanged, run.counts.duplicate),
        ((PAGES - 1) as u64, 0)
    );
    assert_good_stored_once_and_bad_reported(&app, &[run.run_id], &[]).await;

    // A second pass over the shifting listing inserts nothing.
    let again = sync(&app, &api).await;
    assert_eq!(
        (again.counts.inserted, again.counts.unchanged),
        (0, (PAGES * GOOD_PER_PAGE + PAGES - 1) as u64)
    );
    assert_good_stored_once_and_bad_reported(&app, &[again.run_id], &[]).await;
}

#[tokio::test]
async fn every_fault_at_once_then_a_page_that_stays_broken_until_the_api_recovers() {
    let app = spawn_app().await;
    let listing = Listing { overlap: true };
    let recovered = Arc::new(AtomicBool::new(false));
    let broken_body = {
        let body = listing.page_body(2).to_string();
        body[..body.len() / 3].to_string()
    };
    let api = {
        let (recovered, broken_body) = (recovered.clone(), broken_body.clone());
        scripted_api(
            listing,
            Arc::new(move |page, attempt| {
                let body = listing.page_body(page).to_string().into_bytes();
                match (page, attempt) {
                    (0, 0) => Some(Reply::status(503, "unavailable")),
                    (0, 1) => Some(Reply::status(429, "wait").with_header("retry-after", "0")),
                    (0, 2) => Some(Reply::Drop),
                    (1, 0) => Some(Reply::json(&listing.page_body(1)).after(SLOW_ANSWER)),
                    (1, 1) => Some(Reply::CutShort {
                        status: 200,
                        sent: 10,
                        body,
                    }),
                    // Page 2 answers truncated JSON to every attempt of the first run.
                    (2, _) if !recovered.load(Ordering::SeqCst) => {
                        Some(Reply::raw_json(broken_body.clone()))
                    }
                    (3, 0) => Some(Reply::status(500, "oops")),
                    _ => None,
                }
            }),
        )
    };

    let first = sync(&app, &api).await;
    assert_eq!(first.status, RunStatus::Failed, "{first:?}");
    let error = first.error.clone().unwrap();
    assert!(
        error.contains("page 3") && error.contains("not valid JSON"),
        "{error}"
    );
    assert_eq!(
        (first.counts.pages_fetched, first.counts.inserted),
        (2, (2 * GOOD_PER_PAGE) as u64),
        "the pages before the broken one are kept"
    );
    assert_eq!(requests_for(&api, 2), 4, "one attempt and three retries");

    recovered.store(true, Ordering::SeqCst);
    let second = sync(&app, &api).await;
    assert_eq!(second.status, RunStatus::Partial, "{second:?}");
    assert_eq!(
        second.counts.pages_fetched, 2,
        "resumed at the broken page, not from the start"
    );
    assert_eq!(second.counts.inserted, (2 * GOOD_PER_PAGE) as u64);
    assert_eq!(
        second.counts.unchanged, 2,
        "pages 3 and 4 each repeat the last record of the page before"
    );
    assert_eq!(
        (0..PAGES)
            .map(|p| requests_for(&api, p))
            .collect::<Vec<_>>(),
        [4, 3, 5, 2]
    );
    // The broken page's body is kept whole in the first run's report, stage `parse`.
    let parse_errors: Vec<_> = app
        .run_errors(first.run_id)
        .await
        .into_iter()
        .filter(|e| e.stage == Stage::Parse)
        .collect();
    assert_eq!(parse_errors.len(), 1);
    assert!(
        parse_errors[0].message.contains("page 3"),
        "{}",
        parse_errors[0].message
    );
    assert_good_stored_once_and_bad_reported(
        &app,
        &[first.run_id, second.run_id],
        &[("parse", broken_body)],
    )
    .await;
}
