//! `tributary notifications`: the webhook deliveries, newest first, with where each stands.

use std::path::Path;
use std::process::ExitCode;

use clap::Args;
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QueryOrder, QuerySelect};

use crate::config::Settings;
use crate::entities::notification_delivery::{self, DeliveryStatus};

use super::history::{print_rows, shorten};

#[derive(Debug, Args)]
pub struct NotificationsArgs {
    /// Only the deliveries given up after `give_up_after`.
    #[arg(long)]
    failed: bool,
    /// How many deliveries to show.
    #[arg(long, default_value_t = 50)]
    limit: u64,
    /// Print JSON (with each delivery's body) instead of a table.
    #[arg(long)]
    json: bool,
}

/// `tributary notifications`.
pub async fn run(config: &Path, args: NotificationsArgs) -> anyhow::Result<ExitCode> {
    let settings = Settings::load(config)?;
    let db = crate::db::connect_for_reading(&settings.database).await?;
    print_deliveries(&db, &args).await?;
    Ok(ExitCode::SUCCESS)
}

async fn print_deliveries(db: &DatabaseConnection, args: &NotificationsArgs) -> anyhow::Result<()> {
    let mut query = notification_delivery::Entity::find();
    if args.failed {
        query = query.filter(notification_delivery::Column::Status.eq(DeliveryStatus::Failed));
    }
    let deliveries = query
        .order_by_desc(notification_delivery::Column::Id)
        .limit(args.limit)
        .all(db)
        .await?;
    let empty = if args.failed {
        "No failed deliveries."
    } else {
        "No deliveries yet."
    };
    let header = [
        "delivery",
        "run",
        "provider",
        "user",
        "status",
        "attempts",
        "next attempt (UTC)",
        "created (UTC)",
        "last error",
    ];
    print_rows(&deliveries, args.json, Some(empty), &header, |delivery| {
        let next = match delivery.status {
            DeliveryStatus::Pending => format_time(delivery.next_attempt_at),
            DeliveryStatus::Delivered | DeliveryStatus::Failed => String::new(),
        };
        vec![
            delivery.delivery_id.clone(),
            delivery.run_id.to_string(),
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

fn format_time(at: chrono::DateTime<chrono::Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%S").to_string()
}
