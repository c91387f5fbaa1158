//! Reading a request: query strings and JSON bodies refused with the field named, and
//! the opaque cursors of paged lists.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use base64::Engine;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

use super::problem::Problem;

/// A query string read into `T`; a bad or unknown parameter is a 400 naming it.
pub(crate) struct Query<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Problem> {
        let query = parts.uri.query().unwrap_or_default();
        // PostgreSQL's text cannot hold NUL: a filter with one would fail there as a 500.
        if let Some((name, _)) =
            form_urlencoded::parse(query.as_bytes()).find(|(_, value)| value.contains('\0'))
        {
            let name = tributary_providers::quote::truncated(&name, 64);
            return Err(Problem::invalid(
                name.clone(),
                format!("query parameter {name}: must not contain NUL"),
            ));
        }
        // No parameter means anything empty; serde_html_form would read `limit=` as none.
        if let Some((name, _)) =
            form_urlencoded::parse(query.as_bytes()).find(|(_, value)| value.is_empty())
        {
            let name = tributary_providers::quote::truncated(&name, 64);
            return Err(Problem::invalid(
                name.clone(),
                format!("query parameter {name}: must not be empty; leave it out instead"),
            ));
        }
        // Repeated parameters (`external_id=a&external_id=b`) fill a list.
        let deserializer = serde_html_form::Deserializer::from_bytes(query.as_bytes());
        serde_path_to_error::deserialize(deserializer)
            .map(Query)
            .map_err(|error| {
                let path = error.path().to_string();
                // A repeated parameter's path has the index (`last_action[1]`): the detail
                // keeps it, the field is the parameter.
                let field = field_of(
                    path.split('[').next().unwrap_or_default(),
                    &error.inner().to_string(),
                );
                let shown = match path.as_str() {
                    "." => field.clone(),
                    _ => tributary_providers::quote::truncated(&path, 64),
                };
                Problem::invalid(field, format!("query parameter {shown}: {}", error.inner()))
            })
    }
}

/// A JSON body read into `T`; malformed JSON, a wrong type or an unknown field is a 400
/// naming the field, a body over the limit a 413.
pub(crate) struct Json<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Json<T> {
    type Rejection = Problem;

    async fn from_request(request: Request, state: &S) -> Result<Self, Problem> {
        let json = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| {
                let essence = value.split(';').next().unwrap_or_default().trim();
                essence.eq_ignore_ascii_case("application/json")
            });
        if !json {
            return Err(Problem::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "send the body as Content-Type: application/json",
            ));
        }
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(|rejection| Problem::new(rejection.status(), rejection.body_text()))?;
        // serde reads a struct from an array too (`[null]` as its fields in order); every
        // body of this API is an object.
        if bytes.trim_ascii_start().first() != Some(&b'{') {
            return Err(Problem::invalid("", "the body must be a JSON object"));
        }
        let mut deserializer = serde_json::Deserializer::from_slice(&bytes);
        serde_path_to_error::deserialize(&mut deserializer)
            .map(Json)
            .map_err(|error| {
                let field = field_of(&error.path().to_string(), &error.inner().to_string());
                let detail = match field.is_empty() {
                    true => format!("the body is not valid: {}", error.inner()),
                    false => format!("body field {field}: {}", error.inner()),
                };
                Problem::invalid(field, detail)
            })
    }
}

/// The field an error is about: its path, or when the path is the whole input, the name
/// an unknown-field message quotes.
fn field_of(path: &str, message: &str) -> String {
    if path != "." {
        return tributary_providers::quote::truncated(path, 64);
    }
    message
        .strip_prefix("unknown field `")
        .or_else(|| message.strip_prefix("missing field `"))
        .and_then(|rest| rest.split_once('`'))
        .map(|(name, _)| tributary_providers::quote::truncated(name, 64))
        .unwrap_or_default()
}

/// What an id cursor's check covers besides the id, so that a cursor of these ids is
/// never read as one of `records`' positions.
const CURSOR_TAG: &str = "ids.v1";
/// The check's length in hex: 64 bits, enough that an edit passes by luck once in 2^64.
const CHECK_HEX: usize = 16;

/// The opaque cursors of a list paged by row id, bound to the list, the database that
/// issued them and the list's filters: a cursor edited by hand, of other filters, of
/// another list or from another database is a 400 naming `cursor`.
pub(crate) struct IdCursors {
    list: &'static str,
    database: String,
    filters: String,
}

impl IdCursors {
    /// The cursors of `list` on `database` (`ApiState::database_id`) under `filters`,
    /// every query parameter but `cursor` and `limit`.
    pub(crate) fn new(
        list: &'static str,
        database: String,
        filters: &impl std::fmt::Debug,
    ) -> Self {
        IdCursors {
            list,
            database,
            filters: format!("{filters:?}"),
        }
    }

    /// The check over an id, its list, its database and its filters.
    fn check(&self, id: &str) -> String {
        let mut hash = Sha256::new();
        for part in [CURSOR_TAG, self.list, &self.database, &self.filters, id] {
            hash.update(part.as_bytes());
            hash.update([0]);
        }
        let mut hex = const_hex::encode(hash.finalize());
        hex.truncate(CHECK_HEX);
        hex
    }

    /// The cursor of the page after (or before) the row `id`.
    pub(crate) fn encode(&self, id: i64) -> String {
        self.encode_key(&id.to_string())
    }

    /// The cursor of the page after the row whose sort key is `key`.
    pub(crate) fn encode_key(&self, key: &str) -> String {
        let text = format!("{}.{key}.{}", self.list, self.check(key));
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text)
    }

    /// The row id in `cursor`, if given, when [`IdCursors::encode`] made it with this
    /// list, database and filters.
    pub(crate) fn decode(&self, cursor: Option<&str>) -> Result<Option<i64>, Problem> {
        cursor.map(|cursor| self.decode_one(cursor)).transpose()
    }

    fn decode_one(&self, cursor: &str) -> Result<i64, Problem> {
        let key = self.decode_key(cursor)?;
        key.parse::<i64>()
            .ok()
            .filter(|id| *id > 0)
            .ok_or_else(|| self.refused())
    }

    /// The sort key in `cursor` when [`IdCursors::encode_key`] made it with this list,
    /// database and filters.
    pub(crate) fn decode_key(&self, cursor: &str) -> Result<String, Problem> {
        let refused = || self.refused();
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(cursor)
            .map_err(|_| refused())?;
        let text = String::from_utf8(bytes).map_err(|_| refused())?;
        let rest = text
            .strip_prefix(self.list)
            .and_then(|rest| rest.strip_prefix('.'))
            .ok_or_else(refused)?;
        let (key, checked) = rest.rsplit_once('.').ok_or_else(refused)?;
        if checked != self.check(key) {
            return Err(refused());
        }
        Ok(key.to_string())
    }

    pub(crate) fn refused(&self) -> Problem {
        Problem::invalid(
            "cursor",
            format!(
                "cursor: not a cursor of {} with these filters from this server; pass the \
                 `next` of the page before unchanged, with the same filters, or leave cursor \
                 out to start again at the first page",
                self.list
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(database: &str, provider: Option<&str>) -> IdCursors {
        IdCursors::new("runs", database.to_string(), &(provider, None::<String>))
    }

    fn refused(cursors: &IdCursors, cursor: &str) -> bool {
        cursors.decode(Some(cursor)).is_err_and(|problem| {
            problem.field.as_deref() == Some("cursor")
                && problem
                    .detail
                    .as_deref()
                    .is_some_and(|detail| detail.contains("leave cursor out"))
        })
    }

    #[test]
    fn a_cursor_decodes_with_its_list_database_and_filters_only() {
        let cursors = runs("db-1", Some("acme"));
        let cursor = cursors.encode(42);
        assert_eq!(cursors.decode(Some(&cursor)).ok(), Some(Some(42)));
        assert_eq!(cursors.decode(None).ok(), Some(None));
        // The same list, database and filters read afresh, as the next request does.
        assert_eq!(
            runs("db-1", Some("acme")).decode(Some(&cursor)).ok(),
            Some(Some(42))
        );
    }

    #[test]
    fn a_cursor_of_other_filters_another_database_or_another_list_is_refused() {
        let cursor = runs("db-1", Some("acme")).encode(42);
        assert!(refused(&runs("db-1", Some("other")), &cursor));
        assert!(refused(&runs("db-1", None), &cursor));
        assert!(refused(&runs("db-2", Some("acme")), &cursor));
        let connections = IdCursors::new(
            "connections",
            "db-1".into(),
            &(Some("acme"), None::<String>),
        );
        assert!(refused(&connections, &cursor));
    }

    #[test]
    fn a_cursor_edited_by_hand_is_refused() {
        let cursors = runs("db-1", Some("acme"));
        let cursor = cursors.encode(5);
        let text = String::from_utf8(
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(&cursor)
                .expect("base64url"),
        )
        .expect("text");
        let encode = |text: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text);
        let (_, check) = text.rsplit_once('.').expect("a check");
        let edited = [
            text.replacen(".5.", ".6.", 1),
            text.replacen("runs.", "connections.", 1),
            format!("runs.5.{}", "0".repeat(CHECK_HEX)),
            format!("runs.5.{}", &check[1..]),
            "runs:5".into(),
            format!("runs.-1.{check}"),
            "runs.5".into(),
        ];
        for edited in &edited {
            assert!(refused(&cursors, &encode(edited)), "{edited}");
        }
        // The old plain form of a cursor, and what is not base64url or not text.
        for bad in ["", "!!", "cnVuczp4", "cnVuczotMQ", "cnVuczo1", "_w"] {
            assert!(refused(&cursors, bad), "{bad}");
        }
    }

    #[test]
    fn an_unknown_field_is_named_from_the_message() {
        assert_eq!(
            field_of(".", "unknown field `limt`, expected one of `limit`"),
            "limt"
        );
        assert_eq!(field_of("limit", "invalid digit found in string"), "limit");
        assert_eq!(field_of(".", "missing field `records`"), "records");
        assert_eq!(field_of(".", "EOF while parsing"), "");
    }
}
