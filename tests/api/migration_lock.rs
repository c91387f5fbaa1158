//! The migration lock held by another instance: commands that only read answer without
//! waiting for it (the lock's own behaviour is tested in `src/db/migration_lock.rs`).

use std::time::{Duration, Instant};

use tributary::db::MigrationLock;

use crate::helpers::{backend, spawn_app, Backend};

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
