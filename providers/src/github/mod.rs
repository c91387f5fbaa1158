//! `kind = "github"`: what the connected user sees on GitHub, from its REST API, as four
//! streams.
//!
//! ```toml
//! [providers.github]
//! kind = "github"
//! # base_url = "https://api.github.com"   # GitHub Enterprise: "https://HOST/api/v3"
//! # per_page = 100
//! # streams = ["issues", "repos", "pull_requests", "issue_comments"]
//! ```
//!
//! Every record is keyed by its `id`; a page's watermark is its newest `updated_at`, and a
//! stream's cursor the newest of its last complete run.
//!
//! - `issues` (the primary stream): `GET /issues?filter=all&state=all`, every issue and
//!   pull request visible to the user, newest change first. Incremental: `since` is the
//!   cursor (inclusive at GitHub, so boundary ties are fetched again).
//! - `repos`: `GET /user/repos?affiliation=owner,collaborator,organization_member`, newest
//!   change first. Incremental: `since` (documented as "updated after") is the cursor less
//!   a second.
//! - `pull_requests`, per stored repository: `GET /repos/{owner}/{repo}/pulls?state=all`,
//!   newest change first. The endpoint has no `since`: incremental, a page ends at the
//!   first pull request changed in a second before the cursor's, and the listing there.
//! - `issue_comments`, per stored repository: `GET /repos/{owner}/{repo}/issues/comments`,
//!   newest change first. Incremental: `since` (documented as "updated after") is the
//!   cursor less a second.
//!
//! An update moves a record's `updated_at` past the cursor, so the next incremental run
//! fetches it again. A deletion is never listed: a deleted record is seen only as missing
//! from a full pass. The per-repository streams name the repository by the stored `repos`
//! record's `full_name` (or `owner.login` and `name`), percent-encoded; a repository that
//! answers 404, or 403 without a rate-limit signal (deleted, made private, or out of the
//! token's reach), gives a page with [`Page::parent_gone`] and no records, so the run goes
//! on with the next repository; so does a stored record that names no repository.
//!
//! For every stream:
//! - Pages are walked by the `Link` header's `rel="next"` URL, followed as given but only on
//!   the origin of `base_url`.
//! - Rate limits as GitHub documents them: a 403 or 429 with `x-ratelimit-remaining: 0`
//!   waits until `x-ratelimit-reset`; one with `retry-after` waits that long; a secondary
//!   rate limit without either waits a minute. A wait beyond `http.max_rate_limit_wait`
//!   ends the fetch with [`FetchError::RateLimited`] at once. Any other 403 is forbidden
//!   ([`FetchError::Unauthorized`]), as is a 401.

mod streams;
#[cfg(test)]
mod tests;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, ACCEPT, AUTHORIZATION};
use serde::Deserialize;
use serde_json::Value;
use url::Url;

use crate::adapter;
use crate::authorize::AuthorizationApp;
use crate::http::{asked_wait, Answer, HttpClient, ResponsePolicy, Verdict};
use crate::kind::ProviderKind;
use crate::oauth2::ClientAuth;
use crate::stream::unknown_stream;
use crate::{Credentials, FetchContext, FetchError, Page, PagePosition, Provider, StreamSpec};
use streams::{GithubStream, Listing, NotListed};

/// The REST API version the adapter speaks (`X-GitHub-Api-Version`).
pub const API_VERSION: &str = "2022-11-28";

/// How long to wait after a secondary rate limit that names no wait: "at least one minute"
/// in GitHub's documentation.
const SECONDARY_RATE_LIMIT_WAIT: Duration = Duration::from_secs(60);

/// The configuration of a `kind = "github"` provider.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GithubConfig {
    /// The API root. Default `"https://api.github.com"`; GitHub Enterprise Server uses
    /// `"https://HOST/api/v3"`.
    #[serde(default = "default_base_url")]
    pub base_url: Url,
    /// Records per page (`per_page`) of every stream, 1 to 100. Default 100.
    #[serde(default = "default_per_page")]
    pub per_page: u32,
    /// The OAuth app's Client ID, for users connecting on the Connect page; without it
    /// the page asks for a personal access token instead.
    #[serde(default)]
    pub client_id: Option<String>,
    /// The environment variable that holds the OAuth app's client secret; required with
    /// `client_id`.
    #[serde(default)]
    pub client_secret_env: Option<String>,
    /// The scopes asked for. Default `["repo"]`: the private repositories' issues too.
    #[serde(default = "default_scopes")]
    pub scopes: Vec<String>,
    /// Where GitHub's OAuth endpoints are: `{oauth_url}/login/oauth/authorize` and
    /// `/login/oauth/access_token`. Default `"https://github.com"`; GitHub Enterprise
    /// Server uses `"https://HOST"`.
    #[serde(default = "default_oauth_url")]
    pub oauth_url: Url,
}

fn default_scopes() -> Vec<String> {
    vec!["repo".to_string()]
}

fn default_oauth_url() -> Url {
    Url::parse("https://github.com").expect("the default oauth_url is a valid URL")
}

fn default_base_url() -> Url {
    Url::parse("https://api.github.com").expect("the default base_url is a valid URL")
}

fn default_per_page() -> u32 {
    100
}

impl Default for GithubConfig {
    fn default() -> Self {
        GithubConfig {
            base_url: default_base_url(),
            per_page: default_per_page(),
            client_id: None,
            client_secret_env: None,
            scopes: default_scopes(),
            oauth_url: default_oauth_url(),
        }
    }
}

impl GithubConfig {
    /// Checks what serde cannot and returns a message naming the key that is wrong.
    pub fn validate(&self) -> Result<(), String> {
        adapter::validate_base_url("base_url", &self.base_url)?;
        if !(1..=100).contains(&self.per_page) {
            return Err(format!(
                "per_page must be between 1 and 100 (GitHub's largest page), not {}",
                self.per_page
            ));
        }
        adapter::validate_base_url("oauth_url", &self.oauth_url)?;
        match (&self.client_id, &self.client_secret_env) {
            (Some(id), Some(env)) => {
                if id.trim().is_empty() || id.chars().any(|c| c.is_whitespace()) {
                    return Err(format!(
                        "client_id {id:?} must be the OAuth app's Client ID, without spaces"
                    ));
                }
                crate::oauth2::validate_env_var_name("client_secret_env", env)?;
            }
            (Some(_), None) => {
                return Err("client_id needs client_secret_env, the name of the environment variable that holds the OAuth app's client secret".to_string())
            }
            (None, Some(_)) => {
                return Err("client_secret_env needs client_id, the OAuth app's Client ID".to_string())
            }
            (None, None) => {}
        }
        if let Some(scope) = self.scopes.iter().find(|scope| {
            scope.is_empty() || !scope.chars().all(|c| c.is_ascii_graphic() && c != '"')
        }) {
            return Err(format!(
                "scopes: {scope:?} is not a scope name (visible ASCII, such as \"repo\")"
            ));
        }
        Ok(())
    }
}

/// The adapter for one `kind = "github"` provider.
#[derive(Clone, Debug)]
pub struct GithubProvider {
    config: GithubConfig,
    client: HttpClient,
}

impl GithubProvider {
    /// Builds the adapter. The configuration is expected to have passed
    /// [`GithubConfig::validate`].
    pub fn new(config: GithubConfig, client: HttpClient) -> GithubProvider {
        GithubProvider { config, client }
    }

    fn headers(&self, token: &str) -> Result<HeaderMap, FetchError> {
        let mut headers = HeaderMap::new();
        headers.insert(
            ACCEPT,
            HeaderValue::from_static("application/vnd.github+json"),
        );
        headers.insert(
            HeaderName::from_static("x-github-api-version"),
            HeaderValue::from_static(API_VERSION),
        );
        headers.insert(AUTHORIZATION, adapter::bearer("github", token)?);
        Ok(headers)
    }

    /// One page of `listing`: the first at `position` `None`, else the `Link` header's
    /// next URL.
    async fn fetch(
        &self,
        listing: &Listing,
        token: &str,
        position: Option<&PagePosition>,
    ) -> Result<Page, FetchError> {
        let url = match position {
            None => listing.first_url(&self.config)?,
            Some(PagePosition::Url { url }) => {
                adapter::same_origin_url(&self.config.base_url, url)?
            }
            Some(other) => {
                return Err(adapter::position_mismatch(
                    "github",
                    other,
                    "the Link header's next URL",
                ))
            }
        };
        // The page is read where its body is, in the scan that checks it is JSON.
        self.client
            .get_read(url, self.headers(token)?, &GithubPolicy, listing.reader())
            .await
    }
}

impl ProviderKind for GithubConfig {
    fn validate(&self) -> Result<(), String> {
        GithubConfig::validate(self)
    }

    fn streams(&self) -> Vec<StreamSpec> {
        GithubStream::ALL.map(GithubStream::spec).to_vec()
    }

    fn required_env_vars(&self) -> Vec<(String, String)> {
        self.client_secret_env
            .iter()
            .map(|name| ("client_secret_env".to_string(), name.clone()))
            .collect()
    }

    /// GitHub's OAuth apps: PKCE (S256) is supported since July 2025, and the token
    /// endpoint answers JSON when asked.
    fn authorization(&self) -> Option<AuthorizationApp> {
        let client_id = self.client_id.clone()?;
        let endpoint = |path: &str| {
            let mut url = self.oauth_url.clone();
            if let Ok(mut segments) = url.path_segments_mut() {
                segments.pop_if_empty().extend(path.split('/'));
            }
            url
        };
        Some(AuthorizationApp {
            authorize_url: endpoint("login/oauth/authorize"),
            token_url: endpoint("login/oauth/access_token"),
            client_id,
            client_secret_env: self.client_secret_env.clone(),
            scope: (!self.scopes.is_empty()).then(|| self.scopes.join(" ")),
            pkce: true,
            client_auth: ClientAuth::Post,
            account_in_answer: None,
        })
    }

    fn build(&self, client: HttpClient) -> Result<Box<dyn Provider>, FetchError> {
        Ok(Box::new(GithubProvider::new(self.clone(), client)))
    }
}

#[async_trait::async_trait]
impl Provider for GithubProvider {
    async fn fetch_page(
        &self,
        context: &FetchContext<'_>,
        position: Option<&PagePosition>,
    ) -> Result<Page, FetchError> {
        let stream = GithubStream::named(context.stream)
            .ok_or_else(|| unknown_stream("github", context.stream))?;
        let listing = match Listing::new(stream, context) {
            Ok(listing) => listing,
            Err(NotListed::Error(error)) => return Err(error),
            Err(NotListed::Parent(reason)) => {
                return Ok(Page {
                    parent_gone: Some(reason),
                    ..Page::default()
                })
            }
        };
        let token = adapter::token(context.credentials)
            .ok_or_else(|| adapter::missing_token("github", "a GitHub token"))?;
        let fetched = self
            .fetch(&listing, token, position)
            .await
            .map_err(|error| error.redact_secret(token));
        listing.parent_gone_or(fetched)
    }

    /// `GET /user`: the authenticated user's numeric `id`.
    async fn account_id(&self, credentials: &Credentials) -> Result<Option<String>, FetchError> {
        let token = adapter::token(credentials)
            .ok_or_else(|| adapter::missing_token("github", "a GitHub token"))?;
        let url = adapter::endpoint(&self.config.base_url, "/user")?;
        let answer = self
            .client
            .get_json_with(url, self.headers(token)?, &GithubPolicy)
            .await
            .map_err(|error| error.redact_secret(token))?;
        Ok(answer
            .value()
            .get("id")
            .and_then(crate::authorize::account_id_of))
    }
}

/// How GitHub's answers are read: its rate-limit headers and its JSON error bodies.
struct GithubPolicy;

impl ResponsePolicy for GithubPolicy {
    fn classify(&self, answer: &Answer<'_>, default: Verdict) -> Verdict {
        let message = error_message(answer);
        let status = answer.status.as_u16();
        if status == 403 || status == 429 {
            if let Some(wait) = rate_limit_wait(answer, SystemTime::now()) {
                let error = FetchError::Status {
                    url: answer.url.to_string(),
                    status,
                    attempts: answer.attempt,
                    message: format!("rate limited: {message}"),
                };
                return Verdict::Retry {
                    error,
                    wait: Some(wait),
                };
            }
        }
        default.with_message(message)
    }
}

/// The wait a 403 or 429 asks for, when it is a rate limit: `retry-after`, else the time
/// until `x-ratelimit-reset` when `x-ratelimit-remaining` is 0 (at least a second, against
/// clock skew, at most [`MAX_ASKED_WAIT`](crate::http::MAX_ASKED_WAIT)), else a minute for a secondary rate limit that names no wait. `None` when
/// the answer is not a rate limit.
fn rate_limit_wait(answer: &Answer<'_>, now: SystemTime) -> Option<Duration> {
    let reset = (answer.header("x-ratelimit-remaining") == Some("0"))
        .then(|| answer.header("x-ratelimit-reset")?.parse::<u64>().ok())
        .flatten()
        .map(|reset| {
            // In whole seconds, saturating: the header is any number the API sends.
            let now = now
                .duration_since(UNIX_EPOCH)
                .map_or(0, |since| since.as_secs());
            asked_wait(reset.saturating_sub(now)).max(Duration::from_secs(1))
        });
    match (answer.retry_after(), reset) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (Some(wait), None) | (None, Some(wait)) => Some(wait),
        (None, None) => {
            let secondary = answer
                .json()
                .and_then(|body| body.get("message")?.as_str().map(str::to_lowercase))
                .is_some_and(|message| message.contains("secondary rate limit"));
            secondary.then_some(SECONDARY_RATE_LIMIT_WAIT)
        }
    }
}

/// GitHub's error body `{"message": ..., "documentation_url": ...}` as one line, or the
/// start of the body when it is not that.
fn error_message(answer: &Answer<'_>) -> String {
    let Some(body) = answer.json() else {
        return answer.excerpt();
    };
    match (
        body.get("message").and_then(Value::as_str),
        body.get("documentation_url").and_then(Value::as_str),
    ) {
        (Some(message), Some(url)) => format!("{message} (see {url})"),
        (Some(message), None) => message.to_string(),
        _ => answer.excerpt(),
    }
}
