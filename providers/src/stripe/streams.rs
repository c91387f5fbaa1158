//! The streams a Stripe connection serves: each one's list endpoint, the `object` its
//! records carry, and how a run after the first one learns what changed.

use serde_json::value::RawValue;
use serde_json::Value;
use url::Url;

use crate::adapter;
use crate::http::display_url;
use crate::quote::quote_cursor;
use crate::raw::{to_value, RawObject};
use crate::{FetchError, ParentRecord, StreamSpec};

/// One stream: a Stripe list endpoint keyed by `id`.
#[derive(Debug)]
pub(super) struct Stream {
    /// The stream's name in config.
    pub name: &'static str,
    /// The list endpoint (for `invoice_line_items`, the path its invoice's id follows).
    pub path: &'static str,
    /// The `object` field of the stream's records (`"charge"`): events whose `data.object`
    /// is of another kind (a `charge.dispute.created` event holds a dispute) are not
    /// records of the stream.
    pub object: &'static str,
    /// Query parameters every page of the list sends besides `limit` and the cursor.
    pub query: &'static [(&'static str, &'static str)],
    /// How an incremental run finds what changed.
    pub changes: Changes,
}

/// How an incremental run of a stream finds what changed since its cursor.
#[derive(Debug)]
pub(super) enum Changes {
    /// From the Events API.
    Events(EventKinds),
    /// From the list itself, by `created[gte]`: Stripe sends no events for the objects.
    Created,
    /// Listed again in full for every stored invoice on every run: a line item has neither
    /// a creation time nor events of its own.
    PerInvoice,
}

/// The events of one stream's objects.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct EventKinds {
    /// The event type prefix, asked for as `type=PREFIX.*` (`customer.subscription` for
    /// subscriptions).
    pub prefix: &'static str,
    /// Whether `PREFIX.deleted` means the object is gone. Not for subscriptions: Stripe
    /// names a cancellation `customer.subscription.deleted`, and the canceled subscription
    /// is still there to list.
    pub deletes: bool,
    /// Event types that match the prefix but hold no record of the stream.
    pub ignored: &'static [&'static str],
}

impl EventKinds {
    /// Whether an event of type `kind` reports its object deleted.
    pub fn is_deletion(&self, kind: &str) -> bool {
        self.deletes
            && kind
                .strip_prefix(self.prefix)
                .and_then(|rest| rest.strip_prefix('.'))
                == Some("deleted")
    }
}

/// The parent stream of `invoice_line_items`.
const INVOICES: &str = "invoices";

/// Every stream, the primary one (`charges`) first.
pub(super) const STREAMS: &[Stream] = &[
    Stream::evented("charges", "/v1/charges", "charge", "charge", false),
    Stream::evented("customers", "/v1/customers", "customer", "customer", true),
    Stream {
        changes: Changes::Events(EventKinds {
            prefix: "invoice",
            // Only a draft invoice can be deleted; a finalized one is voided instead.
            deletes: true,
            // A preview of an invoice that does not exist yet, without an id to key it.
            ignored: &["invoice.upcoming"],
        }),
        ..Stream::evented(INVOICES, "/v1/invoices", "invoice", "invoice", true)
    },
    Stream {
        // Without `status`, Stripe lists only the subscriptions that are not canceled.
        query: &[("status", "all")],
        ..Stream::evented(
            "subscriptions",
            "/v1/subscriptions",
            "subscription",
            "customer.subscription",
            false,
        )
    },
    Stream::evented(
        "payment_intents",
        "/v1/payment_intents",
        "payment_intent",
        "payment_intent",
        false,
    ),
    Stream::evented("refunds", "/v1/refunds", "refund", "refund", false),
    Stream::evented("products", "/v1/products", "product", "product", true),
    Stream::evented("prices", "/v1/prices", "price", "price", true),
    Stream {
        name: "balance_transactions",
        path: "/v1/balance_transactions",
        object: "balance_transaction",
        query: &[],
        changes: Changes::Created,
    },
    Stream {
        name: "invoice_line_items",
        path: "/v1/invoices",
        object: "line_item",
        query: &[],
        changes: Changes::PerInvoice,
    },
];

impl Stream {
    const fn evented(
        name: &'static str,
        path: &'static str,
        object: &'static str,
        prefix: &'static str,
        deletes: bool,
    ) -> Stream {
        Stream {
            name,
            path,
            object,
            query: &[],
            changes: Changes::Events(EventKinds {
                prefix,
                deletes,
                ignored: &[],
            }),
        }
    }

    /// The stream named `name`, if the adapter serves it.
    pub fn named(name: &str) -> Option<&'static Stream> {
        STREAMS.iter().find(|stream| stream.name == name)
    }

    /// The stream as [`crate::ProviderKind::streams`] lists it.
    pub fn spec(&self) -> StreamSpec {
        match self.changes {
            Changes::PerInvoice => StreamSpec::child(self.name, INVOICES),
            Changes::Events(_) | Changes::Created => StreamSpec::top(self.name),
        }
    }

    /// The URL of the stream's list (for `invoice_line_items`, the lines of `invoice_id`).
    pub fn list_url(&self, base: &Url, invoice_id: Option<&str>) -> Result<Url, FetchError> {
        let mut url = adapter::endpoint(base, self.path)?;
        if let Some(id) = invoice_id {
            let shown = display_url(&url);
            let Ok(mut segments) = url.path_segments_mut() else {
                return Err(FetchError::InvalidUrl {
                    url: shown,
                    message: "the URL cannot take path segments".to_string(),
                });
            };
            // `push` percent-encodes the id as one segment, `/` and `%` included.
            segments.push(id).push("lines");
        }
        url.query_pairs_mut().extend_pairs(self.query);
        Ok(url)
    }
}

/// The id of the invoice whose lines are listed: the stored payload's `id`, else its key.
/// `Err` says why neither can name the invoice in a URL path.
pub(super) fn invoice_id(parent: &ParentRecord<'_>) -> Result<String, String> {
    let from_payload = serde_json::from_str::<&RawValue>(parent.payload)
        .ok()
        .and_then(|payload| RawObject::parse(payload, &["id"])?.get("id").map(to_value));
    let id = match from_payload {
        Some(Value::String(id)) if !id.is_empty() => id,
        _ => parent.external_id.to_string(),
    };
    // A path segment of `.` or `..` would be dropped or climb a level, not name the invoice.
    if matches!(id.trim(), "" | "." | "..") {
        return Err(format!(
            "the invoice's id {} cannot name it in the path /v1/invoices/{{id}}/lines",
            quote_cursor(&id)
        ));
    }
    Ok(id)
}
