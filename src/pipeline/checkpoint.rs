//! The connection's sync state: the in-progress checkpoint of an unfinished run, and the
//! incremental watermark (`connections.cursor`) of the last complete one.

use chrono::Utc;
use serde::{Deserialize, Serialize};
use tributary_providers::{PagePosition, Watermark};

use crate::entities::connection;

/// Where an unfinished run stopped: committed with every page, cleared when a run walks
/// the listing to its end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The first page not yet committed.
    pub position: PagePosition,
    /// The watermark the run asked from (`None` for a full pass): a resumed run must ask
    /// from the same one, or the positions would not mean the same pages.
    pub since: Option<Watermark>,
    /// The newest watermark among the pages committed so far.
    pub watermark: Option<Watermark>,
}

impl Checkpoint {
    /// The column's JSON text.
    pub fn to_column(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string(self)
    }
}

/// The connection's incremental watermark, if it has one, it is readable and it is not
/// in the future (a cursor stored before cursors were clamped to the fetch time would
/// otherwise ask for changes after it forever and find none).
pub fn stored_cursor(connection: &connection::Model) -> Option<Watermark> {
    let text = connection.cursor.as_deref()?;
    match serde_json::from_str::<Watermark>(text) {
        Ok(watermark) if watermark.is_beyond_skew(Utc::now()) => {
            tracing::warn!(
                cursor = text,
                "The stored cursor lies in the future; this run is a full pass."
            );
            None
        }
        Ok(watermark) => Some(watermark),
        Err(error) => {
            tracing::warn!(%error, "The stored cursor is unreadable; this run is a full pass.");
            None
        }
    }
}

/// The checkpoint to resume from: only one taken with the same `since`, so a `--full`
/// pass never continues an incremental listing or the other way round.
pub fn resumable_checkpoint(
    connection: &connection::Model,
    since: Option<&Watermark>,
) -> Option<Checkpoint> {
    let text = connection.checkpoint.as_deref()?;
    match serde_json::from_str::<Checkpoint>(text) {
        Ok(checkpoint) if checkpoint.since.as_ref() == since => Some(checkpoint),
        Ok(_) => {
            tracing::info!("The unfinished run's checkpoint was for another pass; starting from the first page.");
            None
        }
        Err(error) => {
            tracing::warn!(%error, "The stored checkpoint is unreadable; starting from the first page.");
            None
        }
    }
}

/// The larger of two optional watermarks.
pub fn newest(a: Option<Watermark>, b: Option<Watermark>) -> Option<Watermark> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}
