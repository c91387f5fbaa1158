//! SQLite: an all-new page in one hand-off to the database instead of four.
//!
//! sqlx runs SQLite on a worker thread of its own, and every statement is a hand-off
//! there and back: two thread wake-ups, which on a small machine cost about as much as
//! inserting the page's hundred rows. An all-new page (`PageExpectation::New`) is
//! therefore built in full before the connection is taken, and sent as one batch:
//!
//! ```sql
//! BEGIN IMMEDIATE;
//! UPDATE sync_runs SET <counters> WHERE id = ?;
//! SELECT 1 WHERE json(CASE changes() WHEN 1 THEN '1' ELSE 'no row changed' END) IS NULL;
//! UPDATE connections SET checkpoint = ? WHERE id = ?;
//! SELECT 1 WHERE json(CASE changes() WHEN 1 THEN '1' ELSE 'no row changed' END) IS NULL;
//! INSERT INTO records (...) VALUES (...), ...;   -- no ON CONFLICT
//! COMMIT
//! ```
//!
//! The bookkeeping is built with sea-query; the insert, which carries nearly all the
//! values, is written here directly and comes last, so its values follow the
//! bookkeeping's ([`push_records_insert`]). The batch takes the writing connection through
//! the [`WriteLane`], which hands it from one batch straight to the next.
//!
//! Every way the page could go wrong stops the batch with an error before `COMMIT`: the
//! `INSERT` has no `ON CONFLICT` clause, so a key that exists already or a row the
//! database refuses fails it; and the `SELECT` after each update fails when the update
//! found no row (the run's row or the connection is gone). sqlx stops at the first error,
//! the transaction is rolled back with nothing written, and the caller writes the page
//! the usual way, which decides, counts and reports every record as if this had not been
//! tried. The batch runs in a task of its own, so a caller dropped halfway cannot leave
//! the connection inside an open transaction.
//!
//! Each statement is also one message from SQLite's thread to the task waiting for the
//! batch, and can be one more thread wake-up. The guards replaced a `temp` table with a
//! `CHECK` (created, filled and emptied in every batch): two statements fewer a page,
//! about 5 % more pages a second.

use std::sync::Arc;

use chrono::{DateTime, SecondsFormat, Utc};
use sea_orm::sqlx::sqlite::SqliteArguments;
use sea_orm::sqlx::{self, Arguments, IntoArguments, Sqlite};
use sea_orm::DbErr;
use sea_query_sqlx::SqlxValues;
use tributary_providers::Record;

use crate::db::WriteLane;
use crate::pipeline::bookkeeping::{sqlite_statements, PageBookkeeping};
use crate::pipeline::insert::insert_into_records;
use crate::pipeline::store::PageContext;

/// Sent after each bookkeeping update: fails the batch unless the update changed exactly
/// one row. SQLite has no `RAISE` outside triggers, so the failure is `json()` refusing
/// text that is not JSON; when the update did change its row, the statement returns
/// nothing and writes nothing.
const ONE_ROW_CHANGED: &str =
    "SELECT 1 WHERE json(CASE changes() WHEN 1 THEN '1' ELSE 'no row changed' END) IS NULL";

/// A page's whole write, ready to send.
pub(crate) struct NewPageBatch {
    sql: String,
    arguments: SqliteArguments,
}

impl NewPageBatch {
    /// The batch for `records`, all of them new, and the page's bookkeeping.
    pub fn new(
        context: &PageContext<'_>,
        records: &[Record],
        bookkeeping: &PageBookkeeping<'_>,
        now: DateTime<Utc>,
    ) -> Result<NewPageBatch, DbErr> {
        let mut sql = "BEGIN IMMEDIATE".to_string();
        let bookkeeping = sqlite_statements(bookkeeping)?;
        for update in &bookkeeping.statements {
            sql.push_str(&format!("; {update}; {ONE_ROW_CHANGED}"));
        }
        // The values are converted here, before the connection is taken, so the one
        // writing connection waits only for SQLite.
        let mut arguments: SqliteArguments =
            IntoArguments::<Sqlite>::into_arguments(SqlxValues(bookkeeping.values));
        // The insert comes last, so its values follow the bookkeeping's. An empty page
        // (the end of a listing paged until empty) writes its bookkeeping only.
        if !records.is_empty() {
            sql.push_str("; ");
            push_records_insert(&mut sql, &mut arguments, context, records, now)?;
        }
        sql.push_str("; COMMIT");
        Ok(NewPageBatch { sql, arguments })
    }

    /// Sends the batch: `true` when the page is stored, `false` when it was rolled back
    /// (a key existed, a row was refused, or the run's or connection's row was gone)
    /// and must be written the usual way.
    pub async fn write(self, lane: &WriteLane) -> Result<bool, DbErr> {
        let NewPageBatch { sql, arguments } = self;
        let lane = lane.clone();
        tokio::spawn(async move {
            let mut turn = lane.turn().await.map_err(connection_error)?;
            // Several statements in one query: only sqlx's SQLite driver runs them, and
            // it is what lets the page go in one hand-off.
            let written = sqlx::query_with(sqlx::AssertSqlSafe(sql), arguments)
                .execute(&mut **turn.connection())
                .await;
            let Err(error) = written else {
                turn.pass_on();
                return Ok(true);
            };
            tracing::debug!(%error, "The page's batch did not go in; rolling it back.");
            // This fails when no transaction is open (`BEGIN` itself failed), or when the
            // connection is broken, which is then closed. Either way the connection goes
            // back to the pool, which checks it, rather than to the next batch.
            let connection = turn.connection();
            if sqlx::query("ROLLBACK")
                .execute(&mut **connection)
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

/// `INSERT INTO records (...) VALUES (?, ...), ...`, one row per record, first seen by the
/// page's run at `now`, with its values added to `arguments`. Written here rather than
/// through sea-query: a page's hundred rows went through three copies of every payload
/// and a timestamp formatted twice a row, which cost about a tenth of the process's CPU
/// in a first sync. Here a payload is copied once, and what every row shares (the user,
/// the provider, the run and the time) is one value referenced by each row.
fn push_records_insert(
    sql: &mut String,
    arguments: &mut SqliteArguments,
    context: &PageContext<'_>,
    records: &[Record],
    now: DateTime<Utc>,
) -> Result<(), DbErr> {
    sql.push_str(&insert_into_records());
    sql.push_str(" VALUES ");
    // The text sqlx itself writes for a `DateTime` on SQLite, so these rows read back
    // exactly as rows written through sea-orm do.
    let now: Arc<str> = now.to_rfc3339_opts(SecondsFormat::AutoSi, false).into();
    let user: Arc<str> = context.connection.user_id.as_str().into();
    let provider: Arc<str> = context.connection.provider.as_str().into();
    arguments.reserve(records.len() * 9, 0);
    for (index, record) in records.iter().enumerate() {
        if index > 0 {
            sql.push_str(", ");
        }
        sql.push_str("(?, ?, ?, ?, ?, ?, ?, ?, ?)");
        let added = (|| {
            arguments.add(user.clone())?;
            arguments.add(provider.clone())?;
            arguments.add(Arc::<str>::from(record.external_id.as_str()))?;
            arguments.add(Arc::<str>::from(record.payload.as_str()))?;
            arguments.add(Arc::<str>::from(record.content_hash.as_str()))?;
            arguments.add(context.run_id)?;
            arguments.add(context.run_id)?;
            arguments.add(now.clone())?;
            arguments.add(now.clone())
        })();
        added.map_err(|error| DbErr::Custom(format!("building the page's insert: {error}")))?;
    }
    Ok(())
}

fn connection_error(error: sqlx::Error) -> DbErr {
    DbErr::Conn(sea_orm::RuntimeErr::SqlxError(error.into()))
}
