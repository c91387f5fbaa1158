//! `tributary notifications`: the webhook deliveries, newest first, with where each stands.

use std::path::Path;
use std::process::ExitCode;

use crate::app::{Access, App};
use crate::config::Settings;
use crate::entities::notification_delivery::{self, DeliveryStatus};
use crate::ops::notifications::{DeliveriesQuery, DeliveryRef, MAX_LIMIT};
use clap::Args;

use super::history::{print_rows, shorten};

#[derive(Debug, Args)]
pub struct NotificationsArgs {
    /// Only the deliveries given up after `give_up_after`.
    #[arg(long)]
    failed: bool,
    /// How many deliveries to show (1 to 1000), newest first.
    #[arg(long, default_value_t = 50,
        value_parser = clap::value_parser!(u64).range(1..=MAX_LIMIT))]
    limit: u64,
    /// Only deliveries older than this row id (the `--before` a previous page printed).
    #[arg(long, value_name = "ID")]
    before: Option<i64>,
    /// Send this delivery (its `delivery` id) again: a delivered or failed one becomes
    /// pending, and the daemon's next pass sends it with the same id.
    #[arg(long, value_name = "DELIVERY", conflicts_with_all = ["failed", "before"])]
    redeliver: Option<String>,
    /// Print JSON (with each delivery's body) instead of a table.
    #[arg(long)]
    json: bool,
}

/// `tributary notifications`.
pub async fn run(config: &Path, args: NotificationsArgs) -> anyhow::Result<ExitCode> {
    let settings = Settings::load(config)?;
    if let Some(delivery_id) = args.redeliver {
        let app = App::open(settings, Access::Migrated).await?;
        let which = DeliveryRef::DeliveryId(delivery_id);
        let delivery = crate::ops::notifications::redeliver(app.db(), &which).await?;
        match args.json {
            true => println!("{}", serde_json::to_string_pretty(&delivery)?),
            false => println!(
                "Delivery {} ({}) is pending again: the daemon's next pass sends it.",
                delivery.delivery_id,
                what_of(&delivery)
            ),
        }
        return Ok(ExitCode::SUCCESS);
    }
    let app = App::open(settings, Access::Read).await?;
    let query = DeliveriesQuery {
        failed_only: args.failed,
        before: args.before,
        limit: args.limit,
    };
    let page = crate::ops::notifications::list(app.db(), &query).await?;
    print_deliveries(&page.items, &args)?;
    if let (Some(next), false) = (page.next, args.json) {
        println!("More deliveries: add --before {next} for the next page.");
    }
    Ok(ExitCode::SUCCESS)
}

fn print_deliveries(
    deliveries: &[notification_delivery::Model],
    args: &NotificationsArgs,
) -> anyhow::Result<()> {
    let empty = if args.failed {
        "No failed deliveries."
    } else {
        "No deliveries yet."
    };
    let header = [
        "delivery",
        "event",
        "provider",
        "user",
        "status",
        "attempts",
        "next attempt (UTC)",
        "created (UTC)",
        "last error",
    ];
    print_rows(deliveries, args.json, Some(empty), &header, |delivery| {
        let next = match delivery.status {
            DeliveryStatus::Pending => format_time(delivery.next_attempt_at),
            DeliveryStatus::Delivered | DeliveryStatus::Failed => String::new(),
        };
        vec![
            delivery.delivery_id.clone(),
            what_of(delivery),
            delivery.provider.clone(),
            delivery.user_id.clone(),
            delivery.status.to_string(),
            delivery.attempts.to_string(),
            next,
            format_time(delivery.created_at),
            shorten(delivery.last_error.as_deref().unwrap_or("")),
        ]
    })
}

/// What a delivery reports: `run N`, or a connection event's name.
fn what_of(delivery: &notification_delivery::Model) -> String {
    match delivery.run_id {
        Some(run_id) => format!("run {run_id}"),
        None => delivery.event.to_string(),
    }
}

fn format_time(at: chrono::DateTime<chrono::Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%S").to_string()
}
