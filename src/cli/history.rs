//! `tributary runs` and `tributary errors`: the run history and a run's error report.

use std::path::Path;
use std::process::ExitCode;

use anyhow::bail;
use clap::Args;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};

use crate::app::{Access, App};
use crate::config::Settings;
use crate::entities::sync_run;
use crate::ops::errors::{ErrorItem, OpenErrorsQuery, RunErrorsQuery, MAX_LIMIT as MAX_OPEN_LIMIT};
use crate::ops::runs::{RunsQuery, MAX_LIMIT as MAX_RUNS_LIMIT};

/// The longest payload or message shown in a table cell; `--json` shows them whole.
const CELL_LIMIT: usize = 80;

#[derive(Debug, Args)]
pub struct RunsArgs {
    /// How many runs to show (1 to 1000), newest first.
    #[arg(long, default_value_t = 20,
        value_parser = clap::value_parser!(u64).range(1..=MAX_RUNS_LIMIT))]
    limit: u64,
    /// Only runs older than this id, the last one a previous page showed.
    #[arg(long, value_name = "RUN_ID")]
    before: Option<i64>,
    /// Only runs of this user's connections.
    #[arg(long)]
    user: Option<String>,
    /// Only runs of this provider.
    #[arg(long)]
    provider: Option<String>,
    /// Only runs of this stream (e.g. `pull_requests`).
    #[arg(long)]
    stream: Option<String>,
    /// Show every column (every counter and the error), not only those that fit in 120
    /// columns.
    #[arg(long)]
    wide: bool,
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
    /// With `--open`: only errors of runs of this stream.
    #[arg(long, requires = "open")]
    stream: Option<String>,
    /// How many errors to show (1 to 10000), oldest first; by default 20 with `--open`,
    /// else 100.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=MAX_OPEN_LIMIT))]
    limit: Option<u64>,
    /// Only errors after this id, the last one a previous page showed.
    #[arg(long, value_name = "ERROR_ID")]
    after: Option<i64>,
    /// Print JSON (with whole payloads) instead of a table.
    #[arg(long)]
    json: bool,
}

/// `tributary runs`.
pub async fn runs(config: &Path, args: RunsArgs) -> anyhow::Result<ExitCode> {
    let settings = Settings::load(config)?;
    let app = App::open(settings, Access::Read).await?;
    let query = RunsQuery {
        provider: args.provider,
        stream: args.stream,
        user_id: args.user,
        status: None,
        before: args.before,
        limit: args.limit,
    };
    let page = crate::ops::runs::list(app.db(), &query).await?;
    let shape = match (args.json, args.wide) {
        (true, _) => RunsShape::Json,
        (false, true) => RunsShape::Wide,
        (false, false) => RunsShape::Compact,
    };
    print_runs(&page.items, shape)?;
    if let (Some(next), false) = (page.next, args.json) {
        println!("More runs: add --before {next} for the next page.");
    }
    Ok(ExitCode::SUCCESS)
}

/// `tributary errors`.
pub async fn errors(config: &Path, args: ErrorsArgs) -> anyhow::Result<ExitCode> {
    let settings = Settings::load(config)?;
    let app = App::open(settings, Access::Read).await?;
    let db = app.db();
    match (args.run_id, args.open) {
        (run_id, true) => {
            let query = OpenErrorsQuery {
                run_id,
                stream: args.stream,
                after: args.after,
                limit: args.limit.unwrap_or(20),
            };
            let page = crate::ops::errors::open(db, &query).await?;
            print_open_errors(&page.items, args.json)?;
            if let (Some(next), false) = (page.next, args.json) {
                println!("More open errors: add --after {next} for the next page.");
            }
        }
        (Some(run_id), false) => {
            let query = RunErrorsQuery {
                run_id,
                after: args.after,
                limit: args.limit.unwrap_or(100),
            };
            let report = crate::ops::errors::of_run(db, &query).await?;
            print_errors(&report, args.json)?;
            if let (Some(next), false) = (report.errors.next, args.json) {
                println!("More errors: add --after {next} for the next page.");
            }
        }
        (None, false) => bail!("give a RUN_ID, or --open"),
    }
    Ok(ExitCode::SUCCESS)
}

/// How `runs` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunsShape {
    /// A table that fits 120 columns for typical values: who, what, when and the main
    /// counts.
    Compact,
    /// A table of every column.
    Wide,
    /// Every field, as JSON.
    Json,
}

/// Prints `runs`.
pub fn print_runs(runs: &[sync_run::Model], shape: RunsShape) -> anyhow::Result<()> {
    let seconds = |run: &sync_run::Model| {
        run.finished_at
            .map(|finished| {
                format!(
                    "{:.1}",
                    (finished - run.started_at).num_milliseconds() as f64 / 1000.0
                )
            })
            .unwrap_or_default()
    };
    if shape == RunsShape::Compact {
        let header = [
            "id",
            "user",
            "provider/stream",
            "trigger",
            "status",
            "started (UTC)",
            "secs",
            "inserted",
            "updated",
            "failed",
        ];
        return print_rows(runs, false, Some("No runs yet."), &header, |run| {
            let stream = match &run.stream {
                Some(stream) => format!("{}/{stream}", run.provider),
                None => run.provider.clone(),
            };
            vec![
                run.id.to_string(),
                run.user_id.clone(),
                stream,
                run.trigger.to_string(),
                run.status.to_string(),
                run.started_at.format("%Y-%m-%d %H:%M").to_string(),
                seconds(run),
                run.records_inserted.to_string(),
                run.records_updated.to_string(),
                run.records_failed.to_string(),
            ]
        });
    }
    let header = [
        "id",
        "provider",
        "stream",
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
        "parents skipped",
        "filtered",
        "ahead",
        "resume at (UTC)",
        "error",
    ];
    let json = shape == RunsShape::Json;
    print_rows(runs, json, Some("No runs yet."), &header, |run| {
        vec![
            run.id.to_string(),
            run.provider.clone(),
            run.stream.clone().unwrap_or_default(),
            run.user_id.clone(),
            run.trigger.to_string(),
            run.status.to_string(),
            run.started_at.format("%Y-%m-%d %H:%M:%S").to_string(),
            seconds(run),
            run.pages_fetched.to_string(),
            run.records_fetched.to_string(),
            run.records_inserted.to_string(),
            run.records_updated.to_string(),
            run.records_unchanged.to_string(),
            run.records_duplicate.to_string(),
            run.records_failed.to_string(),
            run.records_deleted.to_string(),
            run.records_restored.to_string(),
            run.parents_skipped.to_string(),
            run.records_filtered.to_string(),
            run.watermark_anomalies.to_string(),
            run.resume_at
                .map(|at| at.format("%Y-%m-%d %H:%M:%S").to_string())
                .unwrap_or_default(),
            shorten(run.error.as_deref().unwrap_or("")),
        ]
    })
}

/// Prints one run's error report.
fn print_errors(report: &crate::ops::errors::RunErrors, json: bool) -> anyhow::Result<()> {
    let (run, errors) = (&report.run, &report.errors.items);
    if json {
        println!("{}", serde_json::to_string_pretty(errors)?);
        return Ok(());
    }
    let shown = match report.errors.next {
        None => format!("{} error(s)", errors.len()),
        Some(_) => format!("{} error(s) on this page", errors.len()),
    };
    println!(
        "Run {} ({}@{}{}, {}): {shown}.",
        run.id,
        run.user_id,
        run.provider,
        run.stream
            .as_deref()
            .map(|stream| format!(" stream {stream}"))
            .unwrap_or_default(),
        run.status,
    );
    if let Some(error) = &run.error {
        println!("Run-level error: {error}");
    }
    let header = ["id", "external_id", "stage", "message", "payload"];
    print_rows(errors, false, None, &header, |error| {
        vec![
            error.id.to_string(),
            error.external_id.clone().unwrap_or_default(),
            error.stage.to_string(),
            shorten(&error.message),
            shorten(&error.payload),
        ]
    })
}

/// Prints a page of open errors.
fn print_open_errors(errors: &[ErrorItem], json: bool) -> anyhow::Result<()> {
    if json {
        let rows: Vec<_> = errors.iter().map(|item| &item.error).collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    let header = [
        "id",
        "run",
        "provider",
        "stream",
        "user",
        "external_id",
        "stage",
        "scope",
        "message",
        "payload",
    ];
    print_rows(errors, false, Some("No open errors."), &header, |item| {
        let error = &item.error;
        vec![
            error.id.to_string(),
            error.run_id.to_string(),
            error.provider.clone(),
            item.stream.clone().unwrap_or_default(),
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
