//! Syncing now: one run of each enabled connection a filter matches.

use super::OpsError;
use crate::config::Settings;
use crate::db::DatabasePools;
use crate::pipeline::{ProgressSink, RunOptions};

pub use crate::sync::{SyncFilter, SyncReport};

/// Syncs every enabled connection that matches `filter` once, with `options`; a connection
/// whose run is going elsewhere is reported skipped.
pub async fn now(
    db: &DatabasePools,
    settings: &Settings,
    filter: &SyncFilter,
    options: &RunOptions,
    progress: &dyn ProgressSink,
) -> Result<SyncReport, OpsError> {
    Ok(crate::sync::sync_matching(db, settings, filter, options, progress).await?)
}
