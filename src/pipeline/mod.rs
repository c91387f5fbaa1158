//! The one pipeline that stores every provider's records.
//!
//! [`sync_connection`] is the single-step entry point: it opens a `sync_runs` row, asks the
//! provider for one page at a time, stores each page in one transaction
//! ([`store::store_page`]), and closes the run with its status. Tests drive it directly;
//! the CLI and the daemon call it for each connection.

pub mod checkpoint;
pub mod credential_store;
pub mod run;
pub mod store;

use std::collections::HashSet;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use futures::FutureExt;
use sea_orm::DbErr;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use tributary_providers::{FetchContext, FetchError, Page, PagePosition, Provider, Watermark};

use crate::config::ProviderSettings;
use crate::credentials::StoredCredentials;
use crate::db::DatabasePools;
use crate::entities::connection;

pub use checkpoint::Checkpoint;
pub use run::{RunCounts, RunEnd, RunOutcome, RunStatus, Trigger};
pub use store::{PageContext, PageExpectation, PageStoreCounts, WriteMode};

use checkpoint::{newest, resumable_checkpoint, stored_cursor};
use credential_store::ConnectionCredentials;

/// How a run is asked for.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub trigger: Trigger,
    /// Ignore the incremental cursor and walk the whole listing.
    pub full: bool,
    /// Stops the run between pages (shutdown, or a lost lease); the page being stored
    /// still commits, and the run ends `interrupted` with its checkpoint kept.
    pub cancel: CancellationToken,
}

impl RunOptions {
    /// A manual, incremental run.
    pub fn manual() -> RunOptions {
        RunOptions {
            trigger: Trigger::Manual,
            full: false,
            cancel: CancellationToken::new(),
        }
    }
}

/// Receives progress after each committed page (the CLI draws a progress bar from it).
pub trait ProgressSink: Send + Sync {
    /// Called after a page commits, with the run's totals so far.
    fn page_committed(&self, connection: &connection::Model, counts: &RunCounts);
}

/// A [`ProgressSink`] that shows nothing.
pub struct NoProgress;

impl ProgressSink for NoProgress {
    fn page_committed(&self, _: &connection::Model, _: &RunCounts) {}
}

/// Why a run stopped before the listing ended.
#[derive(Debug, thiserror::Error)]
enum RunFault {
    #[error("{0}")]
    Credentials(String),
    #[error("fetching page {page} failed: {source}")]
    Fetch { page: u64, source: FetchError },
    #[error("stopped early at page {page}: {source}; the next run resumes from the checkpoint")]
    RateLimited { page: u64, source: FetchError },
    #[error("page {page}: {reason}; its records were stored, and the next run starts again at this page")]
    ListingStopped { page: u64, reason: String },
    #[error("pagination returned to a page already fetched in this run ({position}); stopped to avoid a loop")]
    PaginationLoop { position: String },
    #[error(
        "stopped after max_pages = {max_pages} pages; the next run resumes from the checkpoint"
    )]
    MaxPages { max_pages: u64 },
    #[error("storing page {page} failed: {source}")]
    Database { page: u64, source: DbErr },
    #[error("the run exceeded run_timeout ({timeout:?}); committed pages are kept")]
    Timeout { timeout: Duration },
    #[error("interrupted after {pages} page(s) (shutdown or lost lease); the next run resumes from the checkpoint")]
    Interrupted { pages: u64 },
    #[error("the run panicked, a bug in tributary: {message}; committed pages are kept and the next run resumes from the checkpoint")]
    Panicked { message: String },
}

/// Syncs one connection once: one `sync_runs` row, pages stored as they arrive.
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
    let started = Instant::now();
    let trigger = options.trigger;
    let run_id = run::start_run(db, connection, trigger).await?;
    let span = tracing::info_span!(
        "run",
        run_id,
        user_id = %connection.user_id,
        provider = %connection.provider
    );
    async move {
        tracing::info!(
            trigger = %trigger,
            full = options.full,
            "Run started."
        );
        let mut counts = RunCounts::default();
        let mut watermark = None;
        let cursor = stored_cursor(connection);
        let since = if options.full { None } else { cursor.clone() };
        // run_timeout cancels the run like a shutdown does: between pages or during a
        // fetch, never while a page is being stored, so the counters stay exact.
        let run_cancel = options.cancel.child_token();
        let timed_out = Arc::new(AtomicBool::new(false));
        let timer = tokio::spawn({
            let (run_cancel, timed_out) = (run_cancel.clone(), timed_out.clone());
            let limit = settings.run_timeout;
            async move {
                tokio::time::sleep(limit).await;
                timed_out.store(true, Ordering::SeqCst);
                run_cancel.cancel();
            }
        });
        let walk = Walk {
            run_id,
            since: since.as_ref(),
            cancel: &run_cancel,
        };
        // A panic (a bug, in an adapter or in the pipeline) ends this run `failed` and
        // reaches neither the lease's holder nor the daemon; a page being stored when it
        // struck is rolled back with its dropped transaction.
        let result = AssertUnwindSafe(fetch_and_store(
            db,
            provider,
            settings,
            connection,
            walk,
            &mut counts,
            &mut watermark,
            progress,
        ))
        .catch_unwind()
        .await
        .unwrap_or_else(|payload| Err(panicked(payload.as_ref())));
        timer.abort();
        let result = match result {
            Err(RunFault::Interrupted { .. }) if timed_out.load(Ordering::SeqCst) => {
                Err(RunFault::Timeout {
                    timeout: settings.run_timeout,
                })
            }
            other => other,
        };
        let (status, error) = match &result {
            Ok(()) if counts.failed > 0 => (RunStatus::Partial, None),
            Ok(()) => (RunStatus::Succeeded, None),
            // A rate limit never fails a run: it stops early and resumes next time.
            Err(fault @ RunFault::RateLimited { .. }) => {
                (RunStatus::Partial, Some(fault.to_string()))
            }
            Err(fault @ RunFault::Interrupted { .. }) => {
                (RunStatus::Interrupted, Some(fault.to_string()))
            }
            Err(fault) => (RunStatus::Failed, Some(fault.to_string())),
        };
        let listing_complete = result.is_ok();
        let end = RunEnd {
            status,
            error: error.as_deref(),
            listing_complete,
            clear_checkpoint: listing_complete
                || matches!(result, Err(RunFault::PaginationLoop { .. })),
            watermark: if listing_complete {
                newest(watermark, cursor)
            } else {
                None
            },
        };
        run::finish_run(db, connection, run_id, &counts, &end).await?;
        let outcome = RunOutcome {
            run_id,
            user_id: connection.user_id.clone(),
            provider: connection.provider.clone(),
            status,
            counts,
            error,
            panicked: matches!(result, Err(RunFault::Panicked { .. })),
            elapsed: started.elapsed(),
        };
        log_outcome(&outcome);
        crate::telemetry::record_run(&outcome, listing_complete);
        Ok(outcome)
    }
    .instrument(span)
    .await
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

/// How long an unchanged run may go without committing its counters and checkpoint
/// (see ARCHITECTURE.md, "Shortcuts for unchanged and new pages").
const MAX_UNCOMMITTED_UNCHANGED: Duration = Duration::from_secs(1);

/// What the next page most likely holds, judged by the page just stored.
fn expect_after(stored: &PageStoreCounts) -> PageExpectation {
    let some_written = stored.inserted + stored.updated + stored.failed > 0;
    if !some_written {
        PageExpectation::Unchanged
    } else if stored.updated + stored.unchanged + stored.duplicate + stored.failed == 0 {
        PageExpectation::New
    } else {
        PageExpectation::Unknown
    }
}

/// What one walk of a listing is for.
struct Walk<'a> {
    run_id: i64,
    cancel: &'a CancellationToken,
    /// The incremental watermark asked from (`None`: a full pass).
    since: Option<&'a Watermark>,
}

/// Walks the listing from the connection's checkpoint (or the first page) to its end,
/// committing each page with the next checkpoint. `watermark` collects the newest
/// watermark of the pages committed.
#[allow(clippy::too_many_arguments)]
async fn fetch_and_store(
    db: &DatabasePools,
    provider: &dyn Provider,
    settings: &ProviderSettings,
    connection: &connection::Model,
    walk: Walk<'_>,
    counts: &mut RunCounts,
    watermark: &mut Option<Watermark>,
    progress: &dyn ProgressSink,
) -> Result<(), RunFault> {
    let credentials =
        StoredCredentials::from_column(db.secrets(), connection.binding(), &connection.credentials)
            .and_then(|stored| stored.resolve())
            .map_err(RunFault::Credentials)?;
    let credential_store = ConnectionCredentials::new(db, connection, credentials);
    let mut position: Option<PagePosition> = None;
    if let Some(checkpoint) = resumable_checkpoint(connection, walk.since) {
        let position_text = checkpoint.position.describe();
        tracing::info!(position = %position_text, "Resuming from the checkpoint of an unfinished run.");
        *watermark = checkpoint.watermark;
        position = Some(checkpoint.position);
    }
    let mut seen_positions: HashSet<PagePosition> = HashSet::new();
    // A page is expected to be like the one before; the first page of a run is looked up
    // outside a transaction first, since most runs of a daemon change nothing.
    let mut expect = PageExpectation::Unchanged;
    let mut last_commit = Instant::now();
    // The next page, fetched while the current one was being stored: at most one page
    // ahead, so memory stays bounded by two pages. `None` inside: cancelled meanwhile.
    let mut prefetched: Option<Option<Result<Page, FetchError>>> = None;
    loop {
        if counts.pages_fetched >= settings.max_pages {
            return Err(RunFault::MaxPages {
                max_pages: settings.max_pages,
            });
        }
        if let Some(current) = &position {
            if !seen_positions.insert(current.clone()) {
                return Err(RunFault::PaginationLoop {
                    position: current.describe(),
                });
            }
        }
        let page_number = counts.pages_fetched + 1;
        if walk.cancel.is_cancelled() {
            return Err(RunFault::Interrupted {
                pages: counts.pages_fetched,
            });
        }
        let fetched = match prefetched.take() {
            Some(fetched) => fetched,
            None => {
                fetch_unless_cancelled(provider, &credential_store, &walk, position.as_ref()).await
            }
        };
        let Some(fetched) = fetched else {
            return Err(RunFault::Interrupted {
                pages: counts.pages_fetched,
            });
        };
        let page = match fetched {
            Ok(page) => page.refusing_oversized_next(),
            Err(source @ FetchError::RateLimited { .. }) => {
                return Err(RunFault::RateLimited {
                    page: page_number,
                    source,
                })
            }
            Err(source) => {
                if let Some(body) = source.body() {
                    // The page's body is the only copy of its records: keep it in the report.
                    let context = PageContext {
                        run_id: walk.run_id,
                        connection,
                        next_checkpoint: None,
                        mode: settings.write_mode,
                        leave_checkpoint: false,
                        expect: PageExpectation::Unknown,
                    };
                    let message = format!("page {page_number}: {source}");
                    if let Err(db_error) =
                        store::record_page_error(db, &context, source.stage(), &message, body).await
                    {
                        tracing::error!(error = %db_error, "Storing the page's error report failed.");
                    }
                }
                return Err(RunFault::Fetch {
                    page: page_number,
                    source,
                });
            }
        };
        if page.watermarks_ahead > 0 {
            tracing::warn!(
                run_id = walk.run_id,
                page = page_number,
                count = page.watermarks_ahead,
                "Watermarks beyond the clock skew were clamped to the fetch time."
            );
        }
        *watermark = newest(watermark.take(), page.watermark.clone());
        let stop_after = page.stop_after;
        let next_checkpoint = page.next.clone().map(|next| Checkpoint {
            position: next,
            since: walk.since.cloned(),
            watermark: watermark.clone(),
        });
        let context = PageContext {
            run_id: walk.run_id,
            connection,
            next_checkpoint: next_checkpoint.as_ref(),
            mode: settings.write_mode,
            // A page the listing cannot go on from leaves the checkpoint at itself.
            leave_checkpoint: stop_after.is_some(),
            expect: match expect {
                PageExpectation::Unchanged
                    if last_commit.elapsed() >= MAX_UNCOMMITTED_UNCHANGED =>
                {
                    PageExpectation::Unknown
                }
                other => other,
            },
        };
        let mut totals_after = *counts;
        totals_after.pages_fetched += 1;
        totals_after.watermark_anomalies = totals_after
            .watermark_anomalies
            .saturating_add(page.watermarks_ahead);
        // Ask for the next page while this one is stored, unless the checks at the top of
        // the loop are going to stop the run before it.
        let ahead = next_checkpoint
            .as_ref()
            .map(|next| &next.position)
            .filter(|next| {
                totals_after.pages_fetched < settings.max_pages && !seen_positions.contains(*next)
            });
        let store = store::store_page(db, &context, page.items, &mut totals_after);
        let stored = match ahead {
            Some(next) => {
                let fetch_next =
                    fetch_unless_cancelled(provider, &credential_store, &walk, Some(next));
                let (stored, next_page) = tokio::join!(store, fetch_next);
                prefetched = Some(next_page);
                stored
            }
            None => store.await,
        };
        let stored = stored.map_err(|source| RunFault::Database {
            page: page_number,
            source,
        })?;
        *counts = totals_after;
        if !stored.deferred {
            last_commit = Instant::now();
        }
        expect = expect_after(&stored);
        tracing::debug!(
            page = page_number,
            inserted = stored.inserted,
            updated = stored.updated,
            unchanged = stored.unchanged,
            failed = stored.failed,
            deferred = stored.deferred,
            "Page stored."
        );
        progress.page_committed(connection, counts);
        if let Some(reason) = stop_after {
            return Err(RunFault::ListingStopped {
                page: page_number,
                reason,
            });
        }
        match next_checkpoint {
            Some(next) => position = Some(next.position),
            None => return Ok(()),
        }
    }
}

/// Fetches the page at `position`; `None` when the run is cancelled first. The page's
/// watermark is clamped to the moment it was asked for: a record stamped later (a clock
/// years ahead) must not carry the cursor past changes that happen after this fetch.
async fn fetch_unless_cancelled(
    provider: &dyn Provider,
    credential_store: &ConnectionCredentials,
    walk: &Walk<'_>,
    position: Option<&PagePosition>,
) -> Option<Result<Page, FetchError>> {
    let credentials = credential_store.current();
    let fetch_context = FetchContext {
        credentials: &credentials,
        since: walk.since,
        credential_store,
    };
    let asked_at = Utc::now();
    tokio::select! {
        fetched = provider.fetch_page(&fetch_context, position) => Some(fetched.map(|mut page| {
            page.watermark = page.watermark.map(|watermark| watermark.at_most(asked_at));
            page
        })),
        () = walk.cancel.cancelled() => None,
    }
}
