//! The per-kind provider configuration and the registry that builds adapters from it.
//!
//! Each kind's config implements [`ProviderKind`] (`kind.rs`) in the kind's own module;
//! the [`provider_kinds!`] list at the bottom of this file is the registry. Adding a
//! provider kind touches its own module and one line of that list.

use serde::Deserialize;

use crate::authorize::AuthorizationApp;
use crate::github::GithubConfig;
use crate::http::{HttpClient, HttpSettings};
use crate::kind::ProviderKind;
use crate::rest::RestConfig;
use crate::shopify_app::ShopifyApp;
use crate::strava::StravaConfig;
use crate::stripe::StripeConfig;
use crate::{FetchError, Provider, StreamSpec};

/// Declares [`ProviderConfig`] with one variant per `"kind" => Variant(Config)` line, and
/// the methods that dispatch on the kind.
macro_rules! provider_kinds {
    ($($(#[$doc:meta])* $kind:literal => $variant:ident($config:ty),)+) => {
        /// The adapter-specific part of a `[providers.NAME]` table, chosen by its `kind` key.
        // One value per configured provider, built once at start: boxing the large `rest`
        // variant would save nothing worth an indirection.
        #[allow(clippy::large_enum_variant)]
        #[derive(Clone, Debug, Deserialize)]
        #[serde(tag = "kind")]
        pub enum ProviderConfig {
            $($(#[$doc])* #[serde(rename = $kind)] $variant($config),)+
        }

        impl ProviderConfig {
            /// Every `kind` value there is, for messages.
            pub const KINDS: &'static [&'static str] = &[$($kind),+];

            /// Deserializes a provider table's adapter keys (without `kind`) as the named
            /// kind. Unlike deserializing the tagged enum, this keeps the deserializer's
            /// view of the path, so an error can name the exact key.
            pub fn deserialize_kind<'de, D: serde::Deserializer<'de>>(
                kind: &str,
                deserializer: D,
            ) -> Result<ProviderConfig, D::Error> {
                match kind {
                    $($kind => <$config>::deserialize(deserializer).map(ProviderConfig::$variant),)+
                    other => Err(serde::de::Error::custom(format!(
                        "unknown provider kind {other:?}, expected one of: {}",
                        Self::KINDS.join(", ")
                    ))),
                }
            }

            /// The `kind` value, for messages.
            pub fn kind(&self) -> &'static str {
                match self {
                    $(ProviderConfig::$variant(_) => $kind,)+
                }
            }

            fn as_kind(&self) -> &dyn ProviderKind {
                match self {
                    $(ProviderConfig::$variant(config) => config,)+
                }
            }
        }
    };
}

provider_kinds! {
    /// `kind = "rest"`: a REST API described wholly in TOML.
    "rest" => Rest(RestConfig),
    /// `kind = "github"`: the issues, repositories, pull requests and issue comments
    /// visible to the connected GitHub user.
    "github" => Github(GithubConfig),
    /// `kind = "stripe"`: a Stripe account's charges, customers, invoices and more.
    "stripe" => Stripe(StripeConfig),
    /// `kind = "strava"`: the connected athlete's Strava activities and profile (OAuth2).
    "strava" => Strava(StravaConfig),
}

impl ProviderConfig {
    /// See [`ProviderKind::validate`].
    pub fn validate(&self) -> Result<(), String> {
        self.as_kind().validate()
    }

    /// See [`ProviderKind::streams`].
    pub fn streams(&self) -> Vec<StreamSpec> {
        self.as_kind().streams()
    }

    /// See [`ProviderKind::needs_token`].
    pub fn needs_token(&self) -> bool {
        self.as_kind().needs_token()
    }

    /// See [`ProviderKind::takes_key`].
    pub fn takes_key(&self) -> bool {
        self.as_kind().takes_key()
    }

    /// See [`ProviderKind::authorization`].
    pub fn authorization(&self) -> Option<AuthorizationApp> {
        self.as_kind().authorization()
    }

    /// See [`ProviderKind::shopify_app`].
    pub fn shopify_app(&self) -> Option<ShopifyApp> {
        self.as_kind().shopify_app()
    }

    /// See [`ProviderKind::required_env_vars`]. The root crate checks at start that each
    /// is set, so a missing one fails config validation naming the key.
    pub fn required_env_vars(&self) -> Vec<(String, String)> {
        self.as_kind().required_env_vars()
    }
}

/// Builds the adapter for one configured provider. Reads the environment variables that
/// [`ProviderConfig::required_env_vars`] names; an unset one is a
/// [`FetchError::Client`](crate::FetchError::Client) naming it.
pub fn build_provider(
    config: &ProviderConfig,
    http: &HttpSettings,
) -> Result<Box<dyn Provider>, FetchError> {
    config.as_kind().build(HttpClient::new(http.clone())?)
}
