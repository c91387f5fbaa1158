//! Provider adapters for tributary.
//!
//! # Layout
//! - [`Provider`]: the one trait every adapter implements. The pipeline drives it page by
//!   page: it asks for a page at a [`PagePosition`], stores what comes back, and asks for the
//!   next one.
//! - [`http`]: the shared HTTP client (timeouts, retries with backoff and jitter, 429 with
//!   `Retry-After`, a cap on the body size). Every adapter talks to its API through it; an
//!   adapter whose API signals more than the status says plugs in a
//!   [`http::ResponsePolicy`].
//! - [`record`]: turning a raw JSON record into a [`Record`] keyed by its external id, or into
//!   a [`RejectedRecord`] that keeps the raw payload for the error report.
//! - [`rest`]: `kind = "rest"`, the declarative provider configured wholly in TOML.
//! - [`github`]: `kind = "github"`, the issues visible to the connected GitHub user, and
//!   their repositories with each one's pull requests and issue comments.
//! - [`stripe`]: `kind = "stripe"`, a Stripe account's charges, customers, invoices and
//!   their line items, subscriptions and more, kept current through Stripe's Events API.
//! - [`strava`]: `kind = "strava"`, the connected athlete's activities and profile, with
//!   OAuth2 refresh and the application's shared rate-limit budget.
//! - [`authorize`]: the authorization code grant with PKCE the Connect page runs;
//!   [`shopify_app`]: Shopify's per-shop grant (the shop check, the signed callback, the
//!   exchange on the shop's host), not yet offered on the page.
//! - `oauth2`: what the OAuth2 adapters share: reading a token endpoint's answer and
//!   refreshing a connection's access token through the [`CredentialStore`].
//! - [`config`]: [`ProviderConfig`], the per-kind configuration, and [`build_provider`], the
//!   registry that turns it into a `Box<dyn Provider>`; [`kind`]: [`ProviderKind`], the
//!   trait each kind's config implements.
//!
//! Providers never touch the database: they return pages, and only the pipeline writes.

pub mod authorize;
pub mod bounds;
pub mod config;
pub mod github;
pub mod http;
pub mod kind;
pub mod presets;
pub mod quote;
pub mod raw;
pub mod record;
pub mod rest;
pub mod shopify_app;
pub mod strava;
pub mod stripe;

mod adapter;
mod credentials;
mod oauth2;
mod page;
mod stream;
#[cfg(test)]
mod test_support;

pub use adapter::is_loopback;
pub use config::{build_provider, ProviderConfig};
pub use credentials::Credentials;
pub use http::{FetchError, HttpClient, HttpSettings};
pub use kind::ProviderKind;
pub use page::{DeletedRecord, Page, PageItem, PagePosition, Watermark, WATERMARK_CLOCK_SKEW};
pub use record::{IdSpec, Record, RecordStage, RejectedRecord};
pub use stream::{ParentRecord, StreamSpec};

/// What one page fetch may use: the stream it belongs to, the connection's credentials, its
/// incremental watermark, and the store that persists refreshed credentials.
pub struct FetchContext<'a> {
    /// The stream the page belongs to: one of the names [`ProviderKind::streams`] lists.
    pub stream: &'a str,
    /// For a child stream, the parent record whose children are listed; `None` otherwise.
    pub parent: Option<ParentRecord<'a>>,
    /// The connection's credentials as stored when the run started.
    pub credentials: &'a Credentials,
    /// Fetch only what changed since this watermark; `None` for a full pass.
    pub since: Option<&'a Watermark>,
    /// Persists refreshed OAuth credentials (see [`CredentialStore`]).
    pub credential_store: &'a dyn CredentialStore,
    /// The connection's own API origin, in place of the provider's `base_url` (a Shopify
    /// shop connected on the Connect page); `None`: the provider's.
    pub base_url: Option<&'a url::Url>,
}

/// Refreshes expired OAuth credentials. Implemented by the providers that need it.
#[async_trait::async_trait]
pub trait TokenRefresher: Send + Sync {
    /// Spends `current.refresh_token` on new credentials at the API.
    async fn refresh(&self, current: &Credentials) -> Result<Credentials, FetchError>;
}

/// The pipeline's side of a token refresh. Providers never touch the database; they ask
/// this store, which the pipeline implements over the `connections` row.
#[async_trait::async_trait]
pub trait CredentialStore: Send + Sync {
    /// Refreshes the connection's credentials, serialised per connection: the store claims
    /// the connection's row, and if the stored credentials no longer match `stale`
    /// (another run refreshed them first) returns the stored ones without a refresh.
    /// Otherwise it calls `refresher`, commits the new credentials, and only then returns
    /// them, so a refresh token an API rotates is never lost by a crash before use. The
    /// refresher is shared so that the store may finish a refresh its caller stopped
    /// waiting for.
    async fn refresh(
        &self,
        stale: &Credentials,
        refresher: std::sync::Arc<dyn TokenRefresher>,
    ) -> Result<Credentials, FetchError>;
}

/// A [`CredentialStore`] for connections whose credentials are never refreshed: asking it
/// to refresh is an error naming why.
pub struct NoCredentialStore;

#[async_trait::async_trait]
impl CredentialStore for NoCredentialStore {
    async fn refresh(
        &self,
        _stale: &Credentials,
        _refresher: std::sync::Arc<dyn TokenRefresher>,
    ) -> Result<Credentials, FetchError> {
        Err(FetchError::MissingCredentials {
            message: "the credentials expired and cannot be refreshed here".to_string(),
        })
    }
}

impl<'a> FetchContext<'a> {
    /// A full pass of `stream` with credentials that are never refreshed (tests, one-off
    /// fetches).
    pub fn full(credentials: &'a Credentials, stream: &'a str) -> FetchContext<'a> {
        FetchContext {
            stream,
            parent: None,
            credentials,
            since: None,
            credential_store: &NoCredentialStore,
            base_url: None,
        }
    }
}

/// One adapter for one configured provider (e.g. `[providers.acme]`).
///
/// An implementation fetches one page per call and never holds more than that page: the
/// pipeline decides when to ask for the next one, so memory stays bounded by the page size.
#[async_trait::async_trait]
pub trait Provider: Send + Sync {
    /// Fetches the page at `position` (`None` is the first page) with the connection's
    /// credentials. Per-record problems are returned inside the page as
    /// [`PageItem::Rejected`]; an `Err` means the page itself could not be had.
    async fn fetch_page(
        &self,
        context: &FetchContext<'_>,
        position: Option<&PagePosition>,
    ) -> Result<Page, FetchError>;

    /// Checks `credentials` with one light request before a key pasted on the Connect
    /// page is saved: [`FetchError::Unauthorized`] when the API refuses them. By default,
    /// the first page of `stream` (a stream without a parent).
    async fn verify_credentials(
        &self,
        credentials: &Credentials,
        stream: &str,
    ) -> Result<(), FetchError> {
        self.fetch_page(&FetchContext::full(credentials, stream), None)
            .await
            .map(|_| ())
    }

    /// The provider-side account `credentials` belong to (a GitHub user id, a Stripe
    /// account), read with one request when a user connects on the Connect page; `None`
    /// when the provider has no such request. By default, `None`.
    async fn account_id(&self, _credentials: &Credentials) -> Result<Option<String>, FetchError> {
        Ok(None)
    }

    /// How this provider keys its records; replays re-key stored payloads with it. The
    /// built-in APIs key on `id`; the `rest` provider on its configured `id_field` or
    /// `key_fields`.
    fn id_spec(&self) -> IdSpec {
        IdSpec::Field("id".to_string())
    }

    /// How the records of `stream` are keyed (a `rest` resource may key on other fields
    /// than the primary stream). By default, [`Provider::id_spec`].
    fn id_spec_of(&self, _stream: &str) -> IdSpec {
        self.id_spec()
    }

    /// A record of `stream` stored as received (a replayed error's payload), keyed and
    /// checked as [`Provider::fetch_page`] checks a fetched one, or set aside with the
    /// reason. By default, keyed by [`Provider::id_spec_of`].
    fn check_stored(
        &self,
        stream: &str,
        payload: &serde_json::value::RawValue,
    ) -> Result<Record, RejectedRecord> {
        self.id_spec_of(stream).identify_raw(payload)
    }
}
