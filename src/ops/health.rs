//! How a connection's syncs are going, summed up from its streams' latest finished runs:
//! one definition for its sync status and for filtering lists by health.

use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QueryOrder, QuerySelect};
use serde::{Deserialize, Serialize};

use super::stream_states::stream_states;
use super::OpsError;
use crate::config::Settings;
use crate::entities::sync_run::{self, RunStatus};
use crate::entities::{connection, connection_stream};

/// The runs of a stream read to find its last run and its failures in a row.
const RECENT_RUNS: u64 = 20;

/// How a stream's (or a connection's) syncs are going, from its latest finished run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Health {
    /// The last run stored every record it fetched (or stopped early for a reason that
    /// is no fault: a shutdown, a spent budget, its turn given up).
    Healthy,
    /// No run has finished yet.
    NeverSynced,
    /// The last run fetched every page but some records failed (`errors` lists them).
    Degraded,
    /// The last run failed.
    Failing,
}

impl Health {
    /// Every health, best first.
    pub const ALL: [Health; 4] = [
        Health::Healthy,
        Health::NeverSynced,
        Health::Degraded,
        Health::Failing,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Health::Healthy => "healthy",
            Health::NeverSynced => "never_synced",
            Health::Degraded => "degraded",
            Health::Failing => "failing",
        }
    }

    /// The health named `text` as status shows it; anything else is
    /// [`OpsError::Invalid`] naming `field` and listing the names.
    pub fn parse(field: &'static str, text: &str) -> Result<Health, OpsError> {
        Health::ALL
            .into_iter()
            .find(|health| health.as_str() == text)
            .ok_or_else(|| OpsError::Invalid {
                field,
                message: format!(
                    "must be one of {}, not {:?}",
                    Health::ALL.map(Health::as_str).join(", "),
                    tributary_providers::quote::truncated(text, 64)
                ),
            })
    }
}

impl std::fmt::Display for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The health of connection `row`, whose stream states are `states`, as [`status`] sums
/// it up: the worst of its streams', or with `only` that stream's alone.
pub(crate) async fn health(
    db: &DatabaseConnection,
    settings: &Settings,
    row: &connection::Model,
    states: Vec<connection_stream::Model>,
    only: Option<&str>,
) -> Result<Health, OpsError> {
    let mut healths = Vec::new();
    for state in stream_states(settings, row, states) {
        if only.is_some_and(|only| state.name.as_deref() != Some(only)) {
            continue;
        }
        let recent = recent_runs(db, row, state.name.as_deref()).await?;
        healths.push(health_of(finished(&recent).next()));
    }
    Ok(worst(healths))
}

/// The finished runs among `recent`, newest first.
pub(super) fn finished(recent: &[sync_run::Model]) -> impl Iterator<Item = &sync_run::Model> {
    recent.iter().filter(|run| run.status != RunStatus::Running)
}

/// A connection's health from its streams': the worst, or never synced without streams.
pub(super) fn worst(healths: impl IntoIterator<Item = Health>) -> Health {
    healths.into_iter().max().unwrap_or(Health::NeverSynced)
}

/// A stream's health from its latest finished run.
pub(super) fn health_of(last: Option<&sync_run::Model>) -> Health {
    match last {
        None => Health::NeverSynced,
        Some(run) if run.status == RunStatus::Failed => Health::Failing,
        Some(run) if run.records_failed > 0 => Health::Degraded,
        Some(_) => Health::Healthy,
    }
}

/// The stream's latest runs, newest first.
pub(super) async fn recent_runs(
    db: &DatabaseConnection,
    row: &connection::Model,
    stream: Option<&str>,
) -> Result<Vec<sync_run::Model>, OpsError> {
    let mut select = sync_run::Entity::find()
        .filter(sync_run::Column::UserId.eq(row.user_id.as_str()))
        .filter(sync_run::Column::Provider.eq(row.provider.as_str()));
    select = match stream {
        Some(stream) => select.filter(sync_run::Column::Stream.eq(stream)),
        None => select.filter(sync_run::Column::Stream.is_null()),
    };
    Ok(select
        .order_by_desc(sync_run::Column::Id)
        .limit(RECENT_RUNS)
        .all(db)
        .await?)
}
