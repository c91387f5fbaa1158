//! A `tributary sync` killed with SIGKILL, again and again at pseudo-random points of its
//! run, resumes each time from its last committed page. After every kill only whole pages
//! are committed and the checkpoint points at the first page that is not. In the end the
//! records table equals that of a run that was never interrupted, each record was
//! inserted by exactly one run, and no run is left `running`.
//!
//! The kill points come from a small xorshift generator with a fixed seed. The seed and
//! every kill point are printed, and `TRIBUTARY_CRASH_SEED=N` replays another seed.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sea_orm::{ConnectionTrait, EntityTrait, PaginatorTrait, QueryOrder, Statement};
use tributary::entities::sync_run::RunStatus;
use tributary::entities::{connection, record, sync_run};

use crate::helpers::{cursor_provider, mount_cursor_listing, spawn_app, TestApp};

const PAGES: usize = 120;
const PER_PAGE: usize = 4;
const TOTAL: usize = PAGES * PER_PAGE;
const PAGE_DELAY: Duration = Duration::from_millis(10);
/// How many runs are killed before one is left to finish.
const KILLS: usize = 24;
/// Each kill lands up to this long after the run opened (a few pages, at most).
const MAX_KILL_DELAY_MS: u64 = 120;
const DEFAULT_SEED: u64 = 0x5eed_c4a5_4b1e_2026;
/// The `application_name` the killed processes' PostgreSQL sessions carry (sqlx takes it
/// from `PGAPPNAME`), so [`settle`] can tell them from the test's own.
const CHILD_APP_NAME: &str = "tributary-crash-test-child";

/// xorshift64*: a tiny, fixed pseudo-random sequence.
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> XorShift {
        XorShift(seed.max(1))
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A config whose requests carry `x-process: N`, so each request names the process
/// that sent it.
fn write_config(app: &TestApp, process: usize) -> std::path::PathBuf {
    let providers = format!(
        "{}\n[providers.acme.headers]\nx-process = \"{process}\"\n",
        cursor_provider("acme", &app.api.uri(), &["alice"])
    );
    let file = app.dir.path().join(format!("config-{process}.toml"));
    std::fs::write(&file, app.config_text(&providers)).expect("write config");
    file
}

fn sync(config: &std::path::Path) -> Child {
    Command::new(assert_cmd::cargo::cargo_bin("tributary"))
        .arg("--config")
        .arg(config)
        .args(["sync", "--quiet"])
        .env("PGAPPNAME", CHILD_APP_NAME)
        .env_remove("TRIBUTARY_DATABASE_URL")
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tributary starts")
}

/// (user_id, provider, external_id, payload, content_hash) of every record, in key order.
async fn content(app: &TestApp) -> Vec<(String, String, String, String, String)> {
    app.records()
        .await
        .into_iter()
        .map(|r| {
            (
                r.user_id,
                r.provider,
                r.external_id,
                r.payload,
                r.content_hash,
            )
        })
        .collect()
}

async fn runs(app: &TestApp) -> Vec<sync_run::Model> {
    sync_run::Entity::find()
        .order_by_asc(sync_run::Column::Id)
        .all(&app.db)
        .await
        .unwrap()
}

/// Waits until the killed process's work on the test database is over. A database server
/// finishes a statement it received before the client was killed, so after a SIGKILL the
/// tables may still change for a moment; SQLite, in-process, needs no wait.
///
/// On PostgreSQL that is until the process's sessions are gone: a session shows as `idle`
/// while a statement sent outside a transaction (the all-new page) still waits unread in
/// its socket, and it reads, runs and commits that statement before it sees the socket
/// closed and ends.
async fn settle(app: &TestApp) {
    let sql = match crate::helpers::backend() {
        crate::helpers::Backend::Sqlite => return,
        crate::helpers::Backend::Postgres => format!(
            "SELECT count(*) AS busy FROM pg_stat_activity WHERE datname = current_database() \
             AND application_name = '{CHILD_APP_NAME}'"
        ),
        crate::helpers::Backend::Mysql => {
            "SELECT count(*) AS busy FROM information_schema.PROCESSLIST \
             WHERE DB = DATABASE() AND ID <> CONNECTION_ID() AND COMMAND <> 'Sleep'"
                .to_string()
        }
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let row = app
            .db
            .query_one_raw(Statement::from_string(app.db.get_database_backend(), &sql))
            .await
            .unwrap()
            .unwrap();
        let busy: i64 = row.try_get("", "busy").unwrap();
        if busy == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{busy} sessions of the killed process still working after 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The cursor of the connection's checkpoint: the first page not committed (`None`
/// before the first process has stored the connection).
async fn checkpoint_cursor(app: &TestApp) -> Option<String> {
    app.stream_checkpoint().await.map(|text| {
        let checkpoint: serde_json::Value = serde_json::from_str(&text).unwrap();
        checkpoint["position"]["cursor"]
            .as_str()
            .expect("a cursor checkpoint")
            .to_string()
    })
}

/// The `cursor` of the first request process `process` sent, if it sent any
/// (`Some(None)`: the first page).
async fn first_request_of(app: &TestApp, process: usize) -> Option<Option<String>> {
    let requests = app.api.received_requests().await.unwrap_or_default();
    let first = requests.iter().find(|request| {
        request
            .headers
            .get("x-process")
            .is_some_and(|value| value.to_str().ok() == Some(process.to_string().as_str()))
    })?;
    Some(
        first
            .url
            .query_pairs()
            .find(|(key, _)| key == "cursor")
            .map(|(_, value)| value.into_owned()),
    )
}

#[tokio::test]
async fn a_sync_killed_at_two_dozen_points_resumes_each_time_and_ends_identical() {
    let seed = std::env::var("TRIBUTARY_CRASH_SEED")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(DEFAULT_SEED);
    eprintln!("crash test seed: {seed} (replay with TRIBUTARY_CRASH_SEED={seed})");
    let mut rng = XorShift::new(seed);

    // The reference: the same listing synced without interruption.
    let reference = spawn_app().await;
    mount_cursor_listing(
        &reference.api,
        "alice",
        "k",
        PAGES,
        PER_PAGE,
        Duration::ZERO,
    )
    .await;
    let settings = reference
        .settings(&cursor_provider("acme", &reference.api.uri(), &["alice"]))
        .await;
    reference.sync_one(&settings).await;
    let expected = content(&reference).await;
    assert_eq!(expected.len(), TOTAL);

    let app = spawn_app().await;
    mount_cursor_listing(&app.api, "alice", "k", PAGES, PER_PAGE, PAGE_DELAY).await;
    let mut killed = 0;
    for process in 0..KILLS {
        let config = write_config(&app, process);
        let resume_at = checkpoint_cursor(&app).await;
        let runs_before = runs(&app).await.len();
        let mut child = sync(&config);

        // Kill it a pseudo-random while after its run opened.
        let deadline = Instant::now() + Duration::from_secs(30);
        while runs(&app).await.len() == runs_before {
            assert!(
                child.try_wait().unwrap().is_none(),
                "process {process} ended before its run opened"
            );
            assert!(
                Instant::now() < deadline,
                "process {process} never opened its run"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let delay = rng.below(MAX_KILL_DELAY_MS);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        child.kill().expect("SIGKILL");
        let status = child.wait().expect("reaped");
        let signalled = std::os::unix::process::ExitStatusExt::signal(&status) == Some(9);
        settle(&app).await;
        // A kill that lands after the run closed (the process was on its way out) killed
        // no run: the run stays as it ended.
        let run_ended = runs(&app)
            .await
            .last()
            .is_some_and(|run| run.status == RunStatus::Succeeded);
        let was_killed = signalled && !run_ended;
        killed += usize::from(was_killed);

        let committed = record::Entity::find().count(&app.db).await.unwrap() as usize;
        let checkpoint = checkpoint_cursor(&app).await;
        eprintln!(
            "crash: process {process} {} {delay} ms into its run (resumed at {resume_at:?}): \
             {committed} records committed, checkpoint {checkpoint:?}",
            if was_killed {
                "killed"
            } else {
                "finished before its kill,"
            }
        );
        assert_eq!(
            first_request_of(&app, process)
                .await
                .unwrap_or(resume_at.clone()),
            resume_at,
            "process {process} resumed from the checkpoint"
        );
        assert_eq!(committed % PER_PAGE, 0, "only whole pages are committed");
        if committed < TOTAL {
            // The first walk is not over: the checkpoint points at the first page not
            // committed, never past it and never behind it.
            let first_missing = committed / PER_PAGE;
            let expected = (first_missing > 0).then(|| format!("p{first_missing}"));
            assert_eq!(checkpoint, expected, "after process {process}");
        }
    }
    assert!(killed >= 20, "only {killed} kills landed mid-run");

    // The last run is left alone: it resumes, finishes, and exits 0.
    let last = sync(&write_config(&app, KILLS))
        .wait_with_output()
        .expect("tributary runs");
    let stdout = String::from_utf8_lossy(&last.stdout);
    assert!(
        last.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&last.stderr)
    );
    assert!(stdout.contains("alice@acme succeeded"), "{stdout}");

    assert_eq!(
        content(&app).await,
        expected,
        "the table of an uninterrupted run"
    );
    let runs = runs(&app).await;
    assert!(
        runs.iter().all(|r| r.status != RunStatus::Running),
        "{runs:?}"
    );
    let interrupted: Vec<&sync_run::Model> = runs
        .iter()
        .filter(|r| r.status == RunStatus::Interrupted)
        .collect();
    assert_eq!(interrupted.len(), killed, "every killed run is marked");
    assert!(interrupted
        .iter()
        .all(|r| r.error.as_deref().unwrap_or("").contains("stopped")));
    assert_eq!(runs.last().unwrap().status, RunStatus::Succeeded);
    for run in &runs {
        // A run's counters commit with its pages, so even a killed run's add up.
        assert_eq!(
            (run.records_inserted + run.records_unchanged) as usize,
            run.pages_fetched as usize * PER_PAGE,
            "{run:?}"
        );
        assert_eq!(
            (run.records_duplicate, run.records_failed),
            (0, 0),
            "{run:?}"
        );
    }
    let inserted: i64 = runs.iter().map(|r| r.records_inserted).sum();
    assert_eq!(
        inserted as usize, TOTAL,
        "each record inserted by exactly one run"
    );
    let row = connection::Entity::find()
        .one(&app.db)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (app.stream_checkpoint().await, row.lease_holder),
        (None, None)
    );
}
