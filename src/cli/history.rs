//! `tributary runs` and `tributary errors`: the run history and a run's error report.

use std::path::Path;
use std::process::ExitCode;

use std::io::Write;

use anyhow::bail;
use clap::Args;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use futures::TryStreamExt;
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
    /// With `--open`: how many errors to show (1 to 10000), oldest first.
    #[arg(long, requires = "open", default_value_t = 20,
        value_parser = clap::value_parser!(u64).range(1..=MAX_OPEN_LIMIT))]
    limit: u64,
    /// With `--open`: only errors after this id, the last one a previous page showed.
    #[arg(long, requires = "open", value_name = "ERROR_ID")]
    after: Option<i64>,
    /// Print JSON (with whole payloads) instead of a table.
    #[arg(long)]
    json: bool,
}

/// The most open errors one `errors --open` shows: a table holds its rows until printed.
const MAX_OPEN_LIMIT: u64 = 10_000;

/// `tributary runs`.
pub async fn runs(config: &Path, args: RunsArgs) -> anyhow::Result<ExitCode> {
    let settings = Settings::load(config)?;
    let db = crate::db::connect_for_reading(&settings.database).await?;
    let filter = RunFilter {
        provider: args.provider,
        stream: args.stream,
    };
    let shape = match (args.json, args.wide) {
        (true, _) => RunsShape::Json,
        (false, true) => RunsShape::Wide,
        (false, false) => RunsShape::Compact,
    };
    print_runs(&db, &filter, args.limit, shape).await?;
    Ok(ExitCode::SUCCESS)
}

/// `tributary errors`.
pub async fn errors(config: &Path, args: ErrorsArgs) -> anyhow::Result<ExitCode> {
    let settings = Settings::load(config)?;
    let db = crate::db::connect_for_reading(&settings.database).await?;
    match (args.run_id, args.open) {
        (run_id, true) => {
            let page = OpenErrorsPage {
                run_id,
                stream: args.stream.as_deref(),
                after: args.after,
                limit: args.limit,
            };
            print_open_errors(&db, &page, args.json).await?
        }
        (Some(run_id), false) => print_errors(&db, run_id, args.json).await?,
        (None, false) => bail!("give a RUN_ID, or --open"),
    }
    Ok(ExitCode::SUCCESS)
}

/// Which runs `runs` shows. `None` matches all.
#[derive(Debug, Default)]
pub struct RunFilter {
    pub provider: Option<String>,
    pub stream: Option<String>,
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

/// Prints the newest `limit` runs that match `filter`.
pub async fn print_runs(
    db: &DatabaseConnection,
    filter: &RunFilter,
    limit: u64,
    shape: RunsShape,
) -> anyhow::Result<()> {
    let mut query = sync_run::Entity::find();
    if let Some(provider) = &filter.provider {
        query = query.filter(sync_run::Column::Provider.eq(provider.as_str()));
    }
    if let Some(stream) = &filter.stream {
        query = query.filter(sync_run::Column::Stream.eq(stream.as_str()));
    }
    let runs = query
        .order_by_desc(sync_run::Column::Id)
        .limit(limit)
        .all(db)
        .await?;
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
        return print_rows(&runs, false, Some("No runs yet."), &header, |run| {
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
        "error",
    ];
    let json = shape == RunsShape::Json;
    print_rows(&runs, json, Some("No runs yet."), &header, |run| {
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
        "Run {} ({}@{}{}, {}): {} error(s).",
        run.id,
        run.user_id,
        run.provider,
        run.stream
            .as_deref()
            .map(|stream| format!(" stream {stream}"))
            .unwrap_or_default(),
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

/// Which open errors `errors --open` shows: after `after` (by id), at most `limit`, of
/// one run or of every run, perhaps only those of runs of `stream`.
pub struct OpenErrorsPage<'a> {
    pub run_id: Option<i64>,
    pub stream: Option<&'a str>,
    pub after: Option<i64>,
    pub limit: u64,
}

/// Prints one page of the errors no replay has resolved, oldest first, read as a stream:
/// JSON is written as the rows arrive, a table holds only its page. A table ends with the
/// `--after` that shows the next page when there is one.
pub async fn print_open_errors(
    db: &DatabaseConnection,
    page: &OpenErrorsPage<'_>,
    json: bool,
) -> anyhow::Result<()> {
    let mut query = run_error::Entity::find().filter(run_error::Column::ResolvedByRunId.is_null());
    if let Some(run_id) = page.run_id {
        query = query.filter(run_error::Column::RunId.eq(run_id));
    }
    if let Some(after) = page.after {
        query = query.filter(run_error::Column::Id.gt(after));
    }
    if let Some(stream) = page.stream {
        let runs = sea_orm::sea_query::Query::select()
            .column(sync_run::Column::Id)
            .from(sync_run::Entity)
            .and_where(sync_run::Column::Stream.eq(stream))
            .to_owned();
        query = query.filter(run_error::Column::RunId.in_subquery(runs));
    }
    // One row past the page says whether there is a next one.
    let mut rows = query
        .order_by_asc(run_error::Column::Id)
        .limit(page.limit.saturating_add(1))
        .stream(db)
        .await?;
    let mut shown: u64 = 0;
    let mut more = false;
    let mut out = std::io::BufWriter::new(std::io::stdout());
    let mut errors = Vec::new();
    while let Some(error) = rows.try_next().await? {
        if shown == page.limit {
            more = true;
            break;
        }
        shown = shown.saturating_add(1);
        if json {
            // The same pretty array `serde_json` writes, one element at a time.
            let element = serde_json::to_string_pretty(&error)?;
            let separator = if shown == 1 { "[\n" } else { ",\n" };
            write!(out, "{separator}  {}", element.replace('\n', "\n  "))?;
        } else {
            errors.push(error);
        }
    }
    drop(rows);
    if json {
        writeln!(out, "{}", if shown == 0 { "[]" } else { "\n]" })?;
        out.flush()?;
        return Ok(());
    }
    let mut run_ids: Vec<i64> = errors.iter().map(|error| error.run_id).collect();
    run_ids.sort_unstable();
    run_ids.dedup();
    let streams: std::collections::HashMap<i64, String> = sync_run::Entity::find()
        .select_only()
        .columns([sync_run::Column::Id, sync_run::Column::Stream])
        .filter(sync_run::Column::Id.is_in(run_ids))
        .into_tuple::<(i64, Option<String>)>()
        .all(db)
        .await?
        .into_iter()
        .map(|(id, stream)| (id, stream.unwrap_or_default()))
        .collect();
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
    print_rows(&errors, false, Some("No open errors."), &header, |error| {
        vec![
            error.id.to_string(),
            error.run_id.to_string(),
            error.provider.clone(),
            streams.get(&error.run_id).cloned().unwrap_or_default(),
            error.user_id.clone(),
            error.external_id.clone().unwrap_or_default(),
            error.stage.to_string(),
            error.scope.to_string(),
            shorten(&error.message),
            shorten(&error.payload),
        ]
    })?;
    if let (true, Some(last)) = (more, errors.last()) {
        println!(
            "More open errors: add --after {} for the next page.",
            last.id
        );
    }
    Ok(())
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
