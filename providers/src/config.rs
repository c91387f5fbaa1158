//! The per-kind provider configuration and the registry that builds adapters from it.
//!
//! Adding a provider touches its own module, one variant of [`ProviderConfig`] (with its
//! `KINDS` entry and one arm in each method) and one arm of [`build_provider`].

use serde::Deserialize;

use crate::github::{GithubConfig, GithubProvider};
use crate::http::{HttpClient, HttpSettings};
use crate::rest::{RestConfig, RestProvider};
use crate::strava::{StravaConfig, StravaProvider};
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
    /// `kind = "strava"`: the connected athlete's Strava activities (OAuth2).
    Strava(StravaConfig),
}

impl ProviderConfig {
    /// Every `kind` value there is, for messages.
    pub const KINDS: &'static [&'static str] = &["rest", "github", "stripe", "strava"];

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
            "strava" => StravaConfig::deserialize(deserializer).map(ProviderConfig::Strava),
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
            ProviderConfig::Strava(_) => "strava",
        }
    }

    /// Checks what serde cannot (e.g. `id_field` and `key_fields` together) and returns a
    /// message naming the key that is wrong.
    pub fn validate(&self) -> Result<(), String> {
        match self {
            ProviderConfig::Rest(config) => config.validate(),
            ProviderConfig::Github(config) => config.validate(),
            ProviderConfig::Stripe(config) => config.validate(),
            ProviderConfig::Strava(config) => config.validate(),
        }
    }

    /// Whether the provider needs a token on each connection.
    pub fn needs_token(&self) -> bool {
        match self {
            ProviderConfig::Rest(config) => config.needs_token(),
            ProviderConfig::Github(_) | ProviderConfig::Stripe(_) | ProviderConfig::Strava(_) => {
                true
            }
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
            ProviderConfig::Strava(config) => vec![(
                "client_secret_env".to_string(),
                config.client_secret_env.clone(),
            )],
        }
    }
}

/// Builds the adapter for one configured provider. Reads the environment variables that
/// [`ProviderConfig::required_env_vars`] names; an unset one is a
/// [`FetchError::Client`](crate::FetchError::Client) naming it.
pub fn build_provider(
    config: &ProviderConfig,
    http: &HttpSettings,
) -> Result<Box<dyn Provider>, crate::FetchError> {
    let client = HttpClient::new(http.clone())?;
    Ok(match config {
        ProviderConfig::Rest(rest) => {
            let client = match rest.auth_query_param() {
                Some(name) => client.hiding_query_param(name),
                None => client,
            };
            Box::new(RestProvider::new(rest.clone(), client))
        }
        ProviderConfig::Github(github) => Box::new(GithubProvider::new(github.clone(), client)),
        ProviderConfig::Stripe(stripe) => Box::new(StripeProvider::new(stripe.clone(), client)),
        ProviderConfig::Strava(strava) => {
            Box::new(StravaProvider::from_env(strava.clone(), client)?)
        }
    })
}
