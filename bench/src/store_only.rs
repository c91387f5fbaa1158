//! The `store_only` phase: the pipeline's database side alone, as the ceiling a first
//! sync could reach on the same machine at the same time.
//!
//! Every connection gets a run of its own, and U x R new records, already identified and
//! hashed, go through [`Run::store`] a page of 100 at a time, `concurrency` connections at
//! once, exactly as a first sync stores its pages (the same transactions, statements,
//! bookkeeping and checkpoints). Nothing is fetched, parsed or hashed while the phase is
//! timed (a page's records are only assembled from prepared parts), so the figure is what
//! the database and the store take alone. The machine's own speed varies from day to day
//! by more than the gaps this benchmark looks for; a first sync read against this figure
//! from the same run says how much of its time is the database's.
//!
//! The records are keyed `store-<charge id>` so they never meet the synced charges, and
//! their payloads are the charges of one page, reused on every page: the database sees the
//! same sizes, and the phase builds no JSON while it is timed.

use std::time::Instant;

use futures::stream::{self, StreamExt};
use sea_orm::{ColumnTrait, DbErr, EntityTrait, QueryFilter, QueryOrder};
use tributary_providers::record::sha256_hex;
use tributary_providers::{PageItem, PagePosition, Record};

use super::emulator::Dataset;
use super::report::{self, PhaseReport};
use super::verify::{self, Check};
use super::PROVIDER;
use tributary::config::{StreamSettings, WriteMode};
use tributary::db::DatabasePools;
use tributary::entities::connection;
use tributary::entities::sync_run::{RunStatus, Trigger};
use tributary::pipeline::{Checkpoint, PageExpectation, Run, RunCounts, RunEnd, RunPage};

/// Records per stored page, as the emulator serves them.
const PAGE_SIZE: u64 = 100;

/// The prefix of this phase's external ids.
const ID_PREFIX: &str = "store-";

/// Runs the phase on `db`, which holds the configured connections of [`PROVIDER`], and
/// checks that every record went in once.
pub async fn run_store_only(
    db: &DatabasePools,
    dataset: &Dataset,
    concurrency: usize,
) -> anyhow::Result<PhaseReport> {
    let connections = connection::Entity::find()
        .filter(connection::Column::Provider.eq(PROVIDER))
        .order_by_asc(connection::Column::Id)
        .all(&**db)
        .await?;
    let payloads: Vec<(String, String)> = (0..PAGE_SIZE.min(dataset.records_per_user))
        .map(|index| {
            let mut payload = String::new();
            dataset.write_charge(&mut payload, 1, index, 0);
            let hash = sha256_hex(payload.as_bytes());
            (payload, hash)
        })
        .collect();
    let before = verify::fingerprint(db, PROVIDER).await?;
    let mut runs = Vec::with_capacity(connections.len());
    for connection in &connections {
        let stream = charges_stream(connection);
        runs.push(Run::open(db, connection, &stream, Trigger::Manual, None).await?);
    }

    let started = Instant::now();
    // Unordered, as `sync_provider` runs connections: a run that finishes starts the next.
    let stored: Vec<(Run<'_>, Option<DbErr>)> = stream::iter(runs)
        .map(|mut run| {
            let payloads = &payloads;
            async move {
                let error = store_all(dataset, payloads, &mut run).await;
                (run, error)
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let seconds = started.elapsed().as_secs_f64();

    // Every run is closed with the counters of the pages it committed, and every
    // checkpoint the phase left is cleared, also when a page failed: a database given with
    // --database-url is kept, and its next sync must not resume from this phase's
    // positions.
    let mut totals: Vec<RunCounts> = Vec::with_capacity(stored.len());
    let mut failure = None;
    for (run, error) in stored {
        let message = error.as_ref().map(ToString::to_string);
        let end = RunEnd {
            status: match error {
                None => RunStatus::Succeeded,
                Some(_) => RunStatus::Failed,
            },
            error: message.as_deref(),
            listing_complete: false,
            checkpoint: tributary::pipeline::CheckpointMove::Write(None),
            watermark: None,
            notify: tributary::config::NotifyRuns::None,
            deletions: tributary::pipeline::DeletionPass::Off,
            full_passes_served: 0,
            authorization_refused: false,
        };
        totals.push(*run.counts());
        run.close(end).await?;
        failure = failure.or(error);
    }
    if let Some(error) = failure {
        anyhow::bail!("the store_only phase failed: {error}");
    }
    let after = verify::fingerprint(db, PROVIDER).await?;
    let total = u64::from(dataset.users) * dataset.records_per_user;
    let sum = |field: fn(&RunCounts) -> u64| totals.iter().map(field).sum::<u64>();
    let checks = vec![
        Check::equal("connections", connections.len(), dataset.users as usize),
        Check::equal("inserted", sum(|c| c.inserted), total),
        Check::equal("records failed", sum(|c| c.failed), 0),
        Check::equal("rows in records", after.rows, before.rows + total as i64),
        Check::equal("duplicate keys", verify::duplicate_keys(db).await?, 0),
    ];
    Ok(PhaseReport {
        name: "store_only".to_string(),
        seconds,
        records: total,
        records_per_sec: total as f64 / seconds.max(1e-9),
        pages: sum(|c| c.pages_fetched),
        inserted: sum(|c| c.inserted),
        updated: sum(|c| c.updated),
        unchanged: sum(|c| c.unchanged),
        failed: sum(|c| c.failed),
        records_rows_written: None,
        sequential_latency_seconds: 0.0,
        latency_floor_seconds: 0.0,
        peak_rss_bytes: report::peak_rss(),
        checks,
    })
}

/// The Stripe connection's primary stream, whose records keep the provider's name.
fn charges_stream(connection: &connection::Model) -> StreamSettings {
    StreamSettings {
        name: "charges".to_string(),
        namespace: connection.provider.clone(),
        parent: None,
    }
}

/// Stores every record of one connection through its `run`, page by page, each page
/// committing its checkpoint as a first sync's would; the run keeps the counters of the
/// pages committed. Returns the error that stopped it, if one did.
async fn store_all(
    dataset: &Dataset,
    payloads: &[(String, String)],
    run: &mut Run<'_>,
) -> Option<DbErr> {
    let mut start = 0;
    while start < dataset.records_per_user {
        let end = (start + PAGE_SIZE).min(dataset.records_per_user);
        let items: Vec<PageItem> = (start..end)
            .zip(payloads.iter().cycle())
            .map(|(index, (payload, hash))| {
                PageItem::Record(Record {
                    external_id: format!("{ID_PREFIX}{}", dataset.charge_id(index)),
                    payload: payload.clone(),
                    content_hash: hash.clone(),
                })
            })
            .collect();
        let next = (end < dataset.records_per_user).then(|| Checkpoint {
            position: Some(PagePosition::Cursor {
                cursor: dataset.charge_id(end - 1),
            }),
            parent: None,
            walk_started: None,
            since: None,
            watermark: None,
        });
        let page = RunPage {
            items,
            next_checkpoint: next.as_ref(),
            mode: WriteMode::Upsert,
            expect: PageExpectation::New,
            // As the pipeline does: the page counts as fetched once it is committed.
            pages: 1,
            ..RunPage::default()
        };
        if let Err(error) = run.store(page).await {
            return Some(error);
        }
        start = end;
    }
    None
}
