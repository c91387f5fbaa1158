//! Replaying a run's failed records from their stored payloads.

use super::OpsError;
use crate::config::Settings;
use crate::db::DatabasePools;
use crate::pipeline::replay::ReplayError;

pub(crate) use crate::pipeline::replay::ReplayReport;

/// Replays the open record-level errors of run `run_id` as a new run.
pub async fn replay(
    db: &DatabasePools,
    settings: &Settings,
    run_id: i64,
) -> Result<ReplayReport, OpsError> {
    crate::pipeline::replay::replay_run(db, settings, run_id)
        .await
        .map_err(|error| match error {
            ReplayError::NoSuchRun(id) => OpsError::NotFound {
                what: format!("run with id {id}"),
                hint: "; `tributary runs` lists them",
            },
            ReplayError::Busy { .. } => OpsError::Conflict(error.to_string()),
            ReplayError::Database(error) => OpsError::Database(error),
            other => OpsError::Replay(other),
        })
}
