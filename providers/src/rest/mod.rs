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
//! [providers.acme.pagination]
//! type = "cursor"
//! cursor_path = "next_cursor"
//! cursor_param = "cursor"
//! ```
//!
//! - `config`: [`RestConfig`] and its validation.
//! - `pagination`: page URLs and next positions for cursor, offset, page, link and none.
//! - `link`: the RFC 8288 `Link` header parser behind `type = "link"`.

mod config;
pub(crate) mod link;
mod pagination;
#[cfg(test)]
mod tests;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, ACCEPT, AUTHORIZATION};
use secrecy::ExposeSecret;

pub use config::{Auth, PaginationConfig, PaginationType, RestConfig};

use crate::adapter::unreadable_records;
use crate::config::ProviderKind;
use crate::http::{cap_body, display_url, Answered, DefaultPolicy, HttpClient, JsonResponse};
use crate::raw::{array_items, lookup_raw};
use crate::stream::unknown_stream;
use crate::{FetchContext, FetchError, IdSpec, Page, PagePosition, Provider, StreamSpec};

/// The adapter for one `kind = "rest"` provider.
#[derive(Clone, Debug)]
pub struct RestProvider {
    config: RestConfig,
    client: HttpClient,
    id_spec: IdSpec,
}

impl RestProvider {
    /// Builds the adapter. The configuration is expected to have passed
    /// [`RestConfig::validate`]; what is still wrong surfaces as an error of `fetch_page`.
    pub fn new(config: RestConfig, client: HttpClient) -> RestProvider {
        let id_spec = config.id_spec();
        RestProvider {
            config,
            client,
            id_spec,
        }
    }

    /// The provider's configuration.
    pub fn config(&self) -> &RestConfig {
        &self.config
    }

    async fn fetch(
        &self,
        token: Option<&str>,
        position: Option<&PagePosition>,
    ) -> Result<Page, FetchError> {
        let mut url = pagination::page_url(&self.config, position)?;
        if let Some(name) = self.config.auth_query_param() {
            pagination::set_query_param(&mut url, name, self.token(token)?);
        }
        let headers = self.request_headers(token)?;
        let auth_param = self.config.auth_query_param().map(str::to_string);
        let pagination = self.config.pagination.clone();
        let records_path = self.config.records_path.clone().unwrap_or_default();
        let id_spec = self.id_spec.clone();
        let position = position.cloned();
        // The page is read on the thread that read its body, in the same step.
        let read = move |answered: &Answered<'_>| {
            let response = JsonResponse::read(answered)?;
            let listing = Listing {
                records_path: &records_path,
                pagination: &pagination,
                id_spec: &id_spec,
                max_records: answered.max_records,
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
        let (name, value) = match &self.config.auth {
            Auth::None | Auth::Query { .. } => return Ok(headers),
            Auth::Bearer => (AUTHORIZATION, format!("Bearer {}", self.token(token)?)),
            Auth::Header { name } => {
                let name =
                    HeaderName::from_bytes(name.as_bytes()).map_err(|_| FetchError::Client {
                        message: format!("auth.header {name:?} is not a valid HTTP header name"),
                    })?;
                (name, self.token(token)?.to_string())
            }
        };
        let mut value =
            HeaderValue::from_str(&value).map_err(|_| FetchError::MissingCredentials {
                message: format!(
                    "the connection's token cannot be sent with auth = {}: it contains characters \
                 that are not allowed in an HTTP header",
                    self.config.auth
                ),
            })?;
        value.set_sensitive(true);
        headers.insert(name, value);
        Ok(headers)
    }

    fn token<'a>(&self, token: Option<&'a str>) -> Result<&'a str, FetchError> {
        token.ok_or_else(|| FetchError::MissingCredentials {
            message: format!(
                "connection has no token, but auth = {} needs one",
                self.config.auth
            ),
        })
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

    fn build(&self, client: HttpClient) -> Result<Box<dyn Provider>, FetchError> {
        let client = match self.auth_query_param() {
            Some(name) => client.hiding_query_param(name),
            None => client,
        };
        Ok(Box::new(RestProvider::new(self.clone(), client)))
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
        let credentials = context.credentials;
        // Tokens pasted from files often end in a newline; no token has outer whitespace.
        let token = credentials
            .token
            .as_ref()
            .map(|token| token.expose_secret().trim())
            .filter(|token| !token.is_empty());
        let result = self.fetch(token, position).await;
        match token {
            Some(secret) => result.map_err(|error| error.redact_secret(secret)),
            None => result,
        }
    }
}

/// How the provider's pages are read.
struct Listing<'a> {
    records_path: &'a str,
    pagination: &'a PaginationConfig,
    id_spec: &'a IdSpec,
    /// `max_records_per_page`.
    max_records: usize,
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
    let count = u64::try_from(records.len()).unwrap_or(u64::MAX);
    // A page whose records can be read but whose next position cannot is stored, and
    // the run stops after it.
    let next = pagination::next_position(listing.pagination, position, response, count);
    let (next, stop_after) = match next {
        Ok(next) => (next, None),
        Err(FetchError::Shape { message, .. }) => (None, Some(message)),
        Err(other) => return Err(other),
    };
    let (items, _) = crate::adapter::identify_records(listing.id_spec, &records, None);
    Ok(Page {
        items,
        next,
        watermark: None,
        watermarks_ahead: 0,
        stop_after,
        parent_gone: None,
    })
}
