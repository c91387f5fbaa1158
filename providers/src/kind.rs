//! [`ProviderKind`], what every kind's config implements. It sits apart from the registry
//! (`config.rs`), which imports every kind's module, so a kind's module imports it without
//! importing the registry back.

use crate::authorize::AuthorizationApp;
use crate::http::HttpClient;
use crate::shopify_app::ShopifyApp;
use crate::{FetchError, Provider, StreamSpec};

/// What the configuration of one provider kind does beyond deserializing: check itself
/// and build its adapter (as vector's `SinkConfig::build`).
pub trait ProviderKind {
    /// Checks what serde cannot (e.g. `id_field` and `key_fields` together) and returns a
    /// message naming the key that is wrong.
    fn validate(&self) -> Result<(), String>;

    /// The streams the kind can sync. The first is the primary stream: the one a provider
    /// table without `streams` syncs, whose records keep the provider's name as their
    /// namespace.
    fn streams(&self) -> Vec<StreamSpec>;

    /// Whether the provider needs a token on each connection.
    fn needs_token(&self) -> bool {
        true
    }

    /// Whether a user connects an account by pasting a key (an API key or a personal
    /// token kept as is) on the Connect page: a provider whose connections hold a token
    /// and that has no OAuth2 application to authorize one.
    fn takes_key(&self) -> bool {
        self.needs_token() && self.authorization().is_none()
    }

    /// The OAuth2 application a user authorizes on the Connect page (the authorization
    /// code grant), when the provider's config describes one.
    fn authorization(&self) -> Option<AuthorizationApp> {
        None
    }

    /// The Shopify app a user authorizes per shop on the Connect page, when the
    /// provider's config describes one (`auth = { shopify_app = ... }`).
    fn shopify_app(&self) -> Option<ShopifyApp> {
        None
    }

    /// The environment variables the provider reads when it is built, as (config key,
    /// variable name) pairs, e.g. `("client_secret_env", "STRAVA_CLIENT_SECRET")`.
    fn required_env_vars(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// Builds the adapter on `client`, the HTTP client of the provider's `http` settings.
    fn build(&self, client: HttpClient) -> Result<Box<dyn Provider>, FetchError>;
}
