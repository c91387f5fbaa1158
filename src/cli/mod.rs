//! The `tributary` command line: the clap types and the dispatch here, one file per
//! command group (`sync.rs`, `daemon.rs`, `history.rs` for runs and errors, `changes.rs`,
//! `notifications.rs`, `connections.rs`, `secrets.rs`, `replay.rs`, `reconcile.rs`, `setup.rs` for migrate
//! and check-config, `demo/`). `open.rs` opens the database as a command needs it. This
//! is the only module that prints.

mod api_keys;
mod changes;
mod connections;
mod daemon;
mod demo;
mod exit;
mod history;
mod inbox;
mod jobs;
mod notifications;
mod progress;
mod reconcile;
mod replay;
mod secrets;
mod setup;
mod sync;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use tributary_providers::quote::{truncated, MAX_QUOTED_CHARS};

use exit::{EXIT_CONFIG, EXIT_FAILURE, EXIT_SCHEMA};

use crate::config::{ConfigError, Settings};
use crate::telemetry::{self, TraceExport, Traces};

/// tributary: a scheduled multi-provider sync daemon. Fetches your users' records from
/// third-party APIs and stores each once per (user_id, provider, external_id).
#[derive(Debug, Parser)]
#[command(name = "tributary", version = crate::db::RELEASE, about)]
pub(crate) struct Cli {
    /// The config file.
    #[arg(
        long,
        global = true,
        env = "TRIBUTARY_CONFIG",
        default_value = "config.toml"
    )]
    pub(crate) config: PathBuf,
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
    /// Log filter (tracing's EnvFilter syntax, e.g. "info" or "tributary=debug").
    /// Defaults to "warn" (env RUST_LOG).
    #[arg(long, global = true, env = "RUST_LOG")]
    pub(crate) log: Option<String>,
    #[command(subcommand)]
    pub(crate) command: Command,
}

impl Cli {
    /// The process's command line, as `Parser::parse` reads it, except that a value
    /// refused is quoted at most [`MAX_QUOTED_CHARS`] characters long: an argument can be
    /// a whole file's worth of text, and clap echoes it in its error.
    pub(crate) fn parse_args() -> Cli {
        Cli::try_parse().unwrap_or_else(|error| bounded_value(error).exit())
    }
}

/// `error` with the value it quotes cut with `quote::truncated`.
fn bounded_value(mut error: clap::Error) -> clap::Error {
    use clap::error::{ContextKind, ContextValue};
    if let Some(ContextValue::String(value)) = error.get(ContextKind::InvalidValue) {
        let shown = truncated(value, MAX_QUOTED_CHARS);
        error.insert(ContextKind::InvalidValue, ContextValue::String(shown));
    }
    error
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run the scheduler: sync each provider's connections on its cron schedule until
    /// SIGTERM or SIGINT. Meant to run under systemd (see deploy/tributary.service).
    /// Migrates first, refusing (exit 4) while instances of an older schema are alive.
    Daemon(MigrateArgs),
    /// Apply pending database migrations and exit. Refuses (exit 4) while instances of an
    /// older schema are alive: stop them first.
    Migrate(MigrateArgs),
    /// Sync the matching connections once now (one run each) and print a line per run.
    /// Exits 0 when every run succeeded or was partial, 1 when any failed.
    Sync(sync::SyncArgs),
    /// Show the run history, newest first.
    Runs(history::RunsArgs),
    /// Show the change feed: the records inserted, updated, deleted or restored after a
    /// cursor, in commit order, and the cursor to pass next time. Exits 3 when the
    /// cursor is older than the feed's retention (or from another database): resync from
    /// `records`.
    Changes(changes::ChangesArgs),
    /// Show a run's error report (each failed record with its stage, message and payload),
    /// or with `--open` the unresolved errors of every run.
    Errors(history::ErrorsArgs),
    /// Show the webhook deliveries ([notify]), newest first: status, attempts, the last
    /// error and the next attempt.
    Notifications(notifications::NotificationsArgs),
    /// Show the inbound webhook deliveries, newest first: status, attempts, the
    /// connection and job each was routed to, and why a failed one failed.
    Webhooks(inbox::InboxArgs),
    /// Show the sync jobs, newest first: each schedule slot of each connection, the
    /// instance that ran it and how it ended.
    Jobs(jobs::JobsArgs),
    /// Re-ingest a run's failed records from their stored payloads, as a new run with
    /// trigger `replay`. Errors whose record now goes through are marked resolved.
    Replay(replay::ReplayArgs),
    /// Remove duplicate records (by the key user_id, provider, external_id) left from before
    /// the unique index existed, log every removal, then create the index. Run it against a
    /// copy first.
    Reconcile(reconcile::ReconcileArgs),
    /// Manage connections besides config.toml.
    #[command(subcommand)]
    Connections(connections::ConnectionsCommand),
    /// The HTTP API's keys ([api]): create one (shown once), list them, revoke one.
    #[command(subcommand)]
    ApiKeys(api_keys::ApiKeysCommand),
    /// The key that seals stored credentials: generate one, rotate to it, see which
    /// rows use which key.
    #[command(subcommand)]
    Secrets(secrets::SecretsCommand),
    /// Validate the config (providers, cron expressions, URLs, referenced environment
    /// variables) without touching the database.
    CheckConfig,
    /// Start a built-in emulated API on loopback, sync it twice into the configured
    /// database, and show that the second pass inserted nothing.
    Demo(demo::DemoArgs),
}

/// What `migrate` and `daemon` do about instances of an older schema.
#[derive(Debug, clap::Args)]
pub(crate) struct MigrateArgs {
    /// Migrate even while instances of an older schema are alive (announced in
    /// `instances`, or holding leases or running runs). They go on writing under the old
    /// schema; stop them instead unless you know they are gone.
    #[arg(long)]
    pub while_others_run: bool,
}

impl MigrateArgs {
    fn older_instances(&self) -> crate::db::OlderInstances {
        match self.while_others_run {
            true => crate::db::OlderInstances::Allow,
            false => crate::db::OlderInstances::Refuse,
        }
    }
}

/// The `tributary` binary: parses the process's command line, runs the command and
/// returns the process exit code.
pub fn main() -> ExitCode {
    run(Cli::parse_args())
}

/// Runs `work` as a one-shot tool built on the library (the benchmark): text logs on
/// stderr filtered by `filter`, on the same runtime every command runs on, so that what
/// it measures is what `tributary` does.
pub fn run_tool(filter: &str, work: impl std::future::Future<Output = ExitCode>) -> ExitCode {
    match runtime() {
        Ok(runtime) => {
            init_tracing(LogFormat::Text, filter, None);
            runtime.block_on(work)
        }
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

/// Runs a parsed command line and returns the process exit code.
fn run(cli: Cli) -> ExitCode {
    // The daemon's log is its record of work; one-shot commands print their own results.
    let default_filter = match cli.command {
        Command::Daemon(_) => "info",
        _ => "warn",
    };
    // The runtime first: the trace exporter sends on it.
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    let export = match trace_export(&cli) {
        Ok(export) => export.map(|export| (export, runtime.handle().clone())),
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let traces = init_tracing(
        cli.log_format,
        cli.log.as_deref().unwrap_or(default_filter),
        export,
    );
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
    if let Some(traces) = traces {
        traces.shutdown();
    }
    match outcome {
        Ok(code) => code,
        Err(error) => {
            let opening = error.downcast_ref::<crate::app::OpenError>();
            let code = if error.downcast_ref::<crate::config::ConfigError>().is_some()
                || secrets::is_key_error(&error)
                || opening.is_some_and(crate::app::OpenError::is_config)
                || error
                    .downcast_ref::<crate::daemon::DaemonError>()
                    .is_some_and(crate::daemon::DaemonError::is_config)
                || error
                    .downcast_ref::<crate::sync::SyncError>()
                    .is_some_and(crate::sync::SyncError::is_config)
                || error
                    .downcast_ref::<crate::ops::OpsError>()
                    .is_some_and(crate::ops::OpsError::is_config)
            {
                EXIT_CONFIG
            } else if is_schema_refusal(&error)
                || opening.is_some_and(crate::app::OpenError::is_schema)
            {
                EXIT_SCHEMA
            } else {
                EXIT_FAILURE
            };
            eprintln!("error: {error:#}");
            ExitCode::from(code)
        }
    }
}

/// Whether the database was refused for its schema ([`EXIT_SCHEMA`]).
fn is_schema_refusal(error: &anyhow::Error) -> bool {
    error
        .downcast_ref::<crate::db::DbSetupError>()
        .is_some_and(|e| {
            matches!(
                e,
                crate::db::DbSetupError::NewerSchema { .. }
                    | crate::db::DbSetupError::OlderInstancesAlive { .. }
            )
        })
}

/// How long the process waits at exit for token refreshes still in flight.
const REFRESH_DRAIN: std::time::Duration = std::time::Duration::from_secs(60);

/// The size of tokio's blocking pool, where page bodies are parsed and hashed: twice the
/// cores, at least 4. Parsing more pages at once than there are cores gains nothing, and
/// each extra thread keeps freed memory in a malloc arena of its own, which with tokio's
/// default of 512 threads shows in peak RSS at high concurrency.
fn blocking_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    (2 * cores).max(4)
}

/// The runtime every command runs on: multi-threaded, with [`blocking_threads`] for
/// parsing.
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(blocking_threads())
        .build()
}

/// Logs to stderr in `format`, filtered by `filter` (EnvFilter syntax; "warn" if invalid),
/// and exports traces when `export` says where (sent on its runtime). Without an export
/// no trace layer is installed, so spans cost what logging alone makes them cost.
fn init_tracing(
    format: LogFormat,
    filter: &str,
    export: Option<(TraceExport, tokio::runtime::Handle)>,
) -> Option<Traces> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;

    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let colour = use_colour(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let lines = tracing_subscriber::fmt::layer()
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    let lines = match format {
        LogFormat::Text => lines.boxed(),
        LogFormat::Json => lines.json().boxed(),
    };
    let (exported, traces) = match export.map(|(export, runtime)| telemetry::layer(export, runtime))
    {
        Some(Ok((layer, traces))) => (Some(layer), Some(traces)),
        Some(Err(message)) => {
            eprintln!("warning: traces are not exported: {message}");
            (None, None)
        }
        None => (None, None),
    };
    let _ = tracing_subscriber::registry()
        .with(lines.with_filter(filter))
        .with(exported)
        .try_init();
    traces
}

/// The trace export of the commands that sync (`daemon`, `sync`), from `[telemetry]`. A
/// config that does not load exports nothing: the command itself reports why.
fn trace_export(cli: &Cli) -> Result<Option<TraceExport>, ConfigError> {
    if !matches!(cli.command, Command::Daemon(_) | Command::Sync(_)) {
        return Ok(None);
    }
    let Ok(settings) = Settings::load(&cli.config) else {
        return Ok(None);
    };
    let Some(telemetry) = &settings.telemetry else {
        return Ok(None);
    };
    let headers = telemetry
        .resolve_headers()
        .map_err(|(key, message)| ConfigError::Invalid {
            path: settings.path.clone(),
            key,
            message,
        })?;
    Ok(Some(TraceExport {
        traces_url: telemetry.traces_url(),
        headers,
        service_name: telemetry.service_name.clone(),
        sampling_ratio: telemetry.sampling_ratio,
        include_user_id: telemetry.include_user_id,
    }))
}

/// Whether log lines are coloured: only on a terminal, where escape codes are read as
/// colour rather than stored as bytes in a file, and never when `NO_COLOR` is set to
/// anything but the empty string (<https://no-color.org>).
fn use_colour(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|value| value.is_empty())
}

async fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    let config = &cli.config;
    match cli.command {
        Command::CheckConfig => setup::check_config(config),
        Command::Migrate(args) => setup::migrate(config, args.older_instances()).await,
        Command::Daemon(args) => daemon::run(config, args.older_instances()).await,
        Command::Sync(args) => sync::run(config, args).await,
        Command::Runs(args) => history::runs(config, args).await,
        Command::Errors(args) => history::errors(config, args).await,
        Command::Changes(args) => changes::run(config, args).await,
        Command::Notifications(args) => notifications::run(config, args).await,
        Command::Webhooks(args) => inbox::run(config, args).await,
        Command::Jobs(args) => jobs::run(config, args).await,
        Command::Replay(args) => replay::run(config, args).await,
        Command::Reconcile(args) => reconcile::run(config, args).await,
        Command::Connections(command) => connections::command(config, command).await,
        Command::Secrets(command) => secrets::run(config, command).await,
        Command::ApiKeys(command) => api_keys::run(config, command).await,
        Command::Demo(args) => demo::run(config, args).await,
    }
}

#[cfg(test)]
mod tests {
    use super::use_colour;

    #[test]
    fn log_lines_are_coloured_only_on_a_terminal_without_no_color() {
        let set = |value: &str| Some(std::ffi::OsString::from(value));
        for (terminal, no_color, colour) in [
            (true, None, true),
            (true, set(""), true),
            (true, set("1"), false),
            (true, set("false"), false),
            (false, None, false),
            (false, set(""), false),
        ] {
            assert_eq!(
                use_colour(terminal, no_color.as_deref()),
                colour,
                "terminal {terminal}, NO_COLOR {no_color:?}"
            );
        }
    }
}
