//! Reading a request: query strings and JSON bodies refused with the field named, and
//! the opaque cursors of paged lists.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use base64::Engine;
use serde::de::DeserializeOwned;

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

/// The opaque cursor of a list: the operation's row id, with the list's name, in
/// base64url, so that a cursor of one list is refused by another.
pub(crate) fn encode_cursor(list: &str, id: i64) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{list}:{id}"))
}

/// The row id in a cursor `encode_cursor(list, ..)` made; anything else is a 400.
pub(crate) fn decode_cursor(list: &str, cursor: &str) -> Result<i64, Problem> {
    let refused = || {
        Problem::invalid(
            "cursor",
            format!("cursor: not a cursor of this list; pass the `next` of a page of {list}"),
        )
    };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(cursor)
        .map_err(|_| refused())?;
    let text = String::from_utf8(bytes).map_err(|_| refused())?;
    let (name, id) = text.split_once(':').ok_or_else(refused)?;
    if name != list {
        return Err(refused());
    }
    id.parse::<i64>()
        .ok()
        .filter(|id| *id > 0)
        .ok_or_else(refused)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_decodes_in_its_own_list_only() {
        let cursor = encode_cursor("runs", 42);
        assert_eq!(decode_cursor("runs", &cursor).ok(), Some(42));
        assert!(decode_cursor("connections", &cursor).is_err());
        for bad in ["", "!!", "cnVuczp4", "cnVuczotMQ"] {
            let problem = decode_cursor("runs", bad).unwrap_err();
            assert_eq!(problem.field.as_deref(), Some("cursor"), "{bad}");
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
