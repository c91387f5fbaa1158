//! Incremental runs by the Events API: the walk back to the oldest event, the walk forward
//! applying events oldest first, deletions, and the full pass when the cursor is too old.

use super::*;
use crate::{DeletedRecord, PageItem};

/// An event of `kind` holding `object`.
fn event(id: &str, kind: &str, created: i64, object: Value) -> Value {
    json!({
        "id": id,
        "object": "event",
        "api_version": DEFAULT_API_VERSION,
        "created": created,
        "data": {"object": object},
        "livemode": false,
        "pending_webhooks": 0,
        "type": kind,
    })
}

/// A charge at `version` (its description), created long before the events about it.
fn charge_at(id: &str, version: &str) -> Value {
    json!({"id": id, "object": "charge", "created": 1_500_000_000, "description": version})
}

/// The events query for `type` since `since`, with `limit` and a cursor.
fn events_query<'a>(
    kind: &'a str,
    since: &'a str,
    limit: &'a str,
    cursor: Option<(&'a str, &'a str)>,
) -> Vec<(&'a str, &'a str)> {
    let mut pairs = vec![("limit", limit), ("type", kind), ("created[gte]", since)];
    pairs.extend(cursor);
    pairs
}

/// Every page's items, in order.
fn all_items(pages: &[Page]) -> Vec<&PageItem> {
    pages.iter().flat_map(|page| &page.items).collect()
}

/// The payload of the last record keyed `id` among `items`: the one the pipeline keeps.
fn last_payload<'a>(items: &[&'a PageItem], id: &str) -> Option<&'a str> {
    items.iter().rev().find_map(|item| match item {
        PageItem::Record(record) if record.external_id == id => Some(record.payload.as_str()),
        _ => None,
    })
}

#[tokio::test]
async fn events_are_walked_back_then_applied_oldest_first() {
    let server = MockServer::start().await;
    let since = now() - 3_600;
    let since_text = since.to_string();
    let at = |offset: i64| since + offset;
    // Newest first, as Stripe lists them: ch_a has three versions in three events, two of
    // them in one page; a dispute event matches `charge.*` but holds no charge.
    let e6 = event("evt_6", "charge.updated", at(60), charge_at("ch_a", "v3"));
    let e5 = event("evt_5", "charge.captured", at(50), charge_at("ch_a", "v2"));
    let dispute = json!({"id": "dp_1", "object": "dispute", "charge": "ch_b", "created": at(40)});
    let e4 = event("evt_4", "charge.dispute.created", at(40), dispute);
    let e3 = event(
        "evt_3",
        "charge.refunded",
        at(30),
        charge_at("ch_b", "refunded"),
    );
    let e2 = event(
        "evt_2",
        "charge.succeeded",
        at(20),
        charge_at("ch_b", "paid"),
    );
    let e1 = event("evt_1", "charge.succeeded", at(10), charge_at("ch_a", "v1"));
    let pages_of_stripe = [
        (None, vec![e6.clone(), e5.clone()], true),
        (
            Some(("starting_after", "evt_5")),
            vec![e4.clone(), e3.clone()],
            true,
        ),
        (Some(("starting_after", "evt_3")), vec![e2, e1], false),
        // `ending_before` lists the events just newer than the cursor, newest first.
        (Some(("ending_before", "evt_2")), vec![e4, e3], true),
        (Some(("ending_before", "evt_4")), vec![e6, e5], false),
    ];
    for (page_cursor, data, has_more) in pages_of_stripe {
        get(
            "/v1/events",
            &events_query("charge.*", &since_text, "2", page_cursor),
        )
        .respond_with(answer(list(data, has_more)))
        .expect(1)
        .mount(&server)
        .await;
    }
    let provider = provider_with_limit(&server, 2);
    let cursor_mark = Watermark::Epoch(since);
    let started = now();
    let pages = walk(&provider, "charges", Some(&cursor_mark), None).await;

    let positions: Vec<Option<PagePosition>> = pages.iter().map(|page| page.next.clone()).collect();
    assert_eq!(
        positions,
        [
            cursor("events-back:evt_5"),
            cursor("events-back:evt_3"),
            cursor("events-forward:evt_2"),
            cursor("events-forward:evt_4"),
            None,
        ]
    );
    // Walking back reads no records.
    assert!(pages[0].items.is_empty() && pages[1].items.is_empty());
    let items = all_items(&pages);
    assert_eq!(
        ids(&items.iter().map(|item| (*item).clone()).collect::<Vec<_>>()),
        ["ch_a", "ch_b", "ch_b", "ch_a", "ch_a"]
    );
    assert!(last_payload(&items, "ch_a").is_some_and(|payload| payload.contains("\"v3\"")));
    assert!(last_payload(&items, "ch_b").is_some_and(|payload| payload.contains("refunded")));
    // The forward pages' watermarks are their newest events; the first page's is the
    // request time less the lag margin, the newest events being older.
    let watermarks: Vec<Option<Watermark>> =
        pages.iter().map(|page| page.watermark.clone()).collect();
    assert_eq!(
        watermarks[1..],
        [
            None,
            Some(Watermark::Epoch(at(20))),
            Some(Watermark::Epoch(at(40))),
            Some(Watermark::Epoch(at(60))),
        ]
    );
    let Some(Watermark::Epoch(first)) = watermarks[0] else {
        panic!("the first page has no epoch watermark");
    };
    assert!((started - 300..=now() - 300).contains(&first), "{first}");
    assert!(queries(&server, "/v1/charges").await.is_empty());
}

#[tokio::test]
async fn an_update_to_an_old_charge_arrives_as_its_new_payload() {
    let server = MockServer::start().await;
    let since = now() - 600;
    let old = charge_at("ch_2017", "disputed, then won");
    let updated = event("evt_1", "charge.updated", now() - 60, old.clone());
    get(
        "/v1/events",
        &events_query("charge.*", &since.to_string(), "100", None),
    )
    .respond_with(answer(list(vec![updated], false)))
    .expect(1)
    .mount(&server)
    .await;
    let cursor_mark = Watermark::Epoch(since);
    let pages = walk(&provider(&server), "charges", Some(&cursor_mark), None).await;
    assert_eq!(pages.len(), 1);
    let [PageItem::Record(record)] = pages[0].items.as_slice() else {
        panic!("expected one record, got {:?}", pages[0].items);
    };
    assert_eq!(record.external_id, "ch_2017");
    // The object's text exactly as the event carried it.
    assert_eq!(record.payload, serde_json::to_string(&old).unwrap());
}

#[tokio::test]
async fn deletion_events_become_deleted_items_where_stripe_really_deletes() {
    let server = MockServer::start().await;
    let since = now() - 600;
    let since_text = since.to_string();
    let customer = json!({"id": "cus_1", "object": "customer", "deleted": true});
    let discount = json!({"id": "di_1", "object": "discount", "customer": "cus_2"});
    let broken =
        json!({"id": "evt_0", "object": "event", "type": "customer.updated", "created": since});
    let customer_events = vec![
        event("evt_3", "customer.deleted", since + 30, customer.clone()),
        // The deletion of a customer's discount, not of a customer.
        event("evt_2", "customer.discount.deleted", since + 20, discount),
        event(
            "evt_1",
            "customer.updated",
            since + 10,
            json!({"id": "cus_2", "object": "customer"}),
        ),
        broken.clone(),
    ];
    get(
        "/v1/events",
        &events_query("customer.*", &since_text, "100", None),
    )
    .respond_with(answer(list(customer_events, false)))
    .expect(1)
    .mount(&server)
    .await;
    let canceled = json!({"id": "sub_1", "object": "subscription", "status": "canceled"});
    get(
        "/v1/events",
        &events_query("customer.subscription.*", &since_text, "100", None),
    )
    .respond_with(answer(list(
        vec![event(
            "evt_9",
            "customer.subscription.deleted",
            since + 5,
            canceled,
        )],
        false,
    )))
    .expect(1)
    .mount(&server)
    .await;
    let upcoming = json!({"object": "invoice", "status": "draft"});
    let draft = json!({"id": "in_1", "object": "invoice", "status": "draft"});
    get(
        "/v1/events",
        &events_query("invoice.*", &since_text, "100", None),
    )
    .respond_with(answer(list(
        vec![
            event("evt_8", "invoice.deleted", since + 8, draft.clone()),
            event("evt_7", "invoice.upcoming", since + 7, upcoming),
        ],
        false,
    )))
    .expect(1)
    .mount(&server)
    .await;
    let provider = provider(&server);
    let cursor_mark = Watermark::Epoch(since);

    let pages = walk(&provider, "customers", Some(&cursor_mark), None).await;
    let items = &pages[0].items;
    assert_eq!(ids(items)[1..], ["cus_2", "-cus_1"]);
    let PageItem::Rejected(rejected) = &items[0] else {
        panic!(
            "expected the event without an object set aside, got {:?}",
            items[0]
        );
    };
    assert_eq!(&*rejected.message, "event \"evt_0\" has no `data.object`");
    assert_eq!(rejected.payload, serde_json::to_string(&broken).unwrap());
    let PageItem::Deleted(deleted) = &items[2] else {
        panic!("expected a deletion, got {:?}", items[2]);
    };
    let expected = DeletedRecord {
        external_id: "cus_1".into(),
        payload: serde_json::to_string(&customer).unwrap(),
    };
    assert_eq!(deleted, &expected);

    // A subscription's `deleted` event is its cancellation: it is still there.
    let pages = walk(&provider, "subscriptions", Some(&cursor_mark), None).await;
    let [PageItem::Record(record)] = pages[0].items.as_slice() else {
        panic!(
            "expected the canceled subscription, got {:?}",
            pages[0].items
        );
    };
    assert!(record.external_id == "sub_1" && record.payload.contains("canceled"));

    // A deleted draft invoice goes; an upcoming invoice does not exist yet.
    let pages = walk(&provider, "invoices", Some(&cursor_mark), None).await;
    assert_eq!(ids(&pages[0].items), ["-in_1"]);
}

#[tokio::test]
async fn a_cursor_older_than_the_events_stripe_keeps_makes_a_full_pass() {
    let server = MockServer::start().await;
    Mock::given(path("/v1/events"))
        .respond_with(answer(list(vec![], false)))
        .expect(0)
        .mount(&server)
        .await;
    get("/v1/products", &[("limit", "100")])
        .respond_with(answer(list(
            vec![json!({"id": "prod_1", "object": "product", "created": 1_600_000_000})],
            false,
        )))
        .expect(1)
        .mount(&server)
        .await;
    // Within Stripe's 30 days, but not by the margin a walk needs.
    let since = Watermark::Epoch(now() - 29 * 24 * 3_600);
    let before = now();
    let pages = walk(&provider(&server), "products", Some(&since), None).await;
    assert_eq!(ids(&pages[0].items), ["prod_1"]);
    let Some(Watermark::Epoch(first)) = pages[0].watermark else {
        panic!("the full pass's first page has no epoch watermark");
    };
    assert!((before..=now()).contains(&first), "{first}");
    assert_eq!(queries(&server, "/v1/products").await, ["limit=100"]);
}

#[tokio::test]
async fn a_walk_without_events_keeps_a_quiet_accounts_cursor_fresh() {
    let server = MockServer::start().await;
    let long_ago = now() - 7 * 24 * 3_600;
    let just_now = now() - 10;
    for since in [long_ago, just_now] {
        get(
            "/v1/events",
            &events_query("price.*", &since.to_string(), "100", None),
        )
        .respond_with(answer(list(vec![], false)))
        .expect(1)
        .mount(&server)
        .await;
    }
    let provider = provider(&server);
    let started = now();
    let quiet = Watermark::Epoch(long_ago);
    let page = fetch_stream(&provider, "prices", Some(&quiet), None, None)
        .await
        .unwrap();
    assert!(page.items.is_empty() && page.next.is_none());
    let Some(Watermark::Epoch(mark)) = page.watermark else {
        panic!("the first page has no epoch watermark");
    };
    assert!((started - 300..=now() - 300).contains(&mark), "{mark}");
    // Never below the cursor.
    let recent = Watermark::Epoch(just_now);
    let page = fetch_stream(&provider, "prices", Some(&recent), None, None)
        .await
        .unwrap();
    assert_eq!(page.watermark, Some(recent));
}

#[tokio::test]
async fn a_walk_resumes_at_the_position_its_last_committed_page_handed_on() {
    let server = MockServer::start().await;
    let since = now() - 600;
    let since_text = since.to_string();
    let refund = json!({"id": "re_1", "object": "refund", "status": "succeeded"});
    get(
        "/v1/events",
        &events_query(
            "refund.*",
            &since_text,
            "100",
            Some(("starting_after", "evt_7")),
        ),
    )
    .respond_with(answer(list(
        vec![event("evt_6", "refund.updated", since + 6, refund)],
        false,
    )))
    .expect(1)
    .mount(&server)
    .await;
    get(
        "/v1/events",
        &events_query(
            "refund.*",
            &since_text,
            "100",
            Some(("ending_before", "evt_6")),
        ),
    )
    .respond_with(answer(list(vec![], false)))
    .expect(1)
    .mount(&server)
    .await;
    // A provider built after the crash, given the checkpoint's position and the same cursor.
    let provider = provider(&server);
    let cursor_mark = Watermark::Epoch(since);
    let resumed = fetch_stream(
        &provider,
        "refunds",
        Some(&cursor_mark),
        None,
        cursor("events-back:evt_7").as_ref(),
    )
    .await
    .unwrap();
    assert_eq!(ids(&resumed.items), ["re_1"]);
    assert_eq!(resumed.next, cursor("events-forward:evt_6"));
    let last = fetch_stream(
        &provider,
        "refunds",
        Some(&cursor_mark),
        None,
        resumed.next.as_ref(),
    )
    .await
    .unwrap();
    assert!(last.items.is_empty() && last.next.is_none());
}

#[tokio::test]
async fn an_empty_page_after_has_more_is_a_shape_error() {
    let server = MockServer::start().await;
    let since = now() - 600;
    get(
        "/v1/events",
        &events_query(
            "payment_intent.*",
            &since.to_string(),
            "100",
            Some(("starting_after", "evt_1")),
        ),
    )
    .respond_with(answer(list(vec![], false)))
    .expect(1)
    .mount(&server)
    .await;
    let cursor_mark = Watermark::Epoch(since);
    let error = fetch_stream(
        &provider(&server),
        "payment_intents",
        Some(&cursor_mark),
        None,
        cursor("events-back:evt_1").as_ref(),
    )
    .await
    .unwrap_err();
    assert!(matches!(error, FetchError::Shape { .. }), "{error:?}");
    assert!(
        error
            .to_string()
            .contains("no events are older than \"evt_1\""),
        "{error}"
    );
}
