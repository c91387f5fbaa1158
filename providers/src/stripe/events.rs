//! Incremental runs by Stripe's Events API (`GET /v1/events`).
//!
//! A run reads the events of its stream's objects (`type=PREFIX.*`) created at or after
//! its cursor (`created[gte]`), and each event's `data.object`, the object as it was then,
//! becomes the record. Stripe lists events newest first, but they must be applied oldest
//! first, so that an older snapshot never overwrites a newer one; and a page is all the
//! memory a run may hold. So the walk goes in two phases:
//! 1. Back: from the newest event, pages are asked for with `starting_after` until
//!    `has_more` is false. These pages hand on only the id to go on from, and hold no
//!    records.
//! 2. Forward: the last page of phase 1 holds the oldest events; they are applied, each
//!    page reversed to oldest first, and the walk goes on towards the newest with
//!    `ending_before` = the newest event applied, until `has_more` is false.
//!
//! The pipeline keeps the last copy of a key within a page, so each object's newest
//! version in a page is the one stored; the pages go from older to newer, so across pages
//! too.

use chrono::{DateTime, TimeDelta, Utc};
use serde_json::value::RawValue;
use serde_json::Value;
use url::Url;

use super::list::{self, StripeList};
use super::position::{StripePosition, WalkPosition};
use super::streams::EventKinds;
use crate::adapter;
use crate::http::Answered;
use crate::quote::{quote_cursor, truncated, MAX_QUOTED_CHARS};
use crate::raw::{json_kind, lookup_raw, to_value, RawObject};
use crate::{
    DeletedRecord, FetchError, IdSpec, Page, PageItem, RecordStage, RejectedRecord, Watermark,
};

/// How long Stripe keeps events listable: "List events, going back up to 30 days".
const EVENT_RETENTION: TimeDelta = TimeDelta::days(30);

/// How much younger than [`EVENT_RETENTION`] a cursor must be to be walked from: a walk
/// takes time, may be resumed later after a crash, and clocks differ.
const RETENTION_MARGIN: TimeDelta = TimeDelta::days(2);

/// How far before the request the first page's watermark may lie: Stripe may list an event
/// a little after the second it was created in, so the next run reads this much again.
const EVENT_LAG_MARGIN: TimeDelta = TimeDelta::minutes(5);

/// One page of the events walk to ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct EventsPage {
    /// The `object` of the stream's records: events holding another kind are skipped.
    pub object: &'static str,
    /// The stream's events.
    pub kinds: &'static EventKinds,
    /// The stream's cursor, in epoch seconds (`created[gte]`).
    pub since: i64,
    /// Where in the walk the page is.
    pub step: Step,
}

/// Where in the walk a page is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// The newest events. The page's watermark is at least `floor`.
    First {
        /// See [`first_page_floor`].
        floor: i64,
    },
    /// After the first page.
    Walk(WalkPosition),
}

/// Whether the cursor `since` is young enough for Stripe to still hold every event since;
/// when it is not, says so in the log, since the run becomes a full pass of the stream.
pub(super) fn cursor_is_fresh(stream: &str, since: &Watermark, now: DateTime<Utc>) -> bool {
    let Some(since) = adapter::watermark_time(since) else {
        tracing::warn!(
            stream,
            cursor = ?since,
            "The stream's cursor is no time Stripe's events can be asked from; the stream is \
             listed in full instead."
        );
        return false;
    };
    let age = now.signed_duration_since(since);
    let fresh = age
        .checked_add(&RETENTION_MARGIN)
        .is_some_and(|age| age < EVENT_RETENTION);
    if !fresh {
        tracing::warn!(
            stream,
            cursor_age_days = age.num_days(),
            retention_days = EVENT_RETENTION.num_days(),
            "The stream's cursor is older than the events Stripe keeps; the stream is listed \
             in full instead."
        );
    }
    fresh
}

/// The least watermark of the walk's first page: the request time less
/// [`EVENT_LAG_MARGIN`], never below the cursor. With `created[gte]` a quiet account's
/// newest event is read again by every run; were it the watermark, the cursor would stay
/// there and age out of Stripe's retention.
pub(super) fn first_page_floor(since: i64, now: DateTime<Utc>) -> i64 {
    now.checked_sub_signed(EVENT_LAG_MARGIN)
        .map_or(since, |time| time.timestamp())
        .max(since)
}

impl EventsPage {
    /// The page's URL: `GET /v1/events?type=PREFIX.*&created[gte]=SINCE` and the step's
    /// cursor.
    pub fn url(&self, base: &Url, limit: u32) -> Result<Url, FetchError> {
        let mut url = adapter::endpoint(base, "/v1/events")?;
        {
            let mut query = url.query_pairs_mut();
            query
                .append_pair("limit", &limit.to_string())
                .append_pair("type", &format!("{}.*", self.kinds.prefix))
                .append_pair("created[gte]", &self.since.to_string());
            match &self.step {
                Step::First { .. } => {}
                Step::Walk(WalkPosition::Back { after }) => {
                    query.append_pair("starting_after", after);
                }
                Step::Walk(WalkPosition::Forward { before }) => {
                    query.append_pair("ending_before", before);
                }
            }
        }
        Ok(url)
    }

    /// Reads one answered page of the walk.
    pub fn read_page(&self, answered: &Answered<'_>) -> Result<Page, FetchError> {
        let list = list::read(answered, "events")?;
        let going_back = matches!(
            self.step,
            Step::First { .. } | Step::Walk(WalkPosition::Back { .. })
        );
        if going_back && list.has_more {
            return self.back_page(answered, &list);
        }
        let next = self.next_after(answered, &list)?;
        let mut page = self.applied(&list);
        page.next = next.map(|walk| StripePosition::Events(walk).into_page_position());
        if let Step::First { floor } = self.step {
            page.watermark = page.watermark.max(Some(Watermark::Epoch(floor)));
        }
        Ok(page)
    }

    /// Where the walk goes after a page whose events are applied: forward from its newest
    /// event while newer ones remain.
    fn next_after(
        &self,
        answered: &Answered<'_>,
        list: &StripeList<'_>,
    ) -> Result<Option<WalkPosition>, FetchError> {
        let newest = list.items.first().copied();
        match &self.step {
            // Every event since the cursor fit in this one page.
            Step::First { .. } => Ok(None),
            // The oldest events: the walk turns forward from the newest of them.
            Step::Walk(WalkPosition::Back { after }) if list.items.is_empty() => {
                Err(list::shape_error(
                    answered,
                    format!(
                        "no events are older than {}, although the page that ended with it \
                         said `has_more`: the oldest events cannot be read",
                        quote_cursor(after)
                    ),
                ))
            }
            Step::Walk(WalkPosition::Back { .. }) => {
                let before = list::continue_id(answered, newest, "event")?;
                Ok(Some(WalkPosition::Forward { before }))
            }
            Step::Walk(WalkPosition::Forward { .. }) if list.has_more => {
                let before = list::continue_id(answered, newest, "newest event")?;
                Ok(Some(WalkPosition::Forward { before }))
            }
            Step::Walk(WalkPosition::Forward { .. }) => Ok(None),
        }
    }

    /// A page of phase 1: no records, the id to go back from, and on the first page its
    /// watermark (the newest event's `created`, which only the first element holds).
    fn back_page(
        &self,
        answered: &Answered<'_>,
        list: &StripeList<'_>,
    ) -> Result<Page, FetchError> {
        let after = list::continue_id(answered, list.items.last().copied(), "last event")?;
        let watermark = match self.step {
            Step::First { floor } => {
                let newest = list.items.first().and_then(|event| created(event));
                Some(Watermark::Epoch(
                    newest.map_or(floor, |newest| newest.max(floor)),
                ))
            }
            Step::Walk(_) => None,
        };
        Ok(Page {
            next: Some(StripePosition::Events(WalkPosition::Back { after }).into_page_position()),
            watermark,
            ..Page::default()
        })
    }

    /// The page's events applied oldest first, and the newest `created` among them.
    fn applied(&self, list: &StripeList<'_>) -> Page {
        let now = Utc::now();
        let spec = IdSpec::Field("id".to_string());
        let mut page = Page::default();
        let mut newest: Option<i64> = None;
        for event in list.items.iter().rev() {
            let Some(fields) = RawObject::parse(event, &["id", "type", "created", "data"]) else {
                let kind = json_kind(event).name();
                page.items.push(unreadable(
                    event,
                    format!("the event is {kind}, not an object"),
                ));
                continue;
            };
            if let Some(created) = fields.get("created").map(to_value).and_then(|v| v.as_i64()) {
                if Watermark::Epoch(created).is_beyond_skew(now) {
                    page.watermarks_ahead = page.watermarks_ahead.saturating_add(1);
                }
                newest = newest.max(Some(created));
            }
            if let Some(item) = self.item(&spec, event, &fields) {
                page.items.push(item);
            }
        }
        page.watermark = newest.map(Watermark::Epoch);
        page
    }

    /// What one event says of the stream: its object's new version, its deletion, why it
    /// cannot be read, or nothing (an event about another kind of object).
    fn item(&self, spec: &IdSpec, event: &RawValue, fields: &RawObject<'_>) -> Option<PageItem> {
        let kind = fields.get("type").map(to_value);
        let kind = kind.as_ref().and_then(Value::as_str).unwrap_or_default();
        if self.kinds.ignored.contains(&kind) {
            return None;
        }
        let id = fields.get("id").map_or("(no id)", RawValue::get);
        let id = truncated(id, MAX_QUOTED_CHARS);
        let Some(object) = fields
            .get("data")
            .and_then(|data| lookup_raw(data, "object"))
        else {
            return Some(unreadable(
                event,
                format!("event {id} has no `data.object`"),
            ));
        };
        let Some(object_fields) = RawObject::parse(object, &["object"]) else {
            let found = json_kind(object).name();
            let message = format!("event {id}'s `data.object` is {found}, expected an object");
            return Some(unreadable(event, message));
        };
        // `charge.*` also matches `charge.dispute.created`, whose object is a dispute.
        let object_kind = object_fields.get("object").map(to_value);
        if object_kind.as_ref().and_then(Value::as_str) != Some(self.object) {
            return None;
        }
        Some(match spec.identify_raw(object) {
            Ok(record) if self.kinds.is_deletion(kind) => PageItem::Deleted(DeletedRecord {
                external_id: record.external_id,
                payload: record.payload,
            }),
            Ok(record) => PageItem::Record(record),
            Err(rejected) => PageItem::Rejected(rejected),
        })
    }
}

/// An event's `created`, in epoch seconds.
fn created(event: &RawValue) -> Option<i64> {
    lookup_raw(event, "created").map(to_value)?.as_i64()
}

/// An event that holds no readable object, set aside with its text.
fn unreadable(event: &RawValue, message: String) -> PageItem {
    PageItem::Rejected(RejectedRecord {
        external_id: None,
        stage: RecordStage::Parse,
        message: message.into(),
        payload: event.get().to_string(),
    })
}
