//! Rewriting a page's changed records: one `UPDATE ... SET payload = CASE id WHEN ...`
//! per chunk of the page, or one record at a time in a savepoint when a batch failed.

use chrono::{DateTime, Utc};
use sea_orm::sea_query::{CaseStatement, Expr};
use sea_orm::{ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter};
use tributary_providers::Record;

use crate::entities::record;
use crate::pipeline::insert::{chunks_by_size, record_size, StatementLimits};

/// A stored record (its row id) and its new content.
pub type ChangedRecord<'r> = (i64, &'r Record);

/// Rewrites every changed record of a page, a chunk per statement (sized like the
/// inserts, so a statement stays under one TLS record on a server). The first failing
/// statement fails the whole call; the caller then retries record by record, each a
/// batch of one.
pub async fn update_batch(
    txn: &impl ConnectionTrait,
    run_id: i64,
    changed: &[ChangedRecord<'_>],
    now: DateTime<Utc>,
    limits: StatementLimits,
) -> Result<u64, DbErr> {
    let mut updated = 0;
    for chunk in chunks_by_size(changed, limits, |(_, record)| record_size(record)) {
        let ids = chunk.iter().map(|(id, _)| *id);
        let mut payload = CaseStatement::new();
        let mut content_hash = CaseStatement::new();
        for (id, record) in chunk {
            payload = payload.case(
                record::Column::Id.eq(*id),
                Expr::value(record.payload.clone()),
            );
            content_hash = content_hash.case(
                record::Column::Id.eq(*id),
                Expr::value(record.content_hash.clone()),
            );
        }
        // The `ELSE` never applies (the `WHERE` names the same ids); it keeps the column
        // as it is rather than NULL should it ever.
        let payload = payload.finally(Expr::col(record::Column::Payload));
        let content_hash = content_hash.finally(Expr::col(record::Column::ContentHash));
        record::Entity::update_many()
            .col_expr(record::Column::Payload, payload.into())
            .col_expr(record::Column::ContentHash, content_hash.into())
            .col_expr(record::Column::LastSeenRunId, Expr::value(run_id))
            .col_expr(record::Column::UpdatedAt, Expr::value(now))
            .filter(record::Column::Id.is_in(ids))
            .exec(txn)
            .await?;
        updated += chunk.len() as u64;
    }
    Ok(updated)
}
