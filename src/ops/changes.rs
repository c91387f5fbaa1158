//! The change feed: the changes after a cursor, and the head.

use chrono::{DateTime, Utc};
use sea_orm::DatabaseConnection;
use serde::Serialize;
use serde_json::value::RawValue;

use super::OpsError;
use crate::entities::change::ChangeKind;
use crate::pipeline::changes::{self, FeedChange, FeedQuery};

/// A reader's position, as the faces parse it from the text a read issued.
pub(crate) use crate::pipeline::changes::FeedCursor;
pub(crate) use crate::pipeline::changes::MAX_LIMIT;

/// Which changes to read.
#[derive(Clone, Debug, Default)]
pub struct ChangesQuery {
    /// After this cursor (as a previous read issued it); from the first change kept when
    /// `None`.
    pub since: Option<FeedCursor>,
    pub provider: Option<String>,
    pub user_id: Option<String>,
    /// At most this many changes (1 to [`MAX_LIMIT`]).
    pub limit: u64,
}

/// The changes read, the cursor to pass next, and where the feed begins.
#[derive(Debug, Serialize)]
pub struct ChangesPage {
    pub changes: Vec<ChangeItem>,
    #[serde(serialize_with = "as_text")]
    pub next_cursor: FeedCursor,
    pub feed_start: FeedStart,
}

/// Where the feed begins: a reader from `cursor` reads every change kept.
#[derive(Debug, Serialize)]
pub struct FeedStart {
    #[serde(serialize_with = "as_text")]
    pub cursor: FeedCursor,
    pub first_committed_at: Option<DateTime<Utc>>,
}

/// One change: the payload is the record's JSON itself, not a string.
#[derive(Debug, Serialize)]
pub struct ChangeItem {
    #[serde(serialize_with = "as_text")]
    pub cursor: FeedCursor,
    pub user_id: String,
    pub provider: String,
    pub external_id: String,
    pub kind: ChangeKind,
    pub run_id: i64,
    pub committed_at: Option<DateTime<Utc>>,
    pub deleted: bool,
    pub payload: Option<Payload>,
}

/// A payload as stored, written out as the JSON the API sent or, should a row hold
/// something other than JSON, as its text in a string. Which of the two is found while it
/// is written, in the one pass that checks it: a page of payloads is neither copied nor
/// checked twice.
#[derive(Debug)]
pub struct Payload(String);

impl Payload {
    pub(crate) fn stored(text: String) -> Payload {
        Payload(text)
    }

    /// The text as stored.
    pub(crate) fn text(&self) -> &str {
        &self.0
    }
}

impl Serialize for Payload {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match serde_json::from_str::<&RawValue>(&self.0) {
            Ok(json) => json.serialize(serializer),
            Err(_) => serializer.serialize_str(&self.0),
        }
    }
}

/// The cursor after every change committed so far: take it before copying `records`,
/// then follow the feed from it.
pub async fn head(db: &DatabaseConnection) -> Result<FeedCursor, OpsError> {
    Ok(FeedCursor {
        database: Some(changes::database_id(db).await?),
        position: changes::head(db).await?,
    })
}

/// The changes after `query.since`. A cursor the feed cannot serve (swept, ahead of the
/// head, issued by another database, or naming none) is [`OpsError::Feed`], and
/// [`OpsError::needs_resync`] says the reader must take the baseline again.
pub async fn read(db: &DatabaseConnection, query: &ChangesQuery) -> Result<ChangesPage, OpsError> {
    let limit = super::check_limit(query.limit, MAX_LIMIT)?;
    let since = match query.since {
        Some(cursor) => Some(changes::position_in(db, cursor).await?),
        None => None,
    };
    let feed = FeedQuery {
        since,
        provider: query.provider.as_deref(),
        user_id: query.user_id.as_deref(),
        limit,
    };
    let page = changes::read_changes(db, &feed).await?;
    let database = page.database;
    let issued = |position| FeedCursor {
        database: Some(database),
        position,
    };
    Ok(ChangesPage {
        next_cursor: issued(page.next),
        feed_start: FeedStart {
            cursor: issued(page.start.cursor),
            first_committed_at: page.start.first_committed_at,
        },
        changes: page
            .changes
            .into_iter()
            .map(|change| {
                let cursor = issued(change.cursor);
                ChangeItem::of(change, cursor)
            })
            .collect(),
    })
}

impl ChangeItem {
    fn of(change: FeedChange, cursor: FeedCursor) -> ChangeItem {
        ChangeItem {
            cursor,
            user_id: change.user_id,
            provider: change.provider,
            external_id: change.external_id,
            kind: change.kind,
            run_id: change.run_id,
            committed_at: change.committed_at,
            deleted: change.deleted,
            payload: change.payload.map(Payload::stored),
        }
    }
}

/// A cursor as the text readers pass back.
pub(crate) fn as_text<S: serde::Serializer>(
    cursor: &FeedCursor,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_str(cursor)
}

#[cfg(test)]
mod tests {
    use super::Payload;

    #[test]
    fn a_payload_is_written_as_its_json_or_else_as_its_text_in_a_string() {
        let written = |text: &str| {
            serde_json::to_string(&Payload::stored(text.to_string())).expect("written")
        };
        let json = r#"{"id":"ch_1","amount":4.5,"tags":["a",null],"note":"\u00e9"}"#;
        assert_eq!(written(json), json);
        // The whitespace around it is not part of the value.
        assert_eq!(written(" [1, 2]\n"), "[1, 2]");
        assert_eq!(written(r#"{"id": broken"#), r#""{\"id\": broken""#);
        assert_eq!(written("[1] [2]"), r#""[1] [2]""#);
        assert_eq!(written(""), r#""""#);
    }
}
