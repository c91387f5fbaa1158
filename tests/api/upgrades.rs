//! Upgrades with several instances: every syncing process announces itself in
//! `instances`, a binary refuses a schema newer than it knows, and `migrate` refuses to
//! migrate under an instance of an older schema that is still alive.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use chrono::Utc;
use nix::sys::signal::Signal;
use sea_orm::{ActiveValue::NotSet, EntityTrait, Set};
use tributary::entities::instance;

use crate::daemon::{daemon_table, eventually, every_second, Daemon};
use crate::helpers::{cursor_provider, mount_cursor_listing, run, tributary, TestApp};

async fn instances(app: &TestApp) -> Vec<instance::Model> {
    instance::Entity::find()
        .all(&app.db)
        .await
        .expect("instances")
}

/// Writes a row for another process: `age` since its heartbeat, knowing `schema`.
async fn insert_instance(app: &TestApp, holder: &str, schema: &str, age: chrono::TimeDelta) {
    let heartbeat = Utc::now() - age;
    instance::Entity::insert(instance::ActiveModel {
        id: NotSet,
        holder: Set(holder.to_string()),
        host: Set("old-host".to_string()),
        pid: Set(4242),
        command: Set("daemon".to_string()),
        version: Set("0.0.9 (old)".to_string()),
        schema_version: Set(schema.to_string()),
        started_at: Set(heartbeat),
        heartbeat_at: Set(heartbeat),
    })
    .exec(&app.db)
    .await
    .expect("instance row");
}

#[tokio::test]
async fn the_daemon_announces_itself_while_it_runs_and_removes_its_row_at_sigterm() {
    let app = crate::helpers::spawn_app().await;
    mount_cursor_listing(&app.api, "alice", "alice_", 1, 2, Duration::ZERO).await;
    let config = app.write_config(&format!(
        "{}{}",
        daemon_table(None),
        every_second(cursor_provider("acme", &app.api.uri(), &["alice"]))
    ));
    insert_instance(&app, "gone:1:dead", "m0", chrono::TimeDelta::hours(1)).await;
    let mut daemon = Daemon::start_with(
        &config,
        app.dir.path().join("daemon.log"),
        &["--log", "info"],
        &[],
    );

    let pid = i64::from(daemon.pid());
    eventually(Duration::from_secs(30), "the daemon's row", || async {
        instances(&app).await.iter().any(|row| row.pid == pid)
    })
    .await;
    let rows = instances(&app).await;
    assert_eq!(rows.len(), 1, "the stale row was swept: {rows:?}");
    let row = &rows[0];
    assert_eq!((row.pid, row.command.as_str()), (pid, "daemon"), "{row:?}");
    assert!(
        row.holder
            .starts_with(&format!("{}:{}:", row.host, row.pid)),
        "{row:?}"
    );
    assert!(
        row.version.starts_with(env!("CARGO_PKG_VERSION")),
        "{row:?}"
    );
    assert_eq!(
        row.schema_version,
        crate::helpers::newest_schema(),
        "{row:?}"
    );
    assert!(row.heartbeat_at >= row.started_at, "{row:?}");

    daemon.signal(Signal::SIGTERM);
    assert_eq!(daemon.wait(Duration::from_secs(15)), 0, "{}", daemon.log());
    assert_eq!(instances(&app).await, vec![], "{}", daemon.log());
}

#[tokio::test]
async fn sync_announces_itself_while_it_syncs_and_removes_its_row_at_exit() {
    let app = crate::helpers::spawn_app().await;
    mount_cursor_listing(
        &app.api,
        "alice",
        "alice_",
        3,
        2,
        Duration::from_millis(700),
    )
    .await;
    let config = app.write_config(&cursor_provider("acme", &app.api.uri(), &["alice"]));
    let mut sync = Command::new(assert_cmd::cargo::cargo_bin("tributary"))
        .arg("--config")
        .arg(&config)
        .args(["sync", "--quiet"])
        .env_remove("TRIBUTARY_DATABASE_URL")
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("sync starts");

    eventually(Duration::from_secs(30), "sync's row", || async {
        instances(&app)
            .await
            .iter()
            .any(|row| row.command == "sync" && row.pid == i64::from(sync.id()))
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = sync.try_wait().expect("wait") {
            break status;
        }
        assert!(Instant::now() < deadline, "sync did not finish");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status:?}");
    assert_eq!(app.records().await.len(), 6);
    assert_eq!(instances(&app).await, vec![]);
}

/// A migration a future release applied.
const FUTURE: &str = "m20991231_000001_from_a_newer_release";

#[tokio::test]
async fn a_schema_newer_than_the_binary_is_refused_naming_both_versions_before_any_write() {
    let app = crate::helpers::spawn_app().await;
    let config = app.write_config(&cursor_provider("acme", &app.api.uri(), &["alice"]));
    app.execute(&format!(
        "INSERT INTO seaql_migrations (version, applied_at) VALUES ('{FUTURE}', 0)"
    ))
    .await;

    for args in [&["sync"][..], &["migrate"], &["daemon"], &["runs"]] {
        let refused = run(tributary(&config).args(args));
        assert_eq!(refused.code, 4, "{args:?}: {}", refused.stderr);
        assert!(
            refused.stderr.contains(&format!(
                "has schema {FUTURE}, newer than this binary knows (tributary {}, schema {})",
                env!("TRIBUTARY_RELEASE"),
                crate::helpers::newest_schema()
            )),
            "{args:?}: {}",
            refused.stderr
        );
        assert!(
            refused
                .stderr
                .contains("going back to this one means restoring the backup"),
            "{}",
            refused.stderr
        );
    }
    let stored = tributary::entities::connection::Entity::find()
        .all(&app.db)
        .await
        .expect("connections");
    assert_eq!(stored, vec![], "nothing was written");
    assert_eq!(instances(&app).await, vec![]);
    assert_eq!(app.received_requests().await, 0);
}

/// Marks this binary's newest migration (the one that made `instances`) as not applied,
/// so that `migrate` has one to apply while the table it creates is still there.
/// Takes the database back to the schema before the newest migration, through that
/// migration's own `down`, so that `migrate` has exactly it to apply.
async fn roll_back_newest_migration(app: &TestApp) {
    use tributary_migrations::MigratorTrait;
    tributary_migrations::Migrator::down(&*app.db, Some(1))
        .await
        .expect("the newest migration rolled back");
}

async fn recorded(app: &TestApp, version: &str) -> bool {
    tributary_migrations::applied_versions(&app.db)
        .await
        .expect("applied")
        .iter()
        .any(|applied| applied == version)
}

#[tokio::test]
async fn migrate_refuses_while_an_instance_of_an_older_schema_heartbeats_unless_told() {
    let app = crate::helpers::spawn_app().await;
    let config = app.write_config(&cursor_provider("acme", &app.api.uri(), &["alice"]));
    let older = "m20261203_000001_streams";
    insert_instance(
        &app,
        "old-host:4242:beef",
        older,
        chrono::TimeDelta::seconds(5),
    )
    .await;
    roll_back_newest_migration(&app).await;
    let newest = crate::helpers::newest_schema();

    let refused = run(tributary(&config).arg("migrate"));
    assert_eq!(refused.code, 4, "{}", refused.stderr);
    for expected in [
        "refusing to migrate the database".to_string(),
        format!("to schema {newest} while instances of an older schema are alive"),
        format!("`daemon` on old-host (pid 4242, tributary 0.0.9 (old), schema {older}), last heartbeat "),
        "--while-others-run".to_string(),
    ] {
        assert!(refused.stderr.contains(&expected), "{expected}: {}", refused.stderr);
    }
    assert!(!recorded(&app, &newest).await, "nothing was migrated");
    let daemon = run(tributary(&config).arg("daemon"));
    assert_eq!(daemon.code, 4, "{}", daemon.stderr);
    assert!(
        daemon.stderr.contains("old-host (pid 4242"),
        "{}",
        daemon.stderr
    );

    let allowed = run(tributary(&config).args(["migrate", "--while-others-run"]));
    assert_eq!(allowed.code, 0, "{}", allowed.stderr);
    assert!(recorded(&app, &newest).await);

    // An instance that stopped heartbeating is gone, and holds nothing up.
    roll_back_newest_migration(&app).await;
    app.execute("DELETE FROM instances").await;
    insert_instance(
        &app,
        "old-host:4242:beef",
        older,
        chrono::TimeDelta::minutes(10),
    )
    .await;
    let migrated = run(tributary(&config).arg("migrate"));
    assert_eq!(migrated.code, 0, "{}", migrated.stderr);
    assert!(recorded(&app, &newest).await);
}

#[tokio::test]
async fn migrate_refuses_while_a_release_that_does_not_announce_itself_holds_a_lease_or_runs() {
    use sea_orm::{ColumnTrait, QueryFilter};
    use tributary::entities::{connection, sync_run};
    use tributary_migrations::{Migrator, MigratorTrait};
    let app = crate::helpers::spawn_app().await;
    let config = app.write_config(&cursor_provider("acme", &app.api.uri(), &["alice"]));
    let (alice, run_id) = app.alice_with_a_run().await;
    // The schema of a release before `instances`.
    Migrator::down(app.db.main(), Some(1))
        .await
        .expect("rolled back");
    let newest = crate::helpers::newest_schema();
    assert!(!recorded(&app, &newest).await);
    let until = Utc::now() + chrono::TimeDelta::seconds(60);
    // Not through the entity's model: the rolled-back schema lacks the newest columns.
    connection::Entity::update_many()
        .col_expr(
            connection::Column::LeaseHolder,
            sea_orm::sea_query::Expr::value("old-host:77:cafe"),
        )
        .col_expr(
            connection::Column::LeaseExpiresAt,
            sea_orm::sea_query::Expr::value(until),
        )
        .filter(connection::Column::Id.eq(alice.id))
        .exec(&app.db)
        .await
        .expect("lease held");

    let refused = run(tributary(&config).arg("migrate"));
    assert_eq!(refused.code, 4, "{}", refused.stderr);
    for expected in [
        "the lease on alice@acme held by old-host:77:cafe until ".to_string(),
        format!("run {run_id} of alice@acme, running, last heartbeat "),
        "a release before instances".to_string(),
    ] {
        assert!(
            refused.stderr.contains(&expected),
            "{expected}: {}",
            refused.stderr
        );
    }
    assert!(!recorded(&app, &newest).await, "nothing was migrated");

    // The lease alone is a sign too.
    // Not through the entity's model either: the newest migration adds a run column.
    sync_run::Entity::update_many()
        .col_expr(
            sync_run::Column::Status,
            sea_orm::sea_query::Expr::value(tributary::entities::sync_run::RunStatus::Interrupted),
        )
        .filter(sync_run::Column::Id.eq(run_id))
        .exec(&app.db)
        .await
        .expect("run ended");
    let refused = run(tributary(&config).arg("migrate"));
    assert_eq!(refused.code, 4, "{}", refused.stderr);
    assert!(
        !refused.stderr.contains(&format!("run {run_id}")),
        "{}",
        refused.stderr
    );

    let allowed = run(tributary(&config).args(["migrate", "--while-others-run"]));
    assert_eq!(allowed.code, 0, "{}", allowed.stderr);
    assert!(recorded(&app, &newest).await);
}

#[tokio::test]
async fn credentials_in_clear_are_warned_about_at_every_start_and_sealing_them_is_said() {
    use tributary::entities::connection;
    let app = crate::helpers::spawn_app().await;
    mount_cursor_listing(&app.api, "alice", "alice_", 1, 2, Duration::ZERO).await;
    let config = |name: &str, secrets: &str, users: &[&str]| {
        let path = app.dir.path().join(name);
        let text = format!(
            "[database]\nurl = \"{}\"\n{secrets}{}",
            app.database_url,
            cursor_provider("acme", &app.api.uri(), users)
        );
        std::fs::write(&path, text).expect("config written");
        path
    };
    let stored = || async {
        connection::Entity::find()
            .one(&app.db)
            .await
            .expect("connections")
            .expect("alice")
            .credentials
    };
    // As a release without a key left it: alice's token in clear.
    let plaintext = config("plaintext.toml", "[secrets]\nallow_plaintext = true\n", &[]);
    let added = run(tributary(&plaintext)
        .args([
            "connections",
            "add",
            "--provider",
            "acme",
            "--user",
            "alice",
            "--token-stdin",
        ])
        .write_stdin("token-alice\n"));
    assert_eq!(added.code, 0, "{}", added.stderr);
    assert!(stored().await.contains("token-alice"));

    let in_clear = "Credentials are stored in the database in clear. This is unsafe";
    let keyless = config("keyless.toml", "", &[]);
    for _ in 0..2 {
        let started = run(tributary(&keyless).args(["sync", "--quiet"]));
        assert_eq!(started.code, 0, "{}", started.stderr);
        assert!(started.stderr.contains("WARN"), "{}", started.stderr);
        assert!(started.stderr.contains(in_clear), "{}", started.stderr);
        assert!(
            without_colours(&started.stderr).contains("connections=1"),
            "{}",
            started.stderr
        );
    }

    let keyed = config(
        "keyed.toml",
        &format!("[secrets]\nkey_file = \"{}\"\n", app.key_file.display()),
        &[],
    );
    let sealing = run(tributary(&keyed).args(["sync", "--quiet"]));
    assert_eq!(sealing.code, 0, "{}", sealing.stderr);
    assert!(
        sealing
            .stderr
            .contains("Credentials stored in clear were sealed under the current key."),
        "{}",
        sealing.stderr
    );
    assert!(!sealing.stderr.contains(in_clear), "{}", sealing.stderr);
    assert!(!stored().await.contains("token-alice"), "sealed");
}

/// `text` without the terminal colour sequences (`ESC [ ... m`) a log line may carry.
fn without_colours(text: &str) -> String {
    let mut plain = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    plain
}

#[test]
fn version_names_the_commit_it_was_built_from() {
    let output = assert_cmd::Command::cargo_bin("tributary")
        .expect("binary")
        .arg("--version")
        .output()
        .expect("runs");
    assert!(output.status.success());
    let printed = String::from_utf8_lossy(&output.stdout).into_owned();
    assert_eq!(
        printed,
        format!("tributary {}\n", env!("TRIBUTARY_RELEASE"))
    );
    assert!(printed.starts_with(&format!("tributary {} (", env!("CARGO_PKG_VERSION"))));
    // This suite runs from a checkout; a tarball's build prints the version alone.
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("git runs");
    let head = String::from_utf8_lossy(&head.stdout).trim().to_string();
    assert_eq!(head.len(), 12, "{head}");
    assert!(printed.contains(&format!("({head})")), "{printed}");
}

#[tokio::test]
async fn migrate_says_when_nothing_is_pending_and_names_what_it_applied() {
    let app = crate::helpers::spawn_app().await;
    let config = app.write_config("");
    let newest = crate::helpers::newest_schema();

    let idle = run(tributary(&config).arg("migrate"));
    assert_eq!(idle.code, 0, "{}", idle.stderr);
    assert!(
        idle.stdout.starts_with("Nothing to migrate: ")
            && idle.stdout.ends_with(&format!(
                " is at schema {newest}, the newest this release knows.\n"
            )),
        "{}",
        idle.stdout
    );

    roll_back_newest_migration(&app).await;
    let applied = run(tributary(&config).arg("migrate"));
    assert_eq!(applied.code, 0, "{}", applied.stderr);
    assert!(
        applied.stdout.starts_with("Applied 1 migration(s) to ")
            && applied
                .stdout
                .ends_with(&format!(", now at schema {newest}:\n  {newest}\n")),
        "{}",
        applied.stdout
    );
    assert!(recorded(&app, &newest).await);
}

#[tokio::test]
async fn run_deliveries_from_before_connection_events_read_as_runs_after_the_upgrade() {
    use sea_orm::ActiveValue::NotSet;
    use tributary::entities::notification_delivery::{self, DeliveryEvent, DeliveryStatus};
    use tributary_migrations::{Migrator, MigratorTrait};
    let app = crate::helpers::spawn_app().await;
    let (_, run_id) = app.alice_with_a_run().await;
    Migrator::down(app.db.main(), Some(1))
        .await
        .expect("rolled back");
    let delivery = |delivery_id: &str, run_id: Option<i64>| notification_delivery::ActiveModel {
        id: NotSet,
        delivery_id: Set(delivery_id.to_string()),
        run_id: Set(run_id),
        user_id: Set("alice".to_string()),
        provider: Set("acme".to_string()),
        body: Set("{}".to_string()),
        status: Set(DeliveryStatus::Pending),
        attempts: Set(0),
        last_error: Set(None),
        next_attempt_at: Set(Utc::now()),
        created_at: Set(Utc::now()),
        delivered_at: Set(None),
        // The older schema has neither column: the insert leaves them out.
        event: NotSet,
        event_key: NotSet,
    };
    notification_delivery::Entity::insert(delivery("older", Some(run_id)))
        .exec_without_returning(&app.db)
        .await
        .expect("an older release's delivery");
    Migrator::up(app.db.main(), None).await.expect("migrated");

    let rows = notification_delivery::Entity::find()
        .all(&app.db)
        .await
        .expect("deliveries");
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0].delivery_id.as_str(), rows[0].run_id, rows[0].event),
        ("older", Some(run_id), DeliveryEvent::Run)
    );
    assert_eq!(rows[0].event_key, None);
    // Connection events have no run, and their key is unique.
    let event = |delivery_id: &str, key: &str| {
        let mut row = delivery(delivery_id, None);
        row.event = Set(DeliveryEvent::ConnectionCreated);
        row.event_key = Set(Some(key.to_string()));
        notification_delivery::Entity::insert(row).exec_without_returning(&*app.db)
    };
    event("first", "connection.created:1:session-1")
        .await
        .expect("a connection event");
    event("second", "connection.created:2:session-2")
        .await
        .expect("another connection's event");
    assert!(event("third", "connection.created:1:session-1")
        .await
        .is_err());
}
