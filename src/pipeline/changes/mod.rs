//! The change feed: every insert, content update, deletion and restoration of a record,
//! readable in commit order behind a [`Cursor`].
//!
//! A transaction that changes records opens a batch, records one row per change pointing
//! at it, and as its last statement before `COMMIT` ticks the one-row clock and stamps
//! the batch with the new seq. The clock's row lock is held until the commit, so the
//! next transaction gets its seq only once this one committed: seq order is commit
//! order, and a reader that saw seq `n` can never later find a batch below `n` appear
//! (docs/decisions/change-feed.md). `write.rs` writes batches (the store path and
//! `finish_run` call it), `read.rs` reads them, `sweep.rs` forgets old ones.

mod cursor;
mod read;
mod sweep;
mod write;

pub use cursor::{Cursor, CursorError};
pub use read::{
    head, read_changes, run_cursor_bounds, FeedChange, FeedError, FeedPage, FeedQuery, RunCursors,
    MAX_LIMIT,
};
pub use sweep::{sweep_expired_changes, SweptChanges};
pub(crate) use write::{clock_missing, CLOCK_SEQ, TICK};
pub use write::{
    discard_batch, open_batch, record_changes, stamp_batch, BatchOwner, ChangeBatch, ChangeSlot,
};
