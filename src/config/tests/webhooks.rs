//! `[providers.NAME.webhooks]` read through `Settings`, as a config file reaches it.

use std::path::Path;
use std::time::Duration;

use crate::config::{
    ConfigError, HmacAlgorithm, HmacScheme, Settings, SignatureEncoding, WebhookScheme,
    WebhookSettings,
};

fn parse(
    kind: &str,
    webhooks: &str,
    env_is_set: &dyn Fn(&str) -> bool,
) -> Result<Settings, ConfigError> {
    let adapter = match kind {
        "github" => "kind = \"github\"\n",
        "stripe" => "kind = \"stripe\"\n",
        "strava" => "kind = \"strava\"\nclient_id = \"1\"\nclient_secret_env = \"CLIENT\"\n",
        _ => "kind = \"rest\"\nbase_url = \"https://api.example.com\"\npath = \"/items\"\nrecords_path = \"data\"\nid_field = \"id\"\nauth = \"none\"\n",
    };
    let text = format!(
        "[database]\nurl = \"sqlite://t.db\"\n[api]\nlisten = \"127.0.0.1:0\"\n\
         [providers.acme]\n{adapter}schedule = \"0 * * * * *\"\n\
         [providers.acme.webhooks]\n{webhooks}\n"
    );
    Settings::parse(Path::new("config.toml"), &text, None, env_is_set)
}

/// The webhook settings of a table that is accepted with every variable set.
fn accepted(kind: &str, webhooks: &str) -> WebhookSettings {
    let settings =
        parse(kind, webhooks, &|_| true).unwrap_or_else(|error| panic!("{kind}: {error}"));
    settings.providers["acme"]
        .webhooks
        .clone()
        .expect("webhooks")
}

fn refused(kind: &str, webhooks: &str) -> (String, String) {
    match parse(kind, webhooks, &|_| true) {
        Err(ConfigError::Invalid { key, message, .. }) => (key, message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn the_scheme_defaults_by_kind_and_the_body_cap_to_one_mebibyte() {
    for (kind, scheme) in [
        ("github", WebhookScheme::Github),
        ("stripe", WebhookScheme::Stripe),
    ] {
        let webhooks = accepted(kind, "secret_env = \"HOOK\"");
        assert_eq!(webhooks.scheme, scheme);
        assert_eq!(webhooks.secret_env, ["HOOK"]);
        assert_eq!(webhooks.max_body_bytes, 1024 * 1024);
    }
    let (key, message) = refused("rest", "secret_env = \"HOOK\"");
    assert_eq!(key, "providers.acme.webhooks.scheme");
    assert!(message.contains("\"standard\""), "{message}");
}

#[test]
fn a_list_of_secrets_is_kept_in_order_and_each_variable_must_be_set() {
    let webhooks = accepted(
        "rest",
        "scheme = \"shopify\"\nsecret_env = [\"NEW\", \"OLD\"]",
    );
    assert_eq!(webhooks.secret_env, ["NEW", "OLD"]);
    match parse(
        "rest",
        "scheme = \"gitlab\"\nsecret_env = [\"NEW\", \"OLD\"]",
        &|name| name != "OLD",
    ) {
        Err(ConfigError::Invalid { key, message, .. }) => {
            assert_eq!(key, "providers.acme.webhooks.secret_env");
            assert_eq!(message, "environment variable OLD is not set");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let (key, _) = refused("github", "");
    assert_eq!(key, "providers.acme.webhooks.secret_env");
    let (key, message) = refused("github", "secret_env = 5");
    assert_eq!(key, "providers.acme.webhooks.secret_env");
    assert!(
        message.contains("an environment variable's name"),
        "{message}"
    );
}

#[test]
fn the_hmac_scheme_reads_its_keys_and_other_schemes_refuse_them() {
    let webhooks = accepted("rest",
        "scheme = \"hmac\"\nsecret_env = \"HOOK\"\nheader = \"X-Signature\"\nalgorithm = \"sha1\"\n\
         encoding = \"base64\"\nprefix = \"sha1=\"\ntimestamp_header = \"X-Timestamp\"\n\
         tolerance = \"2m\"\nid_header = \"X-Id\"\nmax_body_bytes = 2048");
    assert_eq!(
        webhooks.scheme,
        WebhookScheme::Hmac(HmacScheme {
            header: "X-Signature".into(),
            algorithm: HmacAlgorithm::Sha1,
            encoding: SignatureEncoding::Base64,
            prefix: "sha1=".into(),
            timestamp_header: Some("X-Timestamp".into()),
            tolerance: Duration::from_secs(120),
            id_header: Some("X-Id".into()),
        })
    );
    assert_eq!(webhooks.max_body_bytes, 2048);

    let cases = [
        ("scheme = \"hmac\"\nsecret_env = \"H\"", "header"),
        (
            "scheme = \"hmac\"\nsecret_env = \"H\"\nheader = \"X\"\nalgorithm = \"md5\"",
            "algorithm",
        ),
        (
            "scheme = \"hmac\"\nsecret_env = \"H\"\nheader = \"X\"\nencoding = \"hex2\"",
            "encoding",
        ),
        (
            "scheme = \"hmac\"\nsecret_env = \"H\"\nheader = \"X\"\ntolerance = \"1m\"",
            "tolerance",
        ),
        (
            "scheme = \"standard\"\nsecret_env = \"H\"\nheader = \"X\"",
            "header",
        ),
        (
            "scheme = \"stripe\"\nsecret_env = \"H\"\ntolerance = \"1m\"",
            "tolerance",
        ),
        ("scheme = \"svix\"\nsecret_env = \"H\"", "scheme"),
        (
            "scheme = \"github\"\nsecret_env = \"H\"\nmax_body_bytes = 0",
            "max_body_bytes",
        ),
        (
            "scheme = \"github\"\nsecret_env = \"H\"\nsecret = \"literal\"",
            "secret",
        ),
    ];
    for (table, key) in cases {
        let (refused_key, message) = refused("rest", table);
        assert_eq!(
            refused_key,
            format!("providers.acme.webhooks.{key}"),
            "{table}: {message}"
        );
    }
}

/// Deliveries are received on the API's listener: a `webhooks` table without `[api]`
/// would leave them unanswered, so it is refused naming the table.
#[test]
fn a_webhooks_table_without_an_api_to_receive_it_is_refused() {
    let text = "[database]\nurl = \"sqlite://t.db\"\n[providers.acme]\nkind = \"github\"\n\
                schedule = \"0 * * * * *\"\n[providers.acme.webhooks]\nsecret_env = \"HOOK\"\n";
    match Settings::parse(Path::new("config.toml"), text, None, &|_| true) {
        Err(ConfigError::Invalid { key, message, .. }) => {
            assert_eq!(key, "providers.acme.webhooks");
            assert!(message.contains("add an [api] table"), "{message}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn strava_needs_its_subscription_id_which_no_other_scheme_takes() {
    let webhooks = accepted(
        "strava",
        "secret_env = \"VERIFY\"\nsubscription_id = 120475",
    );
    assert_eq!(
        webhooks.scheme,
        WebhookScheme::Strava {
            subscription_id: 120475
        }
    );
    let (key, message) = refused("strava", "secret_env = \"VERIFY\"");
    assert_eq!(key, "providers.acme.webhooks.subscription_id");
    assert!(message.starts_with("missing"), "{message}");
    let (key, _) = refused("github", "secret_env = \"H\"\nsubscription_id = 1");
    assert_eq!(key, "providers.acme.webhooks.subscription_id");
    let (key, _) = refused("strava", "secret_env = \"H\"\nsubscription_id = -1");
    assert_eq!(key, "providers.acme.webhooks.subscription_id");
}

#[test]
fn the_rate_limit_defaults_to_a_hundred_a_second_and_is_checked() {
    let webhooks = accepted("github", "secret_env = \"H\"");
    assert_eq!(
        (webhooks.rate_limit.requests, webhooks.rate_limit.per),
        (100, Duration::from_secs(1))
    );
    let webhooks = accepted("github", "secret_env = \"H\"\nrate_limit = \"30/minute\"");
    assert_eq!(
        (webhooks.rate_limit.requests, webhooks.rate_limit.per),
        (30, Duration::from_secs(60))
    );
    for bad in ["0/second", "ten/second", "5"] {
        let (key, message) = refused(
            "github",
            &format!("secret_env = \"H\"\nrate_limit = \"{bad}\""),
        );
        assert_eq!(
            key, "providers.acme.webhooks.rate_limit",
            "{bad}: {message}"
        );
    }
}

#[test]
fn an_account_pointer_is_a_json_pointer_and_absent_by_default() {
    assert_eq!(
        accepted("github", "secret_env = \"HOOK\"").account_pointer,
        None
    );
    let webhooks = accepted(
        "rest",
        "scheme = \"standard\"\nsecret_env = \"HOOK\"\naccount_pointer = \"/data/account\"",
    );
    assert_eq!(webhooks.account_pointer.as_deref(), Some("/data/account"));
    let (key, message) = refused(
        "rest",
        "scheme = \"standard\"\nsecret_env = \"HOOK\"\naccount_pointer = \"data.account\"",
    );
    assert_eq!(key, "providers.acme.webhooks.account_pointer");
    assert!(message.contains("\"data.account\""), "{message}");
}
