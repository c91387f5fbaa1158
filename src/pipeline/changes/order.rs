//! How each backend puts committed batches in an order a reader can follow.
//!
//! SQLite and MariaDB/MySQL tick the one-row clock as a transaction's last statement: its
//! row lock is held to the commit, so seq order is commit order. PostgreSQL stamps a batch
//! with its transaction's id instead (plus the clock's offset), which takes no shared
//! lock, and a reader reads only below its snapshot's `xmin`: every transaction with a
//! smaller id has ended by then, and any that commits later has an id at or above it, so
//! nothing can appear behind a reader's cursor (docs/decisions/change-feed.md).

use std::sync::LazyLock;

use sea_orm::{ConnectionTrait, DbBackend, DbErr, Statement};

use crate::entities::change_clock::CLOCK_ROW;
use crate::pipeline::ground::names;

/// How a backend orders its batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FeedOrder {
    /// The clock's tick as the last statement before the commit (SQLite, MySQL).
    Clock,
    /// The writing transaction's id, read below the snapshot's `xmin` (PostgreSQL).
    TransactionId,
}

impl FeedOrder {
    pub(crate) fn of(backend: DbBackend) -> FeedOrder {
        match backend {
            DbBackend::Postgres => FeedOrder::TransactionId,
            _ => FeedOrder::Clock,
        }
    }
}

/// PostgreSQL: the seq of the current transaction's batch, its 64-bit transaction id
/// plus the clock's offset (raised by [`align_clock`] after a restore).
pub(crate) static TRANSACTION_SEQ: LazyLock<String> = LazyLock::new(|| {
    names::sql(&format!(
        "((SELECT {{change_clock::Seq}} FROM {{change_clock}} \
         WHERE {{change_clock::Id}} = {CLOCK_ROW}) + pg_current_xact_id()::text::bigint)"
    ))
});

/// The oldest transaction id still running when the statement's snapshot was taken (or
/// the next to be assigned when none runs).
const SNAPSHOT_XMIN: &str = "pg_snapshot_xmin(pg_current_snapshot())::text::bigint";

/// The clock's row as a reader sees it, `seq` being the newest seq it may read: on
/// PostgreSQL the offset plus its snapshot's `xmin`, less one.
static READ_CLOCK: LazyLock<String> = LazyLock::new(|| {
    names::sql(&format!(
        "SELECT {{change_clock::Seq}} + {SNAPSHOT_XMIN} - 1 AS seq, \
         {{change_clock::SweptSeq}} AS swept_seq FROM {{change_clock}} \
         WHERE {{change_clock::Id}} = {CLOCK_ROW}"
    ))
});

/// The next transaction id to be assigned when the statement's snapshot was taken.
const SNAPSHOT_XMAX: &str = "pg_snapshot_xmax(pg_current_snapshot())::text::bigint";

/// Raises the offset when a stored seq is at or above what a transaction not yet begun
/// would be stamped with, which no transaction of this cluster can have stamped: a
/// database restored from a logical dump into another cluster, whose transaction ids
/// start again from small numbers. The new offset puts even the running transactions'
/// seqs above the stored ones. (A batch committed by a transaction younger than a
/// running one is normal, and above `xmin`: comparing with `xmin` would move the offset
/// under a running writer's stamp.)
static ALIGN_CLOCK: LazyLock<String> = LazyLock::new(|| {
    names::sql(&format!(
        "UPDATE {{change_clock}} SET {{change_clock::Seq}} = b.top + 1 - x.xmin \
         FROM (SELECT max({{change_batch::Seq}}) AS top FROM {{change_batches}}) AS b, \
         (SELECT {SNAPSHOT_XMIN} AS xmin, {SNAPSHOT_XMAX} AS xmax) AS x \
         WHERE {{change_clock::Id}} = {CLOCK_ROW} AND b.top IS NOT NULL \
         AND {{change_clock::Seq}} + x.xmax <= b.top"
    ))
});

/// The clock's row as it is: where it ticks, its seq is the newest batch's.
static READ_TICKED_CLOCK: LazyLock<String> = LazyLock::new(|| {
    names::sql(&format!(
        "SELECT {{change_clock::Seq}} AS seq, {{change_clock::SweptSeq}} AS swept_seq \
         FROM {{change_clock}} WHERE {{change_clock::Id}} = {CLOCK_ROW}"
    ))
});

/// The newest seq a reader may read, and the highest swept one, read in `db`'s snapshot.
pub(crate) async fn read_clock(db: &impl ConnectionTrait) -> Result<(i64, i64), DbErr> {
    let backend = db.get_database_backend();
    let sql = match FeedOrder::of(backend) {
        FeedOrder::TransactionId => READ_CLOCK.as_str(),
        FeedOrder::Clock => READ_TICKED_CLOCK.as_str(),
    };
    let statement = Statement::from_string(backend, sql);
    let row = db
        .query_one_raw(statement)
        .await?
        .ok_or_else(clock_missing)?;
    Ok((row.try_get("", "seq")?, row.try_get("", "swept_seq")?))
}

/// On PostgreSQL, makes every batch written from now on order after every batch already
/// stored; returns whether the offset had to move. Elsewhere the clock carries on by
/// itself, and this does nothing.
pub async fn align_clock(db: &impl ConnectionTrait) -> Result<bool, DbErr> {
    let backend = db.get_database_backend();
    if FeedOrder::of(backend) != FeedOrder::TransactionId {
        return Ok(false);
    }
    let moved = db
        .execute_raw(Statement::from_string(backend, ALIGN_CLOCK.as_str()))
        .await?
        .rows_affected();
    Ok(moved > 0)
}

/// The error for a database whose clock row is gone: no change can be ordered.
pub(crate) fn clock_missing() -> DbErr {
    DbErr::Custom(format!(
        "the change feed's clock row (change_clock, id = {CLOCK_ROW}) is missing, so no \
         change can be ordered; the migrations create it and nothing may delete it"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_names_its_tables_and_columns() {
        for sql in [
            &*TRANSACTION_SEQ,
            &*READ_CLOCK,
            &*READ_TICKED_CLOCK,
            &*ALIGN_CLOCK,
        ] {
            assert!(!sql.contains('{'), "{sql}");
        }
    }
}
