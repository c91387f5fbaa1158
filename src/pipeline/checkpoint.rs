//! A stream's sync state: the in-progress checkpoint of an unfinished run, and the
//! incremental watermark (`connection_streams.cursor`) of the last complete one.

use chrono::Utc;
use sea_orm::DbErr;
use serde::{Deserialize, Serialize};
use tributary_providers::{PagePosition, Watermark};

use crate::entities::connection_stream;

/// Where an unfinished run stopped: committed with every page, cleared when a run walks
/// the listing to its end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The first page not yet committed; for a child stream, of `parent`'s listing, and
    /// `None` once that listing committed to its end (the walk goes on after it).
    pub position: Option<PagePosition>,
    /// A child stream's parent reached: the external id of the parent record whose
    /// listing the walk was in. Parents are walked in external id order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// When the walk began. The cursor never passes this instant, since a record read
    /// early may have changed before the walk reached a later, newer one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub walk_started: Option<chrono::DateTime<Utc>>,
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

/// What a page does to its stream's checkpoint.
#[derive(Clone, Copy, Debug)]
pub enum CheckpointMove<'a> {
    /// Leave it as it is (a replay, or a page the listing cannot go on from).
    Keep,
    /// Write it: the page after this one, or `None` (NULL) after the last page.
    Write(Option<&'a Checkpoint>),
}

/// The `connection_streams.checkpoint` value: the next page's position as JSON, or `NULL` after
/// the last page.
pub(crate) fn checkpoint_column(checkpoint: Option<&Checkpoint>) -> Result<Option<String>, DbErr> {
    checkpoint
        .map(|checkpoint| {
            checkpoint
                .to_column()
                .map_err(|error| DbErr::Custom(format!("serialising the checkpoint: {error}")))
        })
        .transpose()
}

/// The stream's incremental watermark, if it has one, it is readable and it is not
/// in the future (a cursor stored before cursors were clamped to the fetch time would
/// otherwise ask for changes after it forever and find none).
pub fn stored_cursor(state: &connection_stream::Model) -> Option<Watermark> {
    let text = state.cursor.as_deref()?;
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
    state: &connection_stream::Model,
    since: Option<&Watermark>,
) -> Option<Checkpoint> {
    let text = state.checkpoint.as_deref()?;
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
