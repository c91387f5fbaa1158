//! The delivery worker: it sends the notifications runs left in `notification_deliveries`
//! (the outbox, written where a run closes), signed, retried with exponential backoff and
//! jitter, at least once, in order per connection, until `give_up_after`.
//!
//! The daemon's worker ([`Notifier::run`]) looks every `poll_interval` and starts the due
//! deliveries of connections it has none in flight for, up to `max_concurrent_deliveries`
//! at once, without waiting for the attempts it started before: a slow receiver holds
//! back only its own connection's queue. [`Notifier::deliver_due`] is one pass that waits
//! for its attempts; tests call it directly.

mod claim;
mod send;
mod signature;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use backon::BackoffBuilder;
use chrono::{DateTime, TimeDelta, Utc};
use futures::StreamExt;
use sea_orm::{DatabaseConnection, DbErr};
use secrecy::SecretString;
use tokio::task::{JoinError, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::config::NotifySettings;
use crate::entities::notification_delivery::Model as Delivery;

use claim::Settle;

/// The most deliveries one pass reads.
const PASS_SIZE: u64 = 64;
/// How long past the request's timeout a claim lasts, so that settling the attempt after
/// the answer fits in it too.
const CLAIM_MARGIN: Duration = Duration::from_secs(30);

/// The worker could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum NotifierError {
    #[error("building the HTTP client for [notify]: {0}")]
    Client(String),
}

/// What one pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeliveryPass {
    pub delivered: usize,
    /// Failed attempts that will be tried again.
    pub retrying: usize,
    /// Failed attempts past `give_up_after`: the delivery is `failed`.
    pub given_up: usize,
    /// Deliveries another worker claimed first, or took over from this one.
    pub contended: usize,
}

/// How one attempt ended, for the pass's tally.
enum Attempted {
    Delivered,
    Retrying,
    GivenUp,
    Contended,
}

impl Attempted {
    /// The outcome as the metrics label it.
    fn label(&self) -> &'static str {
        match self {
            Attempted::Delivered => "delivered",
            Attempted::Retrying => "retrying",
            Attempted::GivenUp => "given_up",
            Attempted::Contended => "contended",
        }
    }
}

/// Sends the outbox's deliveries.
pub struct Notifier {
    db: DatabaseConnection,
    settings: NotifySettings,
    secret: SecretString,
    client: reqwest::Client,
}

impl Notifier {
    /// A worker over `db` with `[notify]`'s settings and the signing secret.
    pub fn new(
        db: DatabaseConnection,
        settings: NotifySettings,
        secret: SecretString,
    ) -> Result<Notifier, NotifierError> {
        let client = send::client(&settings).map_err(|error| {
            NotifierError::Client(tributary_providers::http::error_chain(&error))
        })?;
        Ok(Notifier {
            db,
            settings,
            secret,
            client,
        })
    }

    /// Sends every delivery due now that heads its connection's queue, a few at a time.
    /// Once `cancel` fires no attempt starts; those in flight finish.
    pub async fn deliver_due(&self, cancel: &CancellationToken) -> Result<DeliveryPass, DbErr> {
        let due = claim::due(&self.db, crate::db::now(), PASS_SIZE).await?;
        let results: Vec<Result<Attempted, DbErr>> = futures::stream::iter(due)
            .take_while(|_| std::future::ready(!cancel.is_cancelled()))
            .map(|delivery| self.attempt(delivery))
            .buffer_unordered(self.settings.max_concurrent_deliveries)
            .collect()
            .await;
        let mut pass = DeliveryPass::default();
        for result in results {
            match result? {
                Attempted::Delivered => pass.delivered += 1,
                Attempted::Retrying => pass.retrying += 1,
                Attempted::GivenUp => pass.given_up += 1,
                Attempted::Contended => pass.contended += 1,
            }
        }
        Ok(pass)
    }

    /// Looks every `poll_interval` until `cancel` fires, the first time one interval
    /// after the start, and starts what is due without waiting for earlier attempts; once
    /// `cancel` fires no attempt starts, and those in flight finish.
    pub(crate) async fn run(self, cancel: CancellationToken) {
        tracing::info!(
            url = %crate::config::redact_url(self.settings.url.as_str()),
            max_concurrent_deliveries = self.settings.max_concurrent_deliveries,
            "Notification worker started."
        );
        let notifier = Arc::new(self);
        let mut in_flight = InFlight::default();
        let interval = notifier.settings.poll_interval;
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = cancel.cancelled() => break,
                Some(joined) = in_flight.attempts.join_next_with_id() => {
                    in_flight.finished(joined);
                    continue;
                }
                _ = ticks.tick() => {}
            }
            if let Err(error) = notifier.start_due(&mut in_flight).await {
                tracing::warn!(%error, "Reading the notification outbox failed; trying again.");
            }
        }
        while let Some(joined) = in_flight.attempts.join_next_with_id().await {
            in_flight.finished(joined);
        }
        tracing::info!("Notification worker stopped.");
    }

    /// Starts the due deliveries of connections with none in flight here, while there is
    /// room. Across daemons the claim keeps a connection's order: its next delivery is not
    /// due while the one before is pending, and an attempt's claim moves that one's
    /// `next_attempt_at` past the attempt.
    async fn start_due(self: &Arc<Self>, in_flight: &mut InFlight) -> Result<(), DbErr> {
        let room = self
            .settings
            .max_concurrent_deliveries
            .saturating_sub(in_flight.attempts.len());
        if room == 0 {
            return Ok(());
        }
        let due = claim::due(&self.db, crate::db::now(), PASS_SIZE).await?;
        let mut started = 0;
        for delivery in due {
            let connection = connection_of(&delivery);
            if started == room {
                break;
            }
            if in_flight.has(&connection) {
                continue;
            }
            started += 1;
            let notifier = Arc::clone(self);
            let task = in_flight
                .attempts
                .spawn(async move { notifier.attempt(delivery).await });
            in_flight.connections.insert(task.id(), connection);
        }
        Ok(())
    }

    /// One attempt at `delivery`: claim it, POST it, record the answer.
    async fn attempt(&self, delivery: Delivery) -> Result<Attempted, DbErr> {
        let now = crate::db::now();
        let until = later(now, self.settings.timeout.saturating_add(CLAIM_MARGIN));
        let Some(attempt) = claim::claim(&self.db, &delivery, now, until).await? else {
            return Ok(Attempted::Contended);
        };
        let sent = send::post(&self.client, &self.settings, &self.secret, &delivery).await;
        let finished = crate::db::now();
        let (settle, attempted) = match sent {
            Ok(()) => (Settle::Delivered { at: finished }, Attempted::Delivered),
            Err(error) => self.after_failure(&delivery, attempt, finished, error),
        };
        if !claim::settle(&self.db, delivery.id, attempt, settle).await? {
            tracing::warn!(
                delivery_id = delivery.delivery_id,
                attempt,
                "The delivery's claim lapsed during its attempt; another worker has it."
            );
            return Ok(Attempted::Contended);
        }
        crate::telemetry::record_notification_attempt(attempted.label());
        if let Attempted::Delivered = attempted {
            tracing::info!(
                delivery_id = delivery.delivery_id,
                run_id = delivery.run_id,
                event = %delivery.event,
                attempt,
                "Notification delivered."
            );
        }
        Ok(attempted)
    }

    /// The retry, or the end, after attempt `attempt` failed with `error` at `now`.
    fn after_failure(
        &self,
        delivery: &Delivery,
        attempt: i64,
        now: DateTime<Utc>,
        error: String,
    ) -> (Settle, Attempted) {
        let deadline = later(delivery.created_at, self.settings.give_up_after);
        if now >= deadline {
            tracing::error!(
                delivery_id = delivery.delivery_id,
                run_id = delivery.run_id,
                event = %delivery.event,
                attempt,
                %error,
                "Notification given up: still failing after give_up_after."
            );
            return (Settle::GiveUp { error, at: now }, Attempted::GivenUp);
        }
        // The last attempt is made at the deadline, so the delivery is given up on time.
        let next = later(now, self.backoff(attempt)).min(deadline);
        tracing::warn!(
            delivery_id = delivery.delivery_id,
            run_id = delivery.run_id,
                event = %delivery.event,
            attempt,
            %error,
            next_attempt_at = %next,
            "Notification attempt failed; it will be retried."
        );
        (Settle::Retry { error, at: next }, Attempted::Retrying)
    }

    /// The wait after failed attempt `attempt` (1 for the first): `retry_initial_delay`
    /// doubling each attempt, plus up to as much again of jitter, at most
    /// `retry_max_delay`.
    fn backoff(&self, attempt: i64) -> Duration {
        // Past this many doublings every wait is the maximum anyway.
        let step = usize::try_from(attempt.saturating_sub(1)).map_or(0, |step| step.min(64));
        backon::ExponentialBuilder::default()
            .with_min_delay(self.settings.retry_initial_delay)
            .with_max_delay(self.settings.retry_max_delay)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times()
            .build()
            .nth(step)
            .unwrap_or(self.settings.retry_max_delay)
            .min(self.settings.retry_max_delay)
    }
}

/// A delivery's connection: its deliveries go one at a time, in order.
type ConnectionKey = (String, String);

fn connection_of(delivery: &Delivery) -> ConnectionKey {
    (delivery.user_id.clone(), delivery.provider.clone())
}

/// The worker's attempts in flight, and the connection of each.
#[derive(Default)]
struct InFlight {
    attempts: JoinSet<Result<Attempted, DbErr>>,
    connections: HashMap<tokio::task::Id, ConnectionKey>,
}

impl InFlight {
    fn has(&self, connection: &ConnectionKey) -> bool {
        self.connections.values().any(|busy| busy == connection)
    }

    /// Frees the connection of an attempt that ended, however it ended.
    fn finished(&mut self, joined: Result<(tokio::task::Id, Result<Attempted, DbErr>), JoinError>) {
        let id = match &joined {
            Ok((id, _)) => *id,
            Err(error) => error.id(),
        };
        self.connections.remove(&id);
        match joined {
            Ok((_, Ok(_))) => {}
            Ok((_, Err(error))) => tracing::warn!(
                %error,
                "Recording a notification attempt failed; it is tried again when its claim lapses."
            ),
            // Its claim lapses, and the delivery is tried again then.
            Err(error) => tracing::error!(%error, "A notification attempt panicked."),
        }
    }
}

/// `start + wait`. The config bounds every wait to days, so this cannot overflow; if it
/// did, `start` keeps the row storable on every backend.
fn later(start: DateTime<Utc>, wait: Duration) -> DateTime<Utc> {
    TimeDelta::from_std(wait)
        .ok()
        .and_then(|delta| start.checked_add_signed(delta))
        .unwrap_or(start)
}
