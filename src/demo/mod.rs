//! `tributary demo`: sync a built-in emulated API twice and show the promises hold.

mod emulator;

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder};
use serde::Deserialize;

use crate::config::{redact_url, DatabaseSettings, Settings, DATABASE_URL_ENV};
use crate::entities::run_error;
use crate::pipeline::{NoProgress, ProgressSink, RunOptions, RunOutcome};
use crate::sync::{sync_matching, SyncFilter};

/// The database used when there is no config file to name one.
const DEFAULT_DATABASE_URL: &str = "sqlite://tributary.db?mode=rwc";
/// The provider name the demo's records are stored under.
const DEMO_PROVIDER: &str = "demo";

/// Only the `[database]` table: the demo ignores the config's providers.
#[derive(Deserialize)]
struct DatabaseOnly {
    database: DatabaseSettings,
}

/// Runs the demo against the database of `config_path` (or the default SQLite file).
pub async fn run(config_path: &Path, show_progress: bool) -> anyhow::Result<ExitCode> {
    let database_url = demo_database_url(config_path)?;
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

    let settings = Settings::parse(
        Path::new("(demo config)"),
        &demo_config(&database_url, &address.to_string()),
        None,
        &|_| true,
    )?;
    let db = crate::db::connect_and_migrate(&settings.database).await?;
    crate::db::require_key_index(&db).await?;
    crate::db::upsert_configured_connections(&db, &settings).await?;

    let bars = crate::cli::progress::BarProgress::new();
    let sink: &dyn ProgressSink = if show_progress { &bars } else { &NoProgress };
    let filter = SyncFilter {
        provider: Some(DEMO_PROVIDER.to_string()),
        user_id: None,
    };
    let mut passes: Vec<Vec<RunOutcome>> = Vec::new();
    for pass in 1..=2 {
        let mut outcomes = sync_matching(&db, &settings, &filter, &RunOptions::manual(), sink)
            .await?
            .outcomes;
        bars.clear();
        outcomes.sort_by(|a, b| a.user_id.cmp(&b.user_id));
        println!("\nPass {pass}:");
        for outcome in &outcomes {
            println!("  {}", crate::cli::summary_line(outcome));
        }
        passes.push(outcomes);
    }

    let inserted_by_pass_2: u64 = passes[1].iter().map(|o| o.counts.inserted).sum();
    let first_pass_runs: Vec<i64> = passes[0].iter().map(|o| o.run_id).collect();
    let validate_errors = run_error::Entity::find()
        .filter(run_error::Column::RunId.is_in(first_pass_runs))
        .filter(run_error::Column::Stage.eq("validate"))
        .order_by_asc(run_error::Column::Id)
        .all(&db)
        .await?;

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
    println!("\nLook around: `tributary runs` and `tributary errors RUN_ID`.");

    let healthy = inserted_by_pass_2 == 0
        && validate_errors.len() == 1
        && passes.iter().flatten().all(|o| o.error.is_none());
    Ok(if healthy {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The database the demo writes to: `TRIBUTARY_DATABASE_URL`, else the config file's
/// `database.url`, else the default SQLite file when there is no config file.
fn demo_database_url(config_path: &Path) -> anyhow::Result<String> {
    if let Ok(url) = std::env::var(DATABASE_URL_ENV) {
        if !url.trim().is_empty() {
            return Ok(url);
        }
    }
    match std::fs::read_to_string(config_path) {
        Ok(text) => {
            let parsed: DatabaseOnly = toml::from_str(&text)
                .with_context(|| format!("reading [database] from {}", config_path.display()))?;
            Ok(parsed.database.url)
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            Ok(DEFAULT_DATABASE_URL.to_string())
        }
        Err(error) => Err(error).with_context(|| format!("reading {}", config_path.display())),
    }
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
            "\n[[providers.{DEMO_PROVIDER}.connections]]\nuser_id = \"{user}\"\ntoken = \"demo-token-{user}\"\n"
        ));
    }
    text
}
