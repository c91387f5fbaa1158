//! `kind = "rest"`: a declarative provider for REST APIs that list records as JSON pages,
//! configured wholly in TOML.
//!
//! ```toml
//! [providers.acme]
//! kind = "rest"
//! base_url = "https://api.acme.example"
//! path = "/v1/items"
//! records_path = "data"
//! id_field = "id"
//! auth = "bearer"
//! incremental = { cursor_field = "updated_at", param = "updated_since", lookback = "5m" }
//! [providers.acme.pagination]
//! type = "cursor"
//! cursor_path = "next_cursor"
//! cursor_param = "cursor"
//! ```
//!
//! `auth` says how requests are authenticated: with the connection's token (`"bearer"`, the
//! default; `{ header = "X-Api-Key" }`; `{ query = "api_key" }`; HTTP basic with
//! `"basic"`, the token being `USER:PASSWORD`, or `{ basic = "USER" }`, the token being the
//! password), with none (`"none"`), or with an OAuth2 access token:
//!
//! ```toml
//! [providers.acme.auth]
//! oauth2 = "refresh_token"        # or "client_credentials"
//! token_url = "https://auth.acme.example/oauth/token"
//! client_id = "tributary"
//! client_secret_env = "ACME_CLIENT_SECRET"
//! # scope = "items:read"
//! # client_auth = "basic"         # default "post": id and secret as form fields
//! ```
//!
//! With `"refresh_token"` each connection holds an access token, a refresh token and its
//! expiry; the token is refreshed through the pipeline's
//! [`CredentialStore`](crate::CredentialStore) a minute before it expires and once after a
//! 401, and a rotated refresh token is committed before it is used. With
//! `"client_credentials"` connections need no token: the provider fetches one for all of
//! them, caches it until a minute before it expires and fetches a new one once after a 401.
//!
//! Pagination types: `cursor` (a body token sent back), `offset`, `page`, `link` (the
//! `Link` header), `next_url` (a body URL), `header` (a response header's token sent back),
//! `has_more` (a body boolean, and the last record's id sent back) and `none`. Next-page
//! URLs are followed only on the origin of `base_url`.
//!
//! Without `incremental` every run is a full pass. With it, a page's watermark is the
//! newest `cursor_field` of its records; a later run sends the stream's cursor as `param`
//! (minus `lookback`, in `format`), and with `stop_when_older` a newest-first listing ends
//! at the first record older than the cursor.
//!
//! `records_path` is a dotted path to the array of records; a segment ending in `[]`
//! flattens an array, so `records_path = "data.groups[].items"` yields every item of every
//! group, in order (the per-page cap, `max_records_per_page`, counts them together).
//! `records_filter = { field = "status", not_in = ["deleted"] }` keeps only the records
//! that pass one test (`equals`, `not_equals`, `in`, `not_in` or `exists`, on a dotted
//! field); the others are dropped before they are keyed or stored, and counted in
//! [`Page::filtered`].
//!
//! # Streams
//!
//! The top-level keys describe the primary stream, `records`. Each
//! `[providers.NAME.resources.RESOURCE]` table adds a stream named RESOURCE (lowercase
//! letters, digits and `_`), and `streams = ["records", "projects", "tasks"]` picks which
//! are synced (default: `records` only). Streams are listed `records` first, then the
//! resources in name order.
//!
//! ```toml
//! [providers.acme.resources.projects]
//! path = "/v1/projects"
//! fields = ["owner.login"]
//!
//! [providers.acme.resources.tasks]
//! parent = "projects"
//! path = "/v1/projects/{parent.id}/tasks"
//! query = { owner = "{parent.owner.login}" }
//! records_filter = { field = "status", not_in = ["deleted"] }
//! ```
//!
//! A resource takes from the top-level keys:
//! - always `base_url` and `auth` (a resource cannot set them);
//! - `query` and `headers` merged: the top-level ones, then the resource's, whose value wins
//!   for a name given in both (header names in any case);
//! - `records_path`, `id_field`/`key_fields` (as a pair) and `pagination` (as a whole
//!   table), unless the resource gives its own (`records_path = ""` is the body itself);
//! - never `path` (required), `incremental`, `records_filter` or `fields`.
//!
//! A resource with `parent` (`"records"` or another resource; a cycle is refused) is a
//! child stream: it is listed once per stored record of its parent, and its `path`, `query`
//! values and `headers` values may name the parent record's fields as `{parent.FIELD}`
//! (a dotted path; `{{` and `}}` stand for braces). A string or an integer is put in, as a
//! percent-encoded path segment in `path`. Only fields the parent is known to have may be
//! named, which validation checks: its id field (`id_field`, or `"id"` by default), its
//! `key_fields`, its `incremental.cursor_field`, and those its `fields` lists. At run time
//! a parent record without the field (or with another kind of value) gives a page with
//! [`Page::parent_gone`], as does a 404 or 410 on its children's listing, so the run goes
//! on with the next parent. The top-level keys are never templates: their braces are sent
//! as they are.
//!
//! - `config`: [`RestConfig`] and its validation.
//! - `resources`: [`ResourceConfig`], what a resource inherits, and its templates rendered
//!   per parent record.
//! - `template`: the `{parent.FIELD}` templates.
//! - `records_path`: reading the records at `records_path`, flattening `[]` segments.
//! - `filter`: [`RecordsFilter`].
//! - `auth`: [`Auth`], its TOML forms and the headers it sends.
//! - `oauth2`: the OAuth2 grants at run time.
//! - `incremental`: [`IncrementalConfig`], the cursor sent, the watermark read, and where a
//!   newest-first listing ends.
//! - `pagination`: page URLs and next positions for every pagination type.
//! - `rate_limit`: [`RateLimitConfig`], the API's own rate-limit headers.
//! - `field_path`: dotted paths whose quoted segments may hold dots (`"@odata.nextLink"`).
//! - `link`: the RFC 8288 `Link` header parser behind `type = "link"`.

mod auth;
mod config;
mod field_path;
mod filter;
mod incremental;
pub(crate) mod link;
mod oauth2;
mod pagination;
mod rate_limit;
mod records_path;
mod resources;
mod template;
#[cfg(test)]
mod tests;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, ACCEPT};
use secrecy::{ExposeSecret, SecretString};

pub use auth::{ClientAuth, Grant, OAuth2};
pub use config::{Auth, PaginationConfig, PaginationType, RestConfig};
pub use filter::{FilterValue, RecordsFilter};
pub use incremental::IncrementalConfig;
pub use rate_limit::{RateLimitConfig, ResetFormat};
pub use resources::ResourceConfig;

use std::borrow::Cow;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde_json::value::RawValue;
use url::Url;

use filter::Filter;
use incremental::Incremental;
use records_path::{NotRecords, RecordsPath};
use resources::StreamPlan;

use crate::http::{cap_body, display_url, Answered, DefaultPolicy, HttpClient, JsonResponse};
use crate::kind::ProviderKind;
use crate::quote::{quoted, truncated, MAX_QUOTED_CHARS};
use crate::stream::unknown_stream;
use crate::{
    FetchContext, FetchError, IdSpec, Page, PagePosition, ParentRecord, Provider, Record,
    RejectedRecord, StreamSpec, Watermark,
};
use oauth2::OAuth2Runtime;

/// The adapter for one `kind = "rest"` provider.
#[derive(Clone, Debug)]
pub struct RestProvider {
    config: RestConfig,
    client: HttpClient,
    /// How the primary stream's records are keyed.
    id_spec: IdSpec,
    /// Every stream's checked settings, `records` first, or why they are wrong.
    streams: Vec<(String, Result<Arc<Stream>, String>)>,
    /// How OAuth2 access tokens are had, for `auth = { oauth2 = ... }`.
    oauth2: Option<OAuth2Runtime>,
    /// The API's rate-limit headers read, for `rate_limit = { ... }`.
    rate_limiter: Option<rate_limit::RateLimiter>,
}

/// One stream's checked settings.
#[derive(Debug)]
struct Stream {
    plan: StreamPlan,
    id_spec: IdSpec,
    /// The `incremental` settings, when set.
    incremental: Option<Arc<Incremental>>,
    records_path: RecordsPath,
    filter: Option<Filter>,
}

impl Stream {
    /// The stream's settings checked; a resource's message names it.
    fn new(plan: StreamPlan) -> Result<Stream, String> {
        let named = |message: String| match plan.name.as_str() {
            resources::PRIMARY => message,
            name => format!("resources.{name}: {message}"),
        };
        let config = &plan.config;
        let incremental = config
            .incremental
            .as_ref()
            .map(|incremental| incremental.plan().map(Arc::new))
            .transpose()
            .map_err(named)?;
        let records_path = RecordsPath::parse(config.records_path.as_deref()).map_err(named)?;
        let filter = config
            .records_filter
            .as_ref()
            .map(|filter| filter.plan("records_filter"))
            .transpose()
            .map_err(named)?;
        Ok(Stream {
            id_spec: config.id_spec(),
            incremental,
            records_path,
            filter,
            plan,
        })
    }
}

impl RestProvider {
    /// Builds the adapter without an OAuth2 client secret (see
    /// [`RestProvider::with_client_secret`]). The configuration is expected to have passed
    /// [`RestConfig::validate`]; what is still wrong surfaces as an error of `fetch_page`.
    pub fn new(config: RestConfig, client: HttpClient) -> RestProvider {
        RestProvider::with_client_secret(config, client, None)
    }

    /// Builds the adapter with the OAuth2 client secret `auth.client_secret_env` names
    /// (ignored by the other kinds of `auth`).
    pub fn with_client_secret(
        config: RestConfig,
        client: HttpClient,
        client_secret: Option<SecretString>,
    ) -> RestProvider {
        let id_spec = config.id_spec();
        let streams = resources::plans(&config)
            .into_iter()
            .map(|(name, plan)| (name, plan.and_then(Stream::new).map(Arc::new)))
            .collect();
        let oauth2 = match &config.auth {
            Auth::OAuth2(settings) => {
                Some(OAuth2Runtime::new(settings, client.clone(), client_secret))
            }
            _ => None,
        };
        let rate_limiter = config.rate_limit.clone().map(rate_limit::RateLimiter::new);
        RestProvider {
            config,
            client,
            id_spec,
            streams,
            oauth2,
            rate_limiter,
        }
    }

    /// Builds the adapter, reading the OAuth2 client secret from the environment variable
    /// `auth.client_secret_env` names; an unset or empty one is a [`FetchError::Client`]
    /// naming it.
    pub fn from_env(config: RestConfig, client: HttpClient) -> Result<RestProvider, FetchError> {
        let client_secret = match &config.auth {
            Auth::OAuth2(settings) => oauth2::client_secret_from_env(settings)?,
            _ => None,
        };
        Ok(RestProvider::with_client_secret(
            config,
            client,
            client_secret,
        ))
    }

    /// The provider's configuration.
    pub fn config(&self) -> &RestConfig {
        &self.config
    }

    /// The stream called `name`, checked.
    fn stream(&self, name: &str) -> Result<Arc<Stream>, FetchError> {
        let (_, stream) = self
            .streams
            .iter()
            .find(|(stream, _)| stream == name)
            .ok_or_else(|| unknown_stream("rest", name))?;
        stream
            .clone()
            .map_err(|message| FetchError::Client { message })
    }

    /// One page of `stream`, listed with `config` (the stream's settings, rendered for the
    /// parent record of a child stream).
    async fn fetch(
        &self,
        stream: &Arc<Stream>,
        config: &RestConfig,
        token: Option<&str>,
        position: Option<&PagePosition>,
        since: Option<&Watermark>,
    ) -> Result<Page, FetchError> {
        let filter = match position {
            Some(PagePosition::RestartedPage { since, .. }) => restart_filter(stream, since)?,
            _ => run_filter(stream, since)?,
        };
        let mut url = pagination::page_url(config, position, filter.param.as_ref())?;
        if let Some(name) = self.config.auth_query_param() {
            pagination::set_query_param(&mut url, name, self.token(token)?);
        }
        let headers = self.request_headers(config, token)?;
        let auth_param = self.config.auth_query_param().map(str::to_string);
        let stream = Arc::clone(stream);
        let base_url = config.base_url.clone();
        let position = position.cloned();
        // The page is read on the thread that read its body, in the same step.
        let read = move |answered: &Answered<'_>| {
            let response = JsonResponse::read(answered)?;
            let listing = Listing {
                stream: &stream,
                base_url: &base_url,
                max_records: answered.max_records,
                older_than: filter.older_than,
            };
            let mut page = read_page(&response, &listing, position.as_ref())?;
            // A next URL that echoes the key is stored without it (it goes into the
            // checkpoint) and gets the key again when it is fetched.
            if let (Some(name), Some(PagePosition::Url { url })) = (&auth_param, &mut page.next) {
                *url = pagination::without_query_param(url, name);
            }
            Ok(page)
        };
        match &self.rate_limiter {
            None => {
                self.client
                    .get_read(url, headers, &DefaultPolicy, read)
                    .await
            }
            Some(limiter) => {
                let max_wait = self.client.settings().max_rate_limit_wait;
                limiter.wait_turn(token, max_wait).await?;
                let policy = limiter.policy(token);
                self.client.get_read(url, headers, &policy, read).await
            }
        }
    }

    /// `Accept`, the stream's static headers, then the token as `auth` says. Values are
    /// marked sensitive so they never show in `Debug` output.
    fn request_headers(
        &self,
        config: &RestConfig,
        token: Option<&str>,
    ) -> Result<HeaderMap, FetchError> {
        let mut headers = HeaderMap::new();
        headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
        for (name, value) in &config.headers {
            let invalid = |what: &str| FetchError::Client {
                message: format!("headers.{name} is not a valid HTTP header {what}"),
            };
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| invalid("name"))?;
            let mut value = HeaderValue::from_str(value).map_err(|_| invalid("value"))?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        if let Some((name, value)) = self.config.auth.header(token)? {
            headers.insert(name, value);
        }
        Ok(headers)
    }

    fn token<'a>(&self, token: Option<&'a str>) -> Result<&'a str, FetchError> {
        self.config.auth.token(token)
    }

    /// `account_id`'s request with `token`, and the id its pointer finds.
    async fn read_account_id(&self, token: Option<&str>) -> Result<Option<String>, FetchError> {
        let Some(account) = &self.config.account_id else {
            return Ok(None);
        };
        let mut url = crate::adapter::endpoint(&self.config.base_url, &account.path)?;
        if let Some(name) = self.config.auth_query_param() {
            pagination::set_query_param(&mut url, name, self.token(token)?);
        }
        let headers = self.request_headers(&self.config, token)?;
        let answer = self.client.get_json(url, headers).await?;
        Ok(answer
            .value()
            .pointer(&account.pointer)
            .and_then(crate::authorize::account_id_of))
    }

    /// One page of `stream` as `auth` says: with the connection's token, or an OAuth2
    /// access token refreshed or fetched as needed. Errors are cleaned of every secret the
    /// request may have carried.
    async fn fetch_authorized(
        &self,
        stream: &Arc<Stream>,
        config: &RestConfig,
        context: &FetchContext<'_>,
        position: Option<&PagePosition>,
    ) -> Result<Page, FetchError> {
        // Every secret a request may carry, so that errors can be cleaned of them.
        let mut seen = Vec::new();
        crate::oauth2::remember(&mut seen, context.credentials);
        let result = match &self.oauth2 {
            None => {
                // Tokens pasted from files often end in a newline; no token has outer
                // whitespace.
                let token = crate::adapter::token(context.credentials);
                seen.extend(self.config.auth.derived_secrets(token));
                self.fetch(stream, config, token, position, context.since)
                    .await
            }
            Some(OAuth2Runtime::RefreshToken(endpoint)) => {
                let refreshing = crate::oauth2::Refreshing {
                    store: context.credential_store,
                    refresher: endpoint.clone(),
                    now: chrono::Utc::now().timestamp(),
                    api: "rest",
                };
                let fetch = |credentials: crate::Credentials| async move {
                    let token = crate::adapter::token(&credentials);
                    self.fetch(stream, config, token, position, context.since)
                        .await
                };
                crate::oauth2::fetch_refreshing(refreshing, context.credentials, &mut seen, fetch)
                    .await
            }
            Some(OAuth2Runtime::ClientCredentials(cache)) => {
                let fetch = |token: SecretString| async move {
                    let token = Some(token.expose_secret());
                    self.fetch(stream, config, token, position, context.since)
                        .await
                };
                cache.fetch_with(&mut seen, fetch).await
            }
        };
        result.map_err(|error| {
            let secrets = seen.iter().map(|secret| secret.expose_secret().trim());
            error.redact_secrets(secrets)
        })
    }
}

/// `config` on the connection's own origin (a shop's), when it has one. A provider that
/// leaves `base_url` to its connections sends nothing for a connection without one.
fn on_connection_base<'c>(
    config: &'c RestConfig,
    base_url: Option<&Url>,
) -> Result<Cow<'c, RestConfig>, FetchError> {
    match base_url {
        Some(base_url) => Ok(Cow::Owned(RestConfig {
            base_url: base_url.clone(),
            ..config.clone()
        })),
        None if config.has_per_connection_base() => Err(FetchError::Client {
            message: "the connection has no base_url of its own, and its provider leaves \
                      base_url to each connection (auth = { shopify_app = ... }): connect the \
                      shop on the Connect page"
                .to_string(),
        }),
        None => Ok(Cow::Borrowed(config)),
    }
}

/// What an incremental run of `stream` stops at and sends, from the stream's cursor
/// `since`.
fn run_filter(
    stream: &Stream,
    since: Option<&Watermark>,
) -> Result<incremental::RunFilter, FetchError> {
    let Some(incremental) = &stream.incremental else {
        return Ok(incremental::RunFilter::default());
    };
    incremental
        .for_run(since)
        .map_err(|message| FetchError::Client { message })
}

/// What a listing started over past `pagination.max_page` from `since` sends.
fn restart_filter(
    stream: &Stream,
    since: &Watermark,
) -> Result<incremental::RunFilter, FetchError> {
    let Some(incremental) = &stream.incremental else {
        return Err(FetchError::Client {
            message: "a listing started over past pagination.max_page needs incremental"
                .to_string(),
        });
    };
    incremental
        .restart_from(since)
        .map_err(|message| FetchError::Client { message })
}

/// A page saying the parent's children cannot be listed, and why.
fn parent_gone(reason: String) -> Page {
    Page {
        parent_gone: Some(reason),
        ..Page::default()
    }
}

/// The fetch's outcome for a child stream, with a parent the API no longer knows (404 or
/// 410 on its children's listing) turned into a page saying the parent is gone, so the
/// pipeline goes on with the next one.
fn parent_gone_or(
    parent: &ParentRecord<'_>,
    fetched: Result<Page, FetchError>,
) -> Result<Page, FetchError> {
    match fetched {
        Err(FetchError::Status {
            status: status @ (404 | 410),
            message,
            ..
        }) => Ok(parent_gone(format!(
            "the API answered {status} listing the children of parent record {}: {}",
            quoted(parent.external_id),
            truncated(&message, MAX_QUOTED_CHARS)
        ))),
        other => other,
    }
}

impl ProviderKind for RestConfig {
    fn validate(&self) -> Result<(), String> {
        RestConfig::validate(self)
    }

    fn streams(&self) -> Vec<StreamSpec> {
        resources::streams(self)
    }

    fn needs_token(&self) -> bool {
        RestConfig::needs_token(self)
    }

    fn takes_key(&self) -> bool {
        RestConfig::needs_token(self)
            && !matches!(self.auth, auth::Auth::OAuth2(_) | auth::Auth::ShopifyApp(_))
    }

    fn required_env_vars(&self) -> Vec<(String, String)> {
        self.auth.required_env_vars()
    }

    fn authorization(&self) -> Option<crate::authorize::AuthorizationApp> {
        self.auth.authorization()
    }

    fn shopify_app(&self) -> Option<crate::shopify_app::ShopifyApp> {
        self.auth.shopify_app()
    }

    fn build(&self, client: HttpClient) -> Result<Box<dyn Provider>, FetchError> {
        let client = match self.auth_query_param() {
            Some(name) => client.hiding_query_param(name),
            None => client,
        };
        Ok(Box::new(RestProvider::from_env(self.clone(), client)?))
    }
}

#[async_trait::async_trait]
impl Provider for RestProvider {
    fn id_spec(&self) -> IdSpec {
        self.id_spec.clone()
    }

    fn id_spec_of(&self, stream: &str) -> IdSpec {
        match self.stream(stream) {
            Ok(stream) => stream.id_spec.clone(),
            Err(_) => self.id_spec.clone(),
        }
    }

    fn check_stored(&self, stream: &str, payload: &RawValue) -> Result<Record, RejectedRecord> {
        let Ok(stream) = self.stream(stream) else {
            return self.id_spec.identify_raw(payload);
        };
        match &stream.incremental {
            Some(incremental) => incremental.check_stored(&stream.id_spec, payload),
            None => stream.id_spec.identify_raw(payload),
        }
    }

    /// `account_id`'s request, when configured, with the connection's token.
    async fn account_id(
        &self,
        credentials: &crate::Credentials,
    ) -> Result<Option<String>, FetchError> {
        let token = crate::adapter::token(credentials);
        let mut secrets: Vec<String> = token.iter().map(|token| token.to_string()).collect();
        secrets.extend(
            self.config
                .auth
                .derived_secrets(token)
                .iter()
                .map(|secret| secret.expose_secret().to_string()),
        );
        self.read_account_id(token)
            .await
            .map_err(|error| error.redact_secrets(secrets.iter().map(String::as_str)))
    }

    async fn fetch_page(
        &self,
        context: &FetchContext<'_>,
        position: Option<&PagePosition>,
    ) -> Result<Page, FetchError> {
        let stream = self.stream(context.stream)?;
        let Some(parent_stream) = &stream.plan.parent else {
            let config = on_connection_base(&stream.plan.config, context.base_url)?;
            return self
                .fetch_authorized(&stream, &config, context, position)
                .await;
        };
        let Some(parent) = context.parent else {
            return Err(FetchError::Client {
                message: format!(
                    "the rest stream {} is listed once per record of {parent_stream}, but no \
                     parent record was given",
                    context.stream
                ),
            });
        };
        let config = match stream.plan.for_parent(&parent) {
            Ok(config) => config,
            // One parent without the fields the templates name costs that parent only.
            Err(reason) => return Ok(parent_gone(reason)),
        };
        let config = on_connection_base(&config, context.base_url)?;
        let fetched = self
            .fetch_authorized(&stream, &config, context, position)
            .await;
        parent_gone_or(&parent, fetched)
    }
}

/// How one stream's pages are read.
struct Listing<'a> {
    stream: &'a Stream,
    /// Next-page URLs are followed only on its origin.
    base_url: &'a Url,
    /// `max_records_per_page`.
    max_records: usize,
    /// With `incremental.stop_when_older` on an incremental run: the listing ends at the
    /// first record older than this.
    older_than: Option<DateTime<Utc>>,
}

/// One page: the records at `records_path` that `records_filter` keeps, keyed by the
/// stream's id, and where the next page starts.
fn read_page(
    response: &JsonResponse,
    listing: &Listing<'_>,
    position: Option<&PagePosition>,
) -> Result<Page, FetchError> {
    let stream = listing.stream;
    let text = response.body.get();
    let records = stream
        .records_path
        .read(&response.body, listing.max_records)
        .map_err(|not_records| match not_records {
            NotRecords::TooMany { count } => FetchError::TooManyRecords {
                url: display_url(&response.url),
                count,
                limit: listing.max_records,
                body: cap_body(text.as_bytes()),
            },
            NotRecords::Shape(message) => FetchError::Shape {
                url: display_url(&response.url),
                message,
                body: cap_body(text.as_bytes()),
            },
        })?;
    // Dropped records are as if the API had not listed them, but for pagination, which
    // goes by what the API listed.
    let kept: Cow<'_, [&RawValue]> = match &stream.filter {
        None => Cow::Borrowed(&records),
        Some(filter) => Cow::Owned(
            records
                .iter()
                .copied()
                .filter(|record| filter.keeps(record))
                .collect(),
        ),
    };
    let filtered = u64::try_from(records.len().saturating_sub(kept.len())).unwrap_or(u64::MAX);
    let read = match &stream.incremental {
        Some(incremental) => incremental.read_records(&stream.id_spec, &kept, listing.older_than),
        None => incremental::ReadRecords {
            items: crate::adapter::identify_records(&stream.id_spec, &kept, None).0,
            ..incremental::ReadRecords::default()
        },
    };
    // A record older than the cursor of a newest-first listing ends it here.
    let next = if read.ended {
        Ok(None)
    } else {
        let from = pagination::NextFrom {
            pagination: &stream.plan.config.pagination,
            base_url: listing.base_url,
            id_spec: &stream.id_spec,
            records: &records,
            newest: read.watermark.as_ref(),
            oldest: read.oldest.as_ref(),
        };
        pagination::next_position(&from, position, response)
    };
    // A page whose records can be read but whose next position cannot is stored, and
    // the run stops after it.
    let (next, stop_after) = match next {
        Ok(next) => (next, None),
        Err(FetchError::Shape { message, .. }) => (None, Some(message)),
        Err(other) => return Err(other),
    };
    Ok(Page {
        items: read.items,
        next,
        watermark: read.watermark,
        watermarks_ahead: read.ahead,
        stop_after,
        parent_gone: None,
        filtered,
    })
}
