//! Syncing now: one run of each enabled connection a filter matches, on the spot or
//! queued for any instance's worker. Either way each connection's run is a `manual` job
//! in `sync_jobs`.

use serde::Serialize;

use super::OpsError;
use crate::config::Settings;
use crate::db::DatabasePools;
use crate::entities::sync_job::JobKind;
use crate::jobs::NewJob;
use crate::lease::Holder;
use crate::pipeline::{ProgressSink, RunOptions};

pub use crate::sync::{SyncFilter, SyncReport};

/// Syncs every enabled connection that matches `filter` once, here and now, with
/// `options`; a connection whose run is going elsewhere is reported skipped. Each
/// connection's run is recorded as a manual job this process holds.
pub async fn now(
    db: &DatabasePools,
    settings: &Settings,
    filter: &SyncFilter,
    options: &RunOptions,
    progress: &dyn ProgressSink,
) -> Result<SyncReport, OpsError> {
    let matching = crate::sync::matching_connections(db, settings, filter).await?;
    let holder = Holder::current();
    let mut jobs = Vec::with_capacity(matching.len());
    for (connection, _) in matching {
        let job = manual_job(&connection, filter, options.full, crate::db::now());
        let id = crate::jobs::insert_claimed(db, &job, holder.as_str()).await?;
        jobs.push((connection, id));
    }
    let report = crate::sync::sync_matching(db, settings, filter, options, progress).await?;
    crate::jobs::finish_on_the_spot(db, holder.as_str(), &jobs, &report).await?;
    Ok(report)
}

/// A job queued by [`queue`].
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Queued {
    pub job_id: i64,
    pub user_id: String,
    pub provider: String,
    /// Empty: every stream the provider syncs.
    pub stream: String,
}

/// Queues a manual job for every enabled connection that matches `filter`, for the
/// first free instance's worker (a running daemon); they start before scheduled jobs.
pub(crate) async fn queue(
    db: &DatabasePools,
    settings: &Settings,
    filter: &SyncFilter,
    full: bool,
) -> Result<Vec<Queued>, OpsError> {
    let matching = crate::sync::matching_connections(db, settings, filter).await?;
    let mut queued = Vec::with_capacity(matching.len());
    for (connection, _) in matching {
        let job = manual_job(&connection, filter, full, crate::db::now());
        let job_id = crate::jobs::insert_queued(db, &job).await?;
        queued.push(Queued {
            job_id,
            user_id: connection.user_id,
            provider: connection.provider,
            stream: job.stream,
        });
    }
    Ok(queued)
}

/// Queues a manual job for connection `id` (one `stream`, or every stream the provider
/// syncs), for the first free instance; it starts before scheduled jobs.
pub(crate) async fn queue_connection(
    db: &DatabasePools,
    settings: &Settings,
    id: i64,
    stream: Option<&str>,
    full: bool,
) -> Result<Queued, OpsError> {
    use crate::entities::connection;
    use sea_orm::EntityTrait;
    let row = connection::Entity::find_by_id(id)
        .one(db.main())
        .await?
        .ok_or_else(|| OpsError::NotFound {
            what: format!("connection with id {id}"),
            hint: "; `tributary connections list` lists them",
        })?;
    let provider = settings
        .providers
        .get(&row.provider)
        .filter(|provider| provider.enabled)
        .ok_or_else(|| {
            OpsError::Conflict(format!(
                "provider {:?} is not configured or is disabled; its connections do not sync",
                row.provider
            ))
        })?;
    if !row.enabled {
        return Err(OpsError::Conflict(format!(
            "connection {id} is disabled; enable it first"
        )));
    }
    if let Some(name) = stream {
        if provider.stream(name).is_none() {
            let known: Vec<&str> = provider.streams.iter().map(|s| s.name.as_str()).collect();
            return Err(OpsError::Invalid {
                field: "stream",
                message: format!(
                    "provider {:?} syncs no stream named {:?}; it syncs {}",
                    row.provider,
                    tributary_providers::quote::truncated(name, 64),
                    known.join(", ")
                ),
            });
        }
    }
    let filter = SyncFilter {
        provider: Some(row.provider.clone()),
        user_id: Some(row.user_id.clone()),
        stream: stream.map(str::to_string),
    };
    let job = manual_job(&row, &filter, full, crate::db::now());
    let job_id = crate::jobs::insert_queued(db, &job).await?;
    Ok(Queued {
        job_id,
        user_id: row.user_id,
        provider: row.provider,
        stream: job.stream,
    })
}

fn manual_job(
    connection: &crate::entities::connection::Model,
    filter: &SyncFilter,
    full: bool,
    now: chrono::DateTime<chrono::Utc>,
) -> NewJob {
    NewJob {
        connection_id: connection.id,
        provider: connection.provider.clone(),
        stream: filter.stream.clone().unwrap_or_default(),
        kind: JobKind::Manual,
        slot_at: None,
        not_before: now,
        attempt: 0,
        full,
    }
}
