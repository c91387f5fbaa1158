//! Refreshing a connection's Strava access token: `POST {oauth_url}/oauth/token` with
//! `grant_type=refresh_token`, as Strava's authentication documentation describes.
//!
//! Strava rotates refresh tokens: the answer's `refresh_token` replaces the one spent. The
//! pipeline's [`crate::CredentialStore`] commits the new pair before it is used.

use chrono::{DateTime, Utc};
use reqwest::header::{HeaderMap, HeaderValue, ACCEPT};
use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;
use url::Url;

use super::limits::Clock;
use crate::http::{cap_body, display_url, Answer, HttpClient, ResponsePolicy, Verdict};
use crate::{Credentials, FetchError, TokenRefresher};

/// Spends a connection's refresh token at Strava's token endpoint.
#[derive(Clone)]
pub(crate) struct OAuthClient {
    /// The provider's HTTP client.
    pub client: HttpClient,
    /// `{oauth_url}/oauth/token`.
    pub token_url: Url,
    /// The application's client id.
    pub client_id: String,
    /// The application's client secret, read from `client_secret_env`.
    pub client_secret: SecretString,
    /// Where "now" comes from, for `expires_in`.
    pub clock: Clock,
}

impl std::fmt::Debug for OAuthClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuthClient")
            .field("token_url", &display_url(&self.token_url))
            .field("client_id", &self.client_id)
            .field("client_secret", &self.client_secret)
            .finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl TokenRefresher for OAuthClient {
    async fn refresh(&self, current: &Credentials) -> Result<Credentials, FetchError> {
        let refresh_token = current
            .refresh_token
            .as_ref()
            .map(|token| token.expose_secret().trim())
            .filter(|token| !token.is_empty())
            .ok_or_else(|| FetchError::MissingCredentials {
                message: "the Strava access token has expired or was rejected, and the \
                          connection has no refresh token to renew it: connect the account \
                          again"
                    .to_string(),
            })?;
        let client_secret = self.client_secret.expose_secret();
        let form = [
            ("client_id", self.client_id.as_str()),
            ("client_secret", client_secret),
            ("grant_type", "refresh_token"),
            ("refresh_token", refresh_token),
        ];
        let mut headers = HeaderMap::new();
        headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
        let result = self
            .client
            .post_form_with(self.token_url.clone(), headers, &form, &TokenPolicy)
            .await
            .and_then(|response| {
                fresh_credentials(&response.url, response.value(), current, (self.clock)())
            });
        let result = result.map_err(|error| error.redact_secrets([client_secret, refresh_token]));
        match &result {
            Ok(_) => {
                tracing::info!(client_id = %self.client_id, "Refreshed a Strava access token.")
            }
            Err(error) => tracing::warn!(
                client_id = %self.client_id,
                %error,
                "Refreshing a Strava access token failed."
            ),
        }
        result
    }
}

/// The credentials in the token endpoint's answer `{"access_token", "refresh_token",
/// "expires_at", "expires_in", "token_type"}`. A missing `refresh_token` keeps the current
/// one; a missing `expires_at` is computed from `expires_in`.
fn fresh_credentials(
    url: &Url,
    body: Value,
    current: &Credentials,
    now: DateTime<Utc>,
) -> Result<Credentials, FetchError> {
    let text = |name: &str| {
        body.get(name)
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|text| !text.is_empty())
    };
    let shape = |message: &str| FetchError::Shape {
        url: display_url(url),
        message: format!("the token endpoint's answer {message}"),
        body: cap_body(without_secrets(&body).to_string().as_bytes()),
    };
    let access_token = text("access_token").ok_or_else(|| shape("has no access_token"))?;
    let refresh_token = match text("refresh_token") {
        Some(token) => Some(SecretString::from(token)),
        None => current.refresh_token.clone(),
    };
    let expires_at = expiry(
        body.get("expires_at").and_then(seconds),
        body.get("expires_in").and_then(seconds),
        now,
    )
    .unwrap_or_else(|| {
        // Refusing the answer would lose the refresh token it may have rotated; a token
        // that lives shorter than assumed costs one more refresh after its 401.
        tracing::warn!(
            assumed_secs = ASSUMED_TOKEN_LIFETIME_SECONDS,
            "The token endpoint's answer has neither expires_at nor expires_in; assuming a short lifetime."
        );
        now.timestamp().saturating_add(ASSUMED_TOKEN_LIFETIME_SECONDS)
    });
    Ok(Credentials {
        token: Some(SecretString::from(access_token)),
        refresh_token,
        expires_at: Some(expires_at),
    })
}

/// How long an access token is taken to live when the answer says nothing of it.
const ASSUMED_TOKEN_LIFETIME_SECONDS: i64 = 60 * 60;

/// The longest an access token is taken to live, whatever the token endpoint says.
const MAX_TOKEN_LIFETIME_SECONDS: i64 = 10 * 365 * 24 * 60 * 60;

/// A number of seconds however the endpoint writes it: an integer of any size (saturated
/// to `i64`), a finite float (truncated) or a string of digits. An answer that carries a
/// rotated refresh token must not be refused over the form of its expiry.
pub(crate) fn seconds(value: &Value) -> Option<i64> {
    match value {
        Value::Number(number) => number
            .as_i64()
            .or_else(|| number.as_u64().map(|_| i64::MAX))
            // A float-to-integer `as` saturates; NaN and infinities are not JSON numbers.
            .or_else(|| number.as_f64().filter(|f| f.is_finite()).map(|f| f as i64)),
        Value::String(text) => text.trim().parse().ok(),
        _ => None,
    }
}

/// When the new access token expires: `expires_at`, else `now` plus `expires_in`, either
/// kept between `now` (already expired: refreshed before its next use) and
/// [`MAX_TOKEN_LIFETIME_SECONDS`] from now, so no value the endpoint sends overflows.
pub(crate) fn expiry(
    expires_at: Option<i64>,
    expires_in: Option<i64>,
    now: DateTime<Utc>,
) -> Option<i64> {
    let now = now.timestamp();
    let latest = now.saturating_add(MAX_TOKEN_LIFETIME_SECONDS);
    let at = match (expires_at, expires_in) {
        (Some(at), _) => at,
        (None, Some(seconds)) => now.saturating_add(seconds),
        (None, None) => return None,
    };
    Some(at.clamp(now, latest))
}

/// The answer with its token values replaced, safe to keep in an error report.
fn without_secrets(body: &Value) -> Value {
    let mut clean = body.clone();
    if let Value::Object(map) = &mut clean {
        for name in ["access_token", "refresh_token"] {
            if let Some(value) = map.get_mut(name) {
                *value = Value::String("[redacted]".to_string());
            }
        }
    }
    clean
}

/// How the token endpoint's answers are read: a 400 or 401 means the refresh token (or the
/// client id or secret) was refused, which is a credentials fault, never retried.
struct TokenPolicy;

impl ResponsePolicy for TokenPolicy {
    fn classify(&self, answer: &Answer<'_>, default: Verdict) -> Verdict {
        let message = super::error_message(answer);
        match answer.status.as_u16() {
            status @ (400 | 401) => Verdict::Fail(FetchError::Unauthorized {
                status,
                message: format!("the Strava token endpoint refused the refresh: {message}"),
            }),
            _ => default.with_message(message),
        }
    }
}
