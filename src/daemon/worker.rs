//! The daemon's worker: claims due jobs from `sync_jobs`, the most urgent first, as many
//! as its bounds allow (`[daemon] max_concurrent_runs` in all, each provider's
//! `max_concurrent_connections`), runs each under its connection's lease, stops the runs
//! of jobs someone asked to cancel (`sync_jobs.cancel_requested_at`, read every
//! [`POLL_EVERY`]), and re-queues the jobs of instances that stopped.
//!
//! The queue is looked at when this instance queued jobs, when one of its runs ended and
//! every [`POLL_EVERY`]. A provider whose last look found no more due jobs is looked at
//! with one read that locks nothing before a claim's transaction, and not at all when
//! one of its runs ends within [`POLL_EVERY`] of that look: a run's end queues nothing
//! due before then but a yielded run's rest, which waits at most that long.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::provider::ProviderJob;
use crate::db::DatabasePools;
use crate::jobs::{JobContext, RetryPolicy};
use crate::pipeline::NoProgress;

/// How often the queue is read whatever wakes the worker: jobs other instances queue,
/// retries and re-queued jobs become due without a local signal.
const POLL_EVERY: Duration = Duration::from_secs(1);
/// How often the jobs of stopped instances are looked for.
const ORPHANS_EVERY: Duration = Duration::from_secs(5);

pub(super) struct Worker {
    pub db: DatabasePools,
    /// This instance's holder (`host:pid:nonce`).
    pub holder: String,
    pub providers: HashMap<String, Arc<ProviderJob>>,
    pub max_runs: usize,
    pub retry: RetryPolicy,
    pub cancel: CancellationToken,
    /// Rung when jobs were queued here.
    pub wake: Arc<Notify>,
    /// Rung when a run of this worker ended.
    ended: Notify,
    /// The providers whose last look at the queue found no more due jobs, and when.
    drained: Mutex<HashMap<String, Instant>>,
    running: AtomicUsize,
    by_provider: Mutex<HashMap<String, usize>>,
    /// Which provider's jobs are claimed first next: turns round, so that no provider
    /// always waits for the others' claims.
    turn: AtomicUsize,
    /// The jobs running here, each with the token that stops its runs: the cancel
    /// requests in the database are matched against these ids.
    running_jobs: Mutex<HashMap<i64, CancellationToken>>,
}

impl Worker {
    pub(super) fn new(
        db: DatabasePools,
        holder: String,
        providers: HashMap<String, Arc<ProviderJob>>,
        max_runs: usize,
        retry: RetryPolicy,
        cancel: CancellationToken,
        wake: Arc<Notify>,
    ) -> Worker {
        Worker {
            db,
            holder,
            providers,
            max_runs,
            retry,
            cancel,
            wake,
            ended: Notify::new(),
            drained: Mutex::default(),
            running: AtomicUsize::new(0),
            by_provider: Mutex::default(),
            turn: AtomicUsize::new(0),
            running_jobs: Mutex::default(),
        }
    }

    /// A token for job `job_id`'s runs, stopped by a shutdown or by a cancel request.
    fn job_started(&self, job_id: i64) -> CancellationToken {
        let token = self.cancel.child_token();
        self.running_jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(job_id, token.clone());
        token
    }

    fn job_ended(&self, job_id: i64) {
        self.running_jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&job_id);
    }

    /// Notes whether the last look at `provider`'s queue found no more due jobs.
    fn note_drained(&self, provider: &str, drained: bool) {
        let mut by_provider = self.drained.lock().unwrap_or_else(PoisonError::into_inner);
        if drained {
            by_provider.insert(provider.to_string(), Instant::now());
        } else {
            by_provider.remove(provider);
        }
    }

    fn running_of(&self, provider: &str) -> usize {
        self.by_provider
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(provider)
            .copied()
            .unwrap_or(0)
    }

    fn count(&self, provider: &str, started: bool) {
        let mut by_provider = self
            .by_provider
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let running = by_provider.entry(provider.to_string()).or_insert(0);
        if started {
            *running = running.saturating_add(1);
            self.running.fetch_add(1, Ordering::SeqCst);
        } else {
            *running = running.saturating_sub(1);
            self.running.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// What made the worker look at the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Look {
    /// [`POLL_EVERY`] passed, or jobs were queued here.
    Poll,
    /// A run of this worker ended.
    RunEnded,
}

/// Claims and runs jobs until `worker.cancel`; the runs it started are tracked by
/// `tracker`, so shutdown waits for them.
pub(super) async fn work(worker: Arc<Worker>, tracker: TaskTracker) {
    let mut orphans_checked: Option<Instant> = None;
    let mut polls = tokio::time::interval(POLL_EVERY);
    polls.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut look = Look::Poll;
    loop {
        if worker.cancel.is_cancelled() {
            return;
        }
        if orphans_checked.is_none_or(|at| at.elapsed() >= ORPHANS_EVERY) {
            orphans_checked = Some(Instant::now());
            requeue_orphans(&worker).await;
        }
        claim_and_start(&worker, &tracker, look).await;
        look = tokio::select! {
            () = worker.cancel.cancelled() => return,
            () = worker.wake.notified() => Look::Poll,
            () = worker.ended.notified() => Look::RunEnded,
            _ = polls.tick() => {
                // Once a poll interval, not at every run's end: a cancel request is
                // answered within it.
                stop_cancelled(&worker).await;
                Look::Poll
            }
        };
    }
}

async fn requeue_orphans(worker: &Worker) {
    // `host:pid:` of this process: its own jobs are never orphans.
    let own = worker
        .holder
        .rsplit_once(':')
        .map_or(worker.holder.as_str(), |(prefix, _)| prefix);
    let own = format!("{own}:");
    match crate::jobs::requeue_orphans(&worker.db, &own, crate::db::now()).await {
        Ok(0) => {}
        Ok(jobs) => tracing::warn!(
            jobs,
            "Jobs of instances that stopped were put back in the queue."
        ),
        Err(error) => tracing::warn!(%error, "Looking for jobs of stopped instances failed."),
    }
}

/// Stops the runs of the jobs running here that someone asked to cancel, whichever
/// instance took the request: one query for all of them, every [`POLL_EVERY`].
async fn stop_cancelled(worker: &Worker) {
    let ids: Vec<i64> = worker
        .running_jobs
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .filter(|(_, token)| !token.is_cancelled())
        .map(|(id, _)| *id)
        .collect();
    let requested = match crate::jobs::cancel_requested(&worker.db, ids).await {
        Ok(requested) => requested,
        Err(error) => {
            tracing::warn!(%error, "Reading the jobs asked to cancel failed; trying again at the next poll.");
            return;
        }
    };
    let running = worker
        .running_jobs
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    for job_id in requested {
        if let Some(token) = running.get(&job_id) {
            tracing::info!(job_id, "Job asked to cancel; its run stops between pages.");
            token.cancel();
        }
    }
}

/// Whether provider `name`'s queue may hold due jobs, looked at for `look`: a provider
/// whose last look found none is skipped when a run ended within [`POLL_EVERY`] of it,
/// and otherwise read (one statement) before a claim's transaction is begun.
async fn may_be_due(worker: &Worker, name: &str, look: Look) -> bool {
    let drained_at = worker
        .drained
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(name)
        .copied();
    let Some(drained_at) = drained_at else {
        return true;
    };
    if look == Look::RunEnded && drained_at.elapsed() < POLL_EVERY {
        return false;
    }
    match crate::jobs::any_due(&worker.db, name, crate::db::now()).await {
        Ok(true) => true,
        Ok(false) => {
            worker.note_drained(name, true);
            false
        }
        Err(error) => {
            tracing::warn!(provider = %name, %error, "Reading the queue failed; trying again at the next poll.");
            false
        }
    }
}

/// At most this many claims in a row that each only skipped superseded slots.
const SUPERSEDED_ROUNDS: usize = 64;

/// Claims up to `room` of provider `name`'s due jobs. A claim that only skipped slots
/// superseded by later ones (a backed-up queue) is followed by another at once: waiting
/// a poll after each would skip `room` slots a second, fewer than a large fleet queues,
/// and the queue would grow while nothing ran. `None`: the claim failed (logged).
async fn claim_past_superseded(
    worker: &Worker,
    name: &str,
    room: usize,
) -> Option<Vec<crate::jobs::Claimed>> {
    for _ in 0..SUPERSEDED_ROUNDS {
        let claimed = crate::jobs::claim(
            &worker.db,
            name,
            &worker.holder,
            u64::try_from(room).unwrap_or(u64::MAX),
            // Due by the database's clock, which every instance shares.
            crate::db::now(),
        )
        .await;
        let claims = match claimed {
            Ok(claims) => claims,
            Err(error) => {
                tracing::warn!(provider = %name, %error, "Claiming jobs failed; trying again at the next poll.");
                return None;
            }
        };
        worker.note_drained(name, !claims.more_due);
        let only_skipped = claims.claimed.is_empty() && claims.superseded > 0 && claims.more_due;
        if !only_skipped || worker.cancel.is_cancelled() {
            return Some(claims.claimed);
        }
    }
    Some(Vec::new())
}

/// Claims as many due jobs as the bounds leave room for, provider by provider, and
/// starts their runs.
async fn claim_and_start(worker: &Arc<Worker>, tracker: &TaskTracker, look: Look) {
    let mut names: Vec<&String> = worker.providers.keys().collect();
    names.sort();
    if names.is_empty() {
        return;
    }
    let first = worker.turn.fetch_add(1, Ordering::SeqCst) % names.len();
    names.rotate_left(first);
    for name in names {
        let Some(job) = worker.providers.get(name) else {
            continue;
        };
        let free = worker
            .max_runs
            .saturating_sub(worker.running.load(Ordering::SeqCst));
        let provider_free = job
            .settings
            .max_concurrent_connections
            .saturating_sub(worker.running_of(name));
        let room = free.min(provider_free);
        if room == 0 || worker.cancel.is_cancelled() || !may_be_due(worker, name, look).await {
            continue;
        }
        let Some(claimed) = claim_past_superseded(worker, name, room).await else {
            continue;
        };
        for crate::jobs::Claimed {
            job: claimed_job,
            connection,
            paused_streams,
        } in claimed
        {
            worker.count(name, true);
            let cancel = worker.job_started(claimed_job.id);
            let (worker, provider_job) = (worker.clone(), job.clone());
            tracker.spawn(async move {
                tracing::debug!(
                    job_id = claimed_job.id,
                    kind = %claimed_job.kind,
                    provider = %claimed_job.provider,
                    "Job claimed."
                );
                let context = JobContext {
                    db: &provider_job.db,
                    settings: &provider_job.settings,
                    provider: provider_job.provider.as_ref(),
                    lease: &provider_job.lease,
                    cancel: &cancel,
                    retry: Some(&worker.retry),
                    progress: &NoProgress,
                };
                if let Some(report) =
                    crate::jobs::run(&context, &claimed_job, connection, &paused_streams).await
                {
                    for outcome in &report.outcomes {
                        provider_job.panics.note(outcome);
                    }
                }
                worker.job_ended(claimed_job.id);
                worker.count(&claimed_job.provider, false);
                worker.ended.notify_one();
            });
        }
    }
}
