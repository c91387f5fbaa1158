//! Each stream's own list: endpoints, parameters, paging, line items per invoice, and the
//! positions and streams the adapter refuses.

use super::*;
use crate::kind::ProviderKind;
use crate::{PageItem, StreamSpec};

/// Query parameters as name and value.
type Query = &'static [(&'static str, &'static str)];

/// The top-level streams: name, list path, `object`, the query every page sends besides
/// `limit` and the cursor.
const TOP_STREAMS: &[(&str, &str, &str, Query)] = &[
    ("charges", "/v1/charges", "charge", &[]),
    ("customers", "/v1/customers", "customer", &[]),
    ("invoices", "/v1/invoices", "invoice", &[]),
    (
        "subscriptions",
        "/v1/subscriptions",
        "subscription",
        &[("status", "all")],
    ),
    (
        "payment_intents",
        "/v1/payment_intents",
        "payment_intent",
        &[],
    ),
    ("refunds", "/v1/refunds", "refund", &[]),
    ("products", "/v1/products", "product", &[]),
    ("prices", "/v1/prices", "price", &[]),
    (
        "balance_transactions",
        "/v1/balance_transactions",
        "balance_transaction",
        &[],
    ),
];

fn object(kind: &str, id: &str, created: i64) -> Value {
    json!({"id": id, "object": kind, "created": created, "livemode": false})
}

/// `extra` with `limit` and, when given, `cursor_name` = `cursor_value`.
fn query<'a>(
    extra: &[(&'a str, &'a str)],
    limit: &'a str,
    cursor: Option<(&'a str, &'a str)>,
) -> Vec<(&'a str, &'a str)> {
    let mut pairs = extra.to_vec();
    pairs.push(("limit", limit));
    pairs.extend(cursor);
    pairs
}

#[test]
fn the_streams_are_listed_charges_first_and_line_items_under_invoices() {
    let streams = StripeConfig::default().streams();
    let mut expected: Vec<StreamSpec> = TOP_STREAMS
        .iter()
        .map(|(name, ..)| StreamSpec::top(name))
        .collect();
    expected.push(StreamSpec::child("invoice_line_items", "invoices"));
    assert_eq!(streams, expected);
}

#[tokio::test]
async fn every_stream_is_listed_page_by_page_after_the_last_id() {
    let server = MockServer::start().await;
    let provider = provider_with_limit(&server, 2);
    for (stream, list_path, kind, extra) in TOP_STREAMS {
        let [newest, middle, oldest] = [3, 2, 1].map(|n| format!("{kind}_{n}"));
        get(list_path, &query(extra, "2", None))
            .respond_with(answer(list(
                vec![
                    object(kind, &newest, 1_700_000_300),
                    object(kind, &middle, 1_700_000_200),
                ],
                true,
            )))
            .expect(1)
            .mount(&server)
            .await;
        get(
            list_path,
            &query(extra, "2", Some(("starting_after", &middle))),
        )
        .respond_with(answer(list(
            vec![object(kind, &oldest, 1_700_000_100)],
            false,
        )))
        .expect(1)
        .mount(&server)
        .await;
        let started = now();
        let pages = walk(&provider, stream, None, None).await;
        assert_eq!(pages.len(), 2, "{stream}");
        assert_eq!(
            ids(&pages[0].items),
            [newest.as_str(), middle.as_str()],
            "{stream}"
        );
        assert_eq!(pages[0].next, cursor(&format!("list:{middle}")), "{stream}");
        assert_eq!(ids(&pages[1].items), [oldest.as_str()], "{stream}");
        let Some(Watermark::Epoch(first)) = pages[0].watermark else {
            panic!("{stream}: the first page has no epoch watermark");
        };
        if *stream == "balance_transactions" {
            // Read by `created[gte]` next time: the newest `created` seen.
            assert_eq!(first, 1_700_000_300);
            assert_eq!(pages[1].watermark, Some(Watermark::Epoch(1_700_000_100)));
        } else {
            // Read by events next time: those after the pass began.
            assert!((started..=now()).contains(&first), "{stream}: {first}");
            assert_eq!(pages[1].watermark, None, "{stream}");
        }
    }
    assert!(queries(&server, "/v1/events").await.is_empty());
}

#[tokio::test]
async fn subscriptions_are_asked_for_in_every_status() {
    let server = MockServer::start().await;
    get("/v1/subscriptions", &[("limit", "100"), ("status", "all")])
        .respond_with(answer(list(
            vec![object("subscription", "sub_canceled", 1_700_000_000)],
            false,
        )))
        .expect(1)
        .mount(&server)
        .await;
    let pages = walk(&provider(&server), "subscriptions", None, None).await;
    assert_eq!(ids(&pages[0].items), ["sub_canceled"]);
    assert_eq!(
        queries(&server, "/v1/subscriptions").await,
        ["limit=100&status=all"]
    );
}

#[tokio::test]
async fn line_items_are_listed_per_invoice_with_its_id_percent_encoded() {
    let server = MockServer::start().await;
    let lines_path = "/v1/invoices/in_a%2Fb%20c%25/lines";
    get(lines_path, &[("limit", "2")])
        .respond_with(answer(list(
            vec![
                object("line_item", "il_1", 1),
                object("line_item", "il_2", 2),
            ],
            true,
        )))
        .expect(1)
        .mount(&server)
        .await;
    get(lines_path, &[("limit", "2"), ("starting_after", "il_2")])
        .respond_with(answer(list(vec![object("line_item", "il_3", 3)], false)))
        .expect(1)
        .mount(&server)
        .await;
    let provider = provider_with_limit(&server, 2);
    let invoice = ParentRecord {
        external_id: "ignored_when_the_payload_has_an_id",
        payload: r#"{"id":"in_a/b c%","object":"invoice"}"#,
    };
    // A cursor of the parent stream's is no reason to skip any line.
    let since = Watermark::Epoch(now() - 60);
    let pages = walk(&provider, "invoice_line_items", Some(&since), Some(invoice)).await;
    let all: Vec<String> = pages.iter().flat_map(|page| ids(&page.items)).collect();
    assert_eq!(all, ["il_1", "il_2", "il_3"]);
    assert_eq!(pages[0].next, cursor("list:il_2"));
    assert!(pages.iter().all(|page| page.watermark.is_none()));

    // Without an `id` in the payload, the invoice's key names it.
    get("/v1/invoices/in_key/lines", &[("limit", "2")])
        .respond_with(answer(list(vec![object("line_item", "il_9", 9)], false)))
        .expect(1)
        .mount(&server)
        .await;
    let keyed = ParentRecord {
        external_id: "in_key",
        payload: r#"{"object":"invoice"}"#,
    };
    let pages = walk(&provider, "invoice_line_items", None, Some(keyed)).await;
    assert_eq!(ids(&pages[0].items), ["il_9"]);
}

#[tokio::test]
async fn an_invoice_stripe_no_longer_has_is_reported_gone() {
    let server = MockServer::start().await;
    get("/v1/invoices/in_deleted/lines", &[("limit", "100")])
        .respond_with(ResponseTemplate::new(404).set_body_json(stripe_error(
            "invalid_request_error",
            Some("resource_missing"),
            &format!("No such invoice: 'in_deleted' (key {KEY})"),
        )))
        .expect(1)
        .mount(&server)
        .await;
    let provider = provider(&server);
    let deleted = ParentRecord {
        external_id: "in_deleted",
        payload: r#"{"id":"in_deleted"}"#,
    };
    let page = fetch_stream(&provider, "invoice_line_items", None, Some(deleted), None)
        .await
        .unwrap();
    assert!(page.items.is_empty() && page.next.is_none());
    let reason = page.parent_gone.unwrap_or_default();
    assert!(
        reason.contains("Stripe has no invoice \"in_deleted\"")
            && reason.contains("No such invoice")
            && !reason.contains(KEY),
        "{reason}"
    );

    // An id that cannot name a path segment is refused without a request.
    let dots = ParentRecord {
        external_id: "..",
        payload: r#"{"id":".."}"#,
    };
    let page = fetch_stream(&provider, "invoice_line_items", None, Some(dots), None)
        .await
        .unwrap();
    assert!(page.parent_gone.unwrap_or_default().contains("\"..\""));
    let error = fetch_stream(&provider, "invoice_line_items", None, None, None)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("listed per invoice"), "{error}");
}

#[tokio::test]
async fn balance_transactions_are_read_by_created_gte_on_every_page() {
    let server = MockServer::start().await;
    let since = Watermark::Epoch(1_700_000_200);
    let path_text = "/v1/balance_transactions";
    let kind = "balance_transaction";
    get(path_text, &[("limit", "1"), ("created[gte]", "1700000200")])
        .respond_with(answer(list(
            vec![object(kind, "txn_2", 1_700_000_900)],
            true,
        )))
        .expect(1)
        .mount(&server)
        .await;
    get(
        path_text,
        &[
            ("limit", "1"),
            ("created[gte]", "1700000200"),
            ("starting_after", "txn_2"),
        ],
    )
    .respond_with(answer(list(
        vec![object(kind, "txn_1", 1_700_000_200)],
        false,
    )))
    .expect(1)
    .mount(&server)
    .await;
    let provider = provider_with_limit(&server, 1);
    let pages = walk(&provider, "balance_transactions", Some(&since), None).await;
    let all: Vec<String> = pages.iter().flat_map(|page| ids(&page.items)).collect();
    assert_eq!(all, ["txn_2", "txn_1"]);
    assert_eq!(pages[0].watermark, Some(Watermark::Epoch(1_700_000_900)));
    assert!(queries(&server, "/v1/events").await.is_empty());
}

#[tokio::test]
async fn the_first_page_of_a_full_pass_carries_the_time_of_the_request() {
    let server = MockServer::start().await;
    // Old charges: their `created` says nothing of what changed since.
    get("/v1/charges", &[("limit", "100")])
        .respond_with(answer(list(vec![charge("ch_old", 1_500_000_000)], true)))
        .mount(&server)
        .await;
    get(
        "/v1/charges",
        &[("limit", "100"), ("starting_after", "ch_old")],
    )
    .respond_with(answer(list(vec![charge("ch_older", 1_400_000_000)], false)))
    .mount(&server)
    .await;
    let before = now();
    let pages = walk(&provider(&server), "charges", None, None).await;
    let after = now();
    let Some(Watermark::Epoch(first)) = pages[0].watermark else {
        panic!("the first page has no epoch watermark: {:?}", pages[0]);
    };
    assert!((before..=after).contains(&first), "{first}");
    assert_eq!(pages[1].watermark, None);
    assert_eq!(ids(&pages[1].items), ["ch_older"]);
}

#[tokio::test]
async fn an_unknown_stream_is_refused_without_a_request() {
    let server = MockServer::start().await;
    let error = fetch_stream(&provider(&server), "disputes", None, None, None)
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "could not build the HTTP client: stripe has no stream \"disputes\""
    );
    assert!(server
        .received_requests()
        .await
        .unwrap_or_default()
        .is_empty());
}

#[tokio::test]
async fn malformed_or_misplaced_positions_are_clear_errors() {
    let server = MockServer::start().await;
    let provider = provider(&server);
    let since = Watermark::Epoch(now() - 60);
    let cases: &[(&str, Option<&Watermark>, PagePosition, &str)] = &[
        (
            "charges",
            None,
            PagePosition::Cursor {
                cursor: "sideways:evt_1".into(),
            },
            "it names no walk the adapter knows",
        ),
        (
            "charges",
            Some(&since),
            PagePosition::Cursor {
                cursor: "events-back:".into(),
            },
            "its id is empty or not visible ASCII",
        ),
        (
            "charges",
            None,
            PagePosition::Cursor {
                cursor: "list:ch 1".into(),
            },
            "its id is empty or not visible ASCII",
        ),
        (
            "charges",
            None,
            PagePosition::Cursor {
                cursor: "events-forward:evt_1".into(),
            },
            "an events walk starts from the stream's cursor, and this run has none",
        ),
        (
            "balance_transactions",
            Some(&since),
            PagePosition::Cursor {
                cursor: "events-back:evt_1".into(),
            },
            "the balance_transactions stream does not walk Stripe's events",
        ),
        (
            "charges",
            None,
            PagePosition::Page { page: 2 },
            "the stripe provider pages by cursor",
        ),
    ];
    for (stream, since, position, expected) in cases {
        let error = fetch_stream(&provider, stream, *since, None, Some(position))
            .await
            .unwrap_err();
        assert!(
            matches!(error, FetchError::PositionMismatch { .. }),
            "{position:?}: {error:?}"
        );
        assert!(error.to_string().contains(expected), "{error}");
    }
    assert!(server
        .received_requests()
        .await
        .unwrap_or_default()
        .is_empty());
}

#[tokio::test]
async fn a_bare_id_from_a_checkpoint_before_streams_continues_the_list() {
    let server = MockServer::start().await;
    get(
        "/v1/charges",
        &[("limit", "100"), ("starting_after", "ch_2")],
    )
    .respond_with(answer(list(vec![charge("ch_1", 1)], false)))
    .expect(1)
    .mount(&server)
    .await;
    let page = fetch(&provider(&server), cursor("ch_2").as_ref())
        .await
        .unwrap();
    assert_eq!(ids(&page.items), ["ch_1"]);
    assert!(matches!(&page.items[0], PageItem::Record(_)));
}

#[test]
fn positions_read_back_as_they_were_written() {
    use crate::stripe::position::{StripePosition, WalkPosition};
    let positions = [
        StripePosition::List {
            after: "ch_1".into(),
        },
        StripePosition::Events(WalkPosition::Back {
            after: "evt_1".into(),
        }),
        StripePosition::Events(WalkPosition::Forward {
            before: "evt_2".into(),
        }),
    ];
    for position in positions {
        let written = position.clone().into_page_position();
        assert_eq!(StripePosition::parse(&written).unwrap(), position);
    }
}
