//! Writing changes: a transaction opens a batch, points each change it records at it,
//! and as its last statement before `COMMIT` stamps the batch with its seq
//! ([`stamp_batch`]). These are the statements every backend shares; a backend writes
//! some of them its own way in `store/` (the all-new pages, SQLite's stamp in one round
//! trip).

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, Set, Statement};

use super::order::{clock_missing, FeedOrder, TRANSACTION_SEQ};
use crate::db::parameters::Binds;
use crate::entities::change::ChangeKind;
use crate::entities::change_clock::CLOCK_ROW;
use crate::entities::{change, change_batch};
use crate::pipeline::ground::names;

/// A transaction's change batch: the row its changes point to, stamped as it commits,
/// and the next free ordinal of its changes.
#[derive(Debug, PartialEq, Eq)]
pub struct ChangeBatch {
    pub id: i64,
    next: i32,
}

/// Where one statement's changes go: batch `batch_id`, at ordinals from `first` on, in
/// the order the statement writes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChangeSlot {
    pub batch_id: i64,
    pub first: i32,
}

impl ChangeBatch {
    /// The next `count` ordinals of the batch, for one statement's changes.
    pub fn reserve(&mut self, count: usize) -> Result<ChangeSlot, DbErr> {
        let first = self.next;
        self.next = i32::try_from(count)
            .ok()
            .and_then(|count| first.checked_add(count))
            .ok_or_else(|| DbErr::Custom("a change batch holds at most 2^31 changes".into()))?;
        Ok(ChangeSlot {
            batch_id: self.id,
            first,
        })
    }
}

impl ChangeSlot {
    /// The slot of the `index`-th of the statement's changes alone (a row written again
    /// by itself takes the place it had).
    pub fn at(self, index: usize) -> Result<ChangeSlot, DbErr> {
        let first = i32::try_from(index)
            .ok()
            .and_then(|index| self.first.checked_add(index))
            .ok_or_else(|| DbErr::Custom("a change's ordinal is out of range".into()))?;
        Ok(ChangeSlot { first, ..self })
    }
}

/// Whose records a batch changes, and in which run.
#[derive(Clone, Copy, Debug)]
pub struct BatchOwner<'a> {
    pub run_id: i64,
    pub user_id: &'a str,
    pub provider: &'a str,
}

/// Inserts the transaction's batch, not yet stamped (its seq stays null until
/// [`stamp_batch`], and no reader sees it before the commit).
pub async fn open_batch(
    txn: &impl ConnectionTrait,
    owner: BatchOwner<'_>,
) -> Result<ChangeBatch, DbErr> {
    let row = change_batch::ActiveModel {
        seq: Set(None),
        run_id: Set(owner.run_id),
        user_id: Set(owner.user_id.to_string()),
        provider: Set(owner.provider.to_string()),
        committed_at: Set(None),
        ..Default::default()
    };
    let inserted = change_batch::Entity::insert(row).exec(txn).await?;
    Ok(ChangeBatch {
        id: inserted.last_insert_id,
        next: 0,
    })
}

/// What a write of changes binds: a row's batch, ordinal, key and kind.
const CHANGE: Binds = Binds::new(4, 0);

/// Records one change of `kind` for each of `external_ids` at `slot`'s ordinals, in
/// order, [`CHANGE`]'s rows a statement; returns how many.
pub async fn record_changes<'k>(
    txn: &impl ConnectionTrait,
    slot: ChangeSlot,
    kind: ChangeKind,
    external_ids: impl IntoIterator<Item = &'k str>,
) -> Result<u64, DbErr> {
    let rows = change_rows(slot, kind, external_ids)?;
    for chunk in rows.chunks(CHANGE.rows(txn.get_database_backend())) {
        change::Entity::insert_many(chunk.to_vec())
            .exec_without_returning(txn)
            .await?;
    }
    Ok(rows.len() as u64)
}

/// The rows of [`record_changes`].
fn change_rows<'k>(
    slot: ChangeSlot,
    kind: ChangeKind,
    external_ids: impl IntoIterator<Item = &'k str>,
) -> Result<Vec<change::ActiveModel>, DbErr> {
    let mut rows: Vec<change::ActiveModel> = Vec::new();
    for (index, external_id) in external_ids.into_iter().enumerate() {
        rows.push(change::ActiveModel {
            batch_id: Set(slot.batch_id),
            ordinal: Set(slot.at(index)?.first),
            external_id: Set(external_id.to_string()),
            kind: Set(kind),
        });
    }
    Ok(rows)
}

/// The clock's tick: `UPDATE change_clock SET seq = seq + 1 WHERE id = 1`. Its row lock is
/// held until the transaction commits, so the next transaction's tick waits for this one
/// to commit, and seq order is commit order.
pub static TICK: LazyLock<String> = LazyLock::new(|| {
    names::sql(&format!(
        "UPDATE {{change_clock}} SET {{change_clock::Seq}} = {{change_clock::Seq}} + 1 \
         WHERE {{change_clock::Id}} = {CLOCK_ROW}"
    ))
});

/// The clock's seq as a subquery: inside the transaction that ticked it, that
/// transaction's own seq.
pub static CLOCK_SEQ: LazyLock<String> = LazyLock::new(|| {
    names::sql(&format!(
        "(SELECT {{change_clock::Seq}} FROM {{change_clock}} \
         WHERE {{change_clock::Id}} = {CLOCK_ROW})"
    ))
});

/// Stamps `batch` with its seq and the time `now`, as the transaction's last statement
/// before `COMMIT`. Where the clock ticks, the tick and then `UPDATE change_batches SET
/// seq = <the clock's seq>, committed_at = now WHERE id = batch`: from the tick on, every
/// other transaction that records changes waits for this one. On PostgreSQL one update
/// sets the transaction's own seq ([`TRANSACTION_SEQ`]) and waits for nobody.
pub async fn stamp_batch(
    txn: &impl ConnectionTrait,
    batch: &ChangeBatch,
    now: DateTime<Utc>,
) -> Result<(), DbErr> {
    let seq = match FeedOrder::of(txn.get_database_backend()) {
        FeedOrder::TransactionId => TRANSACTION_SEQ.as_str(),
        FeedOrder::Clock => {
            tick(txn).await?;
            CLOCK_SEQ.as_str()
        }
    };
    let stamped = change_batch::Entity::update_many()
        .col_expr(change_batch::Column::Seq, Expr::cust(seq))
        .col_expr(change_batch::Column::CommittedAt, Expr::value(now))
        .filter(change_batch::Column::Id.eq(batch.id))
        .filter(Expr::cust(seq).is_not_null())
        .exec(txn)
        .await?
        .rows_affected;
    match stamped {
        1 => Ok(()),
        // The batch is the transaction's own: only a missing clock row leaves no seq.
        _ => Err(clock_missing()),
    }
}

/// [`TICK`], which must change the clock's one row.
async fn tick(txn: &impl ConnectionTrait) -> Result<(), DbErr> {
    let backend = txn.get_database_backend();
    let ticked = txn
        .execute_raw(Statement::from_string(backend, TICK.as_str()))
        .await?
        .rows_affected();
    match ticked {
        1 => Ok(()),
        _ => Err(clock_missing()),
    }
}

/// Removes a batch that recorded no change (every write of its page was refused), so
/// that the transaction takes no seq.
pub async fn discard_batch(txn: &impl ConnectionTrait, batch: &ChangeBatch) -> Result<(), DbErr> {
    change_batch::Entity::delete_by_id(batch.id)
        .exec(txn)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use sea_orm::QueryTrait;

    use super::*;
    use crate::db::parameters::{max_parameters, BACKENDS};

    #[test]
    fn a_write_of_changes_binds_what_its_chunk_allows_for() {
        let slot = ChangeSlot {
            batch_id: 1,
            first: 0,
        };
        for backend in BACKENDS {
            for count in [CHANGE.rows(backend), CHANGE.rows_within_limit(backend)] {
                let keys: Vec<String> = (0..count).map(|i| format!("k{i}")).collect();
                let rows = change_rows(slot, ChangeKind::Inserted, keys.iter().map(String::as_str));
                let statement = change::Entity::insert_many(rows.unwrap()).build(backend);
                let values = statement.values.map_or(0, |values| values.0.len());
                assert_eq!(values, CHANGE.values(count), "{backend:?}");
                assert!(values <= max_parameters(backend), "{backend:?}: {values}");
            }
        }
    }
}
