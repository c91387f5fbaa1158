//! Walking a listing: fetch a page, store it while the next one is fetched, and go on from
//! the checkpoint it committed, until the listing ends or the run has to stop.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sea_orm::DbErr;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use tributary_providers::http::{with_budget, RequestBudget};
use tributary_providers::{
    FetchContext, FetchError, Page, PageItem, PagePosition, ParentRecord, Provider, Watermark,
};

use super::checkpoint::{newest, resumable_checkpoint, Checkpoint};
use super::credential_store::ConnectionCredentials;
use super::ground::PageStoreCounts;
use super::ground::RunCounts;
use super::parents::{self, Parent};
use super::run::{Run, RunPage};
use super::store::PageExpectation;
use crate::config::ProviderSettings;
use crate::credentials::StoredCredentials;
use crate::db::DatabasePools;
use crate::entities::connection;

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
pub(super) enum RunFault {
    #[error("{0}")]
    Credentials(String),
    #[error("fetching page {page} failed: {source}")]
    Fetch { page: u64, source: FetchError },
    #[error("stopped early at page {page}: {source}; the next run resumes from the checkpoint")]
    RateLimited { page: u64, source: FetchError },
    #[error("deferred at page {page}: {source}; the run resumes from the checkpoint then")]
    Deferred {
        page: u64,
        source: FetchError,
        resume_at: DateTime<Utc>,
    },
    #[error("page {page}: {reason}; its records were stored, and the next run starts again at this page")]
    ListingStopped { page: u64, reason: String },
    #[error("pagination returned to a page already fetched in this run ({position}); stopped to avoid a loop")]
    PaginationLoop { position: String },
    #[error("page {page} ({position}) holds the same records as the page before it: the API seems to ignore the pagination parameter; stopped to avoid a loop")]
    RepeatedPage { page: u64, position: String },
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
    #[error("yielded after {pages} page(s), past max_run_duration, so that other connections' due runs start; the next run goes on from the checkpoint")]
    Yielded { pages: u64 },
    #[error("the run panicked, a bug in tributary: {message}; committed pages are kept and the next run resumes from the checkpoint")]
    Panicked { message: String },
}

/// What a run carries from its start to its end.
pub(super) struct RunContext<'a> {
    pub db: &'a DatabasePools,
    pub provider: &'a dyn Provider,
    pub settings: &'a ProviderSettings,
    pub connection: &'a connection::Model,
    /// The incremental watermark asked from (`None`: a full pass).
    pub since: Option<Watermark>,
    /// Stops the walk between pages or during a fetch (shutdown, lost lease, timeout).
    pub cancel: CancellationToken,
    pub progress: &'a dyn ProgressSink,
    /// The run is a full pass of a provider that tracks deletions: its pages note their
    /// keys, unless it resumes an earlier run's walk.
    pub track_deletes: bool,
    /// When the walk gives way between pages (see `RunOptions::yield_after`).
    pub yield_at: Option<std::time::Instant>,
    /// The request budgets every fetch of the run takes from (`None`: none configured).
    pub budget: Option<Arc<dyn RequestBudget>>,
}

/// What a walk has committed so far. The caller keeps it, so that a run that stops early
/// (or panics) still closes with the counters of the pages that committed.
pub(super) struct Committed<'a> {
    /// The run, which stores the pages and keeps their counters.
    pub run: Run<'a>,
    /// The newest watermark of the pages committed.
    pub watermark: Option<Watermark>,
    /// The walk went on from an earlier run's checkpoint, so it did not see the pages
    /// before it.
    pub resumed: bool,
    /// Records of the committed pages that could not be keyed at all.
    pub unkeyed: u64,
    /// The checkpoint of the last page stored unchanged, which rides with the run's next
    /// commit: a run that stops before that commit writes it as it closes.
    pub deferred_checkpoint: Option<Checkpoint>,
    /// When the walk began (in an earlier run, if this one resumed it).
    pub walk_started: Option<chrono::DateTime<Utc>>,
}

impl<'a> Committed<'a> {
    /// A walk of `run` that has committed nothing yet.
    pub fn new(run: Run<'a>) -> Self {
        Committed {
            run,
            watermark: None,
            resumed: false,
            unkeyed: 0,
            deferred_checkpoint: None,
            walk_started: None,
        }
    }

    /// The cursor a complete run leaves: the newest watermark of its pages and the
    /// cursor before, never past the walk's start. A record on a page read early may
    /// change before the walk reaches a later page holding a newer record (a listing not
    /// sorted by the cursor, or a child stream's later parent); a cursor past that change
    /// would hide it.
    pub fn cursor_after(&self, before: Option<Watermark>) -> Option<Watermark> {
        let newest = newest(self.watermark.clone(), before)?;
        Some(match self.walk_started {
            Some(started) => newest.at_most(started),
            None => newest,
        })
    }
}

/// How long an unchanged run may go without committing its counters and checkpoint
/// (see docs/decisions/page-shortcuts.md).
const MAX_UNCOMMITTED_UNCHANGED: Duration = Duration::from_secs(1);

/// A page asked for while the run may be cancelled.
enum Fetched {
    Answer(Result<Page, FetchError>),
    Cancelled,
}

/// Where the walk goes after a page committed.
enum AfterPage {
    Next(PagePosition),
    /// The listing ended with this page.
    End,
    /// The page said the listing cannot go on from it.
    Stopped(String),
}

/// Walks the stream's listing from its checkpoint (or the first page) to its end,
/// committing each page with the next checkpoint. A child stream walks one listing per
/// parent record, in the parents' external id order.
pub(super) async fn walk_listing(
    run: &RunContext<'_>,
    committed: &mut Committed<'_>,
) -> Result<(), RunFault> {
    let stream = committed.run.stream();
    let mut walker = Walker::start(run, stream.name())?;
    let resume = resumable_checkpoint(&stream.state, run.since.as_ref());
    let parent_namespace = stream
        .settings
        .parent
        .as_ref()
        .map(|parent| parent.namespace.clone());
    let last_complete = stream.state.last_success_run_id.unwrap_or(0);
    if let Some(checkpoint) = &resume {
        let position_text = checkpoint
            .position
            .as_ref()
            .map_or_else(|| "the next parent".to_string(), PagePosition::describe);
        tracing::info!(position = %position_text, parent = checkpoint.parent.as_deref().unwrap_or(""), "Resuming from the checkpoint of an unfinished run.");
        committed.watermark = checkpoint.watermark.clone();
        committed.resumed = true;
    }
    committed.walk_started = resume
        .as_ref()
        .and_then(|checkpoint| checkpoint.walk_started)
        .or_else(|| Some(Utc::now()));
    match parent_namespace {
        None => {
            let start = resume.and_then(|checkpoint| checkpoint.position);
            walker.begin(None, run.since.clone(), start);
            walker.walk(committed).await
        }
        Some(parent_namespace) => {
            let from = match resume {
                Some(Checkpoint {
                    parent: Some(id),
                    position: Some(position),
                    ..
                }) => Resume::At(id, position),
                Some(Checkpoint {
                    parent: Some(id),
                    position: None,
                    ..
                }) => Resume::After(id),
                _ => Resume::Start,
            };
            let children = Children {
                parent_namespace: &parent_namespace,
                last_complete,
            };
            walk_children(&mut walker, &children, from, committed).await
        }
    }
}

/// Where a child stream's walk starts.
enum Resume {
    Start,
    /// Within this parent's listing, at this page (if the parent is still there).
    At(String, PagePosition),
    /// After this parent.
    After(String),
}

/// A child stream's parents: their namespace, and the stream's last complete run.
struct Children<'c> {
    parent_namespace: &'c str,
    last_complete: i64,
}

/// Walks a child stream: each live parent's listing to its end, in external id order.
/// A parent deleted since the checkpoint named it is skipped with its position.
async fn walk_children(
    walker: &mut Walker<'_, '_>,
    children: &Children<'_>,
    resume: Resume,
    committed: &mut Committed<'_>,
) -> Result<(), RunFault> {
    let run = walker.run;
    let (mut from, mut resume_at) = match resume {
        Resume::Start => (parents::From::Start, None),
        Resume::At(id, position) => (parents::From::At(id.clone()), Some((id, position))),
        Resume::After(id) => (parents::From::After(id), None),
    };
    let last_complete = children.last_complete;
    loop {
        let chunk = parents::next_chunk(
            run.db.main(),
            &run.connection.user_id,
            children.parent_namespace,
            &from,
        )
        .await
        .map_err(|source| RunFault::Database {
            page: committed.run.counts().pages_fetched,
            source,
        })?;
        let Some(last) = chunk.last() else {
            return Ok(());
        };
        from = parents::From::After(last.external_id.clone());
        for parent in chunk {
            let start = match resume_at.take() {
                Some((id, position)) if id == parent.external_id => Some(position),
                _ => None,
            };
            // A parent first stored after the stream's last complete run has had none of
            // its children listed: it gets a full listing whatever the cursor.
            let since = match parent.first_seen_run_id > last_complete {
                true => None,
                false => run.since.clone(),
            };
            walker.begin(Some(parent), since, start);
            walker.walk(committed).await?;
        }
    }
}

/// The state of one walk between pages.
struct Walker<'r, 'a> {
    run: &'r RunContext<'a>,
    /// The stream's name, as the adapter is asked for its pages.
    stream_name: String,
    credentials: ConnectionCredentials,
    /// The listing being walked: a child stream's parent and the watermark asked from.
    listing: Listing,
    /// The page to fetch next (`None`: the first page).
    position: Option<PagePosition>,
    seen_positions: HashSet<PagePosition>,
    /// The fingerprint of the last page's items (see [`page_fingerprint`]).
    last_page: Option<u64>,
    /// What the next page most likely holds, judged by the one before.
    expect: PageExpectation,
    last_commit: Instant,
    /// The next page, fetched while the current one was being stored: at most one page
    /// ahead, so memory stays bounded by two pages. With the span its fetch ran in.
    prefetched: Option<(Fetched, tracing::Span)>,
    /// The run's span, every page's parent (a page fetched ahead starts inside the page
    /// before).
    run_span: tracing::Span,
    /// The span of the page being walked.
    page_span: tracing::Span,
}

impl<'r, 'a> Walker<'r, 'a> {
    /// Resolves the connection's credentials.
    fn start(run: &'r RunContext<'a>, stream_name: &str) -> Result<Self, RunFault> {
        let connection = run.connection;
        let credentials = StoredCredentials::from_column(
            run.db.secrets(),
            connection.binding(),
            &connection.credentials,
        )
        .and_then(|stored| stored.resolve())
        .map_err(RunFault::Credentials)?;
        Ok(Walker {
            run,
            stream_name: stream_name.to_string(),
            credentials: ConnectionCredentials::new(
                run.db,
                connection,
                credentials,
                crate::db::Announce::under(run.settings.notify),
            ),
            listing: Listing::default(),
            position: None,
            seen_positions: HashSet::new(),
            last_page: None,
            // The first page of a run is looked up outside a transaction first, since
            // most runs of a daemon change nothing.
            expect: PageExpectation::Unchanged,
            last_commit: Instant::now(),
            prefetched: None,
            run_span: tracing::Span::current(),
            page_span: tracing::Span::none(),
        })
    }

    /// Sets the walker at the start of a listing: `parent`'s for a child stream, asked
    /// from `since`, at `start` (`None`: its first page).
    fn begin(
        &mut self,
        parent: Option<Parent>,
        since: Option<Watermark>,
        start: Option<PagePosition>,
    ) {
        self.listing = Listing { parent, since };
        self.position = start;
        self.seen_positions.clear();
        self.last_page = None;
        self.prefetched = None;
    }

    /// Walks the current listing to its end.
    async fn walk(&mut self, committed: &mut Committed<'_>) -> Result<(), RunFault> {
        loop {
            self.check_before_fetch(committed)?;
            let page_number = committed.run.counts().pages_fetched + 1;
            let span = match &self.prefetched {
                Some((_, span)) => span.clone(),
                None => self.page_span(page_number),
            };
            self.page_span = span.clone();
            let step = self
                .page(page_number, committed)
                .instrument(span.clone())
                .await;
            match &step {
                Ok(_) => span.record("outcome", "stored"),
                Err(fault) => span
                    .record("outcome", "failed")
                    .record("otel.status_code", "ERROR")
                    .record("otel.status_description", fault.to_string()),
            };
            if !step? {
                return Ok(());
            }
        }
    }

    /// The span of page `page_number` of this run.
    fn page_span(&self, page_number: u64) -> tracing::Span {
        tracing::debug_span!(
            parent: &self.run_span,
            "page",
            page = super::ground::to_db(page_number),
            records = tracing::field::Empty,
            bytes = tracing::field::Empty,
            failed = tracing::field::Empty,
            outcome = tracing::field::Empty,
            "otel.status_code" = tracing::field::Empty,
            "otel.status_description" = tracing::field::Empty,
        )
    }

    /// Fetches and stores one page; false when the listing ends with it.
    async fn page(
        &mut self,
        page_number: u64,
        committed: &mut Committed<'_>,
    ) -> Result<bool, RunFault> {
        let page = self.next_page(page_number, &committed.run).await?;
        record_page_size(&page, &self.page_span);
        if let Some(position) = self.repeated_page(&page) {
            return Err(RunFault::RepeatedPage {
                page: page_number,
                position,
            });
        }
        if let Some(reason) = page.parent_gone {
            self.parent_gone(&reason, committed);
            return Ok(false);
        }
        match self.store(page, page_number, committed).await? {
            AfterPage::Next(position) => {
                self.position = Some(position);
                Ok(true)
            }
            AfterPage::End => Ok(false),
            AfterPage::Stopped(reason) => Err(RunFault::ListingStopped {
                page: page_number,
                reason,
            }),
        }
    }

    /// A parent whose children the API no longer lists: counted, said, and passed over.
    /// Nothing is committed for it; a run that resumes before it asks again.
    fn parent_gone(&mut self, reason: &str, committed: &mut Committed<'_>) {
        let parent = self
            .listing
            .parent
            .as_ref()
            .map_or("", |parent| parent.external_id.as_str());
        tracing::warn!(
            parent,
            reason,
            "Skipped a parent whose children cannot be listed."
        );
        committed.run.count_skipped_parent();
    }

    /// The position of `page` when it holds the items of the page before, in the same
    /// order, at a position that only counts forward (an offset or a page number), which
    /// never repeats: an API that ignores the parameter would otherwise be walked, the same
    /// page again and again, to `max_pages`.
    fn repeated_page(&mut self, page: &Page) -> Option<String> {
        let fingerprint = page_fingerprint(&page.items);
        let before = std::mem::replace(&mut self.last_page, fingerprint);
        let counting = matches!(
            self.position,
            Some(PagePosition::Offset { .. } | PagePosition::Page { .. })
        );
        (counting && fingerprint.is_some() && before == fingerprint)
            .then(|| self.position.as_ref().map(PagePosition::describe))
            .flatten()
    }

    /// The checks that stop a run before it asks for another page.
    fn check_before_fetch(&mut self, committed: &Committed<'_>) -> Result<(), RunFault> {
        let max_pages = self.run.settings.max_pages;
        let pages_fetched = committed.run.counts().pages_fetched;
        if pages_fetched >= max_pages {
            return Err(RunFault::MaxPages { max_pages });
        }
        if let Some(current) = &self.position {
            if !self.seen_positions.insert(current.clone()) {
                return Err(RunFault::PaginationLoop {
                    position: current.describe(),
                });
            }
        }
        if self.run.cancel.is_cancelled() {
            return Err(RunFault::Interrupted {
                pages: pages_fetched,
            });
        }
        // After a page at least, so that every run makes progress.
        if pages_fetched > 0
            && self
                .run
                .yield_at
                .is_some_and(|at| std::time::Instant::now() >= at)
        {
            return Err(RunFault::Yielded {
                pages: pages_fetched,
            });
        }
        Ok(())
    }

    /// The page at the current position: the one fetched ahead, or a fetch now.
    async fn next_page(&mut self, page_number: u64, run: &Run<'_>) -> Result<Page, RunFault> {
        let fetched = match self.prefetched.take() {
            Some((fetched, _)) => fetched,
            None => {
                fetch_unless_cancelled(
                    self.run,
                    &self.stream_name,
                    &self.credentials,
                    &self.listing,
                    self.position.as_ref(),
                )
                .await
            }
        };
        match fetched {
            Fetched::Answer(Ok(page)) => Ok(page.refusing_oversized_next()),
            Fetched::Answer(Err(source)) => Err(self.fetch_failed(page_number, source, run).await),
            Fetched::Cancelled => Err(RunFault::Interrupted {
                pages: page_number - 1,
            }),
        }
    }

    /// The fault for a failed fetch; a body that came with it goes to the error report.
    async fn fetch_failed(&self, page: u64, source: FetchError, run: &Run<'_>) -> RunFault {
        if matches!(source, FetchError::RateLimited { .. }) {
            return RunFault::RateLimited { page, source };
        }
        if let FetchError::BudgetSpent { reopens_at, .. } = &source {
            let resume_at = *reopens_at;
            return RunFault::Deferred {
                page,
                source,
                resume_at,
            };
        }
        if let Some(body) = source.body() {
            // The page's body is the only copy of its records: keep it in the report.
            let message = format!("page {page}: {source}");
            let stage = source.stage();
            let mode = self.run.settings.write_mode;
            if let Err(db_error) = run.record_page_error(mode, stage, &message, body).await {
                tracing::error!(error = %db_error, "Storing the page's error report failed.");
            }
        }
        RunFault::Fetch { page, source }
    }

    /// Stores `page` in one transaction, fetching the next page meanwhile, and says where
    /// the walk goes on.
    async fn store(
        &mut self,
        page: Page,
        page_number: u64,
        committed: &mut Committed<'_>,
    ) -> Result<AfterPage, RunFault> {
        let run = self.run;
        if page.watermarks_ahead > 0 {
            tracing::warn!(
                run_id = committed.run.id(),
                page = super::ground::to_db(page_number),
                count = page.watermarks_ahead,
                "Watermarks beyond the clock skew were clamped to the fetch time."
            );
        }
        committed.watermark = newest(committed.watermark.take(), page.watermark.clone());
        let next_checkpoint = self.next_checkpoint(page.next.clone(), committed);
        let unkeyed = page
            .items
            .iter()
            .filter(
                |item| matches!(item, PageItem::Rejected(reject) if reject.external_id.is_none()),
            )
            .count() as u64;
        let pages_after = committed.run.counts().pages_fetched.saturating_add(1);
        // Ask for the next page while this one is stored, unless the checks before the
        // next fetch are going to stop the run first.
        let ahead = page.next.as_ref().filter(|next| {
            pages_after < run.settings.max_pages && !self.seen_positions.contains(*next)
        });
        let sightings = run.track_deletes && !committed.resumed;
        let store = committed.run.store(RunPage {
            items: page.items,
            next_checkpoint: next_checkpoint.as_ref(),
            mode: run.settings.write_mode,
            // A page the listing cannot go on from leaves the checkpoint at itself.
            leave_checkpoint: page.stop_after.is_some(),
            expect: self.expectation(),
            sightings,
            pages: 1,
            watermark_anomalies: page.watermarks_ahead,
            filtered: page.filtered,
            version: None,
        });
        let stored = match ahead {
            Some(next) => {
                let next_span = self.page_span(page_number.saturating_add(1));
                let fetch_next = fetch_unless_cancelled(
                    run,
                    &self.stream_name,
                    &self.credentials,
                    &self.listing,
                    Some(next),
                )
                .instrument(next_span.clone());
                let (stored, next_page) = tokio::join!(store, fetch_next);
                self.prefetched = Some((next_page, next_span));
                stored
            }
            None => store.await,
        };
        let stored = stored.map_err(|source| RunFault::Database {
            page: page_number,
            source,
        })?;
        committed.unkeyed = committed.unkeyed.saturating_add(unkeyed);
        if !stored.deferred {
            committed.deferred_checkpoint = None;
        } else if page.stop_after.is_none() {
            committed.deferred_checkpoint = next_checkpoint.clone();
        }
        self.page_committed(page_number, &stored, committed);
        Ok(match (page.stop_after, page.next) {
            (Some(reason), _) => AfterPage::Stopped(reason),
            (None, Some(next)) => AfterPage::Next(next),
            (None, None) => AfterPage::End,
        })
    }

    /// The checkpoint committed with a page whose listing goes on at `next`: that page of
    /// this listing, or for a child stream whose parent's listing ended, past the parent.
    /// `None` when the stream's whole listing ends with the page.
    fn next_checkpoint(
        &self,
        next: Option<PagePosition>,
        committed: &Committed<'_>,
    ) -> Option<Checkpoint> {
        let parent = self
            .listing
            .parent
            .as_ref()
            .map(|parent| parent.external_id.clone());
        if next.is_none() && parent.is_none() {
            return None;
        }
        Some(Checkpoint {
            position: next,
            parent,
            walk_started: committed.walk_started,
            since: self.run.since.clone(),
            watermark: committed.watermark.clone(),
        })
    }

    /// What the page about to be stored most likely holds. An unchanged page writes
    /// nothing, so after [`MAX_UNCOMMITTED_UNCHANGED`] without a commit the next one is
    /// not guessed unchanged and commits the counters and checkpoint.
    fn expectation(&self) -> PageExpectation {
        match self.expect {
            PageExpectation::Unchanged
                if self.last_commit.elapsed() >= MAX_UNCOMMITTED_UNCHANGED =>
            {
                PageExpectation::Unknown
            }
            other => other,
        }
    }

    fn page_committed(&mut self, page: u64, stored: &PageStoreCounts, committed: &Committed<'_>) {
        self.page_span
            .record("failed", super::ground::to_db(stored.failed));
        if !stored.deferred {
            self.last_commit = Instant::now();
        }
        self.expect = expect_after(stored);
        tracing::debug!(
            page,
            inserted = stored.inserted,
            updated = stored.updated,
            unchanged = stored.unchanged,
            failed = stored.failed,
            deferred = stored.deferred,
            "Page stored."
        );
        self.run
            .progress
            .page_committed(self.run.connection, committed.run.counts());
    }
}

/// The page's records and the bytes of their payloads, on the page's span; nothing is
/// counted when no trace records it.
fn record_page_size(page: &Page, span: &tracing::Span) {
    if span.is_disabled() {
        return;
    }
    let bytes: usize = page
        .items
        .iter()
        .map(|item| match item {
            PageItem::Record(record) => record.payload.len(),
            PageItem::Rejected(rejected) => rejected.payload.len(),
            PageItem::Deleted(deleted) => deleted.payload.len(),
        })
        .fold(0, usize::saturating_add);
    span.record(
        "records",
        i64::try_from(page.items.len()).unwrap_or(i64::MAX),
    )
    .record("bytes", i64::try_from(bytes).unwrap_or(i64::MAX));
}

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

/// The listing a walker is in: a child stream's parent, and the watermark its pages are
/// asked from (a parent new since the stream's last complete run is listed in full).
#[derive(Default)]
struct Listing {
    parent: Option<Parent>,
    since: Option<Watermark>,
}

/// A hash of the keys and contents of `items` in order; `None` for an empty page.
fn page_fingerprint(items: &[PageItem]) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    if items.is_empty() {
        return None;
    }
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for item in items {
        match item {
            PageItem::Record(record) => {
                (&record.external_id, &record.content_hash).hash(&mut hasher)
            }
            PageItem::Rejected(rejected) => {
                (&rejected.external_id, &rejected.payload).hash(&mut hasher)
            }
            PageItem::Deleted(deleted) => {
                (&deleted.external_id, &deleted.payload).hash(&mut hasher)
            }
        }
    }
    Some(hasher.finish())
}

/// Fetches the page at `position` unless the run is cancelled first. The page's
/// watermark is clamped to the moment it was asked for: a record stamped later (a clock
/// years ahead) must not carry the cursor past changes that happen after this fetch.
async fn fetch_unless_cancelled(
    run: &RunContext<'_>,
    stream: &str,
    credential_store: &ConnectionCredentials,
    listing: &Listing,
    position: Option<&PagePosition>,
) -> Fetched {
    let credentials = credential_store.current();
    let base_url = match run.connection.base_url.as_deref().map(url::Url::parse) {
        None => None,
        Some(Ok(url)) => Some(url),
        Some(Err(error)) => {
            return Fetched::Answer(Err(FetchError::Client {
                message: format!("the connection's base_url is not a URL: {error}"),
            }))
        }
    };
    let fetch_context = FetchContext {
        stream,
        parent: listing.parent.as_ref().map(|parent| ParentRecord {
            external_id: &parent.external_id,
            payload: &parent.payload,
        }),
        credentials: &credentials,
        since: listing.since.as_ref(),
        credential_store,
        base_url: base_url.as_ref(),
    };
    let asked_at = Utc::now();
    let fetch = run.provider.fetch_page(&fetch_context, position);
    let fetch = async {
        match &run.budget {
            Some(budget) => with_budget(Arc::clone(budget), fetch).await,
            None => fetch.await,
        }
    };
    tokio::select! {
        fetched = fetch => Fetched::Answer(fetched.map(|mut page| {
            page.watermark = page.watermark.map(|watermark| watermark.at_most(asked_at));
            page
        })),
        () = run.cancel.cancelled() => Fetched::Cancelled,
    }
}
