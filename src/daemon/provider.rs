//! What a provider's firings and its jobs' runs share.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tributary_providers::Provider;

use super::endpoints::RunPanics;
use crate::config::ProviderSettings;
use crate::db::DatabasePools;
use crate::sync::LeaseSettings;

/// Everything one firing needs, shared by all firings of one provider.
pub(super) struct ProviderJob {
    pub db: DatabasePools,
    pub settings: ProviderSettings,
    pub provider: Box<dyn Provider>,
    pub lease: LeaseSettings,
    pub cancel: CancellationToken,
    pub panics: Arc<RunPanics>,
    /// `full_sync_schedule`: which firings are full passes.
    pub full_sync: Option<FullPasses>,
    /// `schedule`: a firing's slot is its latest time at or before the firing.
    pub schedule: croner::Cron,
    /// Wakes this instance's worker when jobs were queued.
    pub wake: Arc<tokio::sync::Notify>,
}

/// When `full_sync_schedule` next asks for a full pass: the first firing at or after each
/// of its times is one, so the two schedules need not share a second.
pub(super) struct FullPasses {
    cron: croner::Cron,
    next_due: std::sync::Mutex<Option<chrono::DateTime<chrono::Utc>>>,
}

impl FullPasses {
    pub(super) fn new(cron: croner::Cron, from: chrono::DateTime<chrono::Utc>) -> FullPasses {
        let next_due = cron.find_next_occurrence(&from, false).ok();
        FullPasses {
            cron,
            next_due: std::sync::Mutex::new(next_due),
        }
    }

    /// Whether a firing at `now` is a full pass; if so, the next one is due at the
    /// schedule's next time after `now`.
    pub(super) fn take_due(&self, now: chrono::DateTime<chrono::Utc>) -> bool {
        let mut next_due = self
            .next_due
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match *next_due {
            Some(due) if now >= due => {
                *next_due = self.cron.find_next_occurrence(&now, false).ok();
                true
            }
            _ => false,
        }
    }
}
