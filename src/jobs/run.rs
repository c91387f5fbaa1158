//! Running a claimed job: its connection's streams under the connection's lease, then its
//! end recorded: done, skipped, put back in the queue, or followed by a retry.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use sea_orm::{
    ConnectionTrait, DatabaseTransaction, DbErr, SqliteTransactionMode, TransactionOptions,
    TransactionTrait,
};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use tributary_providers::Provider;

use super::queue::{self, NewJob};
use crate::config::{parse_cron, DaemonSettings, ProviderSettings, StreamSettings};
use crate::db::DatabasePools;
use crate::entities::connection;
use crate::entities::sync_job::{self, JobKind, JobStatus};
use crate::entities::sync_run::{RunStatus, Trigger};
use crate::lease::{release, Holder};
use crate::pipeline::{CloseStep, ProgressSink, RunClosed, RunOptions};
use crate::sync::{sync_provider, LeaseSettings, SyncReport};

/// When a job whose run failed is tried again.
#[derive(Clone, Debug)]
pub(crate) struct RetryPolicy {
    /// Tries after the first (0: none).
    pub retries: u32,
    pub delay: Duration,
    pub max_delay: Duration,
}

impl RetryPolicy {
    pub(crate) fn of(settings: &DaemonSettings) -> RetryPolicy {
        RetryPolicy {
            retries: settings.retries,
            delay: settings.retry_delay,
            max_delay: settings.retry_max_delay,
        }
    }

    /// The wait before retry `attempt` (1 for the first): `delay` doubled per attempt up
    /// to `max_delay`, then placed at `jitter` (0 to 1) within its upper half, so that the
    /// failures of one outage come back spread out, never at once.
    pub(crate) fn backoff(&self, attempt: u32, jitter: f64) -> Duration {
        let doublings = attempt.saturating_sub(1).min(31);
        let full = self
            .delay
            .checked_mul(1u32 << doublings)
            .unwrap_or(self.max_delay)
            .min(self.max_delay);
        let half = full / 2;
        half + half.mul_f64(jitter.clamp(0.0, 1.0))
    }
}

/// What a job runs with.
pub(crate) struct JobContext<'a> {
    pub db: &'a DatabasePools,
    pub settings: &'a ProviderSettings,
    pub provider: &'a dyn Provider,
    pub lease: &'a LeaseSettings,
    /// Cancelled on shutdown or when someone asks to cancel the job: the runs stop
    /// between pages.
    pub cancel: &'a CancellationToken,
    /// `None`: a failed run is not retried (a run someone watches, as `tributary sync`).
    pub retry: Option<&'a RetryPolicy>,
    pub progress: &'a dyn ProgressSink,
}

/// Runs the claimed `job` of `connection` (as the claim read it; `None`: removed) but
/// for its `paused_streams`, and records its end. Returns the runs it made, if any.
pub(crate) async fn run(
    context: &JobContext<'_>,
    job: &sync_job::Model,
    connection: Option<connection::Model>,
    paused_streams: &[String],
) -> Option<SyncReport> {
    let span = tracing::debug_span!(
        "job",
        job_id = job.id,
        connection_id = job.connection_id,
        provider = %job.provider,
        stream = %job.stream,
        kind = ?job.kind,
        attempt = job.attempt,
        runs = tracing::field::Empty,
        outcome = tracing::field::Empty,
        "otel.status_code" = tracing::field::Empty,
    );
    let report = match run_and_record(context, job, connection, paused_streams)
        .instrument(span.clone())
        .await
    {
        Ok(report) => report,
        Err(error) => {
            span.record("otel.status_code", "ERROR");
            tracing::error!(parent: &span, job_id = job.id, %error, "Recording the job's end failed.");
            None
        }
    };
    let outcomes = report
        .as_ref()
        .map_or(&[][..], |report| &report.outcomes[..]);
    // The job's outcome is its worst run's: one failed run fails the job.
    let worst = outcomes
        .iter()
        .map(|outcome| outcome.status)
        .find(|status| *status == RunStatus::Failed)
        .or_else(|| outcomes.last().map(|outcome| outcome.status));
    span.record("runs", i64::try_from(outcomes.len()).unwrap_or(i64::MAX));
    match worst {
        Some(status) => span.record("outcome", tracing::field::display(status)),
        None => span.record("outcome", "no_run"),
    };
    if worst == Some(RunStatus::Failed) {
        span.record("otel.status_code", "ERROR");
    }
    report
}

async fn run_and_record(
    context: &JobContext<'_>,
    job: &sync_job::Model,
    connection: Option<connection::Model>,
    paused_streams: &[String],
) -> Result<Option<SyncReport>, DbErr> {
    let db = context.db;
    // A slot superseded by a later one was skipped by the claim already.
    let Some(connection) = connection else {
        return skip(context, job, "the connection was removed").await;
    };
    if !connection.enabled {
        return skip(context, job, "the connection is disabled").await;
    }
    if connection.paused_at.is_some() && job.kind != JobKind::Manual {
        return skip(context, job, "the connection is paused").await;
    }
    // A revoked authorization would only be refused again; a manual sync runs once to
    // check, and its success clears the state.
    if connection.needs_reconnect_since.is_some() && job.kind != JobKind::Manual {
        return skip(context, job, "the connection needs a reconnect").await;
    }
    let streams: Vec<StreamSettings> = if job.stream.is_empty() {
        context.settings.streams.clone()
    } else {
        match context.settings.stream(&job.stream) {
            Some(stream) => vec![stream.clone()],
            None => {
                let why = format!("the provider no longer syncs a stream {:?}", job.stream);
                return skip(context, job, &why).await;
            }
        }
    };
    // A paused stream, as a paused connection, runs only when someone asks for it.
    let (paused, streams): (Vec<_>, Vec<_>) = streams
        .into_iter()
        .partition(|stream| job.kind != JobKind::Manual && paused_streams.contains(&stream.name));
    if streams.is_empty() {
        let names: Vec<&str> = paused.iter().map(|stream| stream.name.as_str()).collect();
        let why = format!("its streams are paused ({})", names.join(", "));
        return skip(context, job, &why).await;
    }
    let options = RunOptions {
        trigger: match job.kind {
            JobKind::Manual => Trigger::Manual,
            _ => Trigger::Schedule,
        },
        full: job.full,
        cancel: context.cancel.child_token(),
        stream: None,
        lease: None,
        yield_after: Some(context.settings.max_run_duration),
    };
    // The lease is released with the job's end, in one transaction.
    let lease = LeaseSettings {
        keep: true,
        ..context.lease.clone()
    };
    let end_with_close = EndWithClose {
        job_id: job.id,
        job_holder: holder_of(job),
        connection: &connection,
        holder: &context.lease.holder,
        ended: AtomicBool::new(false),
    };
    let report = sync_provider(
        db,
        context.settings,
        context.provider,
        vec![connection.clone()],
        &streams,
        &options,
        &lease,
        context.progress,
        Some(&end_with_close),
    )
    .await;
    let report = match report {
        Ok(report) => report,
        Err(error) => {
            let outcome = format!("its runs could not be recorded: {error}");
            queue::finish(db, job.id, holder_of(job), JobStatus::Failed, outcome).await?;
            return Ok(None);
        }
    };
    if end_with_close.ended.load(Ordering::SeqCst) {
        return Ok(Some(report));
    }
    // A connection skipped as busy was not claimed; otherwise its lease is held still.
    let held = report.skipped.is_empty();
    let ended = end_and_release(context, job, &connection, &report, held).await;
    if ended.is_err() && held {
        // The job's end is lost with the error; the lease must not wait out its expiry.
        if let Err(error) = release(db, &connection, &context.lease.holder).await {
            tracing::warn!(job_id = job.id, %error, "Releasing the connection's lease failed; it expires.");
        }
    }
    ended?;
    Ok(Some(report))
}

/// The end of a job of one stream whose run succeeded, and the lease's release, written
/// in the transaction that closes the run: what [`record_end`] would write for it (the
/// job `done`, naming the run), one transaction sooner. A run that ended otherwise leaves
/// the job's end to [`end_and_release`].
struct EndWithClose<'a> {
    job_id: i64,
    /// Who claimed the job: its end is written only while it still holds it.
    job_holder: &'a str,
    connection: &'a connection::Model,
    holder: &'a Holder,
    /// Set once the writes are made; they hold only if the close then commits.
    ended: AtomicBool,
}

impl CloseStep for EndWithClose<'_> {
    fn write<'t>(
        &'t self,
        txn: &'t DatabaseTransaction,
        run_id: i64,
        closed: &'t RunClosed,
    ) -> BoxFuture<'t, Result<(), DbErr>> {
        Box::pin(async move {
            if closed.status != RunStatus::Succeeded {
                return Ok(());
            }
            let outcome = format!("run {run_id} {}", closed.status);
            queue::finish(txn, self.job_id, self.job_holder, JobStatus::Done, outcome).await?;
            // After the job's row, as in `end_and_release`.
            release(txn, self.connection, self.holder).await?;
            self.ended.store(true, Ordering::SeqCst);
            Ok(())
        })
    }
}

/// Records how the job's runs ended and releases the connection's lease (`held`) in one
/// transaction: a crash leaves both as they were (the job `running`, re-queued once its
/// instance is gone; the lease held until it expires) or neither.
async fn end_and_release(
    context: &JobContext<'_>,
    job: &sync_job::Model,
    connection: &connection::Model,
    report: &SyncReport,
    held: bool,
) -> Result<(), DbErr> {
    // SQLite: the write lock up front, since the transaction reads before it writes.
    let txn = context
        .db
        .begin_with_options(TransactionOptions {
            sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
            ..TransactionOptions::default()
        })
        .await?;
    if queue::still_holds(&txn, job.id, holder_of(job)).await? {
        record_end(&txn, context, job, connection, report).await?;
    } else {
        tracing::warn!(
            job_id = job.id,
            "The job had moved on (its instance was taken for gone); its end, retry and rest are left to its new holder."
        );
    }
    if held {
        // After the job's row: the connection's row stays locked the shortest.
        release(&txn, connection, &context.lease.holder).await?;
    }
    txn.commit().await
}

async fn skip(
    context: &JobContext<'_>,
    job: &sync_job::Model,
    why: &str,
) -> Result<Option<SyncReport>, DbErr> {
    tracing::info!(job_id = job.id, reason = why, "Job skipped.");
    queue::finish(
        context.db,
        job.id,
        holder_of(job),
        JobStatus::Skipped,
        why.to_string(),
    )
    .await?;
    Ok(None)
}

/// Records how the job's runs ended.
async fn record_end(
    db: &impl ConnectionTrait,
    context: &JobContext<'_>,
    job: &sync_job::Model,
    connection: &connection::Model,
    report: &SyncReport,
) -> Result<(), DbErr> {
    let now = crate::db::now();
    if let Some(busy) = report.skipped.first() {
        // A slot finds the connection's run going: that run serves it (a full pass stays
        // owed in `connection_streams`). A run someone asked for, a retry or a re-queued
        // job waits for the lease instead, or it would be lost.
        let held = format!(
            "a run of the connection was going (held by {})",
            busy.holder
        );
        return match job.kind {
            JobKind::Scheduled | JobKind::Full if job.attempt == 0 => {
                queue::finish(db, job.id, holder_of(job), JobStatus::Skipped, held).await
            }
            _ => {
                let at = busy.until.filter(|until| *until > now).unwrap_or(now);
                let at = at
                    .checked_add_signed(chrono::TimeDelta::seconds(1))
                    .unwrap_or(at);
                queue::requeue(db, job.id, holder_of(job), at, format!("waiting: {held}")).await
            }
        };
    }
    let runs: Vec<String> = report
        .outcomes
        .iter()
        .map(|outcome| format!("run {} {}", outcome.run_id, outcome.status))
        .collect();
    let mut outcome = runs.join(", ");
    let stopped = context.cancel.is_cancelled()
        && report
            .outcomes
            .iter()
            .any(|outcome| outcome.status == RunStatus::Interrupted);
    let stopped_before_a_run = context.cancel.is_cancelled() && report.outcomes.is_empty();
    if (stopped || stopped_before_a_run) && queue::is_cancel_requested(db, job.id).await? {
        // Asked to stop: no retry, no resume job; the next run of the stream goes on
        // from the checkpoint its committed pages left.
        if !outcome.is_empty() {
            outcome.push_str("; ");
        }
        outcome.push_str("cancelled on request, its committed pages kept");
        return queue::finish(db, job.id, holder_of(job), JobStatus::Cancelled, outcome).await;
    }
    if stopped {
        if job.kind == JobKind::Scheduled || job.kind == JobKind::Full {
            // The connection's next slot goes on from the checkpoint.
            return queue::finish(db, job.id, holder_of(job), JobStatus::Interrupted, outcome)
                .await;
        }
        // Asked for: another instance (or this one, restarted) finishes it.
        outcome.push_str("; re-queued: the instance shut down");
        return queue::requeue(db, job.id, holder_of(job), now, outcome).await;
    }
    // A run that yielded its turn goes on now, behind the jobs already due (their
    // `not_before` is earlier); one whose request budget is spent, when it reopens.
    let deferred_to = report
        .outcomes
        .iter()
        .filter(|outcome| outcome.status == RunStatus::Deferred)
        .filter_map(|outcome| outcome.resume_at)
        .max();
    let yielded = report.outcomes.iter().any(|outcome| outcome.yielded);
    if let Some(resume_at) = deferred_to.or(yielded.then_some(now)) {
        queue::enqueue(
            db,
            &[NewJob {
                connection_id: job.connection_id,
                provider: job.provider.clone(),
                stream: job.stream.clone(),
                kind: JobKind::Resume,
                slot_at: None,
                not_before: resume_at.max(now),
                attempt: job.attempt,
                full: job.full,
            }],
        )
        .await?;
        match deferred_to {
            Some(at) => outcome.push_str(&format!(
                "; deferred: the request budget is spent, the rest queued for {at}"
            )),
            None => outcome.push_str("; yielded after max_run_duration, the rest queued"),
        }
    }
    let failed = report
        .outcomes
        .iter()
        .any(|outcome| outcome.status == RunStatus::Failed);
    if let (true, Some(policy)) = (failed, context.retry) {
        if let Some(note) = retry(db, context, policy, job, connection, now).await? {
            outcome.push_str("; ");
            outcome.push_str(&note);
        }
    }
    queue::finish(db, job.id, holder_of(job), JobStatus::Done, outcome).await
}

/// Queues the retry of a job whose run failed, unless its tries are spent or the
/// connection's next slot comes first (that slot is the retry). Returns what was decided.
async fn retry(
    db: &impl ConnectionTrait,
    context: &JobContext<'_>,
    policy: &RetryPolicy,
    job: &sync_job::Model,
    connection: &connection::Model,
    now: DateTime<Utc>,
) -> Result<Option<String>, DbErr> {
    let attempt = u32::try_from(job.attempt).unwrap_or(0).saturating_add(1);
    if attempt > policy.retries {
        return Ok(Some(format!(
            "not retried: {} retries spent",
            policy.retries
        )));
    }
    let wait = policy.backoff(attempt, rand::random::<f64>());
    let Some(at) = chrono::TimeDelta::from_std(wait)
        .ok()
        .and_then(|wait| now.checked_add_signed(wait))
    else {
        return Ok(None);
    };
    let schedule = connection
        .schedule
        .as_deref()
        .unwrap_or(&context.settings.schedule);
    if let Some(next) = next_slot(schedule, now) {
        if next <= at {
            return Ok(Some(format!("the slot at {next} retries it")));
        }
    }
    queue::enqueue(
        db,
        &[NewJob {
            connection_id: job.connection_id,
            provider: job.provider.clone(),
            stream: job.stream.clone(),
            kind: JobKind::Retry,
            slot_at: None,
            not_before: at,
            attempt: i32::try_from(attempt).unwrap_or(i32::MAX),
            full: job.full,
        }],
    )
    .await?;
    tracing::info!(
        job_id = job.id,
        user_id = %connection.user_id,
        provider = %connection.provider,
        attempt,
        at = %at,
        "A run failed; retry queued."
    );
    Ok(Some(format!("retry {attempt} queued for {at}")))
}

/// Records how the jobs of a sync run on the spot ended (`tributary sync`: one claimed
/// job per connection, see [`super::insert_claimed`]): skipped when the connection's run
/// was going elsewhere, interrupted when stopped, else done, with their runs.
pub(crate) async fn finish_on_the_spot(
    db: &DatabasePools,
    holder: &str,
    jobs: &[(connection::Model, i64)],
    report: &SyncReport,
) -> Result<(), DbErr> {
    for (connection, job_id) in jobs {
        let mine = |user: &str, provider: &str| {
            user == connection.user_id && provider == connection.provider
        };
        let (status, outcome) = match report
            .skipped
            .iter()
            .find(|skipped| mine(&skipped.user_id, &skipped.provider))
        {
            Some(skipped) => (
                JobStatus::Skipped,
                format!(
                    "a run of the connection was going (held by {})",
                    skipped.holder
                ),
            ),
            None => {
                let runs: Vec<_> = report
                    .outcomes
                    .iter()
                    .filter(|outcome| mine(&outcome.user_id, &outcome.provider))
                    .collect();
                let status = if runs
                    .iter()
                    .any(|outcome| outcome.status == RunStatus::Interrupted)
                {
                    JobStatus::Interrupted
                } else {
                    JobStatus::Done
                };
                let runs: Vec<String> = runs
                    .iter()
                    .map(|outcome| format!("run {} {}", outcome.run_id, outcome.status))
                    .collect();
                (status, runs.join(", "))
            }
        };
        queue::finish(db, *job_id, holder, status, outcome).await?;
    }
    Ok(())
}

/// Who claimed `job` (as the claim read it).
fn holder_of(job: &sync_job::Model) -> &str {
    job.holder.as_deref().unwrap_or_default()
}

/// The schedule's next time after `now`.
fn next_slot(schedule: &str, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    parse_cron(schedule)
        .ok()?
        .find_next_occurrence(&now, false)
        .ok()
}

#[cfg(test)]
mod tests {
    use super::RetryPolicy;
    use std::time::Duration;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            retries: 5,
            delay: Duration::from_secs(60),
            max_delay: Duration::from_secs(600),
        }
    }

    #[test]
    fn the_backoff_doubles_per_attempt_within_its_upper_half() {
        let policy = policy();
        assert_eq!(policy.backoff(1, 0.0), Duration::from_secs(30));
        assert_eq!(policy.backoff(1, 1.0), Duration::from_secs(60));
        assert_eq!(policy.backoff(2, 0.0), Duration::from_secs(60));
        assert_eq!(policy.backoff(3, 1.0), Duration::from_secs(240));
    }

    #[test]
    fn the_backoff_stops_at_its_cap_whatever_the_attempt() {
        let policy = policy();
        assert_eq!(policy.backoff(5, 1.0), Duration::from_secs(600));
        assert_eq!(policy.backoff(u32::MAX, 1.0), Duration::from_secs(600));
        assert_eq!(policy.backoff(u32::MAX, 0.0), Duration::from_secs(300));
    }

    #[test]
    fn jitter_spreads_the_retries_of_one_outage() {
        let policy = policy();
        let waits: std::collections::BTreeSet<Duration> = (0..20)
            .map(|i| policy.backoff(2, f64::from(i) / 20.0))
            .collect();
        assert_eq!(waits.len(), 20);
        assert!(waits
            .iter()
            .all(|wait| *wait >= Duration::from_secs(60) && *wait <= Duration::from_secs(120)));
    }
}
