//! `tributary sync`: one run of each matching connection now, with a progress display and
//! a summary line per run.

use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;

use clap::Args;

use crate::app::{Access, App};
use crate::config::Settings;
use crate::db::OlderInstances;
use crate::entities::sync_run::RunStatus;
use crate::ops::sync::SyncFilter;
use crate::pipeline::{NoProgress, ProgressSink, RunOptions, RunOutcome};

use super::exit::EXIT_FAILURE;
use super::progress::BarProgress;

#[derive(Debug, Args)]
pub struct SyncArgs {
    /// Only this provider (a `[providers.NAME]` table).
    #[arg(long)]
    provider: Option<String>,
    /// Only this user's connections.
    #[arg(long)]
    user: Option<String>,
    /// Only this stream (one of a provider's `streams`, e.g. `pull_requests`).
    #[arg(long)]
    stream: Option<String>,
    /// No progress display, only the summary lines.
    #[arg(long, short)]
    quiet: bool,
    /// Print the runs as JSON instead of summary lines.
    #[arg(long)]
    json: bool,
    /// Ignore the incremental cursor and fetch the whole listing.
    #[arg(long)]
    full: bool,
    /// Queue the runs as jobs for a running daemon (they start before scheduled ones)
    /// instead of running them here; prints the jobs.
    #[arg(long, conflicts_with = "quiet")]
    queue: bool,
}

/// `tributary sync`.
pub async fn run(config: &Path, args: SyncArgs) -> anyhow::Result<ExitCode> {
    let settings = Settings::load_checking_environment(config)?;
    let app = App::open(
        settings,
        Access::Work {
            command: "sync",
            older: OlderInstances::Refuse,
        },
    )
    .await?;
    let (db, settings) = (app.db(), app.settings());
    let filter = SyncFilter {
        provider: args.provider,
        user_id: args.user,
        stream: args.stream,
    };
    if args.queue {
        let queued = crate::ops::sync::queue(db, settings, &filter, args.full).await;
        app.close().await;
        return print_queued(&queued?, args.json);
    }
    let bars = BarProgress::new();
    let show_progress = !args.quiet && !args.json && std::io::stderr().is_terminal();
    let sink: &dyn ProgressSink = if show_progress { &bars } else { &NoProgress };
    let options = RunOptions {
        full: args.full,
        ..RunOptions::manual()
    };
    let interrupt = options.cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("Interrupted: finishing the pages in flight.");
            interrupt.cancel();
        }
    });
    let report = crate::ops::sync::now(db, settings, &filter, &options, sink).await;
    app.close().await;
    let report = report?;
    bars.clear();
    if report.outcomes.is_empty() && report.skipped.is_empty() {
        eprintln!("No enabled connection matches; nothing was synced.");
    }
    if args.json {
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

fn print_queued(queued: &[crate::ops::sync::Queued], json: bool) -> anyhow::Result<ExitCode> {
    if json {
        println!("{}", serde_json::to_string_pretty(queued)?);
        return Ok(ExitCode::SUCCESS);
    }
    if queued.is_empty() {
        eprintln!("No enabled connection matches; nothing was queued.");
    }
    for job in queued {
        let stream = if job.stream.is_empty() {
            "every stream"
        } else {
            job.stream.as_str()
        };
        println!(
            "queued job {} {}@{} ({stream})",
            job.job_id, job.user_id, job.provider
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// 0 when every run succeeded, was partial or deferred (a spent request budget), 1 when
/// any failed or was interrupted.
fn exit_for(outcomes: &[RunOutcome]) -> ExitCode {
    if outcomes
        .iter()
        .any(|o| matches!(o.status, RunStatus::Failed | RunStatus::Interrupted))
    {
        ExitCode::from(EXIT_FAILURE)
    } else {
        ExitCode::SUCCESS
    }
}

/// One line per run: `run 7 alice@acme partial stream=issues pages=3 fetched=250 ...`.
pub fn summary_line(outcome: &RunOutcome) -> String {
    let c = &outcome.counts;
    let mut line = format!(
        "run {} {}@{} {} stream={} pages={} fetched={} inserted={} updated={} unchanged={} duplicate={} failed={} deleted={} restored={} in {:.1}s",
        outcome.run_id,
        outcome.user_id,
        outcome.provider,
        outcome.status,
        outcome.stream,
        c.pages_fetched,
        c.fetched,
        c.inserted,
        c.updated,
        c.unchanged,
        c.duplicate,
        c.failed,
        c.deleted,
        c.restored,
        outcome.elapsed.as_secs_f64()
    );
    if c.parents_skipped > 0 {
        line.push_str(&format!(" parents_skipped={}", c.parents_skipped));
    }
    if c.filtered > 0 {
        line.push_str(&format!(" filtered={}", c.filtered));
    }
    if let Some(resume_at) = &outcome.resume_at {
        line.push_str(&format!(
            " resume_at={}",
            resume_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        ));
    }
    if let Some(error) = &outcome.error {
        line.push_str(&format!(": {error}"));
    }
    line
}
