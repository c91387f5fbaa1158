//! Deletion detection: a tracked full pass that walked the complete listing marks the
//! records it no longer returned deleted (never removed), a run whose listing is not known
//! complete marks nothing, the safety valve holds back a run that would mark too many, a
//! record seen again is restored, and the sightings stay out of `records`.

use std::time::Duration;

use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, PaginatorTrait, QueryFilter, Statement};
use serde_json::{json, Value};
use tributary::config::Settings;
use tributary::entities::change::ChangeKind;
use tributary::entities::sync_run::RunStatus;
use tributary::entities::{connection, connection_stream, record, run_sighting};
use tributary::pipeline::changes::{Cursor, FeedChange};
use tributary::pipeline::{NoProgress, PageExpectation, RunOptions, RunOutcome, RunPage};
use tributary::sync::{sync_matching, SyncFilter};
use tributary_providers::record::sha256_hex;
use tributary_providers::{PageItem, Record};
use wiremock::matchers::{method, path, query_param, query_param_is_missing};
use wiremock::{Mock, ResponseTemplate};

use crate::adapters::issue;
use crate::helpers::{
    backend, connections, cursor_provider, items, mount_cursor_pages, open_run, run, spawn_app,
    tributary, Backend, TestApp,
};

/// alice's cursor provider `acme` with `track_deletes = true` and `extra` provider keys.
fn tracked(app: &TestApp, extra: &str) -> String {
    cursor_provider("acme", &app.api.uri(), &["alice"]).replacen(
        "auth = \"bearer\"\n",
        &format!("auth = \"bearer\"\ntrack_deletes = true\n{extra}\n"),
        1,
    )
}

/// Lists `pages` (each a page's records) as alice's cursor listing, replacing the last.
async fn list(app: &TestApp, pages: Vec<Vec<Value>>) {
    app.api.reset().await;
    let count = pages.len();
    let names: Vec<String> = (0..count).map(|index| format!("p{}", index + 2)).collect();
    let pages = pages
        .into_iter()
        .enumerate()
        .map(|(index, data)| {
            let next = (index + 1 < count).then(|| names[index].as_str());
            (Value::Array(data), next)
        })
        .collect();
    mount_cursor_pages(&app.api, pages).await;
}

/// The listing's first page for a request without a cursor, pointing at `p2`.
async fn mount_first_page(app: &TestApp, data: Vec<Value>) {
    app.api.reset().await;
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .and(query_param_is_missing("cursor"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({"data": data, "next_cursor": "p2"})),
        )
        .mount(&app.api)
        .await;
}

/// Page `p2` answered with `response`.
async fn mount_second_page(app: &TestApp, response: ResponseTemplate) {
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .and(query_param("cursor", "p2"))
        .respond_with(response)
        .mount(&app.api)
        .await;
}

/// Ten records k0..k9 stored by a first tracked sync; returns its settings.
async fn ten_records(app: &TestApp, extra: &str) -> Settings {
    let settings = app.settings(&tracked(app, extra)).await;
    list(app, vec![items("k", "alice", 0..10)]).await;
    let first = app.sync_one(&settings).await;
    assert_eq!(
        (first.status, first.counts.inserted, first.counts.deleted),
        (RunStatus::Succeeded, 10, 0),
        "{first:?}"
    );
    settings
}

/// The external ids of the records marked deleted, in key order.
async fn deleted_ids(app: &TestApp) -> Vec<String> {
    app.records()
        .await
        .into_iter()
        .filter(|r| r.deleted_at.is_some())
        .map(|r| r.external_id)
        .collect()
}

async fn sightings(app: &TestApp) -> u64 {
    run_sighting::Entity::find()
        .count(&app.db)
        .await
        .expect("sightings")
}

/// Nothing marked deleted, the run counted none, and its sightings are gone.
async fn assert_nothing_deleted(app: &TestApp, outcome: &RunOutcome) {
    assert_eq!(deleted_ids(app).await, Vec::<String>::new(), "{outcome:?}");
    assert_eq!(outcome.counts.deleted, 0);
    assert_eq!(app.run_row(outcome.run_id).await.records_deleted, 0);
    assert!(app
        .records()
        .await
        .iter()
        .all(|r| r.deleted_by_run_id.is_none()));
    assert_eq!(sightings(app).await, 0, "the run's sightings are removed");
}

/// Every change after `since` committed so far.
async fn feed_after(app: &TestApp, since: Cursor) -> Vec<FeedChange> {
    crate::helpers::read_feed(&app.db, since, 1_000).await.0
}

/// The cursor after every change committed so far. On PostgreSQL the head can still be
/// below a batch just committed while another test's older transaction runs, so this
/// reads the feed until it has passed the newest batch.
async fn head(app: &TestApp) -> Cursor {
    crate::helpers::read_feed(&app.db, Cursor::START, 1_000)
        .await
        .1
}

#[tokio::test]
async fn a_complete_pass_marks_the_records_it_no_longer_returned_deleted() {
    let app = spawn_app().await;
    let settings = ten_records(&app, "").await;
    let before = head(&app).await;
    // Two pages, so the sightings of both count; k3 and k9 are gone.
    let mut kept = items("k", "alice", 0..10);
    kept.retain(|item| item["id"] != "k3" && item["id"] != "k9");
    let (first, second) = kept.split_at(4);
    list(&app, vec![first.to_vec(), second.to_vec()]).await;
    let pass = app.sync_one(&settings).await;

    assert_eq!(pass.status, RunStatus::Succeeded, "{pass:?}");
    assert_eq!((pass.counts.deleted, pass.counts.unchanged), (2, 8));
    assert_eq!(deleted_ids(&app).await, ["k3", "k9"]);
    for record in app.records().await {
        match record.deleted_at {
            Some(_) => assert_eq!(record.deleted_by_run_id, Some(pass.run_id)),
            None => assert_eq!(record.deleted_by_run_id, None),
        }
    }
    assert_eq!(app.records().await.len(), 10, "marked, never removed");
    let row = app.run_row(pass.run_id).await;
    assert_eq!((row.records_deleted, row.records_restored), (2, 0));
    assert_eq!(sightings(&app).await, 0);

    // Each deletion is a change: shown deleted, without its payload.
    let feed = feed_after(&app, before).await;
    let deleted: Vec<(&str, ChangeKind, bool, bool)> = feed
        .iter()
        .map(|c| {
            (
                c.external_id.as_str(),
                c.kind,
                c.deleted,
                c.payload.is_none(),
            )
        })
        .collect();
    assert_eq!(
        deleted,
        [
            ("k3", ChangeKind::Deleted, true, true),
            ("k9", ChangeKind::Deleted, true, true)
        ]
    );
    assert!(feed.iter().all(|c| c.run_id == pass.run_id));

    // `runs --json` shows the counters; a second pass marks nothing more.
    let config = app.write_config(&tracked(&app, ""));
    let output = run(tributary(&config).args(["runs", "--json"]));
    assert_eq!(output.code, 0, "{}", output.stderr);
    let runs: Value = serde_json::from_str(&output.stdout).expect("runs JSON");
    let shown = runs
        .as_array()
        .expect("an array")
        .iter()
        .find(|r| r["id"] == pass.run_id)
        .expect("the run is listed");
    assert_eq!(shown["records_deleted"], 2);
    assert_eq!(shown["records_restored"], 0);
    let again = app.sync_one(&settings).await;
    assert_eq!((again.counts.deleted, again.counts.unchanged), (0, 8));
    assert_eq!(deleted_ids(&app).await, ["k3", "k9"]);
}

#[tokio::test]
async fn sync_prints_the_deleted_and_restored_counts() {
    let app = spawn_app().await;
    ten_records(&app, "").await;
    list(&app, vec![items("k", "alice", 0..8)]).await;
    let config = app.write_config(&tracked(&app, ""));
    let output = run(tributary(&config).args(["sync", "--quiet"]));
    assert_eq!(output.code, 0, "{}", output.stderr);
    assert!(
        output.stdout.contains("failed=0 deleted=2 restored=0"),
        "{}",
        output.stdout
    );
}

#[tokio::test]
async fn a_failed_page_marks_nothing_deleted() {
    let app = spawn_app().await;
    let settings = ten_records(&app, "").await;
    mount_first_page(&app, items("k", "alice", 0..5)).await;
    mount_second_page(&app, ResponseTemplate::new(500)).await;
    let run = app.sync_one(&settings).await;
    assert_eq!(run.status, RunStatus::Failed, "{run:?}");
    assert_nothing_deleted(&app, &run).await;
}

#[tokio::test]
async fn a_run_stopped_by_a_rate_limit_marks_nothing_deleted() {
    let app = spawn_app().await;
    let provider = tracked(&app, "").replacen(
        "retry_max_delay = \"5ms\"\n",
        "retry_max_delay = \"5ms\"\nmax_rate_limit_wait = \"1s\"\n",
        1,
    );
    let settings = app.settings(&provider).await;
    list(&app, vec![items("k", "alice", 0..10)]).await;
    app.sync_one(&settings).await;
    mount_first_page(&app, items("k", "alice", 0..5)).await;
    mount_second_page(
        &app,
        ResponseTemplate::new(429).insert_header("retry-after", "3600"),
    )
    .await;
    let run = app.sync_one(&settings).await;
    assert_eq!(run.status, RunStatus::Partial, "{run:?}");
    assert!(run.error.as_deref().unwrap_or("").contains("stopped early"));
    assert_nothing_deleted(&app, &run).await;
}

#[tokio::test]
async fn a_run_stopped_by_max_pages_marks_nothing_deleted() {
    let app = spawn_app().await;
    let settings = ten_records(&app, "max_pages = 1").await;
    list(
        &app,
        vec![items("k", "alice", 0..5), items("k", "alice", 5..8)],
    )
    .await;
    let run = app.sync_one(&settings).await;
    assert_eq!(run.status, RunStatus::Failed, "{run:?}");
    assert!(run.error.as_deref().unwrap_or("").contains("max_pages"));
    assert_nothing_deleted(&app, &run).await;
}

#[tokio::test]
async fn a_run_that_timed_out_marks_nothing_deleted() {
    let app = spawn_app().await;
    let settings = ten_records(&app, "run_timeout = \"1s\"").await;
    mount_first_page(&app, items("k", "alice", 0..5)).await;
    let late = json!({"data": items("k", "alice", 5..8), "next_cursor": null});
    mount_second_page(
        &app,
        ResponseTemplate::new(200)
            .set_body_json(late)
            .set_delay(Duration::from_secs(3)),
    )
    .await;
    let run = app.sync_one(&settings).await;
    assert_eq!(run.status, RunStatus::Failed, "{run:?}");
    assert!(run.error.as_deref().unwrap_or("").contains("run_timeout"));
    assert_nothing_deleted(&app, &run).await;
}

#[tokio::test]
async fn a_run_resumed_from_a_checkpoint_marks_nothing_deleted() {
    let app = spawn_app().await;
    ten_records(&app, "max_pages = 1").await;
    // The first run of the short listing stops after its first page (which changes a
    // record, so it commits the checkpoint at the second); the next one goes on from
    // there to the end.
    let mut first_page = items("k", "alice", 0..5);
    first_page[0]["n"] = json!(100);
    list(&app, vec![first_page, items("k", "alice", 5..8)]).await;
    let limited = app.settings(&tracked(&app, "max_pages = 1")).await;
    let stopped = app.sync_one(&limited).await;
    assert_eq!(stopped.status, RunStatus::Failed, "{stopped:?}");
    let unlimited = app.settings(&tracked(&app, "")).await;
    let resumed = app.sync_one(&unlimited).await;
    assert_eq!(
        (resumed.status, resumed.counts.pages_fetched, &resumed.error),
        (RunStatus::Succeeded, 1, &None),
        "{resumed:?}"
    );
    assert_nothing_deleted(&app, &resumed).await;
    // The next run walks the listing from its start, and decides.
    let complete = app.sync_one(&unlimited).await;
    assert_eq!(complete.counts.deleted, 2, "{complete:?}");
    assert_eq!(deleted_ids(&app).await, ["k8", "k9"]);
}

#[tokio::test]
async fn a_full_pass_that_resumed_from_a_checkpoint_stays_owed() {
    let app = spawn_app().await;
    ten_records(&app, "").await;
    let owe = |owed: i64| {
        let app = &app;
        async move {
            connection_stream::Entity::update_many()
                .col_expr(connection_stream::Column::FullPassesOwed, owed.into())
                .exec(&app.db)
                .await
                .expect("owed written");
        }
    };
    let owed = || async {
        connection_stream::Entity::find()
            .one(&app.db)
            .await
            .expect("query")
            .expect("alice's stream")
            .full_passes_owed
    };
    owe(1).await;
    // The owed pass stops after its first page (which changes a record, so it commits the
    // checkpoint at the second); the next run goes on from there to the end.
    let mut first_page = items("k", "alice", 0..5);
    first_page[0]["n"] = json!(100);
    list(&app, vec![first_page, items("k", "alice", 5..8)]).await;
    let limited = app.settings(&tracked(&app, "max_pages = 1")).await;
    let stopped = app.sync_one(&limited).await;
    assert_eq!(stopped.status, RunStatus::Failed, "{stopped:?}");
    let unlimited = app.settings(&tracked(&app, "")).await;
    let resumed = app.sync_one(&unlimited).await;
    assert_eq!(
        (resumed.status, resumed.counts.pages_fetched),
        (RunStatus::Succeeded, 1),
        "{resumed:?}"
    );
    assert_nothing_deleted(&app, &resumed).await;
    assert_eq!(owed().await, 1, "the tail of a listing is not a full pass");
    // The next run walks the listing from its start, decides, and serves the pass.
    let complete = app.sync_one(&unlimited).await;
    assert_eq!(
        (complete.counts.pages_fetched, complete.counts.deleted),
        (2, 2),
        "{complete:?}"
    );
    assert_eq!(deleted_ids(&app).await, ["k8", "k9"]);
    assert_eq!(owed().await, 0);
}

#[tokio::test]
async fn an_incremental_run_marks_nothing_deleted_and_a_full_pass_does() {
    let app = spawn_app().await;
    let provider = format!(
        "[providers.gh]\nkind = \"github\"\nbase_url = \"{}\"\nschedule = \"0 * * * * *\"\n\
         track_deletes = true\nfull_sync_schedule = \"0 0 3 * * *\"\n{}",
        app.api.uri(),
        connections("gh", &["alice"])
    );
    let settings = app.settings(&provider).await;
    let mount = |issues: Vec<Value>| {
        let app = &app;
        async move {
            app.api.reset().await;
            Mock::given(method("GET"))
                .and(path("/issues"))
                .respond_with(ResponseTemplate::new(200).set_body_json(Value::Array(issues)))
                .mount(&app.api)
                .await;
        }
    };
    mount(vec![
        issue(1, "2026-11-01T10:00:00Z"),
        issue(2, "2026-11-01T11:00:00Z"),
        issue(3, "2026-11-01T12:00:00Z"),
    ])
    .await;
    let first = app.sync_one(&settings).await;
    assert_eq!(first.counts.inserted, 3, "{first:?}");

    // Incremental: the answer holds only what changed since the cursor.
    mount(vec![issue(3, "2026-11-01T12:00:00Z")]).await;
    let incremental = app.sync_one(&settings).await;
    assert_eq!(incremental.status, RunStatus::Succeeded, "{incremental:?}");
    assert_nothing_deleted(&app, &incremental).await;

    // A full pass (`sync --full`, or a firing of full_sync_schedule) decides.
    mount(vec![
        issue(1, "2026-11-01T10:00:00Z"),
        issue(3, "2026-11-01T12:00:00Z"),
    ])
    .await;
    let options = RunOptions {
        full: true,
        ..RunOptions::manual()
    };
    let full = sync_matching(
        &app.db,
        &settings,
        &SyncFilter::default(),
        &options,
        &NoProgress,
    )
    .await
    .expect("runs recorded")
    .outcomes
    .remove(0);
    assert_eq!(
        (full.status, full.counts.deleted),
        (RunStatus::Succeeded, 1)
    );
    assert_eq!(deleted_ids(&app).await, ["2"]);
}

#[tokio::test]
async fn a_record_that_cannot_be_keyed_keeps_every_deletion_and_says_why() {
    let app = spawn_app().await;
    let settings = ten_records(&app, "").await;
    let mut listing = items("k", "alice", 0..8);
    listing.push(json!({"owner": "alice", "n": 99}));
    list(&app, vec![listing]).await;
    let run = app.sync_one(&settings).await;
    assert_eq!(run.status, RunStatus::Partial, "{run:?}");
    let error = run.error.clone().unwrap_or_default();
    assert!(error.contains("could not be keyed"), "{error}");
    assert_eq!(
        app.run_row(run.run_id).await.error.as_deref(),
        Some(&*error)
    );
    assert_nothing_deleted(&app, &run).await;
}

#[tokio::test]
async fn a_record_set_aside_with_its_key_counts_as_seen() {
    let app = spawn_app().await;
    let settings = ten_records(&app, "").await;
    app.refuse_updates_of("k3", "k3 is frozen").await;
    let mut listing = items("k", "alice", 0..9);
    listing[3]["n"] = json!(300);
    list(&app, vec![listing]).await;
    let run = app.sync_one(&settings).await;
    assert_eq!(
        (run.status, run.counts.failed, run.counts.deleted),
        (RunStatus::Partial, 1, 1),
        "{run:?}"
    );
    let errors = app.run_errors(run.run_id).await;
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].external_id.as_deref(), Some("k3"));
    assert_eq!(deleted_ids(&app).await, ["k9"], "k3 was seen");
}

#[tokio::test]
async fn the_safety_valve_holds_back_a_run_that_would_delete_too_much() {
    let app = spawn_app().await;
    let settings = ten_records(&app, "").await;
    // Six of ten gone is more than the default half.
    list(&app, vec![items("k", "alice", 0..4)]).await;
    let held = app.sync_one(&settings).await;
    assert_eq!(held.status, RunStatus::Partial, "{held:?}");
    let reason = held.error.clone().unwrap_or_default();
    assert!(
        reason.contains("6 of the connection's 10 live records")
            && reason.contains("max_delete_fraction = 0.5"),
        "{reason}"
    );
    assert_eq!(app.run_row(held.run_id).await.status, RunStatus::Partial);
    assert_eq!(
        app.run_row(held.run_id).await.error.as_deref(),
        Some(&*reason)
    );
    assert_nothing_deleted(&app, &held).await;

    // An empty listing (an outage answering `[]`) wipes nothing either.
    list(&app, vec![vec![]]).await;
    let empty = app.sync_one(&settings).await;
    assert_eq!(empty.status, RunStatus::Partial, "{empty:?}");
    assert_nothing_deleted(&app, &empty).await;

    // The next complete run decides again: four of ten is within the valve.
    list(&app, vec![items("k", "alice", 0..6)]).await;
    let decided = app.sync_one(&settings).await;
    assert_eq!(
        (decided.status, decided.counts.deleted),
        (RunStatus::Succeeded, 4),
        "{decided:?}"
    );
    assert_eq!(deleted_ids(&app).await, ["k6", "k7", "k8", "k9"]);
}

#[tokio::test]
async fn max_delete_fraction_sets_the_valve() {
    let app = spawn_app().await;
    let settings = ten_records(&app, "max_delete_fraction = 1.0").await;
    list(&app, vec![items("k", "alice", 0..2)]).await;
    let run = app.sync_one(&settings).await;
    assert_eq!((run.status, run.counts.deleted), (RunStatus::Succeeded, 8));
}

#[tokio::test]
async fn the_valve_measures_the_records_live_before_the_run() {
    let app = spawn_app().await;
    let settings = ten_records(&app, "").await;
    // A listing that replaced everything (another tenant's page, a changed `id_field`):
    // the 30 new ids must not dilute the 10 the run would lose.
    list(&app, vec![items("other", "alice", 0..30)]).await;
    let held = app.sync_one(&settings).await;
    assert_eq!(
        (held.status, held.counts.inserted),
        (RunStatus::Partial, 30),
        "{held:?}"
    );
    let reason = held.error.clone().unwrap_or_default();
    assert!(
        reason.contains("none of the stream's 10 records that were live before the run"),
        "{reason}"
    );
    assert_nothing_deleted(&app, &held).await;
}

#[tokio::test]
async fn records_the_run_restored_do_not_dilute_the_valve() {
    let app = spawn_app().await;
    let settings = ten_records(&app, "").await;
    list(&app, vec![items("k", "alice", 0..6)]).await;
    let first = app.sync_one(&settings).await;
    assert_eq!(first.counts.deleted, 4, "{first:?}");
    // k6..k9 come back and k1..k5 are gone: five of the six live before the run, not
    // five of the ten live at its end.
    let mut listing = items("k", "alice", 6..10);
    listing.extend(items("k", "alice", 0..1));
    list(&app, vec![listing]).await;
    let held = app.sync_one(&settings).await;
    assert_eq!(
        (held.status, held.counts.restored, held.counts.deleted),
        (RunStatus::Partial, 4, 0),
        "{held:?}"
    );
    let reason = held.error.clone().unwrap_or_default();
    assert!(
        reason.contains("5 of the connection's 6 live records"),
        "{reason}"
    );
    assert_eq!(deleted_ids(&app).await, Vec::<String>::new());
}

#[tokio::test]
async fn a_run_never_marks_every_live_record_deleted_whatever_the_valve() {
    let app = spawn_app().await;
    let settings = app
        .settings(&tracked(&app, "max_delete_fraction = 1.0"))
        .await;
    list(&app, vec![items("k", "alice", 0..1)]).await;
    let first = app.sync_one(&settings).await;
    assert_eq!(first.counts.inserted, 1, "{first:?}");
    // One of one gone, with one new id beside it.
    list(&app, vec![items("other", "alice", 0..1)]).await;
    let held = app.sync_one(&settings).await;
    assert_eq!(held.status, RunStatus::Partial, "{held:?}");
    assert!(
        held.error
            .as_deref()
            .unwrap_or_default()
            .contains("a run never marks every live record deleted"),
        "{held:?}"
    );
    assert_nothing_deleted(&app, &held).await;
    // Short of every record, the setting decides: one of the two live is within 1.0.
    let decided = app.sync_one(&settings).await;
    assert_eq!(
        (decided.status, decided.counts.deleted),
        (RunStatus::Succeeded, 1),
        "{decided:?}"
    );
    assert_eq!(deleted_ids(&app).await, ["k0"]);
}

#[tokio::test]
async fn a_record_seen_again_is_restored_and_the_feed_says_so() {
    let app = spawn_app().await;
    let settings = ten_records(&app, "").await;
    list(&app, vec![items("k", "alice", 0..8)]).await;
    let deleting = app.sync_one(&settings).await;
    assert_eq!(deleting.counts.deleted, 2);
    let before = head(&app).await;

    // k8 comes back unchanged, k9 with new content: both are restored.
    let mut listing = items("k", "alice", 0..10);
    listing[9]["n"] = json!(900);
    list(&app, vec![listing]).await;
    let restoring = app.sync_one(&settings).await;
    assert_eq!(
        (
            restoring.status,
            restoring.counts.restored,
            restoring.counts.updated,
            restoring.counts.unchanged,
            restoring.counts.deleted
        ),
        (RunStatus::Succeeded, 2, 0, 8, 0),
        "{restoring:?}"
    );
    assert_eq!(deleted_ids(&app).await, Vec::<String>::new());
    let records = app.records().await;
    for id in ["k8", "k9"] {
        let record = records.iter().find(|r| r.external_id == id).unwrap();
        assert_eq!(
            (record.deleted_at, record.deleted_by_run_id),
            (None, None),
            "{id}"
        );
        assert_eq!(record.last_seen_run_id, restoring.run_id);
    }
    let k9 = records.iter().find(|r| r.external_id == "k9").unwrap();
    assert!(k9.payload.contains("900"), "{}", k9.payload);
    assert_eq!(app.run_row(restoring.run_id).await.records_restored, 2);
    let feed = feed_after(&app, before).await;
    let restored: Vec<(&str, ChangeKind, bool)> = feed
        .iter()
        .map(|c| (c.external_id.as_str(), c.kind, c.deleted))
        .collect();
    assert_eq!(
        restored,
        [
            ("k8", ChangeKind::Restored, false),
            ("k9", ChangeKind::Restored, false)
        ]
    );
    assert!(feed.iter().all(|c| c.payload.is_some()));
}

#[tokio::test]
async fn a_deleted_record_on_a_page_guessed_new_is_restored_not_skipped() {
    let app = spawn_app().await;
    let settings = ten_records(&app, "").await;
    list(&app, vec![items("k", "alice", 0..9)]).await;
    assert_eq!(app.sync_one(&settings).await.counts.deleted, 1);
    // The first page is all new, so the second is guessed new: k9 is on it.
    let mut second = items("n", "alice", 3..5);
    second.extend(items("k", "alice", 9..10));
    list(
        &app,
        vec![items("n", "alice", 0..3), second, items("k", "alice", 0..9)],
    )
    .await;
    let run = app.sync_one(&settings).await;
    assert_eq!(
        (
            run.counts.inserted,
            run.counts.restored,
            run.counts.duplicate,
            run.counts.deleted
        ),
        (5, 1, 0, 0),
        "{run:?}"
    );
    assert_eq!(deleted_ids(&app).await, Vec::<String>::new());
}

/// Counts every row written to `records` in `record_writes`, by triggers.
async fn count_record_writes(app: &TestApp) {
    app.execute("CREATE TABLE record_writes (n BIGINT NOT NULL)")
        .await;
    app.execute("INSERT INTO record_writes (n) VALUES (0)")
        .await;
    match backend() {
        Backend::Postgres => {
            app.execute(
                "CREATE FUNCTION count_record_write() RETURNS trigger AS $$ BEGIN \
                 UPDATE record_writes SET n = n + 1; RETURN NULL; END $$ LANGUAGE plpgsql",
            )
            .await;
            app.execute(
                "CREATE TRIGGER count_record_writes AFTER INSERT OR UPDATE OR DELETE ON records \
                 FOR EACH ROW EXECUTE FUNCTION count_record_write()",
            )
            .await;
        }
        Backend::Mysql => {
            for event in ["INSERT", "UPDATE", "DELETE"] {
                app.execute(&format!(
                    "CREATE TRIGGER count_record_{event} AFTER {event} ON records FOR EACH ROW \
                     UPDATE record_writes SET n = n + 1"
                ))
                .await;
            }
        }
        Backend::Sqlite => {
            for event in ["INSERT", "UPDATE", "DELETE"] {
                app.execute(&format!(
                    "CREATE TRIGGER count_record_{event} AFTER {event} ON records \
                     BEGIN UPDATE record_writes SET n = n + 1; END"
                ))
                .await;
            }
        }
    }
}

async fn record_writes(app: &TestApp) -> i64 {
    let row = app
        .db
        .query_one_raw(Statement::from_string(
            app.db.get_database_backend(),
            "SELECT n FROM record_writes",
        ))
        .await
        .expect("write count")
        .expect("a row");
    row.try_get("", "n").expect("n")
}

#[tokio::test]
async fn an_unchanged_resync_with_tracking_writes_nothing_to_records() {
    let app = spawn_app().await;
    let settings = app.settings(&tracked(&app, "")).await;
    list(
        &app,
        vec![
            items("k", "alice", 0..4),
            items("k", "alice", 4..8),
            items("k", "alice", 8..10),
        ],
    )
    .await;
    assert_eq!(app.sync_one(&settings).await.counts.inserted, 10);
    let stored = app.dump_records().await;
    count_record_writes(&app).await;
    let again = app.sync_one(&settings).await;
    assert_eq!(
        (again.status, again.counts.unchanged, again.counts.deleted),
        (RunStatus::Succeeded, 10, 0),
        "{again:?}"
    );
    assert_eq!(
        record_writes(&app).await,
        0,
        "no row of records was written"
    );
    assert_eq!(app.dump_records().await, stored);
    assert_eq!(sightings(&app).await, 0);
}

#[tokio::test]
async fn a_run_killed_midway_marks_nothing_and_its_sightings_are_removed() {
    let app = spawn_app().await;
    let settings = ten_records(&app, "").await;
    let connection = connection::Entity::find()
        .one(&app.db)
        .await
        .expect("query")
        .expect("alice's connection");
    // A run that stored one page of a short listing, then died before it closed.
    let mut killed_run = open_run(&app.db, &connection).await;
    let killed = killed_run.id();
    let page: Vec<PageItem> = items("k", "alice", 0..2)
        .iter()
        .map(|item| {
            let payload = item.to_string();
            PageItem::Record(Record {
                external_id: item["id"].as_str().expect("an id").to_string(),
                content_hash: sha256_hex(payload.as_bytes()),
                payload,
            })
        })
        .collect();
    killed_run
        .store(RunPage {
            items: page,
            mode: tributary::config::WriteMode::Upsert,
            leave_checkpoint: true,
            expect: PageExpectation::Unknown,
            sightings: true,
            ..RunPage::default()
        })
        .await
        .expect("page stored");
    let orphaned = run_sighting::Entity::find()
        .filter(run_sighting::Column::RunId.eq(killed))
        .count(&app.db)
        .await
        .expect("sightings");
    assert_eq!(orphaned, 2);
    assert_eq!(deleted_ids(&app).await, Vec::<String>::new());

    // The connection's next run removes them, and decides on its own sightings only.
    list(&app, vec![items("k", "alice", 0..10)]).await;
    let next = app.sync_one(&settings).await;
    assert_eq!(
        (next.status, next.counts.deleted),
        (RunStatus::Succeeded, 0)
    );
    assert_eq!(sightings(&app).await, 0);
    let live = record::Entity::find()
        .filter(record::Column::DeletedAt.is_null())
        .count(&app.db)
        .await
        .expect("records");
    assert_eq!(live, 10);
}

/// A record another run wrote while the pass walked its listing may have come into the
/// listing after the pass went past its place: the pass does not mark it deleted.
#[tokio::test]
async fn a_record_written_by_another_run_during_the_pass_is_not_marked_deleted() {
    let app = spawn_app().await;
    let settings = ten_records(&app, "").await;
    let connection = connection::Entity::find()
        .one(&app.db)
        .await
        .expect("query")
        .expect("alice's connection");
    mount_first_page(&app, items("k", "alice", 0..5)).await;
    let rest = json!({"data": items("k", "alice", 5..10), "next_cursor": null});
    mount_second_page(
        &app,
        ResponseTemplate::new(200)
            .set_body_json(rest)
            .set_delay(Duration::from_millis(1500)),
    )
    .await;
    let pass = app.sync_one(&settings);
    let other_writer = async {
        // Once the pass has started, another run stores k10.
        loop {
            let running = tributary::entities::sync_run::Entity::find()
                .filter(
                    tributary::entities::sync_run::Column::Status
                        .eq(tributary::entities::sync_run::RunStatus::Running),
                )
                .count(&app.db)
                .await
                .expect("sync_runs");
            if running > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut other = open_run(&app.db, &connection).await;
        let payload = items("k", "alice", 10..11)[0].to_string();
        let page = vec![PageItem::Record(Record {
            external_id: "k10".to_string(),
            content_hash: sha256_hex(payload.as_bytes()),
            payload,
        })];
        other
            .store(RunPage {
                items: page,
                mode: tributary::config::WriteMode::Upsert,
                leave_checkpoint: true,
                expect: PageExpectation::Unknown,
                ..RunPage::default()
            })
            .await
            .expect("page stored");
    };
    let (run, ()) = tokio::join!(pass, other_writer);
    assert_eq!(
        (run.status, run.counts.deleted),
        (RunStatus::Succeeded, 0),
        "{run:?}"
    );
    assert_eq!(deleted_ids(&app).await, Vec::<String>::new());
    assert_eq!(app.records().await.len(), 11);
}

#[tokio::test]
async fn the_webhook_body_counts_deletions_and_restorations() {
    let app = spawn_app().await;
    let notify = "\n[notify]\nurl = \"https://hooks.example.com/tributary\"\nsecret_env = \"TRIBUTARY_TEST_HOOK_SECRET\"\n";
    let provider = format!("{}{notify}", tracked(&app, ""));
    let settings = app.settings(&provider).await;
    list(&app, vec![items("k", "alice", 0..4)]).await;
    app.sync_one(&settings).await;
    list(&app, vec![items("k", "alice", 0..3)]).await;
    let deleting = app.sync_one(&settings).await;
    list(&app, vec![items("k", "alice", 0..4)]).await;
    let restoring = app.sync_one(&settings).await;
    // An unchanged run announces nothing.
    let unchanged = app.sync_one(&settings).await;
    assert_eq!(unchanged.counts.unchanged, 4);

    let bodies: Vec<(i64, Value)> = tributary::entities::notification_delivery::Entity::find()
        .all(&app.db)
        .await
        .expect("deliveries")
        .into_iter()
        .map(|row| {
            (
                row.run_id.unwrap_or_default(),
                serde_json::from_str(&row.body).expect("JSON"),
            )
        })
        .collect();
    assert_eq!(bodies.len(), 3, "{bodies:?}");
    let body_of = |run_id: i64| {
        &bodies
            .iter()
            .find(|(id, _)| *id == run_id)
            .expect("a delivery for the run")
            .1
    };
    let counts = &body_of(deleting.run_id)["counts"];
    assert_eq!(
        (&counts["inserted"], &counts["deleted"], &counts["restored"]),
        (&json!(0), &json!(1), &json!(0)),
        "a run that only deleted notifies: {counts}"
    );
    let counts = &body_of(restoring.run_id)["counts"];
    assert_eq!(
        (&counts["updated"], &counts["deleted"], &counts["restored"]),
        (&json!(0), &json!(0), &json!(1)),
        "{counts}"
    );
}

#[tokio::test]
async fn check_config_names_a_bad_deletion_key() {
    let app = spawn_app().await;
    for (extra, key, expected) in [
        (
            "max_delete_fraction = 0.0",
            "providers.acme.max_delete_fraction",
            "greater than 0 and at most 1",
        ),
        (
            "max_delete_fraction = 1.5",
            "providers.acme.max_delete_fraction",
            "greater than 0 and at most 1",
        ),
        (
            "full_sync_schedule = \"every night\"",
            "providers.acme.full_sync_schedule",
            "not a valid cron expression",
        ),
        (
            "mode = \"append\"\nretention = \"1d\"",
            "providers.acme.track_deletes",
            "only applies with mode = \"upsert\"",
        ),
        ("track_deletions = true", "track_deletions", "unknown field"),
    ] {
        let config = app.write_config(&tracked(&app, extra));
        let output = run(tributary(&config).arg("check-config"));
        assert_ne!(output.code, 0, "{extra}: {}", output.stdout);
        assert!(
            output.stderr.contains(key) && output.stderr.contains(expected),
            "{extra}: {}",
            output.stderr
        );
        assert!(
            output.stderr.contains(&*config.display().to_string()),
            "{}",
            output.stderr
        );
    }
    let config = app.write_config(&tracked(
        &app,
        "max_delete_fraction = 0.25\nfull_sync_schedule = \"0 0 3 * * *\"",
    ));
    let output = run(tributary(&config).arg("check-config"));
    assert_eq!(output.code, 0, "{}", output.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_pass_due_while_the_connection_is_busy_stays_owed_until_a_run_makes_it() {
    let app = spawn_app().await;
    // The full pass falls due a few seconds from now, once; the schedule fires every second.
    let due = chrono::Utc::now() + chrono::TimeDelta::seconds(3);
    let provider = format!(
        "{}[providers.gh]\nkind = \"github\"\nbase_url = \"{}\"\nschedule = \"* * * * * *\"\n\
         track_deletes = true\nfull_sync_schedule = \"{}\"\n{}",
        crate::daemon::daemon_table(None),
        app.api.uri(),
        due.format("%S %M %H * * *"),
        connections("gh", &["alice"])
    );
    let settings = app.settings(&provider).await;
    let mount = |issues: Vec<Value>| {
        let app = &app;
        async move {
            app.api.reset().await;
            Mock::given(method("GET"))
                .and(path("/issues"))
                .respond_with(ResponseTemplate::new(200).set_body_json(Value::Array(issues)))
                .mount(&app.api)
                .await;
        }
    };
    mount(vec![
        issue(1, "2026-11-01T10:00:00Z"),
        issue(2, "2026-11-01T11:00:00Z"),
        issue(3, "2026-11-01T12:00:00Z"),
    ])
    .await;
    let first = app.sync_one(&settings).await;
    assert_eq!(first.counts.inserted, 3, "{first:?}");
    // Issue 2 is gone: only a full pass can tell.
    mount(vec![
        issue(1, "2026-11-01T10:00:00Z"),
        issue(3, "2026-11-01T12:00:00Z"),
    ])
    .await;

    // Another process's long run holds the connection while the full pass falls due.
    let lease = |holder: Option<&str>| {
        let app = &app;
        let holder = holder.map(str::to_string);
        async move {
            let until = holder
                .as_ref()
                .map(|_| chrono::Utc::now() + chrono::TimeDelta::hours(1));
            connection::Entity::update_many()
                .col_expr(connection::Column::LeaseHolder, holder.into())
                .col_expr(connection::Column::LeaseExpiresAt, until.into())
                .exec(&app.db)
                .await
                .expect("lease written");
        }
    };
    lease(Some("elsewhere:1:busy")).await;
    let owed = || async {
        connection_stream::Entity::find()
            .one(&app.db)
            .await
            .expect("query")
            .expect("alice's stream")
            .full_passes_owed
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let daemon_settings = app.settings(&provider).await;
    let daemon = tributary::daemon::run(&daemon_settings, app.db.clone(), async {
        let _ = stopped.await;
    });
    let checks = async {
        crate::daemon::eventually(Duration::from_secs(30), "the full firing", || async {
            owed().await > 0
        })
        .await;
        let _ = stop.send(());
    };
    let (result, ()) = tokio::join!(daemon, checks);
    result.expect("the daemon stops cleanly");
    assert_eq!(
        crate::daemon::runs_of(&app, "alice").await.len(),
        1,
        "the busy connection was skipped"
    );

    // The daemon that noted it is gone; the connection's next run, an ordinary sync, makes
    // the full pass it is owed, and then owes none.
    lease(None).await;
    let next = app.sync_one(&settings).await;
    assert_eq!(
        (next.status, next.counts.deleted),
        (RunStatus::Succeeded, 1),
        "{next:?}"
    );
    assert_eq!(deleted_ids(&app).await, ["2"]);
    assert_eq!(owed().await, 0);
    // Served: the next run asks only for what changed since the cursor.
    app.api.reset().await;
    mount(vec![issue(3, "2026-11-01T12:00:00Z")]).await;
    let after = app.sync_one(&settings).await;
    assert_eq!(after.status, RunStatus::Succeeded, "{after:?}");
    let asked = app.api.received_requests().await.unwrap_or_default();
    assert!(
        asked
            .iter()
            .all(|r| r.url.query().unwrap_or_default().contains("since=")),
        "{asked:?}"
    );
}
