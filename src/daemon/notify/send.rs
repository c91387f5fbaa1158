//! One POST of a delivery, and what a failed one leaves in `last_error`: a bounded
//! excerpt with the secret and the signature taken out, since a receiver's error page may
//! echo the request's headers.

use reqwest::header::{HeaderValue, CONTENT_TYPE};
use secrecy::{ExposeSecret, SecretString};
use tributary_providers::http::error_chain;
use tributary_providers::quote::truncated;

use tracing::Instrument;

use crate::config::{redact_url, NotifySettings};
use crate::entities::notification_delivery::Model as Delivery;
use crate::telemetry::{traceparent_of, TRACEPARENT};

use super::signature::{signature, DELIVERY_HEADER, SIGNATURE_HEADER};

/// How much of a refusal's body is read (and searched for secrets) before it is cut.
const ERROR_BODY_READ_LIMIT: usize = 16 * 1024;
/// The most characters of a refusal's body kept in `last_error`.
const ERROR_EXCERPT_CHARS: usize = 200;
/// What replaces a secret in `last_error`.
const REDACTED: &str = "[REDACTED]";

/// The worker's client: the timeout of `[notify]`, rustls, and no redirects (a receiver
/// that moved must be configured anew, not followed with a signed body).
pub(super) fn client(settings: &NotifySettings) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .user_agent(concat!("tributary/", env!("CARGO_PKG_VERSION")))
        .timeout(settings.timeout)
        .redirect(reqwest::redirect::Policy::none())
        .build()
}

/// POSTs the delivery's body, signed now. `Err` holds why it failed, fit for `last_error`.
pub(super) async fn post(
    client: &reqwest::Client,
    settings: &NotifySettings,
    secret: &SecretString,
    delivery: &Delivery,
) -> Result<(), String> {
    let signed = signature(secret, chrono::Utc::now().timestamp(), &delivery.body);
    let redact = Redaction {
        secret,
        signature: &signed,
    };
    let mut signature_value =
        HeaderValue::from_str(&signed).map_err(|error| format!("signing: {error}"))?;
    signature_value.set_sensitive(true);
    let span = tracing::debug_span!(
        "notify.delivery",
        "otel.name" = "POST",
        "otel.kind" = "client",
        "http.request.method" = "POST",
        "url.full" = %redact_url(settings.url.as_str()),
        delivery_id = delivery.delivery_id.as_str(),
        "http.response.status_code" = tracing::field::Empty,
        "otel.status_code" = tracing::field::Empty,
        "otel.status_description" = tracing::field::Empty,
    );
    let mut request = client
        .post(settings.url.clone())
        .header(CONTENT_TYPE, "application/json")
        .header(SIGNATURE_HEADER, signature_value)
        .header(DELIVERY_HEADER, delivery.delivery_id.as_str());
    // The receiver's trace goes on from this delivery's span.
    if let Some(traceparent) = traceparent_of(&span) {
        request = request.header(TRACEPARENT, traceparent);
    }
    let sent = async {
        let response = match request.body(delivery.body.clone()).send().await {
            Ok(response) => response,
            Err(error) => return Err(redact.apply(&transport_error(error))),
        };
        let status = response.status();
        span.record("http.response.status_code", i64::from(status.as_u16()));
        if status.is_success() {
            return Ok(());
        }
        let body = read_head(response).await;
        Err(format!(
            "the receiver answered HTTP {status}: {}",
            redact.excerpt(&body)
        ))
    }
    .instrument(span.clone())
    .await;
    if let Err(error) = &sent {
        span.record("otel.status_code", "ERROR")
            .record("otel.status_description", error.as_str());
    }
    sent
}

/// A failed request's error without its URL (whose query may hold a receiver's token).
fn transport_error(error: reqwest::Error) -> String {
    let timed_out = error.is_timeout();
    let text = error_chain(&error.without_url());
    if timed_out {
        format!("the request timed out ({text})")
    } else {
        format!("the request failed: {text}")
    }
}

/// The start of a refusal's body, at most [`ERROR_BODY_READ_LIMIT`] bytes of it.
async fn read_head(mut response: reqwest::Response) -> String {
    let mut head: Vec<u8> = Vec::new();
    while head.len() < ERROR_BODY_READ_LIMIT {
        match response.chunk().await {
            Ok(Some(chunk)) => head.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    head.truncate(ERROR_BODY_READ_LIMIT);
    String::from_utf8_lossy(&head).into_owned()
}

/// The values an error text must not keep.
struct Redaction<'a> {
    secret: &'a SecretString,
    signature: &'a str,
}

impl Redaction<'_> {
    /// `text` with the secret and the signature replaced.
    fn apply(&self, text: &str) -> String {
        let mut clean = text.to_string();
        for value in [self.secret.expose_secret(), self.signature] {
            if !value.is_empty() && clean.contains(value) {
                clean = clean.replace(value, REDACTED);
            }
        }
        clean
    }

    /// A body as one bounded line: redacted first, so a cut cannot leave part of a
    /// secret behind, then control characters and runs of white space folded.
    fn excerpt(&self, body: &str) -> String {
        let clean = self.apply(body);
        let line = clean
            .split(|c: char| c.is_whitespace() || c.is_control())
            .filter(|word| !word.is_empty())
            .collect::<Vec<_>>()
            .join(" ");
        if line.is_empty() {
            return "(empty body)".to_string();
        }
        truncated(&line, ERROR_EXCERPT_CHARS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_echoed_secret_and_signature_are_removed_before_the_cut() {
        let secret = SecretString::from("whsec_0123456789abcdef");
        let signed = "t=1,v1=00ff";
        let redact = Redaction {
            secret: &secret,
            signature: signed,
        };
        let body = format!(
            "bad request\r\nTributary-Signature: {signed}\nkey whsec_0123456789abcdef\u{0}{}",
            "x".repeat(1000)
        );
        let excerpt = redact.excerpt(&body);
        assert!(!excerpt.contains("whsec_"), "{excerpt}");
        assert!(!excerpt.contains("v1=00ff"), "{excerpt}");
        assert!(
            excerpt.starts_with("bad request Tributary-Signature: [REDACTED] key [REDACTED] xxx")
        );
        assert_eq!(
            excerpt.chars().count(),
            ERROR_EXCERPT_CHARS + 1,
            "{excerpt}"
        );
        assert_eq!(redact.excerpt(" \n"), "(empty body)");
    }
}
