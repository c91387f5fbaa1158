//! `tributary jobs`: the sync jobs, newest first: which slot of which connection, who ran
//! it, and how it ended; `tributary jobs cancel ID` cancels one.

use std::path::Path;
use std::process::ExitCode;

use clap::{Args, Subcommand};

use crate::app::{Access, App};
use crate::config::Settings;
use crate::entities::sync_job::JobStatus;
use crate::ops::jobs::{JobState, JobsQuery, MAX_LIMIT};

use super::history::{print_rows, shorten};

#[derive(Debug, Args)]
pub struct JobsArgs {
    #[command(subcommand)]
    action: Option<JobsAction>,
    /// Only jobs in this state.
    #[arg(long, value_enum)]
    status: Option<JobState>,
    /// Only this connection's.
    #[arg(long, value_name = "CONNECTION_ID")]
    connection: Option<i64>,
    /// Only this provider's.
    #[arg(long)]
    provider: Option<String>,
    /// Only this user's.
    #[arg(long)]
    user: Option<String>,
    /// How many jobs to show (1 to 1000).
    #[arg(long, default_value_t = 20,
        value_parser = clap::value_parser!(u64).range(1..=MAX_LIMIT))]
    limit: u64,
    /// Only jobs older than this id (the `--before` a previous page printed).
    #[arg(long, value_name = "JOB_ID")]
    before: Option<i64>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Instead of jobs, each enabled connection's next slot and its queued jobs.
    #[arg(long, conflicts_with_all = ["status", "before"])]
    next: bool,
}

#[derive(Debug, Subcommand)]
enum JobsAction {
    /// Cancel a job: a queued one at once (it never runs); a running one's instance, any
    /// instance, stops its run between pages, keeping the pages it committed.
    Cancel {
        /// The job's id (`tributary jobs` lists them).
        job_id: i64,
        /// Print the job as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `tributary jobs`.
pub async fn run(config: &Path, args: JobsArgs) -> anyhow::Result<ExitCode> {
    let settings = Settings::load(config)?;
    if let Some(JobsAction::Cancel { job_id, json }) = args.action {
        let app = App::open(settings, Access::Migrated).await?;
        return cancel(&app, job_id, json).await;
    }
    let app = App::open(settings, Access::Read).await?;
    if args.next {
        return next_due(&app, args.json).await;
    }
    let query = JobsQuery {
        state: args.status,
        connection_id: args.connection,
        provider: args.provider,
        user_id: args.user,
        before: args.before,
        limit: args.limit,
    };
    let page = crate::ops::jobs::list(app.db(), &query).await?;
    let header = [
        "id",
        "user",
        "provider",
        "kind",
        "slot (UTC)",
        "due (UTC)",
        "status",
        "instance",
        "outcome",
    ];
    print_rows(&page.items, args.json, Some("No jobs."), &header, |job| {
        vec![
            job.id.to_string(),
            job.user_id.clone(),
            job.provider.clone(),
            job.kind.to_string(),
            job.slot_at
                .map(|at| at.format("%Y-%m-%d %H:%M:%S").to_string())
                .unwrap_or_default(),
            job.not_before
                .map(|at| at.format("%Y-%m-%d %H:%M:%S").to_string())
                .unwrap_or_default(),
            job.status.to_string(),
            job.holder.clone().unwrap_or_default(),
            shorten(job.outcome.as_deref().unwrap_or("")),
        ]
    })?;
    if let (Some(next), false) = (page.next, args.json) {
        println!("More jobs: add --before {next} for the next page.");
    }
    Ok(ExitCode::SUCCESS)
}

/// `tributary jobs cancel ID`.
async fn cancel(app: &App, job_id: i64, json: bool) -> anyhow::Result<ExitCode> {
    let job = crate::ops::jobs::cancel(app.db(), job_id).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&job)?);
    } else if job.status == JobStatus::Cancelled {
        println!("Job {job_id} is cancelled; it never ran.");
    } else {
        println!(
            "Job {job_id} is running on {}; its run stops between pages and the job ends cancelled.",
            job.holder.as_deref().unwrap_or("another instance")
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `tributary jobs --next`.
async fn next_due(app: &App, json: bool) -> anyhow::Result<ExitCode> {
    let due = crate::ops::jobs::next_due(app.db(), app.settings()).await?;
    let header = ["provider", "user", "schedule", "next slot (UTC)", "queued"];
    print_rows(
        &due,
        json,
        Some("No enabled connections."),
        &header,
        |row| {
            vec![
                row.provider.clone(),
                row.user_id.clone(),
                if row.own_schedule {
                    format!("{} (its own)", row.schedule)
                } else {
                    row.schedule.clone()
                },
                match (row.next_slot, row.paused) {
                    (_, true) => "paused".to_string(),
                    (Some(at), false) if !row.paused_streams.is_empty() => format!(
                        "{} (paused: {})",
                        at.format("%Y-%m-%d %H:%M:%S"),
                        row.paused_streams.join(", ")
                    ),
                    (Some(at), false) => at.format("%Y-%m-%d %H:%M:%S").to_string(),
                    (None, false) => String::new(),
                },
                row.queued.to_string(),
            ]
        },
    )?;
    Ok(ExitCode::SUCCESS)
}
