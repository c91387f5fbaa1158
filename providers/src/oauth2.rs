//! What the OAuth2 adapters share (RFC 6749): reading a token endpoint's answer (§5.1) and
//! its errors (§5.2), bounding the expiry it gives, and the refresh-token loop that renews a
//! connection's access token through the pipeline's [`CredentialStore`] before it expires
//! and once after a 401.
//!
//! Used by `strava` (its own token endpoint and error bodies) and by `rest`'s
//! `auth = { oauth2 = ... }`.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use reqwest::header::HeaderValue;
use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;
use url::Url;

use crate::http::{cap_body, display_url, Answer, ResponsePolicy, Verdict};
use crate::{CredentialStore, Credentials, FetchError, TokenRefresher};

/// `auth.client_auth`: how the client authenticates at the token endpoint (RFC 6749
/// §2.3.1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ClientAuth {
    /// `"post"`: `client_id` and `client_secret` as form fields (`client_secret_post`).
    #[default]
    Post,
    /// `"basic"`: `Authorization: Basic` with the form-encoded id and secret
    /// (`client_secret_basic`).
    Basic,
}

/// Refresh an access token that expires within this many seconds, so that a token is
/// never sent in its last minute (clocks drift, and a page may take a while to fetch).
pub(crate) const REFRESH_MARGIN_SECONDS: i64 = 60;

/// How long an access token is taken to live when the answer says nothing of it.
pub(crate) const ASSUMED_TOKEN_LIFETIME_SECONDS: i64 = 60 * 60;

/// The shortest an access token is taken to live: an answer that gives none (`expires_in`
/// of 0 or less, an `expires_at` already past) would otherwise have a token fetched before
/// every page. Twice the refresh margin, so a token serves for a minute before the margin
/// asks for the next; a token the API refuses sooner is replaced after its 401.
pub(crate) const MIN_TOKEN_LIFETIME_SECONDS: i64 = 2 * REFRESH_MARGIN_SECONDS;

/// The longest an access token is taken to live, whatever the token endpoint says.
pub(crate) const MAX_TOKEN_LIFETIME_SECONDS: i64 = 10 * 365 * 24 * 60 * 60;

/// The longest token accepted from a token endpoint: large JWTs run to a few KiB.
pub(crate) const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// What a token endpoint's successful answer grants (RFC 6749 §5.1).
pub(crate) struct TokenAnswer {
    /// `access_token`.
    pub access_token: SecretString,
    /// `refresh_token`, when the endpoint issued (or rotated) one.
    pub refresh_token: Option<SecretString>,
    /// When the access token expires, in seconds since the Unix epoch: `expires_at` (an
    /// extension some APIs send, e.g. Strava), else now plus `expires_in`, else now plus
    /// [`ASSUMED_TOKEN_LIFETIME_SECONDS`]; always between
    /// [`MIN_TOKEN_LIFETIME_SECONDS`] and [`MAX_TOKEN_LIFETIME_SECONDS`] from now.
    pub expires_at: i64,
    /// Whether the answer gave the token no lifetime, so that it was raised to
    /// [`MIN_TOKEN_LIFETIME_SECONDS`] ([`LifetimeWarning`] says so once).
    pub lifetime_floored: bool,
}

/// Warns once per token endpoint that its answers give their tokens no lifetime: every
/// answer would otherwise log it, as often as a page is fetched.
#[derive(Debug, Default)]
pub(crate) struct LifetimeWarning(AtomicBool);

impl LifetimeWarning {
    /// Warns, the first time only, when `answer`'s lifetime was floored.
    pub(crate) fn note(&self, answer: &TokenAnswer, token_url: &Url) {
        if answer.lifetime_floored && !self.0.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                token_url = %display_url(token_url),
                floor_secs = MIN_TOKEN_LIFETIME_SECONDS,
                "The token endpoint gives its access tokens no lifetime (expires_in of 0 or less, or an expires_at already past); taking each to live the floor. Said once for this endpoint."
            );
        }
    }
}

impl TokenAnswer {
    /// Reads `{"access_token", "token_type", "expires_in", "refresh_token"}`. The access
    /// token must be present, at most [`MAX_TOKEN_BYTES`] of visible ASCII (it travels in a
    /// header), and of `token_type` bearer when the type is given. An answer without an
    /// expiry is taken to live [`ASSUMED_TOKEN_LIFETIME_SECONDS`]: refusing it would lose a
    /// refresh token it may have rotated.
    pub(crate) fn read(
        url: &Url,
        body: &Value,
        now: DateTime<Utc>,
    ) -> Result<TokenAnswer, FetchError> {
        let (access_token, refresh_token) = read_tokens(url, body)?;
        let expires_at_given = body.get("expires_at").and_then(seconds);
        let expires_in_given = body.get("expires_in").and_then(seconds);
        let lifetime_floored =
            lifetime(expires_at_given, expires_in_given, now).is_some_and(|secs| secs <= 0);
        let expires_at = expiry(expires_at_given, expires_in_given, now)
        .unwrap_or_else(|| {
            tracing::warn!(
                assumed_secs = ASSUMED_TOKEN_LIFETIME_SECONDS,
                "The token endpoint's answer has neither expires_at nor expires_in; assuming a short lifetime."
            );
            now.timestamp()
                .saturating_add(ASSUMED_TOKEN_LIFETIME_SECONDS)
        });
        Ok(TokenAnswer {
            access_token,
            refresh_token,
            expires_at,
            lifetime_floored,
        })
    }

    /// The connection's new credentials: a missing `refresh_token` keeps `current`'s.
    pub(crate) fn into_credentials(self, current: &Credentials) -> Credentials {
        Credentials {
            token: Some(self.access_token),
            refresh_token: self.refresh_token.or_else(|| current.refresh_token.clone()),
            expires_at: Some(self.expires_at),
        }
    }
}

/// The access token (bearer, at most [`MAX_TOKEN_BYTES`] of visible ASCII) and the refresh
/// token, if any, of a token endpoint's answer.
pub(crate) fn read_tokens(
    url: &Url,
    body: &Value,
) -> Result<(SecretString, Option<SecretString>), FetchError> {
    let shape = |message: String| shape_error(url, body, message);
    let access_token = read_token(url, body, "access_token")?
        .ok_or_else(|| shape("has no access_token".to_string()))?;
    match body.get("token_type") {
        None | Some(Value::Null) => {}
        Some(Value::String(kind)) if kind.trim().eq_ignore_ascii_case("bearer") => {}
        Some(other) => {
            let shown: String = other.to_string().chars().take(40).collect();
            return Err(shape(format!(
                "has token_type {shown}; only bearer tokens can be sent"
            )));
        }
    }
    Ok((access_token, read_token(url, body, "refresh_token")?))
}

/// The client secret from the environment variable `name` (config key `key`), when one
/// is named; an unset or empty variable is a [`FetchError::Client`] naming it.
pub(crate) fn client_secret_from_env(
    key: &str,
    name: Option<&str>,
) -> Result<Option<SecretString>, FetchError> {
    let Some(name) = name else {
        return Ok(None);
    };
    std::env::var(name)
        .ok()
        .map(|value| value.trim().to_string())
        .filter(|value| !value.is_empty())
        .map(|value| Some(SecretString::from(value)))
        .ok_or_else(|| FetchError::Client {
            message: format!(
                "{key}: the environment variable {name} is not set or empty; it must hold the \
                 OAuth2 client secret"
            ),
        })
}

/// `client_secret_basic` (RFC 6749 §2.3.1): the `Authorization` header, marked sensitive,
/// and its base64 credentials, for cleaning errors of them. Id and secret are
/// form-encoded before they are joined.
pub(crate) fn basic_client_auth(
    client_id: &str,
    client_secret: &str,
) -> Result<(HeaderValue, String), FetchError> {
    let encode =
        |text: &str| url::form_urlencoded::byte_serialize(text.as_bytes()).collect::<String>();
    let pair = format!("{}:{}", encode(client_id), encode(client_secret));
    let encoded = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, pair);
    let mut value =
        HeaderValue::from_str(&format!("Basic {encoded}")).map_err(|_| FetchError::Client {
            message: "auth.client_auth = \"basic\": the client credentials cannot be sent in a \
                      header"
                .to_string(),
        })?;
    value.set_sensitive(true);
    Ok((value, encoded))
}

/// The token endpoint's answer refused with `message`, its secrets redacted.
fn shape_error(url: &Url, body: &Value, message: String) -> FetchError {
    FetchError::Shape {
        url: display_url(url),
        message: format!("the token endpoint's answer {message}"),
        body: cap_body(without_secrets(body).to_string().as_bytes()),
    }
}

/// The token `name` of an answer, if it has one: at most [`MAX_TOKEN_BYTES`] of visible
/// ASCII, since it travels in a header or a form.
fn read_token(url: &Url, body: &Value, name: &str) -> Result<Option<SecretString>, FetchError> {
    let Some(text) = body
        .get(name)
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|text| !text.is_empty())
    else {
        return Ok(None);
    };
    let article = if name.starts_with('a') { "an" } else { "a" };
    if text.len() > MAX_TOKEN_BYTES {
        return Err(shape_error(
            url,
            body,
            format!("has {article} {name} longer than {MAX_TOKEN_BYTES} bytes"),
        ));
    }
    if !text.bytes().all(|byte| (0x20..=0x7e).contains(&byte)) {
        return Err(shape_error(
            url,
            body,
            format!("has {article} {name} with characters other than visible ASCII"),
        ));
    }
    Ok(Some(SecretString::from(text)))
}

/// The error of a refresh of `current` whose answer [`TokenAnswer::read`] refused with
/// `error`: when the answer still holds a valid refresh token other than `current`'s, the
/// endpoint rotated it and may have revoked the old one, so it is kept
/// ([`FetchError::RefusedWithRotation`]) with the current access token.
pub(crate) fn refused_refresh(
    error: FetchError,
    url: &Url,
    body: &Value,
    current: &Credentials,
) -> FetchError {
    let Ok(Some(rotated)) = read_token(url, body, "refresh_token") else {
        return error;
    };
    let unchanged = current
        .refresh_token
        .as_ref()
        .is_some_and(|old| old.expose_secret() == rotated.expose_secret());
    if unchanged {
        return error;
    }
    FetchError::RefusedWithRotation {
        error: Box::new(error),
        kept: Box::new(Credentials {
            token: current.token.clone(),
            refresh_token: Some(rotated),
            expires_at: current.expires_at,
        }),
    }
}

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

/// When the new access token expires: `expires_at`, else `now` plus `expires_in`. A
/// lifetime of 0 or less becomes [`MIN_TOKEN_LIFETIME_SECONDS`], and any is kept below
/// [`MAX_TOKEN_LIFETIME_SECONDS`] from now, so no value the endpoint sends overflows.
pub(crate) fn expiry(
    expires_at: Option<i64>,
    expires_in: Option<i64>,
    now: DateTime<Utc>,
) -> Option<i64> {
    let lifetime = lifetime(expires_at, expires_in, now)?;
    let lifetime = match lifetime {
        ..=0 => MIN_TOKEN_LIFETIME_SECONDS,
        secs => secs.min(MAX_TOKEN_LIFETIME_SECONDS),
    };
    Some(now.timestamp().saturating_add(lifetime))
}

/// The seconds the answer gives the token from `now` (saturating), if it gives any.
fn lifetime(expires_at: Option<i64>, expires_in: Option<i64>, now: DateTime<Utc>) -> Option<i64> {
    match (expires_at, expires_in) {
        (Some(at), _) => Some(at.saturating_sub(now.timestamp())),
        (None, Some(seconds)) => Some(seconds),
        (None, None) => None,
    }
}

/// The answer with its token values replaced, safe to keep in an error report.
pub(crate) fn without_secrets(body: &Value) -> Value {
    let mut clean = body.clone();
    if let Value::Object(map) = &mut clean {
        for name in ["access_token", "refresh_token", "id_token"] {
            if let Some(value) = map.get_mut(name) {
                *value = Value::String("[redacted]".to_string());
            }
        }
    }
    clean
}

/// How a standard token endpoint's answers are read (RFC 6749 §5.2): a 400 or 401 means
/// the grant or the client was refused, a credentials fault never retried, explained by
/// the body's `error` and `error_description`; other statuses keep the client's verdict.
pub(crate) struct TokenEndpointPolicy {
    /// What was asked for, for messages: e.g. "the refresh".
    pub what: &'static str,
}

impl ResponsePolicy for TokenEndpointPolicy {
    fn classify(&self, answer: &Answer<'_>, default: Verdict) -> Verdict {
        let message = token_error_message(answer);
        match answer.status.as_u16() {
            status @ (400 | 401) => Verdict::Fail(FetchError::Unauthorized {
                status,
                message: format!("the token endpoint refused {}: {message}", self.what),
            }),
            _ => default.with_message(message),
        }
    }
}

/// `error: error_description` from an RFC 6749 §5.2 error body, or the start of the body
/// when it is not one. Both values are cut short: they are the server's text.
fn token_error_message(answer: &Answer<'_>) -> String {
    let Some(body) = answer.json() else {
        return answer.excerpt();
    };
    let Some(code) = body.get("error").and_then(Value::as_str) else {
        return answer.excerpt();
    };
    let short = |text: &str| crate::quote::truncated(text.trim(), 200);
    match body.get("error_description").and_then(Value::as_str) {
        Some(description) if !description.trim().is_empty() => {
            format!("{}: {}", short(code), short(description))
        }
        _ => short(code),
    }
}

/// Checks that `name`, the value of the config key `key`, can name an environment
/// variable and does not look like the secret itself.
pub(crate) fn validate_env_var_name(key: &str, name: &str) -> Result<(), String> {
    if name.is_empty() || name.contains(['=', '\0']) || name.chars().any(char::is_whitespace) {
        return Err(format!(
            "{key} must be the name of an environment variable (e.g. \"ACME_CLIENT_SECRET\"), \
             not {name:?}"
        ));
    }
    // Client secrets are long runs of hexadecimal digits; variable names hardly ever are.
    if name.len() >= 32 && name.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!(
            "{key} looks like a client secret itself: it must name the environment variable \
             that holds the secret, never the secret"
        ));
    }
    Ok(())
}

/// Whether the credentials hold a refresh token to renew the access token with.
pub(crate) fn has_refresh_token(credentials: &Credentials) -> bool {
    credentials
        .refresh_token
        .as_ref()
        .is_some_and(|token| !token.expose_secret().trim().is_empty())
}

/// The refresh token `credentials` hold (trimmed: tokens pasted from files end in a
/// newline), or an error saying the `whose` access token cannot be renewed without one.
pub(crate) fn refresh_token_of<'c>(
    credentials: &'c Credentials,
    whose: &str,
) -> Result<&'c str, FetchError> {
    credentials
        .refresh_token
        .as_ref()
        .map(|token| token.expose_secret().trim())
        .filter(|token| !token.is_empty())
        .ok_or_else(|| FetchError::MissingCredentials {
            message: format!(
                "the {whose} access token has expired or was rejected, and the connection \
                 has no refresh token to renew it: connect the account again"
            ),
        })
}

/// Whether to refresh before using `credentials` at `now` (seconds since the epoch): the
/// token expires within [`REFRESH_MARGIN_SECONDS`], or is missing or of unknown expiry,
/// while a refresh token exists to renew it.
pub(crate) fn needs_refresh(credentials: &Credentials, now: i64) -> bool {
    if !has_refresh_token(credentials) {
        return false;
    }
    match (crate::adapter::token(credentials), credentials.expires_at) {
        (Some(_), Some(expires_at)) => expires_at <= now.saturating_add(REFRESH_MARGIN_SECONDS),
        _ => true,
    }
}

/// Adds the credentials' secrets to `seen`, so errors can be cleaned of them.
pub(crate) fn remember(seen: &mut Vec<SecretString>, credentials: &Credentials) {
    seen.extend(credentials.token.iter().cloned());
    seen.extend(credentials.refresh_token.iter().cloned());
}

/// How [`fetch_refreshing`] renews a connection's credentials.
pub(crate) struct Refreshing<'a> {
    /// The pipeline's store, which serialises refreshes per connection and commits the
    /// new credentials before handing them back.
    pub store: &'a dyn CredentialStore,
    /// Spends a refresh token at the API's token endpoint.
    pub refresher: Arc<dyn TokenRefresher>,
    /// Now, in seconds since the Unix epoch.
    pub now: i64,
    /// The API, for log lines: e.g. "Strava".
    pub api: &'a str,
}

/// Runs `fetch` with the connection's credentials, refreshing them first when they are
/// about to expire and once after a 401 (unless they were just refreshed). Every
/// credential seen is added to `seen`.
pub(crate) async fn fetch_refreshing<T, F, Fut>(
    refreshing: Refreshing<'_>,
    credentials: &Credentials,
    seen: &mut Vec<SecretString>,
    fetch: F,
) -> Result<T, FetchError>
where
    F: Fn(Credentials) -> Fut,
    Fut: Future<Output = Result<T, FetchError>>,
{
    let Refreshing {
        store,
        refresher,
        now,
        api,
    } = refreshing;
    let mut credentials = credentials.clone();
    let mut refreshed = false;
    if needs_refresh(&credentials, now) {
        tracing::info!(
            api,
            expires_at = credentials.expires_at,
            "The access token expires within a minute or has no known expiry; refreshing it first."
        );
        credentials = store.refresh(&credentials, refresher.clone()).await?;
        remember(seen, &credentials);
        refreshed = true;
    }
    match fetch(credentials.clone()).await {
        Err(FetchError::Unauthorized { status: 401, .. })
            if !refreshed && has_refresh_token(&credentials) =>
        {
            tracing::info!(
                api,
                "The API rejected the access token; refreshing it once and retrying."
            );
            let fresh = store.refresh(&credentials, refresher).await?;
            remember(seen, &fresh);
            fetch(fresh).await
        }
        other => other,
    }
}
