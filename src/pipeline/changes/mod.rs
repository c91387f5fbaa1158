//! The change feed: every insert, content update, deletion and restoration of a record,
//! readable in order behind a [`Cursor`], each once.
//!
//! A transaction that changes records opens a batch, records one row per change pointing
//! at it, and as its last statement before `COMMIT` stamps the batch with its seq, so
//! that a reader that saw seq `n` can never later find a batch below `n` appear
//! (`order.rs` says how each backend ensures it; docs/decisions/change-feed.md).
//! `write.rs` writes batches (the store path and `finish_run` call it), `read.rs` reads
//! them, `sweep.rs` forgets old ones, `readers.rs` notes how far each reader got.

mod cursor;
mod order;
mod read;
mod readers;
mod sweep;
mod write;

pub use cursor::{Cursor, FeedCursor};
pub(crate) use order::{align_clock, clock_missing, TRANSACTION_SEQ};
pub(crate) use read::position_in;
pub(crate) use read::run_cursor_bounds;
pub(crate) use read::MAX_LIMIT;
pub(crate) use read::{database_id, head};
pub use read::{read_changes, FeedChange, FeedError, FeedQuery};
pub(crate) use readers::{
    forget_reader, key_reader, note_read, reader_lags, ReaderPlace, COUNT_CAP,
};
pub use sweep::{sweep_expired_changes, SweptChanges};
// Only the pipeline writes changes, each in the transaction of the write it records.
pub(crate) use write::{
    discard_batch, open_batch, record_changes, stamp_batch, BatchOwner, ChangeBatch, ChangeSlot,
};
pub(crate) use write::{CLOCK_SEQ, TICK};

#[cfg(test)]
mod tests;
