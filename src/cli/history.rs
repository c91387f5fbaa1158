//! `tributary runs` and `tributary errors`: the run history and a run's error report.

use std::path::Path;
use std::process::ExitCode;

use anyhow::bail;
use clap::Args;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QueryOrder, QuerySelect};

use crate::config::Settings;
use crate::entities::{run_error, sync_run};

/// The longest payload or message shown in a table cell; `--json` shows them whole.
const CELL_LIMIT: usize = 80;

#[derive(Debug, Args)]
pub struct RunsArgs {
    /// How many runs to show.
    #[arg(long, default_value_t = 20)]
    limit: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct ErrorsArgs {
    /// The run's id (from `tributary runs`).
    #[arg(required_unless_present = "open")]
    run_id: Option<i64>,
    /// Only errors not yet resolved by a replay (across all runs unless RUN_ID is given).
    #[arg(long)]
    open: bool,
    /// Print JSON (with whole payloads) instead of a table.
    #[arg(long)]
    json: bool,
}

/// `tributary runs`.
pub async fn runs(config: &Path, args: RunsArgs) -> anyhow::Result<ExitCode> {
    let settings = Settings::load(config)?;
    let db = crate::db::connect_for_reading(&settings.database).await?;
    print_runs(&db, args.limit, args.json).await?;
    Ok(ExitCode::SUCCESS)
}

/// `tributary errors`.
pub async fn errors(config: &Path, args: ErrorsArgs) -> anyhow::Result<ExitCode> {
    let settings = Settings::load(config)?;
    let db = crate::db::connect_for_reading(&settings.database).await?;
    match (args.run_id, args.open) {
        (run_id, true) => print_open_errors(&db, run_id, args.json).await?,
        (Some(run_id), false) => print_errors(&db, run_id, args.json).await?,
        (None, false) => bail!("give a RUN_ID, or --open"),
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints the newest `limit` runs.
pub async fn print_runs(db: &DatabaseConnection, limit: u64, json: bool) -> anyhow::Result<()> {
    let runs = sync_run::Entity::find()
        .order_by_desc(sync_run::Column::Id)
        .limit(limit)
        .all(db)
        .await?;
    let header = [
        "id",
        "provider",
        "user",
        "trigger",
        "status",
        "started (UTC)",
        "secs",
        "pages",
        "fetched",
        "inserted",
        "updated",
        "unchanged",
        "dup",
        "failed",
        "deleted",
        "restored",
        "ahead",
        "error",
    ];
    print_rows(&runs, json, Some("No runs yet."), &header, |run| {
        let seconds = run
            .finished_at
            .map(|finished| {
                format!(
                    "{:.1}",
                    (finished - run.started_at).num_milliseconds() as f64 / 1000.0
                )
            })
            .unwrap_or_default();
        vec![
            run.id.to_string(),
            run.provider.clone(),
            run.user_id.clone(),
            run.trigger.to_string(),
            run.status.to_string(),
            run.started_at.format("%Y-%m-%d %H:%M:%S").to_string(),
            seconds,
            run.pages_fetched.to_string(),
            run.records_fetched.to_string(),
            run.records_inserted.to_string(),
            run.records_updated.to_string(),
            run.records_unchanged.to_string(),
            run.records_duplicate.to_string(),
            run.records_failed.to_string(),
            run.records_deleted.to_string(),
            run.records_restored.to_string(),
            run.watermark_anomalies.to_string(),
            shorten(run.error.as_deref().unwrap_or("")),
        ]
    })
}

/// Prints one run's error report.
pub async fn print_errors(db: &DatabaseConnection, run_id: i64, json: bool) -> anyhow::Result<()> {
    let Some(run) = sync_run::Entity::find_by_id(run_id).one(db).await? else {
        bail!("there is no run with id {run_id}; `tributary runs` lists them");
    };
    let errors = run_error::Entity::find()
        .filter(run_error::Column::RunId.eq(run_id))
        .order_by_asc(run_error::Column::Id)
        .all(db)
        .await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&errors)?);
        return Ok(());
    }
    println!(
        "Run {} ({}@{}, {}): {} error(s).",
        run.id,
        run.user_id,
        run.provider,
        run.status,
        errors.len()
    );
    if let Some(error) = &run.error {
        println!("Run-level error: {error}");
    }
    let header = ["id", "external_id", "stage", "message", "payload"];
    print_rows(&errors, false, None, &header, |error| {
        vec![
            error.id.to_string(),
            error.external_id.clone().unwrap_or_default(),
            error.stage.to_string(),
            shorten(&error.message),
            shorten(&error.payload),
        ]
    })
}

/// Prints the errors no replay has resolved, across runs or of one run.
pub async fn print_open_errors(
    db: &DatabaseConnection,
    run_id: Option<i64>,
    json: bool,
) -> anyhow::Result<()> {
    let mut query = run_error::Entity::find().filter(run_error::Column::ResolvedByRunId.is_null());
    if let Some(run_id) = run_id {
        query = query.filter(run_error::Column::RunId.eq(run_id));
    }
    let errors = query.order_by_asc(run_error::Column::Id).all(db).await?;
    let header = [
        "id",
        "run",
        "provider",
        "user",
        "external_id",
        "stage",
        "scope",
        "message",
        "payload",
    ];
    print_rows(&errors, json, Some("No open errors."), &header, |error| {
        vec![
            error.id.to_string(),
            error.run_id.to_string(),
            error.provider.clone(),
            error.user_id.clone(),
            error.external_id.clone().unwrap_or_default(),
            error.stage.to_string(),
            error.scope.to_string(),
            shorten(&error.message),
            shorten(&error.payload),
        ]
    })
}

/// Prints `rows` as pretty JSON, or as a table with `header` and one `row` per item (or
/// `empty`, when given and there are none).
pub fn print_rows<T: serde::Serialize>(
    rows: &[T],
    json: bool,
    empty: Option<&str>,
    header: &[&str],
    row: impl Fn(&T) -> Vec<String>,
) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(rows)?);
        return Ok(());
    }
    if rows.is_empty() {
        if let Some(empty) = empty {
            println!("{empty}");
        }
        return Ok(());
    }
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED).set_header(header);
    for item in rows {
        table.add_row(row(item));
    }
    println!("{table}");
    Ok(())
}

/// Cuts text to a table cell, marking the cut.
pub(super) fn shorten(text: &str) -> String {
    if text.chars().count() <= CELL_LIMIT {
        return text.to_string();
    }
    let mut short: String = text.chars().take(CELL_LIMIT - 1).collect();
    short.push('…');
    short
}
