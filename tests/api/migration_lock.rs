//! The migration lock: instances of one database take turns, instances of other databases
//! on the same server never wait for it, and nobody waits forever.

use std::time::{Duration, Instant};

use sea_orm::{ConnectionTrait, Statement};
use tributary::config::DatabaseSettings;
use tributary::db::{migrate_waiting_at_most, DbSetupError, MigrationLock, MigrationLockError};
use tributary_migrations::MigratorTrait;

use crate::helpers::{backend, scratch_database_url, spawn_app, Backend};

fn settings(url: &str) -> DatabaseSettings {
    DatabaseSettings {
        url: url.to_string(),
        max_connections: 4,
    }
}

/// What the error calls the lock on each backend.
fn lock_kind() -> &'static str {
    match backend() {
        Backend::Sqlite => "lock file ",
        Backend::Postgres => "PostgreSQL advisory lock ",
        Backend::Mysql => "MySQL named lock ",
    }
}

#[tokio::test]
async fn a_migration_waits_for_the_lock_no_longer_than_told_and_names_it() {
    let app = spawn_app().await;
    let settings = settings(&app.database_url);
    let held = MigrationLock::acquire(&app.db, &app.database_url, Duration::from_secs(5))
        .await
        .expect("the lock is free");

    let started = Instant::now();
    let refused = migrate_waiting_at_most(&app.db, &settings, Duration::from_secs(1)).await;
    let waited = started.elapsed();
    let error = refused.expect_err("the lock is held");
    assert!(
        matches!(
            &error,
            DbSetupError::MigrationLock {
                source: MigrationLockError::Timeout { .. },
                ..
            }
        ),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains(&format!(
            "waited 1 s for the migration lock ({}",
            lock_kind()
        )),
        "{message}"
    );
    assert!(
        message.contains("another instance still holds"),
        "{message}"
    );
    assert!(
        waited >= Duration::from_secs(1) && waited < Duration::from_secs(10),
        "waited {waited:?}"
    );

    held.release().await.expect("released");
    migrate_waiting_at_most(&app.db, &settings, Duration::from_secs(1))
        .await
        .expect("the lock is free again");
}

#[tokio::test]
async fn a_migration_lock_held_on_one_database_does_not_hold_up_another_on_the_same_server() {
    let app = spawn_app().await;
    let held = MigrationLock::acquire(&app.db, &app.database_url, Duration::from_secs(5))
        .await
        .expect("the lock is free");

    let other_dir = tempfile::tempdir().unwrap();
    let other_url = scratch_database_url(other_dir.path()).await;
    assert_ne!(other_url, app.database_url);
    let other = tributary::db::connect(&settings(&other_url))
        .await
        .expect("connects");
    migrate_waiting_at_most(&other, &settings(&other_url), Duration::from_secs(1))
        .await
        .expect("another database's lock is its own");
    let applied = other
        .query_all_raw(Statement::from_string(
            other.get_database_backend(),
            "SELECT version FROM seaql_migrations",
        ))
        .await
        .unwrap();
    assert_eq!(
        applied.len(),
        tributary_migrations::Migrator::migrations().len()
    );
    held.release().await.expect("released");
}

/// A command that only reads takes no migration lock when nothing is pending: it answers
/// while another instance holds the lock. (On SQLite the same lock file serialises
/// opening the database, so there every command waits for it.)
#[tokio::test]
async fn a_read_only_command_answers_while_the_migration_lock_is_held() {
    if backend() == Backend::Sqlite {
        return;
    }
    let app = spawn_app().await;
    let config = app.write_config("");
    let held = MigrationLock::acquire(&app.db, &app.database_url, Duration::from_secs(5))
        .await
        .expect("the lock is free");

    let started = Instant::now();
    let runs = crate::helpers::run(
        crate::helpers::tributary(&config)
            .arg("runs")
            .timeout(Duration::from_secs(30)),
    );
    assert_eq!(runs.code, 0, "{}", runs.stderr);
    assert!(runs.stdout.contains("No runs yet."), "{}", runs.stdout);
    let errors = crate::helpers::run(
        crate::helpers::tributary(&config)
            .args(["errors", "--open"])
            .timeout(Duration::from_secs(30)),
    );
    assert_eq!(errors.code, 0, "{}", errors.stderr);
    assert!(
        errors.stdout.contains("No open errors."),
        "{}",
        errors.stdout
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    held.release().await.expect("released");
}
