//! Runs' error reports: `run_errors`, oldest first.

use std::collections::HashMap;

use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QueryOrder, QuerySelect};
use serde::{Deserialize, Serialize};

use super::{check_limit, OpsError, Page};
use crate::entities::{run_error, sync_run};

/// The largest page of errors.
pub const MAX_LIMIT: u64 = 10_000;

/// One run and a page of its errors.
#[derive(Clone, Debug, Serialize)]
pub struct RunErrors {
    pub run: sync_run::Model,
    pub errors: Page<run_error::Model>,
}

/// Which errors of one run to list.
#[derive(Clone, Copy, Debug, Deserialize)]
pub struct RunErrorsQuery {
    pub run_id: i64,
    /// Only errors after this error id (the `next` of the page before).
    pub after: Option<i64>,
    /// At most this many errors (1 to [`MAX_LIMIT`]).
    pub limit: u64,
}

/// The run and a page of its errors (resolved or not), oldest first.
pub async fn of_run(
    db: &DatabaseConnection,
    query: &RunErrorsQuery,
) -> Result<RunErrors, OpsError> {
    let limit = check_limit(query.limit, MAX_LIMIT)?;
    let run = super::runs::get(db, query.run_id).await?;
    let mut select = run_error::Entity::find().filter(run_error::Column::RunId.eq(query.run_id));
    if let Some(after) = query.after {
        select = select.filter(run_error::Column::Id.gt(after));
    }
    let rows = select
        .order_by_asc(run_error::Column::Id)
        .limit(limit.saturating_add(1))
        .all(db)
        .await?;
    Ok(RunErrors {
        run,
        errors: Page::from_rows(rows, limit, |error| error.id),
    })
}

/// Which open errors (those no replay resolved) to list.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct OpenErrorsQuery {
    /// Only this run's.
    pub run_id: Option<i64>,
    /// Only errors of runs of this stream.
    pub stream: Option<String>,
    /// Only errors after this error id (the `next` of the page before).
    pub after: Option<i64>,
    /// At most this many errors (1 to [`MAX_LIMIT`]).
    pub limit: u64,
}

/// An error with the stream of its run.
#[derive(Clone, Debug, Serialize)]
pub struct ErrorItem {
    #[serde(flatten)]
    pub error: run_error::Model,
    /// The stream the failed run synced; `None` for a run from before streams.
    pub stream: Option<String>,
}

/// One page of the open errors that match `query`, oldest first.
pub async fn open(
    db: &DatabaseConnection,
    query: &OpenErrorsQuery,
) -> Result<Page<ErrorItem>, OpsError> {
    let limit = check_limit(query.limit, MAX_LIMIT)?;
    let mut select = run_error::Entity::find().filter(run_error::Column::ResolvedByRunId.is_null());
    if let Some(run_id) = query.run_id {
        select = select.filter(run_error::Column::RunId.eq(run_id));
    }
    if let Some(after) = query.after {
        select = select.filter(run_error::Column::Id.gt(after));
    }
    if let Some(stream) = &query.stream {
        let runs = sea_orm::sea_query::Query::select()
            .column(sync_run::Column::Id)
            .from(sync_run::Entity)
            .and_where(sync_run::Column::Stream.eq(stream.as_str()))
            .to_owned();
        select = select.filter(run_error::Column::RunId.in_subquery(runs));
    }
    let rows = select
        .order_by_asc(run_error::Column::Id)
        .limit(limit.saturating_add(1))
        .all(db)
        .await?;
    let page = Page::from_rows(rows, limit, |error| error.id);
    let mut run_ids: Vec<i64> = page.items.iter().map(|error| error.run_id).collect();
    run_ids.sort_unstable();
    run_ids.dedup();
    let streams: HashMap<i64, Option<String>> = sync_run::Entity::find()
        .select_only()
        .columns([sync_run::Column::Id, sync_run::Column::Stream])
        .filter(sync_run::Column::Id.is_in(run_ids))
        .into_tuple::<(i64, Option<String>)>()
        .all(db)
        .await?
        .into_iter()
        .collect();
    Ok(Page {
        items: page
            .items
            .into_iter()
            .map(|error| ErrorItem {
                stream: streams.get(&error.run_id).cloned().flatten(),
                error,
            })
            .collect(),
        next: page.next,
    })
}
