//! Which id and event type a verified delivery is kept under, per scheme.

use std::time::Duration;

use serde_json::json;

use super::{account_ids, delivery_id, event_type, Headers, WebhookError};
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

/// `scheme`'s settings, with `account_pointer`.
fn settings(
    scheme: WebhookScheme,
    account_pointer: Option<&str>,
) -> crate::config::WebhookSettings {
    crate::config::WebhookSettings {
        scheme,
        secret_env: Vec::new(),
        secret: Vec::new(),
        max_body_bytes: 1024 * 1024,
        rate_limit: crate::config::BudgetWindow {
            requests: 100,
            per: Duration::from_secs(1),
        },
        account_pointer: account_pointer.map(str::to_string),
    }
}

#[test]
fn each_scheme_names_the_accounts_its_deliveries_route_to() {
    let none = headers(&[]);
    let ids = |scheme: WebhookScheme, pointer: Option<&str>, headers: &Headers, body| {
        account_ids(&settings(scheme, pointer), headers, &body)
    };
    let github = json!({"installation": {"id": 7}, "repository": {"owner": {"id": 42}}, "sender": {"id": 42}});
    assert_eq!(
        ids(WebhookScheme::Github, None, &none, github).as_deref(),
        Some("7 42")
    );
    let sender = json!({"sender": {"id": 9}});
    assert_eq!(
        ids(WebhookScheme::Github, None, &none, sender).as_deref(),
        Some("9")
    );
    let connect = json!({"id": "evt_1", "account": "acct_1"});
    assert_eq!(
        ids(WebhookScheme::Stripe, None, &none, connect).as_deref(),
        Some("acct_1")
    );
    // A platform's own event: for the connections without an account id.
    let long = json!({"id": "evt_3", "account": "a".repeat(300)});
    assert_eq!(
        ids(WebhookScheme::Stripe, None, &none, long),
        None,
        "longer than the column"
    );
    let own = json!({"id": "evt_2"});
    assert_eq!(
        ids(WebhookScheme::Stripe, None, &none, own).as_deref(),
        Some("")
    );
    let strava = WebhookScheme::Strava { subscription_id: 1 };
    assert_eq!(
        ids(strava, None, &none, json!({"owner_id": 134815})).as_deref(),
        Some("134815")
    );
    let shop = headers(&[("X-Shopify-Shop-Domain", "Shop.myshopify.com")]);
    assert_eq!(
        ids(WebhookScheme::Shopify, None, &shop, json!({})).as_deref(),
        Some("shop.myshopify.com")
    );
    let gitlab = json!({"project": {"id": 15}, "user_id": 4});
    assert_eq!(
        ids(WebhookScheme::Gitlab, None, &none, gitlab).as_deref(),
        Some("15 4")
    );
    let custom = json!({"data": {"tenant": "t 1"}, "account": "a1"});
    assert_eq!(
        ids(
            WebhookScheme::Standard,
            Some("/account"),
            &none,
            custom.clone()
        )
        .as_deref(),
        Some("a1")
    );
    assert_eq!(
        ids(hmac(None), Some("/data/tenant"), &none, custom.clone()),
        None,
        "no spaces in an id"
    );
    assert_eq!(ids(WebhookScheme::Standard, None, &none, custom), None);
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

/// A GitLab delivery of `bytes` bytes (its token is compared, not computed, so the test
/// needs no HMAC of its own).
fn gitlab_delivery(bytes: usize) -> (Headers, bytes::Bytes) {
    let body = json!({"object_kind": "issue", "padding": "x".repeat(bytes)}).to_string();
    let headers = headers(&[
        ("X-Gitlab-Token", "token"),
        ("X-Gitlab-Event-UUID", &format!("uuid-{bytes}")),
    ]);
    (headers, bytes::Bytes::from(body))
}

#[test]
fn a_large_body_is_checked_on_the_blocking_pool_and_a_small_one_inline() {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use super::{checked, Inbound};

    // One blocking thread, held below: a body checked on the pool waits for it.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let secrets = Arc::new(BTreeMap::from([(
            "lab".to_string(),
            vec![secrecy::SecretString::from("token")],
        )]));
        let check = |(headers, body): (Headers, bytes::Bytes)| {
            let secrets = Arc::clone(&secrets);
            async move {
                let inbound = Inbound {
                    provider: "lab",
                    headers: &headers,
                    body: &body,
                };
                let webhooks = settings(WebhookScheme::Gitlab, None);
                checked(&webhooks, &secrets, &inbound, chrono::Utc::now())
                    .await
                    .map(|checked| checked.delivery_id)
                    .map_err(|error| error.to_string())
            }
        };
        let (held_tx, held_rx) = tokio::sync::oneshot::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let hold = tokio::task::spawn_blocking(move || {
            let _ = held_tx.send(());
            let _ = release_rx.recv();
        });
        held_rx.await.expect("the pool's thread is held");

        let small = tokio::time::timeout(Duration::from_secs(10), check(gitlab_delivery(1024)))
            .await
            .expect("a small body is checked without the blocking pool");
        assert_eq!(small, Ok("uuid-1024".to_string()));
        let large = tokio::spawn(check(gitlab_delivery(64 * 1024)));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !large.is_finished(),
            "a large body waits for the blocking pool"
        );
        release_tx.send(()).expect("released");
        hold.await.expect("the hold ends");
        let large = tokio::time::timeout(Duration::from_secs(10), large)
            .await
            .expect("checked once the pool is free")
            .expect("no panic");
        assert_eq!(large, Ok("uuid-65536".to_string()));
    });
}

/// A failed delivery replayed is applied by the next processing, once: a second replay
/// of it, or of every failed one, puts nothing back.
#[tokio::test]
async fn a_replayed_failed_delivery_is_applied_once_and_replaying_again_does_nothing() {
    use sea_orm::{ActiveModelTrait, ActiveValue::Set, EntityTrait};

    use super::{replay, ReplayWhich};
    use crate::entities::record;
    use crate::entities::webhook_delivery::{self, InboxStatus};
    use crate::ops::OpsError;
    use crate::testing::TestDb;

    let test = TestDb::new().await;
    let settings = test.settings(
        "\n[api]\nlisten = \"127.0.0.1:0\"\n[providers.acme]\nkind = \"stripe\"\n\
         schedule = \"0 0 0 1 1 *\"\nstreams = [\"charges\", \"customers\"]\n\
         [providers.acme.webhooks]\nsecret_env = \"HOOK\"\n",
    );
    test.alice().await;
    let now = crate::db::now();
    let body = r#"{"id":"evt_1","type":"customer.created","created":100,"data":{"object":{"id":"cus_1","object":"customer"}}}"#;
    let failed = webhook_delivery::ActiveModel {
        provider: Set("acme".to_string()),
        delivery_id: Set("evt_1".to_string()),
        event_type: Set(Some("customer.created".to_string())),
        received_at: Set(now),
        body: Set(body.to_string()),
        status: Set(InboxStatus::Failed),
        attempts: Set(5),
        next_attempt_at: Set(now),
        error: Set(Some("the database went away".to_string())),
        account_ids: Set(Some(String::new())),
        ..Default::default()
    }
    .insert(test.main())
    .await
    .expect("failed delivery");

    let replayed = replay(test.main(), ReplayWhich::One(failed.id), now)
        .await
        .expect("replayed");
    assert_eq!(replayed.requeued, [failed.id]);
    let row = webhook_delivery::Entity::find_by_id(failed.id)
        .one(test.main())
        .await
        .expect("row")
        .expect("kept");
    assert_eq!(
        (row.status, row.attempts, row.error),
        (InboxStatus::Received, 0, None)
    );
    let processed = crate::jobs::process_due(&test.db, &settings, now)
        .await
        .expect("processed");
    assert_eq!(processed.applied, 1);
    let records = record::Entity::find()
        .all(test.main())
        .await
        .expect("records");
    assert_eq!(records.len(), 1);

    let again = replay(test.main(), ReplayWhich::One(failed.id), now)
        .await
        .expect("replayed");
    assert!(again.requeued.is_empty() && again.not_failed == [failed.id]);
    let all = replay(test.main(), ReplayWhich::AllFailed, now)
        .await
        .expect("replayed");
    assert!(all.requeued.is_empty() && all.not_failed.is_empty());
    let missing = replay(test.main(), ReplayWhich::One(failed.id + 100), now).await;
    assert!(
        matches!(missing, Err(OpsError::NotFound { .. })),
        "{missing:?}"
    );
}
