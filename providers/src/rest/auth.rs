//! How a `kind = "rest"` provider authenticates (`auth`): the connection's token as a
//! bearer token, a header, a query parameter or an HTTP basic password, or an access token
//! from an OAuth2 token endpoint (`oauth2`, which runs the grants).
//!
//! ```toml
//! auth = "bearer"                      # Authorization: Bearer TOKEN (the default)
//! auth = "none"
//! auth = { header = "X-Api-Key" }      # the token as this header's value
//! auth = { query = "api_key" }         # the token as this query parameter
//! auth = "basic"                       # the token is USER:PASSWORD
//! auth = { basic = "api" }             # the token is the password of user "api"
//!
//! [providers.acme.auth]
//! oauth2 = "refresh_token"             # or "client_credentials"
//! token_url = "https://auth.acme.example/oauth/token"
//! client_id = "tributary"
//! client_secret_env = "ACME_CLIENT_SECRET"
//! scope = "items:read"                 # optional
//! client_auth = "post"                 # or "basic"; default "post"
//! authorize_url = "https://auth.acme.example/oauth/authorize"  # the Connect page's consent
//! pkce = true                          # default true
//!
//! # Shopify's per-shop authorization code grant (docs/decisions/connect-shopify.md):
//! # the token goes in X-Shopify-Access-Token, each connection on its own shop.
//! auth = { shopify_app = { client_id = "...", client_secret_env = "SHOPIFY_SECRET", scope = "read_orders" } }
//! ```

use std::collections::BTreeMap;
use std::fmt;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use reqwest::header::{HeaderName, HeaderValue, AUTHORIZATION};
use secrecy::SecretString;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;
use url::Url;

use crate::authorize::AuthorizationApp;
use crate::http::display_url_text;
pub use crate::oauth2::ClientAuth;
use crate::shopify_app::ShopifyApp;
use crate::FetchError;

/// How requests are authenticated (`auth`).
// One value per configured provider, built once at start: boxing the OAuth2 variant
// would save nothing worth an indirection.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Auth {
    /// `auth = "bearer"`: `Authorization: Bearer TOKEN`.
    #[default]
    Bearer,
    /// `auth = "none"`: the API needs no token.
    None,
    /// `auth = { header = "X-Api-Key" }`: the token, as is, as the value of this header.
    Header {
        /// The header's name.
        name: String,
    },
    /// `auth = { query = "api_key" }`: the token, as is, as the value of this query
    /// parameter of every request.
    Query {
        /// The parameter's name.
        name: String,
    },
    /// HTTP basic authentication (RFC 7617), `Authorization: Basic base64(USER:PASSWORD)`.
    /// `auth = "basic"`: each connection's token is `USER:PASSWORD` (split at the first
    /// `:`), so every connection has its own user. `auth = { basic = "USER" }`: the user is
    /// the same for every connection and the token is the password (e.g. APIs that take
    /// the key as the password of a fixed user such as `"api"`).
    Basic {
        /// The fixed user name, or `None` when the token carries it.
        username: Option<String>,
    },
    /// `auth = { oauth2 = ..., token_url = ..., ... }`: `Authorization: Bearer TOKEN` with an
    /// access token from an OAuth2 token endpoint.
    OAuth2(OAuth2),
    /// `auth = { shopify_app = { client_id, client_secret_env, scope } }`: a Shopify app
    /// users authorize per shop on the Connect page; its offline access token goes in
    /// `X-Shopify-Access-Token`, and each connection's requests go to its own shop.
    ShopifyApp(ShopifyApp),
}

/// The header Shopify's Admin API takes its access token in.
const SHOPIFY_TOKEN_HEADER: &str = "x-shopify-access-token";

/// `auth = { oauth2 = ... }`: an OAuth2 client (RFC 6749) and the grant it uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OAuth2 {
    /// `oauth2`: which grant buys the access token.
    pub grant: Grant,
    /// `token_url`: the token endpoint. https, or http on loopback only (the client secret
    /// travels to it). Required.
    pub token_url: Url,
    /// `client_id`: the client's id at the authorization server. Required.
    pub client_id: String,
    /// `client_secret_env`: the name of the environment variable that holds the client
    /// secret; the secret itself never goes in the config. Required for
    /// `"client_credentials"`; optional for `"refresh_token"` (a public client sends only
    /// its id).
    pub client_secret_env: Option<String>,
    /// `scope`: space-separated scopes asked for (RFC 6749 §3.3). Optional; for
    /// `"refresh_token"` it must not ask for more than the connection was granted.
    pub scope: Option<String>,
    /// `client_auth`: how the client authenticates at the token endpoint. Default
    /// `"post"`.
    pub client_auth: ClientAuth,
    /// `authorize_url`: the authorization endpoint, where users connecting on the Connect
    /// page consent (the authorization code grant). Only with `"refresh_token"`; without
    /// it the provider is not offered on the page.
    pub authorize_url: Option<Url>,
    /// `pkce`: whether the authorization code grant sends a PKCE S256 challenge. Default
    /// `true`; `false` only for a server that refuses the parameters.
    pub pkce: bool,
}

/// `auth.oauth2`: the grant that buys the access token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grant {
    /// `"refresh_token"` (RFC 6749 §6): each connection holds an access token, a refresh
    /// token and its expiry. The access token is refreshed through the pipeline's
    /// credential store a minute before it expires (or first, when its expiry is unknown)
    /// and once after a 401; a refresh token the server rotates is committed before use.
    RefreshToken,
    /// `"client_credentials"` (RFC 6749 §4.4): the provider's own access token, fetched
    /// with the client id and secret, cached in the provider for all its connections
    /// until a minute before it expires, and fetched again once after a 401. Connections
    /// need no token.
    ClientCredentials,
}

impl Grant {
    /// The TOML value, for messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Grant::RefreshToken => "refresh_token",
            Grant::ClientCredentials => "client_credentials",
        }
    }
}

impl Auth {
    /// The application users authorize on the Connect page: the refresh-token grant with
    /// an `authorize_url`.
    pub fn authorization(&self) -> Option<AuthorizationApp> {
        match self {
            Auth::OAuth2(
                oauth2 @ OAuth2 {
                    grant: Grant::RefreshToken,
                    authorize_url: Some(authorize_url),
                    ..
                },
            ) => Some(AuthorizationApp {
                authorize_url: authorize_url.clone(),
                token_url: oauth2.token_url.clone(),
                client_id: oauth2.client_id.clone(),
                client_secret_env: oauth2.client_secret_env.clone(),
                scope: oauth2.scope.clone(),
                pkce: oauth2.pkce,
                client_auth: oauth2.client_auth,
                account_in_answer: None,
            }),
            _ => None,
        }
    }

    /// The Shopify app users authorize per shop on the Connect page.
    pub fn shopify_app(&self) -> Option<ShopifyApp> {
        match self {
            Auth::ShopifyApp(app) => Some(app.clone()),
            _ => None,
        }
    }

    /// Whether connections need a token: not for `"none"` nor for the client-credentials
    /// grant, whose token is the provider's own.
    pub fn needs_token(&self) -> bool {
        !matches!(
            self,
            Auth::None
                | Auth::OAuth2(OAuth2 {
                    grant: Grant::ClientCredentials,
                    ..
                })
        )
    }

    /// The environment variables the provider reads when it is built, as (config key,
    /// variable name) pairs.
    pub fn required_env_vars(&self) -> Vec<(String, String)> {
        match self {
            Auth::OAuth2(OAuth2 {
                client_secret_env: Some(name),
                ..
            }) => vec![("auth.client_secret_env".to_string(), name.clone())],
            Auth::ShopifyApp(app) => vec![(
                "auth.shopify_app.client_secret_env".to_string(),
                app.client_secret_env.clone(),
            )],
            _ => Vec::new(),
        }
    }

    /// The header the token goes in, if any.
    pub fn header_name(&self) -> Option<HeaderName> {
        match self {
            Auth::Bearer | Auth::Basic { .. } | Auth::OAuth2(_) => Some(AUTHORIZATION),
            Auth::None | Auth::Query { .. } => None,
            Auth::Header { name } => HeaderName::from_bytes(name.as_bytes()).ok(),
            Auth::ShopifyApp(_) => Some(HeaderName::from_static(SHOPIFY_TOKEN_HEADER)),
        }
    }

    /// The query parameter the token goes in, if any.
    pub fn query_param(&self) -> Option<&str> {
        match self {
            Auth::Query { name } => Some(name),
            _ => None,
        }
    }

    /// Checks what the parser cannot and returns a message naming the key that is wrong.
    pub fn validate(&self) -> Result<(), String> {
        match self {
            Auth::Header { name } if HeaderName::from_bytes(name.as_bytes()).is_err() => Err(
                format!("auth.header {name:?} is not a valid HTTP header name"),
            ),
            Auth::Basic {
                username: Some(user),
            } => {
                if user.trim().is_empty() {
                    return Err(
                        "auth.basic must name a user; use auth = \"basic\" when each \
                                connection's token is USER:PASSWORD"
                            .to_string(),
                    );
                }
                if user.contains(':') || user.chars().any(char::is_control) {
                    return Err(format!(
                        "auth.basic {user:?} must not contain ':' or control characters \
                         (RFC 7617)"
                    ));
                }
                Ok(())
            }
            Auth::OAuth2(oauth2) => oauth2.validate(),
            Auth::ShopifyApp(app) => validate_shopify_app(app),
            _ => Ok(()),
        }
    }

    /// The header that authenticates a request with `token` (the connection's, or the
    /// OAuth2 access token), marked sensitive so it never shows in `Debug` output; `None`
    /// for `"none"` and query auth.
    pub(crate) fn header(
        &self,
        token: Option<&str>,
    ) -> Result<Option<(HeaderName, HeaderValue)>, FetchError> {
        let (name, value) = match self {
            Auth::None | Auth::Query { .. } => return Ok(None),
            Auth::Bearer | Auth::OAuth2(_) => {
                (AUTHORIZATION, format!("Bearer {}", self.token(token)?))
            }
            Auth::Header { name } => {
                let name =
                    HeaderName::from_bytes(name.as_bytes()).map_err(|_| FetchError::Client {
                        message: format!("auth.header {name:?} is not a valid HTTP header name"),
                    })?;
                (name, self.token(token)?.to_string())
            }
            Auth::ShopifyApp(_) => (
                HeaderName::from_static(SHOPIFY_TOKEN_HEADER),
                self.token(token)?.to_string(),
            ),
            Auth::Basic { username } => {
                let encoded = self.basic_credentials(username.as_deref(), self.token(token)?)?;
                (AUTHORIZATION, format!("Basic {encoded}"))
            }
        };
        let mut value =
            HeaderValue::from_str(&value).map_err(|_| FetchError::MissingCredentials {
                message: format!(
                    "the connection's token cannot be sent with auth = {self}: it contains \
                     characters that are not allowed in an HTTP header"
                ),
            })?;
        value.set_sensitive(true);
        Ok(Some((name, value)))
    }

    /// Secrets derived from `token` that the request carries in another form (the base64
    /// of basic credentials), so that errors can be cleaned of them too.
    pub(crate) fn derived_secrets(&self, token: Option<&str>) -> Vec<SecretString> {
        match (self, token) {
            (Auth::Basic { username }, Some(token)) => self
                .basic_credentials(username.as_deref(), token)
                .ok()
                .map(SecretString::from)
                .into_iter()
                .collect(),
            _ => Vec::new(),
        }
    }

    /// `base64(USER:PASSWORD)`: `username` and the token as the password, or the token
    /// itself when it carries the user.
    fn basic_credentials(&self, username: Option<&str>, token: &str) -> Result<String, FetchError> {
        let pair = match username {
            Some(user) => format!("{user}:{token}"),
            None if token.contains(':') => token.to_string(),
            None => {
                return Err(FetchError::MissingCredentials {
                    message: "auth = \"basic\" takes the connection's token as USER:PASSWORD, \
                              and the token has no ':'; set auth = { basic = \"USER\" } if \
                              the token is only the password"
                        .to_string(),
                })
            }
        };
        Ok(STANDARD.encode(pair))
    }

    /// The token, or why a request cannot be made without one.
    pub(crate) fn token<'a>(&self, token: Option<&'a str>) -> Result<&'a str, FetchError> {
        token.ok_or_else(|| {
            let message = match self {
                Auth::OAuth2(OAuth2 {
                    grant: Grant::RefreshToken,
                    ..
                }) => format!(
                    "connection has neither an access token nor a refresh token, but \
                     auth = {self} needs one"
                ),
                _ => format!("connection has no token, but auth = {self} needs one"),
            };
            FetchError::MissingCredentials { message }
        })
    }
}

impl OAuth2 {
    fn validate(&self) -> Result<(), String> {
        if let Some(url) = &self.authorize_url {
            if url.scheme() != "https" && !(url.scheme() == "http" && crate::is_loopback(url)) {
                return Err(format!(
                    "auth.authorize_url must be an https URL (http only on loopback), not {}",
                    display_url_text(url.as_str())
                ));
            }
            if url.fragment().is_some() || !url.username().is_empty() {
                return Err(
                    "auth.authorize_url must not carry user:password@ or a fragment".to_string(),
                );
            }
        }
        let url = &self.token_url;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!(
                "auth.token_url must be an http or https URL, not {}:",
                url.scheme()
            ));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err("auth.token_url must name a host".to_string());
        }
        if url.scheme() == "http" && !crate::is_loopback(url) {
            return Err(format!(
                "auth.token_url must be an https URL: plain http is allowed only on loopback \
                 (127.0.0.1, ::1, localhost), since the client's credentials would travel in \
                 clear to {}",
                url.host_str().unwrap_or_default()
            ));
        }
        if !url.username().is_empty() || url.password().is_some() || url.fragment().is_some() {
            return Err(
                "auth.token_url must not carry user:password@ or a fragment; the client secret \
                 goes in client_secret_env"
                    .to_string(),
            );
        }
        if self.client_id.trim().is_empty() {
            return Err("auth.client_id must not be empty".to_string());
        }
        if self.client_id.chars().any(char::is_control) {
            return Err("auth.client_id must not contain control characters".to_string());
        }
        if let Some(name) = &self.client_secret_env {
            crate::oauth2::validate_env_var_name("auth.client_secret_env", name)?;
        }
        if self.client_auth == ClientAuth::Basic && self.client_secret_env.is_none() {
            return Err(
                "auth.client_auth = \"basic\" needs auth.client_secret_env: basic client \
                 authentication sends the client secret"
                    .to_string(),
            );
        }
        if let Some(scope) = &self.scope {
            // RFC 6749 §3.3: scope tokens of %x21 / %x23-5B / %x5D-7E, separated by spaces.
            let scope_char = |c: char| c == ' ' || (c.is_ascii_graphic() && c != '"' && c != '\\');
            if scope.trim().is_empty() || !scope.chars().all(scope_char) {
                return Err(format!(
                    "auth.scope {scope:?} must be space-separated scope names of visible ASCII \
                     other than '\"' and '\\' (RFC 6749 §3.3)"
                ));
            }
        }
        Ok(())
    }
}

/// The TOML spelling, for messages: `"bearer"`, `{ header = "X-Api-Key" }`,
/// `{ oauth2 = "refresh_token" }` (its other keys left out).
impl fmt::Display for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Auth::Bearer => f.write_str("\"bearer\""),
            Auth::None => f.write_str("\"none\""),
            Auth::Header { name } => write!(f, "{{ header = {name:?} }}"),
            Auth::Query { name } => write!(f, "{{ query = {name:?} }}"),
            Auth::Basic { username: None } => f.write_str("\"basic\""),
            Auth::Basic {
                username: Some(user),
            } => write!(f, "{{ basic = {user:?} }}"),
            Auth::OAuth2(oauth2) => write!(f, "{{ oauth2 = \"{}\" }}", oauth2.grant.as_str()),
            Auth::ShopifyApp(_) => f.write_str("{ shopify_app = { ... } }"),
        }
    }
}

const AUTH_EXPECTED: &str = "expected \"bearer\", \"none\", \"basic\", { header = \"NAME\" }, \
     { query = \"NAME\" }, { basic = \"USER\" }, { oauth2 = \"refresh_token\" or \
     \"client_credentials\", token_url = \"URL\", client_id = \"ID\", ... } or \
     { shopify_app = { client_id = \"ID\", client_secret_env = \"NAME\", scope = \"SCOPES\" } }";

/// The keys of `auth = { shopify_app = { ... } }`, each required.
const SHOPIFY_APP_KEYS: [&str; 3] = ["client_id", "client_secret_env", "scope"];

/// The keys of `auth = { oauth2 = ... }`.
const OAUTH2_KEYS: [&str; 8] = [
    "oauth2",
    "token_url",
    "client_id",
    "client_secret_env",
    "scope",
    "client_auth",
    "authorize_url",
    "pkce",
];

impl<'de> Deserialize<'de> for Auth {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(AuthVisitor)
    }
}

struct AuthVisitor;

impl<'de> Visitor<'de> for AuthVisitor {
    type Value = Auth;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&AUTH_EXPECTED["expected ".len()..])
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Auth, E> {
        match value {
            "bearer" => Ok(Auth::Bearer),
            "none" => Ok(Auth::None),
            "basic" => Ok(Auth::Basic { username: None }),
            other => Err(E::custom(format!("{AUTH_EXPECTED}, found {other:?}"))),
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Auth, A::Error> {
        let mut table = BTreeMap::new();
        while let Some(key) = map.next_key::<String>()? {
            let value: Value = map.next_value()?;
            table.insert(key, value);
        }
        if table.contains_key("oauth2") {
            return oauth2_from(&table)
                .map(Auth::OAuth2)
                .map_err(de::Error::custom);
        }
        let mut entries = table.into_iter();
        let (key, value) = match (entries.next(), entries.next()) {
            (Some(entry), None) => entry,
            (None, _) => {
                return Err(de::Error::custom(format!(
                    "{AUTH_EXPECTED}, found an empty table"
                )))
            }
            (Some((first, _)), Some((second, _))) => {
                return Err(de::Error::custom(format!(
                    "{AUTH_EXPECTED}, found a table with the keys {first:?} and {second:?}"
                )))
            }
        };
        if key == "shopify_app" {
            return shopify_app_from(&value)
                .map(Auth::ShopifyApp)
                .map_err(de::Error::custom);
        }
        let make: fn(String) -> Auth = match key.as_str() {
            "header" => |name| Auth::Header { name },
            "query" => |name| Auth::Query { name },
            "basic" => |user| Auth::Basic {
                username: Some(user),
            },
            _ => {
                return Err(de::Error::custom(format!(
                    "{AUTH_EXPECTED}, found a table with the key {key:?}"
                )))
            }
        };
        match value {
            Value::String(text) => Ok(make(text)),
            other => Err(de::Error::custom(format!(
                "auth.{key} must be a string, not {}",
                crate::record::json_type_name(&other)
            ))),
        }
    }
}

/// `auth = { oauth2 = ... }` from its table: every key known, each required one present.
fn oauth2_from(table: &BTreeMap<String, Value>) -> Result<OAuth2, String> {
    if let Some(unknown) = table
        .keys()
        .find(|key| !OAUTH2_KEYS.contains(&key.as_str()))
    {
        return Err(format!(
            "auth.{unknown} is not a key of auth = {{ oauth2 = ... }}; expected {}",
            OAUTH2_KEYS.join(", ")
        ));
    }
    let text = |key: &str| -> Result<Option<String>, String> {
        match table.get(key) {
            None => Ok(None),
            Some(Value::String(text)) => Ok(Some(text.clone())),
            Some(other) => Err(format!(
                "auth.{key} must be a string, not {}",
                crate::record::json_type_name(other)
            )),
        }
    };
    let grant = match text("oauth2")?.as_deref() {
        Some("refresh_token") => Grant::RefreshToken,
        Some("client_credentials") => Grant::ClientCredentials,
        other => {
            return Err(format!(
                "auth.oauth2 must be \"refresh_token\" or \"client_credentials\", not {}",
                other.map_or_else(|| "missing".to_string(), |o| format!("{o:?}"))
            ))
        }
    };
    let required = |key: &str| {
        text(key)?.ok_or_else(|| {
            format!(
                "auth.{key} is required with auth.oauth2 = \"{}\"",
                grant.as_str()
            )
        })
    };
    let token_url = required("token_url")?;
    let token_url = Url::parse(token_url.trim()).map_err(|err| {
        format!(
            "auth.token_url {:?} is not a valid URL: {err}",
            display_url_text(&token_url)
        )
    })?;
    let client_id = required("client_id")?;
    let client_secret_env = match grant {
        Grant::ClientCredentials => Some(required("client_secret_env")?),
        Grant::RefreshToken => text("client_secret_env")?,
    };
    let client_auth = match text("client_auth")?.as_deref() {
        None | Some("post") => ClientAuth::Post,
        Some("basic") => ClientAuth::Basic,
        Some(other) => {
            return Err(format!(
                "auth.client_auth must be \"post\" or \"basic\", not {other:?}"
            ))
        }
    };
    let authorize_url = match text("authorize_url")? {
        None => None,
        Some(_) if grant == Grant::ClientCredentials => {
            return Err(
                "auth.authorize_url is for users who authorize a connection: only with \
                 auth.oauth2 = \"refresh_token\""
                    .to_string(),
            )
        }
        Some(text) => Some(Url::parse(text.trim()).map_err(|err| {
            format!(
                "auth.authorize_url {:?} is not a valid URL: {err}",
                display_url_text(&text)
            )
        })?),
    };
    let pkce = match table.get("pkce") {
        None => true,
        Some(Value::Bool(pkce)) => *pkce,
        Some(other) => {
            return Err(format!(
                "auth.pkce must be true or false, not {}",
                crate::record::json_type_name(other)
            ))
        }
    };
    Ok(OAuth2 {
        grant,
        token_url,
        client_id,
        client_secret_env,
        scope: text("scope")?,
        client_auth,
        authorize_url,
        pkce,
    })
}

/// `auth = { shopify_app = { ... } }` from its table: each of its keys given, as a string,
/// and no other.
fn shopify_app_from(value: &Value) -> Result<ShopifyApp, String> {
    let Value::Object(table) = value else {
        return Err(format!(
            "auth.shopify_app must be a table {{ client_id, client_secret_env, scope }}, not {}",
            crate::record::json_type_name(value)
        ));
    };
    if let Some(unknown) = table
        .keys()
        .find(|key| !SHOPIFY_APP_KEYS.contains(&key.as_str()))
    {
        return Err(format!(
            "auth.shopify_app.{unknown} is not a key of auth.shopify_app; expected {}",
            SHOPIFY_APP_KEYS.join(", ")
        ));
    }
    let text = |key: &str| match table.get(key) {
        None => Err(format!("auth.shopify_app.{key} is required")),
        Some(Value::String(text)) => Ok(text.clone()),
        Some(other) => Err(format!(
            "auth.shopify_app.{key} must be a string, not {}",
            crate::record::json_type_name(other)
        )),
    };
    Ok(ShopifyApp {
        client_id: text("client_id")?,
        client_secret_env: text("client_secret_env")?,
        scope: text("scope")?,
    })
}

/// Checks a Shopify app's keys: an id, a variable's name, and comma-separated scopes.
fn validate_shopify_app(app: &ShopifyApp) -> Result<(), String> {
    if app.client_id.trim().is_empty() || app.client_id.chars().any(char::is_control) {
        return Err(
            "auth.shopify_app.client_id must be the app's client id, not empty and without \
             control characters"
                .to_string(),
        );
    }
    crate::oauth2::validate_env_var_name(
        "auth.shopify_app.client_secret_env",
        &app.client_secret_env,
    )?;
    // Shopify's scopes are names such as read_orders, separated by commas.
    let scope_name = |name: &str| {
        !name.is_empty()
            && name
                .bytes()
                .all(|byte| byte.is_ascii_alphanumeric() || byte == b'_')
    };
    if !app.scope.split(',').map(str::trim).all(scope_name) {
        return Err(format!(
            "auth.shopify_app.scope {:?} must be Shopify access scopes separated by commas, \
             e.g. \"read_orders,read_customers\"",
            crate::quote::truncated(&app.scope, 64)
        ));
    }
    Ok(())
}
