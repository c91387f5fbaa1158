//! [`StripeConfig`]: the keys of a `kind = "stripe"` provider table and their checks.

use serde::Deserialize;
use url::Url;

use crate::adapter;

/// The API version every request pins (`Stripe-Version`) unless `api_version` says
/// otherwise: the current version in Stripe's API reference when the adapter was written.
pub const DEFAULT_API_VERSION: &str = "2026-09-30.endive";

/// The configuration of a `kind = "stripe"` provider.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StripeConfig {
    /// The API root. Default `"https://api.stripe.com"`.
    #[serde(default = "default_base_url")]
    pub base_url: Url,
    /// Objects (or events) per page (`limit`), 1 to 100. Default 100.
    #[serde(default = "default_limit")]
    pub limit: u32,
    /// The API version sent as `Stripe-Version` on every request, so that listed objects
    /// keep one shape whatever the account's default version becomes. Default
    /// [`DEFAULT_API_VERSION`]. Objects read from events keep the version of their event
    /// (see the module documentation).
    #[serde(default = "default_api_version")]
    pub api_version: String,
}

fn default_base_url() -> Url {
    Url::parse("https://api.stripe.com").expect("the default base_url is a valid URL")
}

fn default_limit() -> u32 {
    100
}

fn default_api_version() -> String {
    DEFAULT_API_VERSION.to_string()
}

impl Default for StripeConfig {
    fn default() -> Self {
        StripeConfig {
            base_url: default_base_url(),
            limit: default_limit(),
            api_version: default_api_version(),
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
        if !is_api_version(&self.api_version) {
            return Err(format!(
                "api_version must be a Stripe API version such as \"2024-06-20\" or \
                 \"{DEFAULT_API_VERSION}\", not {:?}",
                self.api_version
            ));
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
