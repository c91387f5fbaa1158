//! The keys a run that tracks deletions saw: one `run_sightings` row per key, written with
//! the page that carried it, so that the run's closing transaction can tell the records
//! its complete listing no longer returned without holding any key in memory.

use std::collections::BTreeSet;

use chrono::Utc;
use sea_orm::sea_query::{OnConflict, Query};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr};
use tributary_providers::{Record, RejectedRecord};

use super::backend::{begin_page_transaction, INSERT_CHUNK};
use super::PageContext;
use crate::entities::run_sighting;
use crate::pipeline::fence;

/// The page's keys: its records' and those of the records set aside with a known key
/// (a record that failed still exists at the provider).
pub(crate) fn page_keys<'p>(records: &'p [Record], rejected: &'p [RejectedRecord]) -> Vec<&'p str> {
    let keys: BTreeSet<&str> = records
        .iter()
        .map(|record| record.external_id.as_str())
        .chain(
            rejected
                .iter()
                .filter_map(|reject| reject.external_id.as_deref()),
        )
        .collect();
    keys.into_iter().collect()
}

/// Notes that run `run_id` saw `keys`; a key seen before in the run is skipped.
pub(crate) async fn record(
    txn: &impl ConnectionTrait,
    run_id: i64,
    keys: &[&str],
) -> Result<(), DbErr> {
    for chunk in keys.chunks(INSERT_CHUNK) {
        let mut insert = Query::insert();
        insert.into_table(run_sighting::Entity).columns([
            run_sighting::Column::RunId,
            run_sighting::Column::ExternalId,
        ]);
        for key in chunk {
            insert
                .values([run_id.into(), (*key).into()])
                .map_err(|error| DbErr::Custom(format!("building the sightings: {error}")))?;
        }
        insert.on_conflict(
            OnConflict::columns([
                run_sighting::Column::RunId,
                run_sighting::Column::ExternalId,
            ])
            .do_nothing_on([run_sighting::Column::RunId])
            .to_owned(),
        );
        txn.execute(&insert).await?;
    }
    Ok(())
}

/// The sightings of a page that writes no record, in a transaction of their own (its
/// counters ride with the run's next commit as they would without them), fenced like a
/// page: written only while the run holds its rows.
pub(crate) async fn record_alone(
    db: &DatabaseConnection,
    context: &PageContext<'_>,
    keys: &[&str],
) -> Result<(), DbErr> {
    if keys.is_empty() {
        return Ok(());
    }
    let txn = begin_page_transaction(db).await?;
    let (run_id, fence) = (context.run_id, context.lease);
    if let Err(unheld) = fence::hold(&txn, run_id, context.connection.id, fence, Utc::now()).await?
    {
        txn.rollback().await?;
        return Err(unheld.into_error(run_id, fence));
    }
    record(&txn, run_id, keys).await?;
    txn.commit().await
}
