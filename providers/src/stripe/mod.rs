//! `kind = "stripe"`: the account's charges, from Stripe's API (`GET /v1/charges`).
//!
//! ```toml
//! [providers.stripe]
//! kind = "stripe"
//! # base_url = "https://api.stripe.com"
//! # limit = 100
//! # api_version = "2025-03-31.basil"
//! ```
//!
//! - The connection's token is the secret (or restricted) API key, sent as
//!   `Authorization: Bearer sk_...`.
//! - `api_version`, when set, is sent as `Stripe-Version`, so the charges keep the shape of
//!   that version whatever the account's default version becomes; without it, Stripe
//!   answers in the account's default version.
//! - Pages are Stripe's list objects (`{"object": "list", "data": [...], "has_more": ...}`),
//!   continued with `starting_after` = the last charge's id while `has_more` is true.
//! - Incremental: `created[gte]` is the connection's watermark, the largest `created` seen
//!   (see [`StripeProvider`] for why `gte`).
//! - Errors: 429 and 5xx are retried with backoff; a `Stripe-Should-Retry` header overrides
//!   that either way; Stripe's error body `{"error": {"type", "code", "message"}}` is
//!   surfaced; 401 is [`FetchError::Unauthorized`].

#[cfg(test)]
mod tests;

use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use url::Url;

use crate::adapter;
use crate::config::ProviderKind;
use crate::http::{cap_body, display_url, Answer, Answered, HttpClient, ResponsePolicy, Verdict};
use crate::raw::{array_items, lookup_raw, text_kind, to_value, ListShape, RawList, RawObject};
use crate::record::json_type_name;
use crate::stream::unknown_stream;
use crate::{FetchContext, FetchError, Page, PagePosition, Provider, StreamSpec};

/// The configuration of a `kind = "stripe"` provider.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StripeConfig {
    /// The API root. Default `"https://api.stripe.com"`.
    #[serde(default = "default_base_url")]
    pub base_url: Url,
    /// Charges per page (`limit`), 1 to 100. Default 100.
    #[serde(default = "default_limit")]
    pub limit: u32,
    /// The API version to pin (`Stripe-Version`), e.g. `"2025-03-31.basil"`. Default: the
    /// account's default version.
    #[serde(default)]
    pub api_version: Option<String>,
}

fn default_base_url() -> Url {
    Url::parse("https://api.stripe.com").expect("the default base_url is a valid URL")
}

fn default_limit() -> u32 {
    100
}

impl Default for StripeConfig {
    fn default() -> Self {
        StripeConfig {
            base_url: default_base_url(),
            limit: default_limit(),
            api_version: None,
        }
    }
}

impl StripeConfig {
    /// Checks what serde cannot and returns a message naming the key that is wrong.
    pub fn validate(&self) -> Result<(), String> {
        adapter::validate_base_url("base_url", &self.base_url)?;
        if !(1..=100).contains(&self.limit) {
            return Err(format!(
                "limit must be between 1 and 100 (Stripe's largest page), not {}",
                self.limit
            ));
        }
        if let Some(version) = &self.api_version {
            if !is_api_version(version) {
                return Err(format!(
                    "api_version must be a Stripe API version such as \"2024-06-20\" or \
                     \"2025-03-31.basil\", not {version:?}"
                ));
            }
        }
        Ok(())
    }
}

/// Whether `text` has the shape of a Stripe API version: a date (`2024-06-20`), perhaps
/// followed by a release name (`.basil`).
fn is_api_version(text: &str) -> bool {
    let (date, name) = match text.split_once('.') {
        Some((date, name)) => (date, Some(name)),
        None => (text, None),
    };
    let date_shaped = date.len() == 10
        && date.char_indices().all(|(index, c)| match index {
            4 | 7 => c == '-',
            _ => c.is_ascii_digit(),
        });
    let name_shaped =
        name.is_none_or(|name| !name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase()));
    date_shaped && name_shaped
}

/// The adapter for one `kind = "stripe"` provider.
///
/// Incremental runs ask for `created[gte]=WATERMARK`, not `created[gt]`: the watermark is
/// the largest `created` (whole seconds) a run has seen, and other charges may share that
/// second without having been fetched yet. Stripe supports the inclusive `gte`, so boundary
/// ties are fetched again and absorbed by the key instead of being skipped.
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

    /// The URL of the page after the charge `starting_after` (`None`: the first page).
    fn page_url(
        &self,
        context: &FetchContext<'_>,
        starting_after: Option<&str>,
    ) -> Result<Url, FetchError> {
        let mut url = adapter::endpoint(&self.config.base_url, "/v1/charges")?;
        {
            let mut query = url.query_pairs_mut();
            query.append_pair("limit", &self.config.limit.to_string());
            if let Some(id) = starting_after {
                query.append_pair("starting_after", id);
            }
            if let Some(since) = context.since {
                query.append_pair("created[gte]", &adapter::watermark_epoch(since).to_string());
            }
        }
        Ok(url)
    }

    async fn fetch(
        &self,
        context: &FetchContext<'_>,
        token: &str,
        position: Option<&PagePosition>,
    ) -> Result<Page, FetchError> {
        let starting_after = match position {
            None => None,
            Some(PagePosition::Cursor { cursor }) => Some(cursor.as_str()),
            Some(other) => {
                return Err(adapter::position_mismatch(
                    "stripe",
                    other,
                    "cursor (starting_after)",
                ))
            }
        };
        let url = self.page_url(context, starting_after)?;
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, adapter::bearer("stripe", token)?);
        if let Some(version) = &self.config.api_version {
            let version = HeaderValue::from_str(version).map_err(|_| FetchError::Client {
                message: format!("api_version {version:?} cannot be sent as a header"),
            })?;
            headers.insert("stripe-version", version);
        }
        // The page is read where its body is, in the scan that checks it is JSON.
        self.client
            .get_read(url, headers, &StripePolicy, read_list)
            .await
    }
}

/// The list's fields with `data` read in the same scan that checks the body is JSON, or
/// by the slower way when that fails (e.g. a number past f64 in `data`, which only the
/// record-by-record scan keeps). `None` when the body is not a JSON object.
fn read_list_fields(text: &str, max_records: usize) -> Option<RawList<'_>> {
    let shape = ListShape {
        key: "data",
        fields: &["has_more"],
        max_items: max_records,
    };
    RawList::parse_text(text, shape).or_else(|| {
        let body: &RawValue = serde_json::from_str(text).ok()?;
        let fields = RawObject::parse(body, &["data", "has_more"])?;
        let items = fields
            .get("data")
            .map(|data| array_items(data, max_records));
        Some(RawList { fields, items })
    })
}

/// One page of a Stripe list (`{"object": "list", "data": [...], "has_more": ...}`): its
/// charges keyed by `id`, the next `starting_after` and the newest `created`.
fn read_list(answered: &Answered<'_>) -> Result<Page, FetchError> {
    let text = answered.text;
    let shape = |message: String| FetchError::Shape {
        url: display_url(answered.url),
        message,
        body: cap_body(text.as_bytes()),
    };
    let list = read_list_fields(text, answered.max_records).ok_or_else(|| {
        shape(format!(
            "the body is {}, expected a Stripe list object",
            text_kind(text).name()
        ))
    })?;
    let records = match list.items {
        Some(Ok(records)) => records,
        Some(Err(not_items)) => {
            let max = answered.max_records;
            return Err(adapter::unreadable_records(
                answered.url,
                text,
                max,
                not_items,
                |kind| format!("`data` is {}, expected an array of charges", kind.name()),
            ));
        }
        None => {
            return Err(shape(
                "`data` is missing, expected an array of charges".into(),
            ))
        }
    };
    let last_id = records
        .last()
        .and_then(|last| lookup_raw(last, "id"))
        .map(to_value);
    let next = match (list.fields.get("has_more").map(to_value), last_id) {
        (Some(Value::Bool(false)), _) => None,
        (Some(Value::Bool(true)), Some(Value::String(id))) if !id.is_empty() => {
            Some(PagePosition::Cursor { cursor: id })
        }
        (Some(Value::Bool(true)), _) => {
            return Err(shape(
                "`has_more` is true, but the page has no last charge with a string `id` to \
                 continue after"
                    .to_string(),
            ));
        }
        (found, _) => {
            let found = found.as_ref().map_or("missing", json_type_name);
            return Err(shape(format!(
                "`has_more` is {found}, expected a boolean (is this a Stripe list?)"
            )));
        }
    };
    let created = adapter::WatermarkField::Epoch("created");
    Ok(adapter::page_by_id(&records, created, next))
}

impl ProviderKind for StripeConfig {
    fn validate(&self) -> Result<(), String> {
        StripeConfig::validate(self)
    }

    fn streams(&self) -> Vec<StreamSpec> {
        vec![StreamSpec::top("charges")]
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
        if context.stream != "charges" {
            return Err(unknown_stream("stripe", context.stream));
        }
        let token = adapter::token(context.credentials)
            .ok_or_else(|| adapter::missing_token("stripe", "a Stripe secret API key"))?;
        self.fetch(context, token, position)
            .await
            .map_err(|error| error.redact_secret(token))
    }
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
