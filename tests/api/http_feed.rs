//! The HTTP API's errors, replay, change feed, webhook deliveries and health, on a real
//! `tributary daemon` process: each route's outcome, paging, its problems (404, 400
//! naming the field, 410 for a feed cursor the feed cannot serve) and its scope.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tributary::entities::notification_delivery::{self, DeliveryStatus};
use tributary::entities::sync_run::RunStatus;
use tributary::entities::{change_batch, run_error};
use tributary::pipeline::changes::{self, Cursor, FeedCursor};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::helpers::{
    backend, cursor_provider, items, mount_cursor_pages, read_feed, run, spawn_app, tributary,
    Backend, TestApp,
};
use crate::http::{assert_problem, audit_rows, Served};

/// Every GET in `cases` answers its status with a problem naming `field`.
async fn assert_problems(served: &Served, key: &str, cases: &[(&str, StatusCode, Option<&str>)]) {
    for (path, status, field) in cases {
        let (got, json) = served.get(path, key).await;
        assert_eq!(got, *status, "{path}: {json}");
        assert_eq!(json["field"].as_str(), *field, "{path}: {json}");
        assert!(json["detail"].is_string(), "{path}: {json}");
    }
}

/// A GET without a key is 401; with `wrong`, a key lacking the scope, 403.
async fn assert_scoped(served: &Served, path: &str, wrong: &str) {
    let (status, headers, json) = served.call(Method::GET, path, None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}: {json}");
    assert_problem(status, &headers, &json);
    let (status, json) = served.get(path, wrong).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {json}");
}

/// The ids of a page's items.
pub(crate) fn ids(page: &Value) -> Vec<i64> {
    page["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|item| item["id"].as_i64())
        .collect()
}

/// The output of a `--json` command, parsed.
fn cli_json(config: &std::path::Path, args: &[&str]) -> Value {
    let output = run(tributary(config).args(args));
    assert_eq!(output.code, 0, "{args:?}: {}", output.stderr);
    serde_json::from_str(&output.stdout).expect("JSON")
}

async fn drop_refusal(app: &TestApp) {
    match backend() {
        Backend::Postgres => app.execute("DROP TRIGGER refuse_insert ON records").await,
        _ => app.execute("DROP TRIGGER refuse_insert").await,
    }
}

#[tokio::test]
async fn a_runs_errors_are_paged_with_their_payloads_and_a_replay_resolves_them_audited() {
    let app = spawn_app().await;
    app.refuse_inserts_of("poison", "poison refused").await;
    mount_cursor_pages(
        &app.api,
        vec![(
            json!([{"id": "a"}, {"id": "poison", "v": 1}, {"v": "no id"}]),
            None,
        )],
    )
    .await;
    let providers = cursor_provider("acme", &app.api.uri(), &["alice"]);
    let settings = app.settings(&providers).await;
    let failed = app.sync_one(&settings).await;
    assert_eq!(
        (failed.status, failed.counts.failed),
        (RunStatus::Partial, 2)
    );
    let served = Served::start(&app, &providers).await;
    let records = served.create_key("records", &["records:read"]);
    let reader = served.create_key("reader", &["connections:read"]);
    let syncs = served.create_key("syncs", &["syncs:write"]);
    let run_errors = format!("/v1/runs/{}/errors", failed.run_id);

    // Two errors, one a page, each with the payload as received.
    let (status, first) = served.get(&format!("{run_errors}?limit=1"), &records).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let next = first["next"].as_str().expect("a second page");
    let (status, second) = served
        .get(&format!("{run_errors}?limit=1&cursor={next}"), &records)
        .await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert!(second["next"].is_null(), "{second}");
    let errors: Vec<&Value> = [&first, &second]
        .iter()
        .flat_map(|page| page["items"].as_array().expect("items"))
        .collect();
    let api_ids: Vec<i64> = errors.iter().filter_map(|e| e["id"].as_i64()).collect();
    assert!(api_ids[0] < api_ids[1], "oldest first: {api_ids:?}");
    let by_id = |external_id: Option<&str>| -> &Value {
        errors
            .iter()
            .find(|e| e["external_id"].as_str() == external_id)
            .unwrap_or_else(|| panic!("no error of {external_id:?}: {errors:?}"))
    };
    let (poison, no_id) = (by_id(Some("poison")), by_id(None));
    assert_eq!(poison["payload"], r#"{"id":"poison","v":1}"#);
    assert_eq!(no_id["payload"], r#"{"v":"no id"}"#);
    assert_eq!(
        (&poison["stage"], &no_id["stage"]),
        (&json!("persist"), &json!("validate"))
    );
    assert_eq!(poison["stream"], "records");
    assert_eq!(poison["run_id"], failed.run_id);
    assert!(errors.iter().all(|e| e["resolved_by_run_id"].is_null()));
    let (poison_id, no_id_id) = (poison["id"].clone(), no_id["id"].clone());
    // The same errors as `tributary errors RUN --json`, from the same operation.
    let config = served.config.clone();
    let cli = cli_json(&config, &["errors", &failed.run_id.to_string(), "--json"]);
    let cli_ids: Vec<i64> = cli
        .as_array()
        .expect("errors")
        .iter()
        .filter_map(|e| e["id"].as_i64())
        .collect();
    assert_eq!(cli_ids, api_ids);
    assert_eq!(cli[0]["payload"], errors[0]["payload"]);

    // The open errors of every run, filtered as `errors --open` filters them.
    let (_, open) = served.get("/v1/errors", &records).await;
    assert_eq!(ids(&open), api_ids, "{open}");
    let (_, by_stream) = served.get("/v1/errors?stream=records", &records).await;
    assert_eq!(ids(&by_stream), api_ids);
    let (_, other) = served.get("/v1/errors?stream=other", &records).await;
    assert_eq!(ids(&other), Vec::<i64>::new());
    let (_, by_run) = served
        .get(
            &format!("/v1/errors?run_id={}&limit=1", failed.run_id),
            &records,
        )
        .await;
    assert_eq!(ids(&by_run), api_ids[..1]);
    let next_open = by_run["next"].as_str().expect("a next page").to_string();

    assert_scoped(&served, &run_errors, &reader).await;
    assert_scoped(&served, "/v1/errors", &reader).await;
    assert_problems(
        &served,
        &records,
        &[
            ("/v1/runs/999999/errors", StatusCode::NOT_FOUND, None),
            ("/v1/runs/abc/errors", StatusCode::BAD_REQUEST, Some("id")),
            (
                &format!("{run_errors}?limit=0"),
                StatusCode::BAD_REQUEST,
                Some("limit"),
            ),
            (
                "/v1/errors?limit=1001",
                StatusCode::BAD_REQUEST,
                Some("limit"),
            ),
            (
                "/v1/errors?run_id=-3",
                StatusCode::BAD_REQUEST,
                Some("run_id"),
            ),
            (
                "/v1/errors?run_id=x",
                StatusCode::BAD_REQUEST,
                Some("run_id"),
            ),
            ("/v1/errors?open=1", StatusCode::BAD_REQUEST, Some("open")),
            // A cursor of the open errors is not one of a run's errors.
            (
                &format!("{run_errors}?cursor={next_open}"),
                StatusCode::BAD_REQUEST,
                Some("cursor"),
            ),
        ],
    )
    .await;

    // Replay: a write, refused without syncs:write; then what went through is resolved.
    drop_refusal(&app).await;
    let replay = format!("/v1/runs/{}/replay", failed.run_id);
    let (status, headers, json) = served
        .call(Method::POST, &replay, Some(&reader), None)
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{json}");
    assert_problem(status, &headers, &json);
    let (status, _, report) = served.call(Method::POST, &replay, Some(&syncs), None).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(report["resolved"], json!([poison_id]), "{report}");
    assert_eq!(report["still_failing"][0]["error_id"], no_id_id, "{report}");
    assert!(
        report["still_failing"][0]["reason"]
            .as_str()
            .is_some_and(|reason| reason.contains("has no id field")),
        "{report}"
    );
    assert!(report["stopped"].is_null(), "{report}");
    let replay_run = report["replay_run_id"].as_i64().expect("a replay run");
    assert_eq!(app.record_ids().await, ["a", "poison"]);
    let resolved = run_error::Entity::find_by_id(poison_id.as_i64().expect("id"))
        .one(&app.db)
        .await
        .expect("read")
        .expect("the error");
    assert_eq!(resolved.resolved_by_run_id, Some(replay_run));
    let (_, open) = served.get("/v1/errors", &records).await;
    assert_eq!(json!(ids(&open)), json!([no_id_id]), "{open}");
    let (status, _, json) = served
        .call(Method::POST, "/v1/runs/999999/replay", Some(&syncs), None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{json}");
    let (status, _, json) = served
        .call(Method::POST, "/v1/runs/abc/replay", Some(&syncs), None)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{json}");
    assert_eq!(json["field"], "id", "{json}");

    // Each replay request left its audit row, the refused ones too.
    let audit: Vec<(String, i32)> = audit_rows(&app)
        .await
        .into_iter()
        .map(|(_, method, path, status)| (format!("{method} {path}"), status))
        .collect();
    assert_eq!(
        audit,
        [
            (format!("POST {replay}"), 403),
            (format!("POST {replay}"), 200),
            ("POST /v1/runs/999999/replay".to_string(), 404),
            ("POST /v1/runs/abc/replay".to_string(), 400),
        ]
    );

    // The CLI and the API list the same runs, counters and statuses included.
    let cli_runs = cli_json(&config, &["runs", "--json"]);
    let (_, api_runs) = served.get("/v1/runs", &reader).await;
    assert_eq!(cli_runs, api_runs["items"]);
    let statuses: Vec<(&str, i64)> = cli_runs
        .as_array()
        .expect("runs")
        .iter()
        .map(|r| {
            (
                r["status"].as_str().unwrap_or_default(),
                r["records_failed"].as_i64().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(statuses, [("partial", 1), ("partial", 2)]);
}

#[tokio::test]
async fn a_replay_of_a_run_whose_provider_left_the_config_is_a_conflict_that_writes_nothing() {
    let app = spawn_app().await;
    app.refuse_inserts_of("poison", "poison refused").await;
    mount_cursor_pages(&app.api, vec![(json!([{"id": "poison"}]), None)]).await;
    let settings = app
        .settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;
    let failed = app.sync_one(&settings).await;
    assert_eq!(failed.status, RunStatus::Partial);
    drop_refusal(&app).await;
    // The daemon's config.toml no longer has `acme`.
    let served = Served::start(&app, &cursor_provider("other", &app.api.uri(), &["alice"])).await;
    let syncs = served.create_key("syncs", &["syncs:write"]);
    let replay = format!("/v1/runs/{}/replay", failed.run_id);
    let (status, headers, json) = served.call(Method::POST, &replay, Some(&syncs), None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{json}");
    assert_problem(status, &headers, &json);
    assert!(
        json["detail"]
            .as_str()
            .is_some_and(|d| d.contains("\"acme\", which is not in the config")),
        "{json}"
    );
    assert_eq!(app.record_ids().await, Vec::<String>::new());
    let open = app.run_errors(failed.run_id).await;
    assert!(
        open.iter().all(|e| e.resolved_by_run_id.is_none()),
        "{open:?}"
    );
    let audit: Vec<i32> = audit_rows(&app).await.iter().map(|row| row.3).collect();
    assert_eq!(audit, [409]);
}

/// `position` as the feed of `app`'s database issues it.
async fn issued(app: &TestApp, position: Cursor) -> String {
    FeedCursor::issued_by(&app.db, position)
        .await
        .expect("database id")
        .to_string()
}

/// A scratch app whose one run inserted `k0`, `k1` and `k2` (one batch, readable), and
/// its providers' config.
async fn three_changes() -> (TestApp, String) {
    let app = spawn_app().await;
    let providers = cursor_provider("acme", &app.api.uri(), &["alice"]);
    let settings = app.settings(&providers).await;
    mount_cursor_pages(&app.api, vec![(json!(items("k", "alice", 0..3)), None)]).await;
    app.sync_one(&settings).await;
    // On PostgreSQL a batch is readable once no older transaction is open.
    read_feed(&app.db, Cursor::START, 100).await;
    (app, providers)
}

#[tokio::test]
async fn the_change_feed_is_paged_by_its_cursor_and_a_cursor_it_cannot_serve_is_gone() {
    let (app, providers) = three_changes().await;
    let served = Served::start(&app, &providers).await;
    let records = served.create_key("records", &["records:read"]);
    let reader = served.create_key("reader", &["connections:read"]);

    // Three inserts, two a page, then none after the last cursor.
    let (status, first) = served.get("/v1/changes?limit=2", &records).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let keys = |page: &Value| -> Vec<String> {
        page["changes"]
            .as_array()
            .expect("changes")
            .iter()
            .map(|c| format!("{} {}", c["kind"].as_str().unwrap_or(""), c["external_id"]))
            .collect()
    };
    assert_eq!(keys(&first), [r#"inserted "k0""#, r#"inserted "k1""#]);
    assert_eq!(first["changes"][0]["payload"]["owner"], "alice", "{first}");
    assert_eq!(first["changes"][0]["user_id"], "alice");
    // The same page as `tributary changes --json`: the cursors are the same text.
    let cli = cli_json(&served.config, &["changes", "--json", "--limit", "2"]);
    assert_eq!(cli, first);
    let next = first["next_cursor"].as_str().expect("next_cursor");
    let (_, second) = served
        .get(&format!("/v1/changes?cursor={next}"), &records)
        .await;
    assert_eq!(keys(&second), [r#"inserted "k2""#]);
    let last = second["next_cursor"].as_str().expect("next_cursor");
    let (_, empty) = served
        .get(&format!("/v1/changes?cursor={last}"), &records)
        .await;
    assert_eq!(keys(&empty), Vec::<String>::new());
    assert!(
        empty["next_cursor"].is_string(),
        "polling goes on from it: {empty}"
    );
    let (_, filtered) = served
        .get("/v1/changes?user_id=bob&provider=acme", &records)
        .await;
    assert_eq!(keys(&filtered), Vec::<String>::new());

    // The head: nothing after it until the next run.
    let (status, head) = served.get("/v1/changes/head", &records).await;
    assert_eq!(status, StatusCode::OK, "{head}");
    let head = head["next_cursor"].as_str().expect("the head").to_string();
    let (_, after_head) = served
        .get(&format!("/v1/changes?cursor={head}"), &records)
        .await;
    assert_eq!(keys(&after_head), Vec::<String>::new());

    assert_scoped(&served, "/v1/changes", &reader).await;
    assert_scoped(&served, "/v1/changes/head", &reader).await;
    assert_problems(
        &served,
        &records,
        &[
            (
                "/v1/changes?cursor=nope",
                StatusCode::BAD_REQUEST,
                Some("cursor"),
            ),
            (
                "/v1/changes?limit=0",
                StatusCode::BAD_REQUEST,
                Some("limit"),
            ),
            (
                "/v1/changes?limit=10001",
                StatusCode::BAD_REQUEST,
                Some("limit"),
            ),
            (
                "/v1/changes?since=x",
                StatusCode::BAD_REQUEST,
                Some("since"),
            ),
        ],
    )
    .await;

    // A cursor edited by hand names another database: 410, with how to resync.
    let prefix_len = next.find('.').map_or(0, |at| at + 1);
    let mut edited: Vec<char> = next.chars().collect();
    let at = prefix_len + 2;
    edited[at] = if edited[at] == 'A' { 'B' } else { 'A' };
    let edited: String = edited.into_iter().collect();
    let (status, gone) = served
        .get(&format!("/v1/changes?cursor={edited}"), &records)
        .await;
    assert_eq!(status, StatusCode::GONE, "{edited}: {gone}");
    assert!(
        gone["detail"]
            .as_str()
            .is_some_and(|d| d.contains("another database") && d.contains("GET /v1/changes/head")),
        "{gone}"
    );

    // The run's batch is swept: a cursor inside it is gone. (Only readable batches are
    // swept, and this one was read above.)
    let first_seq = app.batch_seqs().await[0];
    change_batch::Entity::update_many()
        .col_expr(
            change_batch::Column::CommittedAt,
            Expr::value(chrono::Utc::now() - chrono::Duration::days(2)),
        )
        .filter(change_batch::Column::Seq.eq(first_seq))
        .exec(&app.db)
        .await
        .expect("backdated");
    let swept = changes::sweep_expired_changes(&app.db, Duration::from_secs(24 * 60 * 60))
        .await
        .expect("swept");
    assert_eq!(swept.swept_seq, Some(first_seq));
    let inside = issued(
        &app,
        Cursor {
            seq: first_seq,
            ordinal: 1,
        },
    )
    .await;
    let (status, gone) = served
        .get(&format!("/v1/changes?cursor={inside}"), &records)
        .await;
    assert_eq!(status, StatusCode::GONE, "{gone}");
    assert_eq!(gone["type"], "urn:tributary:problem:gone");
    assert!(
        gone["detail"]
            .as_str()
            .is_some_and(|d| d.contains("older than the change feed's retention")
                && d.contains("GET /v1/changes/head")),
        "{gone}"
    );
    // From the feed's start, which moved past the swept batch, a reader reads on.
    let (status, kept) = served.get("/v1/changes", &records).await;
    assert_eq!(status, StatusCode::OK, "{kept}");
    assert_eq!(keys(&kept), Vec::<String>::new());
    assert_ne!(kept["feed_start"], first["feed_start"], "{kept}");
}

/// Every delivery, oldest first.
async fn deliveries(app: &TestApp) -> Vec<notification_delivery::Model> {
    notification_delivery::Entity::find()
        .order_by_asc(notification_delivery::Column::Id)
        .all(&app.db)
        .await
        .expect("deliveries")
}

#[tokio::test]
async fn deliveries_are_listed_newest_first_and_one_is_sent_again_once_asked_audited() {
    let app = spawn_app().await;
    let receiver = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/hooks"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&receiver)
        .await;
    mount_cursor_pages(&app.api, vec![(json!(items("k", "x", 0..2)), None)]).await;
    let users = ["alice", "bob", "carol"];
    let providers = cursor_provider("acme", &app.api.uri(), &users);
    let notify = format!(
        "\n[notify]\nurl = \"{}/hooks\"\nsecret_env = \"TRIBUTARY_TEST_HOOK_SECRET\"\n",
        receiver.uri()
    );
    // The runs write their deliveries; a worker in this process sends them. The daemon
    // serving the API has no [notify], so that only this worker sends.
    let settings = app.settings(&format!("{providers}{notify}")).await;
    app.sync(&settings).await;
    let notifier = tributary::daemon::notify::Notifier::new(
        app.db.main().clone(),
        settings.notify.clone().expect("[notify]"),
        secrecy::SecretString::from("whsec_test_0123456789abcdef"),
    )
    .expect("worker");
    let cancel = CancellationToken::new();
    let pass = notifier.deliver_due(&cancel).await.expect("a pass");
    assert_eq!(pass.delivered, 3, "{pass:?}");
    let rows = deliveries(&app).await;
    let failed = &rows[1];
    notification_delivery::Entity::update_many()
        .col_expr(
            notification_delivery::Column::Status,
            Expr::value(DeliveryStatus::Failed),
        )
        .col_expr(
            notification_delivery::Column::LastError,
            Expr::value("the receiver answered 503"),
        )
        .filter(notification_delivery::Column::Id.eq(failed.id))
        .exec(&app.db)
        .await
        .expect("marked failed");
    let served = Served::start(&app, &providers).await;
    let reader = served.create_key("reader", &["notifications:read"]);
    let writer = served.create_key("writer", &["notifications:write"]);
    let other = served.create_key("other", &["connections:read", "syncs:write"]);

    // Newest first, two a page.
    let (status, first) = served.get("/v1/notifications?limit=2", &reader).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let next = first["next"].as_str().expect("a next page");
    let (_, second) = served
        .get(&format!("/v1/notifications?limit=2&cursor={next}"), &reader)
        .await;
    assert!(second["next"].is_null(), "{second}");
    let listed: Vec<i64> = ids(&first).into_iter().chain(ids(&second)).collect();
    let mut expected: Vec<i64> = rows.iter().map(|row| row.id).collect();
    expected.reverse();
    assert_eq!(listed, expected);
    let (_, only_failed) = served.get("/v1/notifications?failed=true", &reader).await;
    assert_eq!(ids(&only_failed), [failed.id], "{only_failed}");
    let item = &only_failed["items"][0];
    assert_eq!(item["status"], "failed");
    assert_eq!(item["delivery_id"], failed.delivery_id.as_str());
    assert_eq!(item["last_error"], "the receiver answered 503");
    assert_eq!(item["body"], failed.body.as_str());
    assert!(item["next_attempt_at"].is_null(), "{item}");

    assert_scoped(&served, "/v1/notifications", &other).await;
    assert_problems(
        &served,
        &reader,
        &[
            (
                "/v1/notifications?failed=perhaps",
                StatusCode::BAD_REQUEST,
                Some("failed"),
            ),
            (
                "/v1/notifications?limit=1001",
                StatusCode::BAD_REQUEST,
                Some("limit"),
            ),
            (
                "/v1/notifications?cursor=bm9wZQ",
                StatusCode::BAD_REQUEST,
                Some("cursor"),
            ),
        ],
    )
    .await;

    // Redelivering: a write of its own scope; a pending delivery cannot be asked twice.
    let redeliver = format!("/v1/notifications/{}/redeliver", failed.id);
    let mut expected_audit = Vec::new();
    for (key, status) in [
        (&reader, StatusCode::FORBIDDEN),
        (&writer, StatusCode::ACCEPTED),
        (&writer, StatusCode::CONFLICT),
    ] {
        let (got, headers, json) = served.call(Method::POST, &redeliver, Some(key), None).await;
        assert_eq!(got, status, "{json}");
        if status == StatusCode::ACCEPTED {
            assert_eq!(json["status"], "pending", "{json}");
            assert_eq!(json["delivery_id"], failed.delivery_id.as_str());
        } else {
            assert_problem(got, &headers, &json);
        }
        expected_audit.push((format!("POST {redeliver}"), i32::from(status.as_u16())));
    }
    for (path, status) in [
        ("/v1/notifications/999999/redeliver", StatusCode::NOT_FOUND),
        ("/v1/notifications/abc/redeliver", StatusCode::BAD_REQUEST),
    ] {
        let (got, headers, json) = served.call(Method::POST, path, Some(&writer), None).await;
        assert_eq!(got, status, "{path}: {json}");
        assert_problem(got, &headers, &json);
        if status == StatusCode::BAD_REQUEST {
            assert_eq!(json["field"], "id", "{json}");
        }
        expected_audit.push((format!("POST {path}"), i32::from(status.as_u16())));
    }
    let audit: Vec<(String, i32)> = audit_rows(&app)
        .await
        .into_iter()
        .map(|(_, method, path, status)| (format!("{method} {path}"), status))
        .collect();
    assert_eq!(audit, expected_audit);

    // The next pass sends it again, with its original id, and only it.
    receiver.reset().await;
    Mock::given(method("POST"))
        .and(path("/hooks"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&receiver)
        .await;
    let pass = notifier.deliver_due(&cancel).await.expect("a pass");
    assert_eq!(pass.delivered, 1, "{pass:?}");
    let received = receiver.received_requests().await.unwrap_or_default();
    let ids: Vec<&str> = received
        .iter()
        .filter_map(|request| request.headers.get("tributary-delivery"))
        .filter_map(|value| value.to_str().ok())
        .collect();
    assert_eq!(ids, [failed.delivery_id.as_str()]);
    let row = &deliveries(&app).await[1];
    assert_eq!((row.status, row.attempts), (DeliveryStatus::Delivered, 2));

    // The CLI calls the same operation, naming the delivery by the id it shows.
    let delivered = &rows[0];
    let again = run(tributary(&served.config).args([
        "notifications",
        "--redeliver",
        &delivered.delivery_id,
    ]));
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert!(again.stdout.contains("pending again"), "{}", again.stdout);
    assert_eq!(deliveries(&app).await[0].status, DeliveryStatus::Pending);
    let twice = run(tributary(&served.config).args([
        "notifications",
        "--redeliver",
        &delivered.delivery_id,
    ]));
    assert_ne!(twice.code, 0);
    assert!(twice.stderr.contains("already pending"), "{}", twice.stderr);
    let (status, json) = served
        .get(&format!("/v1/notifications?cursor={next}&limit=2"), &reader)
        .await;
    assert_eq!(status, StatusCode::OK, "{json}");
    assert_eq!(json["items"][0]["status"], "pending", "{json}");
    assert!(json["items"][0]["next_attempt_at"].is_string(), "{json}");
}

#[tokio::test]
async fn health_answers_without_a_key_with_the_version_only() {
    let app = spawn_app().await;
    let providers = cursor_provider("acme", &app.api.uri(), &["alice"]);
    let served = Served::start(&app, &providers).await;
    let (status, headers, json) = served.call(Method::GET, "/v1/health", None, None).await;
    assert_eq!(status, StatusCode::OK, "{json}");
    assert!(
        headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/json")),
        "{headers:?}"
    );
    assert_eq!(
        json,
        json!({"status": "ok", "version": env!("CARGO_PKG_VERSION")})
    );
    // A key, even a wrong one, changes nothing: the route reads none.
    let (status, _, _) = served
        .call(Method::GET, "/v1/health", Some("nonsense"), None)
        .await;
    assert_eq!(status, StatusCode::OK);
}

/// The `feed_readers` rows: (reader, key id, seq, ordinal), by reader.
pub(crate) async fn reader_rows(app: &TestApp) -> Vec<(String, Option<i64>, i64, i64)> {
    crate::http::query(
        app,
        "SELECT reader, key_id, seq, ordinal FROM feed_readers ORDER BY reader",
    )
    .await
    .iter()
    .map(|row| {
        (
            row.try_get_by_index(0).expect("reader"),
            row.try_get_by_index(1).expect("key_id"),
            row.try_get_by_index(2).expect("seq"),
            row.try_get_by_index(3).expect("ordinal"),
        )
    })
    .collect()
}

/// The id of the API key named `name`.
pub(crate) async fn key_id(app: &TestApp, name: &str) -> i64 {
    let rows = crate::http::query(
        app,
        &format!("SELECT id FROM api_keys WHERE name = '{name}'"),
    )
    .await;
    rows.first()
        .expect("the key")
        .try_get_by_index(0)
        .expect("id")
}

/// Adds a reader row `reader` at position `seq`.`ordinal`, as a key's first read would.
async fn add_reader(app: &TestApp, reader: &str, seq: i64, ordinal: i64) {
    use sea_orm::sea_query::{Alias, Query};
    use sea_orm::ConnectionTrait;
    let insert = Query::insert()
        .into_table(Alias::new("feed_readers"))
        .columns(["reader", "seq", "ordinal", "read_at"].map(Alias::new))
        .values_panic([
            reader.into(),
            seq.into(),
            ordinal.into(),
            chrono::Utc::now().into(),
        ])
        .to_owned();
    app.db.execute(&insert).await.expect("reader added");
}

/// The names of a page of readers.
fn reader_names(page: &Value) -> Vec<&str> {
    page["readers"]
        .as_array()
        .expect("readers")
        .iter()
        .filter_map(|reader| reader["name"].as_str())
        .collect()
}

#[tokio::test]
async fn the_readers_are_paged_the_furthest_behind_first_and_one_that_reads_on_is_never_skipped() {
    let (app, providers) = three_changes().await;
    for (reader, seq, ordinal) in [
        ("r1", 1, 0),
        ("r2", 1, 0),
        ("r3", 2, 3),
        ("r4", 5, 0),
        ("r5", 9, 9),
    ] {
        add_reader(&app, reader, seq, ordinal).await;
    }
    let served = Served::start(&app, &providers).await;
    let admin = served.create_key("admin", &["admin"]);

    let (status, first) = served.get("/v1/changes/readers?limit=2", &admin).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(reader_names(&first), ["r1", "r2"], "{first}");
    // r1 reads on past r4 while the pages are read: it is listed again at its new
    // place, and no reader is skipped.
    {
        use sea_orm::sea_query::{Alias, ExprTrait, Query};
        use sea_orm::ConnectionTrait;
        let moved = Query::update()
            .table(Alias::new("feed_readers"))
            .value(Alias::new("seq"), 7)
            .and_where(Expr::col(Alias::new("reader")).eq("r1"))
            .to_owned();
        app.db.execute(&moved).await.expect("r1 moved");
    }
    let mut names = Vec::new();
    let mut next = first["next"].as_str().expect("next").to_string();
    loop {
        let (status, page) = served
            .get(
                &format!("/v1/changes/readers?limit=2&cursor={next}"),
                &admin,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{page}");
        // Each page reads the head afresh (on PostgreSQL it moves with transaction ids).
        assert!(page["head"].is_string(), "{page}");
        names.extend(reader_names(&page).into_iter().map(str::to_string));
        match page["next"].as_str() {
            Some(cursor) => next = cursor.to_string(),
            None => break,
        }
    }
    assert_eq!(names, ["r3", "r4", "r1", "r5"]);

    // A cursor of another list, or edited, and a limit out of range name their parameter.
    // `runs.1.0` and `readers.1.0.1.0`.
    assert_problems(
        &served,
        &admin,
        &[
            (
                "/v1/changes/readers?cursor=cnVucy4xLjA",
                StatusCode::BAD_REQUEST,
                Some("cursor"),
            ),
            (
                "/v1/changes/readers?cursor=cmVhZGVycy4xLjAuMS4w",
                StatusCode::BAD_REQUEST,
                Some("cursor"),
            ),
            (
                "/v1/changes/readers?limit=0",
                StatusCode::BAD_REQUEST,
                Some("limit"),
            ),
            (
                "/v1/changes/readers?limit=1001",
                StatusCode::BAD_REQUEST,
                Some("limit"),
            ),
        ],
    )
    .await;
}

#[tokio::test]
async fn two_keys_reading_the_feed_at_different_positions_are_listed_with_their_lag() {
    let (app, providers) = three_changes().await;
    // The page's one batch committed two hours ago.
    let hours_ago = chrono::Utc::now() - chrono::Duration::hours(2);
    change_batch::Entity::update_many()
        .col_expr(change_batch::Column::CommittedAt, Expr::value(hours_ago))
        .exec(&app.db)
        .await
        .expect("backdated");
    let served = Served::start(&app, &providers).await;
    let behind = served.create_key("behind", &["records:read"]);
    let current = served.create_key("current", &["records:read"]);
    let admin = served.create_key("admin", &["admin"]);

    // `behind` read one change of three, `current` all of them.
    let (status, first) = served.get("/v1/changes?limit=1", &behind).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let (status, all) = served.get("/v1/changes", &current).await;
    assert_eq!(status, StatusCode::OK, "{all}");
    let cursor = |page: &Value| -> FeedCursor {
        page["next_cursor"]
            .as_str()
            .expect("next_cursor")
            .parse()
            .expect("a cursor")
    };
    let (behind_at, current_at) = (cursor(&first).position, cursor(&all).position);
    let (behind_id, current_id) = (key_id(&app, "behind").await, key_id(&app, "current").await);
    let mut expected = vec![
        (
            format!("key:{behind_id}"),
            Some(behind_id),
            behind_at.seq,
            behind_at.ordinal,
        ),
        (
            format!("key:{current_id}"),
            Some(current_id),
            current_at.seq,
            current_at.ordinal,
        ),
    ];
    expected.sort();
    assert_eq!(reader_rows(&app).await, expected);

    // The readers as the API lists them, the furthest behind first, and the head (on
    // PostgreSQL it moves on with the transaction ids, so it is at least `current`'s).
    let (status, listed) = served.get("/v1/changes/readers", &admin).await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    let head: FeedCursor = listed["head"]
        .as_str()
        .expect("head")
        .parse()
        .expect("a cursor");
    assert_eq!(head.database, cursor(&all).database, "{listed}");
    match backend() {
        Backend::Postgres => assert!(head.position >= current_at, "{listed}"),
        _ => assert_eq!(head.position, current_at, "{listed}"),
    }
    let readers = listed["readers"].as_array().expect("readers");
    let names: Vec<&str> = readers.iter().filter_map(|r| r["name"].as_str()).collect();
    assert_eq!(names, ["behind", "current"], "{listed}");
    let (late, done) = (&readers[0], &readers[1]);
    assert_eq!(late["cursor"], first["next_cursor"], "{listed}");
    assert_eq!(late["changes_behind"], 2, "{listed}");
    assert_eq!(late["changes_behind_capped"], false, "{listed}");
    let waited = late["seconds_behind"].as_i64().expect("seconds_behind");
    assert!((7200..7300).contains(&waited), "{listed}");
    assert!(late["oldest_unread_committed_at"].is_string(), "{listed}");
    assert_eq!(done["cursor"], all["next_cursor"], "{listed}");
    assert_eq!(
        (&done["changes_behind"], &done["seconds_behind"]),
        (&json!(0), &json!(0)),
        "{listed}"
    );
    assert!(done["oldest_unread_committed_at"].is_null(), "{listed}");
    for reader in readers {
        assert_eq!(
            (&reader["expired"], &reader["idle_past_retention"]),
            (&json!(false), &json!(false)),
            "{listed}"
        );
        let prefix = reader["key_prefix"].as_str().expect("key_prefix");
        let key = if reader["name"] == "behind" {
            &behind
        } else {
            &current
        };
        assert!(key.starts_with(&format!("trb_{prefix}_")), "{listed}");
        assert!(!listed.to_string().contains(key.as_str()), "never the key");
    }
    // Only an admin key lists them.
    assert_scoped(&served, "/v1/changes/readers", &current).await;

    // The batch is swept: `behind`'s cursor is gone, as its next read will say.
    let swept = changes::sweep_expired_changes(&app.db, Duration::from_secs(60 * 60))
        .await
        .expect("swept");
    assert!(swept.swept_seq.is_some(), "{swept:?}");
    let (_, listed) = served.get("/v1/changes/readers", &admin).await;
    let expired: Vec<(&Value, &Value)> = listed["readers"]
        .as_array()
        .expect("readers")
        .iter()
        .map(|r| (&r["name"], &r["expired"]))
        .collect();
    assert_eq!(
        expired,
        [
            (&json!("behind"), &json!(true)),
            (&json!("current"), &json!(false))
        ],
        "{listed}"
    );
    let next = first["next_cursor"].as_str().expect("next_cursor");
    let (status, _) = served
        .get(&format!("/v1/changes?cursor={next}"), &behind)
        .await;
    assert_eq!(status, StatusCode::GONE);

    // A revoked key's row is deleted with the revocation.
    let revoked = run(tributary(&served.config).args(["api-keys", "revoke", "--name", "behind"]));
    assert_eq!(revoked.code, 0, "{}", revoked.stderr);
    let rows: Vec<String> = reader_rows(&app).await.into_iter().map(|r| r.0).collect();
    assert_eq!(rows, [format!("key:{current_id}")]);
    let (_, listed) = served.get("/v1/changes/readers", &admin).await;
    assert_eq!(
        listed["readers"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );
}
