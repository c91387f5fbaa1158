//! `tributary webhooks`: the inbound webhook deliveries, newest first: where each
//! stands, the connection and job it was routed to, and why a failed one failed.

use std::path::Path;
use std::process::ExitCode;

use clap::Args;

use crate::app::{Access, App};
use crate::config::Settings;
use crate::entities::webhook_delivery;
use crate::entities::webhook_delivery::InboxStatus;
use crate::ops::webhooks::{InboxQuery, MAX_INBOX_LIMIT};

use super::history::{print_rows, shorten};

#[derive(Debug, Args)]
pub struct InboxArgs {
    /// Only the deliveries that failed after their retries.
    #[arg(long)]
    failed: bool,
    /// Only this provider's deliveries (its name in config.toml).
    #[arg(long)]
    provider: Option<String>,
    /// How many deliveries to show (1 to 1000), newest first.
    #[arg(long, default_value_t = 50,
        value_parser = clap::value_parser!(u64).range(1..=MAX_INBOX_LIMIT))]
    limit: u64,
    /// Only deliveries older than this row id (the `--before` a previous page printed).
    #[arg(long, value_name = "ID")]
    before: Option<i64>,
    /// Print JSON (with each delivery's body) instead of a table.
    #[arg(long)]
    json: bool,
}

/// `tributary webhooks`.
pub async fn run(config: &Path, args: InboxArgs) -> anyhow::Result<ExitCode> {
    let app = App::open(Settings::load(config)?, Access::Read).await?;
    let query = InboxQuery {
        provider: args.provider.as_deref(),
        status: args.failed.then_some(InboxStatus::Failed),
        before: args.before,
        limit: args.limit,
    };
    let page = crate::ops::webhooks::inbox(app.db(), &query).await?;
    let empty = if args.failed {
        "No failed deliveries."
    } else {
        "No deliveries yet."
    };
    let header = [
        "id",
        "provider",
        "delivery",
        "event",
        "status",
        "attempts",
        "connection",
        "job",
        "received (UTC)",
        "error",
    ];
    let text = |value: Option<i64>| value.map(|id| id.to_string()).unwrap_or_default();
    print_rows(
        &page.items,
        args.json,
        Some(empty),
        &header,
        |delivery: &webhook_delivery::Model| {
            vec![
                delivery.id.to_string(),
                delivery.provider.clone(),
                delivery.delivery_id.clone(),
                delivery.event_type.clone().unwrap_or_default(),
                delivery.status.to_string(),
                delivery.attempts.to_string(),
                text(delivery.connection_id),
                text(delivery.job_id),
                delivery.received_at.format("%Y-%m-%d %H:%M:%S").to_string(),
                shorten(delivery.error.as_deref().unwrap_or("")),
            ]
        },
    )?;
    if let (Some(next), false) = (page.next, args.json) {
        println!("More deliveries: add --before {next} for the next page.");
    }
    Ok(ExitCode::SUCCESS)
}
