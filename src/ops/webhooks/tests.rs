//! Which id and event type a verified delivery is kept under, per scheme.

use std::time::Duration;

use serde_json::json;

use super::{delivery_id, event_type, Headers, WebhookError};
use crate::config::{HmacAlgorithm, HmacScheme, SignatureEncoding, WebhookScheme};

fn headers(pairs: &[(&str, &str)]) -> Headers {
    pairs
        .iter()
        .map(|(name, value)| (name.to_ascii_lowercase(), value.to_string()))
        .collect()
}

fn hmac(id_header: Option<&str>) -> WebhookScheme {
    WebhookScheme::Hmac(HmacScheme {
        header: "X-Signature".into(),
        algorithm: HmacAlgorithm::Sha256,
        encoding: SignatureEncoding::Hex,
        prefix: String::new(),
        timestamp_header: None,
        tolerance: Duration::from_secs(300),
        id_header: id_header.map(str::to_string),
    })
}

#[test]
fn each_scheme_takes_its_delivery_id_from_its_own_place() {
    let none = headers(&[]);
    let body = json!({"id": "evt_1", "type": "charge.refunded"});
    let id = |scheme: &WebhookScheme, headers: &Headers| {
        delivery_id(scheme, headers, &body, b"{}").map_err(|error| error.to_string())
    };
    assert_eq!(
        id(
            &WebhookScheme::Github,
            &headers(&[("X-GitHub-Delivery", "72d3162e")])
        ),
        Ok("72d3162e".into())
    );
    assert_eq!(id(&WebhookScheme::Stripe, &none), Ok("evt_1".into()));
    assert_eq!(
        id(
            &WebhookScheme::Shopify,
            &headers(&[("X-Shopify-Webhook-Id", "b54557e4")])
        ),
        Ok("b54557e4".into())
    );
    let both = headers(&[
        ("Idempotency-Key", "key-1"),
        ("X-Gitlab-Event-UUID", "uuid-1"),
    ]);
    assert_eq!(id(&WebhookScheme::Gitlab, &both), Ok("key-1".into()));
    let uuid_only = headers(&[("X-Gitlab-Event-UUID", "uuid-1")]);
    assert_eq!(id(&WebhookScheme::Gitlab, &uuid_only), Ok("uuid-1".into()));
    assert_eq!(
        id(
            &WebhookScheme::Standard,
            &headers(&[("webhook-id", "msg_1")])
        ),
        Ok("msg_1".into())
    );
    assert_eq!(
        id(&hmac(Some("X-Id")), &headers(&[("X-Id", "d-1")])),
        Ok("d-1".into())
    );
    // Without an id header, the same body is the same delivery.
    assert_eq!(
        id(&hmac(None), &none),
        Ok("44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a".into())
    );
}

#[test]
fn a_delivery_without_a_usable_id_is_malformed_naming_where_the_id_belongs() {
    let body = json!({"type": "x"});
    let refused = |scheme: &WebhookScheme, headers: &Headers| match delivery_id(
        scheme, headers, &body, b"{}",
    ) {
        Err(WebhookError::Malformed(message)) => message,
        other => panic!("expected a malformed delivery, got {other:?}"),
    };
    assert!(refused(&WebhookScheme::Github, &headers(&[])).contains("X-GitHub-Delivery"));
    assert!(refused(&WebhookScheme::Gitlab, &headers(&[]))
        .contains("Idempotency-Key or X-Gitlab-Event-UUID"));
    assert!(refused(&WebhookScheme::Stripe, &headers(&[])).contains("`id`"));
    let long = "x".repeat(256);
    assert!(
        refused(&WebhookScheme::Standard, &headers(&[("webhook-id", &long)]))
            .contains("longer than 255")
    );
}

#[test]
fn the_event_type_comes_from_the_header_or_the_body() {
    let body = json!({"type": "invoice.paid"});
    assert_eq!(
        event_type(
            &WebhookScheme::Github,
            &headers(&[("X-GitHub-Event", "issues")]),
            &body
        ),
        Some("issues".into())
    );
    assert_eq!(
        event_type(&WebhookScheme::Standard, &headers(&[]), &body),
        Some("invoice.paid".into())
    );
    assert_eq!(
        event_type(&WebhookScheme::Shopify, &headers(&[]), &body),
        None
    );
}
