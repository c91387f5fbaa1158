//! Verifying inbound webhooks: pure functions of the scheme, the secrets, the headers, the
//! raw body and the time. Every comparison of a secret or a MAC runs in constant time.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine;
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::{standard_key, HmacAlgorithm, HmacScheme, SignatureEncoding, WebhookScheme};

/// A request's headers by lower-case name (the first of a repeated header).
pub(crate) type Headers = BTreeMap<String, String>;

/// Why a delivery's signature was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    #[error("the {0} header is missing")]
    Missing(String),
    #[error("the {0} header is malformed")]
    Malformed(String),
    #[error("the signature matches none of the provider's secrets")]
    Mismatch,
    #[error("the signature's timestamp is more than {} seconds from now", .tolerance.as_secs())]
    Stale { tolerance: Duration },
    /// Strava signs nothing: an event is taken only for the configured subscription.
    #[error("the event's subscription_id is missing or not this provider's subscription")]
    Subscription,
    /// Strava's handshake: `hub.verify_token` is missing or not the configured one.
    #[error("the hub.verify_token is missing or not the configured one")]
    VerifyToken,
}

/// Stripe's and Standard Webhooks' tolerance.
const TIMESTAMP_TOLERANCE: Duration = crate::config::DEFAULT_WEBHOOK_TOLERANCE;

/// Checks the signature of `body` under `scheme` against each of `secrets`.
pub(crate) fn verify(
    scheme: &WebhookScheme,
    secrets: &[SecretString],
    headers: &Headers,
    body: &[u8],
    now: DateTime<Utc>,
) -> Result<(), Refusal> {
    match scheme {
        WebhookScheme::Github => {
            let name = "X-Hub-Signature-256";
            let hex = header(headers, name)?
                .strip_prefix("sha256=")
                .ok_or_else(|| Refusal::Malformed(name.into()))?;
            let expected = decode(SignatureEncoding::Hex, hex, name)?;
            any_secret(secrets, |key| {
                mac_matches(HmacAlgorithm::Sha256, key, &[body], &expected)
            })
        }
        WebhookScheme::Shopify => {
            let name = "X-Shopify-Hmac-Sha256";
            let expected = decode(SignatureEncoding::Base64, header(headers, name)?, name)?;
            any_secret(secrets, |key| {
                mac_matches(HmacAlgorithm::Sha256, key, &[body], &expected)
            })
        }
        WebhookScheme::Gitlab => {
            let token = header(headers, "X-Gitlab-Token")?;
            // Compared as digests, so that the time taken says nothing of the length.
            let given = Sha256::digest(token.as_bytes());
            any_secret(secrets, |key| {
                bool::from(Sha256::digest(key)[..].ct_eq(&given[..]))
            })
        }
        WebhookScheme::Stripe => verify_stripe(secrets, headers, body, now),
        WebhookScheme::Standard => verify_standard(secrets, headers, body, now),
        WebhookScheme::Hmac(hmac) => verify_hmac(hmac, secrets, headers, body, now),
        WebhookScheme::Strava { subscription_id } => verify_strava(*subscription_id, body),
    }
}

/// Strava's event posts carry no signature (developers.strava.com/docs/webhooks): the
/// event must name the configured subscription, and the object is fetched from the API
/// rather than trusted from the body.
fn verify_strava(subscription_id: u64, body: &[u8]) -> Result<(), Refusal> {
    #[derive(serde::Deserialize)]
    struct Event {
        subscription_id: Option<u64>,
    }
    let named = serde_json::from_slice::<Event>(body)
        .ok()
        .and_then(|event| event.subscription_id);
    match named == Some(subscription_id) {
        true => Ok(()),
        false => Err(Refusal::Subscription),
    }
}

/// Strava's subscription handshake: `hub.verify_token` compared with each of the
/// provider's secrets in constant time (as digests, so the time says nothing of the
/// length).
pub(crate) fn verify_token(secrets: &[SecretString], token: Option<&str>) -> Result<(), Refusal> {
    let given = Sha256::digest(token.unwrap_or_default().as_bytes());
    let matched = any_secret(secrets, |key| {
        bool::from(Sha256::digest(key)[..].ct_eq(&given[..]))
    });
    match (token.is_some_and(|token| !token.is_empty()), matched) {
        (true, Ok(())) => Ok(()),
        _ => Err(Refusal::VerifyToken),
    }
}

/// `Stripe-Signature: t=...,v1=...,v1=...` over `{t}.{body}`.
fn verify_stripe(
    secrets: &[SecretString],
    headers: &Headers,
    body: &[u8],
    now: DateTime<Utc>,
) -> Result<(), Refusal> {
    let name = "Stripe-Signature";
    let value = header(headers, name)?;
    let mut timestamp = None;
    let mut signatures = Vec::new();
    for part in value.split(',') {
        match part.trim().split_once('=') {
            Some(("t", t)) => timestamp = Some(t),
            // Another scheme's or an undecodable one is not ours to match.
            Some(("v1", hex)) => signatures.extend(const_hex::decode(hex).ok()),
            _ => {}
        }
    }
    let timestamp = timestamp.ok_or_else(|| Refusal::Malformed(name.into()))?;
    let seconds = parse_seconds(timestamp, name)?;
    if signatures.is_empty() {
        return Err(Refusal::Malformed(name.into()));
    }
    let signed = [timestamp.as_bytes(), b".", body];
    any_secret(secrets, |key| {
        signatures
            .iter()
            .any(|expected| mac_matches(HmacAlgorithm::Sha256, key, &signed, expected))
    })?;
    within_tolerance(seconds, now, TIMESTAMP_TOLERANCE)
}

/// Standard Webhooks: `webhook-signature: v1,<base64> v1,<base64>` over
/// `{webhook-id}.{webhook-timestamp}.{body}`, keyed by the base64 of `whsec_...`.
fn verify_standard(
    secrets: &[SecretString],
    headers: &Headers,
    body: &[u8],
    now: DateTime<Utc>,
) -> Result<(), Refusal> {
    let id = header(headers, "webhook-id")?;
    let timestamp = header(headers, "webhook-timestamp")?;
    let seconds = parse_seconds(timestamp, "webhook-timestamp")?;
    let signatures: Vec<Vec<u8>> = header(headers, "webhook-signature")?
        .split_whitespace()
        .filter_map(|entry| entry.strip_prefix("v1,"))
        .filter_map(|encoded| {
            base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .ok()
        })
        .collect();
    if signatures.is_empty() {
        return Err(Refusal::Malformed("webhook-signature".into()));
    }
    let signed = [id.as_bytes(), b".", timestamp.as_bytes(), b".", body];
    let matched = secrets.iter().any(|secret| {
        standard_key(secret.expose_secret()).is_some_and(|key| {
            signatures
                .iter()
                .any(|expected| mac_matches(HmacAlgorithm::Sha256, &key, &signed, expected))
        })
    });
    if !matched {
        return Err(Refusal::Mismatch);
    }
    within_tolerance(seconds, now, TIMESTAMP_TOLERANCE)
}

/// `scheme = "hmac"`: the configured header, algorithm, encoding and prefix, over the body
/// or, with `timestamp_header`, over `{timestamp}.{body}`.
fn verify_hmac(
    hmac: &HmacScheme,
    secrets: &[SecretString],
    headers: &Headers,
    body: &[u8],
    now: DateTime<Utc>,
) -> Result<(), Refusal> {
    let value = header(headers, &hmac.header)?;
    let encoded = value
        .strip_prefix(hmac.prefix.as_str())
        .ok_or_else(|| Refusal::Malformed(hmac.header.clone()))?;
    let expected = decode(hmac.encoding, encoded, &hmac.header)?;
    let timestamp = match &hmac.timestamp_header {
        Some(name) => {
            let text = header(headers, name)?;
            Some((text, parse_seconds(text, name)?))
        }
        None => None,
    };
    any_secret(secrets, |key| match timestamp {
        Some((text, _)) => mac_matches(
            hmac.algorithm,
            key,
            &[text.as_bytes(), b".", body],
            &expected,
        ),
        None => mac_matches(hmac.algorithm, key, &[body], &expected),
    })?;
    match timestamp {
        Some((_, seconds)) => within_tolerance(seconds, now, hmac.tolerance),
        None => Ok(()),
    }
}

/// The header `name`, or a refusal naming it.
fn header<'a>(headers: &'a Headers, name: &str) -> Result<&'a str, Refusal> {
    headers
        .get(&name.to_ascii_lowercase())
        .map(|value| value.trim())
        .filter(|value| !value.is_empty())
        .ok_or_else(|| Refusal::Missing(name.to_string()))
}

fn decode(encoding: SignatureEncoding, text: &str, name: &str) -> Result<Vec<u8>, Refusal> {
    match encoding {
        SignatureEncoding::Hex => const_hex::decode(text).ok(),
        SignatureEncoding::Base64 => base64::engine::general_purpose::STANDARD.decode(text).ok(),
    }
    .ok_or_else(|| Refusal::Malformed(name.to_string()))
}

fn parse_seconds(text: &str, name: &str) -> Result<i64, Refusal> {
    text.trim()
        .parse::<i64>()
        .map_err(|_| Refusal::Malformed(name.to_string()))
}

/// Whether `seconds` (Unix time) lies within `tolerance` of `now`, either side.
fn within_tolerance(seconds: i64, now: DateTime<Utc>, tolerance: Duration) -> Result<(), Refusal> {
    let limit = i64::try_from(tolerance.as_secs()).unwrap_or(i64::MAX);
    let fresh = now
        .timestamp()
        .checked_sub(seconds)
        .and_then(i64::checked_abs)
        .is_some_and(|distance| distance <= limit);
    match fresh {
        true => Ok(()),
        false => Err(Refusal::Stale { tolerance }),
    }
}

/// Tries every secret (each of them, so that the time taken says nothing of which).
fn any_secret(secrets: &[SecretString], matches: impl Fn(&[u8]) -> bool) -> Result<(), Refusal> {
    let matched = secrets.iter().fold(false, |found, secret| {
        matches(secret.expose_secret().as_bytes()) | found
    });
    match matched {
        true => Ok(()),
        false => Err(Refusal::Mismatch),
    }
}

/// Whether the HMAC of `parts` under `key` is `expected`, compared in constant time.
fn mac_matches(algorithm: HmacAlgorithm, key: &[u8], parts: &[&[u8]], expected: &[u8]) -> bool {
    match algorithm {
        HmacAlgorithm::Sha256 => Hmac::<Sha256>::new_from_slice(key).is_ok_and(|mut mac| {
            parts.iter().for_each(|part| mac.update(part));
            mac.verify_slice(expected).is_ok()
        }),
        HmacAlgorithm::Sha1 => Hmac::<sha1::Sha1>::new_from_slice(key).is_ok_and(|mut mac| {
            parts.iter().for_each(|part| mac.update(part));
            mac.verify_slice(expected).is_ok()
        }),
    }
}

#[cfg(test)]
mod tests;
