//! Where a Stripe page starts: the positions the adapter hands the pipeline, and the
//! request a position stands for given the stream and its cursor ([`plan`]).
//!
//! Positions are cursors of the form `KIND:ID`, so that a checkpoint says which walk it
//! belongs to and the adapter can refuse one that fits no walk:
//! - `list:ID`: the stream's list, after the object `ID` (`starting_after`). A bare id
//!   (`ch_123`) is read the same way: the adapter wrote those before it served streams.
//! - `events-back:ID`: walking back through the events, older than the event `ID`, to find
//!   the oldest one.
//! - `events-forward:ID`: applying the events newer than the event `ID`, oldest first.

use chrono::{DateTime, Utc};

use super::events::{self, EventsPage, Step};
use super::list::{ListPage, ListWatermark};
use super::streams::{Changes, Stream};
use crate::adapter;
use crate::quote::quote_cursor;
use crate::{FetchError, PagePosition, Watermark};

const LIST: &str = "list";
const EVENTS_BACK: &str = "events-back";
const EVENTS_FORWARD: &str = "events-forward";

/// A position the adapter handed out, read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum StripePosition {
    /// The stream's list, after the object `after`.
    List {
        /// The last object of the page before.
        after: String,
    },
    /// A place in the events walk.
    Events(WalkPosition),
}

/// A place in the events walk after its first page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum WalkPosition {
    /// Looking for the oldest event: the events older than `after` (`starting_after`).
    Back {
        /// The oldest event of the page before.
        after: String,
    },
    /// Applying events: the ones newer than `before` (`ending_before`).
    Forward {
        /// The newest event applied so far.
        before: String,
    },
}

impl StripePosition {
    /// Reads a position the adapter handed out; any other is a clear error.
    pub fn parse(position: &PagePosition) -> Result<StripePosition, FetchError> {
        let PagePosition::Cursor { cursor } = position else {
            return Err(adapter::position_mismatch(
                "stripe",
                position,
                "cursor (`list:ID`, `events-back:ID` or `events-forward:ID`)",
            ));
        };
        // Without a kind, the bare id of a checkpoint written before streams.
        let (kind, id) = cursor.split_once(':').unwrap_or((LIST, cursor));
        if !StripePosition::can_hold(id) {
            return Err(malformed(cursor, "its id is empty or not visible ASCII"));
        }
        let id = id.to_string();
        match kind {
            LIST => Ok(StripePosition::List { after: id }),
            EVENTS_BACK => Ok(StripePosition::Events(WalkPosition::Back { after: id })),
            EVENTS_FORWARD => Ok(StripePosition::Events(WalkPosition::Forward { before: id })),
            _ => Err(malformed(cursor, "it names no walk the adapter knows")),
        }
    }

    /// The position as the pipeline keeps it.
    pub fn into_page_position(self) -> PagePosition {
        let cursor = match self {
            StripePosition::List { after } => format!("{LIST}:{after}"),
            StripePosition::Events(WalkPosition::Back { after }) => {
                format!("{EVENTS_BACK}:{after}")
            }
            StripePosition::Events(WalkPosition::Forward { before }) => {
                format!("{EVENTS_FORWARD}:{before}")
            }
        };
        PagePosition::Cursor { cursor }
    }

    /// Whether `id` can stand in a position: non-empty visible ASCII, as Stripe's ids
    /// (`ch_3MmlLrLkdIwHu7ix0snN0B15`) are.
    pub fn can_hold(id: &str) -> bool {
        !id.is_empty() && id.bytes().all(|byte| byte.is_ascii_graphic())
    }
}

fn malformed(cursor: &str, why: &str) -> FetchError {
    FetchError::PositionMismatch {
        message: format!(
            "cannot fetch the Stripe page at cursor {}: {why}; a Stripe position is \
             `list:ID`, `events-back:ID` or `events-forward:ID`",
            quote_cursor(cursor)
        ),
    }
}

/// What one page request is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Plan {
    /// A page of the stream's own list.
    List(ListPage),
    /// A page of the events walk.
    Events(EventsPage),
}

/// The request for the page of `stream` at `position`, given the stream's cursor `since`
/// and the time of the request `now`.
pub(super) fn plan(
    stream: &'static Stream,
    since: Option<&Watermark>,
    position: Option<StripePosition>,
    now: DateTime<Utc>,
) -> Result<Plan, FetchError> {
    let walk = match position {
        // A list goes on as it began, whatever the cursor says by now.
        Some(StripePosition::List { after }) => return Ok(list(stream, since, Some(after), now)),
        Some(StripePosition::Events(walk)) => Some(walk),
        None => None,
    };
    let Changes::Events(kinds) = &stream.changes else {
        return match walk {
            None => Ok(list(stream, since, None, now)),
            Some(walk) => Err(walk_refused(
                walk,
                &format!("the {} stream does not walk Stripe's events", stream.name),
            )),
        };
    };
    let Some(since) = since else {
        return match walk {
            None => Ok(list(stream, None, None, now)),
            Some(walk) => Err(walk_refused(
                walk,
                "an events walk starts from the stream's cursor, and this run has none",
            )),
        };
    };
    // A walk resumed after its cursor has aged out of Stripe's retention would miss the
    // events that expired meanwhile: it becomes a full pass too.
    if !events::cursor_is_fresh(stream.name, since, now) {
        return Ok(list(stream, None, None, now));
    }
    let since = adapter::watermark_epoch(since);
    let step = match walk {
        None => Step::First {
            floor: events::first_page_floor(since, now),
        },
        Some(walk) => Step::Walk(walk),
    };
    Ok(Plan::Events(EventsPage {
        object: stream.object,
        kinds,
        since,
        step,
    }))
}

/// A page of the stream's list: by `created[gte]` for a stream without events, else a full
/// pass whose first page says when it began (the events after that are what the next run
/// reads).
fn list(
    stream: &Stream,
    since: Option<&Watermark>,
    after: Option<String>,
    now: DateTime<Utc>,
) -> Plan {
    let (created_gte, watermark) = match stream.changes {
        Changes::Created => (
            since.map(adapter::watermark_epoch),
            ListWatermark::NewestCreated,
        ),
        Changes::PerInvoice => (None, ListWatermark::Without),
        Changes::Events(_) if after.is_none() => (None, ListWatermark::At(now.timestamp())),
        Changes::Events(_) => (None, ListWatermark::Without),
    };
    Plan::List(ListPage {
        after,
        created_gte,
        watermark,
    })
}

fn walk_refused(walk: WalkPosition, why: &str) -> FetchError {
    let position = StripePosition::Events(walk).into_page_position();
    FetchError::PositionMismatch {
        message: format!(
            "cannot fetch the Stripe page at {}: {why} (was the checkpoint written for \
             another stream?)",
            position.describe()
        ),
    }
}
