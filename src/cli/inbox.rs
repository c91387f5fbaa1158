//! `tributary webhooks`: the inbound webhook deliveries, newest first: where each
//! stands, the connection and job it was routed to, and why a failed one failed; and
//! `tributary webhooks replay`, which puts failed ones back in the inbox.

use std::path::Path;
use std::process::ExitCode;

use clap::{Args, Subcommand};

use crate::app::{Access, App};
use crate::config::Settings;
use crate::entities::webhook_delivery;
use crate::entities::webhook_delivery::InboxStatus;
use crate::ops::webhooks::{InboxQuery, MAX_INBOX_LIMIT};

use super::history::{print_rows, shorten};

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct InboxArgs {
    #[command(subcommand)]
    command: Option<WebhooksCommand>,
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

#[derive(Debug, Subcommand)]
enum WebhooksCommand {
    /// Put failed deliveries back in the inbox, due now with their attempts reset; the
    /// daemon applies them as any delivery, with one effect. Replaying one that has not
    /// failed does nothing.
    Replay(ReplayArgs),
}

#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
struct ReplayArgs {
    /// The delivery's row id (`tributary webhooks --failed` lists them).
    id: Option<i64>,
    /// Every failed delivery.
    #[arg(long)]
    all_failed: bool,
}

/// `tributary webhooks replay`.
async fn replay(config: &Path, args: ReplayArgs) -> anyhow::Result<ExitCode> {
    use crate::ops::webhooks::ReplayWhich;
    let app = App::open(Settings::load(config)?, Access::Migrated).await?;
    let which = match args.id {
        Some(id) => ReplayWhich::One(id),
        None => ReplayWhich::AllFailed,
    };
    let replayed = crate::ops::webhooks::replay(app.db(), which, crate::db::now()).await?;
    for id in &replayed.not_failed {
        println!("Delivery {id} has not failed; left as it is.");
    }
    println!(
        "{} failed deliveries put back in the inbox; a running daemon applies them.",
        replayed.requeued.len()
    );
    Ok(ExitCode::SUCCESS)
}

/// `tributary webhooks`.
pub async fn run(config: &Path, args: InboxArgs) -> anyhow::Result<ExitCode> {
    if let Some(WebhooksCommand::Replay(replay_args)) = args.command {
        return replay(config, replay_args).await;
    }
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
