//! The feed's retention: batches stamped longer ago than `[changes] retention` are
//! deleted with their changes, a chunk at a time, after the clock remembers the highest
//! seq deleted (`swept_seq`). A reader whose cursor is older than it gets
//! [`super::FeedError::Expired`], never a silent gap.

use std::time::Duration;

use sea_orm::sea_query::Expr;
use sea_orm::{
    ColumnTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect,
};

use crate::entities::change_clock::CLOCK_ROW;
use crate::entities::{change, change_batch, change_clock};

/// How many batches one delete covers.
const SWEEP_CHUNK: u64 = 500;

/// What one sweep removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SweptChanges {
    pub batches: u64,
    pub changes: u64,
    /// The highest seq deleted, if any.
    pub swept_seq: Option<i64>,
}

/// Deletes the batches stamped more than `retention` ago, and their changes.
///
/// The swept seq is raised first, in a commit of its own, and the rows deleted after: a
/// reader that sees any of them gone also sees the raised seq, and refuses a cursor
/// from before it. Each delete is a short transaction of its own, so the sweep never
/// holds the clock's row while it deletes.
pub async fn sweep_expired_changes(
    db: &DatabaseConnection,
    retention: Duration,
) -> Result<SweptChanges, DbErr> {
    // Config validation bounds the retention; one beyond a timestamp's range expires
    // nothing.
    let Some(cutoff) = chrono::Duration::from_std(retention)
        .ok()
        .and_then(|retention| crate::db::now().checked_sub_signed(retention))
    else {
        return Ok(SweptChanges::default());
    };
    // Only batches a reader may read already: on PostgreSQL one still behind a running
    // transaction would raise the swept seq past readers that are up to date.
    let (newest_readable, _) = super::order::read_clock(db).await?;
    let newest_expired: Option<i64> = change_batch::Entity::find()
        .select_only()
        .column_as(change_batch::Column::Seq.max(), "seq")
        .filter(change_batch::Column::CommittedAt.lt(cutoff))
        .filter(change_batch::Column::Seq.lte(newest_readable))
        .into_tuple::<Option<i64>>()
        .one(db)
        .await?
        .flatten();
    let Some(swept_seq) = newest_expired else {
        return Ok(SweptChanges::default());
    };
    change_clock::Entity::update_many()
        .col_expr(change_clock::Column::SweptSeq, Expr::value(swept_seq))
        .filter(change_clock::Column::Id.eq(CLOCK_ROW))
        .filter(change_clock::Column::SweptSeq.lt(swept_seq))
        .exec(db)
        .await?;

    let mut swept = SweptChanges {
        swept_seq: Some(swept_seq),
        ..SweptChanges::default()
    };
    loop {
        let ids: Vec<i64> = change_batch::Entity::find()
            .select_only()
            .column(change_batch::Column::Id)
            .filter(change_batch::Column::Seq.lte(swept_seq))
            .order_by_asc(change_batch::Column::Seq)
            .limit(SWEEP_CHUNK)
            .into_tuple()
            .all(db)
            .await?;
        if ids.is_empty() {
            break;
        }
        // Changes first: a sweep stopped between the two deletes leaves an empty batch
        // below the swept seq, which no reader can reach.
        swept.changes += change::Entity::delete_many()
            .filter(change::Column::BatchId.is_in(ids.iter().copied()))
            .exec(db)
            .await?
            .rows_affected;
        swept.batches += change_batch::Entity::delete_many()
            .filter(change_batch::Column::Id.is_in(ids.iter().copied()))
            .exec(db)
            .await?
            .rows_affected;
    }
    if swept.batches > 0 {
        tracing::info!(
            batches = swept.batches,
            changes = swept.changes,
            swept_seq,
            "Expired changes swept."
        );
    }
    Ok(swept)
}
