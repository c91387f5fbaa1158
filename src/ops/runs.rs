//! The run history: `sync_runs`, newest first.

use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QueryOrder, QuerySelect};
use serde::Deserialize;

use super::{check_limit, OpsError, Page};
use crate::entities::sync_run;

/// The largest page of runs.
pub const MAX_LIMIT: u64 = 1_000;

/// Which runs to list; `None` matches all.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct RunsQuery {
    pub provider: Option<String>,
    pub stream: Option<String>,
    pub user_id: Option<String>,
    /// Only runs that ended so (or are still running).
    #[serde(skip)]
    pub status: Option<sync_run::RunStatus>,
    /// Only runs older than this run id (the `next` of the page before).
    pub before: Option<i64>,
    /// At most this many runs (1 to [`MAX_LIMIT`]).
    pub limit: u64,
}

/// The newest runs that match `query`.
pub async fn list(
    db: &DatabaseConnection,
    query: &RunsQuery,
) -> Result<Page<sync_run::Model>, OpsError> {
    let limit = check_limit(query.limit, MAX_LIMIT)?;
    let mut select = sync_run::Entity::find();
    if let Some(provider) = &query.provider {
        select = select.filter(sync_run::Column::Provider.eq(provider.as_str()));
    }
    if let Some(stream) = &query.stream {
        select = select.filter(sync_run::Column::Stream.eq(stream.as_str()));
    }
    if let Some(user_id) = &query.user_id {
        select = select.filter(sync_run::Column::UserId.eq(user_id.as_str()));
    }
    if let Some(status) = query.status {
        select = select.filter(sync_run::Column::Status.eq(status));
    }
    if let Some(before) = query.before {
        select = select.filter(sync_run::Column::Id.lt(before));
    }
    let rows = select
        .order_by_desc(sync_run::Column::Id)
        .limit(limit.saturating_add(1))
        .all(db)
        .await?;
    Ok(Page::from_rows(rows, limit, |run| run.id))
}

/// One run.
pub async fn get(db: &DatabaseConnection, run_id: i64) -> Result<sync_run::Model, OpsError> {
    sync_run::Entity::find_by_id(run_id)
        .one(db)
        .await?
        .ok_or_else(|| OpsError::NotFound {
            what: format!("run with id {run_id}"),
            hint: "; `tributary runs` lists them",
        })
}

/// Every status a run can have, in the order they are declared.
pub(crate) fn statuses() -> Vec<sync_run::RunStatus> {
    use sea_orm::Iterable;
    sync_run::RunStatus::iter().collect()
}
