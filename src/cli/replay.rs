//! `tributary replay`: re-ingesting a run's failed records, and its report.

use std::path::Path;
use std::process::ExitCode;

use clap::Args;

use crate::app::{Access, App};
use crate::config::Settings;
use crate::db::OlderInstances;
use crate::ops::replay::ReplayReport;

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The run whose errors to replay.
    run_id: i64,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// `tributary replay`.
pub async fn run(config: &Path, args: ReplayArgs) -> anyhow::Result<ExitCode> {
    let settings = Settings::load(config)?;
    let app = App::open(
        settings,
        Access::Work {
            command: "replay",
            older: OlderInstances::Refuse,
        },
    )
    .await?;
    let report = crate::ops::replay::replay(app.db(), app.settings(), args.run_id).await;
    app.close().await;
    let report = report?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_replay(args.run_id, &report);
    }
    match &report.stopped {
        None => Ok(ExitCode::SUCCESS),
        Some(reason) => {
            eprintln!("error: the replay stopped before its end: {reason}");
            Ok(ExitCode::from(super::exit::EXIT_FAILURE))
        }
    }
}

/// The outcome of `tributary replay`.
fn print_replay(run_id: i64, report: &ReplayReport) {
    match report.replay_run_id {
        None => println!("Run {run_id} has no open record errors: nothing to replay."),
        Some(replay) => println!(
            "Replay run {replay} of run {run_id}: {} resolved, {} still failing.",
            report.resolved.len(),
            report.still_failing.len()
        ),
    }
    for (id, reason) in &report.still_failing {
        println!("  error {id} stays open: {reason}");
    }
    if !report.superseded.is_empty() {
        println!(
            "  {} error(s) superseded and closed, not replayed (a newer run stored their record since): {:?}",
            report.superseded.len(),
            report.superseded
        );
    }
    if !report.not_replayable.is_empty() {
        println!(
            "  {} page-level error(s) are not replayable (the next sync fetches those pages again): {:?}",
            report.not_replayable.len(),
            report.not_replayable
        );
    }
}
