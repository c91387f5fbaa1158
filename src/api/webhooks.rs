//! `POST /webhooks/{provider}`: a provider's webhook, outside `/v1` and without an API
//! key, since the signature is the authentication. The body is read up to the provider's
//! `max_body_bytes`, then `ops::webhooks` verifies it over those bytes and keeps it in the
//! inbox before it is answered (docs/decisions/inbound-webhooks.md).

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use tower_http::timeout::TimeoutLayer;
use utoipa::{IntoParams, ToSchema};

use super::problem::Problem;
use super::state::ApiState;
use crate::ops::webhooks::{self, Handshake, Headers, Inbound, Refusal, WebhookError};

/// A delivery kept in the inbox, now or before.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct WebhookReceipt {
    /// `accepted` when it was stored now, `duplicate` when its id was stored before.
    pub status: &'static str,
    /// The provider's id of the delivery.
    pub delivery_id: String,
}

/// Strava's subscription handshake, as its query names it.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct HandshakeQuery {
    /// Always `subscribe`.
    #[serde(rename = "hub.mode")]
    #[param(rename = "hub.mode")]
    mode: Option<String>,
    /// The text to echo.
    #[serde(rename = "hub.challenge")]
    #[param(rename = "hub.challenge")]
    challenge: Option<String>,
    /// The verify token given when the subscription was created: the provider's secret.
    #[serde(rename = "hub.verify_token")]
    #[param(rename = "hub.verify_token")]
    verify_token: Option<String>,
}

/// The challenge echoed, as Strava expects it.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct HandshakeAnswer {
    #[serde(rename = "hub.challenge")]
    #[schema(rename = "hub.challenge")]
    challenge: String,
}

/// Answers Strava's subscription handshake: the challenge is echoed only for the
/// configured verify token.
#[utoipa::path(
    get,
    path = "/webhooks/{provider}",
    params(("provider" = String, Path, description = "The provider's name in config.toml; it needs a `webhooks` table with `scheme = \"strava\"`"), HandshakeQuery),
    responses(
        (status = 200, description = "The verify token matched: the challenge echoed", body = HandshakeAnswer),
        (status = 400, description = "`hub.mode` is not `subscribe` or `hub.challenge` is missing", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "`hub.verify_token` is missing or not the configured one", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No provider of that name answers Strava's handshake", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn handshake(
    State(state): State<ApiState>,
    Path(provider): Path<String>,
    Query(query): Query<HandshakeQuery>,
) -> Result<Json<HandshakeAnswer>, Problem> {
    let handshake = Handshake {
        provider: &provider,
        mode: query.mode.as_deref(),
        challenge: query.challenge.as_deref(),
        verify_token: query.verify_token.as_deref(),
    };
    match webhooks::handshake(&state.settings, &state.webhook_secrets, &handshake) {
        Ok(challenge) => {
            tracing::info!(provider, "A webhook subscription handshake was answered.");
            Ok(Json(HandshakeAnswer { challenge }))
        }
        Err(WebhookError::Refused(refusal)) => {
            // Never the token: only which check failed.
            tracing::warn!(provider, reason = %refusal, "A webhook subscription handshake was refused.");
            Err(Problem::new(StatusCode::FORBIDDEN, refusal.to_string()))
        }
        Err(WebhookError::Malformed(message)) => {
            Err(Problem::new(StatusCode::BAD_REQUEST, message))
        }
        Err(_) => Err(Problem::new(
            StatusCode::NOT_FOUND,
            "no provider of that name receives webhooks with scheme = \"strava\"",
        )),
    }
}

/// The webhook routes with their own layers: the problems and the request timeout, but
/// neither the API's body limit (each provider has its own) nor the audit of key holders'
/// writes.
pub(crate) fn router(request_timeout: Duration, state: ApiState) -> Router {
    Router::new()
        .route("/webhooks/{provider}", post(receive).get(handshake))
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(TimeoutLayer::with_status_code(
            StatusCode::SERVICE_UNAVAILABLE,
            request_timeout,
        ))
        .layer(axum::middleware::from_fn(
            super::problem::problems_everywhere,
        ))
        .with_state(state)
}

/// Receives a provider's webhook: verified over the raw body, kept once per delivery id.
#[utoipa::path(
    post,
    path = "/webhooks/{provider}",
    params(("provider" = String, Path, description = "The provider's name in config.toml; it needs a `webhooks` table")),
    request_body(content = String, content_type = "application/json", description = "The provider's delivery, signed as its `scheme` says"),
    responses(
        (status = 200, description = "Verified and kept (or kept before: a replay writes nothing)", body = WebhookReceipt),
        (status = 400, description = "Verified, but the body is not JSON or names no delivery id", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "The signature is missing, wrong, or older than the tolerance", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No provider of that name receives webhooks", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "The body is larger than the provider's `max_body_bytes`", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Past the provider's `rate_limit`: nothing was kept; retry after `Retry-After` seconds", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn receive(
    State(state): State<ApiState>,
    Path(provider): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<WebhookReceipt>, Problem> {
    let not_found = || {
        Problem::new(
            StatusCode::NOT_FOUND,
            "no provider of that name receives webhooks",
        )
    };
    let max_body_bytes = state
        .settings
        .providers
        .get(&provider)
        .and_then(|settings| settings.webhooks.as_ref())
        .ok_or_else(not_found)?
        .max_body_bytes;
    let too_large = || {
        webhooks::record_outcome(&provider, "too_large");
        Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the body is larger than providers.{provider}.webhooks.max_body_bytes ({max_body_bytes} bytes)"
            ),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|text| text.parse::<u64>().ok());
    if declared.is_some_and(|length| length > u64::try_from(max_body_bytes).unwrap_or(u64::MAX)) {
        return Err(too_large());
    }
    let body = axum::body::to_bytes(body, max_body_bytes)
        .await
        .map_err(|_| too_large())?;
    // The first value of a repeated header; names are lower case already.
    let headers: Headers = headers
        .keys()
        .filter_map(|name| {
            let value = headers.get(name)?.to_str().ok()?;
            Some((name.as_str().to_string(), value.to_string()))
        })
        .collect();
    let inbound = Inbound {
        provider: &provider,
        headers: &headers,
        body: &body,
    };
    match webhooks::receive(
        state.db.main(),
        &state.settings,
        &state.webhook_secrets,
        inbound,
    )
    .await
    {
        Ok(received) => {
            tracing::info!(
                provider,
                delivery_id = received.delivery_id,
                status = received.status,
                "A webhook delivery was received."
            );
            Ok(Json(WebhookReceipt {
                status: received.status,
                delivery_id: received.delivery_id,
            }))
        }
        Err(WebhookError::UnknownProvider(_)) => Err(not_found()),
        Err(WebhookError::Refused(refusal)) => {
            // Neither the body nor the signature: only which check failed.
            tracing::warn!(provider, reason = %refusal, "A webhook delivery was refused.");
            let detail = match &refusal {
                Refusal::Stale { tolerance } => format!(
                    "{refusal} (the tolerance is {} seconds); a replayed delivery is refused",
                    tolerance.as_secs()
                ),
                _ => refusal.to_string(),
            };
            Err(Problem::new(StatusCode::UNAUTHORIZED, detail))
        }
        Err(WebhookError::Malformed(message)) => {
            tracing::warn!(
                provider,
                reason = message,
                "A verified webhook delivery was malformed."
            );
            Err(Problem::invalid("body", message))
        }
        Err(error @ WebhookError::Limited { retry_after, .. }) => {
            tracing::warn!(
                provider,
                retry_after,
                "A webhook delivery was past its provider's rate limit."
            );
            Err(Problem::rate_limited(retry_after, error.to_string()))
        }
        Err(WebhookError::Interrupted) => Err(Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the delivery could not be checked; it is not kept, so send it again",
        )),
        Err(WebhookError::Database(error)) => {
            tracing::error!(provider, %error, "Storing a webhook delivery failed.");
            Err(Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the delivery could not be stored; it is not kept, so send it again",
            ))
        }
    }
}
