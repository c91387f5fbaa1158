//! The end of every page's transaction: the run's counters and heartbeat, and the
//! connection's checkpoint, in one round trip where the backend allows it.

use chrono::{DateTime, Utc};
use sea_orm::sea_query::{
    Alias, CommonTableExpression, Expr, PostgresQueryBuilder, Query, SqliteQueryBuilder,
    UpdateStatement, Value, Values, WithClause,
};
use sea_orm::{ColumnTrait, ConnectionTrait, DatabaseTransaction, DbBackend, DbErr, Statement};

use crate::entities::{connection, sync_run};
use crate::pipeline::checkpoint::Checkpoint;
use crate::pipeline::run::{counter_columns, save_counts, RunCounts};

/// What a page's transaction writes besides its records.
pub struct PageBookkeeping<'a> {
    pub run_id: i64,
    pub counts: &'a RunCounts,
    pub connection_id: i64,
    /// `None`: leave the connection's checkpoint as it is (a replay). `Some(None)`: clear
    /// it (the last page). `Some(Some(next))`: the page after this one.
    pub checkpoint: Option<Option<&'a Checkpoint>>,
    pub now: DateTime<Utc>,
}

/// Saves the run's counters and the connection's checkpoint. On PostgreSQL the two
/// updates are one statement (the first in a `WITH`), on SQLite two statements sent at
/// once; MySQL's prepared statements allow neither, so it takes two round trips. Fails
/// with [`DbErr::RecordNotUpdated`] when the run's row or the connection is gone.
pub async fn save_page_bookkeeping(
    txn: &DatabaseTransaction,
    page: &PageBookkeeping<'_>,
) -> Result<(), DbErr> {
    let backend = txn.get_database_backend();
    if backend == DbBackend::Sqlite {
        let SqliteBookkeeping { statements, values } = sqlite_statements(page)?;
        let rows = statements.len() as u64;
        let statement = Statement::from_sql_and_values(backend, statements.join("; "), values);
        if txn.execute_raw(statement).await?.rows_affected() != rows {
            return Err(DbErr::RecordNotUpdated);
        }
        return Ok(());
    }
    let Some(checkpoint) = page.checkpoint else {
        return save_counts(txn, page.run_id, page.counts).await;
    };
    let mut run = counts_update(page);
    let mut next = checkpoint_update(page, checkpoint)?;
    if backend == DbBackend::Postgres {
        // The connection is updated only if the run's row was: one row means both.
        let run = run.returning_col(sync_run::Column::Id).to_owned();
        let saved = Alias::new("saved_run");
        next.and_where(Expr::exists(
            Query::select()
                .expr(Expr::val(1))
                .from(saved.clone())
                .to_owned(),
        ));
        let cte = CommonTableExpression::new()
            .query(run)
            .table_name(saved)
            .to_owned();
        let (sql, values) = WithClause::new()
            .cte(cte)
            .to_owned()
            .query(next)
            .build(PostgresQueryBuilder);
        let statement = Statement::from_sql_and_values(backend, sql, values);
        if txn.execute_raw(statement).await?.rows_affected() != 1 {
            return Err(DbErr::RecordNotUpdated);
        }
        return Ok(());
    }
    for statement in [&mut run, &mut next] {
        if txn.execute(&*statement).await?.rows_affected() == 0 {
            return Err(DbErr::RecordNotUpdated);
        }
    }
    Ok(())
}

/// A page's bookkeeping on SQLite: `UPDATE` statements that must each change one row,
/// and their values in order. sqlx runs statements joined by `;` in turn in one call,
/// binding each its share of the values.
pub(crate) struct SqliteBookkeeping {
    /// The run's update, and the connection's when the checkpoint moves.
    pub statements: Vec<String>,
    pub values: Values,
}

/// The statements of a page's bookkeeping on SQLite.
pub(crate) fn sqlite_statements(page: &PageBookkeeping<'_>) -> Result<SqliteBookkeeping, DbErr> {
    let (run_sql, mut values) = counts_update(page).build(SqliteQueryBuilder);
    let mut statements = vec![run_sql];
    if let Some(checkpoint) = page.checkpoint {
        let (next_sql, next_values) =
            checkpoint_update(page, checkpoint)?.build(SqliteQueryBuilder);
        statements.push(next_sql);
        values.0.extend(next_values.0);
    }
    Ok(SqliteBookkeeping { statements, values })
}

/// The `connections.checkpoint` value: the next page's position as JSON, or `NULL` after
/// the last page.
pub(crate) fn checkpoint_column(checkpoint: Option<&Checkpoint>) -> Result<Option<String>, DbErr> {
    checkpoint
        .map(|checkpoint| {
            checkpoint
                .to_column()
                .map_err(|error| DbErr::Custom(format!("serialising the checkpoint: {error}")))
        })
        .transpose()
}

/// `UPDATE connections SET checkpoint, updated_at WHERE id = connection_id`.
fn checkpoint_update(
    page: &PageBookkeeping<'_>,
    checkpoint: Option<&Checkpoint>,
) -> Result<UpdateStatement, DbErr> {
    let checkpoint = checkpoint_column(checkpoint)?;
    Ok(Query::update()
        .table(connection::Entity)
        .value(connection::Column::Checkpoint, checkpoint)
        .value(connection::Column::UpdatedAt, page.now)
        .and_where(connection::Column::Id.eq(page.connection_id))
        .to_owned())
}

/// `UPDATE sync_runs SET <counters>, heartbeat_at WHERE id = run_id`.
fn counts_update(page: &PageBookkeeping<'_>) -> UpdateStatement {
    Query::update()
        .table(sync_run::Entity)
        .values(
            counter_values(page)
                .into_iter()
                .map(|(column, value)| (column, Expr::val(value))),
        )
        .and_where(sync_run::Column::Id.eq(page.run_id))
        .to_owned()
}

/// The run's columns a page sets: its counters and its heartbeat.
pub(crate) fn counter_values(page: &PageBookkeeping<'_>) -> Vec<(sync_run::Column, Value)> {
    let mut values = counter_columns(page.counts).to_vec();
    values.push((sync_run::Column::HeartbeatAt, page.now.into()));
    values
}
