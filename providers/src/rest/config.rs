//! The configuration of a `kind = "rest"` provider: `[providers.NAME]` and its
//! `pagination`, `query`, `headers` and `resources` tables.

use std::collections::BTreeMap;
use std::fmt;

use reqwest::header::{HeaderName, HeaderValue};
use serde::Deserialize;
use url::Url;

pub use super::auth::Auth;
use super::field_path::FieldPath;
use super::filter::RecordsFilter;
use super::incremental::IncrementalConfig;
use super::rate_limit::RateLimitConfig;
use super::records_path::RecordsPath;
use super::resources::ResourceConfig;
use crate::IdSpec;

/// The `base_url` of a provider whose connections each bring their own (a Shopify app's
/// shops). `.invalid` never resolves (RFC 6761), and a connection without a base of its
/// own is refused before any request.
pub const PER_CONNECTION_BASE_URL: &str = "https://per-connection.invalid/";

fn per_connection_base_url() -> Url {
    // A constant, checked by the tests of `auth = { shopify_app = ... }`.
    #[allow(clippy::expect_used)]
    Url::parse(PER_CONNECTION_BASE_URL).expect("PER_CONNECTION_BASE_URL is a URL")
}

/// The largest `pagination.page_size`.
const MAX_PAGE_SIZE: u64 = 100_000;
/// The largest `pagination.first_page`: APIs count pages from 0 or 1.
const MAX_FIRST_PAGE: u64 = 1_000_000;

/// A REST API that lists records as JSON pages, described wholly in TOML. Its `Debug` hides
/// every header value and the values of secret query parameters.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestConfig {
    /// Scheme, host and optional path prefix of the API, e.g. `"https://api.example.com/v2"`.
    /// Must be http or https, without a query string (use `query` for that). Required,
    /// except with `auth = { shopify_app = ... }`, whose connections each have their own
    /// (their shop's origin): left out, it is [`PER_CONNECTION_BASE_URL`].
    #[serde(default = "per_connection_base_url")]
    pub base_url: Url,
    /// Path of the list endpoint, appended to `base_url` (its trailing slash trimmed), e.g.
    /// `"/v1/items"`. Default: empty, `base_url` itself is the endpoint.
    #[serde(default)]
    pub path: String,
    /// Dotted path of the array of records in the JSON body, e.g. `"data"` or
    /// `"result.items"`. A segment ending in `[]` names an array whose elements the rest of
    /// the path is followed in: `"data.groups[].items"` yields every item of every group,
    /// in order, and `max_records_per_page` counts them together. Omitted: the body itself
    /// is the array.
    #[serde(default)]
    pub records_path: Option<String>,
    /// Dotted path of each record's stable id (a non-empty string or an integer), e.g.
    /// `"id"`. Default `"id"` unless `key_fields` is given; setting both is an error.
    #[serde(default)]
    pub id_field: Option<String>,
    /// For records without a stable id: the immutable fields (dotted paths) whose values,
    /// hashed, become the id, e.g. `["date", "type"]`. Not together with `id_field`.
    #[serde(default)]
    pub key_fields: Option<Vec<String>>,
    /// How requests are authenticated: `"bearer"` (`Authorization: Bearer TOKEN`),
    /// `"none"`, `{ header = "X-Api-Key" }` (the token as that header's value),
    /// `{ query = "api_key" }` (the token as that query parameter, for APIs that take
    /// nothing else; its value is hidden wherever a URL is quoted), `"basic"` (the token
    /// is `USER:PASSWORD`, sent as HTTP basic credentials), `{ basic = "USER" }` (the token
    /// is USER's password), or `{ oauth2 = "refresh_token" | "client_credentials",
    /// token_url, client_id, client_secret_env, scope, client_auth }` (an access token
    /// from an OAuth2 token endpoint; see [`Auth`]). Default `"bearer"`.
    #[serde(default)]
    pub auth: Auth,
    /// How pages are walked: `[providers.NAME.pagination]`. Default: one page, no pagination.
    #[serde(default)]
    pub pagination: PaginationConfig,
    /// Static query parameters sent on every request built from `base_url` and `path`
    /// (`link` and `next_url` pagination follow the API's next URLs as they are), and on
    /// every resource's, whose own `query` is merged over them. Never templates: braces are
    /// sent as they are.
    #[serde(default)]
    pub query: BTreeMap<String, String>,
    /// Static headers sent on every request, every resource's included (a resource's own
    /// `headers` are merged over them). Not for the token: `auth` sends that. Never
    /// templates.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Incremental sync: `incremental = { cursor_field = "updated_at", param = "since" }`
    /// (see [`IncrementalConfig`]). Omitted: every run is a full pass.
    #[serde(default)]
    pub incremental: Option<IncrementalConfig>,
    /// Keeps only the records that pass one test, e.g.
    /// `records_filter = { field = "status", not_in = ["deleted"] }` (see
    /// [`RecordsFilter`]); the others are dropped and counted, neither stored nor errors.
    /// Omitted: every record is kept.
    #[serde(default)]
    pub records_filter: Option<RecordsFilter>,
    /// More fields (dotted paths) of these records that a child resource's templates may
    /// name as `{parent.FIELD}`, e.g. `["owner.login"]`. A parent already has its id field
    /// (`id_field`, or `"id"` by default), its `key_fields` and its
    /// `incremental.cursor_field`.
    #[serde(default)]
    pub fields: Vec<String>,
    /// More streams of the same API: `[providers.NAME.resources.RESOURCE]` tables (see
    /// [`ResourceConfig`]), each synced as the stream named RESOURCE (lowercase letters,
    /// digits and `_`, not `records`). The keys above describe the primary stream,
    /// `records`; `streams = [...]` picks among `records` and the resources' names.
    #[serde(default)]
    pub resources: BTreeMap<String, ResourceConfig>,
    /// The API's own rate-limit headers: `rate_limit = { remaining_header, reset_header,
    /// reset }` (see [`RateLimitConfig`]). Omitted: only `Retry-After` is read.
    #[serde(default)]
    pub rate_limit: Option<RateLimitConfig>,
    /// `account_id = { path = "/v1/me", pointer = "/data/id" }`: where one request with a
    /// connection's token tells its provider-side account, read when a user connects on
    /// the Connect page. Optional.
    #[serde(default)]
    pub account_id: Option<AccountIdConfig>,
}

/// `account_id`: the request that names the account a token belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountIdConfig {
    /// Appended to `base_url`, e.g. `"/v1/me"`.
    pub path: String,
    /// A JSON pointer (RFC 6901) to the id in the answer, e.g. `"/data/id"`.
    pub pointer: String,
}

impl fmt::Debug for RestConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RestConfig")
            .field("base_url", &crate::http::display_url(&self.base_url))
            .field("path", &self.path)
            .field("records_path", &self.records_path)
            .field("id_field", &self.id_field)
            .field("key_fields", &self.key_fields)
            .field("auth", &self.auth)
            .field("pagination", &self.pagination)
            .field("query", &shown_query(&self.query))
            .field("headers", &hidden_headers(&self.headers))
            .field("incremental", &self.incremental)
            .field("records_filter", &self.records_filter)
            .field("fields", &self.fields)
            .field("resources", &self.resources)
            .field("rate_limit", &self.rate_limit)
            .field("account_id", &self.account_id)
            .finish()
    }
}

/// The query parameters for `Debug`, the values of secret ones hidden.
pub(super) fn shown_query(query: &BTreeMap<String, String>) -> BTreeMap<&str, &str> {
    query
        .iter()
        .map(|(name, value)| {
            let shown = if crate::http::is_secret_param(name) {
                "[REDACTED]"
            } else {
                value.as_str()
            };
            (name.as_str(), shown)
        })
        .collect()
}

/// The headers for `Debug`: their names, every value hidden.
pub(super) fn hidden_headers(headers: &BTreeMap<String, String>) -> BTreeMap<&str, &str> {
    headers
        .keys()
        .map(|name| (name.as_str(), "[REDACTED]"))
        .collect()
}

/// The pagination styles (`pagination.type`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PaginationType {
    /// The body carries the next page's token (`cursor_path`), sent back as `cursor_param`.
    Cursor,
    /// `offset_param` counts records from 0, advancing by the records of each page.
    Offset,
    /// `page_param` counts pages from `first_page`.
    Page,
    /// The `Link` response header's `rel="next"` URL (RFC 8288), followed as is.
    Link,
    /// The body carries the next page's URL (`next_url_path`), followed as is.
    NextUrl,
    /// A response header (`next_header`) carries the next page's token, sent back as
    /// `cursor_param`.
    Header,
    /// Stripe style: the body's boolean (`has_more_path`) says whether more pages follow,
    /// and the last record's `id_field` is sent as `after_param`.
    HasMore,
    /// One request, one page.
    #[default]
    None,
}

/// `[providers.NAME.pagination]`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PaginationConfig {
    /// `"cursor"`, `"offset"`, `"page"`, `"link"`, `"next_url"`, `"header"`, `"has_more"`
    /// or `"none"`. Default `"none"`. Every type ends a run that is handed the same
    /// position twice; offset and page, whose positions only count forward, end one whose
    /// page holds the same records as the page before.
    #[serde(rename = "type")]
    pub kind: PaginationType,
    /// cursor: dotted path of the next page's token in the body (a string or a number;
    /// null, missing or `""` means this was the last page). Required for `"cursor"`.
    pub cursor_path: Option<String>,
    /// cursor, header: the query parameter that sends the token back. Required for
    /// `"cursor"` and `"header"`.
    pub cursor_param: Option<String>,
    /// Optional query parameter that sends `page_size` on every request, e.g. `"limit"`.
    /// For offset and page pagination it also lets a short page end the walk.
    pub page_size_param: Option<String>,
    /// Records per page asked for with `page_size_param`. 1 to 100,000, default 100.
    pub page_size: u64,
    /// offset: the query parameter of the record offset (0 on the first page). Default
    /// `"offset"`.
    pub offset_param: Option<String>,
    /// page: the query parameter of the page number. Default `"page"`.
    pub page_param: Option<String>,
    /// page: the number of the first page. 0 to 1,000,000, default 1.
    pub first_page: Option<u64>,
    /// page: the last page the API serves (Freshdesk refuses page 301). With it the
    /// listing, which must be sorted oldest change first, is read by the newest change:
    /// after each full page the next request asks with `incremental.param` from the
    /// newest `incremental.cursor_field` read, inclusively, at `first_page` again, so no
    /// page number grows past the cap and a record that moves to the end of the listing
    /// during the walk pushes none past a page boundary. Only while a page's records all
    /// share one time does the page number grow; a walk that reaches `max_page` that way
    /// with no newer time to start over from stops after it with the reason. Needs `incremental.param`. At
    /// least `first_page`.
    pub max_page: Option<u64>,
    /// next_url: dotted path of the next page's URL in the body, e.g. `"links.next"`; a
    /// segment in double quotes may hold dots, as OData's key does: `'"@odata.nextLink"'`.
    /// An absolute URL is followed only on the origin of `base_url` (another origin stops
    /// the run with the reason, so the token never leaves); one without a scheme is
    /// appended to `base_url` the way `path` is. Null, missing or `""` means this was the
    /// last page; any other non-string is an error. Required for `"next_url"`.
    pub next_url_path: Option<String>,
    /// header: the response header holding the next page's token, e.g.
    /// `"X-Next-Page-Token"`; absent or empty means this was the last page. Required for
    /// `"header"`.
    pub next_header: Option<String>,
    /// has_more: dotted path of the boolean that says more pages follow. False or missing
    /// means this was the last page; any other non-boolean is an error, and so is true on
    /// a page without records (there is no id to go on from). Default `"has_more"`.
    pub has_more_path: Option<String>,
    /// has_more: the query parameter that sends the last record's `id_field`, e.g.
    /// `"starting_after"`. Required for `"has_more"`, which needs `id_field` (not
    /// `key_fields`).
    pub after_param: Option<String>,
}

impl Default for PaginationConfig {
    fn default() -> Self {
        PaginationConfig {
            kind: PaginationType::None,
            cursor_path: None,
            cursor_param: None,
            page_size_param: None,
            page_size: 100,
            offset_param: None,
            page_param: None,
            first_page: None,
            max_page: None,
            next_url_path: None,
            next_header: None,
            has_more_path: None,
            after_param: None,
        }
    }
}

impl PaginationType {
    /// The TOML value, for messages.
    pub fn as_str(self) -> &'static str {
        match self {
            PaginationType::Cursor => "cursor",
            PaginationType::Offset => "offset",
            PaginationType::Page => "page",
            PaginationType::Link => "link",
            PaginationType::NextUrl => "next_url",
            PaginationType::Header => "header",
            PaginationType::HasMore => "has_more",
            PaginationType::None => "none",
        }
    }
}

impl PaginationConfig {
    /// `offset_param`, or its default `"offset"`.
    pub fn offset_param(&self) -> &str {
        self.offset_param.as_deref().unwrap_or("offset")
    }

    /// `page_param`, or its default `"page"`.
    pub fn page_param(&self) -> &str {
        self.page_param.as_deref().unwrap_or("page")
    }

    /// `first_page`, or its default 1.
    pub fn first_page(&self) -> u64 {
        self.first_page.unwrap_or(1)
    }

    /// `has_more_path`, or its default `"has_more"`.
    pub fn has_more_path(&self) -> &str {
        self.has_more_path.as_deref().unwrap_or("has_more")
    }

    fn validate(&self) -> Result<(), String> {
        let kind = self.kind;
        crate::bounds::count_in(self.page_size, 1, MAX_PAGE_SIZE)
            .map_err(crate::bounds::named("pagination.page_size"))?;
        crate::bounds::count_in(self.first_page(), 0, MAX_FIRST_PAGE)
            .map_err(crate::bounds::named("pagination.first_page"))?;
        let required = |key: &str, value: &Option<String>| match value.as_deref() {
            None => Err(format!(
                "pagination.{key} is required when pagination.type = \"{}\"",
                kind.as_str()
            )),
            Some(v) if v.trim().is_empty() => Err(format!("pagination.{key} must not be empty")),
            Some(_) => Ok(()),
        };
        match kind {
            PaginationType::Cursor => {
                required("cursor_path", &self.cursor_path)?;
                required("cursor_param", &self.cursor_param)?;
            }
            PaginationType::NextUrl => required("next_url_path", &self.next_url_path)?,
            PaginationType::Header => {
                required("next_header", &self.next_header)?;
                required("cursor_param", &self.cursor_param)?;
            }
            PaginationType::HasMore => required("after_param", &self.after_param)?,
            PaginationType::Offset
            | PaginationType::Page
            | PaginationType::Link
            | PaginationType::None => {}
        }
        use PaginationType::{Cursor, HasMore, Header, NextUrl, Offset, Page};
        if let Some(max_page) = self.max_page.filter(|max| *max < self.first_page()) {
            return Err(format!(
                "pagination.max_page must be at least pagination.first_page ({}), got \
                 {max_page}",
                self.first_page()
            ));
        }
        let used_by: [(&str, bool, &[PaginationType]); 10] = [
            ("cursor_path", self.cursor_path.is_some(), &[Cursor]),
            (
                "cursor_param",
                self.cursor_param.is_some(),
                &[Cursor, Header],
            ),
            ("offset_param", self.offset_param.is_some(), &[Offset]),
            ("page_param", self.page_param.is_some(), &[Page]),
            ("first_page", self.first_page.is_some(), &[Page]),
            ("max_page", self.max_page.is_some(), &[Page]),
            ("next_url_path", self.next_url_path.is_some(), &[NextUrl]),
            ("next_header", self.next_header.is_some(), &[Header]),
            ("has_more_path", self.has_more_path.is_some(), &[HasMore]),
            ("after_param", self.after_param.is_some(), &[HasMore]),
        ];
        for (key, set, owners) in used_by {
            if set && !owners.contains(&kind) {
                let owners: Vec<String> = owners
                    .iter()
                    .map(|owner| format!("\"{}\"", owner.as_str()))
                    .collect();
                return Err(format!(
                    "pagination.{key} is set, but pagination.type = \"{}\" does not use it \
                     (it belongs to pagination.type = {})",
                    kind.as_str(),
                    owners.join(" or ")
                ));
            }
        }
        for (key, value) in [
            ("next_url_path", &self.next_url_path),
            ("has_more_path", &self.has_more_path),
        ] {
            if let Some(path) = value {
                FieldPath::parse(path).map_err(|message| format!("pagination.{key} {message}"))?;
            }
        }
        if let Some(name) = &self.next_header {
            HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                format!("pagination.next_header {name:?} is not a valid HTTP header name")
            })?;
        }
        for (key, value) in [
            ("page_size_param", &self.page_size_param),
            ("offset_param", &self.offset_param),
            ("page_param", &self.page_param),
            ("after_param", &self.after_param),
        ] {
            if value.as_deref().is_some_and(|v| v.trim().is_empty()) {
                return Err(format!("pagination.{key} must not be empty"));
            }
        }
        Ok(())
    }
}

impl RestConfig {
    /// Whether `base_url` was left out: each connection brings its own.
    pub fn has_per_connection_base(&self) -> bool {
        self.base_url.as_str() == PER_CONNECTION_BASE_URL
    }

    /// The list endpoint: `base_url` (trailing slash trimmed) + `path`, without the static
    /// query parameters. A `path` without a leading `/` gets one.
    pub fn endpoint(&self) -> Result<Url, String> {
        let base = self.base_url.as_str().trim_end_matches('/');
        let joined = if self.path.is_empty() || self.path.starts_with('/') {
            format!("{base}{}", self.path)
        } else {
            format!("{base}/{}", self.path)
        };
        Url::parse(&joined).map_err(|err| {
            format!(
                "base_url + path ({}) is not a valid URL: {err}",
                crate::http::display_url_text(&joined)
            )
        })
    }

    /// How records are identified: `key_fields` when given, else `id_field` (default `"id"`).
    pub fn id_spec(&self) -> IdSpec {
        match &self.key_fields {
            Some(fields) => IdSpec::KeyFields(fields.clone()),
            None => IdSpec::Field(self.id_field.clone().unwrap_or_else(|| "id".to_string())),
        }
    }

    /// Checks what serde cannot and returns a message naming the key that is wrong: the
    /// primary stream's keys, then every resource with what it inherits.
    pub fn validate(&self) -> Result<(), String> {
        if self.has_per_connection_base() && !matches!(self.auth, Auth::ShopifyApp(_)) {
            return Err(
                "base_url is required (only auth = { shopify_app = ... } leaves it out, its \
                 connections each having their shop's)"
                    .to_string(),
            );
        }
        self.validate_stream()?;
        if let Some(account) = &self.account_id {
            if !account.path.starts_with('/') {
                return Err(format!(
                    "account_id.path {:?} must start with '/', as \"/v1/me\"",
                    account.path
                ));
            }
            if !account.pointer.starts_with('/') {
                return Err(format!(
                    "account_id.pointer {:?} must be a JSON pointer, as \"/data/id\"",
                    account.pointer
                ));
            }
        }
        if let Some(rate_limit) = &self.rate_limit {
            rate_limit.validate()?;
        }
        super::resources::validate(self)
    }

    /// Checks the keys of one stream: the primary one, or a resource merged with what it
    /// inherits.
    pub(super) fn validate_stream(&self) -> Result<(), String> {
        let endpoint = self.endpoint()?;
        if !matches!(endpoint.scheme(), "http" | "https") {
            return Err(format!(
                "base_url must be an http or https URL, not {}:",
                endpoint.scheme()
            ));
        }
        if self.base_url.query().is_some() || self.base_url.fragment().is_some() {
            return Err(
                "base_url must not carry a query string or fragment; put static query \
                 parameters in [providers.NAME.query]"
                    .to_string(),
            );
        }
        match (&self.id_field, &self.key_fields) {
            (Some(_), Some(_)) => {
                return Err("id_field and key_fields are both set; set only one".to_string())
            }
            (Some(field), None) if field.trim().is_empty() => {
                return Err("id_field must not be empty".to_string())
            }
            (None, Some(fields)) if fields.is_empty() => {
                return Err("key_fields must name at least one field".to_string())
            }
            (None, Some(fields)) if fields.iter().any(|f| f.trim().is_empty()) => {
                return Err("key_fields must not contain an empty field name".to_string())
            }
            _ => {}
        }
        self.auth.validate()?;
        for (name, value) in &self.headers {
            let parsed = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("headers.{name} is not a valid HTTP header name"))?;
            HeaderValue::from_str(value)
                .map_err(|_| format!("headers.{name} is not a valid HTTP header value"))?;
            if let Some(auth_header) = self.auth_header() {
                if parsed == auth_header {
                    return Err(format!(
                        "headers.{name} would clash with the header auth = {} sends; set \
                         auth = \"none\" to send it yourself",
                        self.auth
                    ));
                }
            }
        }
        if self.query.keys().any(|key| key.is_empty()) {
            return Err("query must not contain an empty parameter name".to_string());
        }
        if let Auth::Query { name } = &self.auth {
            if name.trim().is_empty() {
                return Err("auth.query must name a query parameter".to_string());
            }
            if self.query.contains_key(name) {
                return Err(format!(
                    "query.{name} would clash with the parameter auth = {} sends",
                    self.auth
                ));
            }
            let pagination = &self.pagination;
            let reserved = [
                pagination.cursor_param.as_deref(),
                pagination.page_size_param.as_deref(),
                (pagination.kind == PaginationType::Offset).then(|| pagination.offset_param()),
                (pagination.kind == PaginationType::Page).then(|| pagination.page_param()),
            ];
            if reserved.contains(&Some(name.as_str())) {
                return Err(format!(
                    "auth.query {name:?} is also a pagination parameter; pick the name the API \
                     expects the key under"
                ));
            }
        }
        self.pagination.validate()?;
        RecordsPath::parse(self.records_path.as_deref())?;
        if let Some(filter) = &self.records_filter {
            filter.plan("records_filter")?;
        }
        for field in &self.fields {
            FieldPath::parse(field).map_err(|message| format!("fields: {field:?} {message}"))?;
        }
        self.validate_listing()
    }

    /// The checks of `has_more` pagination and `incremental` that look at more than their
    /// own table: the id `after_param` sends, and parameter names that would clash.
    fn validate_listing(&self) -> Result<(), String> {
        let pagination = &self.pagination;
        if pagination.kind == PaginationType::HasMore && self.key_fields.is_some() {
            return Err(
                "pagination.type = \"has_more\" sends the last record's id_field as \
                 pagination.after_param, so it needs id_field, not key_fields"
                    .to_string(),
            );
        }
        let incremental_param = match &self.incremental {
            Some(incremental) => {
                incremental.plan()?;
                incremental.param.as_deref()
            }
            None => None,
        };
        if pagination.max_page.is_some() && incremental_param.is_none() {
            return Err(
                "pagination.max_page starts the listing over from the newest \
                 incremental.cursor_field read, so it needs incremental.param to ask from it"
                    .to_string(),
            );
        }
        // Every parameter the requests built from base_url and path may carry.
        let mut sent: Vec<(String, &str)> = self
            .query
            .keys()
            .map(|name| (format!("query.{name}"), name.as_str()))
            .collect();
        let kind = pagination.kind;
        let in_use = [
            (
                "pagination.page_size_param",
                pagination.page_size_param.as_deref(),
            ),
            (
                "pagination.cursor_param",
                pagination.cursor_param.as_deref(),
            ),
            (
                "pagination.offset_param",
                (kind == PaginationType::Offset).then(|| pagination.offset_param()),
            ),
            (
                "pagination.page_param",
                (kind == PaginationType::Page).then(|| pagination.page_param()),
            ),
            ("auth.query", self.auth_query_param()),
        ];
        sent.extend(
            in_use
                .into_iter()
                .filter_map(|(key, name)| name.map(|name| (key.to_string(), name))),
        );
        let new = [
            ("pagination.after_param", pagination.after_param.as_deref()),
            ("incremental.param", incremental_param),
        ];
        for (key, name) in new {
            let Some(name) = name else { continue };
            if let Some((other, _)) = sent.iter().find(|(_, sent)| *sent == name) {
                return Err(format!(
                    "{key} {name:?} is also {other}; a request cannot carry both"
                ));
            }
            sent.push((key.to_string(), name));
        }
        Ok(())
    }

    /// Whether connections need a token (see [`Auth::needs_token`]).
    pub fn needs_token(&self) -> bool {
        self.auth.needs_token()
    }

    /// The header `auth` sends the token in, if any.
    pub(crate) fn auth_header(&self) -> Option<HeaderName> {
        self.auth.header_name()
    }

    /// The query parameter `auth` sends the token in, if any.
    pub fn auth_query_param(&self) -> Option<&str> {
        self.auth.query_param()
    }
}
