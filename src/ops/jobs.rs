//! Sync jobs (`sync_jobs`), newest first, with the connection each is for.

use std::collections::HashMap;

use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QueryOrder, QuerySelect};
use serde::Serialize;

use super::{check_limit, OpsError, Page};
use crate::entities::connection;
use crate::entities::sync_job::{self, JobKind, JobStatus};

/// The largest page of jobs.
pub const MAX_LIMIT: u64 = 1_000;

/// Which jobs to list by where they stand: `--status` and the API's `status` alike.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize, utoipa::ToSchema, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Queued or running.
    Active,
    Queued,
    /// Queued and not due yet (a retry's backoff, a spent budget, a lease held).
    Deferred,
    Running,
    Done,
    Skipped,
    Failed,
    Interrupted,
    Cancelled,
}

impl JobState {
    /// The statuses a job in this state has.
    fn statuses(self) -> &'static [JobStatus] {
        match self {
            JobState::Active => &[JobStatus::Queued, JobStatus::Running],
            JobState::Queued | JobState::Deferred => &[JobStatus::Queued],
            JobState::Running => &[JobStatus::Running],
            JobState::Done => &[JobStatus::Done],
            JobState::Skipped => &[JobStatus::Skipped],
            JobState::Failed => &[JobStatus::Failed],
            JobState::Interrupted => &[JobStatus::Interrupted],
            JobState::Cancelled => &[JobStatus::Cancelled],
        }
    }
}

/// Which jobs to list.
#[derive(Clone, Debug, Default)]
pub struct JobsQuery {
    pub state: Option<JobState>,
    /// Only this connection's.
    pub connection_id: Option<i64>,
    pub provider: Option<String>,
    pub user_id: Option<String>,
    /// Only jobs older than this job id (the `next` of the page before).
    pub before: Option<i64>,
    /// At most this many (1 to [`MAX_LIMIT`]).
    pub limit: u64,
}

/// A job, with the connection it is for.
#[derive(Clone, Debug, Serialize)]
pub struct JobView {
    pub id: i64,
    pub connection_id: i64,
    pub provider: String,
    pub user_id: String,
    /// The stream it runs; empty for every stream the provider syncs.
    pub stream: String,
    pub kind: JobKind,
    pub slot_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Not claimed before this time.
    pub not_before: Option<chrono::DateTime<chrono::Utc>>,
    pub priority: i32,
    /// Tries before this one (retries, re-queues after an instance stopped).
    pub attempt: i32,
    pub full: bool,
    pub status: JobStatus,
    pub holder: Option<String>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub started_at: Option<chrono::DateTime<chrono::Utc>>,
    pub finished_at: Option<chrono::DateTime<chrono::Utc>>,
    pub outcome: Option<String>,
    /// When someone asked to cancel it (a running job stops between pages).
    pub cancel_requested_at: Option<chrono::DateTime<chrono::Utc>>,
}

impl JobView {
    pub(super) fn of(job: sync_job::Model, owner: Option<(String, String)>) -> JobView {
        let (provider, user_id) = owner.unwrap_or_default();
        JobView {
            id: job.id,
            connection_id: job.connection_id,
            provider,
            user_id,
            stream: job.stream,
            kind: job.kind,
            slot_at: job.slot_at,
            not_before: job.not_before,
            priority: job.priority,
            attempt: job.attempt,
            full: job.full,
            status: job.status,
            holder: job.holder,
            created_at: job.created_at,
            started_at: job.started_at,
            finished_at: job.finished_at,
            outcome: job.outcome,
            cancel_requested_at: job.cancel_requested_at,
        }
    }
}

/// The newest jobs that match `query`.
pub async fn list(db: &DatabaseConnection, query: &JobsQuery) -> Result<Page<JobView>, OpsError> {
    let limit = check_limit(query.limit, MAX_LIMIT)?;
    let mut select = sync_job::Entity::find();
    if let Some(state) = query.state {
        select = select.filter(sync_job::Column::Status.is_in(state.statuses().iter().copied()));
        if state == JobState::Deferred {
            select = select.filter(sync_job::Column::NotBefore.gt(crate::db::now()));
        }
    }
    if let Some(connection_id) = query.connection_id {
        select = select.filter(sync_job::Column::ConnectionId.eq(connection_id));
    }
    if query.provider.is_some() || query.user_id.is_some() {
        let mut connections = sea_orm::sea_query::Query::select()
            .column(connection::Column::Id)
            .from(connection::Entity)
            .to_owned();
        if let Some(provider) = &query.provider {
            connections.and_where(connection::Column::Provider.eq(provider.as_str()));
        }
        if let Some(user_id) = &query.user_id {
            connections.and_where(connection::Column::UserId.eq(user_id.as_str()));
        }
        select = select.filter(sync_job::Column::ConnectionId.in_subquery(connections));
    }
    if let Some(before) = query.before {
        select = select.filter(sync_job::Column::Id.lt(before));
    }
    let rows = select
        .order_by_desc(sync_job::Column::Id)
        .limit(limit.saturating_add(1))
        .all(db)
        .await?;
    let page = Page::from_rows(rows, limit, |job| job.id);
    let owners = owners_of(db, page.items.iter().map(|job| job.connection_id).collect()).await?;
    Ok(Page {
        items: page
            .items
            .into_iter()
            .map(|job| {
                let owner = owners.get(&job.connection_id).cloned();
                JobView::of(job, owner)
            })
            .collect(),
        next: page.next,
    })
}

/// The provider and user of each of these connections.
async fn owners_of(
    db: &DatabaseConnection,
    mut ids: Vec<i64>,
) -> Result<HashMap<i64, (String, String)>, OpsError> {
    ids.sort_unstable();
    ids.dedup();
    Ok(connection::Entity::find()
        .select_only()
        .columns([
            connection::Column::Id,
            connection::Column::Provider,
            connection::Column::UserId,
        ])
        .filter(connection::Column::Id.is_in(ids))
        .into_tuple::<(i64, String, String)>()
        .all(db)
        .await?
        .into_iter()
        .map(|(id, provider, user_id)| (id, (provider, user_id)))
        .collect())
}

/// Job `id`.
pub(crate) async fn get(db: &DatabaseConnection, id: i64) -> Result<JobView, OpsError> {
    let job = sync_job::Entity::find_by_id(id)
        .one(db)
        .await?
        .ok_or_else(|| not_found(id))?;
    let owner = owners_of(db, vec![job.connection_id])
        .await?
        .remove(&job.connection_id);
    Ok(JobView::of(job, owner))
}

fn not_found(id: i64) -> OpsError {
    OpsError::NotFound {
        what: format!("job with id {id}"),
        hint: "; `tributary jobs` lists them",
    }
}

/// Cancels job `id`: a queued job at once (it never runs); a running job's instance is
/// asked through the database and stops its run between pages, keeping the pages it
/// committed, and the job ends `cancelled`, never retried. A job that ended already is a
/// conflict. Returns the job as it stands after the request.
pub(crate) async fn cancel(db: &DatabaseConnection, id: i64) -> Result<JobView, OpsError> {
    use crate::jobs::CancelOutcome;
    match crate::jobs::cancel(db, id, crate::db::now()).await? {
        CancelOutcome::Cancelled | CancelOutcome::Requested => get(db, id).await,
        CancelOutcome::Ended(status) => Err(OpsError::Conflict(format!(
            "job {id} has ended ({status}); only a queued or running job can be cancelled"
        ))),
        CancelOutcome::NotFound => Err(not_found(id)),
    }
}

/// When a connection next runs on its schedule.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct NextDue {
    pub provider: String,
    pub user_id: String,
    /// Its own schedule, or its provider's.
    pub schedule: String,
    pub own_schedule: bool,
    pub paused: bool,
    /// Its streams the operator paused: its slots run its other streams.
    pub paused_streams: Vec<String>,
    /// The next slot; `None` while paused or disabled.
    pub next_slot: Option<chrono::DateTime<chrono::Utc>>,
    /// Its jobs waiting in the queue.
    pub queued: u64,
}

/// Every enabled connection of a configured, enabled provider with its next slot and its
/// queued jobs, by provider and user.
pub(crate) async fn next_due(
    db: &DatabaseConnection,
    settings: &crate::config::Settings,
) -> Result<Vec<NextDue>, OpsError> {
    let now = crate::db::now();
    // One grouped count for every connection, not a query per connection.
    let queued_by_connection: HashMap<i64, u64> = sync_job::Entity::find()
        .select_only()
        .column(sync_job::Column::ConnectionId)
        .column_as(sync_job::Column::Id.count(), "queued")
        .filter(sync_job::Column::Status.eq(JobStatus::Queued))
        .group_by(sync_job::Column::ConnectionId)
        .into_tuple::<(i64, i64)>()
        .all(db)
        .await?
        .into_iter()
        .map(|(id, count)| (id, u64::try_from(count).unwrap_or(0)))
        .collect();
    let enabled = sea_orm::sea_query::Query::select()
        .column(connection::Column::Id)
        .from(connection::Entity)
        .and_where(connection::Column::Enabled.eq(true))
        .to_owned();
    let mut paused_streams = crate::pipeline::streams::paused_streams(db, enabled).await?;
    let connections = connection::Entity::find()
        .filter(connection::Column::Enabled.eq(true))
        .order_by_asc(connection::Column::Provider)
        .order_by_asc(connection::Column::UserId)
        .all(db)
        .await?;
    let mut due = Vec::with_capacity(connections.len());
    for row in connections {
        let Some(provider) = settings.providers.get(&row.provider) else {
            continue;
        };
        if !provider.enabled {
            continue;
        }
        let schedule = row
            .schedule
            .clone()
            .unwrap_or_else(|| provider.schedule.clone());
        let paused = row.paused_at.is_some();
        let next_slot = if paused {
            None
        } else {
            crate::config::parse_cron(&schedule)
                .ok()
                .and_then(|cron| cron.find_next_occurrence(&now, false).ok())
        };
        let queued = queued_by_connection.get(&row.id).copied().unwrap_or(0);
        due.push(NextDue {
            provider: row.provider,
            user_id: row.user_id,
            own_schedule: row.schedule.is_some(),
            schedule,
            paused,
            paused_streams: paused_streams.remove(&row.id).unwrap_or_default(),
            next_slot,
            queued,
        });
    }
    Ok(due)
}

/// How many jobs stand in each status, in the order of [`JobStatus`]: the queue's depth.
pub(crate) async fn depth(db: &DatabaseConnection) -> Result<Vec<(JobStatus, u64)>, OpsError> {
    use sea_orm::{Iterable, PaginatorTrait};
    let mut counts = Vec::new();
    for status in JobStatus::iter() {
        let count = sync_job::Entity::find()
            .filter(sync_job::Column::Status.eq(status))
            .count(db)
            .await?;
        counts.push((status, count));
    }
    Ok(counts)
}
