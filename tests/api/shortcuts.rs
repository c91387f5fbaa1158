//! The shortcuts a page takes when it looks like the one before. An unchanged page
//! commits nothing: its counters and checkpoint ride with the run's next commit (at most a
//! second later) or its end, watched here from the database while the runs work. A page
//! guessed new that is not is written the usual way, with the same outcome.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sea_orm::{ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, Statement};
use tributary::config::Settings;
use tributary::config::WriteMode;
use tributary::entities::sync_run::RunStatus;
use tributary::entities::{connection, sync_run};
use tributary::pipeline::{Checkpoint, PageExpectation, RunCounts, RunOutcome, RunPage};
use tributary_providers::record::sha256_hex;
use tributary_providers::{PageItem, PagePosition, Record};

use serde_json::json;

use crate::helpers::{
    cursor_provider, mount_cursor_listing, mount_cursor_pages, open_run, spawn_app, TestApp,
};

const PAGES: usize = 5;
const PER_PAGE: usize = 3;

/// Syncs once, and meanwhile reads the running run's `pages_fetched` every 20 ms.
async fn sync_watching_commits(app: &TestApp, settings: &Settings) -> (RunOutcome, Vec<i64>) {
    let done = AtomicBool::new(false);
    let sync = async {
        let run = app.sync_one(settings).await;
        done.store(true, Ordering::SeqCst);
        run
    };
    let watch = async {
        let mut seen = Vec::new();
        while !done.load(Ordering::SeqCst) {
            let running = sync_run::Entity::find()
                .filter(sync_run::Column::Status.eq("running"))
                .one(&app.db)
                .await
                .expect("sync_runs");
            if let Some(run) = running {
                seen.push(run.pages_fetched);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        seen
    };
    tokio::join!(sync, watch)
}

async fn listing(delay: Duration) -> (TestApp, Settings) {
    let app = spawn_app().await;
    mount_cursor_listing(&app.api, "alice", "it", PAGES, PER_PAGE, delay).await;
    let settings = app
        .settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;
    (app, settings)
}

/// The one connection's checkpoint column.
async fn stored_checkpoint(app: &TestApp) -> Option<String> {
    app.stream_checkpoint().await
}

async fn assert_finished_exactly(app: &TestApp, run: &RunOutcome) {
    assert_eq!(run.status, RunStatus::Succeeded);
    let row = app.run_row(run.run_id).await;
    assert_eq!(
        (
            row.pages_fetched,
            row.records_fetched,
            row.records_unchanged
        ),
        (
            PAGES as i64,
            (PAGES * PER_PAGE) as i64,
            (PAGES * PER_PAGE) as i64
        ),
        "the finished run's counters are exact"
    );
    assert_eq!(stored_checkpoint(app).await, None);
}

#[tokio::test]
async fn an_unchanged_re_sync_commits_no_page_while_its_last_commit_is_recent() {
    let (app, settings) = listing(Duration::from_millis(100)).await;
    let (first, seen) = sync_watching_commits(&app, &settings).await;
    assert_eq!(first.counts.inserted, (PAGES * PER_PAGE) as u64);
    assert!(
        seen.iter().any(|pages| *pages > 0),
        "new pages commit one by one: {seen:?}"
    );
    let before = app.dump_records().await;

    let (second, seen) = sync_watching_commits(&app, &settings).await;
    assert!(!seen.is_empty(), "the watcher saw the run");
    assert!(
        seen.iter().all(|pages| *pages == 0),
        "unchanged pages wrote nothing until the run's end: {seen:?}"
    );
    assert_finished_exactly(&app, &second).await;
    assert_eq!(app.dump_records().await, before);
}

#[tokio::test]
async fn a_long_unchanged_run_still_commits_its_progress_every_second() {
    let (app, settings) = listing(Duration::from_millis(400)).await;
    app.sync_one(&settings).await;

    let (second, seen) = sync_watching_commits(&app, &settings).await;
    assert!(
        seen.iter().any(|pages| (1..PAGES as i64).contains(pages)),
        "a page past the one-second mark committed the run's progress: {seen:?}"
    );
    assert_finished_exactly(&app, &second).await;
}

/// Page 1 is all new, so pages 2 and 3 are guessed new: page 2 repeats a key of page 1
/// with new content, and page 3 holds a record the database refuses. Each must come out
/// as if no guess had been made.
#[tokio::test]
async fn a_page_guessed_new_that_is_not_is_written_the_usual_way() {
    guessed_new_but_not(spawn_app().await).await;
}

async fn guessed_new_but_not(app: TestApp) {
    app.refuse_inserts_of("poison", "poison refused by the database")
        .await;
    let pages = [
        (
            json!([{"id": "a", "v": 1}, {"id": "b", "v": 1}]),
            Some("p2"),
        ),
        (
            json!([{"id": "c", "v": 1}, {"id": "a", "v": 2}]),
            Some("p3"),
        ),
        (json!([{"id": "d", "v": 1}, {"id": "poison", "v": 1}]), None),
    ];
    mount_cursor_pages(&app.api, pages.to_vec()).await;
    let settings = app
        .settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;

    let run = app.sync_one(&settings).await;
    assert_eq!(run.status, RunStatus::Partial, "{run:?}");
    let counts = run.counts;
    assert_eq!(
        (
            counts.inserted,
            counts.updated,
            counts.unchanged,
            counts.duplicate,
            counts.failed
        ),
        (4, 1, 0, 0, 1)
    );
    let stored: Vec<(String, String)> = app
        .records()
        .await
        .into_iter()
        .map(|r| (r.external_id, r.payload))
        .collect();
    let expected = [
        ("a", r#"{"id":"a","v":2}"#),
        ("b", r#"{"id":"b","v":1}"#),
        ("c", r#"{"id":"c","v":1}"#),
        ("d", r#"{"id":"d","v":1}"#),
    ];
    assert_eq!(
        stored,
        expected.map(|(id, payload)| (id.to_string(), payload.to_string()))
    );
    let errors = app.run_errors(run.run_id).await;
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].external_id.as_deref(), Some("poison"));
}

/// A page guessed new goes in one batch on SQLite and one transaction elsewhere; either
/// way, when the run's row is gone the page fails with nothing written, and the same page
/// under its own run is stored with its counters and checkpoint; once the connection is
/// removed, the next page fails the same way.
#[tokio::test]
async fn a_page_guessed_new_whose_run_or_connection_is_gone_writes_nothing() {
    guessed_new_with_rows_gone(spawn_app().await).await;
}

/// The change feed's rows: (changes, batches, stamped batches).
async fn feed(app: &TestApp) -> (u64, u64, usize) {
    use sea_orm::PaginatorTrait;
    use tributary::entities::{change, change_batch};
    let changes = change::Entity::find()
        .count(&app.db)
        .await
        .expect("changes");
    let batches = change_batch::Entity::find()
        .count(&app.db)
        .await
        .expect("batches");
    (changes, batches, app.batch_seqs().await.len())
}

async fn guessed_new_with_rows_gone(app: TestApp) {
    let connection = app.alice().await;
    let mut run = open_run(&app.db, &connection).await;
    let run_id = run.id();
    // A run whose row is gone.
    let mut gone_run = open_run(&app.db, &connection).await;
    sync_run::Entity::delete_by_id(gone_run.id())
        .exec(&app.db)
        .await
        .expect("run row removed");
    let page = |ids: [&str; 2]| {
        ids.map(|id| {
            let payload = format!(r#"{{"id":"{id}"}}"#);
            PageItem::Record(Record {
                external_id: id.to_string(),
                content_hash: sha256_hex(payload.as_bytes()),
                payload,
            })
        })
        .to_vec()
    };
    let next = Checkpoint {
        position: Some(PagePosition::Cursor {
            cursor: "p2".to_string(),
        }),
        parent: None,
        walk_started: None,
        since: None,
        watermark: None,
    };
    let page_of = |ids| RunPage {
        items: page(ids),
        next_checkpoint: Some(&next),
        mode: WriteMode::Upsert,
        expect: PageExpectation::New,
        ..RunPage::default()
    };

    let gone = gone_run.store(page_of(["a", "b"])).await;
    assert!(matches!(gone, Err(DbErr::RecordNotUpdated)), "{gone:?}");
    assert!(app.records().await.is_empty(), "no record written");
    assert_eq!(*gone_run.counts(), RunCounts::default());
    assert_eq!(feed(&app).await, (0, 0, 0), "no change, no batch, no seq");
    assert_eq!(
        app.stream_checkpoint().await,
        None,
        "the checkpoint did not move"
    );

    let stored = run.store(page_of(["a", "b"])).await.expect("stored");
    assert_eq!(
        (stored.inserted, run.counts().inserted, run.counts().fetched),
        (2, 2, 2)
    );
    assert_eq!(app.records().await.len(), 2);
    assert_eq!(app.run_row(run_id).await.records_inserted, 2);
    assert_eq!(
        app.stream_checkpoint().await,
        Some(next.to_column().expect("json"))
    );
    // The page's records carry the same instant as its bookkeeping, written alike: on
    // SQLite, where timestamps are text, the batch's own encoding of the records'
    // times must be the very text sqlx writes for the stream's `updated_at`.
    let same_time = app
        .db
        .query_one_raw(Statement::from_string(
            app.db.get_database_backend(),
            "SELECT count(*) AS n FROM records r, connection_streams s \
             WHERE r.created_at = s.updated_at AND r.updated_at = s.updated_at",
        ))
        .await
        .expect("query")
        .expect("a row")
        .try_get::<i64>("", "n")
        .expect("count");
    assert_eq!(same_time, 2);

    // The connection removed meanwhile (`connections remove`): the next page fails too.
    connection::Entity::delete_by_id(connection.id)
        .exec(&app.db)
        .await
        .expect("removed");
    let before = *run.counts();
    let gone = run.store(page_of(["c", "d"])).await;
    assert!(matches!(gone, Err(DbErr::RecordNotUpdated)), "{gone:?}");
    assert_eq!(app.records().await.len(), 2, "no record written");
    assert_eq!(*run.counts(), before);
    assert_eq!(
        feed(&app).await,
        (2, 1, 1),
        "only the stored page's changes"
    );
    assert_eq!(app.run_row(run_id).await.records_inserted, 2);
}

/// A page whose write fails for a reason the careful path does not handle (no key
/// conflict, no refused row, no row gone) fails, logged and counted, instead of being
/// written again another way with the record set aside.
#[tokio::test]
async fn a_page_write_that_fails_unexpectedly_fails_the_run_and_is_counted() {
    let app = spawn_app().await;
    app.fail_inserts_of("broken").await;
    let pages = [
        (
            json!([{"id": "a", "v": 1}, {"id": "b", "v": 1}]),
            Some("p2"),
        ),
        (json!([{"id": "c", "v": 1}, {"id": "broken", "v": 1}]), None),
    ];
    mount_cursor_pages(&app.api, pages.to_vec()).await;
    let settings = app
        .settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let metrics = recorder.handle();
    let _recording = metrics::set_default_local_recorder(&recorder);

    let run = app.sync_one(&settings).await;

    assert_eq!(run.status, RunStatus::Failed, "{run:?}");
    let error = run.error.as_deref().unwrap_or("");
    assert!(error.contains("storing page 2 failed"), "{error}");
    let stored: Vec<String> = app
        .records()
        .await
        .into_iter()
        .map(|record| record.external_id)
        .collect();
    assert_eq!(stored, ["a", "b"], "page 2 wrote nothing");
    assert!(
        app.run_errors(run.run_id).await.is_empty(),
        "no record was set aside as refused"
    );
    let rendered = metrics.render();
    assert!(
        rendered.lines().any(
            |line| line.starts_with("tributary_store_fast_path_fallbacks_total")
                && line.contains(r#"reason="unexpected""#)
                && line.ends_with(" 1")
        ),
        "{rendered}"
    );
}

/// A run stopped by `max_pages` while its pages were unchanged, and so not yet committed,
/// writes the checkpoint they reached as it closes: the next run goes on from there
/// instead of walking the same unchanged pages again, and the listing's end is reached.
#[tokio::test]
async fn an_unchanged_run_stopped_early_keeps_the_checkpoint_its_pages_reached() {
    let (app, settings) = listing(Duration::ZERO).await;
    app.sync_one(&settings).await;
    let limited = cursor_provider("acme", &app.api.uri(), &["alice"]).replacen(
        "auth = \"bearer\"\n",
        "auth = \"bearer\"\nmax_pages = 2\n",
        1,
    );
    let limited = app.settings(&limited).await;

    let stopped = app.sync_one(&limited).await;
    assert_eq!(stopped.status, RunStatus::Failed);
    assert_eq!(
        (stopped.counts.pages_fetched, stopped.counts.unchanged),
        (2, 2 * PER_PAGE as u64)
    );

    let before = app.api.received_requests().await.unwrap_or_default().len();
    let resumed = app.sync_one(&limited).await;
    let cursors: Vec<Option<String>> = app.api.received_requests().await.unwrap_or_default()
        [before..]
        .iter()
        .map(|request| {
            request
                .url
                .query_pairs()
                .find(|(key, _)| key == "cursor")
                .map(|(_, value)| value.into_owned())
        })
        .collect();
    assert_eq!(
        cursors,
        [Some("p2".to_string()), Some("p3".to_string())],
        "the next run went on from the third page"
    );
    assert_eq!(resumed.counts.unchanged, 2 * PER_PAGE as u64);

    let last = app.sync_one(&limited).await;
    assert_eq!(last.status, RunStatus::Succeeded, "{:?}", last.error);
    assert_eq!(last.counts.pages_fetched, 1);
    assert_eq!(stored_checkpoint(&app).await, None);
}
