//! Fencing: a run writes only while its connection's row holds the lease it claimed (the
//! holder and the generation of that claim). A `tributary sync` stopped with SIGSTOP past
//! its lease's expiry, while another process takes the lease over and stores newer
//! content, writes nothing once it resumes: no page, checkpoint, sighting, deletion mark,
//! change or notification, and its run ends `interrupted` saying why.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use chrono::Utc;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use sea_orm::{ActiveModelTrait, ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter, Set};
use serde_json::json;
use tributary::config::{NotifyRuns, WriteMode};
use tributary::entities::sync_run::{RunStatus, Trigger};
use tributary::entities::{
    change_batch, connection, notification_delivery, record, run_error, run_sighting, sync_run,
};
use tributary::pipeline::CheckpointMove;
use tributary::pipeline::{
    sync_connection, Checkpoint, DeletionPass, Fence, NoProgress, PageExpectation, Run, RunCounts,
    RunEnd, RunOptions, RunPage,
};
use tributary_providers::record::sha256_hex;
use tributary_providers::{PageItem, PagePosition, Record};
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, ResponseTemplate};

use crate::helpers::{cursor_provider, records_stream, spawn_app, TestApp};

/// The reason a run that lost its lease ends with (`pipeline::fence::LEASE_LOST`).
const LEASE_LOST: &str = "the connection's lease was taken over by another process";
const USERS: [&str; 2] = ["alice", "bob"];
const PER_PAGE: usize = 3;
const SECRET_ENV: &str = "TRIBUTARY_TEST_HOOK_SECRET";
const SECRET: &str = "whsec_test_0123456789abcdef";

/// The listing process `process` is answered: one page of `PER_PAGE` records whose
/// content names the process, so a record tells which process wrote it last.
fn page_of(process: u32) -> serde_json::Value {
    let data: Vec<_> = (0..PER_PAGE)
        .map(|i| json!({"id": format!("r{i}"), "written_by": process}))
        .collect();
    json!({"data": data, "next_cursor": null})
}

/// A config with a one-second lease, notifications of every run, and requests that carry
/// `x-process: N`.
fn write_config(app: &TestApp, process: u32) -> std::path::PathBuf {
    let providers = format!(
        "[daemon]\nlease_ttl = \"1s\"\n{}\n[providers.acme.headers]\nx-process = \"{process}\"\n\
         \n[notify]\nurl = \"http://127.0.0.1:9/hooks\"\nsecret_env = \"{SECRET_ENV}\"\nalways = true\n",
        cursor_provider("acme", &app.api.uri(), &USERS)
    );
    let file = app.dir.path().join(format!("config-{process}.toml"));
    std::fs::write(&file, app.config_text(&providers)).expect("write config");
    file
}

fn sync(config: &std::path::Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_tributary"))
        .arg("--config")
        .arg(config)
        .arg("sync")
        .env(SECRET_ENV, SECRET)
        .env_remove("TRIBUTARY_DATABASE_URL")
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tributary starts")
}

/// Waits, at most `limit`, for `condition` to hold.
async fn wait_for<F, Fut>(limit: Duration, what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !condition().await {
        assert!(Instant::now() < deadline, "{what} within {limit:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// How many requests process `process` has sent.
async fn requests_of(app: &TestApp, process: u32) -> usize {
    let requests = app.api.received_requests().await.unwrap_or_default();
    requests
        .iter()
        .filter(|request| {
            request
                .headers
                .get("x-process")
                .is_some_and(|value| value.to_str().ok() == Some(process.to_string().as_str()))
        })
        .count()
}

async fn runs(app: &TestApp) -> Vec<sync_run::Model> {
    sync_run::Entity::find().all(&app.db).await.expect("runs")
}

#[tokio::test]
async fn a_sync_paused_past_its_lease_writes_nothing_after_another_took_it_over() {
    let app = spawn_app().await;
    // The first process's pages are answered late enough to be in flight when it stops.
    Mock::given(method("GET"))
        .and(header("x-process", "1"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(page_of(1))
                .set_delay(Duration::from_millis(500)),
        )
        .mount(&app.api)
        .await;
    Mock::given(method("GET"))
        .and(header("x-process", "2"))
        .respond_with(ResponseTemplate::new(200).set_body_json(page_of(2)))
        .mount(&app.api)
        .await;

    let mut stalled = sync(&write_config(&app, 1));
    let pid = Pid::from_raw(i32::try_from(stalled.id()).expect("a pid"));
    wait_for(
        Duration::from_secs(30),
        "both first pages asked for",
        || async { requests_of(&app, 1).await == USERS.len() },
    )
    .await;
    kill(pid, Signal::SIGSTOP).expect("SIGSTOP");
    let stalled_runs: Vec<i64> = runs(&app).await.iter().map(|run| run.id).collect();
    assert_eq!(
        stalled_runs.len(),
        USERS.len(),
        "one run per connection open"
    );

    // Past the leases' expiry, the second process takes them over and stores its content.
    wait_for(
        Duration::from_secs(10),
        "the stopped process's leases expired",
        || async {
            let rows = connection::Entity::find().all(&app.db).await.expect("rows");
            rows.iter()
                .all(|row| row.lease_expires_at.is_some_and(|until| until < Utc::now()))
        },
    )
    .await;
    let taker = sync(&write_config(&app, 2))
        .wait_with_output()
        .expect("runs");
    assert!(
        taker.status.success(),
        "{}",
        String::from_utf8_lossy(&taker.stderr)
    );

    kill(pid, Signal::SIGCONT).expect("SIGCONT");
    let deadline = Instant::now() + Duration::from_secs(30);
    while stalled.try_wait().expect("status").is_none() {
        assert!(Instant::now() < deadline, "the resumed process never ended");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let output = stalled.wait_with_output().expect("output");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");

    // Every record holds the newer content.
    let records = app.records().await;
    assert_eq!(records.len(), USERS.len() * PER_PAGE);
    for record in &records {
        let payload: serde_json::Value = serde_json::from_str(&record.payload).expect("json");
        assert_eq!(
            payload["written_by"], 2,
            "{} was overwritten",
            record.external_id
        );
        assert!(!stalled_runs.contains(&record.last_seen_run_id));
        assert!(!stalled_runs.contains(&record.first_seen_run_id));
    }
    // The stalled runs end interrupted, saying why, and wrote nothing of their own.
    for run_id in &stalled_runs {
        let run = app.run_row(*run_id).await;
        assert_eq!(run.status, RunStatus::Interrupted, "run {run_id}");
        let error = run.error.unwrap_or_default();
        assert!(error.contains(LEASE_LOST), "run {run_id}: {error}");
        assert_eq!((run.pages_fetched, run.records_inserted), (0, 0));
        assert!(
            stdout.contains(&format!("run {run_id} ")) && stdout.contains("interrupted"),
            "{stdout}"
        );
        let batches = change_batch::Entity::find()
            .filter(change_batch::Column::RunId.eq(*run_id))
            .count(&app.db)
            .await
            .expect("batches");
        let deliveries = notification_delivery::Entity::find()
            .filter(notification_delivery::Column::RunId.eq(*run_id))
            .count(&app.db)
            .await
            .expect("deliveries");
        let errors = app.run_errors(*run_id).await.len();
        assert_eq!((batches, deliveries, errors), (0, 0, 0), "run {run_id}");
    }
    // The second process's runs are whole: one change batch and one delivery each.
    let taker_runs: Vec<sync_run::Model> = runs(&app)
        .await
        .into_iter()
        .filter(|run| !stalled_runs.contains(&run.id))
        .collect();
    assert_eq!(taker_runs.len(), USERS.len());
    for run in &taker_runs {
        assert_eq!(run.status, RunStatus::Succeeded);
    }
    assert_eq!(
        change_batch::Entity::find().count(&app.db).await.unwrap(),
        USERS.len() as u64
    );
    assert_eq!(
        notification_delivery::Entity::find()
            .count(&app.db)
            .await
            .unwrap(),
        USERS.len() as u64
    );
}

/// A connection whose lease another process claimed after this test's run did: the run
/// holds `stale`, the row `current`.
struct TakenOver {
    connection: connection::Model,
    stale: Fence,
    current: Fence,
}

async fn taken_over(app: &TestApp) -> TakenOver {
    app.settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;
    let row = connection::Entity::find()
        .one(&app.db)
        .await
        .expect("query")
        .expect("alice");
    let stale = Fence {
        holder: "stalled-host:101:0000beef".to_string(),
        generation: 1,
    };
    let current = Fence {
        holder: "other-host:202:0000cafe".to_string(),
        generation: 2,
    };
    lease_row(app, &row, &current).await;
    let connection = connection::Entity::find_by_id(row.id)
        .one(&app.db)
        .await
        .expect("query")
        .expect("alice");
    TakenOver {
        connection,
        stale,
        current,
    }
}

/// Writes `fence` into the connection's row, as a claim of it would.
async fn lease_row(app: &TestApp, row: &connection::Model, fence: &Fence) {
    let mut leased: connection::ActiveModel = row.clone().into();
    leased.lease_holder = Set(Some(fence.holder.clone()));
    leased.lease_expires_at = Set(Some(Utc::now() + chrono::Duration::seconds(60)));
    leased.lease_generation = Set(fence.generation);
    leased.update(&app.db).await.expect("leased");
}

fn records(ids: &[&str], version: u32) -> Vec<PageItem> {
    ids.iter()
        .map(|id| {
            let payload = format!(r#"{{"id":"{id}","version":{version}}}"#);
            PageItem::Record(Record {
                external_id: (*id).to_string(),
                content_hash: sha256_hex(payload.as_bytes()),
                payload,
            })
        })
        .collect()
}

/// A run of `world`'s connection under `lease`.
async fn open<'a>(app: &'a TestApp, world: &'a TakenOver, lease: &'a Fence) -> Run<'a> {
    let stream = records_stream(&world.connection);
    Run::open(
        &app.db,
        &world.connection,
        &stream,
        Trigger::Manual,
        Some(lease),
    )
    .await
    .expect("run")
}

fn page(
    items: Vec<PageItem>,
    expect: PageExpectation,
    next: Option<&Checkpoint>,
    sightings: bool,
) -> RunPage<'_> {
    RunPage {
        items,
        next_checkpoint: next,
        mode: WriteMode::Upsert,
        expect,
        sightings,
        ..RunPage::default()
    }
}

fn next_page() -> Checkpoint {
    Checkpoint {
        position: Some(PagePosition::Cursor {
            cursor: "p2".to_string(),
        }),
        parent: None,
        walk_started: None,
        since: None,
        watermark: None,
    }
}

/// A run under the lease the row holds that stores `a` and `b` as new.
async fn store_a_and_b(app: &TestApp, world: &TakenOver) {
    let mut run = open(app, world, &world.current).await;
    let items = records(&["a", "b"], 1);
    run.store(page(items, PageExpectation::New, None, false))
        .await
        .expect("stored");
}

async fn sightings_of(app: &TestApp, run_id: i64) -> u64 {
    run_sighting::Entity::find()
        .filter(run_sighting::Column::RunId.eq(run_id))
        .count(&app.db)
        .await
        .expect("sightings")
}

async fn batches_of(app: &TestApp, run_id: i64) -> u64 {
    change_batch::Entity::find()
        .filter(change_batch::Column::RunId.eq(run_id))
        .count(&app.db)
        .await
        .expect("batches")
}

#[tokio::test]
async fn a_page_under_a_stale_lease_commits_nothing_whichever_way_it_is_written() {
    let app = spawn_app().await;
    let world = taken_over(&app).await;
    let next = next_page();
    // The same holder as the row's, but an older claim of it: the generation tells them
    // apart.
    let older_claim = Fence {
        holder: world.current.holder.clone(),
        generation: world.current.generation - 1,
    };
    let mut refused_runs = Vec::new();
    for lease in [&world.stale, &older_claim] {
        let mut run = open(&app, &world, lease).await;
        for expect in [
            PageExpectation::New,
            PageExpectation::Unknown,
            PageExpectation::Unchanged,
        ] {
            let items = records(&["a", "b"], 1);
            let refused = run.store(page(items, expect, Some(&next), true)).await;
            let error = refused
                .expect_err("a stale lease writes nothing")
                .to_string();
            assert!(
                error.contains("no longer holds its connection's lease"),
                "{expect:?}: {error}"
            );
            assert_eq!(*run.counts(), RunCounts::default());
        }
        refused_runs.push(run.id());
    }
    assert!(app.records().await.is_empty(), "no record written");
    assert_eq!(app.stream_checkpoint().await, None, "no checkpoint moved");
    for run_id in refused_runs {
        assert_eq!(sightings_of(&app, run_id).await, 0, "no sighting noted");
        assert_eq!(batches_of(&app, run_id).await, 0, "no change recorded");
        assert!(app.run_errors(run_id).await.is_empty());
        let row = app.run_row(run_id).await;
        assert_eq!((row.pages_fetched, row.records_fetched), (0, 0));
    }

    // Under the lease the row holds, the same page goes in.
    let mut run = open(&app, &world, &world.current).await;
    let items = records(&["a", "b"], 1);
    run.store(page(items, PageExpectation::New, Some(&next), true))
        .await
        .expect("stored");
    assert_eq!(app.records().await.len(), 2);
    assert_eq!(batches_of(&app, run.id()).await, 1);
}

#[tokio::test]
async fn the_sightings_of_an_unchanged_page_under_a_stale_lease_are_not_noted() {
    let app = spawn_app().await;
    let world = taken_over(&app).await;
    store_a_and_b(&app, &world).await;

    // A page stored unchanged writes only its sightings, in a transaction of their own.
    for (lease, noted) in [(&world.stale, 0), (&world.current, 2)] {
        let mut second = open(&app, &world, lease).await;
        let items = records(&["a", "b"], 1);
        let stored = second
            .store(page(items, PageExpectation::Unchanged, None, true))
            .await;
        assert_eq!(stored.is_ok(), noted > 0, "{stored:?}");
        assert_eq!(sightings_of(&app, second.id()).await, noted);
    }
}

/// A tracked full pass of `a` and `b` that saw only `a`, closing as complete, notifying
/// every run; with `lease_lost`, another process takes the lease over before it closes.
async fn close_complete_pass(
    app: &TestApp,
    world: &TakenOver,
    lease_lost: bool,
) -> (i64, tributary::pipeline::RunClosed) {
    store_a_and_b(app, world).await;
    let mut run = open(app, world, &world.current).await;
    let next = next_page();
    let items = records(&["a"], 2);
    run.store(page(items, PageExpectation::Unknown, Some(&next), true))
        .await
        .expect("stored");
    if lease_lost {
        let taker = Fence {
            holder: "third-host:303:0000f00d".to_string(),
            generation: world.current.generation + 1,
        };
        lease_row(app, &world.connection, &taker).await;
    }
    let run_id = run.id();
    let end = RunEnd {
        status: RunStatus::Succeeded,
        error: None,
        listing_complete: true,
        checkpoint: CheckpointMove::Write(None),
        watermark: None,
        notify: NotifyRuns::All,
        deletions: DeletionPass::Apply { max_fraction: 1.0 },
        full_passes_served: 0,
        authorization_refused: false,
    };
    let closed = run.close(end).await.expect("closed");
    (run_id, closed)
}

#[tokio::test]
async fn a_run_closing_under_a_stale_lease_commits_nothing_but_its_interruption() {
    let app = spawn_app().await;
    let world = taken_over(&app).await;
    let (run_id, closed) = close_complete_pass(&app, &world, true).await;

    assert_eq!(closed.status, RunStatus::Interrupted);
    let row = app.run_row(run_id).await;
    assert_eq!(row.status, RunStatus::Interrupted);
    assert!(
        row.error.as_deref().unwrap_or("").contains(LEASE_LOST),
        "{:?}",
        row.error
    );
    assert!(row.finished_at.is_some());
    // Its counters are those of its committed page; no deletion was marked.
    assert_eq!((row.records_updated, row.records_deleted), (1, 0));
    let b = record::Entity::find()
        .filter(record::Column::ExternalId.eq("b"))
        .one(&app.db)
        .await
        .expect("query")
        .expect("b");
    assert_eq!((b.deleted_at, b.deleted_by_run_id), (None, None));
    // The checkpoint, the cursor and the last success stay; the sightings too (the next
    // run's start removes them); no notification, and no change beyond its page's.
    let stream = app.only_stream().await.expect("stream");
    assert_eq!(
        stream.checkpoint,
        Some(next_page().to_column().expect("json"))
    );
    assert_eq!(stream.last_success_run_id, None);
    assert_eq!(sightings_of(&app, run_id).await, 1);
    let deliveries = notification_delivery::Entity::find()
        .filter(notification_delivery::Column::RunId.eq(run_id))
        .count(&app.db)
        .await
        .expect("deliveries");
    assert_eq!(deliveries, 0);
    assert_eq!(batches_of(&app, run_id).await, 1, "the page's batch only");
}

#[tokio::test]
async fn a_run_closing_under_its_lease_marks_deletions_and_notifies() {
    // The same close as above under the lease the row holds: the deletion, the checkpoint
    // and the notification all commit, so what the test above finds missing is the fence.
    let app = spawn_app().await;
    let world = taken_over(&app).await;
    let (run_id, closed) = close_complete_pass(&app, &world, false).await;
    assert_eq!(closed.status, RunStatus::Succeeded);
    assert_eq!(app.run_row(run_id).await.records_deleted, 1);
    let stream = app.only_stream().await.expect("stream");
    assert_eq!(
        (stream.checkpoint, stream.last_success_run_id),
        (None, Some(run_id))
    );
    assert_eq!(sightings_of(&app, run_id).await, 0);
    let deliveries = notification_delivery::Entity::find()
        .filter(notification_delivery::Column::RunId.eq(run_id))
        .count(&app.db)
        .await
        .expect("deliveries");
    assert_eq!(deliveries, 1);
}

#[tokio::test]
async fn a_run_marked_interrupted_by_another_process_is_never_flipped_back() {
    let app = spawn_app().await;
    let world = taken_over(&app).await;
    let mut run = open(&app, &world, &world.current).await;
    let run_id = run.id();
    // Another process found the run abandoned and marked it, the lease still the run's.
    let mut marked: sync_run::ActiveModel = app.run_row(run_id).await.into();
    marked.status = Set(RunStatus::Interrupted);
    marked.error = Set(Some("marked by another process".to_string()));
    marked.update(&app.db).await.expect("marked");

    let items = records(&["a"], 1);
    let refused = run
        .store(page(items, PageExpectation::New, None, false))
        .await;
    let error = refused
        .expect_err("a closed run writes nothing")
        .to_string();
    assert!(error.contains("was marked interrupted"), "{error}");
    assert!(app.records().await.is_empty());

    let end = RunEnd {
        status: RunStatus::Succeeded,
        error: None,
        listing_complete: true,
        checkpoint: CheckpointMove::Write(None),
        watermark: None,
        notify: NotifyRuns::All,
        deletions: DeletionPass::Off,
        full_passes_served: 0,
        authorization_refused: false,
    };
    let closed = run.close(end).await.expect("closed");
    assert_eq!(closed.status, RunStatus::Interrupted);
    let row = app.run_row(run_id).await;
    assert_eq!(row.status, RunStatus::Interrupted);
    assert_eq!(row.error.as_deref(), Some("marked by another process"));
    assert_eq!(
        app.only_stream().await.expect("stream").last_success_run_id,
        None
    );
    assert_eq!(
        notification_delivery::Entity::find()
            .count(&app.db)
            .await
            .unwrap(),
        0
    );
    assert!(run_error::Entity::find()
        .all(&app.db)
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn a_run_that_lost_its_lease_opens_no_further_stream_of_the_connection() {
    let app = spawn_app().await;
    // The first stream's page is answered while another process holds the lease; the
    // lease lasts a day, so the renewal does not notice first: the page's fence does.
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(page_of(1))
                .set_delay(Duration::from_millis(300)),
        )
        .mount(&app.api)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/archive"))
        .respond_with(ResponseTemplate::new(200).set_body_json(page_of(1)))
        .mount(&app.api)
        .await;
    let providers = cursor_provider("acme", &app.api.uri(), &["alice"]).replacen(
        "kind = \"rest\"\n",
        "kind = \"rest\"\nstreams = [\"records\", \"archive\"]\n",
        1,
    );
    let settings = app
        .settings(&format!(
            "[daemon]\nlease_ttl = \"1day\"\n{providers}\
             [providers.acme.resources.archive]\npath = \"/v1/archive\"\n"
        ))
        .await;
    let take_over = async {
        wait_for(
            Duration::from_secs(30),
            "the first page asked for",
            || async { app.api.received_requests().await.unwrap_or_default().len() == 1 },
        )
        .await;
        let row = connection::Entity::find()
            .one(&app.db)
            .await
            .expect("query")
            .expect("alice");
        let taker = Fence {
            holder: "other-host:202:0000cafe".to_string(),
            generation: row.lease_generation + 1,
        };
        lease_row(&app, &row, &taker).await;
    };
    let (outcomes, ()) = tokio::join!(app.sync(&settings), take_over);

    let ran: Vec<(&str, RunStatus)> = outcomes
        .iter()
        .map(|outcome| (outcome.stream.as_str(), outcome.status))
        .collect();
    assert_eq!(ran, [("records", RunStatus::Interrupted)]);
    let error = outcomes[0].error.clone().unwrap_or_default();
    assert!(error.contains(LEASE_LOST), "{error}");
    assert_eq!(runs(&app).await.len(), 1, "no run of the second stream");
    assert!(app.records().await.is_empty());
    assert_eq!(
        app.api.received_requests().await.unwrap_or_default().len(),
        1
    );
}

#[tokio::test]
async fn a_leased_run_whose_connection_was_removed_ends_interrupted_saying_so() {
    let app = spawn_app().await;
    let world = taken_over(&app).await;
    let run = open(&app, &world, &world.current).await;
    let run_id = run.id();
    // `connections remove` while the run goes.
    connection::Entity::delete_by_id(world.connection.id)
        .exec(&app.db)
        .await
        .expect("removed");

    let end = RunEnd {
        status: RunStatus::Succeeded,
        error: None,
        listing_complete: true,
        checkpoint: CheckpointMove::Write(None),
        watermark: None,
        notify: NotifyRuns::All,
        deletions: DeletionPass::Off,
        full_passes_served: 0,
        authorization_refused: false,
    };
    assert_eq!(*run.counts(), RunCounts::default());
    let closed = run.close(end).await.expect("closed");
    assert_eq!(closed.status, RunStatus::Interrupted);
    let row = app.run_row(run_id).await;
    assert_eq!(row.status, RunStatus::Interrupted);
    let error = row.error.unwrap_or_default();
    assert!(error.contains("the connection was removed"), "{error}");
    assert_eq!(
        notification_delivery::Entity::find()
            .count(&app.db)
            .await
            .unwrap(),
        0
    );
}

#[tokio::test]
async fn a_run_that_stalled_before_it_began_leaves_the_live_runs_sightings_alone() {
    let app = spawn_app().await;
    let world = taken_over(&app).await;
    store_a_and_b(&app, &world).await;
    // The run of the process that took the connection over has noted its first page.
    let mut live_run = open(&app, &world, &world.current).await;
    let live = live_run.id();
    let items = records(&["a", "b"], 1);
    live_run
        .store(page(items, PageExpectation::Unchanged, None, true))
        .await
        .expect("noted");
    assert_eq!(sightings_of(&app, live).await, 2);

    // The stalled process wakes up and begins its run under its older claim.
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(200).set_body_json(page_of(1)))
        .mount(&app.api)
        .await;
    let settings = app
        .settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;
    let acme = &settings.providers["acme"];
    let provider = tributary::sync::build(acme).expect("provider");
    let options = RunOptions {
        lease: Some(world.stale.clone()),
        ..RunOptions::manual()
    };
    let stalled = sync_connection(
        &app.db,
        provider.as_ref(),
        acme,
        &world.connection,
        options,
        &NoProgress,
    )
    .await
    .expect("the run is recorded");
    assert_eq!(stalled.status, RunStatus::Interrupted, "{stalled:?}");
    assert!(
        stalled
            .error
            .clone()
            .unwrap_or_default()
            .contains(LEASE_LOST),
        "{stalled:?}"
    );
    assert_eq!(
        sightings_of(&app, live).await,
        2,
        "the live run's sightings are not taken for an unfinished run's"
    );
    assert_eq!(sightings_of(&app, stalled.run_id).await, 0);
    let ids: Vec<String> = app
        .records()
        .await
        .into_iter()
        .map(|r| r.external_id)
        .collect();
    assert_eq!(ids, ["a", "b"], "nothing of the stalled run is stored");
}
