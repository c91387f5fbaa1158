//! `[connect]`: the hosted page where an app's users connect their own accounts
//! (docs/decisions/connect.md). Off when the table is absent; served by `[api]`.

use std::time::Duration;

use serde::Deserialize;
use tributary_providers::bounds::duration_in;
use url::Url;

/// The ranges of the `[connect]` values.
pub(crate) mod limits {
    use std::time::Duration;

    /// `connect.session_ttl`: a minute to half an hour, as the session's link is a
    /// bearer of the right to connect an account.
    pub const SESSION_TTL: (Duration, Duration) =
        (Duration::from_secs(60), Duration::from_secs(30 * 60));
    /// `connect.return_urls`: how many, and the longest.
    pub const RETURN_URLS: usize = 100;
    pub const URL_BYTES: usize = 2048;
}

/// `[connect]`.
#[derive(Clone, Debug)]
pub(crate) struct ConnectSettings {
    /// The base URL the user's browser reaches the API at (behind a proxy, the proxy's):
    /// session links are made from it, never from a request's `Host`.
    pub public_url: Url,
    /// The only URLs a session may send the user back to, matched exactly.
    pub return_urls: Vec<String>,
    /// How long a session's link stays valid.
    pub session_ttl: Duration,
    /// Refuse to connect a provider account that another user already connected.
    pub one_user_per_account: bool,
}

impl ConnectSettings {
    /// Whether the session cookie must be `Secure`: the page is served over https.
    pub(crate) fn secure(&self) -> bool {
        self.public_url.scheme() == "https"
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConnectSettings {
    public_url: Option<String>,
    #[serde(default)]
    return_urls: Vec<String>,
    #[serde(default = "default_session_ttl", with = "humantime_serde")]
    session_ttl: Duration,
    #[serde(default)]
    one_user_per_account: bool,
}

fn default_session_ttl() -> Duration {
    limits::SESSION_TTL.1
}

/// Checks the table; errors are `(key, message)`.
pub(super) fn parse(raw: RawConnectSettings) -> Result<ConnectSettings, (String, String)> {
    let public_url = raw.public_url.ok_or_else(|| {
        (
            "connect.public_url".to_string(),
            "missing: expected the URL browsers reach the API at, such as \"https://sync.example.com\" (omit the [connect] table to turn Connect off)"
                .to_string(),
        )
    })?;
    let public_url =
        web_url(&public_url).map_err(|message| ("connect.public_url".to_string(), message))?;
    if public_url.query().is_some() || public_url.fragment().is_some() {
        return Err((
            "connect.public_url".to_string(),
            "must not have a query or a fragment".to_string(),
        ));
    }
    if raw.return_urls.is_empty() {
        return Err((
            "connect.return_urls".to_string(),
            "missing: expected the URLs a session may send the user back to, such as [\"https://app.example.com/connected\"]".to_string(),
        ));
    }
    if raw.return_urls.len() > limits::RETURN_URLS {
        return Err((
            "connect.return_urls".to_string(),
            format!(
                "at most {} URLs, got {}",
                limits::RETURN_URLS,
                raw.return_urls.len()
            ),
        ));
    }
    for (index, text) in raw.return_urls.iter().enumerate() {
        let key = format!("connect.return_urls[{index}]");
        if text.len() > limits::URL_BYTES {
            return Err((key, format!("at most {} bytes", limits::URL_BYTES)));
        }
        let url = web_url(text).map_err(|message| (key.clone(), message))?;
        // The outcome is appended as a query: a fragment would swallow it.
        if url.fragment().is_some() {
            return Err((key, "must not have a fragment".to_string()));
        }
    }
    let (min, max) = limits::SESSION_TTL;
    duration_in(raw.session_ttl, min, max)
        .map_err(|message| ("connect.session_ttl".to_string(), message))?;
    Ok(ConnectSettings {
        public_url,
        return_urls: raw.return_urls,
        session_ttl: raw.session_ttl,
        one_user_per_account: raw.one_user_per_account,
    })
}

/// `text` as an https URL, or http on loopback (a developer's machine); cookies and
/// keys never cross the network in clear.
fn web_url(text: &str) -> Result<Url, String> {
    let url = Url::parse(text).map_err(|error| format!("{text:?} is not a URL: {error}"))?;
    match url.scheme() {
        "https" => {}
        "http" if tributary_providers::is_loopback(&url) => {}
        "http" => {
            return Err(format!(
                "{text:?} must be https (http only on loopback, such as http://127.0.0.1:8080)"
            ))
        }
        other => return Err(format!("{text:?}: expected https, got {other}")),
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(format!("{text:?} must not hold a user name or password"));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::{parse, RawConnectSettings};

    fn parsed(text: &str) -> Result<super::ConnectSettings, (String, String)> {
        let raw: RawConnectSettings = toml::from_str(text).expect("TOML");
        parse(raw)
    }

    #[test]
    fn a_connect_table_reads_and_bad_values_name_their_key() {
        let good = parsed(
            "public_url = \"https://sync.example.com\"\nreturn_urls = [\"https://app.example.com/done\"]\n",
        )
        .expect("valid");
        assert_eq!(good.session_ttl, std::time::Duration::from_secs(1800));
        assert!(good.secure());
        let local = parsed(
            "public_url = \"http://127.0.0.1:8080\"\nreturn_urls = [\"http://localhost:3000/done\"]\nsession_ttl = \"5m\"\n",
        )
        .expect("loopback http");
        assert!(!local.secure());
        for (text, key, words) in [
            ("return_urls = [\"https://a.example\"]", "connect.public_url", "missing"),
            ("public_url = \"http://sync.example.com\"\nreturn_urls = [\"https://a.example\"]", "connect.public_url", "https"),
            ("public_url = \"https://s.example\"", "connect.return_urls", "missing"),
            ("public_url = \"https://s.example\"\nreturn_urls = [\"ftp://a.example\"]", "connect.return_urls[0]", "https"),
            ("public_url = \"https://s.example\"\nreturn_urls = [\"https://a.example/#x\"]", "connect.return_urls[0]", "fragment"),
            ("public_url = \"https://s.example\"\nreturn_urls = [\"https://a.example\"]\nsession_ttl = \"31m\"", "connect.session_ttl", "between"),
        ] {
            let (found, message) = parsed(text).expect_err(text);
            assert_eq!(found, key, "{text}: {message}");
            assert!(message.contains(words), "{text}: {message}");
        }
    }
}
