//! `tributary reconcile`: removing pre-index duplicates, and its report.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;

use crate::app::{Access, App};
use crate::config::Settings;
use crate::reconcile::ReconcileReport;

#[derive(Debug, Args)]
pub struct ReconcileArgs {
    /// Report what would be removed and change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Append one JSON line per removed row to this file (written before the deletion
    /// commits; created readable by its owner only). Required unless --dry-run or
    /// --no-audit-log.
    #[arg(long)]
    audit_log: Option<PathBuf>,
    /// Delete without an audit log (no copy of the removed rows is kept).
    #[arg(long, conflicts_with = "audit_log")]
    no_audit_log: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// `tributary reconcile`.
pub async fn run(config: &Path, args: ReconcileArgs) -> anyhow::Result<ExitCode> {
    let ReconcileArgs {
        dry_run,
        audit_log,
        no_audit_log,
        json,
    } = args;
    if !dry_run && audit_log.is_none() && !no_audit_log {
        anyhow::bail!(
            "reconcile deletes rows: give --audit-log FILE to keep a copy of each \
             removed row, --no-audit-log to delete without one, or --dry-run to see \
             what would go"
        );
    }
    let settings = Settings::load(config)?;
    let app = App::open(settings, Access::Migrated).await?;
    let report = crate::reconcile::reconcile(app.db(), dry_run, audit_log.as_deref(), |line| {
        if dry_run && !json {
            println!("would remove: {line}");
        }
    })
    .await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_reconcile(&report);
    }
    Ok(ExitCode::SUCCESS)
}

/// The outcome of `tributary reconcile`.
fn print_reconcile(report: &ReconcileReport) {
    let verb = if report.dry_run {
        "would remove"
    } else {
        "removed"
    };
    println!(
        "{} duplicate key(s); {verb} {} row(s).",
        report.duplicate_keys, report.rows_removed
    );
    match (report.index_existed, report.index_created, report.dry_run) {
        (true, _, _) => {
            println!("The unique index on (user_id, provider, external_id) was already there.")
        }
        (false, true, _) => {
            println!("Created the unique index on (user_id, provider, external_id).")
        }
        (false, false, true) => println!("The unique index is missing; a real run creates it."),
        (false, false, false) => println!("The unique index is still missing."),
    }
}
