//! `[notify]` read through `Settings`, as a config file reaches it.

use std::path::Path;
use std::time::Duration;

use crate::config::{ConfigError, NotifyRuns, NotifySettings, Settings};

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

/// `keep_delivered`, from before `[retention]`, is still read as `retention.deliveries`;
/// giving both is refused, naming the older key.
#[test]
fn keep_delivered_is_the_older_name_of_the_deliveries_retention() {
    let settings = parse(&format!("{BASE}\nkeep_delivered = \"10m\""), &|_| true).expect("valid");
    assert_eq!(settings.retention.deliveries, Duration::from_secs(600));
    let default = parse(BASE, &|_| true).expect("valid");
    assert_eq!(
        default.retention.deliveries,
        Duration::from_secs(30 * 86_400)
    );

    let both = format!(
        "[database]\nurl = \"sqlite://t.db\"\n[retention]\ndeliveries = \"7d\"\n\
         [notify]\n{BASE}\nkeep_delivered = \"1d\"\n"
    );
    match Settings::parse(Path::new("config.toml"), &both, None, &|_| true) {
        Err(ConfigError::Invalid { key, message, .. }) => {
            assert_eq!(key, "notify.keep_delivered");
            assert!(
                message.contains("set only retention.deliveries"),
                "{message}"
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}
