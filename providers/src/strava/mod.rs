//! `kind = "strava"`: the connected athlete's activities and profile, from Strava's API,
//! with OAuth2 tokens that are refreshed as they expire.
//!
//! ```toml
//! [providers.strava]
//! kind = "strava"
//! client_id = "12345"
//! client_secret_env = "STRAVA_CLIENT_SECRET"
//! # base_url = "https://www.strava.com"
//! # oauth_url = "https://www.strava.com"
//! # per_page = 200
//! # rate_limit_reserve = 5
//! # streams = ["activities", "athlete"]
//! ```
//!
//! Two streams, each record keyed by its `id`:
//! - `activities` (the primary stream): `GET /api/v3/athlete/activities`, pages numbered
//!   from 1 (`page`, `per_page`); an empty page ends the listing. A page's watermark is its
//!   latest `start_date`. Incremental: `after` is exclusive at Strava, so it is sent as the
//!   cursor minus one second, and boundary ties are fetched again. An activity edited
//!   later keeps its `start_date`, so an incremental run sees only new activities; edits
//!   and deletions are seen by a full pass (a deleted one as missing from it).
//! - `athlete`: `GET /api/v3/athlete`, the connected athlete as one record, fetched whole
//!   on every run (no watermark), so a change to the profile is seen by the next run.
//!
//! For both:
//! - OAuth2: a connection holds an access token, a refresh token and `expires_at`. Before a
//!   request whose token expires within a minute (or has no known expiry while a refresh
//!   token exists), and once after a 401, the token is refreshed through the pipeline's
//!   [`CredentialStore`](crate::CredentialStore), which commits the rotated pair first
//!   (`oauth`).
//! - Rate limits: the application's 15-minute and daily budgets, read from the usage
//!   headers of every answer and shared by all connections and both streams: every
//!   request counts against them (`limits`).

mod config;
mod limits;
mod oauth;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use chrono::Utc;
use reqwest::header::{HeaderMap, AUTHORIZATION};
use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;

pub use config::StravaConfig;

use crate::adapter;
use crate::authorize::AuthorizationApp;
use crate::http::{Answer, Answered, HttpClient};
use crate::kind::ProviderKind;
use crate::oauth2;
use crate::stream::unknown_stream;
use crate::{Credentials, FetchContext, FetchError, Page, PagePosition, Provider, StreamSpec};
use limits::{Clock, RateLimits, Wait};
use oauth::OAuthClient;

/// The adapter for one `kind = "strava"` provider (one Strava API application). One
/// instance serves all the provider's connections, so its rate-limit state is the
/// application's.
#[derive(Debug)]
pub struct StravaProvider {
    config: StravaConfig,
    client: HttpClient,
    oauth: std::sync::Arc<OAuthClient>,
    limits: RateLimits,
}

impl StravaProvider {
    /// Builds the adapter with the application's client secret. The configuration is
    /// expected to have passed [`StravaConfig::validate`].
    pub fn new(
        config: StravaConfig,
        client: HttpClient,
        client_secret: SecretString,
    ) -> Result<StravaProvider, FetchError> {
        let clock: Clock = Arc::new(Utc::now);
        let oauth = OAuthClient {
            client: client.clone(),
            token_url: adapter::endpoint(&config.oauth_url, "/oauth/token")?,
            client_id: config.client_id.clone(),
            client_secret,
            clock: clock.clone(),
            lifetime_warning: Arc::default(),
        };
        let limits = RateLimits::new(config.rate_limit_reserve, clock);
        Ok(StravaProvider {
            config,
            client,
            oauth: std::sync::Arc::new(oauth),
            limits,
        })
    }

    /// Builds the adapter, reading the client secret from the environment variable that
    /// `client_secret_env` names; an unset or empty variable is a [`FetchError::Client`]
    /// naming it.
    pub fn from_env(
        config: StravaConfig,
        client: HttpClient,
    ) -> Result<StravaProvider, FetchError> {
        let name = &config.client_secret_env;
        let secret = std::env::var(name)
            .ok()
            .map(|value| value.trim().to_string())
            .filter(|value| !value.is_empty())
            .ok_or_else(|| FetchError::Client {
                message: format!(
                    "client_secret_env: the environment variable {name} is not set or empty; \
                     it must hold the Strava application's client secret"
                ),
            })?;
        StravaProvider::new(config, client, SecretString::from(secret))
    }

    /// The same adapter reading the time from `clock` (tests move it near a window edge).
    #[cfg(test)]
    pub(crate) fn with_clock(mut self, clock: Clock) -> StravaProvider {
        std::sync::Arc::make_mut(&mut self.oauth).clock = clock.clone();
        self.limits = RateLimits::new(self.config.rate_limit_reserve, clock);
        self
    }

    /// Fetches the page, refreshing the credentials through the store first when they
    /// are about to expire and once after a 401 (see [`crate::oauth2::fetch_refreshing`]).
    /// Every credential seen is added to `seen`, so errors can be cleaned of them.
    async fn fetch_refreshing(
        &self,
        context: &FetchContext<'_>,
        request: Request,
        seen: &mut Vec<SecretString>,
    ) -> Result<Page, FetchError> {
        let refreshing = oauth2::Refreshing {
            store: context.credential_store,
            refresher: self.oauth.clone(),
            now: self.limits.now().timestamp(),
            api: "Strava",
        };
        oauth2::fetch_refreshing(
            refreshing,
            context.credentials,
            seen,
            |credentials| async move {
                self.fetch(context, access_token(&credentials)?, request)
                    .await
            },
        )
        .await
    }

    /// One request, after waiting out the rate limit if need be: every stream's requests
    /// spend the application's one budget.
    async fn fetch(
        &self,
        context: &FetchContext<'_>,
        token: &str,
        request: Request,
    ) -> Result<Page, FetchError> {
        if let Some(wait) = self.limits.reserve_request() {
            self.wait(wait).await?;
        }
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, adapter::bearer("strava", token)?);
        match request {
            Request::Activities { page } => self.activities(context, headers, page).await,
            Request::Athlete => self.athlete(headers).await,
        }
    }

    /// The activities on `page`, since the watermark when there is one.
    async fn activities(
        &self,
        context: &FetchContext<'_>,
        headers: HeaderMap,
        page: u64,
    ) -> Result<Page, FetchError> {
        let mut url = adapter::endpoint(&self.config.base_url, "/api/v3/athlete/activities")?;
        {
            let mut query = url.query_pairs_mut();
            query
                .append_pair("page", &page.to_string())
                .append_pair("per_page", &self.config.per_page.to_string());
            if let Some(since) = context.since {
                let after = adapter::watermark_epoch(since).saturating_sub(1);
                query.append_pair("after", &after.to_string());
            }
        }
        // The page is read where its body is, in the scan that checks it is JSON.
        let read = move |answered: &Answered<'_>| {
            let start_date = adapter::WatermarkField::Time("start_date");
            // Strava pages by number until an empty page.
            let next = |records: usize| {
                (records > 0).then(|| PagePosition::Page {
                    page: page.saturating_add(1),
                })
            };
            adapter::array_page_by_id(answered, "activities", start_date, next)
        };
        self.client.get_read(url, headers, &self.limits, read).await
    }

    /// The connected athlete, one record.
    async fn athlete(&self, headers: HeaderMap) -> Result<Page, FetchError> {
        let url = adapter::endpoint(&self.config.base_url, "/api/v3/athlete")?;
        let read = |answered: &Answered<'_>| adapter::object_page_by_id(answered, "the athlete");
        self.client.get_read(url, headers, &self.limits, read).await
    }

    /// Sleeps for `wait`, or returns [`FetchError::RateLimited`] at once when it is longer
    /// than `http.max_rate_limit_wait`.
    async fn wait(&self, wait: Wait) -> Result<(), FetchError> {
        let limit = self.client.settings().max_rate_limit_wait;
        let duration = wait.duration();
        if duration > limit {
            return Err(FetchError::RateLimited {
                retry_after: duration,
                limit,
            });
        }
        let wait_ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        match wait {
            Wait::Window(_) => tracing::info!(
                wait_ms,
                "Strava's 15-minute rate-limit budget is nearly spent; waiting for the next window."
            ),
            Wait::Day(_) => tracing::info!(
                wait_ms,
                "Strava's daily rate-limit budget is spent; waiting until midnight UTC."
            ),
        }
        self.client.record_rate_limit_wait();
        tokio::time::sleep(duration).await;
        Ok(())
    }
}

impl ProviderKind for StravaConfig {
    fn validate(&self) -> Result<(), String> {
        StravaConfig::validate(self)
    }

    fn streams(&self) -> Vec<StreamSpec> {
        vec![StreamSpec::top(ACTIVITIES), StreamSpec::top(ATHLETE)]
    }

    /// Strava's tokens expire within hours: a user connects through OAuth2.
    fn takes_key(&self) -> bool {
        false
    }

    fn required_env_vars(&self) -> Vec<(String, String)> {
        vec![(
            "client_secret_env".to_string(),
            self.client_secret_env.clone(),
        )]
    }

    /// Strava's web flow: `{oauth_url}/oauth/authorize`, comma-separated scopes, no PKCE
    /// in its documentation, and the athlete in the token answer.
    fn authorization(&self) -> Option<AuthorizationApp> {
        let endpoint = |path: &str| {
            let mut url = self.oauth_url.clone();
            if let Ok(mut segments) = url.path_segments_mut() {
                segments.pop_if_empty().extend(["oauth", path]);
            }
            url
        };
        Some(AuthorizationApp {
            authorize_url: endpoint("authorize"),
            token_url: endpoint("token"),
            client_id: self.client_id.clone(),
            client_secret_env: Some(self.client_secret_env.clone()),
            scope: (!self.scopes.is_empty()).then(|| self.scopes.join(",")),
            pkce: false,
            client_auth: crate::oauth2::ClientAuth::Post,
            account_in_answer: Some("/athlete/id"),
        })
    }

    fn build(&self, client: HttpClient) -> Result<Box<dyn Provider>, FetchError> {
        Ok(Box::new(StravaProvider::from_env(self.clone(), client)?))
    }
}

#[async_trait::async_trait]
impl Provider for StravaProvider {
    async fn fetch_page(
        &self,
        context: &FetchContext<'_>,
        position: Option<&PagePosition>,
    ) -> Result<Page, FetchError> {
        let request = Request::new(context.stream, position)?;
        let mut seen = Vec::new();
        oauth2::remember(&mut seen, context.credentials);
        let result = self.fetch_refreshing(context, request, &mut seen).await;
        result.map_err(|error| {
            let secrets = seen.iter().map(|secret| secret.expose_secret().trim());
            error.redact_secrets(secrets)
        })
    }
}

/// The primary stream: the athlete's activities.
const ACTIVITIES: &str = "activities";

/// The connected athlete's profile.
const ATHLETE: &str = "athlete";

/// What one page of a stream asks Strava for.
#[derive(Clone, Copy, Debug)]
enum Request {
    /// `GET /api/v3/athlete/activities`, page `page` (from 1).
    Activities { page: u64 },
    /// `GET /api/v3/athlete`.
    Athlete,
}

impl Request {
    /// The request for the page of `stream` at `position`.
    fn new(stream: &str, position: Option<&PagePosition>) -> Result<Request, FetchError> {
        match (stream, position) {
            (ACTIVITIES, None) => Ok(Request::Activities { page: 1 }),
            (ACTIVITIES, Some(PagePosition::Page { page })) => {
                Ok(Request::Activities { page: *page })
            }
            (ACTIVITIES, Some(other)) => {
                Err(adapter::position_mismatch("strava", other, "page number"))
            }
            (ATHLETE, None) => Ok(Request::Athlete),
            (ATHLETE, Some(other)) => Err(FetchError::PositionMismatch {
                message: format!(
                    "cannot fetch the page at {}: Strava's athlete stream is a single page",
                    other.describe()
                ),
            }),
            (other, _) => Err(unknown_stream("strava", other)),
        }
    }
}

/// The access token to send, or why there is none.
fn access_token(credentials: &Credentials) -> Result<&str, FetchError> {
    adapter::token(credentials)
        .ok_or_else(|| adapter::missing_token("strava", "an OAuth access token or a refresh token"))
}

/// Strava's error body `{"message": ..., "errors": [{"resource", "field", "code"}]}` as one
/// line, or the start of the body when it is not that.
fn error_message(answer: &Answer<'_>) -> String {
    let Some(body) = answer.json() else {
        return answer.excerpt();
    };
    let Some(message) = body.get("message").and_then(Value::as_str) else {
        return answer.excerpt();
    };
    let details: Vec<String> = body
        .get("errors")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|error| {
            let parts: Vec<&str> = ["resource", "field", "code"]
                .iter()
                .filter_map(|name| error.get(*name)?.as_str())
                .filter(|part| !part.is_empty())
                .collect();
            (!parts.is_empty()).then(|| parts.join(" "))
        })
        .collect();
    if details.is_empty() {
        message.to_string()
    } else {
        format!("{message} ({})", details.join("; "))
    }
}
