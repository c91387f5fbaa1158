//! `tributary demo`: sync a built-in emulated API twice and show the promises hold.

mod emulator;

use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use serde::Deserialize;

use crate::config::{redact_url, DatabaseSettings, SecretsSettings, Settings, DATABASE_URL_ENV};
use crate::db::DatabasePools;
use crate::entities::run_error;
use crate::pipeline::{NoProgress, ProgressSink, RunOptions, RunOutcome};
use crate::secrets::Keyring;
use crate::sync::{sync_matching, SyncFilter};

/// The database used when there is no config file to name one.
const DEFAULT_DATABASE_URL: &str = "sqlite://tributary.db?mode=rwc";
/// The provider name the demo's records are stored under.
const DEMO_PROVIDER: &str = "demo";

/// Only the `[database]` and `[secrets]` tables: the demo ignores the config's providers.
#[derive(Deserialize)]
struct DatabaseOnly {
    database: DatabaseSettings,
    #[serde(default)]
    secrets: SecretsSettings,
}

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// No progress display.
    #[arg(long, short)]
    quiet: bool,
}

/// Runs the demo against the database of `config_path` (or the default SQLite file).
pub async fn run(config_path: &Path, args: DemoArgs) -> anyhow::Result<ExitCode> {
    let show_progress = !args.quiet && std::io::stderr().is_terminal();
    let (database_url, secrets) = demo_database(config_path)?;
    let keyring = demo_keyring(&secrets)?;
    let address = emulator::start()
        .await
        .context("starting the emulated API on 127.0.0.1")?;
    println!(
        "Emulated API on http://{address}: {} users x {} records, {} per page; one 429, one 503 and one record without an id.",
        emulator::USERS.len(),
        emulator::RECORDS_PER_USER,
        emulator::PAGE_SIZE
    );
    println!("Database: {}", redact_url(&database_url));
    if let Some((id, source)) = keyring.current() {
        println!("Tokens are sealed with key {id} ({source}).");
    }

    let settings = Settings::parse(
        Path::new("(demo config)"),
        &demo_config(&database_url, &address.to_string()),
        None,
        &|_| true,
    )?;
    // Not `Access::Work`, whose steps this repeats in part by hand: work would refuse the
    // connections an earlier demo sealed with its own throwaway key (they are dropped
    // first, below), and it would retire every connection of the operator's database that
    // the demo's settings, which list only the demo's provider, do not name.
    let access = crate::app::Access::Keys { storing: true };
    let app = crate::app::App::open_with_keyring(settings, access, keyring).await?;
    let (db, settings) = (app.db().clone(), app.settings());
    crate::db::require_key_index(&db).await?;
    forget_demo_credentials(&db).await?;
    crate::connections::upsert_configured(&db, settings).await?;

    let bars = super::progress::BarProgress::new();
    let sink: &dyn ProgressSink = if show_progress { &bars } else { &NoProgress };
    let filter = SyncFilter {
        provider: Some(DEMO_PROVIDER.to_string()),
        user_id: None,
        stream: None,
    };
    let mut passes: Vec<Vec<RunOutcome>> = Vec::new();
    for pass in 1..=2 {
        let mut outcomes = sync_matching(&db, settings, &filter, &RunOptions::manual(), sink)
            .await?
            .outcomes;
        bars.clear();
        outcomes.sort_by(|a, b| a.user_id.cmp(&b.user_id));
        println!("\nPass {pass}:");
        for outcome in &outcomes {
            println!("  {}", super::sync::summary_line(outcome));
        }
        passes.push(outcomes);
    }

    let inserted_by_pass_2: u64 = passes[1].iter().map(|o| o.counts.inserted).sum();
    let first_pass_runs: Vec<i64> = passes[0].iter().map(|o| o.run_id).collect();
    let mut validate_errors = Vec::new();
    for run_id in first_pass_runs {
        let query = crate::ops::errors::RunErrorsQuery {
            run_id,
            after: None,
            limit: crate::ops::errors::MAX_LIMIT,
        };
        let report = crate::ops::errors::of_run(&db, &query).await?;
        validate_errors.extend(
            report
                .errors
                .items
                .into_iter()
                .filter(|error| error.stage == run_error::Stage::Validate),
        );
    }
    validate_errors.sort_by_key(|error| error.id);

    println!();
    if inserted_by_pass_2 == 0 {
        println!("Pass 2 inserted 0 records: the key (user_id, provider, external_id) held.");
    } else {
        println!("Pass 2 inserted {inserted_by_pass_2} records: that is a bug, please report it.");
    }
    for error in &validate_errors {
        println!(
            "The malformed record sits in run_errors (run {}, user {}, stage {}): {}\n  payload: {}",
            error.run_id, error.user_id, error.stage, error.message, error.payload
        );
    }
    let sealed = show_stored_credentials(&db).await?;
    println!("\nLook around: `tributary runs` and `tributary errors RUN_ID`.");

    let healthy = sealed
        && inserted_by_pass_2 == 0
        && validate_errors.len() == 1
        && passes.iter().flatten().all(|o| o.error.is_none());
    Ok(if healthy {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The database the demo writes to (`TRIBUTARY_DATABASE_URL`, else the config file's
/// `database.url`, else the default SQLite file when there is no config file) and the
/// config's `[secrets]`.
fn demo_database(config_path: &Path) -> anyhow::Result<(String, SecretsSettings)> {
    let (url, secrets) = match std::fs::read_to_string(config_path) {
        Ok(text) => {
            let parsed: DatabaseOnly = toml::from_str(&text).with_context(|| {
                format!(
                    "reading [database] and [secrets] from {}",
                    config_path.display()
                )
            })?;
            (parsed.database.url, parsed.secrets)
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            (DEFAULT_DATABASE_URL.to_string(), SecretsSettings::default())
        }
        Err(error) => {
            return Err(error).with_context(|| format!("reading {}", config_path.display()))
        }
    };
    match std::env::var(DATABASE_URL_ENV) {
        Ok(override_url) if !override_url.trim().is_empty() => Ok((override_url, secrets)),
        _ => Ok((url, secrets)),
    }
}

/// The configured keys, or a key made for this run alone when none is configured: the
/// demo's tokens are stored sealed either way, and only the demo ever reads them.
fn demo_keyring(secrets: &SecretsSettings) -> anyhow::Result<Keyring> {
    let configured = Keyring::load(secrets, &|name| std::env::var(name).ok())?;
    Ok(match configured.current() {
        Some(_) => configured,
        None => Keyring::ephemeral(),
    })
}

/// Drops what an earlier demo stored for its own connections, which may be sealed with
/// that demo's ephemeral key; they are stored again, sealed with this run's key.
async fn forget_demo_credentials(db: &DatabasePools) -> anyhow::Result<()> {
    crate::connections::forget_credentials(db, DEMO_PROVIDER).await?;
    Ok(())
}

/// Prints the start of each demo connection's stored credentials; `true` when none of
/// them holds its token in clear.
async fn show_stored_credentials(db: &DatabasePools) -> anyhow::Result<bool> {
    let rows = crate::connections::stored_columns(db, DEMO_PROVIDER).await?;
    println!("\nStored credentials (connections.credentials), no token in clear:");
    let mut sealed = true;
    for (user_id, credentials) in &rows {
        let start: String = credentials.chars().take(48).collect();
        println!("  {user_id}: {start}...");
        sealed &= !credentials.contains(&demo_token(user_id));
    }
    Ok(sealed)
}

fn demo_token(user: &str) -> String {
    format!("demo-token-{user}")
}

/// The demo's config: one `rest` provider on the emulator, one connection per user.
fn demo_config(database_url: &str, address: &str) -> String {
    let mut text = format!(
        r#"[database]
url = {database_url}

[providers.{DEMO_PROVIDER}]
kind = "rest"
base_url = "http://{address}"
path = "/v1/items"
schedule = "0 */15 * * * *"
records_path = "data"
id_field = "id"
auth = "bearer"

[providers.{DEMO_PROVIDER}.http]
retry_initial_delay = "200ms"

[providers.{DEMO_PROVIDER}.pagination]
type = "cursor"
cursor_path = "next_cursor"
cursor_param = "cursor"
page_size_param = "limit"
page_size = {page_size}
"#,
        page_size = emulator::PAGE_SIZE,
        database_url = toml::Value::String(database_url.to_string()),
    );
    for user in emulator::USERS {
        text.push_str(&format!(
            "\n[[providers.{DEMO_PROVIDER}.connections]]\nuser_id = \"{user}\"\ntoken = \"{}\"\n",
            demo_token(user)
        ));
    }
    text
}
