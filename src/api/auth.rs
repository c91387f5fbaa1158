//! Who is asking: the bearer key of every `/v1` request but the document, checked against
//! its row on each request, and the audit row of every write request.

use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};

use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;

use super::problem::Problem;
use super::state::ApiState;
use crate::ops::api_keys::{self, Admission, AuditEntry, KeyError, Scope};

/// A scope a route needs, as a type, so that a handler states it in its signature.
pub(crate) trait Needs {
    const SCOPE: Scope;
}

pub(crate) struct ConnectionsRead;
impl Needs for ConnectionsRead {
    const SCOPE: Scope = Scope::ConnectionsRead;
}

pub(crate) struct ConnectionsWrite;
impl Needs for ConnectionsWrite {
    const SCOPE: Scope = Scope::ConnectionsWrite;
}

pub(crate) struct SyncsWrite;
impl Needs for SyncsWrite {
    const SCOPE: Scope = Scope::SyncsWrite;
}

pub(crate) struct RecordsRead;
impl Needs for RecordsRead {
    const SCOPE: Scope = Scope::RecordsRead;
}

pub(crate) struct NotificationsRead;
impl Needs for NotificationsRead {
    const SCOPE: Scope = Scope::NotificationsRead;
}

pub(crate) struct NotificationsWrite;
impl Needs for NotificationsWrite {
    const SCOPE: Scope = Scope::NotificationsWrite;
}

pub(crate) struct WebhooksRead;
impl Needs for WebhooksRead {
    const SCOPE: Scope = Scope::WebhooksRead;
}

pub(crate) struct Admin;
impl Needs for Admin {
    const SCOPE: Scope = Scope::Admin;
}

/// The caller, whose key grants `N`'s scope. Missing, malformed, unknown and revoked keys
/// are 401 with a bearer challenge, a key past its `[api] rate_limit` 429 with
/// `Retry-After`, a key without the scope 403. Taken first in a handler's arguments, so
/// that nothing else is read for a refused caller.
pub(crate) struct Authorized<N> {
    needs: PhantomData<N>,
    /// The key's `api_keys.id`.
    pub(crate) key_id: i64,
}

impl<N: Needs> FromRequestParts<ApiState> for Authorized<N> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, Problem> {
        let Some(value) = parts.headers.get(header::AUTHORIZATION) else {
            return Err(Problem::unauthorized(
                "send the API key as Authorization: Bearer <key>",
            ));
        };
        let token = value
            .to_str()
            .ok()
            .and_then(|value| value.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim())
            .ok_or_else(|| {
                Problem::unauthorized("the Authorization header is not `Bearer <key>`")
            })?;
        let caller = match api_keys::authenticate(state.db.main(), token).await {
            Ok(caller) => caller,
            Err(KeyError::Database(error)) => {
                tracing::error!(%error, "Checking an API key failed.");
                return Err(Problem::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the key could not be checked; try again",
                ));
            }
            Err(refused) => return Err(Problem::unauthorized(refused.to_string())),
        };
        if let Some(slot) = parts.extensions.get::<AuditSlot>() {
            let _ = slot.0.set(caller.key_id);
        }
        if let Some(api) = &state.settings.api {
            let window = caller.rate_limit.as_ref().unwrap_or(&api.rate_limit);
            match api_keys::admit(state.db.main(), caller.key_id, window).await {
                Ok(Admission::Admitted) => {}
                Ok(Admission::Limited { retry_after }) => {
                    return Err(Problem::rate_limited(
                        retry_after,
                        format!(
                            "the key {:?} made its {} requests of this {}-second window ([api] rate_limit); retry after {retry_after} s",
                            caller.name,
                            window.requests,
                            window.per.as_secs()
                        ),
                    ));
                }
                Err(error) => {
                    tracing::error!(%error, "Counting an API request against its key's rate limit failed.");
                    return Err(Problem::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "the request could not be counted; try again",
                    ));
                }
            }
        }
        if !caller.allows(N::SCOPE) {
            return Err(Problem::new(
                StatusCode::FORBIDDEN,
                format!("the key {:?} lacks the scope {}", caller.name, N::SCOPE),
            ));
        }
        Ok(Authorized {
            needs: PhantomData,
            key_id: caller.key_id,
        })
    }
}

/// Where [`Authorized`] leaves the key's id for the audit row.
#[derive(Clone, Default)]
struct AuditSlot(Arc<OnceLock<i64>>);

/// Writes an `api_audit` row for every request that is not a read (GET, HEAD, OPTIONS),
/// with its final status, whether it was served or refused.
pub(crate) async fn audit_writes(
    State(state): State<ApiState>,
    mut request: Request,
    next: Next,
) -> Response {
    if matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    ) {
        return next.run(request).await;
    }
    let slot = AuditSlot::default();
    request.extensions_mut().insert(slot.clone());
    let method = request.method().to_string();
    // The path only: a query string could carry anything, a key included. A Connect
    // link's token, a credential, is left out.
    let path = redacted_path(request.uri().path());
    let response = next.run(request).await;
    let entry = AuditEntry {
        key_id: slot.0.get().copied(),
        method: &method,
        path: &path,
        status: response.status().as_u16(),
    };
    if let Err(error) = api_keys::audit(state.db.main(), entry).await {
        tracing::error!(%error, method, path, "Writing the audit row of an API request failed.");
    }
    response
}

/// `path` with a Connect link's token (`/connect/{token}/...`) replaced by `{token}`.
pub(crate) fn redacted_path(path: &str) -> String {
    match path.strip_prefix("/connect/") {
        Some(rest) => match rest.split_once('/') {
            Some((_, after)) => format!("/connect/{{token}}/{after}"),
            None => "/connect/{token}".to_string(),
        },
        None => path.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_connect_links_token_never_reaches_the_audit() {
        assert_eq!(
            super::redacted_path("/connect/abcDEF_123/stripe"),
            "/connect/{token}/stripe"
        );
        assert_eq!(super::redacted_path("/connect/abc"), "/connect/{token}");
        assert_eq!(super::redacted_path("/v1/connections"), "/v1/connections");
    }
}
