//! Reading the feed: the changes after a cursor in commit order, the head, and the
//! cursors around one run.
//!
//! A read is one snapshot (a read-only `REPEATABLE READ` transaction; on SQLite, a read
//! transaction), so the head, the swept seq and the batches it reads agree: every batch
//! that will ever be stamped at or below the snapshot's head is in it, and only those
//! are read.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sea_orm::sea_query::{Expr, ExprTrait, Query};
use sea_orm::{
    AccessMode, ColumnTrait, ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend,
    DbErr, EntityTrait, FromQueryResult, IsolationLevel, QueryFilter, QueryOrder, QuerySelect,
    TransactionTrait,
};

use super::cursor::{Cursor, DatabaseId, FeedCursor};
use crate::db::parameters::Binds;
use crate::entities::change::ChangeKind;
use crate::entities::change_clock::CLOCK_ROW;
use crate::entities::{change, change_batch, change_clock, record};
use crate::pipeline::ground::row::key_condition;

/// The most changes one read returns.
pub const MAX_LIMIT: u64 = 10_000;

/// How many batches one step of a read looks at: the changes of so many batches are
/// ordered by the database in one statement, without their payloads.
const BATCHES_PER_STEP: u64 = 64;

/// What a payload lookup binds: a key a row, and the user and the provider.
const PAYLOAD_LOOKUP: Binds = Binds::new(1, 2);

/// What to read.
#[derive(Clone, Copy, Debug)]
pub struct FeedQuery<'a> {
    /// Read the changes after this position; `None` reads from the first change kept.
    pub since: Option<Cursor>,
    pub provider: Option<&'a str>,
    pub user_id: Option<&'a str>,
    /// At most this many changes (1 to [`MAX_LIMIT`]).
    pub limit: u64,
}

/// One change, with its record as it is now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeedChange {
    /// Its position: a reader that stops after it resumes from here.
    pub cursor: Cursor,
    pub user_id: String,
    pub provider: String,
    pub external_id: String,
    pub kind: ChangeKind,
    pub run_id: i64,
    /// When its batch was stamped, just before its transaction committed.
    pub committed_at: Option<DateTime<Utc>>,
    /// The record is deleted now: marked deleted by a complete listing
    /// (`records.deleted_at`), or no longer stored at all.
    pub deleted: bool,
    /// The record's current payload; `None` when it is deleted.
    pub payload: Option<String>,
}

/// What one read found, and where the next read starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeedPage {
    pub changes: Vec<FeedChange>,
    /// The cursor to read from next: after the last change returned, or, when the read
    /// reached the end of the feed, the head it saw.
    pub next: Cursor,
    /// The database whose feed was read, which the cursors shown to readers carry.
    pub database: DatabaseId,
    /// Where the feed begins, as the read saw it.
    pub start: FeedStart,
}

/// Where the feed begins: changes before it were swept, and records stored before the
/// feed existed (before the upgrade that added it) have none. A reader that needs every
/// record takes them from `records` (the head, then `records`, then the feed from the
/// head), not from the feed's start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FeedStart {
    /// Just before the first change kept: reading from it gives every change kept.
    pub cursor: Cursor,
    /// When the first change kept committed; `None` while none is readable.
    pub first_committed_at: Option<DateTime<Utc>>,
}

/// Why a read could not be served.
#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    #[error(
        "the cursor ({cursor}) is older than the change feed's retention: changes up to \
         seq {swept} were swept, so some changes after the cursor are gone. Resync: take \
         the head (`tributary changes --head`), copy the records table again, then follow \
         the feed from that head"
    )]
    Expired { cursor: Cursor, swept: i64 },
    #[error(
        "the cursor ({cursor}) is ahead of this database's change feed (its head is {head}): \
         it was issued by another database, or this one was restored from an older backup. \
         Resync: take the head (`tributary changes --head`), copy the records table \
         again, then follow the feed from that head"
    )]
    Ahead { cursor: Cursor, head: Cursor },
    #[error(
        "the cursor {cursor} was issued by another database's change feed, not this \
         one's: its changes are not this database's. Resync: take the head (`tributary \
         changes --head`), copy the records table again, then follow the feed from that \
         head"
    )]
    OtherDatabase { cursor: FeedCursor },
    #[error(
        "the cursor {cursor} was issued by an earlier release of tributary, whose cursors \
         do not say which database issued them, so it cannot be told from another \
         database's. Resync once: take the head (`tributary changes --head`), copy the \
         records table again, then follow the feed from that head"
    )]
    Unidentified { cursor: FeedCursor },
    #[error("reading the change feed failed: {0}")]
    Database(#[from] DbErr),
}

/// The clock as a reader sees it: the newest seq it may read and the highest swept one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Clock {
    pub(super) seq: i64,
    pub(super) swept_seq: i64,
}

impl Clock {
    async fn read(db: &impl ConnectionTrait) -> Result<Clock, DbErr> {
        let (seq, swept_seq) = super::order::read_clock(db).await?;
        Ok(Clock { seq, swept_seq })
    }

    pub(super) fn head(self) -> Cursor {
        Cursor::after_batch(self.seq)
    }

    /// Just before the first change kept: every batch up to the swept seq may be gone.
    pub(super) fn start(self) -> Cursor {
        Cursor::after_batch(self.swept_seq)
    }

    /// Whether the sweep may have deleted changes after `cursor`: a reader there must
    /// resync.
    pub(super) fn expired(self, cursor: Cursor) -> bool {
        self.swept_seq > 0 && cursor < Cursor::after_batch(self.swept_seq)
    }

    /// Whether `cursor` is one this database could have issued (at most the head, or a
    /// stored batch's seq: on PostgreSQL a run's cursor bounds may be above a head still
    /// held back by an older transaction), and whether a reader at it has read
    /// everything the sweep may have deleted.
    fn check(self, cursor: Cursor, newest_batch: Option<i64>) -> Result<(), FeedError> {
        let issued =
            newest_batch.map_or(self.head(), |seq| self.head().max(Cursor::after_batch(seq)));
        if cursor > issued {
            return Err(FeedError::Ahead {
                cursor,
                head: self.head(),
            });
        }
        if self.expired(cursor) {
            return Err(FeedError::Expired {
                cursor,
                swept: self.swept_seq,
            });
        }
        Ok(())
    }
}

/// The seq of the newest stamped batch.
async fn newest_batch(db: &impl ConnectionTrait) -> Result<Option<i64>, DbErr> {
    Ok(change_batch::Entity::find()
        .select_only()
        .column_as(change_batch::Column::Seq.max(), "seq")
        .into_tuple::<Option<i64>>()
        .one(db)
        .await?
        .flatten())
}

/// This database's id, which every cursor its feed issues carries.
pub(crate) async fn database_id(db: &impl ConnectionTrait) -> Result<DatabaseId, DbErr> {
    let stored: Option<Option<String>> = change_clock::Entity::find_by_id(CLOCK_ROW)
        .select_only()
        .column(change_clock::Column::DatabaseId)
        .into_tuple()
        .one(db)
        .await?;
    stored
        .flatten()
        .as_deref()
        .and_then(DatabaseId::from_column)
        .ok_or_else(|| {
            DbErr::Custom(format!(
                "the change feed's database id (change_clock.database_id, id = {CLOCK_ROW}) \
                 is missing or not 32 hexadecimal digits; the migrations set it and nothing \
                 may change it"
            ))
        })
}

/// The position of a reader's `cursor` in this database's feed: refused unless this
/// database issued it.
pub async fn position_in(
    db: &impl ConnectionTrait,
    cursor: FeedCursor,
) -> Result<Cursor, FeedError> {
    match cursor.database {
        None => Err(FeedError::Unidentified { cursor }),
        Some(issuer) if issuer != database_id(db).await? => {
            Err(FeedError::OtherDatabase { cursor })
        }
        Some(_) => Ok(cursor.position),
    }
}

/// The head: the cursor after every change readable so far (on PostgreSQL, those
/// committed by transactions older than every running one). A reader that copies
/// `records` after taking it and then follows the feed from it misses nothing.
pub(crate) async fn head(db: &impl ConnectionTrait) -> Result<Cursor, DbErr> {
    Ok(Clock::read(db).await?.head())
}

impl Cursor {
    /// `db`'s head: the cursor after every change readable so far. A reader that copies
    /// `records` after taking it and then follows the feed from it misses nothing.
    pub async fn head(db: &impl ConnectionTrait) -> Result<Cursor, DbErr> {
        head(db).await
    }
}

impl FeedCursor {
    /// `position` as `db`'s feed issues it to readers: carrying the database's id, so that
    /// a cursor shown to another database's feed is refused.
    pub async fn issued_by(
        db: &impl ConnectionTrait,
        position: Cursor,
    ) -> Result<FeedCursor, DbErr> {
        Ok(FeedCursor {
            database: Some(database_id(db).await?),
            position,
        })
    }
}

/// The cursors just before a run's first change batch and just after its last: reading
/// from `before` until the cursor reaches `after` yields every change of the run (among
/// those of other runs, told apart by their run id). No change can still appear below
/// `before`, so a reader may follow the feed from it; on PostgreSQL one may below `after`
/// until the transactions before it have ended, so a reader keeps the cursor its reads
/// return, not `after`. For a run that changed nothing, both are the head. Inside the
/// transaction that closes the run, this counts the batches that transaction stamped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunCursors {
    pub before: Cursor,
    pub after: Cursor,
}

/// [`RunCursors`] of run `run_id`.
pub async fn run_cursor_bounds(
    db: &impl ConnectionTrait,
    run_id: i64,
) -> Result<RunCursors, DbErr> {
    let (first, last): (Option<i64>, Option<i64>) = change_batch::Entity::find()
        .select_only()
        .column_as(change_batch::Column::Seq.min(), "first")
        .column_as(change_batch::Column::Seq.max(), "last")
        .filter(change_batch::Column::RunId.eq(run_id))
        .filter(change_batch::Column::Seq.is_not_null())
        .into_tuple()
        .one(db)
        .await?
        .unwrap_or((None, None));
    match (first, last) {
        (Some(first), Some(last)) => Ok(RunCursors {
            // Seqs start at 1, so `first - 1` cannot go below the start. On PostgreSQL a
            // batch below the run's first may still be written while the head is behind
            // it: `before` is then the head, so that nothing can still appear below it.
            before: Cursor::after_batch(first.saturating_sub(1)).min(head(db).await?),
            after: Cursor::after_batch(last),
        }),
        _ => {
            let head = head(db).await?;
            Ok(RunCursors {
                before: head,
                after: head,
            })
        }
    }
}

/// Reads up to `query.limit` changes after `query.since`, in commit order.
pub async fn read_changes(
    db: &DatabaseConnection,
    query: &FeedQuery<'_>,
) -> Result<FeedPage, FeedError> {
    let limit = query.limit.clamp(1, MAX_LIMIT);
    let (txn, clock) = snapshot(db).await?;
    let database = database_id(&txn).await?;
    let since = match query.since {
        Some(cursor) => {
            clock.check(cursor, newest_batch(&txn).await?)?;
            cursor
        }
        // A reader that asks for everything kept is given it, however much was swept.
        None => clock.start(),
    };
    let mut from = since;
    let mut picked: Vec<(change_batch::Model, ChangeRef)> = Vec::new();
    let reached_end = loop {
        let batches = batches_after(&txn, query, from, clock.seq).await?;
        let Some(last) = batches.last() else {
            break true;
        };
        let last_seq = last.seq.unwrap_or(from.seq);
        let wanted = limit.saturating_sub(picked.len() as u64);
        let refs = changes_of(&txn, &batches, from, wanted).await?;
        let by_id: HashMap<i64, &change_batch::Model> =
            batches.iter().map(|batch| (batch.id, batch)).collect();
        for change in refs {
            if let Some(batch) = by_id.get(&change.batch_id) {
                picked.push(((*batch).clone(), change));
            }
        }
        if picked.len() as u64 >= limit {
            break false;
        }
        // Every change of these batches after `from` is picked.
        from = Cursor::after_batch(last_seq);
        if (batches.len() as u64) < BATCHES_PER_STEP {
            break true;
        }
    };
    let changes = with_payloads(&txn, picked).await?;
    let start = feed_start(&txn, clock).await?;
    txn.commit().await?;
    let last = changes.last().map(|change| change.cursor);
    let next = match reached_end {
        // Everything up to the snapshot's head was read (the filters only skip).
        true => [Some(since), last, Some(clock.head())]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or(since),
        false => last.unwrap_or(since),
    };
    Ok(FeedPage {
        changes,
        next,
        database,
        start,
    })
}

/// A read-only snapshot of the feed, and its clock as the snapshot sees it.
pub(super) async fn snapshot(
    db: &DatabaseConnection,
) -> Result<(DatabaseTransaction, Clock), DbErr> {
    let txn = match db.get_database_backend() {
        // A SQLite read transaction is a snapshot already, and takes no options.
        DbBackend::Sqlite => db.begin().await?,
        _ => {
            db.begin_with_config(
                Some(IsolationLevel::RepeatableRead),
                Some(AccessMode::ReadOnly),
            )
            .await?
        }
    };
    let clock = Clock::read(&txn).await?;
    Ok((txn, clock))
}

/// Where the feed begins in `clock`'s snapshot.
pub(super) async fn feed_start(
    txn: &impl ConnectionTrait,
    clock: Clock,
) -> Result<FeedStart, DbErr> {
    let cursor = clock.start();
    let first: Option<Option<DateTime<Utc>>> = change_batch::Entity::find()
        .select_only()
        .column(change_batch::Column::CommittedAt)
        .filter(change_batch::Column::Seq.gt(cursor.seq))
        .filter(change_batch::Column::Seq.lte(clock.seq))
        .order_by_asc(change_batch::Column::Seq)
        .limit(1)
        .into_tuple()
        .one(txn)
        .await?;
    Ok(FeedStart {
        cursor,
        first_committed_at: first.flatten(),
    })
}

/// The stamped batches after `from` and up to seq `newest` that match the query's
/// filters, oldest first, one step's worth.
async fn batches_after(
    txn: &impl ConnectionTrait,
    query: &FeedQuery<'_>,
    from: Cursor,
    newest: i64,
) -> Result<Vec<change_batch::Model>, DbErr> {
    // A batch read to its end is passed; a batch read partway is read on.
    let mut select = match from.ordinal {
        i64::MAX => change_batch::Entity::find().filter(change_batch::Column::Seq.gt(from.seq)),
        _ => change_batch::Entity::find().filter(change_batch::Column::Seq.gte(from.seq)),
    };
    // On PostgreSQL a batch above the head may be visible while one below it is still
    // being written: it waits until every transaction before it has ended.
    select = select.filter(change_batch::Column::Seq.lte(newest));
    if let Some(provider) = query.provider {
        select = select.filter(change_batch::Column::Provider.eq(provider));
    }
    if let Some(user_id) = query.user_id {
        select = select.filter(change_batch::Column::UserId.eq(user_id));
    }
    select
        .order_by_asc(change_batch::Column::Seq)
        .limit(BATCHES_PER_STEP)
        .all(txn)
        .await
}

/// A change as its row says, before its record is read.
#[derive(Clone, Debug, FromQueryResult)]
struct ChangeRef {
    batch_id: i64,
    ordinal: i32,
    seq: i64,
    external_id: String,
    kind: ChangeKind,
}

/// The first `limit` changes of `batches` after `from`, in commit order: the database
/// orders them by the batches' seq, then by their ordinal.
async fn changes_of(
    txn: &impl ConnectionTrait,
    batches: &[change_batch::Model],
    from: Cursor,
    limit: u64,
) -> Result<Vec<ChangeRef>, DbErr> {
    let seq = (change_batch::Entity, change_batch::Column::Seq);
    let ordinal = (change::Entity, change::Column::Ordinal);
    let select = Query::select()
        .column((change::Entity, change::Column::BatchId))
        .column(ordinal)
        .expr_as(Expr::col(seq), "seq")
        .column((change::Entity, change::Column::ExternalId))
        .column((change::Entity, change::Column::Kind))
        .from(change::Entity)
        .inner_join(
            change_batch::Entity,
            Expr::col((change_batch::Entity, change_batch::Column::Id))
                .equals((change::Entity, change::Column::BatchId)),
        )
        .and_where(
            Expr::col((change::Entity, change::Column::BatchId))
                .is_in(batches.iter().map(|batch| batch.id)),
        )
        .cond_where(
            sea_orm::Condition::any()
                .add(Expr::col(seq).gt(from.seq))
                .add(Expr::col(ordinal).gt(from.ordinal)),
        )
        .order_by(seq, sea_orm::Order::Asc)
        .order_by(ordinal, sea_orm::Order::Asc)
        .limit(limit)
        .to_owned();
    let statement = txn.get_database_backend().build(&select);
    ChangeRef::find_by_statement(statement).all(txn).await
}

/// The picked changes with their records' current payloads.
async fn with_payloads(
    txn: &impl ConnectionTrait,
    picked: Vec<(change_batch::Model, ChangeRef)>,
) -> Result<Vec<FeedChange>, DbErr> {
    let mut keys: HashMap<(&str, &str), Vec<&str>> = HashMap::new();
    for (batch, change) in &picked {
        keys.entry((&batch.user_id, &batch.provider))
            .or_default()
            .push(&change.external_id);
    }
    let mut payloads: HashMap<(String, String, String), String> = HashMap::new();
    for ((user_id, provider), external_ids) in keys {
        for chunk in external_ids.chunks(PAYLOAD_LOOKUP.rows(txn.get_database_backend())) {
            let rows: Vec<(String, String)> = record::Entity::find()
                .select_only()
                .columns([record::Column::ExternalId, record::Column::Payload])
                .filter(key_condition(user_id, provider, chunk.iter().copied()))
                // A record marked deleted is shown deleted, without its last payload.
                .filter(record::Column::DeletedAt.is_null())
                .into_tuple()
                .all(txn)
                .await?;
            for (external_id, payload) in rows {
                payloads.insert(
                    (user_id.to_string(), provider.to_string(), external_id),
                    payload,
                );
            }
        }
    }
    Ok(picked
        .into_iter()
        .map(|(batch, change)| {
            let key = (batch.user_id, batch.provider, change.external_id);
            let payload = payloads.get(&key).cloned();
            let (user_id, provider, external_id) = key;
            FeedChange {
                cursor: Cursor {
                    seq: change.seq,
                    ordinal: i64::from(change.ordinal),
                },
                user_id,
                provider,
                external_id,
                kind: change.kind,
                run_id: batch.run_id,
                committed_at: batch.committed_at,
                deleted: payload.is_none(),
                payload,
            }
        })
        .collect())
}
