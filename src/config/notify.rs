//! `[notify]`: the webhook tributary POSTs after runs, and how its deliveries are retried.

use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use tributary_providers::bounds::duration_in;
use url::Url;

/// The shortest signing secret accepted: a shorter one could be guessed from signatures.
pub const MIN_SECRET_BYTES: usize = 16;

/// The ranges of the `[notify]` durations.
pub mod limits {
    use std::time::Duration;

    const HOUR: u64 = 60 * 60;
    const DAY: u64 = 24 * HOUR;

    /// `notify.timeout`: one POST, from connecting to the end of the answer.
    pub const TIMEOUT: (Duration, Duration) = (Duration::from_millis(10), Duration::from_secs(300));
    /// `notify.give_up_after`, counted from when the run closed.
    pub const GIVE_UP_AFTER: (Duration, Duration) =
        (Duration::from_secs(1), Duration::from_secs(30 * DAY));
    /// `notify.retry_initial_delay` and `notify.retry_max_delay`.
    pub const RETRY_DELAY: (Duration, Duration) =
        (Duration::from_millis(1), Duration::from_secs(DAY));
    /// `notify.poll_interval`.
    pub const POLL_INTERVAL: (Duration, Duration) =
        (Duration::from_millis(10), Duration::from_secs(HOUR));
    /// `notify.keep_delivered` (a year of 365.25 days, as durations are written).
    pub const KEEP_DELIVERED: (Duration, Duration) = (
        Duration::from_secs(1),
        Duration::from_secs(100 * 31_557_600),
    );
    /// `notify.max_concurrent_deliveries`: deliveries of different connections in flight
    /// at once, per daemon.
    pub const CONCURRENT_DELIVERIES: (usize, usize) = (1, 256);
}

/// Which runs write a notification.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NotifyRuns {
    /// No `[notify]` table: none.
    #[default]
    None,
    /// Runs that inserted, updated, deleted, restored or failed records.
    Changed,
    /// Every run (`always = true`).
    All,
}

/// `[notify]`. Holds the name of the secret's variable, never the secret; its `Debug`
/// shows the URL redacted.
#[derive(Clone)]
pub struct NotifySettings {
    /// Where deliveries are POSTed.
    pub url: Url,
    /// The environment variable that holds the signing secret.
    pub secret_env: String,
    /// Also notify runs that changed nothing.
    pub always: bool,
    /// The limit of one POST.
    pub timeout: Duration,
    /// A delivery still failing this long after its run closed is given up (`failed`).
    pub give_up_after: Duration,
    /// The wait after the first failed attempt; it doubles, with jitter, each attempt.
    pub retry_initial_delay: Duration,
    /// The longest wait between two attempts.
    pub retry_max_delay: Duration,
    /// How often the daemon looks for deliveries that are due.
    pub poll_interval: Duration,
    /// How long a delivered delivery is kept; failed ones are kept until removed.
    pub keep_delivered: Duration,
    /// The most deliveries a daemon has in flight at once, each of another connection.
    pub max_concurrent_deliveries: usize,
}

impl std::fmt::Debug for NotifySettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NotifySettings")
            .field("url", &super::redact_url(self.url.as_str()))
            .field("secret_env", &self.secret_env)
            .field("always", &self.always)
            .field("timeout", &self.timeout)
            .field("give_up_after", &self.give_up_after)
            .field("retry_initial_delay", &self.retry_initial_delay)
            .field("retry_max_delay", &self.retry_max_delay)
            .field("poll_interval", &self.poll_interval)
            .field("keep_delivered", &self.keep_delivered)
            .field("max_concurrent_deliveries", &self.max_concurrent_deliveries)
            .finish()
    }
}

impl NotifySettings {
    /// Which runs notify under these settings.
    pub fn runs(&self) -> NotifyRuns {
        if self.always {
            NotifyRuns::All
        } else {
            NotifyRuns::Changed
        }
    }

    /// Reads the signing secret from `secret_env`. The error names the variable and what
    /// is wrong with it, never its value.
    pub fn signing_secret(&self) -> Result<SecretString, String> {
        let name = &self.secret_env;
        let value = std::env::var(name).map_err(|error| match error {
            std::env::VarError::NotPresent => format!("environment variable {name} is not set"),
            std::env::VarError::NotUnicode(_) => {
                format!("environment variable {name} is not valid UTF-8")
            }
        })?;
        let secret = SecretString::from(value);
        let length = secret.expose_secret().len();
        if length < MIN_SECRET_BYTES {
            return Err(format!(
                "environment variable {name} holds {length} bytes; a signing secret needs at least {MIN_SECRET_BYTES}"
            ));
        }
        Ok(secret)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNotifySettings {
    url: Option<String>,
    secret_env: Option<String>,
    #[serde(default)]
    always: bool,
    #[serde(default = "default_timeout", with = "humantime_serde")]
    timeout: Duration,
    #[serde(default = "default_give_up_after", with = "humantime_serde")]
    give_up_after: Duration,
    #[serde(default = "default_retry_initial_delay", with = "humantime_serde")]
    retry_initial_delay: Duration,
    #[serde(default = "default_retry_max_delay", with = "humantime_serde")]
    retry_max_delay: Duration,
    #[serde(default = "default_poll_interval", with = "humantime_serde")]
    poll_interval: Duration,
    #[serde(default = "default_keep_delivered", with = "humantime_serde")]
    keep_delivered: Duration,
    #[serde(default = "default_max_concurrent_deliveries")]
    max_concurrent_deliveries: usize,
}

fn default_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_give_up_after() -> Duration {
    Duration::from_secs(24 * 60 * 60)
}
fn default_retry_initial_delay() -> Duration {
    Duration::from_secs(5)
}
fn default_retry_max_delay() -> Duration {
    Duration::from_secs(15 * 60)
}
fn default_poll_interval() -> Duration {
    Duration::from_secs(1)
}
fn default_keep_delivered() -> Duration {
    Duration::from_secs(30 * 24 * 60 * 60)
}
fn default_max_concurrent_deliveries() -> usize {
    8
}

/// Validates a `[notify]` table; errors are `(key, message)`.
pub(super) fn parse(
    raw: RawNotifySettings,
    env_is_set: &dyn Fn(&str) -> bool,
) -> Result<NotifySettings, (String, String)> {
    let at = |key: &str| {
        let key = format!("notify.{key}");
        move |message: String| (key.clone(), message)
    };
    let url = raw
        .url
        .ok_or_else(|| "missing: expected the https URL deliveries are POSTed to".to_string())
        .and_then(|text| validate_url(&text))
        .map_err(at("url"))?;
    let secret_env = raw
        .secret_env
        .filter(|name| !name.trim().is_empty())
        .ok_or_else(|| {
            "missing: expected the environment variable that holds the signing secret".to_string()
        })
        .map_err(at("secret_env"))?;
    if !env_is_set(&secret_env) {
        return Err(at("secret_env")(format!(
            "environment variable {secret_env} is not set"
        )));
    }
    let ranges = [
        ("timeout", raw.timeout, limits::TIMEOUT),
        ("give_up_after", raw.give_up_after, limits::GIVE_UP_AFTER),
        (
            "retry_initial_delay",
            raw.retry_initial_delay,
            limits::RETRY_DELAY,
        ),
        ("retry_max_delay", raw.retry_max_delay, limits::RETRY_DELAY),
        ("poll_interval", raw.poll_interval, limits::POLL_INTERVAL),
        ("keep_delivered", raw.keep_delivered, limits::KEEP_DELIVERED),
    ];
    for (key, value, (min, max)) in ranges {
        duration_in(value, min, max).map_err(at(key))?;
    }
    let (min, max) = limits::CONCURRENT_DELIVERIES;
    tributary_providers::bounds::count_in(raw.max_concurrent_deliveries, min, max)
        .map_err(at("max_concurrent_deliveries"))?;
    if raw.retry_max_delay < raw.retry_initial_delay {
        return Err(at("retry_max_delay")(
            "must be at least retry_initial_delay".to_string(),
        ));
    }
    Ok(NotifySettings {
        url,
        secret_env,
        always: raw.always,
        timeout: raw.timeout,
        give_up_after: raw.give_up_after,
        retry_initial_delay: raw.retry_initial_delay,
        retry_max_delay: raw.retry_max_delay,
        poll_interval: raw.poll_interval,
        keep_delivered: raw.keep_delivered,
        max_concurrent_deliveries: raw.max_concurrent_deliveries,
    })
}

/// An https URL, or http on loopback only, as the adapters' `base_url`: a delivery to
/// another host in clear could be read and replayed on the way.
fn validate_url(text: &str) -> Result<Url, String> {
    let url = Url::parse(text).map_err(|error| format!("not a URL ({error})"))?;
    match url.scheme() {
        "https" => {}
        "http" if tributary_providers::is_loopback(&url) => {}
        "http" => {
            return Err(format!(
                "must be an https URL: plain http is allowed only on loopback (127.0.0.1, ::1, \
                 localhost), since the notifications would travel in clear to {}",
                url.host_str().unwrap_or_default()
            ))
        }
        other => return Err(format!("must be an https URL, not {other}:")),
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err("must name a host".to_string());
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::{ConfigError, Settings};

    const SECRET_VAR: &str = "TRIBUTARY_TEST_NOTIFY_SECRET";

    fn parse(notify: &str, env_is_set: &dyn Fn(&str) -> bool) -> Result<Settings, ConfigError> {
        let text = format!(
            "[database]\nurl = \"sqlite://t.db\"\n[notify]\n{notify}\n\
             [providers.acme]\nkind = \"rest\"\nbase_url = \"https://api.example.com\"\n\
             path = \"/items\"\nschedule = \"0 * * * * *\"\nrecords_path = \"data\"\n\
             id_field = \"id\"\nauth = \"none\"\n"
        );
        Settings::parse(Path::new("config.toml"), &text, None, env_is_set)
    }

    /// The key and the message of a refused `[notify]` table.
    fn refused(notify: &str) -> (String, String) {
        match parse(notify, &|_| true) {
            Err(ConfigError::Invalid { key, message, .. }) => (key, message),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    const BASE: &str = "url = \"https://app.example.com/hooks\"\nsecret_env = \"HOOK_SECRET\"";

    #[test]
    fn a_notify_table_with_defaults_notifies_changed_runs_of_every_provider() {
        let settings = parse(BASE, &|_| true).expect("valid");
        let notify = settings.notify.as_ref().expect("notify on");
        assert_eq!(notify.url.as_str(), "https://app.example.com/hooks");
        assert_eq!(notify.secret_env, "HOOK_SECRET");
        assert_eq!(
            (notify.timeout, notify.give_up_after),
            (Duration::from_secs(10), Duration::from_secs(86_400))
        );
        assert_eq!(settings.providers["acme"].notify, NotifyRuns::Changed);

        let always = parse(&format!("{BASE}\nalways = true"), &|_| true).expect("valid");
        assert_eq!(always.providers["acme"].notify, NotifyRuns::All);
    }

    #[test]
    fn without_a_notify_table_no_run_notifies() {
        let text = "[database]\nurl = \"sqlite://t.db\"\n";
        let settings = Settings::parse(Path::new("c.toml"), text, None, &|_| true).expect("valid");
        assert!(settings.notify.is_none());
    }

    #[test]
    fn bad_notify_keys_are_refused_naming_the_key() {
        let cases = [
            ("secret_env = \"S\"", "notify.url", "missing"),
            (
                "url = \"http://app.example.com/h\"\nsecret_env = \"S\"",
                "notify.url",
                "plain http is allowed only on loopback",
            ),
            (
                "url = \"ftp://app.example.com/h\"\nsecret_env = \"S\"",
                "notify.url",
                "must be an https URL",
            ),
            (
                "url = \"not a url\"\nsecret_env = \"S\"",
                "notify.url",
                "not a URL",
            ),
            (
                "url = \"https://a.example.com\"",
                "notify.secret_env",
                "missing",
            ),
            (
                "url = \"https://a.example.com\"\nsecret_env = \" \"",
                "notify.secret_env",
                "missing",
            ),
            (
                &format!("{BASE}\ntimeout = \"0s\""),
                "notify.timeout",
                "must be between",
            ),
            (
                &format!("{BASE}\ngive_up_after = \"400days\""),
                "notify.give_up_after",
                "must be between",
            ),
            (
                &format!("{BASE}\nretry_initial_delay = \"1m\"\nretry_max_delay = \"1s\""),
                "notify.retry_max_delay",
                "at least retry_initial_delay",
            ),
            (
                &format!("{BASE}\npoll_interval = \"1ms\""),
                "notify.poll_interval",
                "must be between",
            ),
            (
                &format!("{BASE}\nkeep_delivered = \"0s\""),
                "notify.keep_delivered",
                "must be between",
            ),
            (
                &format!("{BASE}\nmax_concurrent_deliveries = 0"),
                "notify.max_concurrent_deliveries",
                "must be between 1 and 256, got 0",
            ),
            (
                &format!("{BASE}\nsecret = \"x\""),
                "notify.secret",
                "unknown field `secret`",
            ),
            (
                &format!("{BASE}\ntimeout = \"soon\""),
                "notify.timeout",
                "invalid",
            ),
        ];
        for (table, key, message) in cases {
            let (got_key, got_message) = refused(table);
            assert_eq!(got_key, key, "{table}: {got_message}");
            assert!(got_message.contains(message), "{table}: {got_message}");
        }
    }

    #[test]
    fn plain_http_is_accepted_on_loopback() {
        for url in [
            "http://127.0.0.1:8080/h",
            "http://[::1]/h",
            "http://localhost/h",
        ] {
            let table = format!("url = \"{url}\"\nsecret_env = \"S\"");
            assert!(parse(&table, &|_| true).is_ok(), "{url}");
        }
    }

    #[test]
    fn an_unset_secret_variable_is_refused_by_name() {
        match parse(BASE, &|name| name != "HOOK_SECRET") {
            Err(ConfigError::Invalid { key, message, .. }) => {
                assert_eq!(key, "notify.secret_env");
                assert_eq!(message, "environment variable HOOK_SECRET is not set");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_short_secret_is_refused_without_showing_it() {
        let notify = NotifySettings {
            secret_env: SECRET_VAR.to_string(),
            ..parse(BASE, &|_| true).expect("valid").notify.expect("on")
        };
        // The one test that sets this variable, so no other test races it.
        std::env::set_var(SECRET_VAR, "short-value");
        let error = notify.signing_secret().expect_err("too short");
        assert!(!error.contains("short-value"), "{error}");
        assert!(error.contains("holds 11 bytes"), "{error}");
        std::env::set_var(SECRET_VAR, "a-long-enough-signing-secret");
        assert!(notify.signing_secret().is_ok());
        std::env::remove_var(SECRET_VAR);
        assert!(notify
            .signing_secret()
            .expect_err("unset")
            .contains("is not set"));
    }

    #[test]
    fn debug_shows_the_url_redacted() {
        let table = "url = \"https://app.example.com/h?token=abc123\"\nsecret_env = \"S\"";
        let notify = parse(table, &|_| true).expect("valid").notify.expect("on");
        let shown = format!("{notify:?}");
        assert!(!shown.contains("abc123"), "{shown}");
    }
}
