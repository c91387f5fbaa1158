//! `tributary connections list | add | enable | disable | remove`: managing connections
//! besides config.toml. Connections listed in config.toml belong to the file (they are
//! upserted on every start), so these commands only change the ones added here.

use std::io::BufRead;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use secrecy::SecretString;

use crate::app::{Access, App};
use crate::config::Settings;
use crate::db::DatabasePools;
use crate::ops::connections::{self as ops, ConnectionView, ConnectionsQuery, NewConnection};
use crate::ops::health::Health;
use crate::ops::OpsError;

#[derive(Debug, Subcommand)]
pub enum ConnectionsCommand {
    /// List the connections with how their credentials are held (never the secrets), by
    /// provider and user.
    List {
        /// Only this provider's.
        #[arg(long)]
        provider: Option<String>,
        /// Only this user's.
        #[arg(long)]
        user: Option<String>,
        /// Only those that sync this stream (of the providers whose config lists it).
        #[arg(long)]
        stream: Option<String>,
        /// Only those of this health, as `connections status` shows it (healthy,
        /// never_synced, degraded, failing): the worst of their streams', or with
        /// `--stream` that stream's.
        #[arg(long)]
        health: Option<String>,
        /// Only connections after this one (the `--after` a previous page printed).
        #[arg(long, value_name = "CONNECTION_ID")]
        after: Option<i64>,
        /// How many connections to show (1 to 1000).
        #[arg(long, default_value_t = 100,
            value_parser = clap::value_parser!(u64).range(1..=ops::MAX_LIMIT))]
        limit: u64,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show where a connection's syncs stand, stream by stream: the run going and its job,
    /// the last run and its outcome, the next slot, the cursor, the health; the jobs
    /// waiting.
    Status {
        #[command(flatten)]
        target: Target,
        /// Print JSON (as `GET /v1/connections/{id}/syncs` answers) instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// Add a connection. Secrets come from an environment variable or from standard input
    /// (one per line: the token, then the refresh token), never from the command line.
    Add {
        #[command(flatten)]
        target: Target,
        /// The environment variable that holds the token.
        #[arg(long, conflicts_with = "token_stdin")]
        token_env: Option<String>,
        /// Read the token from the first line of standard input.
        #[arg(long)]
        token_stdin: bool,
        /// OAuth2: the environment variable that holds the refresh token.
        #[arg(long, conflicts_with = "refresh_token_stdin")]
        refresh_token_env: Option<String>,
        /// OAuth2: read the refresh token from the next line of standard input.
        #[arg(long)]
        refresh_token_stdin: bool,
        /// OAuth2: when the access token expires, in seconds since the Unix epoch.
        #[arg(long)]
        expires_at: Option<i64>,
        /// Add it disabled.
        #[arg(long)]
        disabled: bool,
    },
    /// Enable a connection added with `connections add`.
    Enable {
        #[command(flatten)]
        target: Target,
    },
    /// Disable a connection added with `connections add`: it is no longer synced.
    Disable {
        #[command(flatten)]
        target: Target,
    },
    /// Pause a connection, or with `--stream` one of its streams: its schedules leave it
    /// out until `resume`, as do retries and webhook runs, while a paused stream's
    /// connection syncs its other streams. A `sync` asked for still runs it; full passes
    /// that fall due stay owed until it runs. Works for connections config.toml lists too.
    Pause {
        #[command(flatten)]
        target: Target,
        /// Only this stream of the connection.
        #[arg(long)]
        stream: Option<String>,
    },
    /// Resume a paused connection, or with `--stream` a paused stream: its schedule's next
    /// firing includes it.
    Resume {
        #[command(flatten)]
        target: Target,
        /// Only this stream of the connection.
        #[arg(long)]
        stream: Option<String>,
    },
    /// Give a connection a schedule of its own, replacing its provider's, or put it back
    /// on the provider's. Works for connections config.toml lists too.
    Schedule {
        #[command(flatten)]
        target: Target,
        /// A cron expression with seconds, e.g. "0 */5 * * * *".
        #[arg(
            long,
            conflicts_with = "provider_schedule",
            required_unless_present = "provider_schedule"
        )]
        cron: Option<String>,
        /// Follow the provider's `schedule` again (with `--stream`: the connection's).
        #[arg(long)]
        provider_schedule: bool,
        /// Only this stream of the connection; its other streams keep their schedule.
        #[arg(long)]
        stream: Option<String>,
    },
    /// Remove a connection added with `connections add`. Its records stay unless
    /// `--delete-records` is given; its run history stays.
    Remove {
        #[command(flatten)]
        target: Target,
        /// Also delete the connection's records.
        #[arg(long)]
        delete_records: bool,
    },
}

/// Which connection.
#[derive(Debug, Args)]
pub struct Target {
    /// The provider (a `[providers.NAME]` table of the config).
    #[arg(long)]
    provider: String,
    /// The user id.
    #[arg(long)]
    user: String,
}

impl ConnectionsCommand {
    /// Whether the command may store a secret, and so needs the keys.
    fn stores_credentials(&self) -> bool {
        matches!(self, ConnectionsCommand::Add { .. })
    }
}

/// `tributary connections ...`.
pub async fn command(config: &Path, command: ConnectionsCommand) -> anyhow::Result<ExitCode> {
    let settings = Settings::load(config)?;
    // `list` only reads, so it needs no key; only `add` stores a secret; pausing touches
    // no credentials.
    let access = match &command {
        ConnectionsCommand::List { .. } => Access::Describe,
        ConnectionsCommand::Status { .. } => Access::Read,
        ConnectionsCommand::Pause { .. }
        | ConnectionsCommand::Resume { .. }
        | ConnectionsCommand::Schedule { .. } => Access::Migrated,
        _ => Access::Keys {
            storing: command.stores_credentials(),
        },
    };
    let app = App::open(settings, access).await?;
    run(app.db(), app.settings(), command).await?;
    Ok(ExitCode::SUCCESS)
}

async fn run(
    db: &DatabasePools,
    settings: &Settings,
    command: ConnectionsCommand,
) -> anyhow::Result<()> {
    match command {
        ConnectionsCommand::List {
            provider,
            user,
            stream,
            health,
            after,
            limit,
            json,
        } => {
            let query = ConnectionsQuery {
                provider,
                user_id: user,
                enabled: None,
                stream,
                health: health
                    .as_deref()
                    .map(|text| Health::parse("health", text))
                    .transpose()?,
                after,
                limit,
            };
            let page = ops::list(db, settings, &query).await?;
            print_connections(&page.items, json)?;
            if let (Some(next), false) = (page.next, json) {
                println!("More connections: add --after {next} for the next page.");
            }
            Ok(())
        }
        ConnectionsCommand::Status { target, json } => {
            let status = crate::ops::sync_status::status_of(db, settings, &target.into()).await?;
            print_status(&status, json)
        }
        ConnectionsCommand::Add {
            target,
            token_env,
            token_stdin,
            refresh_token_env,
            refresh_token_stdin,
            expires_at,
            disabled,
        } => {
            let mut lines = std::io::stdin().lock().lines();
            let mut read_secret = |what: &str| -> anyhow::Result<SecretString> {
                let line = lines
                    .next()
                    .with_context(|| format!("expected the {what} on standard input"))?
                    .with_context(|| format!("reading the {what} from standard input"))?;
                let secret = line.trim().to_string();
                if secret.is_empty() {
                    bail!("the {what} read from standard input is empty");
                }
                Ok(SecretString::from(secret))
            };
            let token = token_stdin.then(|| read_secret("token")).transpose()?;
            let refresh_token = refresh_token_stdin
                .then(|| read_secret("refresh token"))
                .transpose()?;
            let new = NewConnection {
                target: target.into(),
                token_env,
                token,
                refresh_token_env,
                refresh_token,
                expires_at,
                enabled: !disabled,
                schedule: None,
                stream_schedules: Vec::new(),
            };
            let added = ops::add(db, settings, new)
                .await
                .map_err(|error| match &error {
                    OpsError::Invalid { field: "token", .. } => {
                        anyhow::anyhow!("{error}: give --token-env VAR or --token-stdin")
                    }
                    _ => anyhow::Error::from(error),
                })?;
            println!(
                "Added connection {} ({}@{}, {}).",
                added.id,
                added.user_id,
                added.provider,
                if added.enabled { "enabled" } else { "disabled" }
            );
            Ok(())
        }
        ConnectionsCommand::Enable { target } => set_enabled(db, settings, target, true).await,
        ConnectionsCommand::Disable { target } => set_enabled(db, settings, target, false).await,
        ConnectionsCommand::Schedule {
            target,
            cron,
            stream: Some(stream),
            ..
        } => {
            let target: ops::Target = target.into();
            ops::set_stream_schedule(db, settings, &target, &stream, cron.as_deref()).await?;
            match cron {
                Some(cron) => {
                    println!("{target} syncs stream {stream} on its own schedule {cron:?}.")
                }
                None => println!("{target} syncs stream {stream} on the connection's schedule."),
            }
            Ok(())
        }
        ConnectionsCommand::Schedule { target, cron, .. } => {
            let target: ops::Target = target.into();
            ops::set_schedule(db, &target, cron.as_deref()).await?;
            match cron {
                Some(cron) => println!("{target} now syncs on its own schedule {cron:?}."),
                None => println!("{target} now syncs on its provider's schedule."),
            }
            Ok(())
        }
        ConnectionsCommand::Pause { target, stream } => {
            set_paused(db, settings, target, stream, true).await
        }
        ConnectionsCommand::Resume { target, stream } => {
            set_paused(db, settings, target, stream, false).await
        }
        ConnectionsCommand::Remove {
            target,
            delete_records,
        } => {
            let target: ops::Target = target.into();
            let removed = ops::remove(db, settings, &target, delete_records).await?;
            if delete_records {
                println!(
                    "Removed {target} and its {} record(s).",
                    removed.records_deleted
                );
            } else {
                println!(
                    "Removed {target}; its records are kept (use --delete-records to delete them)."
                );
            }
            Ok(())
        }
    }
}

async fn set_enabled(
    db: &DatabasePools,
    settings: &Settings,
    target: Target,
    enabled: bool,
) -> anyhow::Result<()> {
    let target: ops::Target = target.into();
    ops::set_enabled(db, settings, &target, enabled).await?;
    println!(
        "{target} is {}.",
        if enabled { "enabled" } else { "disabled" }
    );
    Ok(())
}

async fn set_paused(
    db: &DatabasePools,
    settings: &Settings,
    target: Target,
    stream: Option<String>,
    paused: bool,
) -> anyhow::Result<()> {
    let target: ops::Target = target.into();
    let (changed, what) = match stream {
        Some(stream) => (
            ops::set_stream_paused(db, settings, &target, &stream, paused).await?,
            format!("Stream {stream:?} of {target}"),
        ),
        None => (
            ops::set_paused(db, &target, paused).await?,
            target.to_string(),
        ),
    };
    let state = if paused { "paused" } else { "resumed" };
    match changed {
        true => println!("{what} is {state}."),
        false => println!("{what} was already {state}."),
    }
    Ok(())
}

impl From<Target> for ops::Target {
    fn from(target: Target) -> ops::Target {
        ops::Target {
            provider: target.provider,
            user_id: target.user,
        }
    }
}

/// `connections status`: a line for the connection, a table of its streams, a table of
/// its waiting and running jobs.
fn print_status(status: &crate::ops::sync_status::SyncStatus, json: bool) -> anyhow::Result<()> {
    use super::history::{print_rows, shorten};
    if json {
        println!("{}", serde_json::to_string_pretty(status)?);
        return Ok(());
    }
    let time = |at: Option<chrono::DateTime<chrono::Utc>>| {
        at.map(|at| at.format("%Y-%m-%d %H:%M:%S").to_string())
            .unwrap_or_default()
    };
    let mut state = match (status.enabled, status.paused_at) {
        (false, _) => "disabled".to_string(),
        (true, Some(at)) => format!("paused since {}", time(Some(at))),
        (true, None) => "enabled".to_string(),
    };
    if let Some(at) = status.needs_reconnect_since {
        state.push_str(&format!(
            ", needs a reconnect since {} (the provider refused its authorization)",
            time(Some(at))
        ));
    }
    println!(
        "{}@{} (connection {}): {state}, {}.",
        status.user_id, status.provider, status.connection_id, status.health
    );
    let header = [
        "stream",
        "health",
        "running (run/job)",
        "last run",
        "next slot (UTC)",
        "schedule",
        "cursor",
    ];
    print_rows(&status.streams, false, None, &header, |stream| {
        vec![
            stream.stream.clone().unwrap_or_default(),
            match stream.failures_in_a_row {
                0 => stream.health.to_string(),
                n => format!("{} ({n} failed in a row)", stream.health),
            },
            match (&stream.running, stream.running_job_id) {
                (Some(run), Some(job)) => format!("run {} / job {job}", run.id),
                (Some(run), None) => format!("run {}", run.id),
                (None, _) => String::new(),
            },
            stream
                .last_run
                .as_ref()
                .map(|run| {
                    let ended = time(run.finished_at);
                    match &run.error {
                        Some(error) => {
                            shorten(&format!("{} {} {ended}: {error}", run.id, run.status))
                        }
                        None => format!("{} {} {ended}", run.id, run.status),
                    }
                })
                .unwrap_or_default(),
            match stream.paused_at {
                Some(at) => format!("paused since {}", time(Some(at))),
                None => time(stream.next_slot),
            },
            stream
                .schedule
                .as_ref()
                .map(|schedule| format!("{schedule} ({})", stream.schedule_from))
                .unwrap_or_default(),
            shorten(stream.cursor.as_deref().unwrap_or("")),
        ]
    })?;
    let header = ["job", "kind", "stream", "status", "due (UTC)"];
    print_rows(
        &status.jobs,
        false,
        Some("No jobs waiting or running."),
        &header,
        |job| {
            vec![
                job.id.to_string(),
                job.kind.to_string(),
                job.stream.clone(),
                match job.cancel_requested_at {
                    Some(_) => format!("{} (cancel asked)", job.status),
                    None => job.status.to_string(),
                },
                time(job.not_before),
            ]
        },
    )?;
    if let Some(before) = status.jobs_next {
        println!(
            "More jobs: tributary jobs --connection {} --status active --before {before}",
            status.connection_id
        );
    }
    Ok(())
}

fn print_connections(views: &[ConnectionView], json: bool) -> anyhow::Result<()> {
    let header = [
        "id",
        "provider",
        "stream",
        "user",
        "enabled",
        "paused",
        "needs reconnect",
        "defined in",
        "credentials",
        "cursor",
        "unfinished",
        "last success (UTC)",
    ];
    super::history::print_rows(views, json, Some("No connections."), &header, |view| {
        vec![
            view.id.to_string(),
            view.provider.clone(),
            view.stream.clone().unwrap_or_default(),
            view.user_id.clone(),
            view.enabled.to_string(),
            match (view.paused_at, view.stream_paused_at) {
                (Some(_), _) => "yes",
                (None, Some(_)) => "stream",
                (None, None) => "",
            }
            .to_string(),
            if view.needs_reconnect_since.is_some() {
                "yes"
            } else {
                ""
            }
            .to_string(),
            view.defined_in.to_string(),
            view.credentials.clone(),
            view.cursor.clone().unwrap_or_default(),
            if view.unfinished_run { "yes" } else { "" }.to_string(),
            view.last_success_at
                .map(|at| at.format("%Y-%m-%d %H:%M:%S").to_string())
                .unwrap_or_default(),
        ]
    })
}
