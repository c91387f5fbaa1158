//! `auth = { oauth2 = ... }` at run time: the token endpoint (RFC 6749), the
//! refresh-token grant (run through the pipeline's credential store) and the
//! client-credentials grant (one token cached in the provider for all its connections).

use std::sync::Arc;

use chrono::Utc;
use reqwest::header::{HeaderMap, HeaderValue, ACCEPT, AUTHORIZATION};
use secrecy::{ExposeSecret, SecretString};
use url::Url;

use super::auth::{ClientAuth, Grant, OAuth2};
use crate::http::{display_url, HttpClient};
use crate::oauth2::{
    basic_client_auth, refused_refresh, LifetimeWarning, TokenAnswer, TokenEndpointPolicy,
    REFRESH_MARGIN_SECONDS,
};
use crate::{Credentials, FetchError, TokenRefresher};

/// The OAuth2 state of one provider: how its access tokens are had.
#[derive(Clone, Debug)]
pub(super) enum OAuth2Runtime {
    /// `oauth2 = "refresh_token"`: each connection's token, refreshed through the store.
    RefreshToken(Arc<TokenEndpoint>),
    /// `oauth2 = "client_credentials"`: the provider's own token, cached here.
    ClientCredentials(Arc<ClientCredentials>),
}

impl OAuth2Runtime {
    /// The state for `settings`, talking to the token endpoint through `client`.
    pub(super) fn new(
        settings: &OAuth2,
        client: HttpClient,
        client_secret: Option<SecretString>,
    ) -> OAuth2Runtime {
        let endpoint = Arc::new(TokenEndpoint {
            client,
            token_url: settings.token_url.clone(),
            client_id: settings.client_id.clone(),
            client_secret,
            client_secret_env: settings.client_secret_env.clone(),
            scope: settings.scope.clone(),
            client_auth: settings.client_auth,
            lifetime_warning: LifetimeWarning::default(),
        });
        match settings.grant {
            Grant::RefreshToken => OAuth2Runtime::RefreshToken(endpoint),
            Grant::ClientCredentials => {
                OAuth2Runtime::ClientCredentials(Arc::new(ClientCredentials {
                    endpoint,
                    cache: tokio::sync::Mutex::new(None),
                }))
            }
        }
    }
}

/// Reads the client secret from the environment variable `client_secret_env` names, when
/// it names one; an unset or empty variable is a [`FetchError::Client`] naming it.
pub(super) fn client_secret_from_env(
    settings: &OAuth2,
) -> Result<Option<SecretString>, FetchError> {
    crate::oauth2::client_secret_from_env(
        "auth.client_secret_env",
        settings.client_secret_env.as_deref(),
    )
}

/// An OAuth2 token endpoint and the client that asks it for tokens.
pub(super) struct TokenEndpoint {
    client: HttpClient,
    token_url: Url,
    client_id: String,
    client_secret: Option<SecretString>,
    client_secret_env: Option<String>,
    scope: Option<String>,
    client_auth: ClientAuth,
    lifetime_warning: LifetimeWarning,
}

impl std::fmt::Debug for TokenEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenEndpoint")
            .field("token_url", &display_url(&self.token_url))
            .field("client_id", &self.client_id)
            .field("client_secret", &self.client_secret)
            .field("client_auth", &self.client_auth)
            .finish_non_exhaustive()
    }
}

impl TokenEndpoint {
    /// POSTs the grant's form fields (RFC 6749 §4.4.2, §6) with `scope` and the client's
    /// authentication, and reads the answer (§5.1) or its error (§5.2). `secret` is the
    /// grant's own secret (a refresh token); it and the client secret are cleaned from
    /// any error.
    async fn request(
        &self,
        grant: &[(&str, &str)],
        secret: Option<&str>,
        rotating: Option<&Credentials>,
        what: &'static str,
    ) -> Result<TokenAnswer, FetchError> {
        let client_secret = match (&self.client_secret, &self.client_secret_env) {
            (Some(secret), _) => Some(secret.expose_secret()),
            (None, None) => None,
            (None, Some(name)) => {
                return Err(FetchError::Client {
                    message: format!(
                        "auth.client_secret_env: the provider was built without the client \
                         secret from {name}"
                    ),
                })
            }
        };
        let mut form: Vec<(&str, &str)> = grant.to_vec();
        if let Some(scope) = &self.scope {
            form.push(("scope", scope));
        }
        let mut headers = HeaderMap::new();
        headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
        let mut basic = None;
        match (self.client_auth, client_secret) {
            (ClientAuth::Basic, Some(client_secret)) => {
                // RFC 6749 §2.3.1: id and secret are form-encoded before they are joined.
                let (value, encoded) = basic_client_auth(&self.client_id, client_secret)?;
                headers.insert(AUTHORIZATION, value);
                basic = Some(encoded);
            }
            (_, client_secret) => {
                form.push(("client_id", &self.client_id));
                if let Some(client_secret) = client_secret {
                    form.push(("client_secret", client_secret));
                }
            }
        }
        let policy = TokenEndpointPolicy { what };
        let result = self
            .client
            .post_form_with(self.token_url.clone(), headers, &form, &policy)
            .await
            .and_then(|response| {
                let body = response.value();
                TokenAnswer::read(&response.url, &body, Utc::now()).map_err(
                    |error| match rotating {
                        Some(current) => refused_refresh(error, &response.url, &body, current),
                        None => error,
                    },
                )
            });
        let secrets = [client_secret, secret, basic.as_deref()];
        let result = result.map_err(|error| error.redact_secrets(secrets.into_iter().flatten()));
        match &result {
            Ok(answer) => {
                tracing::info!(client_id = %self.client_id, what, "Got an OAuth2 access token.");
                self.lifetime_warning.note(answer, &self.token_url);
            }
            Err(error) => tracing::warn!(
                client_id = %self.client_id,
                what,
                %error,
                "The OAuth2 token endpoint gave no access token."
            ),
        }
        result
    }
}

/// The refresh-token grant: the pipeline's [`crate::CredentialStore`] calls this, one
/// refresh per connection at a time, and commits what it returns before handing it back.
#[async_trait::async_trait]
impl TokenRefresher for TokenEndpoint {
    async fn refresh(&self, current: &Credentials) -> Result<Credentials, FetchError> {
        let refresh_token = crate::oauth2::refresh_token_of(current, "OAuth2")?;
        let grant = [
            ("grant_type", "refresh_token"),
            ("refresh_token", refresh_token),
        ];
        let answer = self
            .request(&grant, Some(refresh_token), Some(current), "the refresh")
            .await?;
        Ok(answer.into_credentials(current))
    }
}

/// Refresh a cached client-credentials token this many seconds before it expires.
const CLIENT_TOKEN_MARGIN_SECONDS: i64 = REFRESH_MARGIN_SECONDS;

/// The client-credentials grant: one access token for all the provider's connections.
#[derive(Debug)]
pub(super) struct ClientCredentials {
    endpoint: Arc<TokenEndpoint>,
    /// The token and when it expires (seconds since the epoch). Held across a fetch from
    /// the token endpoint, so concurrent pages wait for one fetch instead of each making
    /// their own.
    cache: tokio::sync::Mutex<Option<CachedToken>>,
}

#[derive(Debug)]
struct CachedToken {
    token: SecretString,
    expires_at: i64,
}

impl ClientCredentials {
    /// The cached token while it has more than [`CLIENT_TOKEN_MARGIN_SECONDS`] to live and
    /// is not `rejected` (the token an API just refused), else a new one from the token
    /// endpoint. A token another caller fetched in the meantime is used as it is.
    pub(super) async fn token(
        &self,
        rejected: Option<&SecretString>,
    ) -> Result<SecretString, FetchError> {
        let mut cache = self.cache.lock().await;
        if let Some(cached) = cache.as_ref() {
            let now = Utc::now().timestamp();
            let lives = cached.expires_at > now.saturating_add(CLIENT_TOKEN_MARGIN_SECONDS);
            let refused = rejected
                .is_some_and(|rejected| rejected.expose_secret() == cached.token.expose_secret());
            if lives && !refused {
                return Ok(cached.token.clone());
            }
        }
        let grant = [("grant_type", "client_credentials")];
        // RFC 6749 §4.4.3: a refresh token should not be issued here; one that is, is
        // not kept: the client's own credentials buy the next token.
        let answer = self
            .endpoint
            .request(&grant, None, None, "the client credentials")
            .await?;
        let token = answer.access_token.clone();
        *cache = Some(CachedToken {
            token: answer.access_token,
            expires_at: answer.expires_at,
        });
        Ok(token)
    }

    /// Runs `fetch` with the provider's token, and once more with a new token after a 401.
    /// Every token used is added to `seen`.
    pub(super) async fn fetch_with<T, F, Fut>(
        &self,
        seen: &mut Vec<SecretString>,
        fetch: F,
    ) -> Result<T, FetchError>
    where
        F: Fn(SecretString) -> Fut,
        Fut: std::future::Future<Output = Result<T, FetchError>>,
    {
        let token = self.token(None).await?;
        seen.push(token.clone());
        match fetch(token.clone()).await {
            Err(FetchError::Unauthorized { status: 401, .. }) => {
                tracing::info!(
                    "The API rejected the client-credentials access token; fetching a new one \
                     and retrying once."
                );
                let fresh = self.token(Some(&token)).await?;
                seen.push(fresh.clone());
                fetch(fresh).await
            }
            other => other,
        }
    }
}
