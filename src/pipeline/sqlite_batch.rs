//! SQLite: an all-new page in two hand-offs to the database instead of four.
//!
//! sqlx runs SQLite on a worker thread of its own, and every statement is a hand-off
//! there and back: two thread wake-ups, which on a small machine cost about as much as
//! inserting the page's hundred rows. An all-new page (`PageExpectation::New`) is
//! therefore built in full before the connection is taken, and sent as one batch —
//! `BEGIN IMMEDIATE`, one plain `INSERT` of every record, the run's counters and the
//! checkpoint — followed by `COMMIT`.
//!
//! The `INSERT` has no `ON CONFLICT` clause: a key that exists already, or a row the
//! database refuses, fails it, sqlx stops the batch there, and the transaction is rolled
//! back with nothing written. So is a batch whose bookkeeping did not find its rows. The
//! caller then writes the page the usual way, which decides and counts every record as
//! if this had not been tried. The batch runs in a task of its own, so a caller dropped
//! halfway cannot leave the pooled connection inside an open transaction.

use chrono::{DateTime, Utc};
use futures::TryStreamExt;
use sea_orm::sea_query::{Query, SqliteQueryBuilder, Values};
use sea_orm::sqlx::{self, Either, SqliteConnection, SqlitePool};
use sea_orm::{DatabaseConnection, DbErr};
use sea_query_sqlx::SqlxValues;
use tributary_providers::Record;

use crate::entities::record;
use crate::pipeline::bookkeeping::{sqlite_statements, PageBookkeeping};
use crate::pipeline::store::PageContext;

/// A page's whole write, ready to send.
pub(crate) struct NewPageBatch {
    sql: String,
    values: Values,
    /// The rows the batch changes when every record went in and the bookkeeping found
    /// its rows.
    rows: u64,
}

impl NewPageBatch {
    /// The batch for `records`, all of them new, and the page's bookkeeping.
    pub fn new(
        context: &PageContext<'_>,
        records: &[Record],
        bookkeeping: &PageBookkeeping<'_>,
        now: DateTime<Utc>,
    ) -> Result<NewPageBatch, DbErr> {
        let mut insert = Query::insert();
        insert.into_table(record::Entity).columns([
            record::Column::UserId,
            record::Column::Provider,
            record::Column::ExternalId,
            record::Column::Payload,
            record::Column::ContentHash,
            record::Column::FirstSeenRunId,
            record::Column::LastSeenRunId,
            record::Column::CreatedAt,
            record::Column::UpdatedAt,
        ]);
        for record in records {
            insert
                .values([
                    context.connection.user_id.as_str().into(),
                    context.connection.provider.as_str().into(),
                    record.external_id.as_str().into(),
                    record.payload.as_str().into(),
                    record.content_hash.as_str().into(),
                    context.run_id.into(),
                    context.run_id.into(),
                    now.into(),
                    now.into(),
                ])
                .map_err(|error| DbErr::Custom(format!("building the page's insert: {error}")))?;
        }
        let (insert_sql, mut values) = insert.build(SqliteQueryBuilder);
        let bookkeeping = sqlite_statements(bookkeeping)?;
        values.0.extend(bookkeeping.values.0);
        Ok(NewPageBatch {
            sql: format!("BEGIN IMMEDIATE; {insert_sql}; {}", bookkeeping.sql),
            values,
            rows: records.len() as u64 + bookkeeping.rows,
        })
    }

    /// Sends the batch and commits it: `true` when the page is stored, `false` when it
    /// was rolled back (a key existed, a row was refused, or the run's or connection's
    /// row was missing) and must be written the usual way.
    pub async fn write(self, db: &DatabaseConnection) -> Result<bool, DbErr> {
        let pool: SqlitePool = db.get_sqlite_connection_pool().clone();
        tokio::spawn(async move {
            let mut connection = pool.acquire().await.map_err(connection_error)?;
            match run_batch(&mut connection, self.sql, self.values).await {
                Ok(rows) if rows == self.rows => {
                    match sqlx::query("COMMIT").execute(&mut *connection).await {
                        Ok(_) => return Ok(true),
                        Err(error) => {
                            tracing::debug!(%error, "Committing the page's batch failed; rolling it back.");
                        }
                    }
                }
                Ok(rows) => tracing::debug!(
                    rows,
                    expected = self.rows,
                    "The page's batch changed other rows than expected; rolling it back."
                ),
                Err(error) => {
                    tracing::debug!(%error, "The page's batch did not go in; rolling it back.");
                }
            }
            // This fails when no transaction is open (`BEGIN` itself failed), or when the
            // connection is broken: either way it is not used again.
            if sqlx::query("ROLLBACK")
                .execute(&mut *connection)
                .await
                .is_err()
            {
                connection.close_on_drop();
            }
            Ok(false)
        })
        .await
        .map_err(|error| DbErr::Custom(format!("the page's write task failed: {error}")))?
    }
}

/// Runs the statements of `sql` in turn and returns the rows changed by all but the first
/// (`BEGIN`, for which SQLite repeats the count of the connection's previous write).
async fn run_batch(
    connection: &mut SqliteConnection,
    sql: String,
    values: Values,
) -> Result<u64, sqlx::Error> {
    // sqlx deprecates several statements in one query, which only its SQLite driver runs;
    // it is what lets the page go in one hand-off.
    #[allow(deprecated)]
    let mut results =
        sqlx::query_with(sqlx::AssertSqlSafe(sql), SqlxValues(values)).fetch_many(connection);
    let mut rows = 0;
    let mut statements = 0;
    while let Some(result) = results.try_next().await? {
        if let Either::Left(done) = result {
            if statements > 0 {
                rows += done.rows_affected();
            }
            statements += 1;
        }
    }
    Ok(rows)
}

fn connection_error(error: sqlx::Error) -> DbErr {
    DbErr::Conn(sea_orm::RuntimeErr::SqlxError(error.into()))
}
