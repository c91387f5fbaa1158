//! Refreshing a connection's Strava access token: `POST {oauth_url}/oauth/token` with
//! `grant_type=refresh_token`, as Strava's authentication documentation describes.
//!
//! Strava rotates refresh tokens: the answer's `refresh_token` replaces the one spent. The
//! pipeline's [`crate::CredentialStore`] commits the new pair before it is used.

use reqwest::header::{HeaderMap, HeaderValue, ACCEPT};
use secrecy::{ExposeSecret, SecretString};
use url::Url;

use super::limits::Clock;
use crate::http::{display_url, Answer, HttpClient, ResponsePolicy, Verdict};
#[cfg(test)]
pub(crate) use crate::oauth2::{expiry, seconds};
use crate::oauth2::{refused_refresh, LifetimeWarning, TokenAnswer};
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
    /// Says once that Strava's answers give their tokens no lifetime.
    pub lifetime_warning: std::sync::Arc<LifetimeWarning>,
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
        let refresh_token = crate::oauth2::refresh_token_of(current, "Strava")?;
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
                let body = response.value();
                TokenAnswer::read(&response.url, &body, (self.clock)())
                    .map_err(|error| refused_refresh(error, &response.url, &body, current))
            })
            .map(|answer| {
                self.lifetime_warning.note(&answer, &self.token_url);
                answer.into_credentials(current)
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
