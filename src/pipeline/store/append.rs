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
    ColumnTrait, DatabaseConnection, DatabaseTransaction, DbErr, EntityTrait, QueryFilter,
    QuerySelect, Set,
};
use tributary_providers::Record;

use super::backend::StoreBackend;
use super::{insert_carefully, InsertOutcome, PageChanges, PageContext};
use crate::entities::processed_key;

/// How many keys one lookup carries.
const LOOKUP_CHUNK: usize = 500;

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
    ) -> Result<InsertOutcome, DbErr> {
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
        for chunk in rows.chunks(LOOKUP_CHUNK) {
            processed_key::Entity::insert_many(chunk.to_vec())
                .on_conflict(
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
                .exec_without_returning(txn)
                .await?;
        }
        Ok(outcome)
    }
}

/// The page's keys that were processed and have not expired.
async fn processed_keys(
    txn: &DatabaseTransaction,
    context: &PageContext<'_>,
    records: &[Record],
    now: DateTime<Utc>,
) -> Result<HashSet<String>, DbErr> {
    let mut processed = HashSet::new();
    for chunk in records.chunks(LOOKUP_CHUNK) {
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
pub async fn sweep_expired_keys(db: &DatabaseConnection) -> Result<u64, DbErr> {
    let deleted = processed_key::Entity::delete_many()
        .filter(processed_key::Column::ExpiresAt.lte(Utc::now()))
        .exec(db)
        .await?
        .rows_affected;
    if deleted > 0 {
        tracing::info!(keys = deleted, "Expired processed keys swept.");
    }
    Ok(deleted)
}
