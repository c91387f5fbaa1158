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
use crate::ops::api_keys::{self, AuditEntry, KeyError, Scope};

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

/// The caller, whose key grants `N`'s scope. Missing, malformed, unknown and revoked keys
/// are 401 with a bearer challenge, a key without the scope 403. Taken first in a
/// handler's arguments, so that nothing else is read for a refused caller.
pub(crate) struct Authorized<N> {
    needs: PhantomData<N>,
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
        if !caller.allows(N::SCOPE) {
            return Err(Problem::new(
                StatusCode::FORBIDDEN,
                format!("the key {:?} lacks the scope {}", caller.name, N::SCOPE),
            ));
        }
        Ok(Authorized { needs: PhantomData })
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
    // The path only: a query string could carry anything, a key included.
    let path = request.uri().path().to_string();
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
