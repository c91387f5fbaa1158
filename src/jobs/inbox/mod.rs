//! The webhook inbox's processing: claims deliveries `received` and due, routes each to
//! the connections of its provider with the account id it names, and either stores the
//! object it carries whole through the pipeline (`apply.rs`), or queues one incremental
//! run per connection and stream as a `webhook` job, which deliveries arriving while it
//! waits join (docs/decisions/inbound-webhooks.md). An object whose version ties with
//! the stored one's but whose content differs queues that run too.

mod apply;
mod carried;

use chrono::{DateTime, TimeDelta, Utc};
use sea_orm::sea_query::{LockBehavior, LockType};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DatabaseBackend, DatabaseTransaction, DbErr,
    EntityTrait, IsolationLevel, QueryFilter, QueryOrder, QuerySelect, Set, SqliteTransactionMode,
    TransactionOptions, TransactionTrait,
};

use crate::config::{ProviderSettings, Settings};
use crate::db::DatabasePools;
use crate::entities::connection;
use crate::entities::sync_job::{self, JobKind, JobStatus};
use crate::entities::webhook_delivery::{self, InboxStatus};

use super::queue::{insert_queued, NewJob};

/// Attempts before a delivery that keeps failing is left `failed`.
pub(crate) const MAX_ATTEMPTS: i64 = 5;
/// The wait before the second attempt; it doubles with each failure after.
const FIRST_BACKOFF: TimeDelta = TimeDelta::seconds(10);
/// Deliveries settled in one call, so that a backlog does not hold the loop forever.
const BATCH: usize = 100;
/// How long a delivery whose object is being stored stays claimed: past it, an instance
/// that died storing it has it applied again, by whichever instance claims it next.
const APPLY_HOLD: TimeDelta = TimeDelta::seconds(30);
/// The wait of a delivery whose connection's lease a run holds.
const BUSY_WAIT: TimeDelta = TimeDelta::seconds(2);

/// What one call did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Processed {
    /// Routed to a connection: its job queued or joined.
    pub applied: u64,
    /// No connection of the provider has an account the delivery names.
    pub unmatched: u64,
    /// Failed and due again later, or `failed` after its last attempt.
    pub failed: u64,
    /// Webhook jobs inserted (the rest joined one already queued).
    pub jobs_queued: u64,
    /// Carrying an object for a connection whose lease a run holds: due again shortly.
    pub waiting: u64,
}

/// How one delivery ended.
enum Settled {
    Applied {
        jobs_queued: u64,
    },
    Unmatched,
    /// It carries its object whole: held for [`APPLY_HOLD`], to be stored for these
    /// connections once the claim committed.
    Carries(Vec<connection::Model>),
}

/// Settles up to [`BATCH`] deliveries due at `now`, one transaction each. Each is
/// claimed with `FOR UPDATE SKIP LOCKED` on PostgreSQL and MySQL (SQLite has one
/// writer), so instances sharing the inbox never settle one twice.
pub(crate) async fn process_due(
    db: &DatabasePools,
    settings: &Settings,
    now: DateTime<Utc>,
) -> Result<Processed, DbErr> {
    let mut processed = Processed::default();
    // A disabled provider's deliveries wait, as its jobs do, until it is enabled again.
    let providers: Vec<&str> = settings
        .providers
        .values()
        .filter(|provider| provider.enabled && provider.webhooks.is_some())
        .map(|provider| provider.name.as_str())
        .collect();
    if providers.is_empty() {
        return Ok(processed);
    }
    for _ in 0..BATCH {
        let txn = begin(db).await?;
        let mut due = webhook_delivery::Entity::find()
            .filter(webhook_delivery::Column::Status.eq(InboxStatus::Received))
            .filter(webhook_delivery::Column::Provider.is_in(providers.iter().copied()))
            .filter(webhook_delivery::Column::NextAttemptAt.lte(now))
            .order_by_asc(webhook_delivery::Column::NextAttemptAt)
            .order_by_asc(webhook_delivery::Column::Id)
            .limit(1);
        if db.get_database_backend() != DatabaseBackend::Sqlite {
            due = due.lock_with_behavior(LockType::Update, LockBehavior::SkipLocked);
        }
        let Some(delivery) = due.one(&txn).await? else {
            txn.commit().await?;
            break;
        };
        let outcome = match settle(&txn, settings, &delivery, now).await {
            Ok(settled) => txn.commit().await.map(|()| settled),
            Err(error) => {
                // Released before the failure is written, which updates the same row.
                txn.rollback().await?;
                Err(error)
            }
        };
        let outcome = match outcome {
            Ok(Settled::Carries(connections)) => {
                apply_carried(db, settings, &delivery, &connections, now).await
            }
            settled => settled,
        };
        let provider = delivery.provider.as_str();
        match outcome {
            Ok(Settled::Applied { jobs_queued }) => {
                processed.applied = processed.applied.saturating_add(1);
                processed.jobs_queued = processed.jobs_queued.saturating_add(jobs_queued);
                crate::telemetry::record_webhook_delivery(provider, "applied");
            }
            Ok(Settled::Carries(_)) => {
                processed.waiting = processed.waiting.saturating_add(1);
                tracing::debug!(
                    provider,
                    delivery_id = delivery.delivery_id.as_str(),
                    "Webhook delivery waits for its connection's run to end."
                );
            }
            Ok(Settled::Unmatched) => {
                processed.unmatched = processed.unmatched.saturating_add(1);
                crate::telemetry::record_webhook_delivery(provider, "unmatched");
                tracing::info!(
                    provider,
                    delivery_id = delivery.delivery_id.as_str(),
                    "Webhook delivery matches no connection; kept as unmatched."
                );
            }
            Err(error) => {
                processed.failed = processed.failed.saturating_add(1);
                let last = record_failure(db, &delivery, &error, now).await?;
                crate::telemetry::record_webhook_delivery(
                    provider,
                    if last { "failed" } else { "retried" },
                );
                tracing::warn!(
                    provider,
                    delivery_id = delivery.delivery_id.as_str(),
                    attempts = delivery.attempts.saturating_add(1),
                    last,
                    %error,
                    "Processing a webhook delivery failed."
                );
            }
        }
    }
    Ok(processed)
}

/// Routes `delivery` and queues or joins its connections' jobs, inside `txn`.
async fn settle(
    txn: &DatabaseTransaction,
    settings: &Settings,
    delivery: &webhook_delivery::Model,
    now: DateTime<Utc>,
) -> Result<Settled, DbErr> {
    let provider = settings.providers.get(&delivery.provider);
    let connections = match (provider, &delivery.account_ids) {
        (Some(_), Some(ids)) => matching_connections(txn, &delivery.provider, ids).await?,
        _ => Vec::new(),
    };
    let (Some(provider), Some(first)) = (provider, connections.first()) else {
        settle_row(txn, delivery, InboxStatus::Unmatched, None, None, now).await?;
        return Ok(Settled::Unmatched);
    };
    if carries_object(provider, delivery) {
        hold(txn, delivery, now).await?;
        return Ok(Settled::Carries(connections));
    }
    let stream = stream_of(provider, delivery.event_type.as_deref());
    let mut jobs_queued = 0u64;
    let mut first_job = None;
    for connection in &connections {
        let (job_id, inserted) = queue_or_join(txn, connection, &stream, now).await?;
        first_job.get_or_insert(job_id);
        jobs_queued = jobs_queued.saturating_add(u64::from(inserted));
    }
    settle_row(
        txn,
        delivery,
        InboxStatus::Applied,
        Some(first.id),
        first_job,
        now,
    )
    .await?;
    Ok(Settled::Applied { jobs_queued })
}

/// The enabled connections of `provider` with one of `ids` (space-separated) as their
/// account, or, for `ids` empty (a Stripe platform's own event), those without one;
/// locked in id order on PostgreSQL and MySQL, so that two instances routing deliveries
/// of one connection queue its job one after the other, the second joining the first's.
async fn matching_connections(
    txn: &DatabaseTransaction,
    provider: &str,
    ids: &str,
) -> Result<Vec<connection::Model>, DbErr> {
    let mut query = connection::Entity::find()
        .filter(connection::Column::Provider.eq(provider))
        .filter(connection::Column::Enabled.eq(true))
        .order_by_asc(connection::Column::Id);
    query = if ids.is_empty() {
        query.filter(connection::Column::AccountId.is_null())
    } else {
        query.filter(connection::Column::AccountId.is_in(ids.split(' ')))
    };
    if txn.get_database_backend() != DatabaseBackend::Sqlite {
        query = query.lock(LockType::Update);
    }
    query.all(txn).await
}

/// The webhook job of `connection` and `stream` still queued, or a new one: its id and
/// whether it was inserted. The caller holds the connection's row lock (SQLite: the
/// write lock), so no other instance inserts one meanwhile.
async fn queue_or_join(
    txn: &DatabaseTransaction,
    connection: &connection::Model,
    stream: &str,
    now: DateTime<Utc>,
) -> Result<(i64, bool), DbErr> {
    let waiting = sync_job::Entity::find()
        .select_only()
        .column(sync_job::Column::Id)
        .filter(sync_job::Column::ConnectionId.eq(connection.id))
        .filter(sync_job::Column::Stream.eq(stream))
        .filter(sync_job::Column::Kind.eq(JobKind::Webhook))
        .filter(sync_job::Column::Status.eq(JobStatus::Queued))
        .order_by_asc(sync_job::Column::Id)
        .limit(1)
        .into_tuple::<i64>()
        .one(txn)
        .await?;
    if let Some(job_id) = waiting {
        return Ok((job_id, false));
    }
    let job = NewJob {
        connection_id: connection.id,
        provider: connection.provider.clone(),
        stream: stream.to_string(),
        kind: JobKind::Webhook,
        slot_at: None,
        not_before: now,
        attempt: 0,
        full: false,
    };
    Ok((insert_queued(txn, &job).await?, true))
}

/// The stream an event concerns when the provider syncs one of its name (GitHub's
/// `issues`, Stripe's `charge.refunded` for `charges`, Strava's `activity.update` for
/// `activities`, GitLab's `Merge Request Hook` for `merge_requests`); empty, for every
/// stream, when none is known.
fn stream_of(provider: &ProviderSettings, event_type: Option<&str>) -> String {
    let Some(event_type) = event_type else {
        return String::new();
    };
    let object = match event_type.strip_suffix(" Hook") {
        Some(gitlab) => gitlab.to_ascii_lowercase().replace(' ', "_"),
        None => event_type
            .split('.')
            .next()
            .unwrap_or(event_type)
            .to_string(),
    };
    let plural = match object.strip_suffix('y') {
        Some(stem) => format!("{stem}ies"),
        None => format!("{object}s"),
    };
    [object, plural]
        .into_iter()
        .find(|name| provider.stream(name).is_some())
        .unwrap_or_default()
}

/// Whether `delivery` carries an object whole that `provider` has a stream for.
fn carries_object(provider: &ProviderSettings, delivery: &webhook_delivery::Model) -> bool {
    let Some(webhooks) = &provider.webhooks else {
        return false;
    };
    let event_type = delivery.event_type.as_deref();
    carried::carried(&webhooks.scheme, event_type, &delivery.body)
        .is_some_and(|carried| apply::stream_for(provider, &carried).is_some())
}

/// Keeps `delivery` from being claimed again for [`APPLY_HOLD`], as the claim commits.
async fn hold(
    txn: &DatabaseTransaction,
    delivery: &webhook_delivery::Model,
    now: DateTime<Utc>,
) -> Result<(), DbErr> {
    due_again(
        txn,
        delivery,
        now.checked_add_signed(APPLY_HOLD).unwrap_or(now),
    )
    .await
}

async fn due_again(
    db: &impl ConnectionTrait,
    delivery: &webhook_delivery::Model,
    at: DateTime<Utc>,
) -> Result<(), DbErr> {
    webhook_delivery::ActiveModel {
        id: Set(delivery.id),
        next_attempt_at: Set(at),
        ..Default::default()
    }
    .update(db)
    .await
    .map(|_| ())
}

/// Stores the object `delivery` carries for `connections`, then settles it `applied`;
/// when a connection's run holds its lease, the delivery is due again shortly, its
/// attempts unchanged ([`Settled::Carries`]).
async fn apply_carried(
    db: &DatabasePools,
    settings: &Settings,
    delivery: &webhook_delivery::Model,
    connections: &[connection::Model],
    now: DateTime<Utc>,
) -> Result<Settled, DbErr> {
    let provider = settings.providers.get(&delivery.provider);
    let scheme = provider.and_then(|provider| provider.webhooks.as_ref());
    let (Some(provider), Some(webhooks), Some(first)) = (provider, scheme, connections.first())
    else {
        return Err(DbErr::Custom(
            "the delivery's provider has no webhooks".into(),
        ));
    };
    let event_type = delivery.event_type.as_deref();
    let Some(carried) = carried::carried(&webhooks.scheme, event_type, &delivery.body) else {
        return Err(DbErr::Custom(
            "the delivery no longer reads as an object".into(),
        ));
    };
    match apply::apply(db, settings, provider, connections, &carried).await? {
        apply::Applied::Stored { tied } => {
            let (mut jobs_queued, mut first_job) = (0u64, None);
            if let Some(stream) = apply::stream_for(provider, &carried) {
                for connection in &tied {
                    let (job_id, inserted) = queue_run(db, connection, &stream.name, now).await?;
                    first_job.get_or_insert(job_id);
                    jobs_queued = jobs_queued.saturating_add(u64::from(inserted));
                }
            }
            settle_row(
                db.main(),
                delivery,
                InboxStatus::Applied,
                Some(first.id),
                first_job,
                now,
            )
            .await?;
            Ok(Settled::Applied { jobs_queued })
        }
        apply::Applied::Busy => {
            let at = now.checked_add_signed(BUSY_WAIT).unwrap_or(now);
            due_again(db.main(), delivery, at).await?;
            Ok(Settled::Carries(Vec::new()))
        }
    }
}

/// A transaction of the inbox's. SQLite: the write lock up front, so the read and the
/// writes see one state. MySQL: read committed, as PostgreSQL's default, so that a
/// locking read takes no gap locks, which would deadlock with another instance's settled
/// row moving in the status index while that instance holds the connection's lock.
async fn begin(db: &DatabasePools) -> Result<DatabaseTransaction, DbErr> {
    db.begin_with_options(TransactionOptions {
        sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
        isolation_level: (db.get_database_backend() == DatabaseBackend::MySql)
            .then_some(IsolationLevel::ReadCommitted),
        ..TransactionOptions::default()
    })
    .await
}

/// [`queue_or_join`] in a transaction of its own that holds `connection`'s row (SQLite:
/// the write lock), as routing does.
async fn queue_run(
    db: &DatabasePools,
    connection: &connection::Model,
    stream: &str,
    now: DateTime<Utc>,
) -> Result<(i64, bool), DbErr> {
    let txn = begin(db).await?;
    if txn.get_database_backend() != DatabaseBackend::Sqlite {
        connection::Entity::find_by_id(connection.id)
            .lock(LockType::Update)
            .one(&txn)
            .await?;
    }
    let queued = queue_or_join(&txn, connection, stream, now).await?;
    txn.commit().await?;
    Ok(queued)
}

async fn settle_row(
    txn: &impl ConnectionTrait,
    delivery: &webhook_delivery::Model,
    status: InboxStatus,
    connection_id: Option<i64>,
    job_id: Option<i64>,
    now: DateTime<Utc>,
) -> Result<(), DbErr> {
    webhook_delivery::ActiveModel {
        id: Set(delivery.id),
        status: Set(status),
        attempts: Set(delivery.attempts.saturating_add(1)),
        connection_id: Set(connection_id),
        job_id: Set(job_id),
        applied_at: Set((status == InboxStatus::Applied).then_some(now)),
        error: Set(None),
        ..Default::default()
    }
    .update(txn)
    .await
    .map(|_| ())
}

/// Counts a failed attempt of `delivery`: due again after a backoff, or `failed` after
/// [`MAX_ATTEMPTS`]; its error is kept either way. Returns whether it was the last.
async fn record_failure(
    db: &DatabasePools,
    delivery: &webhook_delivery::Model,
    error: &DbErr,
    now: DateTime<Utc>,
) -> Result<bool, DbErr> {
    let attempts = delivery.attempts.saturating_add(1);
    let last = attempts >= MAX_ATTEMPTS;
    let doublings = u32::try_from(attempts.saturating_sub(1)).unwrap_or(u32::MAX);
    let backoff = FIRST_BACKOFF
        .checked_mul(2i32.saturating_pow(doublings.min(16)))
        .unwrap_or(TimeDelta::hours(1));
    webhook_delivery::ActiveModel {
        id: Set(delivery.id),
        status: Set(if last {
            InboxStatus::Failed
        } else {
            InboxStatus::Received
        }),
        attempts: Set(attempts),
        next_attempt_at: Set(now.checked_add_signed(backoff).unwrap_or(now)),
        error: Set(Some(error.to_string())),
        ..Default::default()
    }
    .update(db)
    .await?;
    Ok(last)
}

#[cfg(test)]
mod tests;
