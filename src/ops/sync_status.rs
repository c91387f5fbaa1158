//! Where a connection's syncs stand, stream by stream: the run going now and the job it
//! belongs to, the jobs waiting, the last run and how it ended, the next slot of the
//! schedule that applies (the stream's own, the connection's or the provider's), the
//! cursor, and a health summed up from the recent runs.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QueryOrder, QuerySelect};
use serde::Serialize;

use super::health::{finished, health_of, recent_runs, worst, Health};
use super::jobs::JobView;
use super::stream_states::stream_states;
use super::OpsError;
use crate::config::Settings;
use crate::db::DatabasePools;
use crate::entities::sync_job::{self, JobStatus};
use crate::entities::sync_run::{self, RunStatus, Trigger};
use crate::entities::{connection, stream_schedule};

/// The most jobs a status lists (queued and running, newest first); `jobs_next` pages on
/// through `tributary jobs` or `GET /v1/jobs`.
const MAX_JOBS: u64 = 100;
/// The most running jobs a connection's streams are matched with (a run holds its
/// stream's lease, so there are at most as many as it has streams).
const MAX_RUNNING: u64 = 1_000;

impl std::fmt::Display for ScheduleFrom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ScheduleFrom::Stream => "stream",
            ScheduleFrom::Connection => "connection",
            ScheduleFrom::Provider => "provider",
        })
    }
}

/// Which schedule a stream follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ScheduleFrom {
    /// The stream's own (`connections schedule --stream`).
    Stream,
    /// The connection's own.
    Connection,
    /// Its provider's `schedule` in config.toml.
    Provider,
}

/// A run, briefly.
#[derive(Clone, Debug, Serialize)]
pub struct RunBrief {
    pub id: i64,
    pub trigger: Trigger,
    pub status: RunStatus,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// Refreshed with every page the run commits.
    pub heartbeat_at: DateTime<Utc>,
    pub pages_fetched: i64,
    pub records_fetched: i64,
    pub records_failed: i64,
    pub error: Option<String>,
}

impl From<sync_run::Model> for RunBrief {
    fn from(run: sync_run::Model) -> RunBrief {
        RunBrief {
            id: run.id,
            trigger: run.trigger,
            status: run.status,
            started_at: run.started_at,
            finished_at: run.finished_at,
            heartbeat_at: run.heartbeat_at,
            pages_fetched: run.pages_fetched,
            records_fetched: run.records_fetched,
            records_failed: run.records_failed,
            error: run.error,
        }
    }
}

/// One stream of the connection.
#[derive(Clone, Debug, Serialize)]
pub struct StreamStatus {
    /// `None` for a connection whose provider config.toml no longer has.
    pub stream: Option<String>,
    pub health: Health,
    /// The run going now, if one is.
    pub running: Option<RunBrief>,
    /// The running job that covers this stream, if one does.
    pub running_job_id: Option<i64>,
    /// The latest run that ended.
    pub last_run: Option<RunBrief>,
    /// Failed runs since the last one that did not fail (counted over the latest 20).
    pub failures_in_a_row: u32,
    pub last_success_run_id: Option<i64>,
    pub last_success_at: Option<DateTime<Utc>>,
    /// The schedule that applies; `None` when the provider is not configured.
    pub schedule: Option<String>,
    pub schedule_from: ScheduleFrom,
    /// Its schedule's next slot; `None` while it or the connection is paused, the
    /// connection disabled, or its provider disabled or gone.
    pub next_slot: Option<DateTime<Utc>>,
    /// Since when the operator has paused the stream.
    pub paused_at: Option<DateTime<Utc>>,
    /// Where the next incremental run starts.
    pub cursor: Option<String>,
    /// Whether a run stopped midway and the next one goes on from its checkpoint.
    pub unfinished_run: bool,
    /// Full passes the provider's `full_sync_schedule` still owes it.
    pub full_passes_owed: i64,
}

/// A connection's syncs.
#[derive(Clone, Debug, Serialize)]
pub struct SyncStatus {
    pub connection_id: i64,
    pub provider: String,
    pub user_id: String,
    pub enabled: bool,
    pub paused_at: Option<DateTime<Utc>>,
    /// Since when the provider has refused its authorization; scheduled runs skip it.
    pub needs_reconnect_since: Option<DateTime<Utc>>,
    /// The worst of its streams'.
    pub health: Health,
    /// The first page of its running and queued jobs, newest first (at most 100).
    pub jobs: Vec<JobView>,
    /// The id the next page of its running and queued jobs starts before; `None` when
    /// `jobs` holds them all.
    pub jobs_next: Option<i64>,
    pub streams: Vec<StreamStatus>,
}

/// Connection `id`'s syncs as they stand.
pub async fn status(
    db: &DatabasePools,
    settings: &Settings,
    id: i64,
) -> Result<SyncStatus, OpsError> {
    let main = db.main();
    let row = connection::Entity::find_by_id(id)
        .one(main)
        .await?
        .ok_or_else(|| OpsError::NotFound {
            what: format!("connection with id {id}"),
            hint: "; `tributary connections list` lists them",
        })?;
    let states = crate::pipeline::streams::states_of(main, vec![id]).await?;
    let owed: HashMap<String, i64> = states
        .iter()
        .map(|state| (state.stream.clone(), state.full_passes_owed))
        .collect();
    let own_schedules: HashMap<String, String> = stream_schedule::Entity::find()
        .filter(stream_schedule::Column::ConnectionId.eq(id))
        .all(main)
        .await?
        .into_iter()
        .map(|own| (own.stream, own.schedule))
        .collect();
    let jobs = super::jobs::list(
        main,
        &super::jobs::JobsQuery {
            state: Some(super::jobs::JobState::Active),
            connection_id: Some(id),
            limit: MAX_JOBS,
            ..Default::default()
        },
    )
    .await?;
    let running_jobs = running_jobs(main, id).await?;
    let provider = settings
        .providers
        .get(&row.provider)
        .filter(|provider| provider.enabled);
    // Whole seconds: the next slot then reads the same whenever it is asked for.
    let now = chrono::SubsecRound::trunc_subsecs(crate::db::now(), 0);
    let mut streams = Vec::new();
    for state in stream_states(settings, &row, states) {
        let (schedule, schedule_from) =
            match state.name.as_ref().and_then(|name| own_schedules.get(name)) {
                Some(own) => (Some(own.clone()), ScheduleFrom::Stream),
                None => match (&row.schedule, provider) {
                    (Some(own), _) => (Some(own.clone()), ScheduleFrom::Connection),
                    (None, Some(provider)) => {
                        (Some(provider.schedule.clone()), ScheduleFrom::Provider)
                    }
                    (None, None) => (None, ScheduleFrom::Provider),
                },
            };
        let sleeping = !row.enabled
            || row.paused_at.is_some()
            || state.paused_at.is_some()
            || provider.is_none();
        let next_slot = schedule
            .as_deref()
            .filter(|_| !sleeping)
            .and_then(|schedule| crate::config::parse_cron(schedule).ok())
            .and_then(|cron| cron.find_next_occurrence(&now, false).ok());
        let recent = recent_runs(main, &row, state.name.as_deref()).await?;
        let running = recent
            .iter()
            .find(|run| run.status == RunStatus::Running)
            .cloned();
        let failures_in_a_row = finished(&recent)
            .take_while(|run| run.status == RunStatus::Failed)
            .count();
        let last_run = finished(&recent).next().cloned();
        let running_job_id = running.as_ref().and_then(|_| {
            running_jobs
                .iter()
                .find(|job| job.stream.is_empty() || Some(&job.stream) == state.name.as_ref())
                .map(|job| job.id)
        });
        streams.push(StreamStatus {
            health: health_of(last_run.as_ref()),
            full_passes_owed: state
                .name
                .as_ref()
                .and_then(|name| owed.get(name))
                .copied()
                .unwrap_or(0),
            stream: state.name,
            running: running.map(RunBrief::from),
            running_job_id,
            last_run: last_run.map(RunBrief::from),
            failures_in_a_row: u32::try_from(failures_in_a_row).unwrap_or(u32::MAX),
            last_success_run_id: state.last_success_run_id,
            last_success_at: state.last_success_at,
            schedule,
            schedule_from,
            next_slot,
            paused_at: state.paused_at,
            cursor: state.cursor,
            unfinished_run: state.checkpoint.is_some(),
        });
    }
    let health = worst(streams.iter().map(|stream| stream.health));
    Ok(SyncStatus {
        connection_id: row.id,
        health,
        jobs: jobs.items,
        jobs_next: jobs.next,
        provider: row.provider,
        user_id: row.user_id,
        enabled: row.enabled,
        paused_at: row.paused_at,
        needs_reconnect_since: row.needs_reconnect_since,
        streams,
    })
}

/// [`status`] of connection `target`.
pub async fn status_of(
    db: &DatabasePools,
    settings: &Settings,
    target: &super::connections::Target,
) -> Result<SyncStatus, OpsError> {
    let id = super::connections::id_of(db.main(), target).await?;
    status(db, settings, id).await
}

/// The connection's running jobs, oldest first.
async fn running_jobs(
    db: &DatabaseConnection,
    connection_id: i64,
) -> Result<Vec<sync_job::Model>, OpsError> {
    Ok(sync_job::Entity::find()
        .filter(sync_job::Column::ConnectionId.eq(connection_id))
        .filter(sync_job::Column::Status.eq(JobStatus::Running))
        .order_by_asc(sync_job::Column::Id)
        .limit(MAX_RUNNING)
        .all(db)
        .await?)
}
