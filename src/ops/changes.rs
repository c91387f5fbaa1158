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
pub(crate) use crate::pipeline::changes::ReaderPlace;
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

/// [`read`] by API key `key_id`, noting where the reader got to (one indexed `SELECT`,
/// and a write at most every few seconds: `pipeline::changes::note_read`). A failure to
/// note it is logged, and the read served all the same.
pub(crate) async fn read_by(
    db: &DatabaseConnection,
    query: &ChangesQuery,
    key_id: i64,
) -> Result<ChangesPage, OpsError> {
    let page = read(db, query).await?;
    let reader = changes::key_reader(key_id);
    let position = page.next_cursor.position;
    if let Err(error) =
        changes::note_read(db, &reader, Some(key_id), position, crate::db::now()).await
    {
        tracing::warn!(%error, key_id, "Noting where a change feed reader got to failed.");
    }
    Ok(page)
}

/// The feed's head and start, and how far behind the head each reader is.
#[derive(Debug, Serialize)]
pub(crate) struct FeedReaders {
    #[serde(serialize_with = "as_text")]
    pub head: FeedCursor,
    pub feed_start: FeedStart,
    pub readers: Vec<ReaderView>,
    /// Where the next page of readers starts; `None` on the last page.
    #[serde(skip)]
    pub next: Option<changes::ReaderPlace>,
}

/// A reader's place in the list as a cursor's key: position, then row.
pub(crate) fn place_key(place: ReaderPlace) -> String {
    format!(
        "{}.{}.{}",
        place.position.seq, place.position.ordinal, place.id
    )
}

/// The place in a key [`place_key`] made.
pub(crate) fn place_of(key: &str) -> Option<ReaderPlace> {
    let mut parts = key.split('.').map(str::parse::<i64>);
    let (Some(Ok(seq)), Some(Ok(ordinal)), Some(Ok(id)), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    Some(ReaderPlace {
        position: changes::Cursor { seq, ordinal },
        id,
    })
}

/// The largest page of readers.
pub(crate) const MAX_READERS: u64 = 1_000;

/// A key that reads the feed, and how far behind the head it is. The API returns it as
/// it is, so its schema is described here once.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = FeedReader)]
pub(crate) struct ReaderView {
    /// The key's name.
    pub name: String,
    /// The key's public prefix (`trb_<prefix>_...`).
    pub key_prefix: Option<String>,
    /// The furthest cursor its reads returned (noted at most every 5 seconds).
    #[serde(serialize_with = "as_text")]
    #[schema(value_type = String)]
    pub cursor: FeedCursor,
    /// The changes after its cursor up to the head, counted up to 100,000.
    pub changes_behind: u64,
    /// Whether there are more than `changes_behind`.
    pub changes_behind_capped: bool,
    /// When the first change it has not read committed; null when it has read them all.
    pub oldest_unread_committed_at: Option<DateTime<Utc>>,
    /// How long that change has waited for it, in seconds; 0 when it has read them all.
    pub seconds_behind: i64,
    /// When it last read (to within a minute while its cursor stays put).
    pub last_read_at: DateTime<Utc>,
    /// Changes after its cursor were swept: its next read is refused (410).
    pub expired: bool,
    /// It has not read for longer than the feed's retention, so changes after its cursor
    /// are swept, or will be, before it reads again.
    pub idle_past_retention: bool,
}

/// A page of at most `limit` readers of the feed after place `after`, the furthest behind
/// first, with the head they are behind. Readers whose key was revoked are left out
/// (their rows are deleted with the revocation).
pub(crate) async fn readers(
    db: &DatabaseConnection,
    retention: std::time::Duration,
    after: Option<changes::ReaderPlace>,
    limit: u64,
) -> Result<FeedReaders, OpsError> {
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
    let limit = super::check_limit(limit, MAX_READERS)?;
    let lags = changes::reader_lags(db, after, limit).await?;
    let database = Some(changes::database_id(db).await?);
    let issued = |position| FeedCursor { database, position };
    let key_ids: Vec<i64> = lags.readers.iter().filter_map(|lag| lag.key_id).collect();
    let keys: std::collections::HashMap<i64, crate::entities::api_key::Model> =
        match key_ids.is_empty() {
            true => Default::default(),
            false => crate::entities::api_key::Entity::find()
                .filter(crate::entities::api_key::Column::Id.is_in(key_ids))
                .all(db)
                .await?
                .into_iter()
                .map(|key| (key.id, key))
                .collect(),
        };
    let now = crate::db::now();
    let idle_since = chrono::TimeDelta::from_std(retention)
        .ok()
        .and_then(|retention| now.checked_sub_signed(retention));
    let readers = lags
        .readers
        .into_iter()
        .filter_map(|lag| {
            let key = lag.key_id.and_then(|id| keys.get(&id));
            if key.is_some_and(|key| key.revoked_at.is_some()) {
                return None;
            }
            let waited = lag
                .oldest_unread_at
                .map_or(0, |at| (now - at).num_seconds());
            Some(ReaderView {
                name: key.map_or_else(|| lag.reader.clone(), |key| key.name.clone()),
                key_prefix: key.map(|key| key.prefix.clone()),
                cursor: issued(lag.position),
                changes_behind: lag.unread.min(changes::COUNT_CAP),
                changes_behind_capped: lag.unread > changes::COUNT_CAP,
                oldest_unread_committed_at: lag.oldest_unread_at,
                seconds_behind: waited.max(0),
                last_read_at: lag.read_at,
                expired: lag.expired,
                idle_past_retention: idle_since.is_some_and(|since| lag.read_at < since),
            })
        })
        .collect();
    Ok(FeedReaders {
        head: issued(lags.head),
        feed_start: FeedStart {
            cursor: issued(lags.start.cursor),
            first_committed_at: lags.start.first_committed_at,
        },
        readers,
        next: lags.next,
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
