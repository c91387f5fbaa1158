//! The feed's readers: where each one's reads have reached and when it last read, one row
//! per reader in `feed_readers`, and how far behind the head each is
//! (docs/decisions/feed-readers.md).
//!
//! A read adds one indexed `SELECT` of its reader's row, and a write only when one is due:
//! the position moved and the row is older than [`MOVE_EVERY`], or it did not move and the
//! row is older than [`REFRESH_EVERY`]. Each write is conditional on the row as the
//! database holds it, so concurrent reads on several instances write at most once per
//! interval, and a position never moves back, whatever order they commit in.

use chrono::{DateTime, TimeDelta, Utc};
use sea_orm::sea_query::{Alias, Expr, ExprTrait, OnConflict, Query};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect, Set,
};

use super::cursor::Cursor;
use super::read::{feed_start, snapshot, FeedStart};
use crate::entities::{change, change_batch, feed_reader};

/// A moving reader's row is written at most this often.
pub(crate) const MOVE_EVERY: TimeDelta = TimeDelta::seconds(5);
/// A reader polling at the same position has its `read_at` refreshed this often.
pub(crate) const REFRESH_EVERY: TimeDelta = TimeDelta::seconds(60);
/// Unread changes are counted up to this many, so that a reader far behind costs the
/// operator page a bounded scan.
pub(crate) const COUNT_CAP: u64 = 100_000;

/// The reader that an API key is.
pub(crate) fn key_reader(key_id: i64) -> String {
    format!("key:{key_id}")
}

/// What [`note_read`] wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Noted {
    /// The reader's first read: its row.
    Inserted,
    /// Its position moved forward.
    Moved,
    /// Its position stayed; `read_at` was refreshed.
    Refreshed,
    /// Nothing was due, or another read wrote first.
    Skipped,
}

/// Notes that `reader` (API key `key_id`) read up to `position` at `now`.
pub(crate) async fn note_read(
    db: &DatabaseConnection,
    reader: &str,
    key_id: Option<i64>,
    position: Cursor,
    now: DateTime<Utc>,
) -> Result<Noted, DbErr> {
    let row = feed_reader::Entity::find()
        .filter(feed_reader::Column::Reader.eq(reader))
        .one(db)
        .await?;
    let Some(row) = row else {
        let inserted = feed_reader::Entity::insert(feed_reader::ActiveModel {
            reader: Set(reader.to_string()),
            key_id: Set(key_id),
            seq: Set(position.seq),
            ordinal: Set(position.ordinal),
            read_at: Set(now),
            ..Default::default()
        })
        .on_conflict(
            OnConflict::column(feed_reader::Column::Reader)
                // MySQL has no DO NOTHING: `ON DUPLICATE KEY UPDATE ... = ...` changes no row.
                .do_nothing_on([feed_reader::Column::Reader])
                .to_owned(),
        )
        .exec_without_returning(db)
        .await?;
        // A concurrent first read inserted it: the next read moves it on.
        return Ok(if inserted > 0 {
            Noted::Inserted
        } else {
            Noted::Skipped
        });
    };
    let stored = Cursor {
        seq: row.seq,
        ordinal: row.ordinal,
    };
    let written = match position > stored {
        true if row.read_at <= now - MOVE_EVERY => advance(db, row.id, position, now).await?,
        false if row.read_at <= now - REFRESH_EVERY => refresh(db, row.id, now).await?,
        _ => return Ok(Noted::Skipped),
    };
    Ok(match (written, position > stored) {
        (false, _) => Noted::Skipped,
        (true, true) => Noted::Moved,
        (true, false) => Noted::Refreshed,
    })
}

/// Moves reader row `id` to `position` at `now`, unless another read wrote it within
/// [`MOVE_EVERY`] or moved it as far already: both are checked by the database on the
/// row it holds, so a read that reached further and wrote first is never moved back.
/// Whether it moved.
pub(super) async fn advance(
    db: &DatabaseConnection,
    id: i64,
    position: Cursor,
    now: DateTime<Utc>,
) -> Result<bool, DbErr> {
    let behind = sea_orm::Condition::any()
        .add(feed_reader::Column::Seq.lt(position.seq))
        .add(
            feed_reader::Column::Seq
                .eq(position.seq)
                .and(feed_reader::Column::Ordinal.lt(position.ordinal)),
        );
    let moved = feed_reader::Entity::update_many()
        .col_expr(feed_reader::Column::Seq, Expr::value(position.seq))
        .col_expr(feed_reader::Column::Ordinal, Expr::value(position.ordinal))
        .col_expr(feed_reader::Column::ReadAt, Expr::value(now))
        .filter(feed_reader::Column::Id.eq(id))
        .filter(feed_reader::Column::ReadAt.lte(now - MOVE_EVERY))
        .filter(behind)
        .exec(db)
        .await?;
    Ok(moved.rows_affected > 0)
}

/// Notes that reader row `id` read at `now` without moving, unless another read did
/// within [`REFRESH_EVERY`].
async fn refresh(db: &DatabaseConnection, id: i64, now: DateTime<Utc>) -> Result<bool, DbErr> {
    let refreshed = feed_reader::Entity::update_many()
        .col_expr(feed_reader::Column::ReadAt, Expr::value(now))
        .filter(feed_reader::Column::Id.eq(id))
        .filter(feed_reader::Column::ReadAt.lte(now - REFRESH_EVERY))
        .exec(db)
        .await?;
    Ok(refreshed.rows_affected > 0)
}

/// Forgets the reader an API key was: a revoked key reads no more.
pub(crate) async fn forget_reader(db: &DatabaseConnection, reader: &str) -> Result<(), DbErr> {
    feed_reader::Entity::delete_many()
        .filter(feed_reader::Column::Reader.eq(reader))
        .exec(db)
        .await?;
    Ok(())
}

/// One reader and how far behind the head it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ReaderLag {
    pub reader: String,
    pub key_id: Option<i64>,
    pub position: Cursor,
    pub read_at: DateTime<Utc>,
    /// The changes after its position up to the head, counted up to one past
    /// [`COUNT_CAP`].
    pub unread: u64,
    /// When the first change it has not read committed; `None` when it has read them all.
    pub oldest_unread_at: Option<DateTime<Utc>>,
    /// Whether changes after its position were swept: its next read is refused.
    pub expired: bool,
    /// Where it stands in the list of readers.
    pub place: ReaderPlace,
}

/// A reader's place in the list, the furthest behind first: its position, then its row.
/// A position only moves forward, so a page after a place skips no reader that existed
/// before the first page was read; a reader that moved on meanwhile is listed again at
/// its new place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReaderPlace {
    pub position: Cursor,
    pub id: i64,
}

/// The feed's head and start, and a page of its readers, from one snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FeedReaders {
    pub head: Cursor,
    pub start: FeedStart,
    pub readers: Vec<ReaderLag>,
    /// The place the next page starts after; `None` on the last page.
    pub next: Option<ReaderPlace>,
}

/// At most `limit` readers after place `after`, the furthest behind first, with their
/// lag behind the head: two indexed statements a reader.
pub(crate) async fn reader_lags(
    db: &DatabaseConnection,
    after: Option<ReaderPlace>,
    limit: u64,
) -> Result<FeedReaders, DbErr> {
    let (txn, clock) = snapshot(db).await?;
    let mut select = feed_reader::Entity::find();
    if let Some(after) = after {
        let (seq, ordinal, id) = (
            feed_reader::Column::Seq,
            feed_reader::Column::Ordinal,
            feed_reader::Column::Id,
        );
        select = select.filter(
            sea_orm::Condition::any()
                .add(seq.gt(after.position.seq))
                .add(
                    seq.eq(after.position.seq)
                        .and(ordinal.gt(after.position.ordinal)),
                )
                .add(
                    seq.eq(after.position.seq)
                        .and(ordinal.eq(after.position.ordinal))
                        .and(id.gt(after.id)),
                ),
        );
    }
    let mut rows = select
        .order_by_asc(feed_reader::Column::Seq)
        .order_by_asc(feed_reader::Column::Ordinal)
        .order_by_asc(feed_reader::Column::Id)
        .limit(limit.saturating_add(1))
        .all(&txn)
        .await?;
    let more = u64::try_from(rows.len()).unwrap_or(u64::MAX) > limit;
    rows.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    let mut readers = Vec::with_capacity(rows.len());
    for row in rows {
        let position = Cursor {
            seq: row.seq,
            ordinal: row.ordinal,
        };
        let (unread, oldest_unread_at) = unread_after(&txn, position, clock.seq).await?;
        readers.push(ReaderLag {
            reader: row.reader,
            key_id: row.key_id,
            position,
            read_at: row.read_at,
            unread,
            oldest_unread_at,
            expired: clock.expired(position),
            place: ReaderPlace {
                position,
                id: row.id,
            },
        });
    }
    let start = feed_start(&txn, clock).await?;
    txn.commit().await?;
    Ok(FeedReaders {
        head: clock.head(),
        start,
        next: readers.last().map(|reader| reader.place).filter(|_| more),
        readers,
    })
}

/// How many changes after `position` up to seq `head` there are (up to one past
/// [`COUNT_CAP`]),
/// and when the first of them committed.
async fn unread_after(
    txn: &impl ConnectionTrait,
    position: Cursor,
    head: i64,
) -> Result<(u64, Option<DateTime<Utc>>), DbErr> {
    let seq = (change_batch::Entity, change_batch::Column::Seq);
    let ordinal = (change::Entity, change::Column::Ordinal);
    let committed_at = (change_batch::Entity, change_batch::Column::CommittedAt);
    let unread = Query::select()
        .from(change::Entity)
        .inner_join(
            change_batch::Entity,
            Expr::col((change_batch::Entity, change_batch::Column::Id))
                .equals((change::Entity, change::Column::BatchId)),
        )
        .and_where(Expr::col(seq).lte(head))
        .cond_where(
            sea_orm::Condition::any()
                .add(Expr::col(seq).gt(position.seq))
                .add(
                    Expr::col(seq)
                        .eq(position.seq)
                        .and(Expr::col(ordinal).gt(position.ordinal)),
                ),
        )
        .to_owned();
    let first = unread
        .clone()
        .column(committed_at)
        .order_by(seq, sea_orm::Order::Asc)
        .order_by(ordinal, sea_orm::Order::Asc)
        .limit(1)
        .to_owned();
    let Some(first) = txn.query_one(&first).await? else {
        return Ok((0, None));
    };
    let oldest: Option<DateTime<Utc>> = first.try_get_by_index(0)?;
    let capped = unread
        .clone()
        .expr_as(Expr::val(1), "one")
        // One past the cap tells "exactly the cap" from "more".
        .limit(COUNT_CAP + 1)
        .to_owned();
    let count = Query::select()
        .expr_as(Expr::cust("COUNT(*)"), "unread")
        .from_subquery(capped, Alias::new("unread_changes"))
        .to_owned();
    let counted: i64 = match txn.query_one(&count).await? {
        Some(row) => row.try_get_by_index(0)?,
        None => 0,
    };
    Ok((u64::try_from(counted).unwrap_or(0), oldest))
}
