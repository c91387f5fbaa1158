//! `tributary daemon`: one cron job per provider, each firing syncing the provider's
//! enabled connections under their leases, until a shutdown signal.
//!
//! With `[notify]`, a delivery worker ([`notify::Notifier`]) sends the notifications runs
//! leave in the outbox.
//!
//! Shutdown: the scheduler stops firing, running syncs are cancelled between pages (the
//! page being stored still commits), runs end `interrupted` with their checkpoints, the
//! delivery worker finishes the attempts in flight and starts none, and the process exits
//! 0 within `[daemon] shutdown_grace`.

mod endpoints;
pub mod notify;
mod provider;
mod single_instance;
pub(crate) mod systemd;
mod worker;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio_cron_scheduler::{Job, JobScheduler};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tributary_providers::Provider;

use crate::config::{parse_cron, ConfigError, ProviderSettings, Settings};
use crate::db::{DatabasePools, DbSetupError};
use crate::entities::sync_job::JobKind;
use crate::entities::{connection, stream_schedule};
use crate::jobs::NewJob;
use crate::lease::{sweep_abandoned_runs, Holder};
use crate::pipeline::streams::owe_full_pass;
use crate::sync::{build, enabled_connections, LeaseSettings, SyncError, SyncFilter};

use endpoints::RunPanics;
use provider::{FullPasses, ProviderJob};
pub(crate) use single_instance::lock_sqlite;

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    KeyIndex(#[from] DbSetupError),
    #[error(transparent)]
    SingleInstance(#[from] single_instance::SingleInstanceError),
    #[error(transparent)]
    Provider(#[from] SyncError),
    #[error("marking runs left running by a stopped process failed: {0}")]
    Abandoned(#[source] sea_orm::DbErr),
    #[error("provider {provider}: full_sync_schedule: {message}")]
    FullSyncSchedule { provider: String, message: String },
    #[error("provider {provider}: schedule: {message}")]
    Schedule { provider: String, message: String },
    #[error("{what} failed: {source}")]
    Scheduler {
        what: String,
        #[source]
        source: tokio_cron_scheduler::JobSchedulerError,
    },
    #[error("starting the webhook deliveries failed: {0}")]
    Notifier(#[from] notify::NotifierError),
    #[error("installing the metrics recorder failed: {0}")]
    Metrics(String),
    #[error(transparent)]
    Api(#[from] crate::api::ApiError),
    #[error("listening on {listen} ([daemon] listen) failed: {source}")]
    Listen {
        listen: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

impl DaemonError {
    /// Whether the configuration is at fault.
    pub fn is_config(&self) -> bool {
        match self {
            DaemonError::Config(_)
            | DaemonError::FullSyncSchedule { .. }
            | DaemonError::Schedule { .. } => true,
            DaemonError::Provider(error) => error.is_config(),
            _ => false,
        }
    }
}

/// The scheduler's error, saying what was being done.
fn scheduler_error(
    what: impl Into<String>,
) -> impl FnOnce(tokio_cron_scheduler::JobSchedulerError) -> DaemonError {
    let what = what.into();
    move |source| DaemonError::Scheduler { what, source }
}

/// Runs the daemon until `shutdown` resolves. The database must be migrated and the
/// configured connections loaded (`App::open` with `Access::Work` does both); a records
/// table without the unique key index is refused here too, before anything is written.
pub async fn run(
    settings: &Settings,
    db: DatabasePools,
    shutdown: impl Future<Output = ()>,
) -> Result<(), DaemonError> {
    run_with(settings, db, shutdown, build).await
}

/// [`run`] with each enabled provider's adapter made by `adapter` (tests drive the
/// daemon with adapters of their own).
pub async fn run_with(
    settings: &Settings,
    db: DatabasePools,
    shutdown: impl Future<Output = ()>,
    adapter: impl Fn(&ProviderSettings) -> Result<Box<dyn Provider>, SyncError>,
) -> Result<(), DaemonError> {
    let notify_secret = settings.notify_secret()?;
    // Read before this function serves or writes anything.
    let api_tls = settings.api_tls()?;
    let _sqlite_lock = lock_sqlite(&settings.database.url)?;
    // Checked again although `App::open` does: an embedding app may start the daemon on
    // pools of its own, and without the index concurrent runs could write duplicates.
    crate::db::require_key_index(&db).await?;
    // Installed before the pools are handed out, so that every statement is counted; no
    // count, not even its atomic add, without the endpoint that serves it.
    let metrics = match settings.daemon.listen {
        Some(_) => Some(crate::telemetry::install_prometheus().map_err(DaemonError::Metrics)?),
        None => None,
    };
    let db = match metrics {
        Some(_) => {
            let statements = crate::telemetry::statement_counter();
            db.counting_statements(move || statements.increment(1))
        }
        None => db,
    };
    let holder = Holder::current();
    tracing::info!(instance = holder.as_str(), "Daemon starting.");
    // Before anything compares a time of another instance's (the sweep below does).
    crate::db::follow_clock(db.main(), true).await;
    let abandoned = sweep_abandoned_runs(&db)
        .await
        .map_err(DaemonError::Abandoned)?;
    if abandoned > 0 {
        tracing::warn!(
            runs = abandoned,
            "Marked runs of stopped processes interrupted."
        );
    }

    let cancel = CancellationToken::new();
    let panics = Arc::new(RunPanics::default());
    let tracker = TaskTracker::new();
    let scheduling = Arc::new(AtomicBool::new(false));
    tracker.spawn({
        let (db, cancel) = (db.main().clone(), cancel.clone());
        async move {
            loop {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(crate::db::SYNC_CLOCK_EVERY) => crate::db::follow_clock(&db, false).await,
                }
            }
        }
    });
    let scheduler = JobScheduler::new()
        .await
        .map_err(scheduler_error("creating the scheduler"))?;
    let mut scheduled = 0;
    let wake = Arc::new(tokio::sync::Notify::new());
    let mut jobs_by_provider = std::collections::HashMap::new();
    for provider_settings in settings.providers.values() {
        if !provider_settings.enabled {
            tracing::info!(provider = %provider_settings.name, "Provider disabled; not scheduled.");
            continue;
        }
        let job = Arc::new(ProviderJob {
            db: db.clone(),
            provider: adapter(provider_settings)?,
            settings: provider_settings.clone(),
            lease: LeaseSettings {
                holder: holder.clone(),
                ttl: settings.daemon.lease_ttl,
                keep: false,
            },
            cancel: cancel.clone(),
            panics: panics.clone(),
            wake: wake.clone(),
            schedule: parse_cron(&provider_settings.schedule).map_err(|message| {
                DaemonError::Schedule {
                    provider: provider_settings.name.clone(),
                    message,
                }
            })?,
            full_sync: match &provider_settings.full_sync_schedule {
                Some(expression) => Some(FullPasses::new(
                    parse_cron(expression).map_err(|message| DaemonError::FullSyncSchedule {
                        provider: provider_settings.name.clone(),
                        message,
                    })?,
                    chrono::Utc::now(),
                )),
                None => None,
            },
        });
        jobs_by_provider.insert(provider_settings.name.clone(), job.clone());
        let tracker = tracker.clone();
        let cron = Job::new_async(provider_settings.schedule.as_str(), move |_, _| {
            let job = job.clone();
            let tracker = tracker.clone();
            Box::pin(async move {
                if job.cancel.is_cancelled() {
                    return;
                }
                // Tracked, so shutdown waits for it; the scheduler does not.
                tracker.spawn(async move { fire(&job).await });
            })
        })
        .map_err(scheduler_error(format!(
            "scheduling provider {} with {:?}",
            provider_settings.name, provider_settings.schedule
        )))?;
        scheduler.add(cron).await.map_err(scheduler_error(format!(
            "scheduling provider {}",
            provider_settings.name
        )))?;
        scheduled += 1;
    }
    if settings
        .providers
        .values()
        .any(|provider| provider.webhooks.is_some())
    {
        // Tracked, so shutdown lets a delivery being settled commit.
        tracker.spawn(process_webhooks(
            db.clone(),
            Arc::new(settings.clone()),
            wake.clone(),
            cancel.clone(),
        ));
    }
    let worker = Arc::new(worker::Worker::new(
        db.clone(),
        holder.as_str().to_string(),
        jobs_by_provider.clone(),
        settings.daemon.max_concurrent_runs,
        crate::jobs::RetryPolicy::of(&settings.daemon),
        cancel.clone(),
        wake,
    ));
    let overrides = Arc::new(Overrides {
        db: db.clone(),
        jobs: jobs_by_provider,
        seen: std::sync::Mutex::default(),
    });
    let ticker = {
        let tracker = tracker.clone();
        let cancel = cancel.clone();
        Job::new_async("* * * * * *", move |_, _| {
            let overrides = overrides.clone();
            let tracker = tracker.clone();
            let cancel = cancel.clone();
            Box::pin(async move {
                if !cancel.is_cancelled() {
                    tick_overrides(&overrides, &tracker).await;
                }
            })
        })
        .map_err(scheduler_error("scheduling the connections' own schedules"))?
    };
    scheduler
        .add(ticker)
        .await
        .map_err(scheduler_error("scheduling the connections' own schedules"))?;
    schedule_sweeps(&scheduler, settings, &db).await?;
    if let (Some(notify), Some(secret)) = (&settings.notify, notify_secret) {
        let notifier = notify::Notifier::new(db.main().clone(), notify.clone(), secret)?;
        // Tracked, so shutdown lets the attempts in flight finish.
        tracker.spawn(notifier.run(cancel.clone()));
    }
    scheduler
        .start()
        .await
        .map_err(scheduler_error("starting the scheduler"))?;
    tracker.spawn(worker::work(worker, tracker.clone()));
    scheduling.store(true, Ordering::SeqCst);

    let endpoints = match (settings.daemon.listen, metrics) {
        (Some(listen), Some(metrics)) => {
            let state = endpoints::EndpointState {
                db: db.main().clone(),
                metrics,
                scheduling: scheduling.clone(),
                panics: panics.clone(),
                webhook_providers: Arc::new(
                    settings
                        .providers
                        .iter()
                        .filter(|(_, provider)| provider.webhooks.is_some())
                        .map(|(name, _)| name.clone())
                        .collect(),
                ),
                providers: Arc::new(settings.providers.keys().cloned().collect()),
            };
            Some(
                endpoints::serve(listen, state, cancel.clone())
                    .await
                    .map_err(|source| DaemonError::Listen { listen, source })?,
            )
        }
        _ => None,
    };
    let api = match &settings.api {
        Some(api) => {
            let settings = Arc::new(settings.clone());
            Some(crate::api::serve(api, api_tls, db.clone(), settings, cancel.clone()).await?)
        }
        None => None,
    };
    let watchdog = systemd::spawn_watchdog();
    systemd::ready();
    tracing::info!(providers = scheduled, "Daemon ready.");

    shutdown.await;

    tracing::info!("Shutting down: no new runs; letting pages in flight commit.");
    systemd::stopping();
    scheduling.store(false, Ordering::SeqCst);
    let mut scheduler = scheduler;
    if let Err(error) = scheduler.shutdown().await {
        tracing::warn!(%error, "Stopping the scheduler failed.");
    }
    cancel.cancel();
    tracker.close();
    let grace = settings.daemon.shutdown_grace;
    if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
        tracing::warn!(
            grace_secs = grace.as_secs(),
            "Runs still going after the shutdown grace; they are marked interrupted."
        );
        // Our leases are ours no more once we exit: mark what is left.
        if let Err(error) = crate::lease::interrupt_runs_of(&db, &holder).await {
            tracing::error!(%error, "Marking unfinished runs interrupted failed.");
        }
    }
    if let Some(watchdog) = watchdog {
        watchdog.abort();
    }
    if let Some(endpoints) = endpoints {
        let _ = endpoints.await;
    }
    if let Some(api) = api {
        let _ = api.await;
    }
    tracing::info!("Daemon stopped.");
    Ok(())
}

/// How often the webhook inbox is read for deliveries to settle.
const WEBHOOKS_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Settles the webhook inbox's due deliveries until `cancel`, waking the worker when
/// jobs were queued. Every instance runs it; the claim keeps them apart.
async fn process_webhooks(
    db: DatabasePools,
    settings: Arc<Settings>,
    wake: Arc<tokio::sync::Notify>,
    cancel: CancellationToken,
) {
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(WEBHOOKS_EVERY) => {}
        }
        match crate::jobs::process_due(&db, &settings, crate::db::now()).await {
            Ok(processed) if processed.jobs_queued > 0 => wake.notify_one(),
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "Reading the webhook inbox failed."),
        }
    }
}

/// Schedules the sweeps: the change feed's expired changes, and the expired processed
/// keys when an append-only provider exists.
async fn schedule_sweeps(
    scheduler: &JobScheduler,
    settings: &Settings,
    db: &DatabasePools,
) -> Result<(), DaemonError> {
    if settings
        .providers
        .values()
        .any(|p| matches!(p.write_mode, crate::config::WriteMode::Append { .. }))
    {
        let db = db.clone();
        let sweep = Job::new_async(settings.daemon.key_sweep_schedule.as_str(), move |_, _| {
            let db = db.clone();
            Box::pin(async move {
                if let Err(error) = crate::pipeline::store::sweep_expired_keys(&db).await {
                    tracing::warn!(%error, "Sweeping expired processed keys failed.");
                }
            })
        })
        .map_err(scheduler_error("scheduling the processed-keys sweep"))?;
        scheduler
            .add(sweep)
            .await
            .map_err(scheduler_error("scheduling the processed-keys sweep"))?;
    }
    let retention = settings.changes.retention;
    let sweep = {
        let db = db.clone();
        Job::new_async(settings.changes.sweep_schedule.as_str(), move |_, _| {
            let db = db.clone();
            Box::pin(async move {
                let swept = crate::pipeline::changes::sweep_expired_changes(&db, retention);
                if let Err(error) = swept.await {
                    tracing::warn!(%error, "Sweeping expired changes failed.");
                }
            })
        })
        .map_err(scheduler_error("scheduling the change feed's sweep"))?
    };
    scheduler
        .add(sweep)
        .await
        .map_err(scheduler_error("scheduling the change feed's sweep"))?;
    let retention = crate::retention::scheduled(db.clone(), settings.retention.clone())
        .map_err(scheduler_error("scheduling the history's retention sweep"))?;
    scheduler
        .add(retention)
        .await
        .map_err(scheduler_error("scheduling the history's retention sweep"))?;
    Ok(())
}

/// One firing of a provider's schedule: the slot's job of every enabled, unpaused
/// connection without a schedule of its own is queued, once whatever the number of
/// instances firing it.
async fn fire(job: &ProviderJob) {
    let provider = &job.settings.name;
    // Taken first: the steps below take time, and every instance must name the same slot.
    let slot = slot_of(&job.schedule, chrono::Utc::now());
    let full = job
        .full_sync
        .as_ref()
        .is_some_and(|full_sync| full_sync.take_due(chrono::Utc::now()));
    let mut backoff = Backoff::until(next_slot(&job.schedule, slot));
    let connections = loop {
        match enabled_connections(&job.db, provider, &SyncFilter::default()).await {
            Ok(connections) => break connections,
            Err(error) => {
                if !backoff
                    .wait(&job.cancel, provider, slot, &error, "Listing connections")
                    .await
                {
                    return;
                }
            }
        }
    };
    tracing::debug!(%provider, connections = connections.len(), full, "Schedule fired.");
    // Owed in the database before any claim: a connection busy now, or a run of another
    // instance, makes its full pass at its next run.
    let mut unrecorded = false;
    if full {
        for connection in &connections {
            if let Err(error) = owe_full_pass(&job.db, connection).await {
                tracing::error!(
                    user_id = %connection.user_id,
                    %provider,
                    %error,
                    "Noting the full pass owed failed; this firing makes it if it can."
                );
                unrecorded = true;
            }
        }
    }
    // A paused connection still owes the full passes that fall due, as a busy one does.
    let (paused, connections): (Vec<_>, Vec<_>) = connections
        .into_iter()
        .partition(|connection| connection.paused_at.is_some());
    for connection in &paused {
        tracing::debug!(
            user_id = %connection.user_id,
            %provider,
            "Connection paused; left out of the firing."
        );
    }
    // A connection with a schedule of its own fires on it (`tick_overrides`).
    let connections = connections
        .into_iter()
        .filter(|connection| connection.schedule.is_none())
        .collect();
    let kind = if full {
        JobKind::Full
    } else {
        JobKind::Scheduled
    };
    let overridden = loop {
        match stream_rules(&job.db, Some(provider), true).await {
            Ok(overridden) => break overridden,
            Err(error) => {
                if !backoff
                    .wait(
                        &job.cancel,
                        provider,
                        slot,
                        &error,
                        "Reading the streams' own schedules",
                    )
                    .await
                {
                    return;
                }
            }
        }
    };
    let jobs = slot_jobs(&job.settings, connections, &overridden);
    queue_slot(job, jobs, slot, kind, unrecorded, backoff).await;
}

/// The streams that do not follow their connection's schedule, by connection.
#[derive(Default)]
struct StreamRules {
    /// Those with a schedule of their own.
    own: HashMap<i64, Vec<stream_schedule::Model>>,
    /// Those paused: no schedule queues them.
    paused: HashMap<i64, Vec<String>>,
}

impl StreamRules {
    /// Whether stream `stream` of connection `connection_id` is paused.
    fn is_paused(&self, connection_id: i64, stream: &str) -> bool {
        self.paused
            .get(&connection_id)
            .is_some_and(|paused| paused.iter().any(|name| name == stream))
    }
}

/// The streams with a schedule of their own and, with `paused`, those paused (of
/// `provider`'s connections only, or all).
async fn stream_rules(
    db: &DatabasePools,
    provider: Option<&str>,
    paused: bool,
) -> Result<StreamRules, sea_orm::DbErr> {
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
    let mut connections = sea_orm::sea_query::Query::select()
        .column(connection::Column::Id)
        .from(connection::Entity)
        .to_owned();
    if let Some(provider) = provider {
        connections.and_where(connection::Column::Provider.eq(provider));
    }
    let mut rules = StreamRules::default();
    let query = stream_schedule::Entity::find()
        .filter(stream_schedule::Column::ConnectionId.in_subquery(connections.clone()));
    for row in query.all(db.main()).await? {
        rules.own.entry(row.connection_id).or_default().push(row);
    }
    if paused {
        rules.paused = crate::pipeline::streams::paused_streams(db.main(), connections).await?;
    }
    Ok(rules)
}

/// What a slot of the connections' schedule runs of each: every stream (`""`), or, for a
/// connection some of whose streams have a schedule of their own or are paused, each of
/// the others.
fn slot_jobs(
    settings: &ProviderSettings,
    connections: Vec<connection::Model>,
    rules: &StreamRules,
) -> Vec<(connection::Model, String)> {
    let mut jobs = Vec::with_capacity(connections.len());
    for connection in connections {
        let own = rules.own.get(&connection.id);
        if own.is_none() && !rules.paused.contains_key(&connection.id) {
            jobs.push((connection, String::new()));
            continue;
        }
        for stream in &settings.streams {
            let has_own = own.is_some_and(|own| own.iter().any(|row| row.stream == stream.name));
            if !has_own && !rules.is_paused(connection.id, &stream.name) {
                jobs.push((connection.clone(), stream.name.clone()));
            }
        }
    }
    jobs
}

/// Queues slot `slot` of each `(connection, stream)` as a job, unless an instance queued it
/// already, and wakes the worker. `full` asks for full passes (a firing that could not
/// note the ones owed); `kind` says whether the slot is a full pass's. A database that
/// cannot be reached is tried again within `backoff`.
async fn queue_slot(
    job: &ProviderJob,
    mut connections: Vec<(connection::Model, String)>,
    slot: chrono::DateTime<chrono::Utc>,
    kind: JobKind,
    full: bool,
    mut backoff: Backoff,
) {
    let provider = &job.settings.name;
    if connections.is_empty() {
        return;
    }
    rotate_for(&mut connections, slot);
    let jobs: Vec<NewJob> = connections
        .iter()
        .map(|(connection, stream)| NewJob {
            connection_id: connection.id,
            provider: provider.clone(),
            stream: stream.clone(),
            kind,
            slot_at: Some(slot),
            not_before: slot,
            attempt: 0,
            full,
        })
        .collect();
    let queued = loop {
        // Idempotent: a try that failed after its insert committed only finds its rows.
        match crate::jobs::enqueue(&job.db, &jobs).await {
            Ok(queued) => break queued,
            Err(error) => {
                if !backoff
                    .wait(
                        &job.cancel,
                        provider,
                        slot,
                        &error,
                        "Queueing the slot's jobs",
                    )
                    .await
                {
                    return;
                }
            }
        }
    };
    let taken = u64::try_from(jobs.len())
        .unwrap_or(u64::MAX)
        .saturating_sub(queued);
    if taken > 0 {
        tracing::debug!(%provider, %slot, connections = taken, "Slot taken by another instance.");
    }
    if backoff.tries > 0 {
        tracing::info!(%provider, %slot, jobs = queued, tries = backoff.tries, "Slot queued once the database answered again.");
    } else {
        tracing::debug!(%provider, %slot, jobs = queued, "Slot queued.");
    }
    job.wake.notify_one();
}

/// The first wait before a firing tries its database again; it doubles per try.
const FIRING_RETRY_FIRST: std::time::Duration = std::time::Duration::from_millis(250);
/// The longest wait between two tries of a firing.
const FIRING_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// How a firing whose database cannot be reached (a restart, a failover) tries again:
/// waits from [`FIRING_RETRY_FIRST`] doubling to [`FIRING_RETRY_MAX`], until the daemon
/// shuts down or the schedule's next slot comes. Past that slot its own firing queues the
/// connections' next job, which serves them as the lost one would have: queueing the
/// older slot then would only run each connection twice in a row.
struct Backoff {
    /// No try starts at or after this.
    until: chrono::DateTime<chrono::Utc>,
    next_wait: std::time::Duration,
    /// Failed tries so far.
    tries: u32,
}

impl Backoff {
    fn until(until: chrono::DateTime<chrono::Utc>) -> Backoff {
        Backoff {
            until,
            next_wait: FIRING_RETRY_FIRST,
            tries: 0,
        }
    }

    /// After a failed try of `what`: logs it and waits for the next try. Returns false
    /// (and logs why) when no try is left.
    async fn wait(
        &mut self,
        cancel: &CancellationToken,
        provider: &str,
        slot: chrono::DateTime<chrono::Utc>,
        error: &(dyn std::fmt::Display + Sync),
        what: &str,
    ) -> bool {
        self.tries = self.tries.saturating_add(1);
        let wait = self.next_wait;
        self.next_wait = self.next_wait.saturating_mul(2).min(FIRING_RETRY_MAX);
        let retry_at = chrono::TimeDelta::from_std(wait)
            .ok()
            .and_then(|wait| chrono::Utc::now().checked_add_signed(wait));
        if cancel.is_cancelled() || retry_at.is_none_or(|at| at >= self.until) {
            tracing::error!(
                %provider,
                %slot,
                %error,
                tries = self.tries,
                "{what} failed; the slot is given up and its connections wait for the next one."
            );
            return false;
        }
        tracing::warn!(
            %provider,
            %slot,
            %error,
            tries = self.tries,
            retry_in_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
            "{what} failed; trying again."
        );
        tokio::select! {
            () = cancel.cancelled() => {
                tracing::warn!(%provider, %slot, "Shutting down; the slot is left to the other instances.");
                false
            }
            () = tokio::time::sleep(wait) => true,
        }
    }
}

/// The schedule's first time after `slot` (a year on if it has none, so that a firing
/// still gives up some day).
fn next_slot(
    schedule: &croner::Cron,
    slot: chrono::DateTime<chrono::Utc>,
) -> chrono::DateTime<chrono::Utc> {
    schedule
        .find_next_occurrence(&slot, false)
        .ok()
        .or_else(|| slot.checked_add_signed(chrono::TimeDelta::days(365)))
        .unwrap_or(slot)
}

/// The connections with a schedule of their own, and the slot each was last seen at.
struct Overrides {
    db: DatabasePools,
    jobs: std::collections::HashMap<String, Arc<ProviderJob>>,
    /// By connection and stream (`""`: the connection's own schedule).
    seen: std::sync::Mutex<HashMap<(i64, String), chrono::DateTime<chrono::Utc>>>,
}

/// Every second: the enabled, unpaused connections and streams with a schedule of their
/// own whose slot has come since the last tick are queued, each as a slot job like a
/// provider's firing. One seen for the first time (the daemon started, or its schedule
/// was just set) waits for its next slot.
async fn tick_overrides(overrides: &Overrides, tracker: &TaskTracker) {
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
    let now = chrono::Utc::now();
    // Paused streams are read below, only when some connection has a schedule of its own.
    let mut streams = match stream_rules(&overrides.db, None, false).await {
        Ok(streams) => streams,
        Err(error) => {
            tracing::warn!(%error, "Reading the streams' own schedules failed; retrying at the next tick.");
            return;
        }
    };
    let ids: Vec<i64> = streams.own.keys().copied().collect();
    let rows = connection::Entity::find()
        .filter(
            sea_orm::Condition::any()
                .add(connection::Column::Schedule.is_not_null())
                .add(connection::Column::Id.is_in(ids)),
        )
        .filter(connection::Column::Enabled.eq(true))
        .filter(connection::Column::PausedAt.is_null())
        .all(overrides.db.main())
        .await;
    let rows = match rows {
        Ok(rows) => rows,
        Err(error) => {
            tracing::warn!(%error, "Reading the connections' own schedules failed; retrying at the next tick.");
            return;
        }
    };
    if !rows.is_empty() {
        let of = sea_orm::sea_query::Query::select()
            .column(connection::Column::Id)
            .from(connection::Entity)
            .and_where(connection::Column::Id.is_in(rows.iter().map(|row| row.id)))
            .to_owned();
        match crate::pipeline::streams::paused_streams(overrides.db.main(), of).await {
            Ok(paused) => streams.paused = paused,
            Err(error) => {
                tracing::warn!(%error, "Reading the paused streams failed; retrying at the next tick.");
                return;
            }
        }
    }
    for row in rows {
        let Some(job) = overrides.jobs.get(&row.provider) else {
            continue;
        };
        let mut due = Vec::new();
        if let Some(cron) = row
            .schedule
            .as_deref()
            .and_then(|expression| parse_cron(expression).ok())
        {
            let slot = slot_of(&cron, now);
            if overrides.first_since(row.id, "", slot) {
                let jobs = slot_jobs(&job.settings, vec![row.clone()], &streams);
                due.push((jobs, slot, Backoff::until(next_slot(&cron, slot))));
            }
        }
        for own in streams.own.get(&row.id).into_iter().flatten() {
            let Ok(cron) = parse_cron(&own.schedule) else {
                continue;
            };
            let slot = slot_of(&cron, now);
            if overrides.first_since(row.id, &own.stream, slot)
                && !streams.is_paused(row.id, &own.stream)
            {
                let backoff = Backoff::until(next_slot(&cron, slot));
                due.push((vec![(row.clone(), own.stream.clone())], slot, backoff));
            }
        }
        for (jobs, slot, backoff) in due {
            if jobs.is_empty() || job.cancel.is_cancelled() {
                continue;
            }
            let job = job.clone();
            tracker.spawn(async move {
                queue_slot(&job, jobs, slot, JobKind::Scheduled, false, backoff).await
            });
        }
    }
}

impl Overrides {
    /// Notes `slot` as the latest of the connection's (or one stream's) own schedule;
    /// whether it is a new one since an earlier tick.
    fn first_since(
        &self,
        connection_id: i64,
        stream: &str,
        slot: chrono::DateTime<chrono::Utc>,
    ) -> bool {
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        seen.insert((connection_id, stream.to_string()), slot)
            .is_some_and(|last| last < slot)
    }
}

/// Turns `items` by an amount drawn from `slot`: jobs of one slot are claimed in the
/// order they were queued, and this order changes from slot to slot (the same on every
/// instance), so that no connection is always the last to start.
fn rotate_for<T>(items: &mut [T], slot: chrono::DateTime<chrono::Utc>) {
    if items.is_empty() {
        return;
    }
    // splitmix64's finaliser: consecutive slots, whatever their period, give unrelated
    // turns (a plain remainder repeats whenever the period divides by the count).
    let mut z =
        u64::from_ne_bytes(slot.timestamp().to_ne_bytes()).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    let turn = usize::try_from(z % u64::try_from(items.len()).unwrap_or(1)).unwrap_or(0);
    items.rotate_left(turn);
}

/// The slot a firing at `now` serves: the schedule's latest time at or before it, in
/// whole seconds, so that every instance firing it computes the same value whatever its
/// delay (croner keeps the fraction of the time it searches from).
fn slot_of(
    schedule: &croner::Cron,
    now: chrono::DateTime<chrono::Utc>,
) -> chrono::DateTime<chrono::Utc> {
    use chrono::Timelike;
    let whole = |time: chrono::DateTime<chrono::Utc>| time.with_nanosecond(0).unwrap_or(time);
    schedule
        .find_previous_occurrence(&whole(now), true)
        .map(whole)
        .unwrap_or_else(|_| whole(now))
}

#[cfg(test)]
mod tests {
    use super::provider::FullPasses;
    use crate::config::parse_cron;

    fn at(text: &str) -> chrono::DateTime<chrono::Utc> {
        text.parse().unwrap()
    }

    #[test]
    fn every_connection_is_sometimes_first_in_a_slot_whatever_the_period() {
        for period in [60, 15 * 60, 3600] {
            let mut first = std::collections::BTreeSet::new();
            for n in 0..40 {
                let slot = at("2026-12-02T00:00:00Z") + chrono::Duration::seconds(period * n);
                let mut connections = vec![0, 1, 2, 3];
                super::rotate_for(&mut connections, slot);
                assert_eq!(
                    {
                        let mut sorted = connections.clone();
                        sorted.sort();
                        sorted
                    },
                    [0, 1, 2, 3],
                    "a rotation"
                );
                first.insert(connections[0]);
            }
            assert_eq!(first.len(), 4, "period {period}s: {first:?}");
        }
        let mut none: Vec<u8> = Vec::new();
        super::rotate_for(&mut none, at("2026-12-02T00:00:00Z"));
    }

    #[test]
    fn instances_firing_a_slot_at_different_moments_compute_the_same_slot() {
        let every_six = parse_cron("*/6 * * * * *").unwrap();
        let slot = at("2026-12-02T01:10:06Z");
        for fired in [
            "2026-12-02T01:10:06Z",
            "2026-12-02T01:10:06.020113Z",
            "2026-12-02T01:10:07.5Z",
            "2026-12-02T01:10:11.999Z",
        ] {
            assert_eq!(super::slot_of(&every_six, at(fired)), slot, "{fired}");
        }
        assert_eq!(
            super::slot_of(&every_six, at("2026-12-02T01:10:12.001Z")),
            at("2026-12-02T01:10:12Z")
        );
    }

    #[tokio::test]
    async fn a_firing_tries_its_database_again_until_the_next_slot_or_shutdown() {
        let every_ten = parse_cron("*/10 * * * * *").unwrap();
        let slot = at("2026-12-02T01:10:00Z");
        assert_eq!(
            super::next_slot(&every_ten, slot),
            at("2026-12-02T01:10:10Z")
        );

        let cancel = tokio_util::sync::CancellationToken::new();
        let until = chrono::Utc::now() + chrono::TimeDelta::milliseconds(600);
        let mut backoff = super::Backoff::until(until);
        // 250 ms fits before the next slot; the 500 ms after it would not.
        assert!(
            backoff
                .wait(&cancel, "acme", slot, &"down", "Listing")
                .await
        );
        assert!(
            !backoff
                .wait(&cancel, "acme", slot, &"down", "Listing")
                .await
        );
        assert_eq!(backoff.tries, 2);

        let mut backoff = super::Backoff::until(at("2100-01-01T00:00:00Z"));
        cancel.cancel();
        assert!(
            !backoff
                .wait(&cancel, "acme", slot, &"down", "Listing")
                .await
        );
    }

    #[test]
    fn the_first_firing_at_or_after_each_full_sync_time_is_a_full_pass() {
        // Hourly firings at :00 and a nightly full pass at 03:30: they never share a second.
        let nightly = FullPasses::new(
            parse_cron("0 30 3 * * *").unwrap(),
            at("2026-12-02T01:10:00Z"),
        );
        assert!(!nightly.take_due(at("2026-12-02T02:00:00Z")));
        assert!(!nightly.take_due(at("2026-12-02T03:00:00Z")));
        assert!(nightly.take_due(at("2026-12-02T04:00:00.004Z")));
        assert!(!nightly.take_due(at("2026-12-02T05:00:00Z")));
        assert!(nightly.take_due(at("2026-12-03T04:00:02Z")));
    }

    #[test]
    fn a_firing_due_at_the_full_sync_time_is_a_full_pass_even_when_late() {
        let nightly = FullPasses::new(
            parse_cron("0 0 3 * * *").unwrap(),
            at("2026-12-02T01:00:00Z"),
        );
        assert!(nightly.take_due(at("2026-12-02T03:00:04.200Z")));
        assert!(!nightly.take_due(at("2026-12-02T03:15:00Z")));
    }
}
