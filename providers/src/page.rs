//! What a provider hands the pipeline: one page of records and where the next page is.

use serde::{Deserialize, Serialize};

use crate::http::display_url_text;
use crate::quote::{quote_cursor, truncated, MAX_QUOTED_CHARS};
use crate::record::{Record, RejectedRecord};

/// The longest cursor a page may hand on; a longer one stops the run after the page.
pub const MAX_CURSOR_BYTES: usize = 4 * 1024;
/// The longest next-page URL a page may hand on; a longer one stops the run after the page.
pub const MAX_NEXT_URL_BYTES: usize = 8 * 1024;

/// The incremental-sync watermark: the newest change a run has seen. The connection keeps
/// the largest watermark of its last complete run, and the next run asks only for what
/// changed since (inclusively where the API allows, so boundary ties are re-fetched and
/// absorbed by the key).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Watermark {
    /// A timestamp (e.g. GitHub's `updated_at`, Strava's `start_date`).
    Time(chrono::DateTime<chrono::Utc>),
    /// Seconds since the Unix epoch (e.g. Stripe's `created`).
    Epoch(i64),
}

/// How far past this machine's clock a record's watermark may lie before it counts as an
/// anomaly: servers' clocks drift a little, a year-9999 `updated_at` is not drift.
pub const WATERMARK_CLOCK_SKEW: chrono::TimeDelta = chrono::TimeDelta::minutes(5);

impl Watermark {
    /// Whether the watermark lies after `time` (an epoch watermark compares its seconds).
    pub fn is_after(&self, time: chrono::DateTime<chrono::Utc>) -> bool {
        match self {
            Watermark::Time(own) => *own > time,
            Watermark::Epoch(seconds) => *seconds > time.timestamp(),
        }
    }

    /// Whether the watermark lies beyond `now` by more than [`WATERMARK_CLOCK_SKEW`].
    pub fn is_beyond_skew(&self, now: chrono::DateTime<chrono::Utc>) -> bool {
        // `now` near the end of chrono's range has no later instant: nothing is beyond it.
        now.checked_add_signed(WATERMARK_CLOCK_SKEW)
            .is_some_and(|limit| self.is_after(limit))
    }

    /// The watermark for messages: an RFC 3339 time, or epoch seconds.
    pub fn describe(&self) -> String {
        match self {
            Watermark::Time(time) => time.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
            Watermark::Epoch(seconds) => format!("{seconds} (epoch seconds)"),
        }
    }

    /// The watermark, or `time` in the same kind when the watermark lies after it: a cursor
    /// never passes the moment its page was asked for.
    pub fn at_most(self, time: chrono::DateTime<chrono::Utc>) -> Watermark {
        match self {
            Watermark::Time(own) => Watermark::Time(own.min(time)),
            Watermark::Epoch(seconds) => Watermark::Epoch(seconds.min(time.timestamp())),
        }
    }
}

/// Where a page starts. It is serialised into the connection's checkpoint, so it must be
/// plain data.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PagePosition {
    /// An opaque cursor token returned by the previous page.
    Cursor {
        /// The token, sent back as the configured query parameter.
        cursor: String,
    },
    /// A record offset (`offset` pagination).
    Offset {
        /// The number of records before this page.
        offset: u64,
    },
    /// A page number (`page` pagination).
    Page {
        /// The page number.
        page: u64,
    },
    /// A full URL to fetch next (`link` pagination, RFC 8288 `rel="next"`).
    Url {
        /// The absolute URL.
        url: String,
    },
    /// A page number of a listing started over because the API serves no page past
    /// `pagination.max_page`: asked from `since`, not from the run's cursor.
    RestartedPage {
        /// The page number.
        page: u64,
        /// The newest change read before the listing started over.
        since: Watermark,
    },
}

impl PagePosition {
    /// The position for messages and logs: its kind and value, a cursor truncated, a URL
    /// without its query string and truncated.
    pub fn describe(&self) -> String {
        match self {
            PagePosition::Cursor { cursor } => format!("cursor {}", quote_cursor(cursor)),
            PagePosition::Offset { offset } => format!("offset {offset}"),
            PagePosition::Page { page } => format!("page {page}"),
            PagePosition::RestartedPage { page, since } => {
                format!(
                    "page {page} of the listing started over from {}",
                    since.describe()
                )
            }
            PagePosition::Url { url } => {
                let without_query = url.split('?').next().unwrap_or(url);
                format!("URL {}", truncated(without_query, MAX_QUOTED_CHARS))
            }
        }
    }

    /// Why the position is too long to follow (and to keep in a checkpoint), if it is.
    fn too_long(&self) -> Option<String> {
        match self {
            PagePosition::Cursor { cursor } if cursor.len() > MAX_CURSOR_BYTES => Some(format!(
                "the next cursor is {} bytes long, more than the {MAX_CURSOR_BYTES} allowed \
                 (it starts {})",
                cursor.len(),
                quote_cursor(cursor)
            )),
            PagePosition::Url { url } if url.len() > MAX_NEXT_URL_BYTES => Some(format!(
                "the next-page URL is {} bytes long, more than the {MAX_NEXT_URL_BYTES} \
                 allowed ({})",
                url.len(),
                display_url_text(url)
            )),
            _ => None,
        }
    }
}

/// One item of a page: a record ready to store, one that was set aside with its payload, or
/// one the API says was deleted.
#[derive(Clone, Debug)]
pub enum PageItem {
    /// A record ready to store.
    Record(Record),
    /// A record set aside, with the reason and its raw payload.
    Rejected(RejectedRecord),
    /// A record the API reports deleted (e.g. a Stripe `customer.deleted` event): the
    /// pipeline marks the stored record deleted.
    Deleted(DeletedRecord),
}

/// A record the API reports deleted, as the report of its deletion carried it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeletedRecord {
    /// The deleted record's key within its stream.
    pub external_id: String,
    /// The record's JSON text as the deletion report carried it (its last state), exactly
    /// as received.
    pub payload: String,
}

/// One fetched page.
#[derive(Clone, Debug, Default)]
pub struct Page {
    /// The page's records in the order the API returned them.
    pub items: Vec<PageItem>,
    /// Where the next page starts; `None` when this was the last page.
    pub next: Option<PagePosition>,
    /// The newest watermark among this page's records, for providers that sync
    /// incrementally; `None` otherwise.
    pub watermark: Option<Watermark>,
    /// How many of this page's records carry a watermark beyond the clock by more than
    /// [`WATERMARK_CLOCK_SKEW`] (the pipeline counts them as anomalies of the run).
    pub watermarks_ahead: u64,
    /// Why the listing cannot go on after this page although its records were read (a
    /// malformed `Link` header, a cursor of the wrong type): the pipeline stores the
    /// records, then stops the run with this reason, and the next run starts again at
    /// this page. `None` when `next` says where the listing goes.
    pub stop_after: Option<String>,
    /// For a child stream: why the parent's children cannot be listed although the API
    /// answered (a repository the token no longer sees). The page holds no records; the
    /// pipeline counts the parent as skipped, says why in the run's log, and goes on with
    /// the next parent.
    pub parent_gone: Option<String>,
    /// How many records the API listed on this page that the provider's configured filter
    /// dropped (the rest kind's `records_filter`): they are in neither `items` nor the
    /// run's errors, and the pipeline may count them. 0 for providers without a filter.
    pub filtered: u64,
}

impl Page {
    /// The page, with a next position too long to follow turned into [`Page::stop_after`]:
    /// its records are stored, and the run stops with the reason.
    pub fn refusing_oversized_next(mut self) -> Page {
        if let Some(reason) = self.next.as_ref().and_then(PagePosition::too_long) {
            self.next = None;
            self.stop_after.get_or_insert(reason);
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page_to(next: PagePosition) -> Page {
        Page {
            next: Some(next),
            ..Page::default()
        }
    }

    #[test]
    fn a_next_position_too_long_to_follow_stops_the_run_after_the_page() {
        let cursor = "c".repeat(MAX_CURSOR_BYTES + 1);
        let page = page_to(PagePosition::Cursor { cursor }).refusing_oversized_next();
        assert_eq!(page.next, None);
        let reason = page.stop_after.unwrap();
        assert!(reason.starts_with(
            "the next cursor is 4097 bytes long, more than the 4096 allowed (it starts \"ccc"
        ));
        assert!(reason.len() < 400, "{reason}");
        let url = format!(
            "https://api.example.com/items?after={}",
            "u".repeat(MAX_NEXT_URL_BYTES)
        );
        let page = page_to(PagePosition::Url { url }).refusing_oversized_next();
        let reason = page.stop_after.unwrap();
        assert!(reason.starts_with("the next-page URL is 8228 bytes long, more than the 8192 allowed (https://api.example.com/items?after=uuu"), "{reason}");
        assert!(reason.ends_with("…)") && reason.len() < 400, "{reason}");
        let fine = PagePosition::Cursor {
            cursor: "c".repeat(MAX_CURSOR_BYTES),
        };
        let page = page_to(fine.clone()).refusing_oversized_next();
        assert_eq!((page.next, page.stop_after), (Some(fine), None));
    }

    #[test]
    fn positions_are_described_truncated_and_without_query_strings() {
        let cursor = PagePosition::Cursor {
            cursor: "c".repeat(1000),
        };
        let described = cursor.describe();
        assert_eq!(
            described.chars().count(),
            "cursor ".len() + MAX_QUOTED_CHARS + 3
        );
        let url = PagePosition::Url {
            url: format!("https://h/{}?token=x", "p".repeat(1000)),
        };
        let described = url.describe();
        assert!(described.starts_with("URL https://h/ppp") && described.ends_with('…'));
        assert!(!described.contains("token"));
        assert_eq!(PagePosition::Offset { offset: 7 }.describe(), "offset 7");
    }

    #[test]
    fn a_restarted_page_keeps_its_time_through_the_checkpoint() {
        let position = PagePosition::RestartedPage {
            page: 3,
            since: Watermark::Time("2024-03-04T05:06:07Z".parse().unwrap()),
        };
        let text = serde_json::to_string(&position).unwrap();
        assert_eq!(
            text,
            r#"{"type":"restarted_page","page":3,"since":{"time":"2024-03-04T05:06:07Z"}}"#
        );
        assert_eq!(
            serde_json::from_str::<PagePosition>(&text).unwrap(),
            position
        );
        assert_eq!(
            position.describe(),
            "page 3 of the listing started over from 2024-03-04T05:06:07Z"
        );
    }
}
