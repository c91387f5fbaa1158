//! The object a delivery carries whole, read from its body as received: a Stripe event's
//! `data.object`, the issue, pull request or comment of GitHub's `issues`,
//! `pull_request` and `issue_comment` events, and the order of Shopify's `orders/*`
//! topics; with its version, which orders the deliveries of one object however they
//! arrive (docs/decisions/webhook-versions.md). Any other delivery, or one without the
//! fields its version needs, carries none and queues a run instead.

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::config::WebhookScheme;

/// An object a delivery carries.
#[derive(Debug)]
pub(crate) struct Carried<'b> {
    /// Its type (`charge`, `issue`, `issue_comment`): its stream is the provider's
    /// stream of that name, or of that name with an `s`.
    pub object_type: String,
    /// Failing those, the `rest` kind's primary stream holds it (Shopify's orders, as
    /// `preset = "shopify_orders"` lists them).
    pub in_primary: bool,
    /// The object's JSON text exactly as received.
    pub object: &'b RawValue,
    /// The event reports the object deleted.
    pub deleted: bool,
    /// The object's version as sortable text: seconds, zero-padded, then a rank.
    pub version: String,
}

/// The object `body` carries whole, when `scheme` says how to read one.
pub(crate) fn carried<'b>(
    scheme: &WebhookScheme,
    event_type: Option<&str>,
    body: &'b str,
) -> Option<Carried<'b>> {
    match scheme {
        WebhookScheme::Stripe => stripe(body),
        WebhookScheme::Github => github(event_type?, body),
        WebhookScheme::Shopify => shopify(event_type?, body),
        _ => None,
    }
}

#[derive(Deserialize)]
struct StripeEvent<'b> {
    #[serde(rename = "type")]
    kind: String,
    created: i64,
    #[serde(borrow)]
    data: StripeData<'b>,
}

#[derive(Deserialize)]
struct StripeData<'b> {
    #[serde(borrow)]
    object: &'b RawValue,
}

/// What a Stripe object's version reads of it besides the event's `created`.
#[derive(Deserialize)]
struct StripeState {
    object: String,
    #[serde(default)]
    status: Option<serde_json::Value>,
    #[serde(default)]
    refunded: Option<serde_json::Value>,
}

/// A Stripe event's object. Its version is the event's `created` and then the object's
/// state, since two events of one object often share a second: deleted, then refunded,
/// then a final status, then any other.
fn stripe(body: &str) -> Option<Carried<'_>> {
    let event: StripeEvent<'_> = serde_json::from_str(body).ok()?;
    let state: StripeState = serde_json::from_str(event.data.object.get()).ok()?;
    let created = u64::try_from(event.created).ok()?;
    let deleted = event.kind.ends_with(".deleted");
    let status = state.status.as_ref().and_then(serde_json::Value::as_str);
    let rank = match (deleted, state.refunded.and_then(|r| r.as_bool()), status) {
        (true, _, _) => 9,
        (false, Some(true), _) => 3,
        (
            false,
            _,
            Some("succeeded" | "paid" | "failed" | "canceled" | "void" | "uncollectible"),
        ) => 2,
        (false, _, Some(_)) => 1,
        (false, _, None) => 0,
    };
    Some(Carried {
        object_type: state.object,
        in_primary: false,
        object: event.data.object,
        deleted,
        version: version(created, rank),
    })
}

#[derive(Deserialize)]
struct GithubEvent<'b> {
    #[serde(default)]
    action: Option<String>,
    #[serde(borrow, default)]
    issue: Option<&'b RawValue>,
    #[serde(borrow, default)]
    pull_request: Option<&'b RawValue>,
    #[serde(borrow, default)]
    comment: Option<&'b RawValue>,
}

#[derive(Deserialize)]
struct Updated {
    updated_at: String,
}

/// The issue, pull request or comment of a GitHub event (`X-GitHub-Event`), versioned by
/// its `updated_at`; a `deleted` action ranks above any edit of the same second.
fn github<'b>(event_type: &str, body: &'b str) -> Option<Carried<'b>> {
    let event: GithubEvent<'b> = serde_json::from_str(body).ok()?;
    let object = match event_type {
        "issues" => event.issue?,
        "pull_request" => event.pull_request?,
        "issue_comment" => event.comment?,
        _ => return None,
    };
    let seconds = updated_at(object)?;
    let deleted = event.action.as_deref() == Some("deleted");
    let object_type = match event_type {
        "issues" => "issue",
        other => other,
    };
    Some(Carried {
        object_type: object_type.to_string(),
        in_primary: false,
        object,
        deleted,
        version: version(seconds, if deleted { 9 } else { 0 }),
    })
}

/// The seconds of an object's RFC 3339 `updated_at`.
fn updated_at(object: &RawValue) -> Option<u64> {
    let updated: Updated = serde_json::from_str(object.get()).ok()?;
    let updated_at = chrono::DateTime::parse_from_rfc3339(&updated.updated_at).ok()?;
    u64::try_from(updated_at.timestamp()).ok()
}

/// The order of a Shopify `orders/*` topic (`X-Shopify-Topic`), whose body is the order
/// as the REST Admin API returns it, versioned by its `updated_at`. `orders/delete`
/// carries only the `id`: a deletion is final at Shopify, so it ranks above every
/// version. `orders/edited` carries an order edit, not the order, and other topics
/// queue a run.
fn shopify<'b>(topic: &str, body: &'b str) -> Option<Carried<'b>> {
    let object: &'b RawValue = serde_json::from_str(body).ok()?;
    let (deleted, version) = match topic {
        "orders/delete" => (true, version(u64::MAX, 9)),
        "orders/create"
        | "orders/updated"
        | "orders/cancelled"
        | "orders/fulfilled"
        | "orders/partially_fulfilled"
        | "orders/paid" => (false, version(updated_at(object)?, 0)),
        _ => return None,
    };
    Some(Carried {
        object_type: "order".to_string(),
        in_primary: true,
        object,
        deleted,
        version,
    })
}

/// Seconds and a rank as text that sorts as they do.
fn version(seconds: u64, rank: u8) -> String {
    format!("{seconds:020}.{rank}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stripe_refund_of_the_same_second_is_newer_than_the_success() {
        let event = |kind: &str, refunded: bool| {
            format!(
                r#"{{"id":"evt","type":"{kind}","created":1700000000,"data":{{"object":{{"id":"ch_1","object":"charge","status":"succeeded","refunded":{refunded}}}}}}}"#
            )
        };
        let (succeeded, refunded) = (
            event("charge.succeeded", false),
            event("charge.refunded", true),
        );
        let succeeded = carried(&WebhookScheme::Stripe, None, &succeeded).expect("carried");
        let refunded = carried(&WebhookScheme::Stripe, None, &refunded).expect("carried");
        assert!(refunded.version > succeeded.version);
        assert_eq!(succeeded.object_type, "charge");
        assert!(succeeded.object.get().starts_with(r#"{"id":"ch_1""#));
    }

    #[test]
    fn a_github_edit_is_versioned_by_updated_at_and_a_deletion_is_marked() {
        let body = |action: &str, at: &str| {
            format!(r#"{{"action":"{action}","issue":{{"id":7,"updated_at":"{at}"}}}}"#)
        };
        let (early, late) = (
            body("edited", "2026-12-01T10:00:00Z"),
            body("deleted", "2026-12-01T10:00:01Z"),
        );
        let early = carried(&WebhookScheme::Github, Some("issues"), &early).expect("carried");
        let late = carried(&WebhookScheme::Github, Some("issues"), &late).expect("carried");
        assert!(late.version > early.version && late.deleted && !early.deleted);
        assert_eq!(early.object_type, "issue");
    }

    #[test]
    fn a_shopify_order_is_versioned_by_updated_at_and_its_deletion_is_final() {
        let shopify = WebhookScheme::Shopify;
        let order = r##"{"id":450789469,"name":"#1001","updated_at":"2024-03-01T10:15:00-05:00"}"##;
        let updated = carried(&shopify, Some("orders/updated"), order).expect("carried");
        assert_eq!(updated.version, version(1_709_306_100, 0));
        assert_eq!(
            (updated.object_type.as_str(), updated.in_primary),
            ("order", true)
        );
        assert_eq!(updated.object.get(), order);
        let gone = r#"{"id":450789469}"#;
        let deleted = carried(&shopify, Some("orders/delete"), gone).expect("carried");
        assert!(deleted.deleted && deleted.version > updated.version);
    }

    #[test]
    fn objects_without_their_version_or_of_other_events_carry_nothing() {
        let github = WebhookScheme::Github;
        assert!(carried(&github, Some("issues"), r#"{"issue":{"id":7}}"#).is_none());
        assert!(carried(&github, Some("push"), r#"{"issue":{"id":7}}"#).is_none());
        assert!(carried(&github, None, "{}").is_none());
        let shopify = WebhookScheme::Shopify;
        let order = r#"{"id":450789469,"updated_at":"2024-03-01T10:15:00-05:00"}"#;
        assert!(carried(&shopify, Some("orders/edited"), order).is_none());
        assert!(carried(&shopify, Some("orders/updated"), r#"{"id":1}"#).is_none());
        assert!(carried(&shopify, None, order).is_none());
        let stripe = WebhookScheme::Stripe;
        assert!(carried(&stripe, None, r#"{"type":"x","data":{"object":{}}}"#).is_none());
        assert!(carried(&stripe, None, "not json").is_none());
    }
}
