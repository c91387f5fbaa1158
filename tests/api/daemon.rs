//! `tributary daemon` as a real process: schedules, skips, SIGTERM, metrics, one SQLite
//! daemon per file, and several instances sharing a server database.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder};
use tributary::entities::sync_run::{RunStatus, Trigger};
use tributary::entities::{connection, processed_key, sync_run};

use crate::helpers::{backend, cursor_provider, mount_cursor_listing, spawn_app, Backend, TestApp};

/// A running `tributary daemon`, killed if the test ends without stopping it.
pub(crate) struct Daemon {
    child: Child,
    log: std::path::PathBuf,
}

impl Daemon {
    pub(crate) fn start(config: &std::path::Path, log: std::path::PathBuf) -> Daemon {
        Daemon::start_with(config, log, &["--log", "info"], &[])
    }

    /// A daemon started with these global arguments and environment variables.
    pub(crate) fn start_with(
        config: &std::path::Path,
        log: std::path::PathBuf,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Daemon {
        let log_file = std::fs::File::create(&log).expect("log file");
        let child = Command::new(assert_cmd::cargo::cargo_bin("tributary"))
            .arg("--config")
            .arg(config)
            .args(args)
            .arg("daemon")
            .env_remove("TRIBUTARY_DATABASE_URL")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .expect("daemon starts");
        Daemon { child, log }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub(crate) fn signal(&self, signal: Signal) {
        kill(Pid::from_raw(self.pid() as i32), signal).expect("signal sent");
    }

    /// Waits for the process to exit and returns its exit code.
    pub(crate) fn wait(&mut self, limit: Duration) -> i32 {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status.code().unwrap_or(-1);
            }
            assert!(
                Instant::now() < deadline,
                "the daemon did not exit in {limit:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `check` until it returns true, or fails with `what` after `limit`.
pub(crate) async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(crate) async fn runs_of(app: &TestApp, user: &str) -> Vec<sync_run::Model> {
    sync_run::Entity::find()
        .filter(sync_run::Column::UserId.eq(user))
        .order_by_asc(sync_run::Column::Id)
        .all(&app.db)
        .await
        .unwrap()
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a free port")
}

pub(crate) fn daemon_table(listen: Option<u16>) -> String {
    let listen = listen
        .map(|port| format!("listen = \"127.0.0.1:{port}\"\n"))
        .unwrap_or_default();
    format!("[daemon]\n{listen}lease_ttl = \"5s\"\nshutdown_grace = \"8s\"\n")
}

pub(crate) fn every_second(providers: String) -> String {
    providers.replace(
        "schedule = \"0 */15 * * * *\"",
        "schedule = \"* * * * * *\"",
    )
}

#[tokio::test]
async fn the_daemon_syncs_on_schedule_serves_metrics_and_stops_on_sigterm() {
    let app = crate::helpers::spawn_app().await;
    mount_cursor_listing(&app.api, "alice", "alice_", 2, 2, Duration::ZERO).await;
    let port = free_port();
    let config = app.write_config(&format!(
        "{}{}",
        daemon_table(Some(port)),
        every_second(cursor_provider("acme", &app.api.uri(), &["alice"]))
    ));
    let mut daemon = Daemon::start(&config, app.dir.path().join("daemon.log"));

    eventually(Duration::from_secs(30), "two scheduled runs", || async {
        runs_of(&app, "alice")
            .await
            .iter()
            .filter(|r| r.trigger == Trigger::Schedule && r.status == RunStatus::Succeeded)
            .count()
            >= 2
    })
    .await;
    let client = reqwest::Client::new();
    let health = client
        .get(format!("http://127.0.0.1:{port}/healthz"))
        .send()
        .await
        .expect("healthz answers");
    assert_eq!(health.status(), 200);
    assert_eq!(health.text().await.unwrap(), "ok\n");
    let metrics = client
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(
            "tributary_runs_total{provider=\"acme\",stream=\"records\",status=\"succeeded\"}"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "tributary_records_total{provider=\"acme\",stream=\"records\",outcome=\"inserted\"} 4"
        ),
        "{metrics}"
    );
    assert!(
        metrics
            .contains("tributary_run_duration_seconds_bucket{provider=\"acme\",stream=\"records\""),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "tributary_last_success_timestamp_seconds{provider=\"acme\",stream=\"records\"}"
        ),
        "{metrics}"
    );
    // Two runs cannot have sent fewer statements than two claims and two runs' writes.
    let statements: u64 = metrics
        .lines()
        .find_map(|line| line.strip_prefix("tributary_database_statements_total "))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no statement count:\n{metrics}"));
    assert!(statements >= 10, "{statements} statements:\n{metrics}");

    daemon.signal(Signal::SIGTERM);
    assert_eq!(daemon.wait(Duration::from_secs(15)), 0, "{}", daemon.log());
    let runs = runs_of(&app, "alice").await;
    assert!(
        runs.iter().all(|r| r.status != RunStatus::Running),
        "{runs:?}"
    );
    assert_eq!(
        app.records().await.len(),
        4,
        "every run after the first inserted nothing"
    );
    assert!(daemon.log().contains("Daemon stopped."), "{}", daemon.log());
}

#[tokio::test]
async fn sigterm_mid_run_commits_the_page_in_flight_and_marks_the_run_interrupted() {
    let app = crate::helpers::spawn_app().await;
    mount_cursor_listing(
        &app.api,
        "alice",
        "alice_",
        8,
        5,
        Duration::from_millis(700),
    )
    .await;
    let config = app.write_config(&format!(
        "{}{}",
        daemon_table(None),
        every_second(cursor_provider("acme", &app.api.uri(), &["alice"]))
    ));
    let mut daemon = Daemon::start(&config, app.dir.path().join("daemon.log"));
    eventually(Duration::from_secs(30), "a committed page", || async {
        runs_of(&app, "alice")
            .await
            .iter()
            .any(|r| r.pages_fetched >= 2)
    })
    .await;

    daemon.signal(Signal::SIGTERM);
    assert_eq!(daemon.wait(Duration::from_secs(15)), 0, "{}", daemon.log());
    let runs = runs_of(&app, "alice").await;
    assert_eq!(
        runs.len(),
        1,
        "later firings skipped the connection while its run went on"
    );
    assert!(
        daemon.log().contains("a run of it is already going"),
        "{}",
        daemon.log()
    );
    let run = &runs[0];
    assert_eq!(run.status, RunStatus::Interrupted);
    let committed = app.records().await.len();
    assert_eq!(
        committed,
        run.pages_fetched as usize * 5,
        "whole pages only"
    );
    assert!(committed < 40);
    let row = connection::Entity::find()
        .one(&app.db)
        .await
        .unwrap()
        .unwrap();
    assert!(
        app.stream_checkpoint().await.is_some(),
        "the checkpoint is kept for the next run"
    );
    assert_eq!(row.lease_holder, None, "the lease is released");
}

#[tokio::test]
async fn several_daemons_share_the_work_and_one_killed_mid_run_is_taken_over() {
    let app = crate::helpers::spawn_app().await;
    let providers = cursor_provider("acme", &app.api.uri(), &["alice", "bob", "sloth"]).replace(
        "schedule = \"0 */15 * * * *\"",
        "schedule = \"*/2 * * * * *\"",
    );
    let config = app.write_config(&format!("{}{providers}", daemon_table(None)));

    if backend() == Backend::Sqlite {
        // SQLite has one writer: a second daemon on the same file refuses to start.
        mount_cursor_listing(&app.api, "alice", "alice_", 1, 1, Duration::ZERO).await;
        let _first = Daemon::start(&config, app.dir.path().join("first.log"));
        eventually(
            Duration::from_secs(20),
            "the first daemon's lock",
            || async { app.dir.path().join("test.db.daemon.lock").exists() },
        )
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut second = Daemon::start(&config, app.dir.path().join("second.log"));
        let code = second.wait(Duration::from_secs(20));
        assert_ne!(code, 0);
        assert!(
            second
                .log()
                .contains("another tributary daemon is already running"),
            "{}",
            second.log()
        );
        return;
    }

    mount_cursor_listing(&app.api, "alice", "alice_", 2, 3, Duration::ZERO).await;
    mount_cursor_listing(&app.api, "bob", "bob_", 2, 3, Duration::ZERO).await;
    mount_cursor_listing(
        &app.api,
        "sloth",
        "sloth_",
        6,
        4,
        Duration::from_millis(900),
    )
    .await;
    let mut daemons: Vec<Daemon> = (0..3)
        .map(|i| Daemon::start(&config, app.dir.path().join(format!("daemon{i}.log"))))
        .collect();

    // Kill whichever daemon runs sloth once two of its pages have committed.
    eventually(
        Duration::from_secs(40),
        "two committed pages of sloth",
        || async {
            runs_of(&app, "sloth")
                .await
                .iter()
                .any(|r| r.pages_fetched >= 2)
        },
    )
    .await;
    let row = connection::Entity::find()
        .filter(connection::Column::UserId.eq("sloth"))
        .one(&app.db)
        .await
        .unwrap()
        .unwrap();
    let holder = row.lease_holder.expect("sloth's run holds its lease");
    let victim = daemons
        .iter()
        .position(|d| holder.split(':').nth(1) == Some(d.pid().to_string().as_str()))
        .expect("the holder is one of ours");
    daemons[victim].signal(Signal::SIGKILL);
    daemons[victim].wait(Duration::from_secs(10));

    eventually(
        Duration::from_secs(60),
        "sloth synced to the end by another daemon",
        || async {
            runs_of(&app, "sloth")
                .await
                .iter()
                .any(|r| r.status == RunStatus::Succeeded)
        },
    )
    .await;
    // Two finished runs each, so that the check for overlaps below has ticks to compare:
    // a quick takeover can otherwise end the window before a second tick of bob's.
    eventually(
        Duration::from_secs(30),
        "two finished runs of alice and of bob",
        || async {
            let mut each = Vec::new();
            for user in ["alice", "bob"] {
                let runs = runs_of(&app, user).await;
                each.push(runs.iter().filter(|r| r.finished_at.is_some()).count() >= 2);
            }
            each.iter().all(|done| *done)
        },
    )
    .await;
    for (i, daemon) in daemons.iter_mut().enumerate() {
        if i != victim {
            daemon.signal(Signal::SIGTERM);
            assert_eq!(daemon.wait(Duration::from_secs(20)), 0, "{}", daemon.log());
        }
    }

    // Every record stored exactly once.
    let records = app.records().await;
    assert_eq!(records.len(), 2 * 6 + 24);
    let sloth = runs_of(&app, "sloth").await;
    let killed = sloth
        .iter()
        .find(|r| r.status == RunStatus::Interrupted)
        .expect("the killed run is marked");
    let resumed = sloth
        .iter()
        .find(|r| r.status == RunStatus::Succeeded)
        .unwrap();
    assert!(resumed.id > killed.id);
    assert!(
        resumed.pages_fetched < 6,
        "the taker resumed from the checkpoint: {resumed:?}"
    );
    assert_eq!(killed.pages_fetched + resumed.pages_fetched, 6);
    assert!(sloth.iter().all(|r| r.status != RunStatus::Running));

    // No two runs of one connection ever overlapped, though three daemons fired each tick.
    for user in ["alice", "bob", "sloth"] {
        let runs = runs_of(&app, user).await;
        assert!(runs.len() >= 2 || user == "sloth", "{user}: {runs:?}");
        for pair in runs.windows(2) {
            let ended = pair[0].finished_at.expect("finished");
            assert!(
                ended <= pair[1].started_at,
                "{user}: overlapping runs {pair:?}"
            );
        }
    }
}

#[tokio::test]
async fn instances_starting_at_once_migrate_a_fresh_database_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let url = crate::helpers::scratch_database_url(dir.path()).await;
    let config = dir.path().join("config.toml");
    std::fs::write(&config, format!("[database]\nurl = \"{url}\"\n")).unwrap();
    // Eight at once: with three, a race between two of them switching the fresh file to
    // WAL ("database is locked" at connect) showed up about once in a hundred tries.
    let children: Vec<_> = (0..8)
        .map(|_| {
            Command::new(assert_cmd::cargo::cargo_bin("tributary"))
                .arg("--config")
                .arg(&config)
                .arg("migrate")
                .env_remove("TRIBUTARY_DATABASE_URL")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("tributary starts")
        })
        .collect();
    for child in children {
        let output = child.wait_with_output().unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let db = sea_orm::Database::connect(&url).await.unwrap();
    let applied = db
        .query_all_raw(sea_orm::Statement::from_string(
            db.get_database_backend(),
            "SELECT version FROM seaql_migrations",
        ))
        .await
        .unwrap();
    use tributary_migrations::MigratorTrait;
    assert_eq!(
        applied.len(),
        tributary_migrations::Migrator::migrations().len(),
        "each migration recorded once"
    );
}

/// SQLite, whatever backend the suite runs on: the settings every connection gets.
#[tokio::test]
async fn a_sqlite_database_is_opened_in_wal_mode_with_infrequent_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let settings = tributary::config::DatabaseSettings {
        url: format!("sqlite://{}?mode=rwc", dir.path().join("wal.db").display()),
        max_connections: 4,
    };
    let db = tributary::db::connect(&settings).await.expect("connects");
    let mut pragmas = Vec::new();
    for pragma in [
        "journal_mode",
        "synchronous",
        "wal_autocheckpoint",
        "foreign_keys",
    ] {
        let row = db
            .query_one_raw(sea_orm::Statement::from_string(
                db.get_database_backend(),
                format!("PRAGMA {pragma}"),
            ))
            .await
            .unwrap()
            .unwrap();
        let value: String = match row.try_get_by_index::<String>(0) {
            Ok(text) => text,
            Err(_) => row.try_get_by_index::<i64>(0).unwrap().to_string(),
        };
        pragmas.push((pragma, value));
    }
    assert_eq!(
        pragmas,
        [
            ("journal_mode", "wal".to_string()),
            ("synchronous", "1".to_string()),
            ("wal_autocheckpoint", "10000".to_string()),
            ("foreign_keys", "1".to_string()),
        ]
    );
}

#[tokio::test]
async fn the_daemon_speaks_systemds_notify_protocol_and_logs_json_with_run_fields() {
    use std::os::unix::net::UnixDatagram;
    let app = crate::helpers::spawn_app().await;
    mount_cursor_listing(&app.api, "alice", "alice_", 1, 2, Duration::ZERO).await;
    let config = app.write_config(&format!(
        "{}{}",
        daemon_table(None),
        every_second(cursor_provider("acme", &app.api.uri(), &["alice"]))
    ));
    let socket_path = app.dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let log = app.dir.path().join("daemon.json.log");
    let child = Command::new(assert_cmd::cargo::cargo_bin("tributary"))
        .arg("--config")
        .arg(&config)
        .args(["--log-format", "json", "--log", "info", "daemon"])
        .env_remove("TRIBUTARY_DATABASE_URL")
        .env("NOTIFY_SOCKET", &socket_path)
        .env("WATCHDOG_USEC", "1000000")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut daemon = Daemon { child, log };

    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut buf = [0u8; 512];
    while !(seen.contains("READY=1") && seen.contains("WATCHDOG=1")) {
        assert!(Instant::now() < deadline, "notifications so far: {seen:?}");
        if let Ok(n) = socket.recv(&mut buf) {
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
            seen.push('\n');
        }
    }
    eventually(Duration::from_secs(30), "a scheduled run", || async {
        runs_of(&app, "alice")
            .await
            .iter()
            .any(|r| r.status == RunStatus::Succeeded)
    })
    .await;
    daemon.signal(Signal::SIGTERM);
    while !seen.contains("STOPPING=1") {
        assert!(Instant::now() < deadline, "notifications so far: {seen:?}");
        if let Ok(n) = socket.recv(&mut buf) {
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    }
    assert_eq!(daemon.wait(Duration::from_secs(15)), 0);

    let lines: Vec<serde_json::Value> = daemon
        .log()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    let finished = lines
        .iter()
        .find(|line| line["fields"]["message"] == "Run finished.")
        .expect("a run finished line");
    assert_eq!(finished["span"]["name"], "run");
    assert_eq!(finished["span"]["user_id"], "alice");
    assert_eq!(finished["span"]["provider"], "acme");
    assert!(finished["span"]["run_id"].is_number(), "{finished}");
}

#[tokio::test]
async fn a_run_past_its_run_timeout_fails_and_keeps_its_committed_pages() {
    let app = crate::helpers::spawn_app().await;
    mount_cursor_listing(
        &app.api,
        "alice",
        "alice_",
        10,
        3,
        Duration::from_millis(400),
    )
    .await;
    let providers = cursor_provider("acme", &app.api.uri(), &["alice"]).replace(
        "schedule = \"0 */15 * * * *\"",
        "schedule = \"0 */15 * * * *\"\nrun_timeout = \"1500ms\"",
    );
    let settings = app.settings(&providers).await;
    let run = app.sync_one(&settings).await;
    assert_eq!(run.status, tributary::entities::sync_run::RunStatus::Failed);
    assert!(
        run.error.as_deref().unwrap_or("").contains("run_timeout"),
        "{:?}",
        run.error
    );
    let committed = app.records().await.len();
    assert!((3..30).contains(&committed), "{committed}");
    assert_eq!(committed, run.counts.pages_fetched as usize * 3);
    let row = app.run_row(run.run_id).await;
    assert_eq!(row.status, RunStatus::Failed);
    assert_eq!(
        row.records_inserted as usize, committed,
        "the run's counters match what it committed"
    );
    assert!(
        row.heartbeat_at > row.started_at,
        "the heartbeat moved with the pages"
    );
    assert!(
        app.stream_checkpoint().await.is_some(),
        "the next run resumes"
    );
}

/// The daemon deletes the processed keys of append-only providers whose retention has
/// passed, on its `key_sweep_schedule`, and keeps the live ones.
#[tokio::test]
async fn the_daemon_sweeps_expired_processed_keys_on_its_schedule() {
    use sea_orm::{ActiveModelTrait, Set};
    let app = crate::helpers::spawn_app().await;
    let now = chrono::Utc::now();
    for (id, expires_at) in [
        ("evt_expired", now - chrono::Duration::hours(1)),
        ("evt_live", now + chrono::Duration::days(30)),
    ] {
        processed_key::ActiveModel {
            user_id: Set("alice".to_string()),
            provider: Set("events".to_string()),
            external_id: Set(id.to_string()),
            processed_at: Set(now - chrono::Duration::days(31)),
            expires_at: Set(expires_at),
            ..Default::default()
        }
        .insert(&app.db)
        .await
        .unwrap();
    }
    // Synced once a year: no run happens while the test watches the sweep.
    let providers = cursor_provider("events", &app.api.uri(), &["alice"]).replace(
        "schedule = \"0 */15 * * * *\"",
        "schedule = \"0 0 0 1 1 *\"\nmode = \"append\"\nretention = \"30d\"",
    );
    let config = app.write_config(&format!(
        "{}key_sweep_schedule = \"* * * * * *\"\n{providers}",
        daemon_table(None)
    ));
    let mut daemon = Daemon::start(&config, app.dir.path().join("daemon.log"));
    let keys_left = || async {
        processed_key::Entity::find()
            .order_by_asc(processed_key::Column::ExternalId)
            .all(&app.db)
            .await
            .unwrap()
            .into_iter()
            .map(|key| key.external_id)
            .collect::<Vec<_>>()
    };

    eventually(Duration::from_secs(20), "the expired key swept", || async {
        keys_left().await == ["evt_live"]
    })
    .await;
    daemon.signal(Signal::SIGTERM);
    assert_eq!(daemon.wait(Duration::from_secs(15)), 0, "{}", daemon.log());
    assert_eq!(keys_left().await, ["evt_live"]);
    assert!(
        daemon.log().contains("Expired processed keys swept."),
        "{}",
        daemon.log()
    );
    assert!(runs_of(&app, "alice").await.is_empty(), "no run was due");
}

/// The daemon deletes the change batches older than `[changes] retention` on its
/// `sweep_schedule`, keeps the newer ones, and remembers the highest seq it swept.
#[tokio::test]
async fn the_daemon_sweeps_changes_past_their_retention_on_its_schedule() {
    use sea_orm::sea_query::Expr;
    use tributary::entities::{change, change_batch, change_clock};
    let app = crate::helpers::spawn_app().await;
    // Two pages of one run: a batch each.
    let connection = app.alice().await;
    let mut run = crate::helpers::open_run(&app.db, &connection).await;
    for external_id in ["old", "new"] {
        let payload = format!(r#"{{"id":"{external_id}"}}"#);
        let item = tributary_providers::PageItem::Record(tributary_providers::Record {
            external_id: external_id.to_string(),
            content_hash: tributary_providers::record::sha256_hex(payload.as_bytes()),
            payload,
        });
        let page = tributary::pipeline::RunPage {
            items: vec![item],
            ..tributary::pipeline::RunPage::default()
        };
        run.store(page).await.unwrap();
    }
    let seqs = app.batch_seqs().await;
    assert_eq!(seqs.len(), 2);
    change_batch::Entity::update_many()
        .col_expr(
            change_batch::Column::CommittedAt,
            Expr::value(chrono::Utc::now() - chrono::Duration::days(2)),
        )
        .filter(change_batch::Column::Seq.eq(seqs[0]))
        .exec(&app.db)
        .await
        .unwrap();
    // Synced once a year: no run happens while the test watches the sweep.
    let providers = cursor_provider("acme", &app.api.uri(), &["alice"]).replace(
        "schedule = \"0 */15 * * * *\"",
        "schedule = \"0 0 0 1 1 *\"",
    );
    let config = app.write_config(&format!(
        "{}[changes]\nretention = \"1d\"\nsweep_schedule = \"* * * * * *\"\n{providers}",
        daemon_table(None)
    ));
    let mut daemon = Daemon::start(&config, app.dir.path().join("daemon.log"));
    let changes_left = || async {
        change::Entity::find()
            .all(&app.db)
            .await
            .unwrap()
            .into_iter()
            .map(|change| change.external_id)
            .collect::<Vec<_>>()
    };
    // The log line comes after the last delete: waiting for the rows alone could stop the
    // daemon between the two, cutting the sweep short before it logs.
    eventually(Duration::from_secs(20), "the old batch swept", || async {
        daemon.log().contains("Expired changes swept.")
    })
    .await;
    daemon.signal(Signal::SIGTERM);
    assert_eq!(daemon.wait(Duration::from_secs(15)), 0, "{}", daemon.log());
    assert_eq!(changes_left().await, ["new"]);
    assert_eq!(app.batch_seqs().await, [seqs[1]], "the new batch is kept");
    let clock = change_clock::Entity::find_by_id(1)
        .one(&app.db)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(clock.swept_seq, seqs[0], "the old batch's seq");
}

#[tokio::test]
async fn a_start_waiting_for_the_migration_lock_extends_systemds_start_timeout() {
    use std::os::unix::net::UnixDatagram;
    let app = crate::helpers::spawn_app().await;
    let config = app.write_config(&format!(
        "{}{}",
        daemon_table(None),
        cursor_provider("acme", &app.api.uri(), &["alice"])
    ));
    let socket_path = app.dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).expect("bind the notify socket");
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .expect("read timeout");
    // Another instance is migrating: the daemon must wait, and say it is still starting.
    let held =
        tributary::db::MigrationLock::acquire(&app.db, &app.database_url, Duration::from_secs(5))
            .await
            .expect("the lock is free");
    let log = app.dir.path().join("daemon.log");
    let child = Command::new(assert_cmd::cargo::cargo_bin("tributary"))
        .arg("--config")
        .arg(&config)
        .args(["--log", "info", "daemon"])
        .env_remove("TRIBUTARY_DATABASE_URL")
        .env("NOTIFY_SOCKET", &socket_path)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("daemon starts");
    let mut daemon = Daemon { child, log };
    let mut seen = String::new();
    let mut buf = [0u8; 512];
    let mut read_for = |limit: Duration, seen: &mut String, until: &str| {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline && !seen.contains(until) {
            if let Ok(n) = socket.recv(&mut buf) {
                seen.push_str(&String::from_utf8_lossy(&buf[..n]));
                seen.push('\n');
            }
        }
    };
    read_for(Duration::from_secs(3), &mut seen, "READY=1");
    assert!(
        seen.contains("EXTEND_TIMEOUT_USEC="),
        "notifications: {seen:?}"
    );
    assert!(
        !seen.contains("READY=1"),
        "ready while the lock is held: {seen:?}"
    );

    // A stop asked for while still migrating waits for the start to finish, never kills
    // the process halfway through it.
    daemon.signal(Signal::SIGTERM);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        daemon.child.try_wait().expect("wait").is_none(),
        "SIGTERM killed the daemon while it waited to migrate:\n{}",
        daemon.log()
    );
    held.release().await.expect("released");
    read_for(Duration::from_secs(30), &mut seen, "STOPPING=1");
    assert!(
        seen.contains("READY=1") && seen.contains("STOPPING=1"),
        "notifications: {seen:?}\n{}",
        daemon.log()
    );
    let code = daemon.wait(Duration::from_secs(15));
    assert_eq!(code, 0, "{}", daemon.log());
}

/// The shipped unit keeps the hardening docs/operations.md promises, and the install steps
/// (there and in the README) never put a secret on a command line.
#[test]
fn the_systemd_unit_is_hardened_and_the_install_steps_keep_secrets_off_command_lines() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let unit = std::fs::read_to_string(root.join("deploy/tributary.service")).expect("unit");
    let directives: Vec<&str> = unit
        .lines()
        .map(str::trim)
        .filter(|line| !line.starts_with('#'))
        .collect();
    for wanted in [
        "Type=notify",
        "UMask=0077",
        "ProtectProc=invisible",
        "PrivateMounts=yes",
        "RemoveIPC=yes",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
    ] {
        assert!(
            directives.contains(&wanted),
            "{wanted} missing from the unit"
        );
    }
    assert!(directives.iter().any(|line| line.starts_with("MemoryMax=")));
    assert!(
        unit.contains("LoadCredential="),
        "LoadCredential= is documented in the unit"
    );
    for doc in ["README.md", "docs/operations.md"] {
        let text = std::fs::read_to_string(root.join(doc)).expect(doc);
        assert!(
            !text.contains("env $("),
            "an install step in {doc} expands secrets onto a command line"
        );
    }
}

/// `ProtectProc=invisible` and similar sandboxes can hide `/proc/sys/kernel/hostname`;
/// here a private mount namespace blanks it, and the lease holder must still name the host.
#[tokio::test]
async fn lease_holders_name_the_host_where_proc_does_not_show_it() {
    let app = crate::helpers::spawn_app().await;
    let config = app.write_config(&format!(
        "{}{}",
        daemon_table(None),
        cursor_provider("acme", &app.api.uri(), &["alice"])
    ));
    let blank = app.dir.path().join("blank-hostname");
    std::fs::write(&blank, "").expect("blank file");
    let script = format!(
        "mount --bind '{}' /proc/sys/kernel/hostname && exec \"$0\" --config \"$1\" --log info daemon",
        blank.display()
    );
    let log = app.dir.path().join("daemon.log");
    let child = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .arg(assert_cmd::cargo::cargo_bin("tributary"))
        .arg(&config)
        .env_remove("TRIBUTARY_DATABASE_URL")
        .env_remove("HOSTNAME")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("unshare starts");
    let mut daemon = Daemon { child, log };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !daemon.log().contains("Daemon ready.") {
        assert!(Instant::now() < deadline, "not ready:\n{}", daemon.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let host = nix::unistd::gethostname()
        .expect("gethostname")
        .into_string()
        .expect("a UTF-8 host name");
    let holder = format!("{}:{}:", host.replace(':', "_"), daemon.pid());
    assert!(
        daemon.log().contains(&holder),
        "{holder} not in:\n{}",
        daemon.log()
    );
    daemon.signal(Signal::SIGTERM);
    let code = daemon.wait(Duration::from_secs(15));
    assert_eq!(code, 0, "{}", daemon.log());
}

/// A `sync_jobs` row as an instance writes it, for tests that seed the table.
struct JobRow {
    connection_id: i64,
    holder: String,
    slot_at: chrono::DateTime<chrono::Utc>,
    started: chrono::DateTime<chrono::Utc>,
}

impl JobRow {
    fn new(
        connection_id: i64,
        holder: &str,
        slot_at: chrono::DateTime<chrono::Utc>,
        started: chrono::DateTime<chrono::Utc>,
    ) -> JobRow {
        JobRow {
            connection_id,
            holder: holder.to_string(),
            slot_at,
            started,
        }
    }

    fn running(self) -> tributary::entities::sync_job::ActiveModel {
        use sea_orm::Set;
        use tributary::entities::sync_job::{ActiveModel, JobKind, JobStatus};
        ActiveModel {
            connection_id: Set(self.connection_id),
            provider: Set("acme".to_string()),
            stream: Set(String::new()),
            kind: Set(JobKind::Scheduled),
            slot_at: Set(Some(self.slot_at)),
            status: Set(JobStatus::Running),
            holder: Set(Some(self.holder)),
            created_at: Set(self.started),
            started_at: Set(Some(self.started)),
            finished_at: Set(None),
            outcome: Set(None),
            ..Default::default()
        }
    }

    fn finished(
        self,
        status: tributary::entities::sync_job::JobStatus,
        at: chrono::DateTime<chrono::Utc>,
        outcome: &str,
    ) -> tributary::entities::sync_job::ActiveModel {
        use sea_orm::Set;
        let mut row = self.running();
        row.status = Set(status);
        row.finished_at = Set(Some(at));
        row.outcome = Set(Some(outcome.to_string()));
        row
    }
}

/// Alice's jobs in `sync_jobs`, oldest first.
async fn jobs_of_alice(app: &TestApp) -> Vec<tributary::entities::sync_job::Model> {
    use tributary::entities::sync_job;
    let alice = connection::Entity::find()
        .filter(connection::Column::UserId.eq("alice"))
        .one(&app.db)
        .await
        .unwrap()
        .expect("alice");
    sync_job::Entity::find()
        .filter(sync_job::Column::ConnectionId.eq(alice.id))
        .order_by_asc(sync_job::Column::Id)
        .all(&app.db)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_daemon_firing_a_slot_after_another_ran_it_runs_nothing() {
    use tributary::entities::sync_job::{self, JobStatus};
    if backend() == Backend::Sqlite {
        // One daemon per SQLite file (see `several_daemons_share_the_work_...`).
        return;
    }
    let app = crate::helpers::spawn_app().await;
    let users: Vec<String> = (0..4).map(|i| format!("user{i}")).collect();
    let names: Vec<&str> = users.iter().map(String::as_str).collect();
    for user in &names {
        mount_cursor_listing(&app.api, user, user, 1, 1, Duration::ZERO).await;
    }
    let providers = cursor_provider("acme", &app.api.uri(), &names).replace(
        "schedule = \"0 */15 * * * *\"",
        "schedule = \"*/6 * * * * *\"",
    );
    let config = app.write_config(&format!("{}{providers}", daemon_table(None)));
    app.settings(&providers).await;
    let jobs = || async {
        sync_job::Entity::find()
            .order_by_asc(sync_job::Column::Id)
            .all(&app.db)
            .await
            .unwrap()
    };
    let mut early = Daemon::start(&config, app.dir.path().join("early.log"));
    let mut late = Daemon::start_with(
        &config,
        app.dir.path().join("late.log"),
        &["--log", "debug"],
        &[],
    );
    eventually(Duration::from_secs(30), "both daemons ready", || async {
        early.log().contains("Daemon ready.") && late.log().contains("Daemon ready.")
    })
    .await;
    // The late daemon is paused over the next slot, until the early one has run it: it
    // fires the slot when it resumes, as an instance whose firing was delayed would.
    let now = chrono::Utc::now();
    let next_slot = {
        let seconds = now.timestamp();
        let next = seconds - seconds.rem_euclid(6) + 6;
        chrono::DateTime::from_timestamp(next, 0).expect("a time")
    };
    let until_pause = (next_slot - now - chrono::Duration::milliseconds(700))
        .to_std()
        .unwrap_or_default();
    tokio::time::sleep(until_pause).await;
    late.signal(Signal::SIGSTOP);
    let fired_before = late.log().matches("Schedule fired.").count();
    eventually(
        Duration::from_secs(20),
        "the early daemon's runs of the slot",
        || async {
            jobs()
                .await
                .iter()
                .filter(|job| job.slot_at == Some(next_slot) && job.status == JobStatus::Done)
                .count()
                == users.len()
        },
    )
    .await;
    late.signal(Signal::SIGCONT);
    // Well before the slot after it.
    let settle = (next_slot + chrono::Duration::milliseconds(4500) - chrono::Utc::now())
        .to_std()
        .unwrap_or_default();
    tokio::time::sleep(settle).await;
    for daemon in [&early, &late] {
        daemon.signal(Signal::SIGTERM);
    }
    for daemon in [&mut early, &mut late] {
        assert_eq!(daemon.wait(Duration::from_secs(20)), 0, "{}", daemon.log());
    }

    let jobs = jobs().await;
    let runs = sync_run::Entity::find().all(&app.db).await.unwrap();
    let in_slot = |at: chrono::DateTime<chrono::Utc>| {
        at >= next_slot && at < next_slot + chrono::Duration::seconds(6)
    };
    let runs_in_slot = runs.iter().filter(|run| in_slot(run.started_at)).count();
    assert_eq!(
        runs_in_slot,
        users.len(),
        "each connection runs once in the slot, though the late daemon fired it too\n{}",
        late.log()
    );
    // (MySQL counts a duplicate's row as found, so only the firing itself is logged
    // alike on every backend.)
    assert!(
        late.log().matches("Schedule fired.").count() > fired_before,
        "the late daemon fired the slot after it resumed:\n{}",
        late.log()
    );
    let done = jobs
        .iter()
        .filter(|job| job.status == JobStatus::Done)
        .count();
    assert_eq!(runs.len(), done, "one run per job that ran: {jobs:#?}");
    let mut slots: Vec<_> = jobs
        .iter()
        .map(|job| (job.connection_id, job.slot_at))
        .collect();
    slots.sort();
    slots.dedup();
    assert_eq!(slots.len(), jobs.len(), "one job per slot");
}

#[tokio::test]
async fn the_daemon_sweeps_jobs_finished_longer_than_keep_jobs_ago() {
    use sea_orm::ActiveModelTrait;
    use tributary::entities::sync_job::JobStatus;
    let app = crate::helpers::spawn_app().await;
    // Synced once a year: no run happens while the test watches the sweep.
    let providers = cursor_provider("acme", &app.api.uri(), &["alice"]).replace(
        "schedule = \"0 */15 * * * *\"",
        "schedule = \"0 0 0 1 1 *\"",
    );
    app.settings(&providers).await;
    let alice = connection::Entity::find()
        .one(&app.db)
        .await
        .unwrap()
        .expect("alice");
    let now = chrono::Utc::now();
    for (hours_ago, slot) in [(3, 1), (0, 2)] {
        let finished = now - chrono::Duration::hours(hours_ago);
        let slot_at = now - chrono::Duration::days(slot);
        let job = JobRow::new(alice.id, "elsewhere:1:0", slot_at, finished);
        job.finished(JobStatus::Done, finished, "run 1 succeeded")
            .insert(&app.db)
            .await
            .unwrap();
    }
    let config = app.write_config(&format!(
        "[daemon]\nkeep_jobs = \"2h\"\nlease_ttl = \"5s\"\nshutdown_grace = \"8s\"\n\
         [retention]\nsweep_schedule = \"* * * * * *\"\n{providers}"
    ));
    let mut daemon = Daemon::start_with(
        &config,
        app.dir.path().join("daemon.log"),
        &["--log", "debug"],
        &[],
    );
    eventually(Duration::from_secs(20), "the old job swept", || async {
        // Swept with the history, `keep_jobs` its retention.
        daemon
            .log()
            .contains("Retention sweep deleted old history.")
    })
    .await;
    daemon.signal(Signal::SIGTERM);
    assert_eq!(daemon.wait(Duration::from_secs(15)), 0, "{}", daemon.log());
    let left: Vec<_> = jobs_of_alice(&app)
        .await
        .iter()
        .filter_map(|job| job.finished_at)
        .collect();
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(
        left[0] > now - chrono::Duration::hours(1),
        "the recent job stays"
    );

    // `tributary jobs` shows it, with the connection it was for.
    let listed = crate::helpers::run(crate::helpers::tributary(&config).args(["jobs", "--json"]));
    assert_eq!(listed.code, 0, "{}", listed.stderr);
    let jobs: serde_json::Value = serde_json::from_str(&listed.stdout).expect("JSON");
    let jobs = jobs.as_array().expect("an array");
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0]["user_id"], "alice");
    assert_eq!(jobs[0]["provider"], "acme");
    assert_eq!(jobs[0]["status"], "done");
    assert_eq!(jobs[0]["outcome"], "run 1 succeeded");
    let skipped = crate::helpers::run(
        crate::helpers::tributary(&config).args(["jobs", "--status", "skipped"]),
    );
    assert_eq!(skipped.stdout.trim(), "No jobs.", "{}", skipped.stderr);
}

#[tokio::test]
async fn the_library_daemon_refuses_a_records_table_without_the_key_index() {
    let app = spawn_app().await;
    mount_cursor_listing(&app.api, "alice", "a", 1, 3, Duration::ZERO).await;
    let provider = every_second(cursor_provider("acme", &app.api.uri(), &["alice"]));
    let settings = app.settings(&provider).await;
    app.execute(match backend() {
        Backend::Mysql => "DROP INDEX records_user_provider_external_id_key ON records",
        _ => "DROP INDEX records_user_provider_external_id_key",
    })
    .await;
    // Never told to stop: only the refusal ends it within the limit.
    let daemon = tributary::daemon::run(&settings, app.db.clone(), std::future::pending());
    let refused = tokio::time::timeout(Duration::from_secs(30), daemon)
        .await
        .expect("the daemon refuses at once instead of scheduling")
        .expect_err("the daemon refuses a table without the key index");
    assert!(
        matches!(
            refused,
            tributary::daemon::DaemonError::KeyIndex(tributary::db::DbSetupError::MissingKeyIndex)
        ),
        "{refused:?}"
    );
    assert!(
        refused
            .to_string()
            .contains("tributary reconcile --dry-run"),
        "{refused}"
    );
    assert!(runs_of(&app, "alice").await.is_empty(), "no run started");
    assert!(app.records().await.is_empty());
}

#[tokio::test]
async fn a_paused_connection_is_left_out_of_its_schedule_until_resumed() {
    let app = crate::helpers::spawn_app().await;
    for user in ["alice", "bob"] {
        mount_cursor_listing(&app.api, user, user, 1, 1, Duration::ZERO).await;
    }
    let providers = every_second(cursor_provider("acme", &app.api.uri(), &["alice", "bob"]));
    let config = app.write_config(&format!("{}{providers}", daemon_table(None)));
    app.settings(&providers).await;
    let connections = |args: &[&str]| {
        let mut all = vec!["connections"];
        all.extend_from_slice(args);
        crate::helpers::run(crate::helpers::tributary(&config).args(&all))
    };
    let paused = connections(&["pause", "--provider", "acme", "--user", "alice"]);
    assert_eq!(paused.code, 0, "{}", paused.stderr);
    assert!(
        paused.stdout.contains("alice@acme is paused."),
        "{}",
        paused.stdout
    );
    let listed = connections(&["list", "--json"]);
    let rows: serde_json::Value = serde_json::from_str(&listed.stdout).expect("JSON");
    let paused_at = |user: &str| {
        rows.as_array()
            .expect("an array")
            .iter()
            .find(|row| row["user_id"] == user)
            .map(|row| row["paused_at"].is_null())
    };
    assert_eq!(
        (paused_at("alice"), paused_at("bob")),
        (Some(false), Some(true))
    );

    let mut daemon = Daemon::start(&config, app.dir.path().join("daemon.log"));
    eventually(Duration::from_secs(30), "three of bob's runs", || async {
        runs_of(&app, "bob").await.len() >= 3
    })
    .await;
    assert!(runs_of(&app, "alice").await.is_empty(), "alice is paused");

    let resumed = connections(&["resume", "--provider", "acme", "--user", "alice"]);
    assert_eq!(resumed.code, 0, "{}", resumed.stderr);
    eventually(
        Duration::from_secs(30),
        "alice's run once resumed",
        || async { !runs_of(&app, "alice").await.is_empty() },
    )
    .await;
    daemon.signal(Signal::SIGTERM);
    assert_eq!(daemon.wait(Duration::from_secs(15)), 0, "{}", daemon.log());
    let again = connections(&["resume", "--provider", "acme", "--user", "alice"]);
    assert!(
        again.stdout.contains("was already resumed"),
        "{}",
        again.stdout
    );
    let unknown = connections(&["pause", "--provider", "acme", "--user", "nobody"]);
    assert_ne!(unknown.code, 0);
    assert!(
        unknown
            .stderr
            .contains("there is no connection nobody@acme"),
        "{}",
        unknown.stderr
    );
}

#[tokio::test]
async fn a_job_whose_instance_stopped_is_put_back_in_the_queue_and_run() {
    use sea_orm::{ActiveModelTrait, Set};
    use tributary::entities::instance;
    use tributary::entities::sync_job::{self, JobStatus};
    let app = crate::helpers::spawn_app().await;
    mount_cursor_listing(&app.api, "alice", "alice", 1, 1, Duration::ZERO).await;
    let providers = cursor_provider("acme", &app.api.uri(), &["alice"]).replace(
        "schedule = \"0 */15 * * * *\"",
        "schedule = \"0 0 0 1 1 *\"",
    );
    app.settings(&providers).await;
    let alice = connection::Entity::find()
        .one(&app.db)
        .await
        .unwrap()
        .expect("alice");
    let now = chrono::Utc::now();
    // Another instance, alive and heartbeating, and one killed without a trace.
    instance::ActiveModel {
        holder: Set("live-host:2:beef".to_string()),
        host: Set("live-host".to_string()),
        pid: Set(2),
        command: Set("daemon".to_string()),
        version: Set("test".to_string()),
        schema_version: Set(crate::helpers::newest_schema()),
        started_at: Set(now),
        heartbeat_at: Set(now),
        ..Default::default()
    }
    .insert(&app.db)
    .await
    .unwrap();
    let mut ids = Vec::new();
    // The live instance's job names another nonce of the same process, as a lease does.
    for (holder, minutes_ago) in [("gone-host:1:dead", 2), ("live-host:2:0a0a0a0a", 1)] {
        let started = now - chrono::Duration::minutes(minutes_ago);
        let job = JobRow::new(alice.id, holder, started, started)
            .running()
            .insert(&app.db)
            .await
            .unwrap();
        ids.push(job.id);
    }
    let config = app.write_config(&format!("{}{providers}", daemon_table(None)));
    let mut daemon = Daemon::start(&config, app.dir.path().join("daemon.log"));
    let job = |id: i64| {
        let app = &app;
        async move {
            sync_job::Entity::find_by_id(id)
                .one(&app.db)
                .await
                .unwrap()
                .expect("the job")
        }
    };
    eventually(
        Duration::from_secs(20),
        "the orphaned job re-queued and run",
        || async { job(ids[0]).await.status == JobStatus::Done },
    )
    .await;
    daemon.signal(Signal::SIGTERM);
    assert_eq!(daemon.wait(Duration::from_secs(15)), 0, "{}", daemon.log());
    let orphaned = job(ids[0]).await;
    assert_eq!(orphaned.attempt, 1, "{orphaned:?}");
    assert!(orphaned
        .holder
        .as_deref()
        .is_some_and(|holder| !holder.starts_with("gone-host")));
    let runs = runs_of(&app, "alice").await;
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0].status, RunStatus::Succeeded, "{runs:?}");
    assert_eq!(
        orphaned.outcome.as_deref(),
        Some(format!("run {} succeeded", runs[0].id).as_str())
    );
    assert!(daemon
        .log()
        .contains("Jobs of instances that stopped were put back in the queue."));
    assert_eq!(
        job(ids[1]).await.status,
        JobStatus::Running,
        "a live instance's job is its own"
    );
    let listed = crate::helpers::run(
        crate::helpers::tributary(&config).args(["jobs", "--status", "running", "--json"]),
    );
    let listed: serde_json::Value = serde_json::from_str(&listed.stdout).expect("JSON");
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    assert_eq!(listed[0]["id"], ids[1], "{listed}");
}

#[tokio::test]
async fn a_paused_connection_still_owes_the_full_passes_that_fall_due() {
    use tributary::entities::connection_stream;
    let app = crate::helpers::spawn_app().await;
    mount_cursor_listing(&app.api, "alice", "alice", 1, 1, Duration::ZERO).await;
    let providers = every_second(cursor_provider("acme", &app.api.uri(), &["alice"])).replacen(
        "kind = \"rest\"\n",
        "kind = \"rest\"\nfull_sync_schedule = \"* * * * * *\"\n",
        1,
    );
    let config = app.write_config(&format!("{}{providers}", daemon_table(None)));
    let settings = app.settings(&providers).await;
    let first = app.sync_one(&settings).await;
    assert_eq!(first.status, RunStatus::Succeeded, "{first:?}");
    let paused = crate::helpers::run(crate::helpers::tributary(&config).args([
        "connections",
        "pause",
        "--provider",
        "acme",
        "--user",
        "alice",
    ]));
    assert_eq!(paused.code, 0, "{}", paused.stderr);
    let owed = || async {
        connection_stream::Entity::find()
            .one(&app.db)
            .await
            .unwrap()
            .expect("alice's stream")
            .full_passes_owed
    };
    let mut daemon = Daemon::start(&config, app.dir.path().join("daemon.log"));
    eventually(Duration::from_secs(30), "a full pass owed", || async {
        owed().await > 0
    })
    .await;
    daemon.signal(Signal::SIGTERM);
    assert_eq!(daemon.wait(Duration::from_secs(15)), 0, "{}", daemon.log());
    assert_eq!(runs_of(&app, "alice").await.len(), 1, "no run while paused");
}

#[tokio::test]
async fn a_connection_with_a_schedule_of_its_own_syncs_on_it() {
    let app = crate::helpers::spawn_app().await;
    for user in ["alice", "bob"] {
        mount_cursor_listing(&app.api, user, user, 1, 1, Duration::ZERO).await;
    }
    // The provider syncs once a year; alice is given every second.
    let providers = cursor_provider("acme", &app.api.uri(), &["alice", "bob"]).replace(
        "schedule = \"0 */15 * * * *\"",
        "schedule = \"0 0 0 1 1 *\"",
    );
    let config = app.write_config(&format!("{}{providers}", daemon_table(None)));
    app.settings(&providers).await;
    let schedule = |user: &str, args: &[&str]| {
        let mut all = vec![
            "connections",
            "schedule",
            "--provider",
            "acme",
            "--user",
            user,
        ];
        all.extend_from_slice(args);
        crate::helpers::run(crate::helpers::tributary(&config).args(&all))
    };
    let bad = schedule("alice", &["--cron", "every minute"]);
    assert_ne!(bad.code, 0);
    assert!(
        bad.stderr
            .contains("schedule: \"every minute\" is not a cron expression"),
        "{}",
        bad.stderr
    );
    let alice = connection::Entity::find()
        .filter(connection::Column::UserId.eq("alice"))
        .one(&app.db)
        .await
        .expect("alice's connection")
        .expect("alice is connected");
    assert_eq!(alice.schedule, None, "a bad schedule writes nothing");
    let unknown = schedule("nobody", &["--cron", "* * * * * *"]);
    assert!(
        unknown
            .stderr
            .contains("there is no connection nobody@acme"),
        "{}",
        unknown.stderr
    );
    let set = schedule("alice", &["--cron", "* * * * * *"]);
    assert_eq!(set.code, 0, "{}", set.stderr);
    let listed = crate::helpers::run(crate::helpers::tributary(&config).args([
        "connections",
        "list",
        "--json",
    ]));
    assert!(
        listed.stdout.contains("\"schedule\": \"* * * * * *\""),
        "{}",
        listed.stdout
    );

    let mut daemon = Daemon::start(&config, app.dir.path().join("daemon.log"));
    eventually(Duration::from_secs(30), "two of alice's runs", || async {
        runs_of(&app, "alice").await.len() >= 2
    })
    .await;
    // Back on the provider's yearly schedule: no run after the next second.
    let back = schedule("alice", &["--provider-schedule"]);
    assert_eq!(back.code, 0, "{}", back.stderr);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let settled = runs_of(&app, "alice").await.len();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    daemon.signal(Signal::SIGTERM);
    assert_eq!(daemon.wait(Duration::from_secs(15)), 0, "{}", daemon.log());
    assert_eq!(
        runs_of(&app, "alice").await.len(),
        settled,
        "alice follows the provider again"
    );
    assert!(
        runs_of(&app, "bob").await.is_empty(),
        "bob keeps the provider's schedule"
    );
}
