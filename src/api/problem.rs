//! Errors as RFC 9457 problem details (`application/problem+json`): every answer of 400
//! or more, whether a handler, an extractor, a tower layer or the router made it.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::ops::OpsError;

/// The media type of a problem.
pub(crate) const PROBLEM_JSON: &str = "application/problem+json";
/// The longest body of a plain error answer that is kept as a problem's `detail`.
const MAX_DETAIL_BYTES: usize = 4096;

/// A problem detail (RFC 9457).
#[derive(Clone, Debug, Serialize, ToSchema)]
pub(crate) struct Problem {
    /// What kind of problem, as a URN: `urn:tributary:problem:not-found`.
    #[serde(rename = "type")]
    pub kind: String,
    /// A short summary of the kind.
    pub title: String,
    /// The HTTP status.
    pub status: u16,
    /// What went wrong this time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The query parameter or body field that was wrong, when one was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// Set on 401: the `WWW-Authenticate` challenge to send.
    #[serde(skip)]
    challenge: Option<&'static str>,
    /// Set on 429: the `Retry-After` to send, in seconds (small, so that a `Result` of a
    /// problem stays small).
    #[serde(skip)]
    retry_after: Option<std::num::NonZeroU32>,
}

impl Problem {
    pub(crate) fn new(status: StatusCode, detail: impl Into<String>) -> Problem {
        let detail = detail.into();
        Problem {
            kind: format!("urn:tributary:problem:{}", slug(status)),
            title: status.canonical_reason().unwrap_or("Error").to_string(),
            status: status.as_u16(),
            detail: (!detail.is_empty()).then_some(detail),
            field: None,
            challenge: None,
            retry_after: None,
        }
    }

    /// 429, with `Retry-After` in seconds.
    pub(crate) fn rate_limited(retry_after: u64, detail: impl Into<String>) -> Problem {
        let mut problem = Problem::new(StatusCode::TOO_MANY_REQUESTS, detail);
        let seconds = u32::try_from(retry_after).unwrap_or(u32::MAX);
        problem.retry_after =
            Some(std::num::NonZeroU32::new(seconds).unwrap_or(std::num::NonZeroU32::MIN));
        problem
    }

    /// 400 naming the query parameter or body field that was wrong.
    pub(crate) fn invalid(field: impl Into<String>, detail: impl Into<String>) -> Problem {
        let field = field.into();
        let mut problem = Problem::new(StatusCode::BAD_REQUEST, detail);
        problem.kind = "urn:tributary:problem:invalid-input".to_string();
        problem.field = (!field.is_empty()).then_some(field);
        problem
    }

    /// 401, with the bearer challenge.
    pub(crate) fn unauthorized(detail: impl Into<String>) -> Problem {
        let mut problem = Problem::new(StatusCode::UNAUTHORIZED, detail);
        problem.challenge = Some("Bearer realm=\"tributary\"");
        problem
    }
}

/// The last part of a problem's type.
fn slug(status: StatusCode) -> &'static str {
    match status {
        StatusCode::BAD_REQUEST => "bad-request",
        StatusCode::UNAUTHORIZED => "unauthorized",
        StatusCode::FORBIDDEN => "forbidden",
        StatusCode::NOT_FOUND => "not-found",
        StatusCode::METHOD_NOT_ALLOWED => "method-not-allowed",
        StatusCode::REQUEST_TIMEOUT => "timeout",
        StatusCode::CONFLICT => "conflict",
        StatusCode::GONE => "gone",
        StatusCode::PAYLOAD_TOO_LARGE => "body-too-large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported-media-type",
        StatusCode::UNPROCESSABLE_ENTITY => "unprocessable",
        StatusCode::TOO_MANY_REQUESTS => "rate-limited",
        StatusCode::SERVICE_UNAVAILABLE => "unavailable",
        status if status.is_server_error() => "internal",
        _ => "error",
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&self).unwrap_or_default();
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(challenge) = self.challenge {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(challenge),
            );
        }
        if let Some(seconds) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds.get()));
        }
        response
    }
}

impl From<OpsError> for Problem {
    fn from(error: OpsError) -> Problem {
        match error {
            OpsError::NotFound { what, .. } => {
                Problem::new(StatusCode::NOT_FOUND, format!("there is no {what}"))
            }
            OpsError::Invalid { field, message } => {
                // The operations page by row ids; the API calls the key `cursor`.
                let field = match field {
                    "after" | "before" => "cursor",
                    other => other,
                };
                Problem::invalid(field, format!("{field}: {message}"))
            }
            OpsError::Conflict(message) => Problem::new(StatusCode::CONFLICT, message),
            // The request is right; the daemon has no key to seal the tokens it carries.
            error if error.is_missing_key() => {
                let mut problem = Problem::new(StatusCode::CONFLICT, error.to_string());
                problem.field = Some("token".to_string());
                problem
            }
            // The run exists but cannot be replayed as things are now (its provider left
            // config.toml, its connection was removed): the caller's to resolve.
            OpsError::Replay(error) => Problem::new(StatusCode::CONFLICT, error.to_string()),
            error if error.needs_resync() => Problem::new(StatusCode::GONE, error.to_string()),
            error => {
                tracing::error!(%error, "An API request failed.");
                Problem::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the request failed on the server; its log says why",
                )
            }
        }
    }
}

/// Turns every error answer that is not yet a problem (the router's 404 and 405, the
/// body limit's 413, the timeout's 503, a rejection's text) into one, keeping its status
/// and headers and its text as the detail.
pub(crate) async fn problems_everywhere(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(PROBLEM_JSON.as_bytes()));
    // The Connect page answers its errors as pages for a person.
    let is_page = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"text/html"));
    if !(status.is_client_error() || status.is_server_error()) || is_problem || is_page {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, MAX_DETAIL_BYTES)
        .await
        .ok()
        .map(|bytes| String::from_utf8_lossy(&bytes).trim().to_string())
        .unwrap_or_default();
    let detail = match (status, text.is_empty()) {
        (_, false) => text,
        (StatusCode::NOT_FOUND, true) => "no such route; the routes are in /v1/openapi.json".into(),
        (StatusCode::METHOD_NOT_ALLOWED, true) => {
            "the route does not take this method; `Allow` lists those it takes".into()
        }
        (StatusCode::PAYLOAD_TOO_LARGE, true) => {
            "the request body is larger than [api] max_body_bytes".into()
        }
        (StatusCode::SERVICE_UNAVAILABLE | StatusCode::REQUEST_TIMEOUT, true) => {
            "the request took longer than [api] request_timeout".into()
        }
        (_, true) => String::new(),
    };
    let problem = Problem::new(status, detail);
    parts.headers.remove(header::CONTENT_LENGTH);
    parts
        .headers
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    let body = serde_json::to_vec(&problem).unwrap_or_default();
    Response::from_parts(parts, Body::from(body))
}
