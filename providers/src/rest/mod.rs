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
//! - `config`: [`RestConfig`] and its validation.
//! - `auth`: [`Auth`], its TOML forms and the headers it sends.
//! - `oauth2`: the OAuth2 grants at run time.
//! - `incremental`: [`IncrementalConfig`], the cursor sent, the watermark read, and where a
//!   newest-first listing ends.
//! - `pagination`: page URLs and next positions for every pagination type.
//! - `field_path`: dotted paths whose quoted segments may hold dots (`"@odata.nextLink"`).
//! - `link`: the RFC 8288 `Link` header parser behind `type = "link"`.

mod auth;
mod config;
mod field_path;
mod incremental;
pub(crate) mod link;
mod oauth2;
mod pagination;
#[cfg(test)]
mod tests;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, ACCEPT};
use secrecy::{ExposeSecret, SecretString};

pub use auth::{ClientAuth, Grant, OAuth2};
pub use config::{Auth, PaginationConfig, PaginationType, RestConfig};
pub use incremental::IncrementalConfig;

use std::sync::Arc;

use chrono::{DateTime, Utc};
use url::Url;

use incremental::Incremental;

use crate::adapter::unreadable_records;
use crate::config::ProviderKind;
use crate::http::{cap_body, display_url, Answered, DefaultPolicy, HttpClient, JsonResponse};
use crate::raw::{array_items, lookup_raw};
use crate::stream::unknown_stream;
use crate::{
    FetchContext, FetchError, IdSpec, Page, PagePosition, Provider, StreamSpec, Watermark,
};
use oauth2::OAuth2Runtime;

/// The adapter for one `kind = "rest"` provider.
#[derive(Clone, Debug)]
pub struct RestProvider {
    config: RestConfig,
    client: HttpClient,
    id_spec: IdSpec,
    /// The checked `incremental` settings, or why they are wrong.
    incremental: Result<Option<Arc<Incremental>>, String>,
    /// How OAuth2 access tokens are had, for `auth = { oauth2 = ... }`.
    oauth2: Option<OAuth2Runtime>,
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
        let incremental = config
            .incremental
            .as_ref()
            .map(|incremental| incremental.plan().map(Arc::new))
            .transpose();
        let oauth2 = match &config.auth {
            Auth::OAuth2(settings) => {
                Some(OAuth2Runtime::new(settings, client.clone(), client_secret))
            }
            _ => None,
        };
        RestProvider {
            config,
            client,
            id_spec,
            incremental,
            oauth2,
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

    async fn fetch(
        &self,
        token: Option<&str>,
        position: Option<&PagePosition>,
        since: Option<&Watermark>,
    ) -> Result<Page, FetchError> {
        let (incremental, filter) = self.run_filter(since)?;
        let mut url = pagination::page_url(&self.config, position, filter.param.as_ref())?;
        if let Some(name) = self.config.auth_query_param() {
            pagination::set_query_param(&mut url, name, self.token(token)?);
        }
        let headers = self.request_headers(token)?;
        let auth_param = self.config.auth_query_param().map(str::to_string);
        let pagination = self.config.pagination.clone();
        let records_path = self.config.records_path.clone().unwrap_or_default();
        let id_spec = self.id_spec.clone();
        let base_url = self.config.base_url.clone();
        let position = position.cloned();
        // The page is read on the thread that read its body, in the same step.
        let read = move |answered: &Answered<'_>| {
            let response = JsonResponse::read(answered)?;
            let listing = Listing {
                records_path: &records_path,
                pagination: &pagination,
                base_url: &base_url,
                id_spec: &id_spec,
                max_records: answered.max_records,
                incremental: incremental.as_deref(),
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
        self.client
            .get_read(url, headers, &DefaultPolicy, read)
            .await
    }

    /// The incremental settings and what this run sends and stops at, from the stream's
    /// cursor `since`.
    fn run_filter(
        &self,
        since: Option<&Watermark>,
    ) -> Result<(Option<Arc<Incremental>>, incremental::RunFilter), FetchError> {
        let client_error = |message: String| FetchError::Client { message };
        let Some(incremental) = self.incremental.clone().map_err(client_error)? else {
            return Ok((None, incremental::RunFilter::default()));
        };
        let filter = incremental.for_run(since).map_err(client_error)?;
        Ok((Some(incremental), filter))
    }

    /// `Accept`, the static headers, then the token as `auth` says. Values are marked
    /// sensitive so they never show in `Debug` output.
    fn request_headers(&self, token: Option<&str>) -> Result<HeaderMap, FetchError> {
        let mut headers = HeaderMap::new();
        headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
        for (name, value) in &self.config.headers {
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
}

impl ProviderKind for RestConfig {
    fn validate(&self) -> Result<(), String> {
        RestConfig::validate(self)
    }

    fn streams(&self) -> Vec<StreamSpec> {
        vec![StreamSpec::top("records")]
    }

    fn needs_token(&self) -> bool {
        RestConfig::needs_token(self)
    }

    fn required_env_vars(&self) -> Vec<(String, String)> {
        self.auth.required_env_vars()
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

    async fn fetch_page(
        &self,
        context: &FetchContext<'_>,
        position: Option<&PagePosition>,
    ) -> Result<Page, FetchError> {
        if context.stream != "records" {
            return Err(unknown_stream("rest", context.stream));
        }
        // Every secret a request may carry, so that errors can be cleaned of them.
        let mut seen = Vec::new();
        crate::oauth2::remember(&mut seen, context.credentials);
        let result = match &self.oauth2 {
            None => {
                // Tokens pasted from files often end in a newline; no token has outer
                // whitespace.
                let token = crate::adapter::token(context.credentials);
                seen.extend(self.config.auth.derived_secrets(token));
                self.fetch(token, position, context.since).await
            }
            Some(OAuth2Runtime::RefreshToken(endpoint)) => {
                let refreshing = crate::oauth2::Refreshing {
                    store: context.credential_store,
                    refresher: endpoint.clone(),
                    now: chrono::Utc::now().timestamp(),
                    api: "rest",
                };
                let fetch = |credentials: crate::Credentials| async move {
                    self.fetch(crate::adapter::token(&credentials), position, context.since)
                        .await
                };
                crate::oauth2::fetch_refreshing(refreshing, context.credentials, &mut seen, fetch)
                    .await
            }
            Some(OAuth2Runtime::ClientCredentials(cache)) => {
                let fetch = |token: SecretString| async move {
                    self.fetch(Some(token.expose_secret()), position, context.since)
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

/// How the provider's pages are read.
struct Listing<'a> {
    records_path: &'a str,
    pagination: &'a PaginationConfig,
    /// Next-page URLs are followed only on its origin.
    base_url: &'a Url,
    id_spec: &'a IdSpec,
    /// `max_records_per_page`.
    max_records: usize,
    /// The `incremental` settings, when set.
    incremental: Option<&'a Incremental>,
    /// With `incremental.stop_when_older` on an incremental run: the listing ends at the
    /// first record older than this.
    older_than: Option<DateTime<Utc>>,
}

/// One page: the records at `records_path` keyed by `id_spec`, and where the next page
/// starts.
fn read_page(
    response: &JsonResponse,
    listing: &Listing<'_>,
    position: Option<&PagePosition>,
) -> Result<Page, FetchError> {
    let path = listing.records_path;
    let text = response.body.get();
    let Some(found) = lookup_raw(&response.body, path) else {
        return Err(FetchError::Shape {
            url: display_url(&response.url),
            message: format!("records_path `{path}` is not in the body"),
            body: cap_body(text.as_bytes()),
        });
    };
    let records = array_items(found, listing.max_records).map_err(|not_items| {
        unreadable_records(
            &response.url,
            text,
            listing.max_records,
            not_items,
            |kind| {
                if path.is_empty() {
                    format!(
                        "the body is {}, expected an array of records (set records_path to the \
                     dotted path of the array)",
                        kind.name()
                    )
                } else {
                    format!(
                        "records_path `{path}` is {}, expected an array of records",
                        kind.name()
                    )
                }
            },
        )
    })?;
    let read = match listing.incremental {
        Some(incremental) => {
            incremental.read_records(listing.id_spec, &records, listing.older_than)
        }
        None => incremental::ReadRecords {
            items: crate::adapter::identify_records(listing.id_spec, &records, None).0,
            ..incremental::ReadRecords::default()
        },
    };
    // A record older than the cursor of a newest-first listing ends it here.
    let next = if read.ended {
        Ok(None)
    } else {
        let from = pagination::NextFrom {
            pagination: listing.pagination,
            base_url: listing.base_url,
            id_spec: listing.id_spec,
            records: &records,
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
    })
}
