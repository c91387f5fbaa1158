//! The one pipeline that stores every provider's records.
//!
//! [`sync_connection`] is the single-step entry point: it opens a [`Run`] (a `sync_runs`
//! row), asks the provider for one page at a time, has the run store each page in one
//! transaction ([`Run::store`]), and closes the run with its status ([`Run::close`]).
//! Tests drive it directly; the CLI and the daemon call it for each connection.

mod budget;
pub mod changes;
pub(crate) mod checkpoint;
pub(crate) mod credential_store;
mod deletions;
pub(crate) mod fence;
mod ground;
mod outbox;
mod parents;
pub(crate) mod records;
pub(crate) mod replay;
mod run;
pub mod store;
pub(crate) mod streams;
mod walk;

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use futures::FutureExt;
use sea_orm::DbErr;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use tributary_providers::{FetchError, Provider};

use crate::config::{ProviderSettings, StreamSettings};
use crate::db::DatabasePools;
use crate::entities::connection;
pub use crate::lease::Fence;

pub use checkpoint::{Checkpoint, CheckpointMove};
pub use deletions::DeletionPass;
pub(crate) use ground::row::{duplicate_keys, StoredKey};
pub use ground::{PageStoreCounts, RunCounts};
pub(crate) use run::{CloseStep, OpenedRun, RunStatus, Trigger};
pub use run::{Run, RunClosed, RunEnd, RunOutcome, RunPage};
pub use store::context::PageExpectation;

pub(crate) use budget::take_one_from;
use checkpoint::stored_cursor;
pub use walk::NoProgress;
pub(crate) use walk::ProgressSink;
use walk::{walk_listing, Committed, RunContext, RunFault};

/// How a run is asked for.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub trigger: Trigger,
    /// Ignore the incremental cursor and walk the whole listing.
    pub full: bool,
    /// Stops the run between pages (shutdown, or a lost lease); the page being stored
    /// still commits, and the run ends `interrupted` with its checkpoint kept.
    pub cancel: CancellationToken,
    /// The stream to sync; `None`: the kind's primary stream.
    pub stream: Option<StreamSettings>,
    /// The connection's lease the run holds (`sync` claims it): every write of the run is
    /// conditional on the connection's row still holding it. `None`: the caller holds no
    /// lease, and the run's writes are conditional on its row being `running` only.
    pub lease: Option<Fence>,
    /// Stop between pages once the run has taken this long, after at least one page, and
    /// end `partial` with the checkpoint kept (`max_run_duration`, for runs of the queue:
    /// a long first sync gives other connections' due jobs their turn). `None`: no limit
    /// but `run_timeout`.
    pub yield_after: Option<std::time::Duration>,
}

impl RunOptions {
    /// A manual, incremental run of the primary stream.
    pub fn manual() -> RunOptions {
        RunOptions {
            trigger: Trigger::Manual,
            full: false,
            cancel: CancellationToken::new(),
            stream: None,
            lease: None,
            yield_after: None,
        }
    }
}

/// Syncs one stream of one connection once: one `sync_runs` row, pages stored as they
/// arrive.
///
/// Returns `Err` only when the run could not be recorded at all (the database is down);
/// every other failure is in the returned outcome's status and error.
pub async fn sync_connection(
    db: &DatabasePools,
    provider: &dyn Provider,
    settings: &ProviderSettings,
    connection: &connection::Model,
    options: RunOptions,
    progress: &dyn ProgressSink,
) -> Result<RunOutcome, DbErr> {
    let hooks = RunHooks::default();
    sync_opened(db, provider, settings, connection, options, progress, hooks).await
}

/// What a caller inside the crate brings to a run besides its options.
#[derive(Default)]
pub(crate) struct RunHooks<'h> {
    /// The run's row, inserted in the transaction that claimed the connection's lease
    /// ([`Run::open_in`]); `None`: the run opens its row itself.
    pub opened: Option<OpenedRun>,
    /// Writes that commit with the run's close ([`Run::close_with`]).
    pub with_close: Option<&'h dyn CloseStep>,
}

/// [`sync_connection`] with `hooks`.
pub(crate) async fn sync_opened(
    db: &DatabasePools,
    provider: &dyn Provider,
    settings: &ProviderSettings,
    connection: &connection::Model,
    options: RunOptions,
    progress: &dyn ProgressSink,
    hooks: RunHooks<'_>,
) -> Result<RunOutcome, DbErr> {
    let started = Instant::now();
    let RunOptions {
        trigger,
        full,
        cancel,
        stream,
        lease,
        yield_after,
    } = options;
    let stream_settings = match stream {
        Some(stream) => stream,
        None => settings.primary_stream(),
    };
    let lease = lease.as_ref();
    let run = match hooks.opened {
        Some(opened) => Run::opened(db, connection, opened, lease),
        None => Run::open(db, connection, &stream_settings, trigger, lease).await?,
    };
    let run_id = run.id();
    let span = tracing::info_span!(
        "run",
        run_id,
        user_id = %connection.user_id,
        provider = %connection.provider,
        stream = %run.stream().name(),
        connection_id = connection.id,
        trigger = %trigger,
        outcome = tracing::field::Empty,
        pages = tracing::field::Empty,
        fetched = tracing::field::Empty,
        inserted = tracing::field::Empty,
        updated = tracing::field::Empty,
        unchanged = tracing::field::Empty,
        failed = tracing::field::Empty,
        deleted = tracing::field::Empty,
        "otel.status_code" = tracing::field::Empty,
        "otel.status_description" = tracing::field::Empty,
    );
    let run_span = span.clone();
    async move {
        let stream = run.stream();
        // A full pass the schedule owes the stream makes this run one, whoever asked.
        let owed = stream.state.full_passes_owed;
        let full = full || owed > 0;
        tracing::info!(
            trigger = %trigger,
            full,
            full_passes_owed = owed,
            "Run started."
        );
        let cursor = stored_cursor(&stream.state);
        let since = if full { None } else { cursor.clone() };
        let track_deletes = settings.deletions.track && since.is_none();
        // Only a run that notes sightings needs an unfinished run's gone first: the
        // others leave them to the next run that does, and to retention.
        let orphans = match track_deletes {
            true => deletions::remove_orphans(db, connection, run_id, lease).await,
            false => Ok(Some(0)),
        };
        match orphans {
            Ok(Some(0)) => {}
            Ok(Some(removed)) => {
                tracing::info!(removed, "Removed the sightings of an unfinished run.")
            }
            Ok(None) => tracing::warn!(
                "Earlier runs' sightings left alone: the run no longer holds its connection's lease."
            ),
            Err(error) => tracing::warn!(%error, "Removing an unfinished run's sightings failed; the next run tries again."),
        }
        let context = RunContext {
            db,
            provider,
            settings,
            connection,
            track_deletes,
            since,
            cancel: cancel.child_token(),
            progress,
            yield_at: yield_after.and_then(|after| started.checked_add(after)),
            budget: budget::TableBudget::for_connection(db, settings, connection),
        };
        let mut committed = Committed::new(run);
        let result = walk_within_timeout(&context, &mut committed).await;
        let counts = *committed.run.counts();
        let (status, error) = status_of(&result, &counts);
        let resume_at = match &result {
            Err(RunFault::Deferred { resume_at, .. }) => Some(*resume_at),
            _ => None,
        };
        let listing_complete = result.is_ok();
        let authorization_refused = matches!(
            &result,
            Err(RunFault::Fetch {
                source: FetchError::Unauthorized { status: 401, .. },
                ..
            })
        );
        let end = RunEnd {
            authorization_refused,
            status,
            error: error.as_deref(),
            listing_complete,
            checkpoint: if listing_complete
                || matches!(
                    result,
                    Err(RunFault::PaginationLoop { .. } | RunFault::RepeatedPage { .. })
                )
            {
                CheckpointMove::Write(None)
            } else {
                match &committed.deferred_checkpoint {
                    Some(deferred) => CheckpointMove::Write(Some(deferred)),
                    None => CheckpointMove::Keep,
                }
            },
            watermark: if listing_complete {
                committed.cursor_after(cursor)
            } else {
                None
            },
            notify: settings.notify,
            // A run owed a full pass is one, so its complete listing serves them; one that
            // went on from a checkpoint saw only the listing's tail, which serves none.
            full_passes_served: if listing_complete && !committed.resumed {
                owed
            } else {
                0
            },
            deletions: DeletionPass::for_run(
                &deletions::WalkSeen {
                    tracked: context.track_deletes,
                    listing_complete,
                    resumed: committed.resumed,
                    unkeyed: committed.unkeyed,
                    parents_skipped: counts.parents_skipped,
                },
                settings.deletions.max_fraction,
            ),
        };
        let stream_name = committed.run.stream().name().to_string();
        let closed = committed.run.close_with(end, hooks.with_close).await?;
        // Only a run that closed deferred (not one whose lease was lost meanwhile).
        let resume_at = resume_at.filter(|_| closed.status == RunStatus::Deferred);
        if let Some(resume_at) = resume_at {
            run::note_resume_at(db, run_id, resume_at).await?;
        }
        let outcome = RunOutcome {
            run_id,
            user_id: connection.user_id.clone(),
            provider: connection.provider.clone(),
            stream: stream_name,
            status: closed.status,
            counts: closed.counts,
            error: closed.error,
            yielded: matches!(result, Err(RunFault::Yielded { .. })),
            panicked: matches!(result, Err(RunFault::Panicked { .. })),
            resume_at,
            elapsed: started.elapsed(),
        };
        log_outcome(&outcome);
        record_on_span(&run_span, &outcome);
        crate::telemetry::record_run(&outcome.metrics(listing_complete));
        Ok(outcome)
    }
    .instrument(span)
    .await
}

/// Walks the listing, cancelled by `run_timeout` like a shutdown cancels it: between
/// pages or during a fetch, never while a page is being stored, so the counters stay
/// exact. A panic (a bug, in an adapter or in the pipeline) ends the run `failed` and
/// reaches neither the lease's holder nor the daemon; a page being stored when it struck
/// is rolled back with its dropped transaction.
async fn walk_within_timeout(
    run: &RunContext<'_>,
    committed: &mut Committed<'_>,
) -> Result<(), RunFault> {
    let timeout = run.settings.run_timeout;
    let timed_out = Arc::new(AtomicBool::new(false));
    let timer = tokio::spawn({
        let (cancel, timed_out) = (run.cancel.clone(), timed_out.clone());
        async move {
            tokio::time::sleep(timeout).await;
            timed_out.store(true, Ordering::SeqCst);
            cancel.cancel();
        }
    });
    let result = AssertUnwindSafe(walk_listing(run, committed))
        .catch_unwind()
        .await
        .unwrap_or_else(|payload| Err(panicked(payload.as_ref())));
    timer.abort();
    match result {
        Err(RunFault::Interrupted { .. }) if timed_out.load(Ordering::SeqCst) => {
            Err(RunFault::Timeout { timeout })
        }
        other => other,
    }
}

/// The status a walk's result gives the run, and its run-level reason.
fn status_of(result: &Result<(), RunFault>, counts: &RunCounts) -> (RunStatus, Option<String>) {
    match result {
        Ok(()) if counts.failed > 0 => (RunStatus::Partial, None),
        Ok(()) => (RunStatus::Succeeded, None),
        // A rate limit never fails a run: it stops early and resumes next time.
        Err(fault @ RunFault::RateLimited { .. }) => (RunStatus::Partial, Some(fault.to_string())),
        // Nor does yielding its turn: the next job goes on from the checkpoint.
        Err(fault @ RunFault::Yielded { .. }) => (RunStatus::Partial, Some(fault.to_string())),
        // Nor does a spent request budget: it stops before the request, until it reopens.
        Err(fault @ RunFault::Deferred { .. }) => (RunStatus::Deferred, Some(fault.to_string())),
        Err(fault @ RunFault::Interrupted { .. }) => {
            (RunStatus::Interrupted, Some(fault.to_string()))
        }
        Err(fault) => (RunStatus::Failed, Some(fault.to_string())),
    }
}

/// The longest panic message kept in `sync_runs.error`.
const MAX_PANIC_MESSAGE_CHARS: usize = 500;

/// The fault for a run that panicked with `payload`, logged with its message.
fn panicked(payload: &(dyn std::any::Any + Send)) -> RunFault {
    let text = payload
        .downcast_ref::<&str>()
        .map(|text| (*text).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string());
    let message: String = text.chars().take(MAX_PANIC_MESSAGE_CHARS).collect();
    tracing::error!(panic = %message, "The run panicked; it ends failed.");
    RunFault::Panicked { message }
}

/// The run's outcome and counters as attributes of its span, for traces.
fn record_on_span(span: &tracing::Span, outcome: &RunOutcome) {
    let counts = &outcome.counts;
    span.record("outcome", tracing::field::display(outcome.status));
    for (name, value) in [
        ("pages", counts.pages_fetched),
        ("fetched", counts.fetched),
        ("inserted", counts.inserted),
        ("updated", counts.updated),
        ("unchanged", counts.unchanged),
        ("failed", counts.failed),
        ("deleted", counts.deleted),
    ] {
        // As integers: the trace layer would export a u64 as text.
        span.record(name, ground::to_db(value));
    }
    if outcome.status == RunStatus::Failed {
        span.record("otel.status_code", "ERROR");
        if let Some(error) = &outcome.error {
            span.record("otel.status_description", error.as_str());
        }
    }
}

fn log_outcome(outcome: &RunOutcome) {
    let counts = &outcome.counts;
    match (outcome.status, &outcome.error) {
        (RunStatus::Failed, error) => tracing::warn!(
            error = error.as_deref().unwrap_or(""),
            pages = counts.pages_fetched,
            inserted = counts.inserted,
            "Run failed."
        ),
        (status, Some(reason)) => tracing::warn!(
            status = %status,
            reason = reason.as_str(),
            pages = counts.pages_fetched,
            inserted = counts.inserted,
            "Run stopped early."
        ),
        (status, None) => tracing::info!(
            status = %status,
            pages = counts.pages_fetched,
            fetched = counts.fetched,
            inserted = counts.inserted,
            updated = counts.updated,
            unchanged = counts.unchanged,
            duplicate = counts.duplicate,
            failed = counts.failed,
            watermark_anomalies = counts.watermark_anomalies,
            "Run finished."
        ),
    }
}
