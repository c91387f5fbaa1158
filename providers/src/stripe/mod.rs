//! `kind = "stripe"`: a Stripe account's charges, customers, invoices and their line items,
//! subscriptions, payment intents, refunds, products, prices and balance transactions.
//!
//! ```toml
//! [providers.stripe]
//! kind = "stripe"
//! # base_url = "https://api.stripe.com"
//! # limit = 100
//! # api_version = "2026-09-30.endive"
//! ```
//!
//! - The connection's token is the secret (or restricted) API key, sent as
//!   `Authorization: Bearer sk_...`.
//! - Every request sends `Stripe-Version`: `api_version`, by default
//!   [`DEFAULT_API_VERSION`], so listed objects keep one shape whatever the account's
//!   default version becomes. An event's `data.object` is rendered in the version of the
//!   event (the account's default when the event was created), not in `Stripe-Version`:
//!   keep the account's default version equal to `api_version` for records read from
//!   events to have the shape of listed ones.
//! - Lists are Stripe's list objects (`{"object": "list", "data": [...], "has_more": ...}`),
//!   newest first, `limit` objects a page, continued with `starting_after` = the last
//!   object's id while `has_more` is true. Records are keyed by `id`; no list is asked to
//!   `expand` anything, so related objects stay ids and a payload is the object as listed.
//!
//! # Streams
//!
//! Every stream's records are keyed by `id`.
//!
//! | stream | list | incremental run | deletions |
//! |---|---|---|---|
//! | `charges` (primary) | `GET /v1/charges` | events `charge.*` | none |
//! | `customers` | `GET /v1/customers` | events `customer.*` | `customer.deleted` |
//! | `invoices` | `GET /v1/invoices` | events `invoice.*` | `invoice.deleted` (drafts) |
//! | `subscriptions` | `GET /v1/subscriptions?status=all` | events `customer.subscription.*` | none |
//! | `payment_intents` | `GET /v1/payment_intents` | events `payment_intent.*` | none |
//! | `refunds` | `GET /v1/refunds` | events `refund.*` | none |
//! | `products` | `GET /v1/products` | events `product.*` | `product.deleted` |
//! | `prices` | `GET /v1/prices` | events `price.*` | `price.deleted` |
//! | `balance_transactions` | `GET /v1/balance_transactions` | the list, `created[gte]` | none |
//! | `invoice_line_items` | `GET /v1/invoices/{id}/lines` per stored invoice | listed in full | none |
//!
//! - `subscriptions` asks for `status=all`: without it Stripe leaves canceled subscriptions
//!   out. `customer.subscription.deleted` means canceled, not gone: it updates the record.
//! - `invoice_line_items` is a child of `invoices`: it is listed, in full on every run, for
//!   each invoice the pipeline stored (a line item has neither events nor a creation
//!   time). The invoice's id, the stored payload's `id` (else its key), is percent-encoded
//!   as a path segment. An invoice Stripe no longer has (404, a deleted draft) is reported
//!   as gone ([`Page::parent_gone`]) and its lines are skipped.
//!
//! # Cursors
//!
//! - A full pass (no cursor) lists the stream. Its first page's watermark is the time of
//!   the request, not the objects' `created`: the events after that moment are what the
//!   next run must read. Its other pages carry none.
//! - An incremental run of a stream with events reads `GET /v1/events` with
//!   `type=PREFIX.*` and `created[gte]` = the cursor (inclusive: boundary ties are read
//!   again and absorbed by the key). Each event's `data.object`, the object as it was at
//!   that moment and as received, becomes the record: an update to an old charge arrives
//!   as that charge's new payload. Events are applied oldest first, so that an older
//!   version never overwrites a newer one: the walk first goes back through the events
//!   (`starting_after`, pages without records, positions `events-back:ID`) to the oldest,
//!   then forward (`ending_before`, each page reversed to oldest first, positions
//!   `events-forward:ID`). A page's watermark is its newest event's `created`; the first
//!   page's is at least the request time less five minutes (and never below the cursor),
//!   so a quiet account's cursor does not age.
//! - The deletion event of an object Stripe really deletes becomes a
//!   [`PageItem::Deleted`](crate::PageItem::Deleted) holding the object's last state.
//!   Events that match the prefix but hold another kind of object (`charge.dispute.*`
//!   holds disputes, `customer.discount.deleted` a discount) are skipped, as is
//!   `invoice.upcoming` (an invoice that does not exist yet).
//! - Stripe keeps events 30 days. A cursor older than that, less a two-day margin, makes
//!   the run a full pass instead, with a warning naming the stream and the cursor's age.
//! - `balance_transactions` has no events (Stripe sends none for balance transactions): an
//!   incremental run lists those created at or after the cursor, the newest `created`
//!   seen. One whose `status` later moves from `pending` to `available` is seen again only
//!   by a full pass.
//! - List pages hand on `list:ID` positions (a bare id, as written before streams, reads
//!   the same); a position that fits none of these is refused with an error naming it.
//!
//! # Errors
//!
//! 429 and 5xx are retried with backoff; a `Stripe-Should-Retry` header overrides that
//! either way; Stripe's error body `{"error": {"type", "code", "message"}}` is
//!   surfaced; 401 is [`FetchError::Unauthorized`].

mod config;
mod events;
mod list;
mod position;
mod streams;
#[cfg(test)]
mod tests;

use chrono::Utc;
use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION};
use serde_json::Value;

pub use config::{StripeConfig, DEFAULT_API_VERSION};

use crate::adapter;
use crate::http::{Answer, Answered, HttpClient, ResponsePolicy, Verdict};
use crate::kind::ProviderKind;
use crate::quote::quote_cursor;
use crate::stream::unknown_stream;
use crate::{FetchContext, FetchError, Page, PagePosition, Provider, StreamSpec};
use events::EventsPage;
use list::ListPage;
use position::{Plan, StripePosition};
use streams::{Changes, Stream, STREAMS};

/// The adapter for one `kind = "stripe"` provider.
///
/// Cursors are inclusive (`created[gte]`): a cursor is a whole second, and other objects
/// or events may share that second without having been read yet. Boundary ties are read
/// again and absorbed by the key instead of being skipped.
#[derive(Clone, Debug)]
pub struct StripeProvider {
    config: StripeConfig,
    client: HttpClient,
}

impl StripeProvider {
    /// Builds the adapter. The configuration is expected to have passed
    /// [`StripeConfig::validate`].
    pub fn new(config: StripeConfig, client: HttpClient) -> StripeProvider {
        StripeProvider { config, client }
    }

    fn headers(&self, token: &str) -> Result<HeaderMap, FetchError> {
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, adapter::bearer("stripe", token)?);
        let version = &self.config.api_version;
        let version = HeaderValue::from_str(version).map_err(|_| FetchError::Client {
            message: format!("api_version {version:?} cannot be sent as a header"),
        })?;
        headers.insert("stripe-version", version);
        Ok(headers)
    }

    async fn fetch(
        &self,
        context: &FetchContext<'_>,
        token: &str,
        position: Option<&PagePosition>,
    ) -> Result<Page, FetchError> {
        let stream = Stream::named(context.stream)
            .ok_or_else(|| unknown_stream("stripe", context.stream))?;
        let position = position.map(StripePosition::parse).transpose()?;
        let plan = position::plan(stream, context.since, position, Utc::now())?;
        let headers = self.headers(token)?;
        match plan {
            Plan::List(page) => self.fetch_list(context, stream, page, headers).await,
            Plan::Events(page) => self.fetch_events(page, headers).await,
        }
    }

    /// A page of the stream's own list (for line items, of the context's invoice).
    async fn fetch_list(
        &self,
        context: &FetchContext<'_>,
        stream: &'static Stream,
        page: ListPage,
        headers: HeaderMap,
    ) -> Result<Page, FetchError> {
        let invoice_id = match stream.changes {
            Changes::PerInvoice => {
                let parent = list::parent_of(stream, context.parent)?;
                match streams::invoice_id(&parent) {
                    Ok(id) => Some(id),
                    Err(reason) => return Ok(list::parent_gone(reason)),
                }
            }
            Changes::Events(_) | Changes::Created => None,
        };
        let url = page.url(
            &self.config.base_url,
            stream,
            invoice_id.as_deref(),
            self.config.limit,
        )?;
        let watermark = page.watermark;
        let read =
            move |answered: &Answered<'_>| list::read_page(answered, stream.object, watermark);
        let answer = self
            .client
            .get_read(url, headers, &StripePolicy, read)
            .await;
        match (answer, invoice_id) {
            // A draft invoice deleted since it was stored: its lines went with it.
            (Err(error), Some(id)) if matches!(error, FetchError::Status { status: 404, .. }) => {
                let reason = format!(
                    "Stripe has no invoice {} any more: {error}",
                    quote_cursor(&id)
                );
                Ok(list::parent_gone(reason))
            }
            (answer, _) => answer,
        }
    }

    /// A page of the events walk.
    async fn fetch_events(&self, page: EventsPage, headers: HeaderMap) -> Result<Page, FetchError> {
        let url = page.url(&self.config.base_url, self.config.limit)?;
        let read = move |answered: &Answered<'_>| page.read_page(answered);
        self.client
            .get_read(url, headers, &StripePolicy, read)
            .await
    }
}

impl ProviderKind for StripeConfig {
    fn validate(&self) -> Result<(), String> {
        StripeConfig::validate(self)
    }

    fn streams(&self) -> Vec<StreamSpec> {
        STREAMS.iter().map(Stream::spec).collect()
    }

    fn build(&self, client: HttpClient) -> Result<Box<dyn Provider>, FetchError> {
        Ok(Box::new(StripeProvider::new(self.clone(), client)))
    }
}

#[async_trait::async_trait]
impl Provider for StripeProvider {
    async fn fetch_page(
        &self,
        context: &FetchContext<'_>,
        position: Option<&PagePosition>,
    ) -> Result<Page, FetchError> {
        let token = adapter::token(context.credentials)
            .ok_or_else(|| adapter::missing_token("stripe", "a Stripe secret API key"))?;
        match self.fetch(context, token, position).await {
            Ok(mut page) => {
                // Stripe's message is quoted in the reason, and a token never is.
                page.parent_gone = page.parent_gone.map(|reason| redacted(reason, token));
                Ok(page)
            }
            Err(error) => Err(error.redact_secret(token)),
        }
    }

    /// One object of `stream`'s list (`limit=1`): a restricted key is checked for the
    /// permission the sync needs, which `GET /v1/account` would not show.
    async fn verify_credentials(
        &self,
        credentials: &crate::Credentials,
        stream: &str,
    ) -> Result<(), FetchError> {
        let token = adapter::token(credentials)
            .ok_or_else(|| adapter::missing_token("stripe", "a Stripe secret API key"))?;
        let stream = Stream::named(stream).ok_or_else(|| unknown_stream("stripe", stream))?;
        let page = ListPage {
            after: None,
            created_gte: None,
            watermark: list::ListWatermark::Without,
        };
        let checked = async {
            let url = page.url(&self.config.base_url, stream, None, 1)?;
            let read = move |answered: &Answered<'_>| {
                list::read_page(answered, stream.object, list::ListWatermark::Without)
            };
            self.client
                .get_read(url, self.headers(token)?, &StripePolicy, read)
                .await
        };
        checked
            .await
            .map(|_| ())
            .map_err(|error| error.redact_secret(token))
    }

    /// `GET /v1/account`: the account the key belongs to (`acct_...`).
    async fn account_id(
        &self,
        credentials: &crate::Credentials,
    ) -> Result<Option<String>, FetchError> {
        let token = adapter::token(credentials)
            .ok_or_else(|| adapter::missing_token("stripe", "a Stripe secret API key"))?;
        let answered = async {
            let url = adapter::endpoint(&self.config.base_url, "/v1/account")?;
            self.client
                .get_json_with(url, self.headers(token)?, &StripePolicy)
                .await
        };
        let answer = answered.await.map_err(|error| error.redact_secret(token))?;
        Ok(answer
            .value()
            .get("id")
            .and_then(crate::authorize::account_id_of))
    }
}

/// `text` with `secret` (never empty: blank tokens are refused) replaced.
fn redacted(text: String, secret: &str) -> String {
    text.replace(secret, "[redacted]")
}

/// How Stripe's answers are read: `Stripe-Should-Retry` and its JSON error bodies.
struct StripePolicy;

impl ResponsePolicy for StripePolicy {
    fn classify(&self, answer: &Answer<'_>, default: Verdict) -> Verdict {
        let verdict = default.with_message(error_message(answer));
        match answer.header("stripe-should-retry") {
            Some("false") => verdict.fail(),
            Some("true") if !matches!(verdict.error(), FetchError::Unauthorized { .. }) => {
                verdict.retry(answer.retry_after())
            }
            _ => verdict,
        }
    }
}

/// Stripe's error body `{"error": {"type", "code", "message"}}` as one line, or the start
/// of the body when it is not that.
fn error_message(answer: &Answer<'_>) -> String {
    let Some(body) = answer.json() else {
        return answer.excerpt();
    };
    let Some(error) = body.get("error") else {
        return answer.excerpt();
    };
    let field = |name: &str| error.get(name).and_then(Value::as_str);
    let message = field("message").unwrap_or("no message");
    match (field("type"), field("code")) {
        (Some(kind), Some(code)) => format!("{message} (type {kind}, code {code})"),
        (Some(kind), None) => format!("{message} (type {kind})"),
        (None, Some(code)) => format!("{message} (code {code})"),
        (None, None) if field("message").is_some() => message.to_string(),
        (None, None) => answer.excerpt(),
    }
}
