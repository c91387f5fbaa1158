//! The configuration of a `kind = "strava"` provider.

use serde::Deserialize;
use url::Url;

use crate::adapter;

/// The configuration of a `kind = "strava"` provider: the Strava API application whose
/// OAuth tokens the connections hold.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StravaConfig {
    /// The API host; activities are listed at `{base_url}/api/v3/athlete/activities` and
    /// the athlete read at `{base_url}/api/v3/athlete`. Default `"https://www.strava.com"`.
    #[serde(default = "default_url")]
    pub base_url: Url,
    /// The OAuth host; tokens are refreshed at `{oauth_url}/oauth/token`. Default
    /// `"https://www.strava.com"`.
    #[serde(default = "default_url")]
    pub oauth_url: Url,
    /// The application's Client ID, as Strava's API settings page shows it (e.g.
    /// `"12345"`). Required.
    pub client_id: String,
    /// The name of the environment variable that holds the application's Client Secret
    /// (e.g. `"STRAVA_CLIENT_SECRET"`); the secret itself never goes in the config. Required.
    pub client_secret_env: String,
    /// Activities per page (`per_page`), 1 to 200. Default 200.
    #[serde(default = "default_per_page")]
    pub per_page: u32,
    /// Requests of each 15-minute budget kept in reserve: once a window's usage reaches
    /// its limit minus this, requests wait for the next window. 0 to 100, default 5.
    #[serde(default = "default_rate_limit_reserve")]
    pub rate_limit_reserve: u32,
    /// The scopes a user is asked for on the Connect page. Default `["read",
    /// "activity:read_all"]`: the profile and every activity, private ones too.
    #[serde(default = "default_scopes")]
    pub scopes: Vec<String>,
}

fn default_scopes() -> Vec<String> {
    vec!["read".to_string(), "activity:read_all".to_string()]
}

/// The largest `rate_limit_reserve`: Strava's smallest 15-minute budget is 100 requests.
const MAX_RATE_LIMIT_RESERVE: u32 = 100;

fn default_url() -> Url {
    Url::parse("https://www.strava.com").expect("the default URL is a valid URL")
}

fn default_per_page() -> u32 {
    200
}

fn default_rate_limit_reserve() -> u32 {
    5
}

impl StravaConfig {
    /// A configuration with the defaults and the two required keys.
    pub fn new(client_id: &str, client_secret_env: &str) -> StravaConfig {
        StravaConfig {
            base_url: default_url(),
            oauth_url: default_url(),
            client_id: client_id.to_string(),
            client_secret_env: client_secret_env.to_string(),
            per_page: default_per_page(),
            rate_limit_reserve: default_rate_limit_reserve(),
            scopes: default_scopes(),
        }
    }

    /// Checks what serde cannot and returns a message naming the key that is wrong.
    pub fn validate(&self) -> Result<(), String> {
        adapter::validate_base_url("base_url", &self.base_url)?;
        adapter::validate_base_url("oauth_url", &self.oauth_url)?;
        if self.client_id.trim().is_empty() {
            return Err("client_id must not be empty".to_string());
        }
        if self.client_id.chars().any(char::is_whitespace) {
            return Err(format!(
                "client_id {:?} must not contain whitespace",
                self.client_id
            ));
        }
        crate::oauth2::validate_env_var_name("client_secret_env", &self.client_secret_env)?;
        crate::bounds::count_in(self.rate_limit_reserve, 0, MAX_RATE_LIMIT_RESERVE)
            .map_err(crate::bounds::named("rate_limit_reserve"))?;
        if !(1..=200).contains(&self.per_page) {
            return Err(format!(
                "per_page must be between 1 and 200 (Strava's largest page), not {}",
                self.per_page
            ));
        }
        if let Some(scope) = self.scopes.iter().find(|scope| {
            scope.is_empty() || !scope.chars().all(|c| c.is_ascii_graphic() && c != ',')
        }) {
            return Err(format!(
                "scopes: {scope:?} is not a Strava scope (such as \"activity:read_all\")"
            ));
        }
        Ok(())
    }
}
