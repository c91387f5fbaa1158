//! The keys a run that tracks deletions saw: one `run_sightings` row per key, written with
//! the page that carried it, so that the run's closing transaction can tell the records
//! its complete listing no longer returned without holding any key in memory.

use std::collections::BTreeSet;

use sea_orm::sea_query::{InsertStatement, OnConflict, Query};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr};
use tributary_providers::{Record, RejectedRecord};

use super::context::PageContext;
use crate::db::parameters::Binds;
use crate::entities::run_sighting;
use crate::pipeline::fence;
use crate::pipeline::ground::begin_page_transaction;

/// What a write of sightings binds: a row's run and key.
const SIGHTING: Binds = Binds::new(2, 0);

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
    for chunk in keys.chunks(SIGHTING.rows(txn.get_database_backend())) {
        txn.execute(&sightings_insert(run_id, chunk)?).await?;
    }
    Ok(())
}

/// `INSERT INTO run_sightings ... ON CONFLICT DO NOTHING`, a row per key.
fn sightings_insert(run_id: i64, keys: &[&str]) -> Result<InsertStatement, DbErr> {
    let mut insert = Query::insert();
    insert.into_table(run_sighting::Entity).columns([
        run_sighting::Column::RunId,
        run_sighting::Column::ExternalId,
    ]);
    for key in keys {
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
    Ok(insert)
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
    if let Err(unheld) =
        fence::hold(&txn, run_id, context.connection.id, fence, crate::db::now()).await?
    {
        txn.rollback().await?;
        return Err(unheld.into_error(run_id, fence));
    }
    record(&txn, run_id, keys).await?;
    txn.commit().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::parameters::{max_parameters, BACKENDS};

    #[test]
    fn a_write_of_sightings_binds_what_its_chunk_allows_for() {
        for backend in BACKENDS {
            for count in [SIGHTING.rows(backend), SIGHTING.rows_within_limit(backend)] {
                let keys: Vec<String> = (0..count).map(|i| format!("k{i}")).collect();
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                let statement = backend.build(&sightings_insert(1, &keys).unwrap());
                let values = statement.values.map_or(0, |values| values.0.len());
                assert_eq!(values, SIGHTING.values(count), "{backend:?}");
                assert!(values <= max_parameters(backend), "{backend:?}: {values}");
            }
        }
    }
}
