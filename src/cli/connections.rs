//! `tributary connections list | add | enable | disable | remove`: managing connections
//! besides config.toml. Connections listed in config.toml belong to the file (they are
//! upserted on every start), so these commands only change the ones added here.

use std::collections::HashMap;
use std::io::BufRead;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{bail, Context};
use chrono::Utc;
use clap::{Args, Subcommand};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QueryOrder, Set,
};
use serde::Serialize;

use crate::app::{Access, App};
use crate::config::Settings;
use crate::credentials::StoredCredentials;
use crate::db::DatabasePools;
use crate::entities::{connection, connection_stream};

#[derive(Debug, Subcommand)]
pub enum ConnectionsCommand {
    /// List every connection with how its credentials are held (never the secrets).
    List {
        /// Print JSON instead of a table.
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

/// One line of `connections list`: one stream of one connection.
#[derive(Debug, Serialize)]
struct ConnectionView {
    id: i64,
    provider: String,
    /// The stream (`None` for a connection whose provider config.toml no longer has and
    /// that never ran a stream).
    stream: Option<String>,
    user_id: String,
    enabled: bool,
    /// `config` when config.toml lists it, `removed` when it listed it and no longer does
    /// (disabled, credentials dropped), else `cli`.
    defined_in: connection::DefinedIn,
    credentials: String,
    cursor: Option<String>,
    unfinished_run: bool,
    last_success_run_id: Option<i64>,
    last_success_at: Option<chrono::DateTime<Utc>>,
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
    // Only `add` stores a secret; the others read with whatever keys are configured.
    let storing = command.stores_credentials();
    let app = App::open(settings, Access::Keys { storing }).await?;
    run(app.db(), app.settings(), command).await?;
    Ok(ExitCode::SUCCESS)
}

async fn run(
    db: &DatabasePools,
    settings: &Settings,
    command: ConnectionsCommand,
) -> anyhow::Result<()> {
    match command {
        ConnectionsCommand::List { json } => list(db, settings, json).await,
        ConnectionsCommand::Add {
            target,
            token_env,
            token_stdin,
            refresh_token_env,
            refresh_token_stdin,
            expires_at,
            disabled,
        } => {
            let provider = check_target(settings, &target)?;
            if find(db, &target).await?.is_some() {
                bail!(
                    "{}@{} already exists; remove it first or use enable/disable",
                    target.user,
                    target.provider
                );
            }
            for var in token_env.iter().chain(refresh_token_env.iter()) {
                if std::env::var_os(var).is_none() {
                    bail!("environment variable {var} is not set");
                }
            }
            let mut lines = std::io::stdin().lock().lines();
            let mut read_secret = |what: &str| -> anyhow::Result<String> {
                let line = lines
                    .next()
                    .with_context(|| format!("expected the {what} on standard input"))?
                    .with_context(|| format!("reading the {what} from standard input"))?;
                let secret = line.trim().to_string();
                if secret.is_empty() {
                    bail!("the {what} read from standard input is empty");
                }
                Ok(secret)
            };
            let token = token_stdin.then(|| read_secret("token")).transpose()?;
            let refresh_token = refresh_token_stdin
                .then(|| read_secret("refresh token"))
                .transpose()?;
            if provider.adapter.needs_token() && token_env.is_none() && token.is_none() {
                bail!(
                    "provider {} needs a token: give --token-env VAR or --token-stdin",
                    target.provider
                );
            }
            let stored = StoredCredentials {
                token_env,
                token,
                refresh_token_env,
                refresh_token,
                expires_at,
                oauth: None,
            };
            let binding = crate::secrets::Binding {
                user_id: &target.user,
                provider: &target.provider,
            };
            let column = stored.to_column_for(db.secrets(), binding)?;
            let row = connection::ActiveModel::new_connection(
                &target.user,
                &target.provider,
                !disabled,
                column,
            )
            .insert(db)
            .await?;
            println!(
                "Added connection {} ({}@{}, {}).",
                row.id,
                row.user_id,
                row.provider,
                if row.enabled { "enabled" } else { "disabled" }
            );
            Ok(())
        }
        ConnectionsCommand::Enable { target } => set_enabled(db, settings, &target, true).await,
        ConnectionsCommand::Disable { target } => set_enabled(db, settings, &target, false).await,
        ConnectionsCommand::Remove {
            target,
            delete_records,
        } => {
            refuse_config_defined(settings, &target)?;
            let row = find(db, &target).await?.with_context(|| {
                format!("there is no connection {}@{}", target.user, target.provider)
            })?;
            let removed = crate::pipeline::records::remove_connection(
                db.main(),
                row.id,
                &row.user_id,
                &row.provider,
                delete_records,
            )
            .await?;
            let Some(deleted) = removed else {
                anyhow::bail!("there is no connection {}@{}", target.user, target.provider);
            };
            if delete_records {
                println!(
                    "Removed {}@{} and its {deleted} record(s).",
                    target.user, target.provider
                );
            } else {
                println!(
                    "Removed {}@{}; its records are kept (use --delete-records to delete them).",
                    target.user, target.provider
                );
            }
            Ok(())
        }
    }
}

async fn list(db: &DatabasePools, settings: &Settings, json: bool) -> anyhow::Result<()> {
    let rows = connection::Entity::find()
        .order_by_asc(connection::Column::Provider)
        .order_by_asc(connection::Column::UserId)
        .all(db)
        .await?;
    let ids = rows.iter().map(|row| row.id).collect();
    let mut states: HashMap<i64, Vec<connection_stream::Model>> = HashMap::new();
    for state in crate::pipeline::streams::states_of(db.main(), ids).await? {
        states.entry(state.connection_id).or_default().push(state);
    }
    let mut views: Vec<ConnectionView> = Vec::new();
    for row in rows {
        let credentials =
            StoredCredentials::describe_column(db.secrets(), row.binding(), &row.credentials);
        let defined_in = defined_in(settings, &row);
        let own = states.remove(&row.id).unwrap_or_default();
        for stream in stream_states(settings, &row, own) {
            views.push(ConnectionView {
                id: row.id,
                provider: row.provider.clone(),
                stream: stream.name,
                user_id: row.user_id.clone(),
                enabled: row.enabled,
                defined_in,
                credentials: credentials.clone(),
                cursor: stream.cursor,
                unfinished_run: stream.checkpoint.is_some(),
                last_success_run_id: stream.last_success_run_id,
                last_success_at: stream.last_success_at,
            });
        }
    }
    let header = [
        "id",
        "provider",
        "stream",
        "user",
        "enabled",
        "defined in",
        "credentials",
        "cursor",
        "unfinished",
        "last success (UTC)",
    ];
    super::history::print_rows(&views, json, Some("No connections."), &header, |view| {
        vec![
            view.id.to_string(),
            view.provider.clone(),
            view.stream.clone().unwrap_or_default(),
            view.user_id.clone(),
            view.enabled.to_string(),
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

/// One stream's state as `connections list` shows it.
struct StreamState {
    name: Option<String>,
    cursor: Option<String>,
    checkpoint: Option<String>,
    last_success_run_id: Option<i64>,
    last_success_at: Option<chrono::DateTime<Utc>>,
}

/// The streams of connection `row` to show, given its stream states `own`: the configured
/// ones in their order, then any other stream that has state. A stream that never ran shows
/// nothing, except the primary stream, which shows the state the connection kept from
/// before streams until its first run takes it over.
fn stream_states(
    settings: &Settings,
    row: &connection::Model,
    own: Vec<connection_stream::Model>,
) -> Vec<StreamState> {
    let provider = settings.providers.get(&row.provider);
    let primary = provider.map(|provider| provider.primary_stream().name);
    let mut names: Vec<String> = provider
        .map(|provider| provider.streams.iter().map(|s| s.name.clone()).collect())
        .unwrap_or_default();
    for state in &own {
        if !names.contains(&state.stream) {
            names.push(state.stream.clone());
        }
    }
    let legacy = || StreamState {
        name: None,
        cursor: row.cursor.clone(),
        checkpoint: row.checkpoint.clone(),
        last_success_run_id: row.last_success_run_id,
        last_success_at: row.last_success_at,
    };
    if names.is_empty() {
        return vec![legacy()];
    }
    names
        .into_iter()
        .map(|name| match own.iter().find(|state| state.stream == name) {
            Some(state) => StreamState {
                name: Some(name),
                cursor: state.cursor.clone(),
                checkpoint: state.checkpoint.clone(),
                last_success_run_id: state.last_success_run_id,
                last_success_at: state.last_success_at,
            },
            None if primary.as_ref() == Some(&name) => StreamState {
                name: Some(name),
                ..legacy()
            },
            None => StreamState {
                name: Some(name),
                cursor: None,
                checkpoint: None,
                last_success_run_id: None,
                last_success_at: None,
            },
        })
        .collect()
}

async fn set_enabled(
    db: &DatabaseConnection,
    settings: &Settings,
    target: &Target,
    enabled: bool,
) -> anyhow::Result<()> {
    refuse_config_defined(settings, target)?;
    let row = find(db, target)
        .await?
        .with_context(|| format!("there is no connection {}@{}", target.user, target.provider))?;
    let mut active: connection::ActiveModel = row.into();
    active.enabled = Set(enabled);
    active.updated_at = Set(Utc::now());
    active.update(db).await?;
    println!(
        "{}@{} is {}.",
        target.user,
        target.provider,
        if enabled { "enabled" } else { "disabled" }
    );
    Ok(())
}

async fn find(
    db: &DatabaseConnection,
    target: &Target,
) -> anyhow::Result<Option<connection::Model>> {
    Ok(connection::Entity::find()
        .filter(connection::Column::Provider.eq(target.provider.as_str()))
        .filter(connection::Column::UserId.eq(target.user.as_str()))
        .one(db)
        .await?)
}

/// The provider's settings, when the target names a configured provider and a valid user.
fn check_target<'a>(
    settings: &'a Settings,
    target: &Target,
) -> anyhow::Result<&'a crate::config::ProviderSettings> {
    let provider = settings.providers.get(&target.provider).with_context(|| {
        format!(
            "no provider named {:?} in {}",
            target.provider,
            settings.path.display()
        )
    })?;
    if target.user.trim().is_empty() || target.user.len() > 255 {
        bail!("--user must be a non-empty user id of at most 255 bytes");
    }
    refuse_config_defined(settings, target)?;
    Ok(provider)
}

fn defined_in(settings: &Settings, row: &connection::Model) -> connection::DefinedIn {
    use connection::DefinedIn;
    if settings.lists_connection(&row.provider, &row.user_id) {
        DefinedIn::Config
    } else if row.defined_in != DefinedIn::Cli {
        // Retired by the next command that syncs, if it has not been already.
        DefinedIn::Removed
    } else {
        DefinedIn::Cli
    }
}

fn refuse_config_defined(settings: &Settings, target: &Target) -> anyhow::Result<()> {
    if settings.lists_connection(&target.provider, &target.user) {
        bail!(
            "{}@{} is defined in {} (providers.{}.connections); change it there",
            target.user,
            target.provider,
            settings.path.display(),
            target.provider
        );
    }
    Ok(())
}
