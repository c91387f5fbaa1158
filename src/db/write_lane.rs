//! SQLite: the writing connection passed from one all-new page's batch to the next while
//! batches are waiting, instead of going back to the pool between them.
//!
//! A sqlx pool pings every connection given back to it. On SQLite that ping is one more
//! round trip to the connection's worker thread, and the next batch is sent only once the
//! ping has come back and the pool has woken the next task: four thread wake-ups between
//! two batches instead of two, during which SQLite's thread sleeps. In a first sync
//! that sleep was about a quarter of the writer's time.
//!
//! So a batch that finds other batches waiting hands the connection to the next one
//! directly. Everything else that writes (run bookkeeping, leases, pages written the usual
//! way) still takes the connection from the pool, so the lane gives it back at least
//! every [`HOLD_AT_MOST`], however many batches wait, and whenever none does, including
//! when the batch it was passed on to was dropped before taking it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sea_orm::sqlx::pool::PoolConnection;
use sea_orm::sqlx::{self, Sqlite, SqlitePool};
use tokio::sync::{Mutex, OwnedMutexGuard};

/// How long the lane keeps the connection from the pool, at most, before the statements
/// queued there get their turn.
const HOLD_AT_MOST: Duration = Duration::from_millis(50);

/// The connection's way from one batch to the next. Clones share the lane.
#[derive(Clone, Debug)]
pub struct WriteLane {
    pool: SqlitePool,
    /// Batches that asked for a turn and have not had it yet.
    waiting: Arc<AtomicUsize>,
    held: Arc<Mutex<Option<Held>>>,
}

#[derive(Debug)]
struct Held {
    connection: PoolConnection<Sqlite>,
    /// When the lane took the connection from the pool.
    since: Instant,
}

impl WriteLane {
    /// A lane for the writing connection of `pool`.
    pub fn new(pool: SqlitePool) -> WriteLane {
        WriteLane {
            pool,
            waiting: Arc::new(AtomicUsize::new(0)),
            held: Arc::new(Mutex::new(None)),
        }
    }

    /// Waits for the batches before this one, then for the connection: from the batch
    /// before, or from the pool. Turns are taken in the order they were asked for. A
    /// batch that stops waiting (its task dropped) leaves no connection behind for a
    /// batch that will not come.
    pub async fn turn(&self) -> Result<Turn, sqlx::Error> {
        let waiting = Waiting::counted(self);
        let mut slot = self.held.clone().lock_owned().await;
        drop(waiting);
        let held = match slot.take() {
            Some(held) => held,
            None => Held {
                connection: self.pool.acquire().await?,
                since: Instant::now(),
            },
        };
        Ok(Turn {
            lane: self.clone(),
            slot,
            held,
        })
    }

    /// When no batch waits any more, a connection passed on to the slot goes back to the
    /// pool. Does nothing while a batch holds the slot: that batch takes the connection.
    fn give_back_if_nobody_waits(&self) {
        if self.waiting.load(Ordering::SeqCst) == 0 {
            if let Ok(mut slot) = self.held.try_lock() {
                drop(slot.take());
            }
        }
    }
}

/// A batch counted as waiting for its turn, for as long as it waits.
struct Waiting<'a> {
    lane: &'a WriteLane,
}

impl Waiting<'_> {
    fn counted(lane: &WriteLane) -> Waiting<'_> {
        lane.waiting.fetch_add(1, Ordering::SeqCst);
        Waiting { lane }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.lane.waiting.fetch_sub(1, Ordering::SeqCst);
        // Given its turn, the batch holds the slot and this does nothing. Dropped while
        // waiting, it may have been the batch a connection was passed on to.
        self.lane.give_back_if_nobody_waits();
    }
}

/// One batch's use of the writing connection. Dropped without [`Turn::pass_on`], the
/// connection goes back to the pool, which checks it before anyone uses it again.
pub struct Turn {
    lane: WriteLane,
    slot: OwnedMutexGuard<Option<Held>>,
    held: Held,
}

impl Turn {
    /// The connection, outside any transaction.
    pub fn connection(&mut self) -> &mut PoolConnection<Sqlite> {
        &mut self.held.connection
    }

    /// The batch is done and left the connection outside any transaction: the next batch
    /// waiting takes it, unless none is or the lane has held it for [`HOLD_AT_MOST`]
    /// already, in which case it goes back to the pool.
    pub fn pass_on(self) {
        let Turn {
            lane,
            mut slot,
            held,
        } = self;
        if lane.waiting.load(Ordering::SeqCst) > 0 && held.since.elapsed() < HOLD_AT_MOST {
            *slot = Some(held);
        }
        drop(slot);
        // The batch waiting may have been dropped since: then nobody comes for it.
        lane.give_back_if_nobody_waits();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use sea_orm::sqlx::sqlite::SqlitePoolOptions;

    use super::*;

    /// A one-connection pool on an in-memory database that counts the connections given
    /// back to it.
    async fn counted_pool() -> (SqlitePool, Arc<AtomicUsize>) {
        let released = Arc::new(AtomicUsize::new(0));
        let counter = released.clone();
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .after_release(move |_, _| {
                counter.fetch_add(1, Ordering::SeqCst);
                Box::pin(async { Ok(true) })
            })
            .connect("sqlite::memory:")
            .await
            .expect("in-memory pool");
        (pool, released)
    }

    /// A second batch asking `lane` for a turn, once it is waiting for one.
    async fn next_batch_waiting(lane: &WriteLane) -> tokio::task::JoinHandle<Turn> {
        let next_lane = lane.clone();
        let next = tokio::spawn(async move { next_lane.turn().await.expect("next turn") });
        while lane.waiting.load(Ordering::SeqCst) != 1 {
            tokio::task::yield_now().await;
        }
        next
    }

    /// Waits (at most a few seconds) until the pool has had `n` connections given back.
    async fn until_released(released: &AtomicUsize, n: usize) {
        tokio::time::timeout(Duration::from_secs(5), async {
            while released.load(Ordering::SeqCst) < n {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the pool did not get {n} connection(s) back"));
    }

    #[tokio::test]
    async fn a_batch_waiting_gets_the_connection_straight_from_the_one_before() {
        let (pool, released) = counted_pool().await;
        let lane = WriteLane::new(pool.clone());
        let first = lane.turn().await.expect("first turn");
        let second = next_batch_waiting(&lane).await;

        first.pass_on();
        let second = second.await.expect("second batch");
        assert_eq!(released.load(Ordering::SeqCst), 0, "not through the pool");
        assert!(
            pool.try_acquire().is_none(),
            "the lane holds the connection"
        );

        // Nobody waits: the connection goes back to the pool for everyone else.
        second.pass_on();
        until_released(&released, 1).await;
        let other = tokio::time::timeout(Duration::from_secs(5), pool.acquire()).await;
        assert!(matches!(other, Ok(Ok(_))), "the pool has it back");
    }

    #[tokio::test]
    async fn the_lane_gives_the_connection_back_to_the_pool_after_holding_it_a_while() {
        let (pool, released) = counted_pool().await;
        let lane = WriteLane::new(pool.clone());
        let first = lane.turn().await.expect("first turn");
        tokio::time::sleep(HOLD_AT_MOST + Duration::from_millis(10)).await;
        let second = next_batch_waiting(&lane).await;

        first.pass_on();
        until_released(&released, 1).await;
        let second = second.await.expect("second batch");
        drop(second);
        until_released(&released, 2).await;
    }

    #[tokio::test]
    async fn a_turn_dropped_without_passing_on_gives_the_connection_back_to_the_pool() {
        let (pool, released) = counted_pool().await;
        let lane = WriteLane::new(pool.clone());
        let first = lane.turn().await.expect("first turn");
        let second = next_batch_waiting(&lane).await;

        // A failed batch: its connection may be in any state, so the pool checks it.
        drop(first);
        until_released(&released, 1).await;
        second.await.expect("second batch").pass_on();
        until_released(&released, 2).await;
    }

    #[tokio::test]
    async fn a_batch_that_stops_waiting_strands_no_connection() {
        let (pool, released) = counted_pool().await;
        let lane = WriteLane::new(pool.clone());
        let first = lane.turn().await.expect("first turn");
        let second = next_batch_waiting(&lane).await;

        // Passed on to the batch waiting, which is dropped before it takes its turn.
        first.pass_on();
        second.abort();
        assert!(second.await.is_err(), "the waiting batch was dropped");
        until_released(&released, 1).await;
        let other = tokio::time::timeout(Duration::from_secs(5), pool.acquire()).await;
        assert!(matches!(other, Ok(Ok(_))), "the pool has it back");
    }
}
