//! Deliveries that carry their object whole, on the three databases: stored through the
//! pipeline by version, whatever order and however often they arrive, deletions marked
//! and in the feed, nothing for a disabled connection, and two instances sharing the
//! inbox applying each delivery once.

use sea_orm::{ActiveModelTrait, EntityTrait, IntoActiveModel, QueryOrder};
use serde_json::json;

use super::*;
use crate::entities::{change, record, sync_run};
use crate::pipeline::{Run, Trigger};

/// `acme`, a Stripe provider with its charges and customers, receiving webhooks.
const STRIPE: &str = "\n[api]\nlisten = \"127.0.0.1:0\"\n[providers.acme]\nkind = \"stripe\"\n\
    schedule = \"0 0 0 1 1 *\"\nstreams = [\"charges\", \"customers\"]\n\
    [providers.acme.webhooks]\nsecret_env = \"HOOK\"\n";

/// `acme`, a GitHub provider, receiving webhooks.
const GITHUB: &str = "\n[api]\nlisten = \"127.0.0.1:0\"\n[providers.acme]\nkind = \"github\"\n\
    schedule = \"0 0 0 1 1 *\"\n[providers.acme.webhooks]\nsecret_env = \"HOOK\"\n";

/// A Stripe event of `kind` at `created` about `object`, received now as the platform's
/// own (routed to connections without an account id).
async fn stripe_event(test: &TestDb, id: &str, kind: &str, created: i64, object: &str) {
    let body = format!(
        r#"{{"id":"{id}","object":"event","type":"{kind}","created":{created},"data":{{"object":{object}}}}}"#
    );
    deliver(test, id, kind, &body, "").await;
}

async fn deliver(test: &TestDb, id: &str, event_type: &str, body: &str, accounts: &str) {
    let now = crate::db::now();
    webhook_delivery::ActiveModel {
        provider: Set("acme".to_string()),
        delivery_id: Set(id.to_string()),
        event_type: Set(Some(event_type.to_string())),
        received_at: Set(now),
        body: Set(body.to_string()),
        status: Set(InboxStatus::Received),
        attempts: Set(0),
        next_attempt_at: Set(now),
        account_ids: Set(Some(accounts.to_string())),
        ..Default::default()
    }
    .insert(test.main())
    .await
    .expect("delivery");
}

/// Alice's connection with `account` as its account id, enabled or not.
async fn alice_as(test: &TestDb, account: Option<&str>, enabled: bool) {
    let mut alice = test.alice().await.into_active_model();
    alice.account_id = Set(account.map(str::to_string));
    alice.enabled = Set(enabled);
    alice.update(test.main()).await.expect("alice");
}

fn customer(name: &str) -> String {
    format!(r#"{{"id":"cus_1","object":"customer","name":"{name}"}}"#)
}

fn charge(id: &str, refunded: bool) -> String {
    format!(r#"{{"id":"{id}","object":"charge","status":"succeeded","refunded":{refunded}}}"#)
}

async fn process(db: &DatabasePools, settings: &Settings) -> Processed {
    process_due(db, settings, crate::db::now())
        .await
        .expect("processed")
}

async fn records(test: &TestDb) -> Vec<record::Model> {
    record::Entity::find()
        .order_by_asc(record::Column::Id)
        .all(test.main())
        .await
        .expect("records")
}

/// The change feed's (external id, kind) in order.
async fn changes(test: &TestDb) -> Vec<(String, String)> {
    change::Entity::find()
        .order_by_asc(change::Column::BatchId)
        .order_by_asc(change::Column::Ordinal)
        .all(test.main())
        .await
        .expect("changes")
        .into_iter()
        .map(|change| (change.external_id, change.kind.to_string()))
        .collect()
}

async fn deliveries(test: &TestDb) -> Vec<webhook_delivery::Model> {
    webhook_delivery::Entity::find()
        .order_by_asc(webhook_delivery::Column::Id)
        .all(test.main())
        .await
        .expect("deliveries")
}

async fn webhook_runs(test: &TestDb) -> Vec<sync_run::Model> {
    sync_run::Entity::find()
        .filter(sync_run::Column::Trigger.eq(Trigger::Webhook))
        .all(test.main())
        .await
        .expect("runs")
}

/// The feed's entries `expected` as [`changes`] reads them.
fn feed(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected
        .iter()
        .map(|(id, kind)| (id.to_string(), kind.to_string()))
        .collect()
}

fn names(records: &[record::Model]) -> Vec<(String, String)> {
    records
        .iter()
        .map(|record| {
            let payload: serde_json::Value = serde_json::from_str(&record.payload).expect("JSON");
            let name = payload["name"].as_str().unwrap_or_default().to_string();
            (record.external_id.clone(), name)
        })
        .collect()
}

#[tokio::test]
async fn out_of_order_and_repeated_deliveries_of_one_object_end_with_the_newest_stored_once() {
    let test = TestDb::new().await;
    let settings = test.settings(STRIPE);
    test.alice().await;
    stripe_event(&test, "evt_3", "customer.updated", 300, &customer("third")).await;
    stripe_event(&test, "evt_1", "customer.created", 100, &customer("first")).await;
    // The provider sending the newest again under another event id, then one between.
    stripe_event(&test, "evt_3b", "customer.updated", 300, &customer("third")).await;
    stripe_event(&test, "evt_2", "customer.updated", 200, &customer("second")).await;

    let processed = process(&test.db, &settings).await;

    assert_eq!((processed.applied, processed.jobs_queued), (4, 0));
    let stored = records(&test).await;
    assert_eq!(names(&stored), [("cus_1".to_string(), "third".to_string())]);
    assert_eq!(
        stored[0].source_version.as_deref(),
        Some("00000000000000000300.0")
    );
    assert_eq!(changes(&test).await, feed(&[("cus_1", "inserted")]));
    assert!(deliveries(&test)
        .await
        .iter()
        .all(|d| d.status == InboxStatus::Applied && d.attempts == 1 && d.job_id.is_none()));
    let runs = webhook_runs(&test).await;
    assert_eq!(runs.len(), 4, "a run a delivery");
    assert_eq!(runs.iter().map(|run| run.records_inserted).sum::<i64>(), 1);
    assert_eq!(runs.iter().map(|run| run.records_unchanged).sum::<i64>(), 3);
}

#[tokio::test]
async fn a_refund_then_an_older_success_leaves_the_charge_refunded() {
    let test = TestDb::new().await;
    let settings = test.settings(STRIPE);
    test.alice().await;
    stripe_event(
        &test,
        "evt_r",
        "charge.refunded",
        200,
        &charge("ch_1", true),
    )
    .await;
    stripe_event(
        &test,
        "evt_s",
        "charge.succeeded",
        100,
        &charge("ch_1", false),
    )
    .await;
    // Two events of one second: the refund is the later state whatever the order.
    stripe_event(
        &test,
        "evt_r2",
        "charge.refunded",
        500,
        &charge("ch_2", true),
    )
    .await;
    stripe_event(
        &test,
        "evt_s2",
        "charge.succeeded",
        500,
        &charge("ch_2", false),
    )
    .await;

    assert_eq!(process(&test.db, &settings).await.applied, 4);

    let refunded: Vec<(String, bool)> = records(&test)
        .await
        .iter()
        .map(|record| {
            let payload: serde_json::Value = serde_json::from_str(&record.payload).expect("JSON");
            (record.external_id.clone(), payload["refunded"] == true)
        })
        .collect();
    assert_eq!(refunded, [("ch_1".into(), true), ("ch_2".into(), true)]);
    assert_eq!(
        changes(&test).await,
        feed(&[("ch_1", "inserted"), ("ch_2", "inserted")])
    );
}

#[tokio::test]
async fn a_deleted_event_marks_the_record_deleted_in_the_feed_and_an_older_update_does_not_restore_it(
) {
    let test = TestDb::new().await;
    let settings = test.settings(STRIPE);
    test.alice().await;
    stripe_event(&test, "evt_c", "customer.created", 100, &customer("first")).await;
    process(&test.db, &settings).await;
    stripe_event(&test, "evt_d", "customer.deleted", 200, &customer("first")).await;
    stripe_event(&test, "evt_u", "customer.updated", 150, &customer("late")).await;

    assert_eq!(process(&test.db, &settings).await.applied, 2);

    let stored = records(&test).await;
    assert_eq!(names(&stored), [("cus_1".to_string(), "first".to_string())]);
    assert!(stored[0].deleted_at.is_some(), "{stored:?}");
    let deleting_run = stored[0].deleted_by_run_id.expect("deleted by a run");
    let run = sync_run::Entity::find_by_id(deleting_run)
        .one(test.main())
        .await
        .expect("run")
        .expect("the run");
    assert_eq!((run.trigger, run.records_deleted), (Trigger::Webhook, 1));
    assert_eq!(
        changes(&test).await,
        feed(&[("cus_1", "inserted"), ("cus_1", "deleted")])
    );
}

#[tokio::test]
async fn a_github_issue_edited_event_updates_the_record_and_the_feed() {
    let test = TestDb::new().await;
    let settings = test.settings(GITHUB);
    alice_as(&test, Some("4242"), true).await;
    let issue = |action: &str, title: &str, at: &str| {
        format!(
            r#"{{"action":"{action}","issue":{{"id":7,"title":"{title}","updated_at":"{at}"}},"sender":{{"id":4242}}}}"#
        )
    };
    let opened = issue("opened", "Bug", "2026-12-05T10:00:00Z");
    let edited = issue("edited", "Bug, clearer", "2026-12-05T10:05:00Z");
    // A revoked token: an object a delivery carried proves nothing about it.
    let mut revoked = crate::entities::connection::Entity::find()
        .one(&test.db)
        .await
        .expect("connections")
        .expect("alice")
        .into_active_model();
    revoked.needs_reconnect_since = sea_orm::Set(Some(crate::db::now()));
    revoked.update(&test.db).await.expect("marked");
    deliver(&test, "gh-1", "issues", &opened, "4242").await;
    process(&test.db, &settings).await;
    deliver(&test, "gh-2", "issues", &edited, "4242").await;
    // A redelivery of the first, as GitHub's "redeliver" button sends it.
    deliver(&test, "gh-1-again", "issues", &opened, "4242").await;

    assert_eq!(process(&test.db, &settings).await.applied, 2);

    let stored = records(&test).await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].external_id, "7");
    assert!(stored[0].payload.contains("Bug, clearer"), "{stored:?}");
    assert_eq!(
        stored[0].provider, "acme",
        "the issues stream keeps the name"
    );
    assert_eq!(
        changes(&test).await,
        feed(&[("7", "inserted"), ("7", "updated")])
    );
    let connection = crate::entities::connection::Entity::find()
        .one(&test.db)
        .await
        .expect("connections")
        .expect("alice");
    assert!(
        connection.needs_reconnect_since.is_some(),
        "its webhook runs succeeded without asking the provider"
    );
}

/// `acme`, a GitHub provider syncing pull requests and issue comments too.
const GITHUB_ALL: &str = "\n[api]\nlisten = \"127.0.0.1:0\"\n[providers.acme]\nkind = \"github\"\n\
    schedule = \"0 0 0 1 1 *\"\nstreams = [\"issues\", \"repos\", \"pull_requests\", \"issue_comments\"]\n\
    [providers.acme.webhooks]\nsecret_env = \"HOOK\"\n";

#[tokio::test]
async fn github_pull_request_and_issue_comment_events_store_their_objects_in_their_streams() {
    let test = TestDb::new().await;
    let settings = test.settings(GITHUB_ALL);
    alice_as(&test, Some("4242"), true).await;
    let pull = |action: &str, title: &str, at: &str| {
        format!(
            r#"{{"action":"{action}","number":3,"pull_request":{{"id":30,"number":3,"title":"{title}","updated_at":"{at}"}},"sender":{{"id":4242}}}}"#
        )
    };
    let comment = r#"{"action":"created","issue":{"id":7,"number":1,"title":"Bug","updated_at":"2026-12-05T09:00:00Z"},"comment":{"id":70,"body":"Seen it too","updated_at":"2026-12-05T10:01:00Z"},"sender":{"id":4242}}"#;
    deliver(
        &test,
        "gh-pr-1",
        "pull_request",
        &pull("opened", "Fix", "2026-12-05T10:00:00Z"),
        "4242",
    )
    .await;
    deliver(&test, "gh-c-1", "issue_comment", comment, "4242").await;
    process(&test.db, &settings).await;
    deliver(
        &test,
        "gh-pr-2",
        "pull_request",
        &pull("edited", "Fix, tested", "2026-12-05T10:02:00Z"),
        "4242",
    )
    .await;

    let processed = process(&test.db, &settings).await;

    assert_eq!((processed.applied, processed.jobs_queued), (1, 0));
    let stored: Vec<(String, String)> = records(&test)
        .await
        .into_iter()
        .map(|record| (record.provider, record.external_id))
        .collect();
    assert_eq!(
        stored,
        [
            ("acme.pull_requests".to_string(), "30".to_string()),
            ("acme.issue_comments".to_string(), "70".to_string()),
        ],
        "each object in its own stream, the comment not the issue"
    );
    let pull_request = &records(&test).await[0];
    assert!(
        pull_request.payload.contains("Fix, tested"),
        "{pull_request:?}"
    );
    assert_eq!(
        changes(&test).await,
        feed(&[("30", "inserted"), ("70", "inserted"), ("30", "updated")])
    );
    let mut runs = webhook_runs(&test).await;
    runs.sort_by_key(|run| run.id);
    let streams: Vec<String> = runs
        .into_iter()
        .map(|run| run.stream.unwrap_or_default())
        .collect();
    assert_eq!(
        streams,
        ["pull_requests", "issue_comments", "pull_requests"]
    );
    assert!(
        webhook_jobs(&test).await.is_empty(),
        "nothing asked of GitHub"
    );
}

#[tokio::test]
async fn a_delivery_for_a_removed_connection_changes_nothing() {
    let test = TestDb::new().await;
    let settings = test.settings(GITHUB);
    alice_as(&test, Some("4242"), true).await;
    let alice = crate::entities::connection::Entity::find()
        .one(test.main())
        .await
        .expect("connections")
        .expect("alice");
    // Received while the connection was there, applied after it was removed.
    deliver(
        &test,
        "gh-1",
        "issues",
        &github_issue("opened", "Bug", "2026-12-05T10:00:00Z"),
        "4242",
    )
    .await;
    let removed =
        crate::pipeline::records::remove_connection(test.main(), alice.id, "alice", "acme", false)
            .await
            .expect("removed");
    assert_eq!(removed, Some(0));

    let processed = process(&test.db, &settings).await;

    assert_eq!(
        (
            processed.applied,
            processed.unmatched,
            processed.jobs_queued
        ),
        (0, 1, 0)
    );
    assert!(records(&test).await.is_empty());
    assert!(changes(&test).await.is_empty());
    assert!(webhook_runs(&test).await.is_empty());
    assert!(webhook_jobs(&test).await.is_empty());
    let delivery = &deliveries(&test).await[0];
    assert_eq!(
        (delivery.status, delivery.connection_id, delivery.job_id),
        (InboxStatus::Unmatched, None, None)
    );
}

#[tokio::test]
async fn an_object_failing_validation_is_a_run_error_with_its_payload_and_the_run_notifies() {
    let test = TestDb::new().await;
    let notify =
        "\n[notify]\nurl = \"https://app.example.com/hooks\"\nsecret_env = \"HOOK_NOTIFY\"\n";
    let settings = test.settings(&format!("{notify}{STRIPE}"));
    test.alice().await;
    // A customer without its `id`: no key to store it under.
    let keyless = r#"{"object":"customer","name":"no-id-customer"}"#;
    stripe_event(&test, "evt_bad", "customer.created", 100, keyless).await;

    let processed = process(&test.db, &settings).await;

    assert_eq!(
        (processed.applied, processed.failed),
        (1, 0),
        "{processed:?}"
    );
    assert!(records(&test).await.is_empty());
    let runs = webhook_runs(&test).await;
    assert_eq!(runs.len(), 1);
    assert_eq!(
        (runs[0].status, runs[0].records_failed),
        (crate::pipeline::RunStatus::Partial, 1)
    );
    let errors = crate::entities::run_error::Entity::find()
        .all(test.main())
        .await
        .expect("run errors");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(
        (
            errors[0].run_id,
            errors[0].user_id.as_str(),
            errors[0].provider.as_str()
        ),
        (runs[0].id, "alice", "acme"),
        "run errors name the provider, the run its stream"
    );
    assert_eq!(runs[0].stream.as_deref(), Some("customers"));
    assert_eq!(errors[0].external_id, None);
    assert_eq!(errors[0].payload, keyless, "the object as received");
    let notifications = crate::entities::notification_delivery::Entity::find()
        .all(test.main())
        .await
        .expect("notifications");
    assert_eq!(notifications.len(), 1, "{notifications:?}");
    assert_eq!(notifications[0].run_id, Some(runs[0].id));
    let body: serde_json::Value = serde_json::from_str(&notifications[0].body).expect("JSON");
    assert_eq!(
        (&body["stream"], &body["status"], &body["counts"]["failed"]),
        (&json!("customers"), &json!("partial"), &json!(1)),
        "{body}"
    );
}

#[tokio::test]
async fn a_delivery_for_a_disabled_connection_changes_nothing() {
    let test = TestDb::new().await;
    let settings = test.settings(STRIPE);
    alice_as(&test, None, false).await;
    stripe_event(&test, "evt_1", "customer.created", 100, &customer("first")).await;

    let processed = process(&test.db, &settings).await;

    assert_eq!((processed.applied, processed.unmatched), (0, 1));
    assert!(records(&test).await.is_empty());
    assert!(changes(&test).await.is_empty());
    assert!(webhook_runs(&test).await.is_empty());
}

#[tokio::test]
async fn a_delivery_held_by_an_instance_that_died_is_applied_once_when_its_hold_ends() {
    let test = TestDb::new().await;
    let settings = test.settings(STRIPE);
    test.alice().await;
    stripe_event(&test, "evt_1", "customer.created", 100, &customer("first")).await;
    // What an instance killed after its claim committed leaves: the row held, nothing
    // stored.
    let delivery = deliveries(&test).await.remove(0);
    let claimed_at = crate::db::now();
    let held_until = claimed_at + APPLY_HOLD;
    due_again(test.main(), &delivery, held_until)
        .await
        .expect("held");

    let early = process_due(&test.db, &settings, claimed_at)
        .await
        .expect("early");
    assert_eq!(early, Processed::default(), "nothing is due while held");
    let after = held_until + TimeDelta::seconds(1);
    let processed = process_due(&test.db, &settings, after)
        .await
        .expect("after");

    assert_eq!(processed.applied, 1);
    assert_eq!(
        names(&records(&test).await),
        [("cus_1".into(), "first".into())]
    );
    let delivery = deliveries(&test).await.remove(0);
    assert_eq!(
        (delivery.status, delivery.attempts),
        (InboxStatus::Applied, 1)
    );
    assert_eq!(webhook_runs(&test).await.len(), 1);
}

#[tokio::test]
async fn two_instances_sharing_the_inbox_apply_each_delivery_once_and_keep_the_newest() {
    let test = TestDb::new().await;
    let settings = test.settings(STRIPE);
    test.alice().await;
    // Versions 1..=20 of one customer, arriving in a shuffled order.
    let mut order: Vec<i64> = (1..=20).collect();
    order.sort_by_key(|n| (n * 7) % 20);
    for n in &order {
        let id = format!("evt_{n}");
        let name = format!("v{n}");
        stripe_event(&test, &id, "customer.updated", 1000 + n, &customer(&name)).await;
    }
    let (one, two) = (test.pool(4).await, test.pool(4).await);

    // A delivery that meets the other instance's run on its connection waits a moment;
    // rounds go on until every delivery is settled.
    let (mut applied, mut failed) = (0, 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while applied < 20 && std::time::Instant::now() < deadline {
        let (first, second) = tokio::join!(process(&one, &settings), process(&two, &settings));
        applied += first.applied + second.applied;
        failed += first.failed + second.failed;
        if first.applied + second.applied == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }

    assert_eq!((applied, failed), (20, 0));
    assert_eq!(
        names(&records(&test).await),
        [("cus_1".into(), "v20".into())]
    );
    assert!(deliveries(&test)
        .await
        .iter()
        .all(|d| d.status == InboxStatus::Applied && d.attempts == 1));
    assert_eq!(webhook_runs(&test).await.len(), 20, "one run a delivery");
    let feed = changes(&test).await;
    assert_eq!(feed.first(), Some(&("cus_1".into(), "inserted".into())));
    assert!(
        feed[1..].iter().all(|(_, kind)| kind == "updated"),
        "{feed:?}"
    );
}

/// A page of `cus_1` named `name`, as a run of the listing stores it (no version).
fn listed_customer(name: &str) -> crate::pipeline::RunPage<'static> {
    let payload = customer(name);
    let record = tributary_providers::Record {
        external_id: "cus_1".to_string(),
        content_hash: tributary_providers::record::sha256_hex(payload.as_bytes()),
        payload,
    };
    crate::pipeline::RunPage {
        items: vec![tributary_providers::PageItem::Record(record)],
        ..Default::default()
    }
}

#[tokio::test]
async fn a_delivery_waits_for_a_running_run_to_end_and_a_later_runs_read_wins_over_it() {
    use crate::lease::{claim, release, Holder};

    let test = TestDb::new().await;
    let settings = test.settings(STRIPE);
    let alice = test.alice().await;
    let customers = settings.providers["acme"]
        .stream("customers")
        .expect("customers")
        .clone();
    let scheduled = Holder::current();
    let ttl = std::time::Duration::from_secs(60);
    let lease = claim(test.main(), &alice, &scheduled, ttl)
        .await
        .expect("claim")
        .expect("free");
    let mut run = Run::open(
        &test.db,
        &alice,
        &customers,
        Trigger::Schedule,
        Some(&lease),
    )
    .await
    .expect("run");
    stripe_event(
        &test,
        "evt_2",
        "customer.updated",
        200,
        &customer("delivered"),
    )
    .await;

    // While the run holds the connection, the delivery waits, no attempt spent.
    let now = crate::db::now();
    let waiting = process_due(&test.db, &settings, now)
        .await
        .expect("processed");
    assert_eq!((waiting.applied, waiting.waiting), (0, 1));
    // The run stores what it read before the change, and ends.
    run.store(listed_customer("listed before"))
        .await
        .expect("stored");
    release(test.main(), &alice, &scheduled)
        .await
        .expect("released");
    let after = now + BUSY_WAIT + TimeDelta::seconds(1);
    let applied = process_due(&test.db, &settings, after)
        .await
        .expect("processed");
    assert_eq!(applied.applied, 1);
    assert_eq!(
        names(&records(&test).await),
        [("cus_1".into(), "delivered".into())]
    );

    // A run after the delivery read the API later: its read wins.
    let mut later = Run::open(&test.db, &alice, &customers, Trigger::Schedule, None)
        .await
        .expect("run");
    later
        .store(listed_customer("listed after"))
        .await
        .expect("stored");
    assert_eq!(
        names(&records(&test).await),
        [("cus_1".into(), "listed after".into())]
    );
    // A delivery older than the last one stored is still refused.
    stripe_event(&test, "evt_1", "customer.updated", 150, &customer("stale")).await;
    assert_eq!(process(&test.db, &settings).await.applied, 1);
    let stored = records(&test).await;
    assert_eq!(names(&stored), [("cus_1".into(), "listed after".into())]);
    assert_eq!(
        stored[0].source_version.as_deref(),
        Some("00000000000000000200.0")
    );
    let delivery = &deliveries(&test).await[0];
    assert_eq!(
        (delivery.status, delivery.attempts),
        (InboxStatus::Applied, 1)
    );
}

#[tokio::test]
async fn a_deletion_before_its_object_leaves_a_tombstone_an_older_delivery_cannot_lift_but_a_listing_can(
) {
    let test = TestDb::new().await;
    let settings = test.settings(STRIPE);
    let alice = test.alice().await;
    stripe_event(&test, "evt_d", "customer.deleted", 200, &customer("gone")).await;
    assert_eq!(process(&test.db, &settings).await.applied, 1);
    // The provider's `created` event, delayed past its deletion.
    stripe_event(&test, "evt_c", "customer.created", 100, &customer("first")).await;

    assert_eq!(process(&test.db, &settings).await.applied, 1);

    let stored = records(&test).await;
    assert_eq!(names(&stored), [("cus_1".to_string(), "gone".to_string())]);
    assert!(stored[0].deleted_at.is_some(), "{stored:?}");
    assert_eq!(
        stored[0].source_version.as_deref(),
        Some("00000000000000000200.9")
    );
    assert!(
        changes(&test).await.is_empty(),
        "the app never saw the record"
    );
    let runs = webhook_runs(&test).await;
    let written: i64 = runs
        .iter()
        .map(|run| run.records_inserted + run.records_deleted + run.records_restored)
        .sum();
    assert_eq!(written, 0, "{runs:?}");

    // A run's listing is the source of truth: it returns the object, which is live again.
    let customers = settings.providers["acme"]
        .stream("customers")
        .expect("customers")
        .clone();
    let mut run = Run::open(&test.db, &alice, &customers, Trigger::Schedule, None)
        .await
        .expect("run");
    run.store(listed_customer("listed")).await.expect("stored");
    let stored = records(&test).await;
    assert_eq!(
        names(&stored),
        [("cus_1".to_string(), "listed".to_string())]
    );
    assert!(stored[0].deleted_at.is_none(), "{stored:?}");
    assert_eq!(changes(&test).await, feed(&[("cus_1", "restored")]));
}

/// A GitHub `issues` event of issue 7 with `action`, `title` and `updated_at`, from
/// alice's user 4242.
fn github_issue(action: &str, title: &str, at: &str) -> String {
    format!(
        r#"{{"action":"{action}","issue":{{"id":7,"title":"{title}","updated_at":"{at}"}},"sender":{{"id":4242}}}}"#
    )
}

async fn webhook_jobs(test: &TestDb) -> Vec<sync_job::Model> {
    sync_job::Entity::find()
        .order_by_asc(sync_job::Column::Id)
        .all(test.main())
        .await
        .expect("jobs")
}

#[tokio::test]
async fn two_edits_in_one_second_store_nothing_from_the_second_and_queue_the_streams_run() {
    let test = TestDb::new().await;
    let settings = test.settings(GITHUB);
    alice_as(&test, Some("4242"), true).await;
    let at = "2026-12-05T10:00:00Z";
    deliver(
        &test,
        "gh-1",
        "issues",
        &github_issue("opened", "Bug", at),
        "4242",
    )
    .await;
    process(&test.db, &settings).await;
    // Edited within the same second: its version ties with the stored one's.
    let edited = github_issue("edited", "Bug, clearer", at);
    deliver(&test, "gh-2", "issues", &edited, "4242").await;
    // A redelivery of the first, identical to what is stored, queues nothing.
    let opened = github_issue("opened", "Bug", at);
    deliver(&test, "gh-1-again", "issues", &opened, "4242").await;

    let processed = process(&test.db, &settings).await;

    assert_eq!((processed.applied, processed.jobs_queued), (2, 1));
    let stored = records(&test).await;
    assert_eq!(stored.len(), 1);
    assert!(stored[0].payload.contains(r#""title":"Bug""#), "{stored:?}");
    assert_eq!(changes(&test).await, feed(&[("7", "inserted")]));
    let jobs = webhook_jobs(&test).await;
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(
        (jobs[0].kind, jobs[0].status, jobs[0].stream.as_str()),
        (JobKind::Webhook, JobStatus::Queued, "issues")
    );
    let job_ids: Vec<Option<i64>> = deliveries(&test).await.iter().map(|d| d.job_id).collect();
    assert_eq!(job_ids, [None, Some(jobs[0].id), None]);
}

/// `acme`, Shopify's orders through `preset = "shopify_orders"`, receiving webhooks.
const SHOPIFY: &str = "\n[api]\nlisten = \"127.0.0.1:0\"\n[providers.acme]\n\
    preset = \"shopify_orders\"\nbase_url = \"https://shop.myshopify.com\"\n\
    schedule = \"0 0 0 1 1 *\"\n[providers.acme.webhooks]\nscheme = \"shopify\"\n\
    secret_env = \"HOOK\"\n";

/// A Shopify order as its webhooks and the REST Admin API send it (trimmed).
fn order(id: u64, name: &str, updated_at: &str) -> String {
    format!(
        r#"{{"id":{id},"name":"{name}","financial_status":"paid","updated_at":"{updated_at}","line_items":[]}}"#
    )
}

#[tokio::test]
async fn shopify_orders_are_stored_from_the_body_by_updated_at_and_deleted_for_good() {
    let test = TestDb::new().await;
    let settings = test.settings(SHOPIFY);
    let shop = "shop.myshopify.com";
    alice_as(&test, Some(shop), true).await;
    let (first, second) = ("2026-12-05T10:00:00-05:00", "2026-12-05T10:05:00-05:00");
    deliver(
        &test,
        "s-2",
        "orders/updated",
        &order(450789469, "paid", second),
        shop,
    )
    .await;
    deliver(
        &test,
        "s-1",
        "orders/create",
        &order(450789469, "created", first),
        shop,
    )
    .await;
    // An order edit's body is no order: it queues a run.
    deliver(
        &test,
        "s-e",
        "orders/edited",
        r#"{"order_edit":{"id":1}}"#,
        shop,
    )
    .await;

    let processed = process(&test.db, &settings).await;

    assert_eq!((processed.applied, processed.jobs_queued), (3, 1));
    let stored = records(&test).await;
    assert_eq!(names(&stored), [("450789469".into(), "paid".into())]);
    assert_eq!(stored[0].provider, "acme", "the preset's primary stream");
    assert_eq!(changes(&test).await, feed(&[("450789469", "inserted")]));
    let jobs = webhook_jobs(&test).await;
    assert_eq!(jobs.len(), 1, "{jobs:?}");

    // `orders/delete` carries the id alone; a delete before its order is kept too.
    deliver(&test, "s-d", "orders/delete", r#"{"id":450789469}"#, shop).await;
    deliver(&test, "s-d2", "orders/delete", r#"{"id":7}"#, shop).await;
    process(&test.db, &settings).await;
    deliver(
        &test,
        "s-late",
        "orders/updated",
        &order(7, "late", second),
        shop,
    )
    .await;
    assert_eq!(process(&test.db, &settings).await.applied, 1);

    let stored = records(&test).await;
    let deleted: Vec<(&str, bool)> = stored
        .iter()
        .map(|record| (record.external_id.as_str(), record.deleted_at.is_some()))
        .collect();
    assert_eq!(deleted, [("450789469", true), ("7", true)]);
    assert_eq!(
        changes(&test).await,
        feed(&[("450789469", "inserted"), ("450789469", "deleted")])
    );
}
