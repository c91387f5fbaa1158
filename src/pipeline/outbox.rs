//! The notification outbox: a run that notifies writes its delivery row in the transaction
//! that closes it, so the notification commits with the run or not at all, and a crash
//! after the commit loses nothing (the daemon's delivery worker sends it).

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DbErr, EntityTrait, Set};
use serde::Serialize;

use crate::config::NotifyRuns;
use crate::entities::connection;
use crate::entities::notification_delivery::{self, DeliveryEvent, DeliveryStatus};

use super::ground::{to_db, RunCounts};
use crate::entities::sync_run::RunStatus;

/// What a closing run tells the outbox.
pub(crate) struct ClosedRun<'a> {
    pub connection: &'a connection::Model,
    /// The stream the run synced.
    pub stream: &'a str,
    pub run_id: i64,
    pub status: RunStatus,
    pub counts: &'a RunCounts,
    pub notify: NotifyRuns,
    pub now: DateTime<Utc>,
}

/// The JSON a receiver gets. The field names are a contract with receivers.
#[derive(Serialize)]
struct Body<'a> {
    delivery_id: &'a str,
    run_id: i64,
    user_id: &'a str,
    provider: &'a str,
    stream: &'a str,
    status: RunStatus,
    counts: BodyCounts,
    cursors: BodyCursors,
}

/// The change feed's cursors around the run: reading from `before` until past `after`
/// (`tributary changes --since BEFORE`) yields the run's changes.
#[derive(Serialize)]
struct BodyCursors {
    before: String,
    after: String,
}

/// The run's counters that say what changed.
#[derive(Serialize)]
struct BodyCounts {
    inserted: i64,
    updated: i64,
    deleted: i64,
    restored: i64,
    failed: i64,
}

/// Whether the run changed anything a receiver would want to hear about.
fn changed(counts: &RunCounts) -> bool {
    counts.inserted > 0
        || counts.updated > 0
        || counts.deleted > 0
        || counts.restored > 0
        || counts.failed > 0
}

/// Writes the run's delivery into `txn` when its provider notifies such runs; returns the
/// delivery id it wrote.
pub(crate) async fn write(
    txn: &impl ConnectionTrait,
    run: &ClosedRun<'_>,
) -> Result<Option<String>, DbErr> {
    let wanted = match run.notify {
        NotifyRuns::None => false,
        NotifyRuns::Changed => changed(run.counts),
        NotifyRuns::All => true,
    };
    if !wanted {
        return Ok(None);
    }
    let delivery_id = uuid::Uuid::new_v4().to_string();
    // In the closing transaction, after everything the run changed was stamped.
    let cursors = super::changes::run_cursor_bounds(txn, run.run_id).await?;
    let database = Some(super::changes::database_id(txn).await?);
    let cursor = |position| super::changes::FeedCursor { database, position }.to_string();
    let body = Body {
        delivery_id: &delivery_id,
        run_id: run.run_id,
        user_id: &run.connection.user_id,
        provider: &run.connection.provider,
        stream: run.stream,
        status: run.status,
        counts: BodyCounts {
            inserted: to_db(run.counts.inserted),
            updated: to_db(run.counts.updated),
            deleted: to_db(run.counts.deleted),
            restored: to_db(run.counts.restored),
            failed: to_db(run.counts.failed),
        },
        cursors: BodyCursors {
            before: cursor(cursors.before),
            after: cursor(cursors.after),
        },
    };
    let body = serde_json::to_string(&body)
        .map_err(|error| DbErr::Custom(format!("serialising the notification: {error}")))?;
    let row = notification_delivery::ActiveModel {
        delivery_id: Set(delivery_id.clone()),
        run_id: Set(Some(run.run_id)),
        user_id: Set(run.connection.user_id.clone()),
        provider: Set(run.connection.provider.clone()),
        body: Set(body),
        status: Set(DeliveryStatus::Pending),
        attempts: Set(0),
        last_error: Set(None),
        next_attempt_at: Set(run.now),
        created_at: Set(run.now),
        delivered_at: Set(None),
        event: Set(DeliveryEvent::Run),
        event_key: Set(None),
        ..Default::default()
    };
    notification_delivery::Entity::insert(row)
        .exec_without_returning(txn)
        .await?;
    Ok(Some(delivery_id))
}
