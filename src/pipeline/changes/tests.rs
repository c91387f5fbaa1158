//! The feed's write path driven a statement at a time, as the store path runs it, by
//! writers whose transactions interleave: a reader polling with its last cursor reads
//! every committed change once, in the feed's order, on each backend. These steps are
//! crate-private, so their tests live here (run on the three databases by scripts/test).

use std::time::Duration;

use proptest::prelude::*;
use sea_orm::sea_query::Expr;
use sea_orm::{
    ColumnTrait, DatabaseConnection, DatabaseTransaction, EntityTrait, QueryFilter, QueryOrder,
    TransactionTrait,
};

use super::{
    align_clock, head, open_batch, read_changes, record_changes, run_cursor_bounds, stamp_batch,
    sweep_expired_changes, BatchOwner, ChangeBatch, Cursor, FeedChange, FeedQuery, SweptChanges,
    MAX_LIMIT,
};
use crate::config::NotifyRuns;
use crate::entities::change::ChangeKind;
use crate::entities::change_batch;
use crate::entities::sync_run::RunStatus;
use crate::pipeline::{CheckpointMove, DeletionPass, Run, RunEnd};
use crate::testing::{backend, open_run, page_of, Backend, TestDb};

/// Every change after `since` up to the newest batch committed when it is called, read
/// `limit` at a time, and the cursor after them; on PostgreSQL it reads on for at most
/// 30 s until other tests' older transactions have ended and that batch is readable.
async fn read_all(db: &DatabaseConnection, since: Cursor, limit: u64) -> (Vec<FeedChange>, Cursor) {
    let target = batch_seqs(db)
        .await
        .pop()
        .map_or(since, Cursor::after_batch);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let (mut all, mut cursor) = (Vec::new(), since);
    loop {
        let query = FeedQuery {
            since: Some(cursor),
            provider: None,
            user_id: None,
            limit,
        };
        let page = read_changes(db, &query).await.expect("feed read");
        assert!(page.next >= cursor, "the cursor never goes back");
        let done = page.changes.is_empty();
        cursor = page.next;
        all.extend(page.changes);
        if done && cursor >= target {
            return (all, cursor);
        }
        if done {
            assert!(
                std::time::Instant::now() < deadline,
                "the feed never reached {target:?}: it stopped at {cursor:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The seqs of the stamped batches, in order.
async fn batch_seqs(db: &DatabaseConnection) -> Vec<i64> {
    change_batch::Entity::find()
        .filter(change_batch::Column::Seq.is_not_null())
        .order_by_asc(change_batch::Column::Seq)
        .all(db)
        .await
        .expect("change batches")
        .into_iter()
        .filter_map(|batch| batch.seq)
        .collect()
}

fn ids(names: &[&str]) -> Vec<String> {
    names.iter().map(|name| name.to_string()).collect()
}

/// The (external id, kind) of each change, in feed order.
fn kinds(changes: &[FeedChange]) -> Vec<(String, ChangeKind)> {
    changes
        .iter()
        .map(|change| (change.external_id.clone(), change.kind))
        .collect()
}

/// Stores `pages` in `run` and closes it succeeded; returns its id.
async fn run_of(mut run: Run<'_>, pages: &[&[&str]]) -> i64 {
    for page in pages {
        run.store(page_of(page)).await.expect("stored");
    }
    let id = run.id();
    let end = RunEnd {
        status: RunStatus::Succeeded,
        error: None,
        listing_complete: true,
        checkpoint: CheckpointMove::Write(None),
        watermark: None,
        notify: NotifyRuns::All,
        deletions: DeletionPass::Off,
        full_passes_served: 0,
        authorization_refused: false,
    };
    run.close(end).await.expect("closed");
    id
}

/// A reader that polls the feed with the last cursor it got, as an app would.
struct Poller {
    db: crate::db::DatabasePools,
    cursor: Cursor,
    /// Every external id read, in the order read.
    seen: Vec<String>,
    limit: u64,
}

impl Poller {
    /// A poller after every change committed so far (on PostgreSQL the head alone may
    /// still be below one, held back by another test's transaction).
    async fn new(test: &TestDb) -> Poller {
        let db = test.pool(2).await;
        let (_, cursor) = read_all(db.main(), Cursor::START, MAX_LIMIT).await;
        Poller {
            db,
            cursor,
            seen: Vec::new(),
            limit: 2,
        }
    }

    /// One read; returns the external ids it found.
    async fn poll(&mut self) -> Vec<String> {
        let query = FeedQuery {
            since: Some(self.cursor),
            provider: None,
            user_id: None,
            limit: self.limit,
        };
        let page = read_changes(self.db.main(), &query)
            .await
            .expect("feed read");
        assert!(page.next >= self.cursor, "the cursor never goes back");
        self.cursor = page.next;
        let found: Vec<String> = page.changes.into_iter().map(|c| c.external_id).collect();
        self.seen.extend(found.iter().cloned());
        found
    }

    /// Polls until it has read `total` changes in all, or for at most 30 s: on
    /// PostgreSQL a committed change is read once every transaction of the server that
    /// began before it has ended, and the other tests' transactions run meanwhile.
    async fn drain_to(&mut self, total: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while self.seen.len() < total && std::time::Instant::now() < deadline {
            if self.poll().await.is_empty() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        // Nothing more, however long it is read.
        self.poll().await;
    }
}

/// One writer's open transaction, driven a statement at a time as the store path runs
/// them: the batch, its changes, then the stamp and the commit.
struct Writer {
    txn: DatabaseTransaction,
    batch: ChangeBatch,
    ids: Vec<String>,
}

impl Writer {
    async fn begin(db: &DatabaseConnection, run_id: i64) -> Writer {
        let txn = db.begin().await.expect("begin");
        let owner = BatchOwner {
            run_id,
            user_id: "alice",
            provider: "acme",
        };
        let batch = open_batch(&txn, owner).await.expect("batch");
        Writer {
            txn,
            batch,
            ids: Vec::new(),
        }
    }

    async fn record(&mut self, ids: &[String]) {
        let slot = self.batch.reserve(ids.len()).expect("slot");
        let recorded = record_changes(
            &self.txn,
            slot,
            ChangeKind::Inserted,
            ids.iter().map(String::as_str),
        )
        .await
        .expect("changes");
        assert_eq!(recorded, ids.len() as u64);
        self.ids.extend(ids.iter().cloned());
    }

    async fn stamp(&self) {
        stamp_batch(&self.txn, &self.batch, chrono::Utc::now())
            .await
            .expect("stamped");
    }

    /// The stamp and the commit; returns the ids committed.
    async fn finish(self) -> Vec<String> {
        self.stamp().await;
        self.txn.commit().await.expect("commit");
        self.ids
    }
}

/// Where the clock ticks (MariaDB/MySQL), the feed is in commit order: a transaction that
/// began writing first and commits last is read last, and a stamp waits for the commit of
/// the one before. On PostgreSQL the feed is in the order transactions began writing: one
/// that committed early is read once every transaction that began before it has ended.
/// Either way a reader polling with its last cursor reads each change once.
#[tokio::test]
async fn transactions_that_commit_out_of_the_order_they_began_writing_are_read_once_each() {
    let test = TestDb::new().await;
    let (_, run_id) = test.alice_with_a_run().await;
    let mut poller = Poller::new(&test).await;
    let writers = test.pool(4).await;
    if backend() == Backend::Sqlite {
        // One writer at a time: a transaction's changes appear when it commits, whole.
        let mut a = Writer::begin(&writers, run_id).await;
        a.record(&ids(&["a1", "a2", "a3"])).await;
        assert!(poller.poll().await.is_empty());
        a.stamp().await;
        assert!(poller.poll().await.is_empty(), "stamped is not committed");
        a.txn.commit().await.expect("commit");
        poller.drain_to(3).await;
        assert_eq!(poller.seen, ids(&["a1", "a2", "a3"]));
        return;
    }
    let postgres = backend() == Backend::Postgres;

    // A writes first, B overtakes it and commits first.
    let mut a = Writer::begin(&writers, run_id).await;
    a.record(&ids(&["a1", "a2", "a3"])).await;
    let mut b = Writer::begin(&writers, run_id).await;
    b.record(&ids(&["b1"])).await;
    assert!(
        a.batch.id < b.batch.id,
        "A's batch has the smaller id: an autoincrement would order it first"
    );
    assert!(poller.poll().await.is_empty());
    b.stamp().await;
    assert!(poller.poll().await.is_empty(), "stamped is not committed");
    b.finish().await;
    if postgres {
        assert!(
            poller.poll().await.is_empty(),
            "B waits behind A, still open"
        );
        a.finish().await;
        poller.drain_to(4).await;
        assert_eq!(poller.seen, ids(&["a1", "a2", "a3", "b1"]));
    } else {
        poller.drain_to(1).await;
        assert_eq!(poller.seen, ids(&["b1"]));
        // A commits after the reader moved past B: its smaller ids are read all the same.
        a.finish().await;
        poller.drain_to(4).await;
        assert_eq!(poller.seen, ids(&["b1", "a1", "a2", "a3"]));
    }
    let read_so_far = poller.seen.clone();

    // C stamps first; D stamps while C is not committed yet.
    let mut c = Writer::begin(&writers, run_id).await;
    c.record(&ids(&["c1"])).await;
    let mut d = Writer::begin(&writers, run_id).await;
    d.record(&ids(&["d1", "d2"])).await;
    c.stamp().await;
    let d_stamp = tokio::spawn(async move {
        d.stamp().await;
        d
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(poller.poll().await.is_empty());
    let expected: Vec<String> = read_so_far
        .into_iter()
        .chain(ids(&["c1", "d1", "d2"]))
        .collect();
    if postgres {
        // No clock: D's stamp waits for nobody, and D commits before C.
        assert!(d_stamp.is_finished(), "D's stamp did not wait for C");
        let d = d_stamp.await.expect("D stamped");
        d.txn.commit().await.expect("commit");
        assert!(
            poller.poll().await.is_empty(),
            "D waits behind C, still open"
        );
        c.txn.commit().await.expect("commit");
    } else {
        assert!(!d_stamp.is_finished(), "D's tick waits for C's commit");
        c.txn.commit().await.expect("commit");
        let d = d_stamp.await.expect("D stamped");
        poller.drain_to(expected.len() - 2).await;
        assert_eq!(poller.seen, expected[..expected.len() - 2]);
        d.txn.commit().await.expect("commit");
    }
    poller.drain_to(expected.len()).await;
    assert_eq!(poller.seen, expected);
}

/// One step of a random interleaving.
#[derive(Clone, Debug)]
enum Step {
    /// Writer `n` opens its transaction (if it has none open).
    Begin(usize),
    /// Writer `n` records this many changes.
    Record(usize, usize),
    /// Writer `n` stamps and commits.
    Finish(usize),
    /// Writer `n` rolls back.
    Abort(usize),
    /// The reader polls, reading at most this many.
    Poll(u64),
}

const WRITERS: usize = 3;

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0..WRITERS).prop_map(Step::Begin),
        4 => (0..WRITERS, 1..4usize).prop_map(|(n, changes)| Step::Record(n, changes)),
        3 => (0..WRITERS).prop_map(Step::Finish),
        1 => (0..WRITERS).prop_map(Step::Abort),
        3 => (1..5u64).prop_map(Step::Poll),
    ]
}

/// Runs `steps` from the head: writers on their own connections, a reader polling in
/// between. Returns what committed, in the feed's order (commit order where the clock
/// ticks, the order the transactions began writing on PostgreSQL), and what the reader
/// read.
async fn interleave(
    test: &TestDb,
    writers_db: &DatabaseConnection,
    run_id: i64,
    case: usize,
    steps: &[Step],
) -> (Vec<String>, Vec<String>) {
    let mut poller = Poller::new(test).await;
    // Each open writer, with the place its transaction took when it began writing.
    let mut open: Vec<Option<(usize, Writer)>> = (0..WRITERS).map(|_| None).collect();
    let mut began = 0;
    // What committed, with that place, in commit order.
    let mut committed: Vec<(usize, Vec<String>)> = Vec::new();
    let mut next_id = 0;
    for step in steps {
        match *step {
            // SQLite has one writer: a second transaction would wait for the first.
            Step::Begin(n)
                if open[n].is_none()
                    && (backend() != Backend::Sqlite || open.iter().all(Option::is_none)) =>
            {
                open[n] = Some((began, Writer::begin(writers_db, run_id).await));
                began += 1;
            }
            Step::Record(n, count) => {
                if let Some((_, writer)) = open[n].as_mut() {
                    let names: Vec<String> = (0..count)
                        .map(|_| {
                            next_id += 1;
                            format!("case{case}-w{n}-{next_id}")
                        })
                        .collect();
                    writer.record(&names).await;
                }
            }
            Step::Finish(n) => {
                if let Some((place, writer)) = open[n].take() {
                    committed.push((place, writer.finish().await));
                }
            }
            Step::Abort(n) => {
                if let Some((_, writer)) = open[n].take() {
                    writer.txn.rollback().await.expect("rollback");
                }
            }
            Step::Poll(limit) => {
                poller.limit = limit;
                poller.poll().await;
            }
            Step::Begin(_) => {}
        }
    }
    for (place, writer) in open.into_iter().flatten() {
        committed.push((place, writer.finish().await));
    }
    if backend() == Backend::Postgres {
        committed.sort_by_key(|(place, _)| *place);
    }
    let committed: Vec<String> = committed.into_iter().flat_map(|(_, ids)| ids).collect();
    poller.limit = 3;
    poller.drain_to(committed.len()).await;
    (committed, poller.seen)
}

/// Random interleavings of three writers and a reader: what the reader read is exactly
/// what committed, each change once, in the feed's order.
#[test]
fn a_poller_reads_every_committed_change_once_in_order_under_any_interleaving() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (test, writers, run_id) = runtime.block_on(async {
        let test = TestDb::new().await;
        let (_, run_id) = test.alice_with_a_run().await;
        let writers = test.pool(WRITERS as u32 + 1).await;
        (test, writers, run_id)
    });
    let case = std::cell::Cell::new(0);
    let mut config = proptest::test_runner::Config::with_cases(48);
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        config.rng_seed = proptest::test_runner::RngSeed::Fixed(0xfeed);
    }
    config.failure_persistence = None;
    let mut runner = proptest::test_runner::TestRunner::new(config);
    runner
        .run(&proptest::collection::vec(step(), 4..40), |steps| {
            case.set(case.get() + 1);
            let (committed, seen) =
                runtime.block_on(interleave(&test, &writers, run_id, case.get(), &steps));
            prop_assert_eq!(&seen, &committed, "steps: {:?}", steps);
            Ok(())
        })
        .expect("the reader read every committed change once, in order");
}

#[tokio::test]
async fn a_runs_cursor_bounds_enclose_exactly_its_changes() {
    let test = TestDb::new().await;
    let alice = test.alice().await;
    let pages: [&[&str]; 2] = [&["k0", "k1"], &["k2", "k3"]];
    let first = run_of(open_run(&test.db, &alice).await, &pages).await;
    let bounds = run_cursor_bounds(test.main(), first).await.expect("bounds");
    let seqs = batch_seqs(test.main()).await;
    assert_eq!(seqs.len(), 2);
    // On PostgreSQL `before` is the head instead when that is lower.
    assert!(bounds.before <= Cursor::after_batch(seqs[0] - 1));
    if backend() != Backend::Postgres {
        assert_eq!(bounds.before, Cursor::after_batch(seqs[0] - 1));
    }
    assert_eq!(bounds.after, Cursor::after_batch(seqs[1]));
    let (feed, next) = read_all(test.main(), bounds.before, 100).await;
    assert_eq!(feed.len(), 4);
    assert!(feed.iter().all(|change| change.run_id == first));
    assert!(next >= bounds.after);

    // A run that changed nothing: both bounds are the head when it closed.
    let head_before = next;
    let unchanged = run_of(open_run(&test.db, &alice).await, &pages).await;
    let bounds = run_cursor_bounds(test.main(), unchanged)
        .await
        .expect("bounds");
    assert_eq!(bounds.before, bounds.after);
    assert!(bounds.before >= head_before);
    if backend() != Backend::Postgres {
        assert_eq!(bounds.before, head_before);
    }
    assert!(read_all(test.main(), head_before, 100).await.0.is_empty());

    // Inside the transaction that stamps a run's batch, the bounds count it.
    let run_id = open_run(&test.db, &alice).await.id();
    let txn = test.main().begin().await.expect("begin");
    let owner = BatchOwner {
        run_id,
        user_id: "alice",
        provider: "acme",
    };
    let mut batch = open_batch(&txn, owner).await.expect("batch");
    let slot = batch.reserve(1).expect("slot");
    record_changes(&txn, slot, ChangeKind::Deleted, ["k0"])
        .await
        .expect("change");
    stamp_batch(&txn, &batch, chrono::Utc::now())
        .await
        .expect("stamped");
    let inside = run_cursor_bounds(&txn, run_id).await.expect("bounds");
    txn.commit().await.expect("commit");
    let seqs = batch_seqs(test.main()).await;
    assert_eq!(seqs.len(), 3);
    assert_eq!(inside.after, Cursor::after_batch(seqs[2]));
    assert!(inside.before <= Cursor::after_batch(seqs[2] - 1));
    if backend() != Backend::Postgres {
        assert_eq!(inside.before, Cursor::after_batch(seqs[2] - 1));
    }
    let (feed, _) = read_all(test.main(), inside.before, 100).await;
    assert_eq!(kinds(&feed), vec![("k0".to_string(), ChangeKind::Deleted)]);
    assert!(feed[0].payload.is_some() && !feed[0].deleted);
}

/// A PostgreSQL database restored from a logical dump into another cluster holds batches
/// stamped with the old cluster's transaction ids, above the new one's: aligning moves the
/// clock's offset past them once, so the next change is read after them and no stamp
/// collides with a stored seq. Where the clock ticks, it carries on by itself.
#[tokio::test]
async fn a_restored_database_is_aligned_once_so_its_next_change_reads_after_the_stored_ones() {
    let test = TestDb::new().await;
    let (alice, run_id) = test.alice_with_a_run().await;
    if backend() != Backend::Postgres {
        assert!(!align_clock(test.main()).await.expect("aligned"));
        return;
    }
    assert!(
        !align_clock(test.main()).await.expect("aligned"),
        "a new database's clock is aligned"
    );
    let restored_seq: i64 = 1_000_000_000_000;
    sea_orm::ConnectionTrait::execute_unprepared(
        test.main(),
        &format!(
            "INSERT INTO change_batches (seq, run_id, user_id, provider, committed_at) \
             VALUES ({restored_seq}, {run_id}, 'alice', 'acme', now())"
        ),
    )
    .await
    .expect("a restored batch");
    assert!(align_clock(test.main()).await.expect("aligned"));
    assert!(
        !align_clock(test.main()).await.expect("aligned"),
        "aligned once, it stays aligned"
    );
    run_of(open_run(&test.db, &alice).await, &[&["k0", "k1"]]).await;
    let seqs = batch_seqs(test.main()).await;
    assert_eq!(seqs.len(), 2, "{seqs:?}");
    assert!(seqs[1] > restored_seq, "{seqs:?}");
    let (feed, _) = read_all(test.main(), Cursor::after_batch(restored_seq), 100).await;
    assert_eq!(
        kinds(&feed),
        vec![
            ("k0".to_string(), ChangeKind::Inserted),
            ("k1".to_string(), ChangeKind::Inserted)
        ],
        "a reader past the restored batch reads the new changes"
    );
}

/// On PostgreSQL a transaction that began writing before a run holds the head back below
/// the run's batches. The run's cursors are still accepted: `after` is not "ahead of this
/// database", and nothing can appear below `before`, so a reader that follows the feed
/// from it reads the run's changes once the older transaction has ended. Nor is the
/// run's batch, above the open transaction, taken for a restored database's.
#[tokio::test]
async fn a_runs_cursors_are_accepted_while_an_older_transaction_is_open() {
    let test = TestDb::new().await;
    let alice = test.alice().await;
    let writers = test.pool(2).await;
    // SQLite has one writer: an open writer would hold the run back instead.
    let held = match backend() {
        Backend::Sqlite => None,
        _ => Some(Writer::begin(&writers, 0).await),
    };
    let run = run_of(
        open_run(&test.db, &alice).await,
        &[&["k0", "k1"], &["k2", "k3"]],
    )
    .await;
    let bounds = run_cursor_bounds(test.main(), run).await.expect("bounds");
    let head = head(test.main()).await.expect("head");
    assert!(bounds.before <= head, "{bounds:?} {head:?}");
    if backend() == Backend::Postgres {
        assert!(
            bounds.after > head,
            "the run is behind the open transaction"
        );
    }
    // A batch above a running transaction is no restored database: the clock stays.
    assert!(!align_clock(test.main()).await.expect("aligned"));
    for since in [bounds.before, bounds.after] {
        let query = FeedQuery {
            since: Some(since),
            provider: None,
            user_id: None,
            limit: 100,
        };
        let page = read_changes(test.main(), &query).await;
        assert!(page.is_ok(), "{since:?}: {page:?}");
    }
    if let Some(held) = held {
        held.txn.rollback().await.expect("rollback");
    }
    let (feed, next) = read_all(test.main(), bounds.before, 100).await;
    assert_eq!(feed.len(), 4, "{feed:?}");
    assert!(feed.iter().all(|change| change.run_id == run));
    assert!(next >= bounds.after);
}

/// The retention sweep takes only batches a reader may already read: on PostgreSQL an
/// expired batch above a head held back by an older open transaction waits, or the swept
/// seq would pass readers that are up to date and refuse them as expired.
#[tokio::test]
async fn the_sweep_leaves_a_batch_no_reader_may_read_yet() {
    let test = TestDb::new().await;
    let (_, run_id) = test.alice_with_a_run().await;
    let writers = test.pool(2).await;
    let (_, reader) = read_all(test.main(), Cursor::START, 100).await;
    // SQLite has one writer: an open writer would hold the next one back instead.
    let held = match backend() {
        Backend::Sqlite => None,
        _ => Some(Writer::begin(&writers, run_id).await),
    };
    let mut expired = Writer::begin(test.main(), run_id).await;
    expired.record(&ids(&["old"])).await;
    let expired_id = expired.batch.id;
    expired.finish().await;
    change_batch::Entity::update_many()
        .col_expr(
            change_batch::Column::CommittedAt,
            Expr::value(chrono::Utc::now() - chrono::Duration::days(2)),
        )
        .filter(change_batch::Column::Id.eq(expired_id))
        .exec(test.main())
        .await
        .expect("backdated");
    let day = Duration::from_secs(24 * 60 * 60);
    let swept = sweep_expired_changes(test.main(), day)
        .await
        .expect("swept");
    let total = |swept: SweptChanges| (swept.batches, swept.changes);
    if backend() != Backend::Postgres {
        // No reader is held back where the clock ticks.
        assert_eq!(total(swept), (1, 1));
    } else {
        assert_eq!(swept, SweptChanges::default(), "behind the open one");
        let query = FeedQuery {
            since: Some(reader),
            provider: None,
            user_id: None,
            limit: 10,
        };
        assert!(
            read_changes(test.main(), &query).await.is_ok(),
            "an up-to-date reader is not refused as expired"
        );
        held.expect("held on PostgreSQL")
            .txn
            .rollback()
            .await
            .expect("rollback");
        read_all(test.main(), reader, 100).await;
        let swept = sweep_expired_changes(test.main(), day)
            .await
            .expect("swept");
        assert_eq!(total(swept), (1, 1), "once readable, it is swept");
    }
    assert_eq!(batch_seqs(test.main()).await, Vec::<i64>::new());
}

/// A reader's row moves forward at most every few seconds, is refreshed while the reader
/// polls where it is, and never moves back: not for an older position, and not when
/// reads on several connections race and commit out of order.
#[tokio::test]
async fn a_readers_position_moves_forward_throttled_and_never_back_under_racing_reads() {
    use super::note_read;
    use super::readers::{advance, Noted, MOVE_EVERY, REFRESH_EVERY};
    use crate::entities::feed_reader;
    let test = TestDb::new().await;
    let db = test.main();
    let at = |seconds: i64| {
        chrono::DateTime::from_timestamp(1_800_000_000 + seconds, 0).expect("a time")
    };
    let row = |reader: &'static str| async move {
        let row = feed_reader::Entity::find()
            .filter(feed_reader::Column::Reader.eq(reader))
            .one(db)
            .await
            .expect("readers")
            .expect("its row");
        (
            Cursor {
                seq: row.seq,
                ordinal: row.ordinal,
            },
            row.read_at,
        )
    };
    let note = |position: Cursor, now| note_read(db, "key:1", Some(1), position, now);
    let seven = Cursor::after_batch(7);
    let partway = Cursor { seq: 9, ordinal: 2 };

    assert_eq!(note(seven, at(0)).await.expect("noted"), Noted::Inserted);
    assert_eq!(row("key:1").await, (seven, at(0)));
    // Within MOVE_EVERY of the last write, a move waits for a later read.
    let soon = MOVE_EVERY.num_seconds() - 1;
    assert_eq!(
        note(partway, at(soon)).await.expect("noted"),
        Noted::Skipped
    );
    assert_eq!(row("key:1").await, (seven, at(0)));
    let later = MOVE_EVERY.num_seconds();
    assert_eq!(note(partway, at(later)).await.expect("noted"), Noted::Moved);
    assert_eq!(row("key:1").await, (partway, at(later)));
    // An older position (a reader reading again from an older cursor) leaves it, and
    // only refreshes when it last read, once REFRESH_EVERY has passed.
    assert_eq!(
        note(seven, at(later + 1)).await.expect("noted"),
        Noted::Skipped
    );
    let refresh = later + REFRESH_EVERY.num_seconds();
    assert_eq!(
        note(seven, at(refresh)).await.expect("noted"),
        Noted::Refreshed
    );
    assert_eq!(row("key:1").await, (partway, at(refresh)));
    // A read that decided on an older row moves nothing once a further one is stored.
    let id = feed_reader::Entity::find()
        .one(db)
        .await
        .expect("readers")
        .expect("its row")
        .id;
    assert!(!advance(db, id, seven, at(refresh + 1000))
        .await
        .expect("ran"));
    assert_eq!(row("key:1").await, (partway, at(refresh)));

    // Reads racing on four connections, each due by its own clock, at positions out of
    // order: the row only ever moves forward, and ends at the furthest position noted.
    let racers = test.pool(4).await;
    let positions: Vec<Cursor> = [13, 4, 19, 11, 20, 2, 17, 8, 15, 6, 18, 10]
        .iter()
        .map(|seq| Cursor::after_batch(100 + seq))
        .collect();
    note_read(db, "key:2", Some(2), Cursor::after_batch(100), at(0))
        .await
        .expect("first read");
    let stop = tokio_util::sync::CancellationToken::new();
    let watcher = {
        let (stop, watched) = (stop.clone(), test.pool(1).await);
        tokio::spawn(async move {
            let mut seen = Vec::new();
            while !stop.is_cancelled() {
                let row = feed_reader::Entity::find()
                    .filter(feed_reader::Column::Reader.eq("key:2"))
                    .one(watched.main())
                    .await
                    .expect("readers")
                    .expect("its row");
                seen.push(Cursor {
                    seq: row.seq,
                    ordinal: row.ordinal,
                });
                tokio::task::yield_now().await;
            }
            seen
        })
    };
    let step = MOVE_EVERY.num_seconds();
    let noted = futures::future::join_all(positions.iter().enumerate().map(|(i, position)| {
        let db = racers.main();
        // Every read is due by its own clock against the first one's row.
        let now = at(step * (i as i64 + 1));
        async move {
            (
                note_read(db, "key:2", Some(2), *position, now).await,
                *position,
            )
        }
    }))
    .await;
    stop.cancel();
    let seen = watcher.await.expect("watcher");
    assert!(
        seen.windows(2).all(|pair| pair[0] <= pair[1]),
        "the position moved back: {seen:?}"
    );
    let moved: Vec<Cursor> = noted
        .into_iter()
        .filter_map(|(noted, position)| match noted.expect("noted") {
            Noted::Moved => Some(position),
            _ => None,
        })
        .collect();
    assert!(!moved.is_empty(), "some read moved it");
    let furthest = moved.iter().max().copied();
    assert_eq!(Some(row("key:2").await.0), furthest, "moved: {moved:?}");
}
