//! `/v1/changes`: the change feed, with the cursor rules of `tributary changes`: a cursor
//! is the text a read issued (the CLI's and the API's are the same), and one the feed
//! cannot serve is 410 with how to resync.

use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::auth::{Admin, Authorized, RecordsRead};
use super::input::{IdCursors, Query};
use super::problem::Problem;
use super::state::ApiState;
use crate::ops::changes::{self as ops, ChangeItem, ChangesQuery, FeedCursor, Payload, ReaderView};
use crate::ops::OpsError;

const DEFAULT_LIMIT: u64 = 100;
/// The list a readers cursor is of.
const READERS: &str = "readers";

/// How a reader takes its baseline again, over this API.
const RESYNC: &str = "Over this API: GET /v1/changes/head, copy the records, then read \
                      /v1/changes from that head";

/// A page of the feed: the changes after the cursor, in commit order.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ChangePage {
    pub changes: Vec<Change>,
    /// Pass it as `cursor` for the changes after these; poll with it when there are
    /// none yet.
    pub next_cursor: String,
    pub feed_start: FeedStart,
}

/// Where the feed begins: earlier changes were swept, and records stored before the feed
/// existed have none.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct FeedStart {
    /// A reader from this cursor reads every change kept.
    pub cursor: String,
    pub first_committed_at: Option<DateTime<Utc>>,
}

/// One committed change of one record.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Change {
    /// The position just after this change.
    pub cursor: String,
    pub user_id: String,
    /// The stream's namespace: `NAME` or `NAME.STREAM`.
    pub provider: String,
    pub external_id: String,
    /// `inserted`, `updated`, `deleted` or `restored`.
    pub kind: String,
    pub run_id: i64,
    pub committed_at: Option<DateTime<Utc>>,
    /// Whether the record is deleted now (a tombstone).
    pub deleted: bool,
    /// The record as the provider sent it; absent for a deleted record.
    #[schema(value_type = Option<serde_json::Value>)]
    pub payload: Option<Payload>,
}

impl From<ChangeItem> for Change {
    fn from(item: ChangeItem) -> Change {
        Change {
            cursor: item.cursor.to_string(),
            user_id: item.user_id,
            provider: item.provider,
            external_id: item.external_id,
            kind: item.kind.to_string(),
            run_id: item.run_id,
            committed_at: item.committed_at,
            deleted: item.deleted,
            payload: item.payload,
        }
    }
}

/// The head: the cursor after every change committed so far.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct FeedHead {
    /// Take it before copying the records, then read the feed from it.
    pub next_cursor: String,
}

/// Which changes to read.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ChangesParams {
    /// After this cursor (a `next_cursor`, a change's `cursor` or the head); from the
    /// feed's start when absent.
    cursor: Option<String>,
    /// Only changes of this provider's records (its namespace, `NAME` or `NAME.STREAM`).
    provider: Option<String>,
    /// Only changes of this user's records.
    user_id: Option<String>,
    /// At most this many changes (1 to 10000, default 100).
    #[param(minimum = 1, maximum = 10000)]
    limit: Option<u64>,
}

/// Read the change feed after a cursor. The key is the reader whose position and last
/// read `/v1/changes/readers` shows.
#[utoipa::path(
    get,
    path = "/v1/changes",
    params(ChangesParams),
    security(("bearer" = ["records:read"])),
    responses(
        (status = 200, description = "The changes after the cursor", body = ChangePage),
        (status = 400, description = "A query parameter is wrong, or the cursor is not one", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The key lacks records:read", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "The feed cannot serve the cursor (swept, from another database, ahead of the head): resync from the head", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn read_changes(
    caller: Authorized<RecordsRead>,
    State(state): State<ApiState>,
    Query(params): Query<ChangesParams>,
) -> Result<axum::Json<ChangePage>, Problem> {
    let since = params
        .cursor
        .as_deref()
        .map(|text| {
            text.parse::<FeedCursor>()
                .map_err(|error| Problem::invalid("cursor", format!("cursor: {error}")))
        })
        .transpose()?;
    let query = ChangesQuery {
        since,
        provider: params.provider,
        user_id: params.user_id,
        limit: params.limit.unwrap_or(DEFAULT_LIMIT),
    };
    let page = ops::read_by(state.db.main(), &query, caller.key_id)
        .await
        .map_err(gone_with_resync)?;
    Ok(axum::Json(ChangePage {
        changes: page.changes.into_iter().map(Change::from).collect(),
        next_cursor: page.next_cursor.to_string(),
        feed_start: FeedStart {
            cursor: page.feed_start.cursor.to_string(),
            first_committed_at: page.feed_start.first_committed_at,
        },
    }))
}

/// The feed's head.
#[utoipa::path(
    get,
    path = "/v1/changes/head",
    security(("bearer" = ["records:read"])),
    responses(
        (status = 200, description = "The cursor after every change committed so far", body = FeedHead),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The key lacks records:read", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn feed_head(
    _caller: Authorized<RecordsRead>,
    State(state): State<ApiState>,
) -> Result<axum::Json<FeedHead>, Problem> {
    let head = ops::head(state.db.main()).await?;
    Ok(axum::Json(FeedHead {
        next_cursor: head.to_string(),
    }))
}

/// A cursor the feed cannot serve is 410, saying how to resync over this API too.
fn gone_with_resync(error: OpsError) -> Problem {
    match error.needs_resync() {
        true => Problem::new(StatusCode::GONE, format!("{error}. {RESYNC}")),
        false => error.into(),
    }
}

/// The feed's readers: the head, and how far behind it each key that reads the feed is.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct FeedReaders {
    /// The cursor after every change committed so far.
    pub head: String,
    pub feed_start: FeedStart,
    /// The furthest behind first.
    pub readers: Vec<ReaderView>,
    /// Pass it as `cursor` for the next page; absent on the last page.
    pub next: Option<String>,
}

/// Which page of readers.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ReadersParams {
    /// The `next` of the page before. A reader that read on while the pages were read
    /// may be listed again further on; none is skipped.
    cursor: Option<String>,
    /// At most this many readers (1 to 1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u64>,
}

/// The feed's readers, and how far behind the head each is.
#[utoipa::path(
    get,
    path = "/v1/changes/readers",
    params(ReadersParams),
    security(("bearer" = ["admin"])),
    responses(
        (status = 200, description = "The head, and a page of the readers with each one's cursor and lag", body = FeedReaders),
        (status = 400, description = "A query parameter is wrong", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The key lacks admin", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn feed_readers(
    _caller: Authorized<Admin>,
    State(state): State<ApiState>,
    Query(params): Query<ReadersParams>,
) -> Result<axum::Json<FeedReaders>, Problem> {
    let cursors = IdCursors::new(READERS, state.database_id().await?, &());
    let after = match params.cursor.as_deref() {
        Some(cursor) => {
            let key = cursors.decode_key(cursor)?;
            Some(ops::place_of(&key).ok_or_else(|| cursors.refused())?)
        }
        None => None,
    };
    let retention = state.settings.changes.retention;
    let limit = params.limit.unwrap_or(DEFAULT_LIMIT);
    let found = ops::readers(state.db.main(), retention, after, limit).await?;
    Ok(axum::Json(FeedReaders {
        head: found.head.to_string(),
        feed_start: FeedStart {
            cursor: found.feed_start.cursor.to_string(),
            first_committed_at: found.feed_start.first_committed_at,
        },
        readers: found.readers,
        next: found
            .next
            .map(|place| cursors.encode_key(&ops::place_key(place))),
    }))
}
