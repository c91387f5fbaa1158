//! `mode = "append"`: event-log providers whose records are never updated in place.
//!
//! Keys written are tracked in `processed_keys` for the provider's `retention`; a key
//! found there is a duplicate whatever its content (a late retry of an event already
//! taken). Expired keys are swept on a schedule, which keeps the table as small as the
//! window in which a retry can plausibly arrive. The records' own unique index stays the
//! backstop for as long as the record is kept.

use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::sea_query::OnConflict;
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbErr, EntityTrait,
    InsertMany, QueryFilter, QuerySelect, Set,
};
use tributary_providers::Record;

use super::backend::{StoreBackend, StoreError, KEY_LOOKUP};
use super::context::PageContext;
use super::writes::{insert_carefully, InsertOutcome, PageChanges};
use crate::db::parameters::Binds;
use crate::entities::processed_key;

/// What a write of processed keys binds: a row's user, provider, key and two times.
const PROCESSED_KEY: Binds = Binds::new(5, 0);

/// A page of events being written, in its transaction.
pub(crate) struct NewKeys<'a> {
    pub backend: &'a dyn StoreBackend,
    pub txn: &'a DatabaseTransaction,
    pub context: &'a PageContext<'a>,
    pub retention: Duration,
    pub now: DateTime<Utc>,
}

impl NewKeys<'_> {
    /// Writes the page's records whose keys were not processed within the retention, and
    /// records their keys. Keys already processed count as duplicates. Each event written
    /// is an `inserted` change of the feed: an app follows an event log as it follows any
    /// other provider's records.
    pub(crate) async fn write(
        &self,
        records: Vec<Record>,
        changes: &mut PageChanges,
    ) -> Result<InsertOutcome, StoreError> {
        let (txn, context, now) = (self.txn, self.context, self.now);
        let processed = processed_keys(txn, context, &records, now).await?;
        let (seen, fresh): (Vec<Record>, Vec<Record>) = records
            .into_iter()
            .partition(|record| processed.contains(&record.external_id));
        let keys: Vec<String> = fresh.iter().map(|r| r.external_id.clone()).collect();
        let fresh: Vec<&Record> = fresh.iter().collect();
        let mut outcome = match fresh.is_empty() {
            true => InsertOutcome::default(),
            false => insert_carefully(self.backend, txn, context, &fresh, now, changes).await?,
        };
        changes.recorded += outcome.inserted;
        outcome.duplicate += seen.len() as u64;
        let failed: HashSet<&str> = outcome
            .failed
            .iter()
            .filter_map(|reject| reject.external_id.as_deref())
            .collect();
        // Config validation bounds the retention; should one pass it anyway, the key is
        // kept for as long as a timestamp can say rather than the write failing.
        let expires_at = chrono::Duration::from_std(self.retention)
            .ok()
            .and_then(|retention| now.checked_add_signed(retention))
            .unwrap_or(chrono::DateTime::<chrono::Utc>::MAX_UTC);
        let rows: Vec<processed_key::ActiveModel> = keys
            .iter()
            .filter(|key| !failed.contains(key.as_str()))
            .map(|key| processed_key::ActiveModel {
                user_id: Set(context.connection.user_id.clone()),
                provider: Set(context.stream.namespace().to_string()),
                external_id: Set(key.clone()),
                processed_at: Set(now),
                expires_at: Set(expires_at),
                ..Default::default()
            })
            .collect();
        for chunk in rows.chunks(PROCESSED_KEY.rows(txn.get_database_backend())) {
            processed_keys_insert(chunk.to_vec())
                .exec_without_returning(txn)
                .await?;
        }
        Ok(outcome)
    }
}

/// Inserts `rows`, a key processed again taking its new times.
fn processed_keys_insert(
    rows: Vec<processed_key::ActiveModel>,
) -> InsertMany<processed_key::ActiveModel> {
    processed_key::Entity::insert_many(rows).on_conflict(
        OnConflict::columns([
            processed_key::Column::UserId,
            processed_key::Column::Provider,
            processed_key::Column::ExternalId,
        ])
        .update_columns([
            processed_key::Column::ProcessedAt,
            processed_key::Column::ExpiresAt,
        ])
        .to_owned(),
    )
}

/// The page's keys that were processed and have not expired.
async fn processed_keys(
    txn: &DatabaseTransaction,
    context: &PageContext<'_>,
    records: &[Record],
    now: DateTime<Utc>,
) -> Result<HashSet<String>, DbErr> {
    let mut processed = HashSet::new();
    for chunk in records.chunks(KEY_LOOKUP.rows(txn.get_database_backend())) {
        let ids = chunk.iter().map(|record| record.external_id.as_str());
        let keys: Vec<String> = processed_key::Entity::find()
            .select_only()
            .column(processed_key::Column::ExternalId)
            .filter(processed_key::Column::UserId.eq(context.connection.user_id.as_str()))
            .filter(processed_key::Column::Provider.eq(context.stream.namespace()))
            .filter(processed_key::Column::ExternalId.is_in(ids))
            .filter(processed_key::Column::ExpiresAt.gt(now))
            .into_tuple()
            .all(txn)
            .await?;
        processed.extend(keys);
    }
    Ok(processed)
}

/// Deletes the keys whose retention has passed; returns how many.
pub(crate) async fn sweep_expired_keys(db: &DatabaseConnection) -> Result<u64, DbErr> {
    let deleted = processed_key::Entity::delete_many()
        .filter(processed_key::Column::ExpiresAt.lte(crate::db::now()))
        .exec(db)
        .await?
        .rows_affected;
    if deleted > 0 {
        tracing::info!(keys = deleted, "Expired processed keys swept.");
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use sea_orm::QueryTrait;

    use super::*;
    use crate::db::parameters::{max_parameters, BACKENDS};

    #[test]
    fn a_write_of_processed_keys_binds_what_its_chunk_allows_for() {
        let now = Utc::now();
        for backend in BACKENDS {
            for count in [
                PROCESSED_KEY.rows(backend),
                PROCESSED_KEY.rows_within_limit(backend),
            ] {
                let rows = (0..count).map(|i| processed_key::ActiveModel {
                    user_id: Set("alice".into()),
                    provider: Set("acme".into()),
                    external_id: Set(format!("k{i}")),
                    processed_at: Set(now),
                    expires_at: Set(now),
                    ..Default::default()
                });
                let statement = processed_keys_insert(rows.collect()).build(backend);
                let values = statement.values.map_or(0, |values| values.0.len());
                assert_eq!(values, PROCESSED_KEY.values(count), "{backend:?}");
                assert!(values <= max_parameters(backend), "{backend:?}: {values}");
            }
        }
    }

    /// Keys past their retention are swept; live ones stay.
    #[tokio::test]
    async fn keys_past_their_retention_are_swept_and_live_ones_stay() {
        let test = crate::testing::TestDb::new().await;
        let now = Utc::now();
        let key = |id: &str, expires_at| processed_key::ActiveModel {
            user_id: Set("alice".into()),
            provider: Set("acme".into()),
            external_id: Set(id.into()),
            processed_at: Set(now),
            expires_at: Set(expires_at),
            ..Default::default()
        };
        let rows = vec![
            key("expired", now - chrono::Duration::seconds(1)),
            key("live", now + chrono::Duration::days(30)),
        ];
        processed_keys_insert(rows)
            .exec(test.main())
            .await
            .expect("keys written");
        assert_eq!(sweep_expired_keys(test.main()).await.expect("swept"), 1);
        let left: Vec<String> = processed_key::Entity::find()
            .all(test.main())
            .await
            .expect("keys")
            .into_iter()
            .map(|key| key.external_id)
            .collect();
        assert_eq!(left, ["live"]);
    }
}
