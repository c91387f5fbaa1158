//! `/v1/records`: one stream's synced records, read-only, in the order they last changed,
//! with tombstones for records deleted at the provider when asked.
//!
//! The cursor is the last record's (change time, row id) with a check over this
//! database's id and the list's filters, so that a cursor edited by hand, of other
//! filters or from another database is refused rather than read from a wrong place.

use std::ops::ControlFlow;

use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize, Serializer};
use sha2::{Digest, Sha256};
use utoipa::{IntoParams, ToSchema};

use super::auth::{Authorized, RecordsRead};
use super::input::Query;
use super::problem::Problem;
use super::state::ApiState;
use crate::ops::changes::Payload;
use crate::ops::records::{self as ops, RecordItem, RecordPosition, RecordsQuery};

/// What last happened to a record.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum LastAction {
    /// Stored once and not changed since.
    Added,
    /// Rewritten with new content, or restored, since first stored.
    Updated,
    /// Deleted at the provider: a tombstone.
    Deleted,
}

impl From<LastAction> for ops::LastAction {
    fn from(action: LastAction) -> ops::LastAction {
        match action {
            LastAction::Added => ops::LastAction::Added,
            LastAction::Updated => ops::LastAction::Updated,
            LastAction::Deleted => ops::LastAction::Deleted,
        }
    }
}

impl From<ops::LastAction> for LastAction {
    fn from(action: ops::LastAction) -> LastAction {
        match action {
            ops::LastAction::Added => LastAction::Added,
            ops::LastAction::Updated => LastAction::Updated,
            ops::LastAction::Deleted => LastAction::Deleted,
        }
    }
}

/// The page size when `limit` is not given.
const DEFAULT_LIMIT: u64 = 100;
/// What a cursor's text starts with, naming its list and format.
const CURSOR_TAG: &str = "records.v1";
/// Hex digits of the check a cursor carries.
const CHECK_HEX: usize = 16;

/// A record, or with `include_deleted` the tombstone of one deleted at the provider.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Record {
    /// The provider's name (`[providers.NAME]`).
    pub provider: String,
    pub stream: String,
    pub user_id: String,
    /// The connection of `user_id` at `provider`; absent once it was removed.
    pub connection_id: Option<i64>,
    /// The record's id at the provider.
    pub external_id: String,
    /// Whether it was added, then updated or deleted since.
    pub last_action: LastAction,
    /// The record's JSON as the provider sent it; null for a tombstone.
    #[schema(value_type = Option<Object>)]
    pub payload: Option<Payload>,
    /// When tributary first stored it.
    #[serde(serialize_with = "rfc3339")]
    pub first_seen_at: DateTime<Utc>,
    /// When it last changed (stored, rewritten, deleted or restored): what
    /// `modified_after` compares and the list is ordered by.
    #[serde(serialize_with = "rfc3339")]
    pub changed_at: DateTime<Utc>,
    /// Whether it was deleted at the provider (a tombstone).
    pub deleted: bool,
    #[serde(serialize_with = "rfc3339_or_null")]
    pub deleted_at: Option<DateTime<Utc>>,
}

/// A time as chrono's own `Serialize` writes it (RFC 3339 in UTC with `Z`, as many
/// fraction digits as it needs), but formatted in one go: chrono's goes through
/// `collect_str` a piece at a time, which was 60 % of serializing a page of records.
fn rfc3339<S: Serializer>(time: &DateTime<Utc>, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&time.to_rfc3339_opts(SecondsFormat::AutoSi, true))
}

fn rfc3339_or_null<S: Serializer>(
    time: &Option<DateTime<Utc>>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match time {
        Some(time) => rfc3339(time, serializer),
        None => serializer.serialize_none(),
    }
}

impl From<RecordItem> for Record {
    fn from(item: RecordItem) -> Record {
        Record {
            provider: item.provider,
            stream: item.stream,
            user_id: item.user_id,
            connection_id: item.connection_id,
            external_id: item.external_id,
            last_action: item.last_action.into(),
            payload: item.payload,
            first_seen_at: item.first_seen_at,
            changed_at: item.changed_at,
            deleted: item.deleted,
            deleted_at: item.deleted_at,
        }
    }
}

/// A page of records.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct RecordPage {
    pub items: Vec<Record>,
    /// Pass it as `cursor`, with the same filters, for the next page; absent on the last
    /// page. To follow changes later, keep the last page's last `changed_at` and pass it
    /// as `modified_after`.
    pub next: Option<String>,
}

/// Which records to read.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListParams {
    /// The provider's name, as in config.toml; required unless `connection_id` is given.
    provider: Option<String>,
    /// The stream (default: the provider's primary stream).
    stream: Option<String>,
    /// Only this user's records.
    user_id: Option<String>,
    /// Only this connection's records (its provider and user).
    connection_id: Option<i64>,
    /// Only records changed after this RFC 3339 time (`2026-12-01T00:00:00Z`).
    #[param(value_type = Option<String>, format = DateTime)]
    modified_after: Option<String>,
    /// Also return the records deleted at the provider, as tombstones (default false).
    include_deleted: Option<bool>,
    /// Only the records with this id at the provider; repeat it for several (at most 100).
    #[serde(default)]
    #[param(max_items = 100)]
    external_id: Vec<String>,
    /// Only the records whose last action is this; repeat it for several. `deleted`
    /// returns tombstones whatever `include_deleted` says.
    #[serde(default)]
    last_action: Vec<LastAction>,
    /// The `next` of the page before.
    cursor: Option<String>,
    /// At most this many records (1 to 1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u64>,
}

/// List one stream's records, the least recently changed first. A record changed while
/// the list is paged comes again later in it, with its new content; none is skipped.
#[utoipa::path(
    get,
    path = "/v1/records",
    params(ListParams),
    security(("bearer" = ["records:read"])),
    responses(
        (status = 200, description = "A page of records", body = RecordPage, headers(
            ("Link" = String, description = "The next page (RFC 8288, `rel=\"next\"`): this request's query with `cursor` set to `next`, relative to the request's URL; absent on the last page. Sent before the body, so a client can ask for the next page while it reads this one"),
        )),
        (status = 400, description = "A query parameter is wrong", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The key lacks records:read", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn list_records(
    _caller: Authorized<RecordsRead>,
    State(state): State<ApiState>,
    RawQuery(raw_query): RawQuery,
    Query(params): Query<ListParams>,
) -> Result<Response, Problem> {
    let modified_after = params
        .modified_after
        .as_deref()
        .map(parse_time)
        .transpose()?;
    let mut query = RecordsQuery {
        provider: params.provider,
        stream: params.stream,
        user_id: params.user_id,
        connection_id: params.connection_id,
        modified_after,
        include_deleted: params.include_deleted.unwrap_or(false),
        external_ids: params.external_id,
        last_actions: params.last_action.into_iter().map(Into::into).collect(),
        after: None,
        limit: params.limit.unwrap_or(DEFAULT_LIMIT),
    };
    let database = state.database_id().await?;
    let filters = filters_of(&query);
    if let Some(cursor) = params.cursor.as_deref() {
        query.after = Some(decode_cursor(&database, &filters, cursor)?);
    }
    let listing = ops::prepare(state.db.main(), &state.settings, &query).await?;
    // Each record is written as the database returns it, while the next is read.
    let mut writer = PageWriter::new(query.limit);
    let mut failed = None;
    let next = listing
        .each(state.db.main(), |item| {
            match writer.push(&Record::from(item)) {
                Ok(()) => ControlFlow::Continue(()),
                Err(error) => {
                    failed = Some(error);
                    ControlFlow::Break(())
                }
            }
        })
        .await
        .map_err(crate::ops::OpsError::Database)?;
    if let Some(error) = failed {
        tracing::error!(%error, "Serializing a page of records failed.");
        return Err(Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the page of records could not be written",
        ));
    }
    let next = next.map(|position| encode_cursor(&database, &filters, position));
    let mut response = (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        writer.finish(next.clone()),
    )
        .into_response();
    if let Some(link) = next.and_then(|next| next_link(raw_query.as_deref(), &next)) {
        response.headers_mut().insert(header::LINK, link);
    }
    Ok(response)
}

/// The `Link` header of the page after this one (RFC 8288): the request's own query with
/// `cursor` set to `next`, as a reference relative to the request's URL, which holds
/// behind a proxy that serves the API under a prefix of its own.
fn next_link(raw_query: Option<&str>, next: &str) -> Option<HeaderValue> {
    let kept = raw_query
        .unwrap_or_default()
        .split('&')
        .filter(|pair| !pair.is_empty())
        .filter(|pair| {
            form_urlencoded::parse(pair.as_bytes())
                .next()
                .is_none_or(|(name, _)| name != "cursor")
        });
    let mut query: Vec<&str> = kept.collect();
    let cursor = format!("cursor={next}");
    query.push(&cursor);
    HeaderValue::from_str(&format!("<?{}>; rel=\"next\"", query.join("&"))).ok()
}

/// A [`RecordPage`] written as JSON a record at a time, byte for byte as serde writes
/// the whole page (a unit test holds them equal), into one buffer sized for the page:
/// left to double as it fills, as `axum::Json`'s starts at 128 bytes, the buffer of a page
/// of 1,000 records (about 900 KB) would be copied a dozen times.
struct PageWriter {
    buffer: Vec<u8>,
    first: bool,
}

impl PageWriter {
    fn new(limit: u64) -> PageWriter {
        let records = usize::try_from(limit.min(ops::MAX_LIMIT)).unwrap_or(0);
        let mut buffer = Vec::with_capacity(records.saturating_mul(RECORD_BYTES));
        buffer.extend_from_slice(b"{\"items\":[");
        PageWriter {
            buffer,
            first: true,
        }
    }

    fn push(&mut self, record: &Record) -> Result<(), serde_json::Error> {
        if !std::mem::take(&mut self.first) {
            self.buffer.push(b',');
        }
        serde_json::to_writer(&mut self.buffer, record)
    }

    /// The page, ended with its `next`.
    fn finish(mut self, next: Option<String>) -> Vec<u8> {
        self.buffer.extend_from_slice(b"],\"next\":");
        // An `Option<String>` always serializes.
        let next = serde_json::to_vec(&next).unwrap_or_else(|_| b"null".to_vec());
        self.buffer.extend_from_slice(&next);
        self.buffer.push(b'}');
        self.buffer
    }
}

/// Room for a record's JSON, payload included: a guess (the bench's are about 900 bytes);
/// a page of larger ones grows the buffer a few times.
const RECORD_BYTES: usize = 1024;

/// An RFC 3339 time; a `+` a client left unescaped arrives as a space and is taken back.
fn parse_time(text: &str) -> Result<DateTime<Utc>, Problem> {
    DateTime::parse_from_rfc3339(text)
        .or_else(|_| DateTime::parse_from_rfc3339(&text.replace(' ', "+")))
        .map(|time| time.with_timezone(&Utc))
        .map_err(|_| {
            Problem::invalid(
                "modified_after",
                format!(
                    "modified_after: expected an RFC 3339 time such as 2026-12-01T00:00:00Z, got {:?}",
                    tributary_providers::quote::truncated(text, 64)
                ),
            )
        })
}

/// The filters a cursor is bound to, as one text.
fn filters_of(query: &RecordsQuery) -> String {
    format!(
        "{:?}",
        (
            &query.provider,
            &query.stream,
            &query.user_id,
            query.connection_id,
            query.modified_after.map(|time| time.to_rfc3339()),
            query.include_deleted,
            &query.external_ids,
            &query.last_actions,
        )
    )
}

/// The check over a cursor's position, its database and its filters.
fn check(database: &str, filters: &str, position: &str) -> String {
    let mut hash = Sha256::new();
    for part in [CURSOR_TAG, database, filters, position] {
        hash.update(part.as_bytes());
        hash.update([0]);
    }
    let mut hex = const_hex::encode(hash.finalize());
    hex.truncate(CHECK_HEX);
    hex
}

fn encode_cursor(database: &str, filters: &str, position: RecordPosition) -> String {
    let at = position.changed_at;
    let position = format!(
        "{}.{}.{}",
        at.timestamp(),
        at.timestamp_subsec_nanos(),
        position.id
    );
    let text = format!(
        "{CURSOR_TAG}.{position}.{}",
        check(database, filters, &position)
    );
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text)
}

/// The position in a cursor [`encode_cursor`] made for this database and these filters;
/// anything else is a 400 naming `cursor`.
fn decode_cursor(database: &str, filters: &str, cursor: &str) -> Result<RecordPosition, Problem> {
    let refused = || {
        Problem::invalid(
            "cursor",
            "cursor: not a cursor of this list; pass the `next` of the page before, with the \
             same filters, from this server",
        )
    };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(cursor)
        .map_err(|_| refused())?;
    let text = String::from_utf8(bytes).map_err(|_| refused())?;
    let rest = text
        .strip_prefix(CURSOR_TAG)
        .and_then(|rest| rest.strip_prefix('.'))
        .ok_or_else(refused)?;
    let (position, checked) = rest.rsplit_once('.').ok_or_else(refused)?;
    if checked != check(database, filters, position) {
        return Err(refused());
    }
    let mut parts = position.split('.');
    let mut number = || parts.next().and_then(|part| part.parse::<i64>().ok());
    let (seconds, nanos, id) = (number(), number(), number());
    let nanos = nanos.and_then(|nanos| u32::try_from(nanos).ok());
    match (seconds, nanos, id, parts.next()) {
        (Some(seconds), Some(nanos), Some(id), None) => {
            let changed_at = DateTime::from_timestamp(seconds, nanos).ok_or_else(refused)?;
            Ok(RecordPosition { changed_at, id })
        }
        _ => Err(refused()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_link_is_the_query_with_its_cursor_replaced() {
        let link = |query: Option<&str>| {
            next_link(query, "bmV4dA")
                .map(|value| value.to_str().unwrap_or_default().to_string())
                .unwrap_or_default()
        };
        assert_eq!(link(None), "<?cursor=bmV4dA>; rel=\"next\"");
        assert_eq!(
            link(Some("provider=git%20hub&cursor=old&limit=10&external_id=a&external_id=b")),
            "<?provider=git%20hub&limit=10&external_id=a&external_id=b&cursor=bmV4dA>; rel=\"next\""
        );
        // A cursor named in escapes is replaced too, so the next request names one.
        assert_eq!(
            link(Some("curs%6Fr=old&&limit=5")),
            "<?limit=5&cursor=bmV4dA>; rel=\"next\""
        );
    }

    fn sample(i: i64, payload: Option<&str>) -> Record {
        let at = DateTime::from_timestamp(1_764_000_000 + i, 0).expect("time");
        Record {
            provider: "github".into(),
            stream: "issues".into(),
            user_id: format!("user \"{i}\""),
            connection_id: (i % 2 == 0).then_some(i),
            external_id: format!("id-{i}"),
            last_action: if payload.is_some() {
                LastAction::Added
            } else {
                LastAction::Deleted
            },
            payload: payload.map(|text| Payload::stored(text.to_string())),
            first_seen_at: at,
            changed_at: at,
            deleted: payload.is_none(),
            deleted_at: payload.is_none().then_some(at),
        }
    }

    #[test]
    fn a_page_written_a_record_at_a_time_is_byte_for_byte_the_page_serde_writes() {
        let payloads = [
            Some(r#"{"a": [1, 2], "b": "\u00e9"}"#),
            None,
            Some("not json"),
        ];
        for count in [0usize, 1, 3, 40] {
            for next in [None, Some("cmVjb3Jkcy52MS4x".to_string())] {
                let records: Vec<Record> = (0..count)
                    .map(|i| sample(i as i64, payloads[i % payloads.len()]))
                    .collect();
                let mut writer = PageWriter::new(1);
                for record in &records {
                    writer.push(record).expect("written");
                }
                let written = writer.finish(next.clone());
                let page = RecordPage {
                    items: records,
                    next,
                };
                let whole = serde_json::to_vec(&page).expect("written");
                assert_eq!(String::from_utf8(written), String::from_utf8(whole));
            }
        }
    }

    #[test]
    fn times_are_written_as_chrono_writes_them() {
        // Whole seconds, milli-, micro- and nanoseconds (PostgreSQL keeps micro, SQLite
        // nano), a leap second, and the ends of four-digit years.
        let times = [
            (1_764_000_000, 0),
            (1_764_000_000, 120_000_000),
            (1_764_000_000, 123_456_000),
            (1_764_000_000, 123_456_789),
            (1_483_228_799, 1_500_000_000),
            (0, 1),
            (253_402_300_799, 999_999_999),
        ];
        for (seconds, nanos) in times {
            let time = DateTime::from_timestamp(seconds, nanos).expect("time");
            let mut ours = Vec::new();
            rfc3339(&time, &mut serde_json::Serializer::new(&mut ours)).expect("written");
            let chrono = serde_json::to_vec(&time).expect("written");
            assert_eq!(String::from_utf8(ours), String::from_utf8(chrono));
        }
        let mut none = Vec::new();
        rfc3339_or_null(&None, &mut serde_json::Serializer::new(&mut none)).expect("written");
        assert_eq!(none, b"null");
    }

    #[test]
    fn a_cursor_decodes_only_with_its_database_and_filters_and_unedited() {
        let at = DateTime::from_timestamp(1_764_000_000, 123_456_789).expect("time");
        let position = RecordPosition {
            changed_at: at,
            id: 42,
        };
        let cursor = encode_cursor("db1", "f", position);
        assert_eq!(decode_cursor("db1", "f", &cursor).ok(), Some(position));
        assert!(decode_cursor("db2", "f", &cursor).is_err());
        assert!(decode_cursor("db1", "g", &cursor).is_err());
        let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let text = String::from_utf8(engine.decode(&cursor).expect("base64")).expect("text");
        let edited = engine.encode(text.replace(".42.", ".41."));
        for bad in [edited.as_str(), "", "!!", "cnVuczo0Mg"] {
            let problem = decode_cursor("db1", "f", bad).unwrap_err();
            assert_eq!(problem.field.as_deref(), Some("cursor"), "{bad}");
        }
    }
}
