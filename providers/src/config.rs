//! The per-kind provider configuration and the registry that builds adapters from it.
//!
//! Adding a provider touches its own module and one line in [`ProviderConfig`] and
//! [`build_provider`].

use serde::Deserialize;

use crate::github::{GithubConfig, GithubProvider};
use crate::http::{HttpClient, HttpSettings};
use crate::rest::{RestConfig, RestProvider};
use crate::stripe::{StripeConfig, StripeProvider};
use crate::Provider;

/// The adapter-specific part of a `[providers.NAME]` table, chosen by its `kind` key.
// One value per configured provider, built once at start: boxing the large `rest`
// variant would save nothing worth an indirection.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum ProviderConfig {
    /// `kind = "rest"`: a REST API described wholly in TOML.
    Rest(RestConfig),
    /// `kind = "github"`: the issues visible to the connected GitHub user.
    Github(GithubConfig),
    /// `kind = "stripe"`: the charges of a Stripe account.
    Stripe(StripeConfig),
}

impl ProviderConfig {
    /// Every `kind` value there is, for messages.
    pub const KINDS: &'static [&'static str] = &["rest", "github", "stripe"];

    /// Deserializes a provider table's adapter keys (without `kind`) as the named kind.
    /// Unlike deserializing the tagged enum, this keeps the deserializer's view of the
    /// path, so an error can name the exact key.
    pub fn deserialize_kind<'de, D: serde::Deserializer<'de>>(
        kind: &str,
        deserializer: D,
    ) -> Result<ProviderConfig, D::Error> {
        match kind {
            "rest" => RestConfig::deserialize(deserializer).map(ProviderConfig::Rest),
            "github" => GithubConfig::deserialize(deserializer).map(ProviderConfig::Github),
            "stripe" => StripeConfig::deserialize(deserializer).map(ProviderConfig::Stripe),
            other => Err(serde::de::Error::custom(format!(
                "unknown provider kind {other:?}, expected one of: {}",
                Self::KINDS.join(", ")
            ))),
        }
    }

    /// The `kind` value, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            ProviderConfig::Rest(_) => "rest",
            ProviderConfig::Github(_) => "github",
            ProviderConfig::Stripe(_) => "stripe",
        }
    }

    /// Checks what serde cannot (e.g. `id_field` and `key_fields` together) and returns a
    /// message naming the key that is wrong.
    pub fn validate(&self) -> Result<(), String> {
        match self {
            ProviderConfig::Rest(config) => config.validate(),
            ProviderConfig::Github(config) => config.validate(),
            ProviderConfig::Stripe(config) => config.validate(),
        }
    }

    /// Whether the provider needs a token on each connection.
    pub fn needs_token(&self) -> bool {
        match self {
            ProviderConfig::Rest(config) => config.needs_token(),
            ProviderConfig::Github(_) | ProviderConfig::Stripe(_) => true,
        }
    }

    /// The environment variables the provider reads when it is built, as (config key,
    /// variable name) pairs, e.g. `("client_secret_env", "STRAVA_CLIENT_SECRET")`. The root
    /// crate checks at start that each is set, so a missing one fails config validation
    /// naming the key.
    pub fn required_env_vars(&self) -> Vec<(String, String)> {
        match self {
            ProviderConfig::Rest(_) | ProviderConfig::Github(_) | ProviderConfig::Stripe(_) => {
                Vec::new()
            }
        }
    }
}

/// Builds the adapter for one configured provider.
pub fn build_provider(
    config: &ProviderConfig,
    http: &HttpSettings,
) -> Result<Box<dyn Provider>, crate::FetchError> {
    let client = HttpClient::new(http.clone())?;
    Ok(match config {
        ProviderConfig::Rest(rest) => Box::new(RestProvider::new(rest.clone(), client)),
        ProviderConfig::Github(github) => Box::new(GithubProvider::new(github.clone(), client)),
        ProviderConfig::Stripe(stripe) => Box::new(StripeProvider::new(stripe.clone(), client)),
    })
}
