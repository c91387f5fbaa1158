//! `[providers.NAME.webhooks]`: how a provider's inbound webhooks are verified. Holds the
//! names of the secrets' variables, never the secrets; [`resolve_secrets`] reads them.

use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use super::budget::BudgetWindow;

/// `max_body_bytes` when not given.
const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;
/// `rate_limit` when not given: well above a provider's usual bursts, well below what
/// fills a disk.
const DEFAULT_RATE_LIMIT: &str = "100/second";
/// The range of `max_body_bytes`.
const MAX_BODY_BYTES: (usize, usize) = (1, 64 * 1024 * 1024);
/// The replay window of the timestamped schemes when not given (Stripe's and Standard
/// Webhooks' own).
pub(crate) const DEFAULT_TOLERANCE: Duration = Duration::from_secs(5 * 60);
/// The range of `tolerance`.
const TOLERANCE: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(24 * 60 * 60));

/// One provider's webhook settings.
#[derive(Clone, Debug)]
pub(crate) struct WebhookSettings {
    pub scheme: WebhookScheme,
    /// The variables that hold the secrets; each is tried (several during a rotation).
    pub secret_env: Vec<String>,
    /// `secret`: secrets as written in config.toml, sealed (`sealed:v1:...`, opened with
    /// the secrets key at start-up) or, only with `[secrets] allow_plaintext`, literal.
    /// Tried after those of `secret_env`.
    pub secret: Vec<SecretString>,
    /// The largest body read; a larger one is refused with 413.
    pub max_body_bytes: usize,
    /// How many verified deliveries are kept per window, across instances; past it they
    /// are answered 429 with `Retry-After`.
    pub rate_limit: BudgetWindow,
    /// `account_pointer`: the JSON pointer (RFC 6901) to the provider-side account id in
    /// a delivery's body, which routes it to the connection with that `account_id`.
    /// Given, it replaces the scheme's own (GitHub `sender.id`, Stripe `account`, ...).
    pub account_pointer: Option<String>,
}

/// How deliveries are signed.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum WebhookScheme {
    Github,
    Stripe,
    Shopify,
    Gitlab,
    /// Standard Webhooks (`webhook-id`, `webhook-timestamp`, `webhook-signature`).
    Standard,
    Hmac(HmacScheme),
    /// Strava: a `GET` handshake echoing `hub.challenge` for the verify token (the
    /// secret), and unsigned event posts accepted only for this subscription.
    Strava {
        subscription_id: u64,
    },
}

/// `scheme = "hmac"`: an HMAC of the body (or of `{timestamp}.{body}`) in a header.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct HmacScheme {
    pub header: String,
    pub algorithm: HmacAlgorithm,
    pub encoding: SignatureEncoding,
    /// Text before the signature in the header, such as `sha256=`.
    pub prefix: String,
    /// When given, the header with the Unix seconds that are signed before the body.
    pub timestamp_header: Option<String>,
    pub tolerance: Duration,
    /// The header with the delivery's id; without it, the body's SHA-256 is the id.
    pub id_header: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HmacAlgorithm {
    Sha256,
    Sha1,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SignatureEncoding {
    Hex,
    Base64,
}

/// One variable name, or a list of them.
#[derive(Deserialize)]
#[serde(
    untagged,
    expecting = "an environment variable's name, or a list of them during a rotation"
)]
pub(super) enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// One secret as written in config.toml, or a list of them.
#[derive(Deserialize)]
#[serde(
    untagged,
    expecting = "a sealed secret (tributary secrets seal-webhook), or a list of them during a rotation"
)]
pub(super) enum OneOrManySecrets {
    One(SecretString),
    Many(Vec<SecretString>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWebhookSettings {
    secret_env: Option<OneOrMany>,
    secret: Option<OneOrManySecrets>,
    scheme: Option<String>,
    header: Option<String>,
    algorithm: Option<String>,
    encoding: Option<String>,
    prefix: Option<String>,
    timestamp_header: Option<String>,
    #[serde(default, with = "humantime_serde")]
    tolerance: Option<Duration>,
    id_header: Option<String>,
    subscription_id: Option<u64>,
    max_body_bytes: Option<usize>,
    rate_limit: Option<String>,
    account_pointer: Option<String>,
}

/// Validates a provider's `webhooks` table; `kind` is the provider's kind. Errors are
/// `(key under the table, message)`.
pub(super) fn parse(
    mut raw: RawWebhookSettings,
    kind: &str,
    env_is_set: &dyn Fn(&str) -> bool,
) -> Result<WebhookSettings, (String, String)> {
    let secret_env = match raw.secret_env.take() {
        Some(OneOrMany::One(name)) => vec![name],
        Some(OneOrMany::Many(names)) => names,
        None => Vec::new(),
    };
    let secret = match raw.secret.take() {
        Some(OneOrManySecrets::One(secret)) => vec![secret],
        Some(OneOrManySecrets::Many(secrets)) => secrets,
        None => Vec::new(),
    };
    if secret_env.is_empty() && secret.is_empty() {
        return Err((
            "secret_env".into(),
            "missing: expected the environment variable that holds the signing secret (or a list of them during a rotation), or a sealed `secret`".into(),
        ));
    }
    if secret_env.iter().any(|name| name.trim().is_empty()) {
        return Err((
            "secret_env".into(),
            "expected the names of environment variables, got an empty one".into(),
        ));
    }
    if secret
        .iter()
        .any(|secret| secret.expose_secret().is_empty())
    {
        return Err(("secret".into(), "empty".into()));
    }
    if let Some(name) = secret_env.iter().find(|name| !env_is_set(name)) {
        return Err((
            "secret_env".into(),
            format!("environment variable {name} is not set"),
        ));
    }
    let scheme_name = match (raw.scheme.as_deref(), kind) {
        (Some(name), _) => name,
        (None, "github") => "github",
        (None, "stripe") => "stripe",
        (None, "strava") => "strava",
        (None, _) => {
            return Err((
                "scheme".into(),
                format!("missing: kind {kind:?} has no default; expected one of {SCHEMES}"),
            ))
        }
    };
    let hmac_keys = [
        ("header", raw.header.is_some()),
        ("algorithm", raw.algorithm.is_some()),
        ("encoding", raw.encoding.is_some()),
        ("prefix", raw.prefix.is_some()),
        ("timestamp_header", raw.timestamp_header.is_some()),
        ("id_header", raw.id_header.is_some()),
    ];
    if scheme_name != "hmac" {
        if let Some((key, _)) = hmac_keys.iter().find(|(_, given)| *given) {
            return Err((
                (*key).into(),
                format!("only applies with scheme = \"hmac\", not {scheme_name:?}"),
            ));
        }
    }
    if scheme_name != "strava" && raw.subscription_id.is_some() {
        return Err((
            "subscription_id".into(),
            format!("only applies with scheme = \"strava\", not {scheme_name:?}"),
        ));
    }
    let tolerance = raw.tolerance.unwrap_or(DEFAULT_TOLERANCE);
    if raw.tolerance.is_some() {
        let takes_tolerance = matches!(scheme_name, "hmac") && raw.timestamp_header.is_some();
        if !takes_tolerance {
            return Err((
                "tolerance".into(),
                "only applies with scheme = \"hmac\" and a timestamp_header (Stripe's and Standard Webhooks' are 5 minutes)".into(),
            ));
        }
        let (min, max) = TOLERANCE;
        tributary_providers::bounds::duration_in(tolerance, min, max)
            .map_err(|message| ("tolerance".to_string(), message))?;
    }
    let scheme = match scheme_name {
        "github" => WebhookScheme::Github,
        "stripe" => WebhookScheme::Stripe,
        "shopify" => WebhookScheme::Shopify,
        "gitlab" => WebhookScheme::Gitlab,
        "standard" => WebhookScheme::Standard,
        "hmac" => WebhookScheme::Hmac(parse_hmac(&raw, tolerance)?),
        "strava" => WebhookScheme::Strava {
            subscription_id: raw.subscription_id.ok_or_else(|| {
                (
                    "subscription_id".to_string(),
                    "missing: expected the id Strava answered when the subscription was created"
                        .to_string(),
                )
            })?,
        },
        other => {
            return Err((
                "scheme".into(),
                format!("expected one of {SCHEMES}, got {other:?}"),
            ))
        }
    };
    let max_body_bytes = raw.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY_BYTES);
    let (min, max) = MAX_BODY_BYTES;
    tributary_providers::bounds::count_in(max_body_bytes, min, max)
        .map_err(|message| ("max_body_bytes".to_string(), message))?;
    let rate_limit =
        super::api::parse_rate_limit(raw.rate_limit.as_deref().unwrap_or(DEFAULT_RATE_LIMIT))
            .map_err(|message| ("rate_limit".to_string(), message))?;
    if let Some(pointer) = &raw.account_pointer {
        if !pointer.starts_with('/') {
            return Err((
                "account_pointer".into(),
                format!("expected a JSON pointer such as \"/account/id\", got {pointer:?}"),
            ));
        }
    }
    Ok(WebhookSettings {
        scheme,
        secret_env,
        secret,
        max_body_bytes,
        rate_limit,
        account_pointer: raw.account_pointer.clone(),
    })
}

const SCHEMES: &str =
    "\"github\", \"stripe\", \"shopify\", \"gitlab\", \"standard\", \"strava\" or \"hmac\"";

fn parse_hmac(
    raw: &RawWebhookSettings,
    tolerance: Duration,
) -> Result<HmacScheme, (String, String)> {
    let header = raw
        .header
        .clone()
        .filter(|header| valid_header_name(header))
        .ok_or_else(|| {
            (
                "header".to_string(),
                "missing or not a header name: expected the header that carries the signature, e.g. \"X-Signature\"".to_string(),
            )
        })?;
    let algorithm = match raw.algorithm.as_deref() {
        Some("sha256") | None => HmacAlgorithm::Sha256,
        Some("sha1") => HmacAlgorithm::Sha1,
        Some(other) => {
            return Err((
                "algorithm".into(),
                format!("expected \"sha256\" or \"sha1\", got {other:?}"),
            ))
        }
    };
    let encoding = match raw.encoding.as_deref() {
        Some("hex") | None => SignatureEncoding::Hex,
        Some("base64") => SignatureEncoding::Base64,
        Some(other) => {
            return Err((
                "encoding".into(),
                format!("expected \"hex\" or \"base64\", got {other:?}"),
            ))
        }
    };
    for (key, value) in [
        ("timestamp_header", &raw.timestamp_header),
        ("id_header", &raw.id_header),
    ] {
        if value
            .as_deref()
            .is_some_and(|name| !valid_header_name(name))
        {
            return Err((key.into(), "not a header name".into()));
        }
    }
    Ok(HmacScheme {
        header,
        algorithm,
        encoding,
        prefix: raw.prefix.clone().unwrap_or_default(),
        timestamp_header: raw.timestamp_header.clone(),
        tolerance,
        id_header: raw.id_header.clone(),
    })
}

/// An HTTP header name: letters, digits and `-`/`_`, as the headers providers use.
fn valid_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// What a sealed secret starts with (the `secrets` module's sealed form).
pub(crate) const SEALED_PREFIX: &str = "sealed:";

/// Reads the secrets of `settings`: from their variables in the order listed, then each
/// `secret` through `open` (which opens a sealed one). Errors are `(key under the table,
/// message)`, naming the variable or the entry, never a value.
pub(crate) fn resolve_secrets(
    settings: &WebhookSettings,
    open: &dyn Fn(&SecretString) -> Result<SecretString, String>,
) -> Result<Vec<SecretString>, (String, String)> {
    let standard = |secret: &SecretString| {
        settings.scheme != WebhookScheme::Standard || standard_key(secret.expose_secret()).is_some()
    };
    let mut secrets = Vec::with_capacity(
        settings
            .secret_env
            .len()
            .saturating_add(settings.secret.len()),
    );
    for name in &settings.secret_env {
        let refused = |message: String| ("secret_env".to_string(), message);
        let secret = super::secret_env::secret_from_env(name).map_err(refused)?;
        if secret.expose_secret().is_empty() {
            return Err(refused(format!("environment variable {name} is empty")));
        }
        if !standard(&secret) {
            return Err(refused(format!(
                "environment variable {name} is not a Standard Webhooks secret (whsec_ and base64)"
            )));
        }
        secrets.push(secret);
    }
    for (index, written) in settings.secret.iter().enumerate() {
        let refused = |message: String| {
            (
                "secret".to_string(),
                format!("entry {}: {message}", index.saturating_add(1)),
            )
        };
        let secret = open(written).map_err(refused)?;
        if secret.expose_secret().is_empty() || !standard(&secret) {
            return Err(refused(
                "empty, or not a Standard Webhooks secret (whsec_ and base64)".to_string(),
            ));
        }
        secrets.push(secret);
    }
    Ok(secrets)
}

/// The key of a Standard Webhooks secret: the base64 after `whsec_`.
pub(crate) fn standard_key(secret: &str) -> Option<zeroize::Zeroizing<Vec<u8>>> {
    use base64::Engine;
    let encoded = secret.strip_prefix("whsec_").unwrap_or(secret);
    base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()
        .filter(|key| !key.is_empty())
        .map(zeroize::Zeroizing::new)
}
