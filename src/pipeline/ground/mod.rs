//! The pipeline's ground floor: the types and statements that the layers above share
//! (the run's counters, the names SQL text is written with, the record row's columns, a
//! page's transaction), so that none of them has to import another layer for them. It
//! imports nothing of the pipeline.

mod counts;
pub(crate) mod names;
pub(crate) mod row;

use sea_orm::{
    DatabaseConnection, DatabaseTransaction, DbErr, SqliteTransactionMode, TransactionOptions,
    TransactionTrait,
};

pub(crate) use counts::{counter_columns, counts_model, to_db, update_counts};
pub use counts::{PageStoreCounts, RunCounts};

/// Opens a page's transaction. On SQLite it takes the write lock at once (`BEGIN
/// IMMEDIATE`), waiting for it under the busy timeout. A deferred transaction would read
/// the lookup's snapshot first and ask for the write lock only at the insert; if another
/// process committed in between, SQLite refuses the upgrade at once with `SQLITE_BUSY`,
/// and the whole page would fail. Taking the lock first also means no other writer can
/// insert a key between our lookup and our insert. Other backends ignore the mode.
pub(crate) async fn begin_page_transaction(
    db: &DatabaseConnection,
) -> Result<DatabaseTransaction, DbErr> {
    db.begin_with_options(TransactionOptions {
        sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
        ..TransactionOptions::default()
    })
    .await
}
