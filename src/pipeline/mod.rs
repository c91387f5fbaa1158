//! The one pipeline that stores every provider's records.
//!
//! [`sync_connection`] is the single-step entry point: it opens a `sync_runs` row, asks the
//! provider for one page at a time, stores each page in one transaction
//! ([`store::store_page`]), and closes the run with its status. Tests drive it directly;
//! the CLI and the daemon call it for each connection.

pub mod run;
pub mod store;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use sea_orm::{DatabaseConnection, DbErr};
use secrecy::SecretString;
use tracing::Instrument;
use tributary_providers::{Credentials, FetchContext, FetchError, PagePosition, Provider};

use crate::config::ProviderSettings;
use crate::entities::connection;

pub use run::{RunCounts, RunOutcome, RunStatus, Trigger};
pub use store::{PageContext, PageStoreCounts};

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
}

/// Syncs one connection once: one `sync_runs` row, pages stored as they arrive.
///
/// Returns `Err` only when the run could not be recorded at all (the database is down);
/// every other failure is in the returned outcome's status and error.
pub async fn sync_connection(
    db: &DatabaseConnection,
    provider: &dyn Provider,
    settings: &ProviderSettings,
    connection: &connection::Model,
    trigger: Trigger,
    progress: &dyn ProgressSink,
) -> Result<RunOutcome, DbErr> {
    let started = Instant::now();
    let run_id = run::start_run(db, connection, trigger).await?;
    let span = tracing::info_span!(
        "run",
        run_id,
        user_id = %connection.user_id,
        provider = %connection.provider
    );
    async move {
        tracing::info!(trigger = trigger.as_str(), "Run started.");
        let mut counts = RunCounts::default();
        let listing = fetch_and_store(
            db,
            provider,
            settings,
            connection,
            run_id,
            &mut counts,
            progress,
        );
        let result = match tokio::time::timeout(settings.run_timeout, listing).await {
            Ok(result) => result,
            Err(_) => Err(RunFault::Timeout {
                timeout: settings.run_timeout,
            }),
        };
        let (status, error) = match &result {
            Ok(()) if counts.failed > 0 => (RunStatus::Partial, None),
            Ok(()) => (RunStatus::Succeeded, None),
            Err(fault) => (RunStatus::Failed, Some(fault.to_string())),
        };
        let clear_checkpoint = matches!(result, Ok(()) | Err(RunFault::PaginationLoop { .. }));
        run::finish_run(
            db,
            connection,
            run_id,
            status,
            &counts,
            error.as_deref(),
            clear_checkpoint,
        )
        .await?;
        let outcome = RunOutcome {
            run_id,
            user_id: connection.user_id.clone(),
            provider: connection.provider.clone(),
            status,
            counts,
            error,
            elapsed: started.elapsed(),
        };
        match outcome.status {
            RunStatus::Failed => tracing::warn!(
                status = outcome.status.as_str(),
                error = outcome.error.as_deref().unwrap_or(""),
                pages = counts.pages_fetched,
                inserted = counts.inserted,
                "Run failed."
            ),
            _ => tracing::info!(
                status = outcome.status.as_str(),
                pages = counts.pages_fetched,
                fetched = counts.fetched,
                inserted = counts.inserted,
                updated = counts.updated,
                unchanged = counts.unchanged,
                duplicate = counts.duplicate,
                failed = counts.failed,
                "Run finished."
            ),
        }
        Ok(outcome)
    }
    .instrument(span)
    .await
}

/// Walks the listing from the connection's checkpoint (or the first page) to its end.
async fn fetch_and_store(
    db: &DatabaseConnection,
    provider: &dyn Provider,
    settings: &ProviderSettings,
    connection: &connection::Model,
    run_id: i64,
    counts: &mut RunCounts,
    progress: &dyn ProgressSink,
) -> Result<(), RunFault> {
    let credentials =
        resolve_credentials(&connection.credentials).map_err(RunFault::Credentials)?;
    let mut position = resume_position(connection);
    if let Some(position) = &position {
        tracing::info!(
            ?position,
            "Resuming from the checkpoint of an unfinished run."
        );
    }
    let mut seen_positions: HashSet<PagePosition> = HashSet::new();
    loop {
        if counts.pages_fetched >= settings.max_pages {
            return Err(RunFault::MaxPages {
                max_pages: settings.max_pages,
            });
        }
        if let Some(current) = &position {
            if !seen_positions.insert(current.clone()) {
                return Err(RunFault::PaginationLoop {
                    position: describe_position(current),
                });
            }
        }
        let page_number = counts.pages_fetched + 1;
        let fetch_context = FetchContext::full(&credentials);
        let page = match provider.fetch_page(&fetch_context, position.as_ref()).await {
            Ok(page) => page,
            Err(source) => {
                if let Some(body) = source.body() {
                    // The page's body is the only copy of its records: keep it in the report.
                    let context = PageContext {
                        run_id,
                        connection,
                        next_checkpoint: position.as_ref(),
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
        let next = page.next.clone();
        let context = PageContext {
            run_id,
            connection,
            next_checkpoint: next.as_ref(),
        };
        let mut totals_after = *counts;
        totals_after.pages_fetched += 1;
        let stored = store::store_page(db, &context, page.items, &mut totals_after)
            .await
            .map_err(|source| RunFault::Database {
                page: page_number,
                source,
            })?;
        *counts = totals_after;
        tracing::debug!(
            page = page_number,
            inserted = stored.inserted,
            updated = stored.updated,
            unchanged = stored.unchanged,
            failed = stored.failed,
            "Page committed."
        );
        progress.page_committed(connection, counts);
        match next {
            Some(next) => position = Some(next),
            None => return Ok(()),
        }
    }
}

/// Reads the stored credentials JSON into [`Credentials`], resolving `token_env`.
fn resolve_credentials(stored: &str) -> Result<Credentials, String> {
    let value: serde_json::Value = serde_json::from_str(stored)
        .map_err(|_| "the connection's stored credentials are not valid JSON".to_string())?;
    if let Some(var) = value.get("token_env").and_then(|v| v.as_str()) {
        return match std::env::var(var) {
            Ok(token) if !token.is_empty() => Ok(Credentials {
                token: Some(SecretString::from(token)),
                ..Credentials::default()
            }),
            _ => Err(format!(
                "credentials: environment variable {var} is not set or empty"
            )),
        };
    }
    let token = value
        .get("token")
        .and_then(|v| v.as_str())
        .map(|token| SecretString::from(token.to_string()));
    Ok(Credentials {
        token,
        ..Credentials::default()
    })
}

/// The position an unfinished earlier run committed last, if any.
fn resume_position(connection: &connection::Model) -> Option<PagePosition> {
    let text = connection.checkpoint.as_deref()?;
    match serde_json::from_str(text) {
        Ok(position) => Some(position),
        Err(error) => {
            tracing::warn!(%error, "The stored checkpoint is unreadable; starting from the first page.");
            None
        }
    }
}

/// A position for messages: the kind and value, with URLs' query strings left out.
fn describe_position(position: &PagePosition) -> String {
    match position {
        PagePosition::Cursor { cursor } => format!("cursor {cursor:?}"),
        PagePosition::Offset { offset } => format!("offset {offset}"),
        PagePosition::Page { page } => format!("page {page}"),
        PagePosition::Url { url } => {
            let without_query = url.split('?').next().unwrap_or(url);
            format!("URL {without_query}")
        }
    }
}
