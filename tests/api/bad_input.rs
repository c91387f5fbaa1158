//! Bad input, fuzzed and by example: record payloads, bodies, `Link` headers, cursors that
//! loop, bodies over the size cap and config files. Each ends in a clear error row or
//! startup message; never a panic, and never a lost good record.

use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use serde_json::{json, Value};
use tributary::config::Settings;
use tributary::entities::run_error::Stage;
use tributary::entities::sync_run::RunStatus;
use tributary::pipeline::{NoProgress, RunOptions, RunOutcome};
use tributary::sync::{sync_matching, SyncFilter};
use wiremock::matchers::{header, method, path, query_param, query_param_is_missing};
use wiremock::{Mock, ResponseTemplate};

use crate::helpers::{connections, proptest_config, runtime, spawn_app, TestApp};

/// A cursor provider on the app's API for `users`, with fast retries.
fn provider(app: &TestApp, users: &[&str], extra: &str) -> String {
    format!(
        r#"
[providers.acme]
kind = "rest"
base_url = "{}"
path = "/v1/items"
schedule = "0 */15 * * * *"
records_path = "data"
auth = "bearer"
max_pages = 50
{extra}
[providers.acme.http]
max_retries = 1
retry_initial_delay = "1ms"
retry_max_delay = "2ms"

[providers.acme.pagination]
type = "cursor"
cursor_path = "next_cursor"
cursor_param = "cursor"
{}"#,
        app.api.uri(),
        connections("acme", users)
    )
}

/// Syncs one user's connection and returns its run.
async fn sync_user(app: &TestApp, settings: &Settings, user: &str) -> RunOutcome {
    let report = sync_matching(
        &app.db,
        settings,
        &SyncFilter {
            provider: None,
            user_id: Some(user.to_string()),
            stream: None,
        },
        &RunOptions::manual(),
        &NoProgress,
    )
    .await
    .expect("runs recorded");
    assert_eq!(report.outcomes.len(), 1, "{report:?}");
    report.outcomes.into_iter().next().unwrap()
}

/// Serves `bodies` as `user`'s cursor pages (`c1`, `c2`, ... after the first).
async fn mount_pages(app: &TestApp, user: &str, bodies: Vec<ResponseTemplate>) {
    for (page, body) in bodies.into_iter().enumerate() {
        let mock = Mock::given(method("GET"))
            .and(path("/v1/items"))
            .and(header(
                "authorization",
                format!("Bearer token-{user}").as_str(),
            ));
        let mock = if page == 0 {
            mock.and(query_param_is_missing("cursor"))
        } else {
            mock.and(query_param("cursor", format!("c{page}").as_str()))
        };
        mock.respond_with(body).mount(&app.api).await;
    }
}

fn page(data: Vec<Value>, next: Option<usize>) -> ResponseTemplate {
    ResponseTemplate::new(200)
        .set_body_json(json!({"data": data, "next_cursor": next.map(|n| format!("c{n}"))}))
}

/// (external_id, payload) of `user`'s records, in key order.
async fn stored(app: &TestApp, user: &str) -> Vec<(String, String)> {
    app.records()
        .await
        .into_iter()
        .filter(|r| r.user_id == user)
        .map(|r| (r.external_id, r.payload))
        .collect()
}

/// (stage, payload) of a run's error rows, sorted.
async fn reported(app: &TestApp, run_id: i64) -> Vec<(String, String)> {
    let mut errors: Vec<(String, String)> = app
        .run_errors(run_id)
        .await
        .into_iter()
        .map(|e| (e.stage.to_string(), e.payload))
        .collect();
    errors.sort();
    errors
}

// ---------------------------------------------------------------------------------------
// Record payloads, fuzzed through the whole pipeline.

/// One record of a fuzzed page: what it is and what must become of it.
#[derive(Clone, Debug)]
enum Item {
    /// Must be stored under this external id.
    Good { id: String, record: Value },
    /// Must land in run_errors at this stage, with this payload.
    Bad { stage: &'static str, record: Value },
}

/// Ids that must be stored as they are, and must never collide with one another unless
/// equal byte for byte: case, accents, trailing spaces, characters outside the Basic
/// Multilingual Plane, integers, 255 bytes exactly.
fn good_id() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => prop::sample::select(vec![
            "ab", "AB", "Ab", "x", "x ", " x", "é", "e", "E", "ß", "ss", "😀", "😁", "İ", "i",
        ])
        .prop_map(|id| json!(id)),
        1 => "[a-zA-Z0-9 _.-]{1,20}"
            .prop_filter("not blank", |id| !id.trim().is_empty())
            .prop_map(|id| json!(id)),
        1 => "\\PC{1,30}"
            .prop_filter("usable", |id| !id.trim().is_empty()
                && !id.contains('\0')
                && id.len() <= 255)
            .prop_map(|id| json!(id)),
        1 => any::<i64>().prop_map(|n| json!(n)),
        1 => any::<u64>().prop_map(|n| json!(n)),
        1 => Just(json!("z".repeat(255))),
    ]
}

/// Ids (or whole records) that cannot be keyed.
fn bad_record() -> impl Strategy<Value = (Value, &'static str)> {
    prop_oneof![
        Just((json!({"name": "no id"}), "validate")),
        Just((json!({"id": null}), "validate")),
        Just((json!({"id": ""}), "validate")),
        Just((json!({"id": " \t "}), "validate")),
        Just((json!({"id": true}), "validate")),
        Just((json!({"id": [1]}), "validate")),
        Just((json!({"id": {"nested": 1}}), "validate")),
        Just((json!({"id": 1.5}), "validate")),
        Just((json!({"id": 1e300}), "validate")),
        // u64::MAX + 1 is read as a float.
        Just((
            serde_json::from_str::<Value>(r#"{"id": 18446744073709551616}"#).unwrap(),
            "validate"
        )),
        Just((json!({"id": "y".repeat(256)}), "validate")),
        Just((json!({"id": "é".repeat(128)}), "validate")),
        Just((json!({"id": "a\u{0}b"}), "validate")),
        Just((json!("a bare string"), "parse")),
        Just((json!(42), "parse")),
        Just((json!([{"id": "in an array"}]), "parse")),
        Just((Value::Null, "parse")),
    ]
}

/// Extra fields: nested a few levels, with every kind of JSON value.
fn extra() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        "\\PC{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z]{1,4}", inner, 0..4)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

fn item() -> impl Strategy<Value = Item> {
    prop_oneof![
        3 => (good_id(), extra()).prop_map(|(id, extra)| {
            let key = match &id {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            Item::Good { id: key, record: json!({"id": id, "extra": extra}) }
        }),
        1 => bad_record().prop_map(|(record, stage)| Item::Bad { stage, record }),
    ]
}

#[test]
fn fuzzed_pages_cost_only_their_bad_records() {
    let runtime = runtime();
    let app = runtime.block_on(spawn_app());
    let mut runner = TestRunner::new(proptest_config(24, 0x6261_6469));
    let case = std::cell::Cell::new(0usize);
    let pages = prop::collection::vec(prop::collection::vec(item(), 0..8), 1..4);
    runner
        .run(&pages, |pages| {
            case.set(case.get() + 1);
            let user = format!("fuzz{}", case.get());
            runtime.block_on(async {
                let count = pages.len();
                let bodies = pages
                    .iter()
                    .enumerate()
                    .map(|(n, items)| {
                        let data = items
                            .iter()
                            .map(|item| match item {
                                Item::Good { record, .. } | Item::Bad { record, .. } => {
                                    record.clone()
                                }
                            })
                            .collect();
                        page(data, (n + 1 < count).then_some(n + 1))
                    })
                    .collect();
                mount_pages(&app, &user, bodies).await;
                let settings = app.settings(&provider(&app, &[&user], "")).await;
                let run = sync_user(&app, &settings, &user).await;

                // The last copy of each key wins; every bad record is reported once.
                let mut expected: std::collections::BTreeMap<String, String> = Default::default();
                let mut bad: Vec<(String, String)> = Vec::new();
                for item in pages.iter().flatten() {
                    match item {
                        Item::Good { id, record } => {
                            expected.insert(id.clone(), record.to_string());
                        }
                        Item::Bad { stage, record } => {
                            bad.push((stage.to_string(), record.to_string()))
                        }
                    }
                }
                bad.sort();
                let status = if bad.is_empty() {
                    RunStatus::Succeeded
                } else {
                    RunStatus::Partial
                };
                prop_assert_eq!(run.status, status, "{:?}", run);
                prop_assert_eq!(run.counts.failed as usize, bad.len());
                prop_assert_eq!(run.counts.inserted as usize, expected.len());
                prop_assert_eq!(
                    run.counts.fetched as usize,
                    pages.iter().map(Vec::len).sum::<usize>()
                );
                let mut wanted: Vec<(String, String)> = expected.into_iter().collect();
                wanted.sort();
                let mut got = stored(&app, &user).await;
                got.sort();
                prop_assert_eq!(got, wanted, "every good record stored once");
                prop_assert_eq!(reported(&app, run.run_id).await, bad);
                Ok(())
            })
        })
        .unwrap();
}

// ---------------------------------------------------------------------------------------
// Bodies.

#[tokio::test]
async fn a_body_that_is_not_utf8_is_a_parse_error_row_and_the_pages_before_it_are_kept() {
    let app = spawn_app().await;
    let mut broken = br#"{"data": [{"id": "b"#.to_vec();
    broken.extend_from_slice(&[0xff, 0xfe, b'"', b'}', b']', b'}']);
    mount_pages(
        &app,
        "alice",
        vec![
            page(vec![json!({"id": "a1"}), json!({"id": "a2"})], Some(1)),
            ResponseTemplate::new(200).set_body_raw(broken.clone(), "application/json"),
        ],
    )
    .await;
    let settings = app.settings(&provider(&app, &["alice"], "")).await;
    let run = sync_user(&app, &settings, "alice").await;
    assert_eq!(run.status, RunStatus::Failed);
    let error = run.error.clone().unwrap();
    assert!(
        error.contains("page 2") && error.contains("not valid JSON"),
        "{error}"
    );
    assert_eq!(
        stored(&app, "alice").await,
        [
            ("a1".to_string(), r#"{"id":"a1"}"#.to_string()),
            ("a2".to_string(), r#"{"id":"a2"}"#.to_string())
        ]
    );
    let errors = app.run_errors(run.run_id).await;
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].stage, Stage::Parse);
    assert_eq!(errors[0].payload, String::from_utf8_lossy(&broken));
    assert!(errors[0].payload.contains('\u{fffd}'));
}

/// Records are stored as the text the API sent, never parsed into a tree: nesting past
/// serde_json's tree limit (128) and numbers past f64 are kept exactly, not refused.
#[tokio::test]
async fn deep_nesting_and_numbers_out_of_range_are_stored_as_sent() {
    let app = spawn_app().await;
    let cases = [
        (
            "deep",
            format!(
                r#"{{"id": "deep", "v": {}0{}}}"#,
                "[".repeat(200),
                "]".repeat(200)
            ),
        ),
        (
            "shallow",
            format!(
                r#"{{"id": "shallow", "v": {}0{}}}"#,
                "[".repeat(100),
                "]".repeat(100)
            ),
        ),
        ("huge", r#"{"id": "huge", "v": 1e400}"#.to_string()),
    ];
    let users: Vec<&str> = cases.iter().map(|(user, _)| *user).collect();
    for (user, record) in &cases {
        let body = format!(r#"{{"data": [{record}]}}"#);
        mount_pages(
            &app,
            user,
            vec![ResponseTemplate::new(200).set_body_raw(body, "application/json")],
        )
        .await;
    }
    let settings = app.settings(&provider(&app, &users, "")).await;
    for (user, record) in &cases {
        let run = sync_user(&app, &settings, user).await;
        assert_eq!(run.status, RunStatus::Succeeded, "{user}: {run:?}");
        assert_eq!(
            stored(&app, user).await,
            [(user.to_string(), record.clone())],
            "{user}"
        );
        assert!(reported(&app, run.run_id).await.is_empty(), "{user}");
    }
}

#[tokio::test]
async fn a_body_over_the_size_cap_fails_the_run_naming_the_limit_and_keeps_earlier_pages() {
    let app = spawn_app().await;
    let big: Vec<Value> = (0..200)
        .map(|i| json!({"id": format!("big{i}"), "padding": "x".repeat(40)}))
        .collect();
    mount_pages(
        &app,
        "alice",
        vec![page(vec![json!({"id": "small"})], Some(1)), page(big, None)],
    )
    .await;
    let http = "[providers.acme.http]\nmax_retries = 1\nmax_body_bytes = 2000\n";
    let providers = provider(&app, &["alice"], "").replace(
        "[providers.acme.http]\nmax_retries = 1\nretry_initial_delay = \"1ms\"\nretry_max_delay = \"2ms\"\n",
        http,
    );
    let settings = app.settings(&providers).await;
    for attempt in 0..2 {
        let run = sync_user(&app, &settings, "alice").await;
        assert_eq!(run.status, RunStatus::Failed);
        let error = run.error.clone().unwrap();
        assert!(
            error.contains("page") && error.contains("limit of 2000 bytes (http.max_body_bytes)"),
            "{error}"
        );
        assert_eq!(
            app.run_row(run.run_id).await.error.as_deref(),
            Some(error.as_str())
        );
        // The second run resumes at the page that is too big, and stops there again.
        assert_eq!(run.counts.pages_fetched, 1 - attempt);
        assert_eq!(stored(&app, "alice").await.len(), 1);
    }
}

// ---------------------------------------------------------------------------------------
// Link headers and cursors that never end.

/// A `link`-paginated provider for `users` on the app's API (body: the array itself).
fn link_provider(app: &TestApp, users: &[&str]) -> String {
    format!(
        "[providers.acme]\nkind = \"rest\"\nbase_url = \"{}\"\npath = \"/v1/items\"\n\
         schedule = \"0 */15 * * * *\"\nauth = \"bearer\"\nmax_pages = 50\n\
         [providers.acme.http]\nmax_retries = 0\n\
         [providers.acme.pagination]\ntype = \"link\"\n{}",
        app.api.uri(),
        connections("acme", users)
    )
}

#[tokio::test]
async fn a_malformed_link_header_stores_its_page_and_the_next_run_starts_again_there() {
    let app = spawn_app().await;
    let base = app.api.uri();
    let first_page = Mock::given(method("GET"))
        .and(path("/v1/items"))
        .and(query_param_is_missing("page"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!([{"id": "l1"}]))
                .insert_header(
                    "link",
                    format!("<{base}/v1/items?page=2>; rel=\"next\"").as_str(),
                ),
        )
        .named("the first page")
        .expect(1);
    first_page.mount(&app.api).await;
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .and(query_param("page", "2"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!([{"id": "l2"}]))
                .insert_header(
                    "link",
                    format!("<{base}/v1/items?page=3; rel=\"next\"").as_str(),
                ),
        )
        .named("the page with the broken header")
        .expect(2)
        .mount(&app.api)
        .await;
    let settings = app.settings(&link_provider(&app, &["alice"])).await;
    let both_pages = [
        ("l1".to_string(), r#"{"id":"l1"}"#.to_string()),
        ("l2".to_string(), r#"{"id":"l2"}"#.to_string()),
    ];

    let run = sync_user(&app, &settings, "alice").await;
    assert_eq!(run.status, RunStatus::Failed);
    let error = run.error.clone().unwrap();
    assert!(
        error.contains("page 2")
            && error.contains("malformed Link header")
            && error.contains("the next run starts again at this page"),
        "{error}"
    );
    // The page's records are stored: the header is broken, not the records.
    assert_eq!(stored(&app, "alice").await, both_pages);
    assert_eq!((run.counts.fetched, run.counts.inserted), (2, 2));
    assert!(reported(&app, run.run_id).await.is_empty());

    // The checkpoint stays at page 2, so the next run asks for it again (and only it),
    // stores nothing twice and stops there the same way.
    let again = sync_user(&app, &settings, "alice").await;
    assert_eq!(again.status, RunStatus::Failed);
    // Pages are numbered within a run: the resumed run's first page is this one.
    let error = again.error.clone().unwrap();
    assert!(
        error.starts_with("page 1: malformed Link header"),
        "{error}"
    );
    assert_eq!((again.counts.fetched, again.counts.inserted), (1, 0));
    assert_eq!(stored(&app, "alice").await, both_pages);
    app.api.verify().await;
}

#[test]
fn link_graphs_that_loop_are_stopped_and_every_page_visited_is_stored_once() {
    let runtime = runtime();
    let app = runtime.block_on(spawn_app());
    let base = app.api.uri();
    let mut runner = TestRunner::new(proptest_config(12, 0x6c6f_6f70));
    let case = std::cell::Cell::new(0usize);
    // Each page links to a page (maybe itself, maybe an earlier one) or to none.
    let graphs = prop::collection::vec(prop::option::weighted(0.8, 0usize..6), 1..6);
    runner
        .run(&graphs, |links| {
            case.set(case.get() + 1);
            let user = format!("graph{}", case.get());
            let links: Vec<Option<usize>> = links
                .iter()
                .map(|next| next.map(|n| n % links.len()))
                .collect();
            runtime.block_on(async {
                let respond = {
                    let (links, base) = (links.clone(), base.clone());
                    move |request: &wiremock::Request| {
                        let n: usize = request
                            .url
                            .query_pairs()
                            .find(|(k, _)| k == "page")
                            .and_then(|(_, v)| v.parse().ok())
                            .unwrap_or(0);
                        let body = json!([{"id": format!("g{n}a")}, {"id": format!("g{n}b")}]);
                        let mut template = ResponseTemplate::new(200).set_body_json(body);
                        if let Some(next) = links[n] {
                            template = template.insert_header(
                                "link",
                                format!("<{base}/v1/items?page={next}>; rel=\"next\"").as_str(),
                            );
                        }
                        template
                    }
                };
                Mock::given(method("GET"))
                    .and(path("/v1/items"))
                    .and(header(
                        "authorization",
                        format!("Bearer token-{user}").as_str(),
                    ))
                    .respond_with(respond)
                    .mount(&app.api)
                    .await;
                let settings = app.settings(&link_provider(&app, &[&user])).await;
                let run = sync_user(&app, &settings, &user).await;

                // The walk as the pipeline must make it: the first page has no URL of its
                // own, every later one is a URL, and a URL seen before ends the run.
                let mut fetched = vec![0];
                let mut seen_urls = std::collections::HashSet::new();
                let mut looped = false;
                let mut current = 0;
                while let Some(next) = links[current] {
                    if !seen_urls.insert(next) {
                        looped = true;
                        break;
                    }
                    fetched.push(next);
                    current = next;
                }
                prop_assert_eq!(run.counts.pages_fetched as usize, fetched.len());
                if looped {
                    prop_assert_eq!(run.status, RunStatus::Failed);
                    let error = run.error.clone().unwrap_or_default();
                    prop_assert!(error.contains("already fetched"), "{}", error);
                } else {
                    prop_assert_eq!(run.status, RunStatus::Succeeded, "{:?}", run);
                }
                let mut wanted: Vec<(String, String)> = fetched
                    .iter()
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .flat_map(|n| {
                        ["a", "b"].map(|s| {
                            let id = format!("g{n}{s}");
                            (id.clone(), json!({ "id": id }).to_string())
                        })
                    })
                    .collect();
                wanted.sort();
                let mut got = stored(&app, &user).await;
                got.sort();
                prop_assert_eq!(got, wanted);
                // A page fetched twice (the first page again by its URL) is absorbed.
                prop_assert_eq!(
                    run.counts.inserted + run.counts.unchanged,
                    2 * fetched.len() as u64
                );
                Ok(())
            })
        })
        .unwrap();
}

#[tokio::test]
async fn a_cursor_that_cycles_is_stopped_by_the_loop_guard_and_the_next_run_starts_over() {
    let app = spawn_app().await;
    // c1 -> c2 -> c1 -> ...: an API that keeps answering the same two cursors.
    mount_pages(
        &app,
        "alice",
        vec![
            page(vec![json!({"id": "first"})], Some(1)),
            page(vec![json!({"id": "one"})], Some(2)),
            page(vec![json!({"id": "two"})], Some(1)),
        ],
    )
    .await;
    let settings = app.settings(&provider(&app, &["alice"], "")).await;
    for _ in 0..2 {
        let run = sync_user(&app, &settings, "alice").await;
        assert_eq!(run.status, RunStatus::Failed);
        let error = run.error.clone().unwrap();
        assert!(
            error.contains("already fetched") && error.contains("c1"),
            "{error}"
        );
        assert_eq!(run.counts.pages_fetched, 3, "from the first page each time");
        let ids: Vec<String> = stored(&app, "alice")
            .await
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        assert_eq!(ids, ["first", "one", "two"]);
    }
}

// ---------------------------------------------------------------------------------------
// Config files. Mutated configs are fuzzed once, without a database, in tests/config.rs.

/// A duration the config accepts must not crash the run that uses it later.
#[tokio::test]
async fn an_absurd_lease_ttl_is_refused_at_start_with_its_key() {
    let app = spawn_app().await;
    let config = app.write_config(&format!(
        "[daemon]\nlease_ttl = \"100000000years\"\n{}",
        provider(&app, &["alice"], "")
    ));
    // Before the bound existed, check-config passed and sync panicked claiming the lease.
    for args in [&["check-config"][..], &["sync", "--quiet"][..]] {
        let output = std::process::Command::new(assert_cmd::cargo::cargo_bin("tributary"))
            .arg("--config")
            .arg(&config)
            .args(args)
            .env_remove("TRIBUTARY_DATABASE_URL")
            .output()
            .expect("tributary runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("key `daemon.lease_ttl`") && stderr.contains("between 1s and 1day"),
            "{stderr}"
        );
    }
    assert!(app.records().await.is_empty());
}
