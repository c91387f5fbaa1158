//! Deletions an API reports (Stripe's `customer.deleted` events): the page's transaction
//! marks the stored records deleted, as a complete listing's pass does for what it no
//! longer returned, with a `deleted` change each. A record is marked, never removed; one
//! that comes back later is restored by the usual write.

use chrono::{DateTime, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseTransaction, DbErr, EntityTrait, QueryFilter, QuerySelect,
};
use tributary_providers::DeletedRecord;

use super::backend::KEY_LOOKUP;
use super::context::PageContext;
use super::writes::PageChanges;
use crate::entities::change::ChangeKind;
use crate::entities::record;
use crate::pipeline::changes;
use crate::pipeline::ground::row;

/// Marks the live records among `deleted` deleted by the page's run at `now`, recording
/// their changes in the page's batch; returns how many it marked. Keys not stored, or
/// stored deleted already, are left as they are.
pub(crate) async fn mark(
    txn: &DatabaseTransaction,
    context: &PageContext<'_>,
    deleted: &[DeletedRecord],
    now: DateTime<Utc>,
    changes: &mut PageChanges,
) -> Result<u64, DbErr> {
    let mut marked = 0;
    // The lookup and the marks each bind a key a row and less of their own than a lookup.
    for chunk in deleted.chunks(KEY_LOOKUP.rows(txn.get_database_backend())) {
        let ids = chunk.iter().map(|item| item.external_id.as_str());
        let live: Vec<(i64, String)> = record::Entity::find()
            .select_only()
            .columns([record::Column::Id, record::Column::ExternalId])
            .filter(row::key_condition(
                &context.connection.user_id,
                context.stream.namespace(),
                ids,
            ))
            .filter(record::Column::DeletedAt.is_null())
            .into_tuple()
            .all(txn)
            .await?;
        if live.is_empty() {
            continue;
        }
        record::Entity::update_many()
            .col_expr(record::Column::DeletedAt, Expr::value(now))
            .col_expr(record::Column::DeletedByRunId, Expr::value(context.run_id))
            // A deletion is a change: readers of what changed since an instant find it.
            .col_expr(record::Column::UpdatedAt, Expr::value(now))
            .filter(record::Column::Id.is_in(live.iter().map(|(id, _)| *id)))
            .exec(txn)
            .await?;
        let slot = changes.slot(txn, context, live.len()).await?;
        let keys = live.iter().map(|(_, external_id)| external_id.as_str());
        let recorded = changes::record_changes(txn, slot, ChangeKind::Deleted, keys).await?;
        changes.recorded += recorded;
        marked += recorded;
    }
    Ok(marked)
}
