//! The `tributary` command line: one file per command group.

mod connections;
mod history;
pub mod progress;
mod secrets;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};

use crate::config::Settings;
use crate::db::DatabasePools;
use crate::pipeline::{NoProgress, ProgressSink, RunOptions, RunOutcome, RunStatus};
use crate::sync::{sync_matching, SyncFilter};

/// Exit code for a bad config or command line.
const EXIT_CONFIG: u8 = 2;
/// Exit code when a run failed or the database could not be used.
const EXIT_FAILURE: u8 = 1;

/// tributary: a scheduled multi-provider sync daemon. Fetches your users' records from
/// third-party APIs and stores each once per (user_id, provider, external_id).
#[derive(Debug, Parser)]
#[command(name = "tributary", version, about)]
pub struct Cli {
    /// The config file.
    #[arg(
        long,
        global = true,
        env = "TRIBUTARY_CONFIG",
        default_value = "config.toml"
    )]
    pub config: PathBuf,
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log filter (tracing's EnvFilter syntax, e.g. "info" or "tributary=debug").
    /// Defaults to "warn" (env RUST_LOG).
    #[arg(long, global = true, env = "RUST_LOG")]
    pub log: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the scheduler: sync each provider's connections on its cron schedule until
    /// SIGTERM or SIGINT. Meant to run under systemd (see deploy/tributary.service).
    Daemon,
    /// Apply pending database migrations and exit.
    Migrate,
    /// Sync the matching connections once now (one run each) and print a line per run.
    /// Exits 0 when every run succeeded or was partial, 1 when any failed.
    Sync {
        /// Only this provider (a `[providers.NAME]` table).
        #[arg(long)]
        provider: Option<String>,
        /// Only this user's connections.
        #[arg(long)]
        user: Option<String>,
        /// No progress display, only the summary lines.
        #[arg(long, short)]
        quiet: bool,
        /// Print the runs as JSON instead of summary lines.
        #[arg(long)]
        json: bool,
        /// Ignore the incremental cursor and fetch the whole listing.
        #[arg(long)]
        full: bool,
    },
    /// Show the run history, newest first.
    Runs {
        /// How many runs to show.
        #[arg(long, default_value_t = 20)]
        limit: u64,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show a run's error report (each failed record with its stage, message and payload),
    /// or with `--open` the unresolved errors of every run.
    Errors {
        /// The run's id (from `tributary runs`).
        #[arg(required_unless_present = "open")]
        run_id: Option<i64>,
        /// Only errors not yet resolved by a replay (across all runs unless RUN_ID is given).
        #[arg(long)]
        open: bool,
        /// Print JSON (with whole payloads) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Re-ingest a run's failed records from their stored payloads, as a new run with
    /// trigger `replay`. Errors whose record now goes through are marked resolved.
    Replay {
        /// The run whose errors to replay.
        run_id: i64,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove duplicate records (by the key user_id, provider, external_id) left from before
    /// the unique index existed, log every removal, then create the index. Run it against a
    /// copy first.
    Reconcile {
        /// Report what would be removed and change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Append one JSON line per removed row to this file (written before the deletion
        /// commits; created readable by its owner only). Required unless --dry-run or
        /// --no-audit-log.
        #[arg(long)]
        audit_log: Option<PathBuf>,
        /// Delete without an audit log (no copy of the removed rows is kept).
        #[arg(long, conflicts_with = "audit_log")]
        no_audit_log: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Manage connections besides config.toml.
    #[command(subcommand)]
    Connections(connections::ConnectionsCommand),
    /// The key that seals stored credentials: generate one, rotate to it, see which
    /// rows use which key.
    #[command(subcommand)]
    Secrets(secrets::SecretsCommand),
    /// Validate the config (providers, cron expressions, URLs, referenced environment
    /// variables) without touching the database.
    CheckConfig,
    /// Start a built-in emulated API on loopback, sync it twice into the configured
    /// database, and show that the second pass inserted nothing.
    Demo {
        /// No progress display.
        #[arg(long, short)]
        quiet: bool,
    },
    /// Benchmark: sync an emulated Stripe of USERS x RECORDS charges into a fresh database
    /// (first sync, unchanged re-sync, 10 % changed, then as many new records stored with
    /// nothing fetched), check the table, report records/s and peak RSS.
    Bench(crate::bench::BenchArgs),
}

/// Runs a parsed command line and returns the process exit code.
pub fn run(cli: Cli) -> ExitCode {
    // The daemon's log is its record of work; one-shot commands print their own results.
    let default_filter = match cli.command {
        Command::Daemon => "info",
        _ => "warn",
    };
    init_tracing(cli.log_format, cli.log.as_deref().unwrap_or(default_filter));
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(blocking_threads())
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    let outcome = runtime.block_on(async {
        let outcome = dispatch(cli).await;
        // A run cancelled while its token refresh was in flight leaves the refresh to
        // finish and commit: a token the provider already rotated must not be lost.
        if !crate::pipeline::credential_store::wait_for_refreshes(REFRESH_DRAIN).await {
            tracing::warn!(
                wait_secs = REFRESH_DRAIN.as_secs(),
                "A credentials refresh was still in flight at exit."
            );
        }
        outcome
    });
    match outcome {
        Ok(code) => code,
        Err(error) => {
            let code = if error.downcast_ref::<crate::config::ConfigError>().is_some()
                || secrets::is_key_error(&error)
                || error
                    .downcast_ref::<crate::sync::SyncError>()
                    .is_some_and(|e| {
                        matches!(
                            e,
                            crate::sync::SyncError::UnknownProvider { .. }
                                | crate::sync::SyncError::ProviderDisabled { .. }
                        )
                    }) {
                EXIT_CONFIG
            } else {
                EXIT_FAILURE
            };
            eprintln!("error: {error:#}");
            ExitCode::from(code)
        }
    }
}

/// How long the process waits at exit for token refreshes still in flight.
const REFRESH_DRAIN: std::time::Duration = std::time::Duration::from_secs(60);

/// The size of tokio's blocking pool, where page bodies are parsed and hashed: twice the
/// cores, at least 4. Parsing more pages at once than there are cores gains nothing, and
/// each extra thread keeps freed memory in a malloc arena of its own (at 64 concurrent
/// runs, tokio's default of 512 threads cost about 4 MiB of peak RSS and 8 % of speed).
fn blocking_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    (2 * cores).max(4)
}

fn init_tracing(format: LogFormat, filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

async fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::CheckConfig => {
            let settings = Settings::load_checking_environment(&cli.config)?;
            let keyring = secrets::load_keyring(&settings)?;
            crate::credentials::check_storable(&settings, &keyring)?;
            let connections: usize = settings
                .providers
                .values()
                .map(|p| p.connections.len())
                .sum();
            println!(
                "{} is valid: {} provider(s), {} connection(s), database {}",
                settings.path.display(),
                settings.providers.len(),
                connections,
                crate::config::redact_url(&settings.database.url)
            );
            match keyring.current() {
                Some((id, source)) => println!("Secrets key {id} from {source}."),
                None if keyring.allows_plaintext() => {
                    println!(
                        "No secrets key: literal secrets are stored in clear (allow_plaintext)."
                    )
                }
                None => println!("No secrets key: only token_env connections can be stored."),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Daemon => {
            let shutdown = shutdown_signal();
            let settings = Settings::load_checking_environment(&cli.config)?;
            // Refuse a second SQLite daemon before touching the database.
            let lock = crate::daemon::lock_sqlite(&settings.database.url)?;
            let extender = crate::daemon::systemd::spawn_start_extender();
            let opened = open_for_writing(&settings).await;
            if let Some(extender) = extender {
                extender.abort();
            }
            let db = opened?;
            drop(lock);
            crate::daemon::run(settings, db, shutdown).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Migrate => {
            let settings = Settings::load(&cli.config)?;
            crate::db::connect_and_migrate(&settings.database).await?;
            println!(
                "Migrations applied to {}.",
                crate::config::redact_url(&settings.database.url)
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Sync {
            provider,
            user,
            quiet,
            json,
            full,
        } => {
            let settings = Settings::load_checking_environment(&cli.config)?;
            let db = open_for_writing(&settings).await?;
            let filter = SyncFilter {
                provider,
                user_id: user,
            };
            let bars = progress::BarProgress::new();
            let show_progress = !quiet && !json && std::io::stderr().is_terminal();
            let sink: &dyn ProgressSink = if show_progress { &bars } else { &NoProgress };
            let options = RunOptions {
                full,
                ..RunOptions::manual()
            };
            let interrupt = options.cancel.clone();
            tokio::spawn(async move {
                if tokio::signal::ctrl_c().await.is_ok() {
                    eprintln!("Interrupted: finishing the pages in flight.");
                    interrupt.cancel();
                }
            });
            let report = sync_matching(&db, &settings, &filter, &options, sink).await?;
            bars.clear();
            if report.outcomes.is_empty() && report.skipped.is_empty() {
                eprintln!("No enabled connection matches; nothing was synced.");
            }
            if json {
                let json = serde_json::json!({
                    "runs": report.outcomes,
                    "skipped": report.skipped,
                });
                println!("{}", serde_json::to_string_pretty(&json)?);
            } else {
                for outcome in &report.outcomes {
                    println!("{}", summary_line(outcome));
                }
                for skipped in &report.skipped {
                    println!(
                        "skipped {}@{}: a run of it is already going (held by {})",
                        skipped.user_id, skipped.provider, skipped.holder
                    );
                }
            }
            Ok(exit_for(&report.outcomes))
        }
        Command::Runs { limit, json } => {
            let settings = Settings::load(&cli.config)?;
            let db = crate::db::connect_for_reading(&settings.database).await?;
            history::print_runs(&db, limit, json).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Errors {
            run_id,
            open: only_open,
            json,
        } => {
            let settings = Settings::load(&cli.config)?;
            let db = crate::db::connect_for_reading(&settings.database).await?;
            match (run_id, only_open) {
                (run_id, true) => history::print_open_errors(&db, run_id, json).await?,
                (Some(run_id), false) => history::print_errors(&db, run_id, json).await?,
                (None, false) => anyhow::bail!("give a RUN_ID, or --open"),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Replay { run_id, json } => {
            let settings = Settings::load(&cli.config)?;
            let db = open_for_writing(&settings).await?;
            let report = crate::replay::replay_run(&db, &settings, run_id).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                history::print_replay(run_id, &report);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Reconcile {
            dry_run,
            audit_log,
            no_audit_log,
            json,
        } => {
            if !dry_run && audit_log.is_none() && !no_audit_log {
                anyhow::bail!(
                    "reconcile deletes rows: give --audit-log FILE to keep a copy of each \
                     removed row, --no-audit-log to delete without one, or --dry-run to see \
                     what would go"
                );
            }
            let settings = Settings::load(&cli.config)?;
            let db = crate::db::connect_and_migrate(&settings.database).await?;
            let report = crate::reconcile::reconcile(&db, dry_run, audit_log.as_deref(), |line| {
                if dry_run && !json {
                    println!("would remove: {line}");
                }
            })
            .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                history::print_reconcile(&report);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Connections(command) => {
            let settings = Settings::load(&cli.config)?;
            // Only `add` stores a secret; the others read with whatever keys are configured.
            let db = match command.stores_credentials() {
                true => connect_with_keys(&settings).await?,
                false => crate::db::connect_and_migrate(&settings.database)
                    .await?
                    .with_keyring(secrets::load_keyring(&settings)?),
            };
            connections::run(&db, &settings, command).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Secrets(command) => secrets::run(&cli.config, command).await,
        Command::Demo { quiet } => {
            let show_progress = !quiet && std::io::stderr().is_terminal();
            crate::demo::run(&cli.config, show_progress).await
        }
        Command::Bench(args) => crate::bench::run(args).await,
    }
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

/// For commands that sync or replay: loads the keys, connects and migrates, refuses a
/// table without the unique index, loads the configured connections, retires those
/// config.toml no longer lists, and seals in place the credentials a database still
/// holds in clear. A bad key, a literal secret without one, or a configured connection
/// sealed with a key not configured stop it before anything is written. Commands that
/// only read leave connections as they are.
async fn open_for_writing(settings: &Settings) -> anyhow::Result<DatabasePools> {
    let db = connect_with_keys(settings).await?;
    crate::db::require_key_index(&db).await?;
    crate::db::sealing::check_configured_keys(&db, settings).await?;
    crate::db::upsert_configured_connections(&db, settings)
        .await
        .context("loading the configured connections into the database")?;
    crate::db::retire_removed_connections(&db, settings)
        .await
        .context("disabling the connections removed from the config")?;
    let sealed = crate::db::sealing::reseal(&db, crate::db::sealing::Reseal::InClear, None)
        .await
        .context("sealing the credentials stored in clear")?;
    if sealed.resealed > 0 {
        tracing::info!(
            connections = sealed.resealed,
            "Credentials stored in clear were sealed under the current key."
        );
    }
    for failure in &sealed.failed {
        tracing::error!(error = %failure, "Stored credentials could not be sealed.");
    }
    Ok(db)
}

/// Loads the keys (refusing bad ones and literal secrets that could not be stored), then
/// connects and migrates.
async fn connect_with_keys(settings: &Settings) -> anyhow::Result<DatabasePools> {
    let keyring = secrets::load_keyring(settings)?;
    crate::credentials::check_storable(settings, &keyring)?;
    Ok(crate::db::connect_and_migrate(&settings.database)
        .await?
        .with_keyring(keyring))
}

/// 0 when every run succeeded or was partial, 1 when any failed or was interrupted.
pub fn exit_for(outcomes: &[RunOutcome]) -> ExitCode {
    if outcomes
        .iter()
        .any(|o| matches!(o.status, RunStatus::Failed | RunStatus::Interrupted))
    {
        ExitCode::from(EXIT_FAILURE)
    } else {
        ExitCode::SUCCESS
    }
}

/// One line per run: `run 7 alice@acme partial pages=3 fetched=250 inserted=249 ...`.
pub fn summary_line(outcome: &RunOutcome) -> String {
    let c = &outcome.counts;
    let mut line = format!(
        "run {} {}@{} {} pages={} fetched={} inserted={} updated={} unchanged={} duplicate={} failed={} in {:.1}s",
        outcome.run_id,
        outcome.user_id,
        outcome.provider,
        outcome.status,
        c.pages_fetched,
        c.fetched,
        c.inserted,
        c.updated,
        c.unchanged,
        c.duplicate,
        c.failed,
        outcome.elapsed.as_secs_f64()
    );
    if let Some(error) = &outcome.error {
        line.push_str(&format!(": {error}"));
    }
    line
}
