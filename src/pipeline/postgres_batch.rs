//! PostgreSQL: an all-new page as one statement, one round trip instead of four.
//!
//! A statement outside a transaction is a transaction of its own, so an all-new page
//! (`PageExpectation::New`) whose checkpoint moves is sent as one statement, its writes in
//! data-modifying `WITH` queries, which PostgreSQL runs to completion whether or not the
//! rest refers to them:
//!
//! ```sql
//! WITH inserted AS (INSERT INTO records ... FROM unnest($5, $6, $7) ... ON CONFLICT DO NOTHING RETURNING 1),
//!      saved_run AS (UPDATE sync_runs SET <counters> WHERE id = $3 RETURNING 1),
//!      saved_connection AS (UPDATE connections SET checkpoint = ... WHERE id = ... RETURNING 1)
//! SELECT 1 / ((SELECT count(*) FROM inserted) = <records>
//!             AND (SELECT count(*) FROM saved_run) = 1
//!             AND (SELECT count(*) FROM saved_connection) = 1)::int
//! ```
//!
//! The last line is the page's assertion: unless every record went in and both
//! bookkeeping rows were found, it divides by zero, the statement fails, and PostgreSQL
//! undoes all of it. The caller then writes the page the usual way, which decides, counts
//! and reports every record as if this had not been tried. (The condition comes from the
//! `WITH` queries, so the planner cannot fold the division into a constant and fail early.)

use sea_orm::{
    ConnectionTrait, DatabaseConnection, DbBackend, DbErr, EntityName, IdenStatic, Statement, Value,
};
use tributary_providers::Record;

use crate::entities::{connection, sync_run};
use crate::pipeline::bookkeeping::{checkpoint_column, counter_values, PageBookkeeping};
use crate::pipeline::insert::postgres_insert;
use crate::pipeline::store::PageContext;

/// Stores `records`, all of them new, with the page's bookkeeping in one statement:
/// `true` when the page is stored, `false` when nothing was written and the page must be
/// written the usual way (as it must when the page leaves the checkpoint as it is).
pub(crate) async fn write_new_page(
    db: &DatabaseConnection,
    context: &PageContext<'_>,
    records: &[Record],
    bookkeeping: &PageBookkeeping<'_>,
) -> Result<bool, DbErr> {
    let Some(checkpoint) = bookkeeping.checkpoint else {
        return Ok(false);
    };
    let records: Vec<&Record> = records.iter().collect();
    let (insert_sql, mut values) = postgres_insert(context, &records, bookkeeping.now);
    let mut parameter = |value: Value| {
        values.push(value);
        format!("${}", values.len())
    };
    let counters = counter_values(bookkeeping)
        .into_iter()
        .map(|(column, value)| format!("{} = {}", column.as_str(), parameter(value)))
        .collect::<Vec<_>>()
        .join(", ");
    let checkpoint = parameter(checkpoint_column(checkpoint)?.into());
    let connection_id = parameter(bookkeeping.connection_id.into());
    let record_count = parameter(i64::try_from(records.len()).unwrap_or(i64::MAX).into());
    let sql = format!(
        "WITH inserted AS ({insert_sql} RETURNING 1), \
         saved_run AS (UPDATE {runs} SET {counters} WHERE {run_id} = $3 RETURNING 1), \
         saved_connection AS (UPDATE {connections} SET {checkpoint_column} = {checkpoint}, \
         {updated_at} = $4 WHERE {connection_key} = {connection_id} RETURNING 1) \
         SELECT 1 / ((SELECT count(*) FROM inserted) = {record_count} \
         AND (SELECT count(*) FROM saved_run) = 1 \
         AND (SELECT count(*) FROM saved_connection) = 1)::int AS stored",
        runs = sync_run::Entity.table_name(),
        run_id = sync_run::Column::Id.as_str(),
        connections = connection::Entity.table_name(),
        checkpoint_column = connection::Column::Checkpoint.as_str(),
        updated_at = connection::Column::UpdatedAt.as_str(),
        connection_key = connection::Column::Id.as_str(),
    );
    match db
        .execute_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            sql,
            values,
        ))
        .await
    {
        Ok(_) => Ok(true),
        Err(error) => {
            tracing::debug!(%error, "The page's statement did not go in; nothing was written.");
            Ok(false)
        }
    }
}
