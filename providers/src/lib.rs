//! Provider adapters for tributary.
//!
//! # Layout
//! - [`Provider`]: the one trait every adapter implements. The pipeline drives it page by
//!   page: it asks for a page at a [`PagePosition`], stores what comes back, and asks for the
//!   next one.
//! - [`http`]: the shared HTTP client (timeouts, retries with backoff and jitter, 429 with
//!   `Retry-After`, a cap on the body size). Every adapter talks to its API through it.
//! - [`record`]: turning a raw JSON record into a [`Record`] keyed by its external id, or into
//!   a [`RejectedRecord`] that keeps the raw payload for the error report.
//! - [`rest`]: `kind = "rest"`, the declarative provider configured wholly in TOML.
//! - [`config`]: [`ProviderConfig`], the per-kind configuration, and [`build_provider`], the
//!   registry that turns it into a `Box<dyn Provider>`.
//!
//! Providers never touch the database: they return pages, and only the pipeline writes.

pub mod config;
pub mod http;
pub mod record;
pub mod rest;

mod page;

pub use config::{build_provider, ProviderConfig};
pub use http::{FetchError, HttpClient, HttpSettings};
pub use page::{Credentials, Page, PageItem, PagePosition};
pub use record::{IdSpec, Record, RecordStage, RejectedRecord};

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
        credentials: &Credentials,
        position: Option<&PagePosition>,
    ) -> Result<Page, FetchError>;
}
