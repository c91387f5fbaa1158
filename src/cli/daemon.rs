//! `tributary daemon`: the stop signals, the single-instance lock and systemd's start
//! timeout around [`crate::daemon::run`].

use std::path::Path;
use std::process::ExitCode;

use crate::app::{Access, App};
use crate::config::Settings;

use crate::db::OlderInstances;

/// `tributary daemon`.
pub async fn run(config: &Path, older: OlderInstances) -> anyhow::Result<ExitCode> {
    let shutdown = shutdown_signal();
    let settings = Settings::load_checking_environment(config)?;
    // An unusable certificate or key stops the daemon before it migrates; `daemon::run`
    // reads them again for the API.
    settings.api_tls()?;
    // Refuse a second SQLite daemon before touching the database.
    let lock = crate::daemon::lock_sqlite(&settings.database.url)?;
    let extender = crate::daemon::systemd::spawn_start_extender();
    let opened = App::open(
        settings,
        Access::Work {
            command: "daemon",
            older,
        },
    )
    .await;
    if let Some(extender) = extender {
        extender.abort();
    }
    let app = opened?;
    drop(lock);
    let ran = crate::daemon::run(app.settings(), app.db().clone(), shutdown).await;
    app.close().await;
    ran?;
    Ok(ExitCode::SUCCESS)
}

/// Listens for SIGTERM and SIGINT from the moment it is called, so that a signal while the
/// daemon is still migrating is kept for when it is ready instead of killing it halfway;
/// the future resolves on the first.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, Signal, SignalKind};
    let listen = |kind: SignalKind, name: &'static str| match signal(kind) {
        Ok(stream) => Some(stream),
        Err(error) => {
            tracing::error!(%error, signal = name, "Cannot listen for a stop signal.");
            None
        }
    };
    async fn next(stream: &mut Option<Signal>) {
        match stream {
            Some(stream) => {
                stream.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    }
    let mut terminate = listen(SignalKind::terminate(), "SIGTERM");
    let mut interrupt = listen(SignalKind::interrupt(), "SIGINT");
    async move {
        tokio::select! {
            _ = next(&mut terminate) => tracing::info!("SIGTERM received."),
            _ = next(&mut interrupt) => tracing::info!("SIGINT received."),
        }
    }
}
