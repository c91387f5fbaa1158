//! Webhooks from the outbox: a run that changed something leaves a delivery in the
//! transaction that closes it, and the delivery worker POSTs it signed, retried with
//! backoff, in order per connection, until it is delivered or given up. A wiremock server
//! is the receiver; it checks each signature over the raw body it got.

use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use nix::sys::signal::Signal;
use sea_orm::{EntityTrait, QueryOrder, QuerySelect};
use secrecy::SecretString;
use serde_json::Value;
use sha2::Sha256;
use tokio_util::sync::CancellationToken;
use tributary::config::Settings;
use tributary::daemon::notify::{DeliveryPass, Notifier};
use tributary::entities::notification_delivery::{self, DeliveryStatus};
use tributary::entities::{run_error, sync_run};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::daemon::{daemon_table, eventually, every_second, Daemon};
use crate::helpers::{cursor_provider, items, mount_cursor_pages, run, tributary, TestApp};

/// The signing secret the tests configure (long enough for `[notify]`).
pub(crate) const SECRET: &str = "whsec_test_0123456789abcdef";
/// The variable the configs name for it.
pub(crate) const SECRET_ENV: &str = "TRIBUTARY_TEST_HOOK_SECRET";
/// How old a signed timestamp the test receiver accepts, as docs/operations.md advises.
const TOLERANCE_SECS: i64 = 300;

/// A `[notify]` table for `receiver` with fast retries, `extra`'s lines (`key = value`)
/// added or replacing those.
pub(crate) fn notify_table(receiver: &MockServer, extra: &str) -> String {
    let mut keys = vec![
        ("url".to_string(), format!("\"{}/hooks\"", receiver.uri())),
        ("secret_env".to_string(), format!("\"{SECRET_ENV}\"")),
        ("retry_initial_delay".to_string(), "\"1ms\"".to_string()),
        ("retry_max_delay".to_string(), "\"5ms\"".to_string()),
        ("timeout".to_string(), "\"5s\"".to_string()),
    ];
    for line in extra.lines().filter(|line| !line.trim().is_empty()) {
        let (key, value) = line.split_once('=').expect("key = value");
        let (key, value) = (key.trim().to_string(), value.trim().to_string());
        keys.retain(|(k, _)| *k != key);
        keys.push((key, value));
    }
    let lines: String = keys
        .iter()
        .map(|(key, value)| format!("{key} = {value}\n"))
        .collect();
    format!("\n[notify]\n{lines}")
}

/// A cursor provider `acme` for `users` and a `[notify]` table.
fn providers(app: &TestApp, receiver: &MockServer, users: &[&str], extra: &str) -> String {
    format!(
        "{}{}",
        cursor_provider("acme", &app.api.uri(), users),
        notify_table(receiver, extra)
    )
}

/// A delivery worker on the app's database with the config's `[notify]`.
pub(crate) fn notifier(app: &TestApp, settings: &Settings) -> Notifier {
    let notify = settings.notify.clone().expect("[notify] configured");
    Notifier::new(app.db.main().clone(), notify, SecretString::from(SECRET)).expect("worker")
}

/// A test's app with alice's listing of `records` records, and a receiver.
async fn alice_listing(records: usize) -> (TestApp, MockServer) {
    let app = crate::helpers::spawn_app().await;
    mount_records(&app, items("k", "alice", 0..records)).await;
    (app, MockServer::start().await)
}

/// The settings of [`providers`], with the connections stored.
async fn notifying(app: &TestApp, receiver: &MockServer, users: &[&str], extra: &str) -> Settings {
    app.settings(&providers(app, receiver, users, extra)).await
}

/// Lists one page of `records` for every user.
async fn mount_records(app: &TestApp, records: Vec<Value>) {
    app.api.reset().await;
    mount_cursor_pages(&app.api, vec![(Value::Array(records), None)]).await;
}

/// Every delivery, oldest first.
pub(crate) async fn deliveries(app: &TestApp) -> Vec<notification_delivery::Model> {
    notification_delivery::Entity::find()
        .order_by_asc(notification_delivery::Column::Id)
        .all(&app.db)
        .await
        .expect("deliveries")
}

/// Passes of `notifier` until `done` holds of the deliveries, failing after `limit`.
pub(crate) async fn deliver_until(
    app: &TestApp,
    notifier: &Notifier,
    limit: Duration,
    done: impl Fn(&[notification_delivery::Model]) -> bool,
) -> Vec<DeliveryPass> {
    let deadline = Instant::now() + limit;
    let mut passes = Vec::new();
    loop {
        let rows = deliveries(app).await;
        if done(&rows) {
            return passes;
        }
        assert!(Instant::now() < deadline, "timed out: {rows:#?}");
        passes.push(
            notifier
                .deliver_due(&CancellationToken::new())
                .await
                .expect("pass"),
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub(crate) fn all_settled(rows: &[notification_delivery::Model]) -> bool {
    rows.iter().all(|d| d.status != DeliveryStatus::Pending)
}

/// A receiver that answers `status` and counts nothing itself (wiremock keeps requests).
pub(crate) async fn answer(receiver: &MockServer, status: u16) {
    Mock::given(method("POST"))
        .and(path("/hooks"))
        .respond_with(ResponseTemplate::new(status))
        .mount(receiver)
        .await;
}

/// What the receiver checks of one request: the signature over the raw body with the
/// shared secret, and the timestamp's age. Returns the body.
pub(crate) fn verified(request: &Request) -> Value {
    let header = request
        .headers
        .get("tributary-signature")
        .and_then(|value| value.to_str().ok())
        .expect("a Tributary-Signature header");
    let mut timestamp = None;
    let mut v1 = None;
    for part in header.split(',') {
        match part.split_once('=') {
            Some(("t", value)) => timestamp = Some(value.to_string()),
            Some(("v1", value)) => v1 = Some(value.to_string()),
            _ => panic!("unexpected part {part:?} in {header:?}"),
        }
    }
    let timestamp = timestamp.expect("t=");
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).expect("key");
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(&request.body);
    let expected = const_hex::encode(mac.finalize().into_bytes());
    assert_eq!(
        v1.as_deref(),
        Some(expected.as_str()),
        "the signature holds"
    );
    let age = chrono::Utc::now().timestamp() - timestamp.parse::<i64>().expect("t is a number");
    assert!((0..TOLERANCE_SECS).contains(&age), "signed {age}s ago");
    serde_json::from_slice(&request.body).expect("a JSON body")
}

pub(crate) async fn received(receiver: &MockServer) -> Vec<Request> {
    receiver.received_requests().await.unwrap_or_default()
}

#[tokio::test]
async fn a_changed_run_is_posted_signed_with_its_counts_and_the_receiver_verifies_it() {
    let (app, receiver) = alice_listing(3).await;
    answer(&receiver, 204).await;
    let settings = notifying(&app, &receiver, &["alice"], "").await;
    let run = app.sync_one(&settings).await;

    let rows = deliveries(&app).await;
    assert_eq!(rows.len(), 1, "the run's delivery committed with it");
    assert_eq!(
        (rows[0].run_id, rows[0].status, rows[0].attempts),
        (Some(run.run_id), DeliveryStatus::Pending, 0)
    );
    let worker = notifier(&app, &settings);
    deliver_until(&app, &worker, Duration::from_secs(20), all_settled).await;

    let requests = received(&receiver).await;
    assert_eq!(requests.len(), 1);
    let body = verified(&requests[0]);
    let delivery = &deliveries(&app).await[0];
    assert_eq!(delivery.status, DeliveryStatus::Delivered);
    assert_eq!(delivery.attempts, 1);
    assert!(delivery.delivered_at.is_some());
    assert_eq!(
        requests[0].headers.get("tributary-delivery").unwrap(),
        delivery.delivery_id.as_str()
    );
    assert_eq!(
        requests[0].headers.get("content-type").unwrap(),
        "application/json"
    );
    assert_eq!(body["delivery_id"], delivery.delivery_id.as_str());
    assert_eq!(body["run_id"], run.run_id);
    assert_eq!(body["user_id"], "alice");
    assert_eq!(body["provider"], "acme");
    assert_eq!(body["stream"], "records");
    assert_eq!(body["status"], "succeeded");
    assert_eq!(body["counts"]["inserted"], 3);
    assert_eq!(body["counts"]["updated"], 0);
    assert_eq!(body["counts"]["failed"], 0);
    // The feed's cursors around the run: reading from one to the other gives its changes.
    let database = tributary::pipeline::changes::FeedCursor::issued_by(
        &app.db,
        tributary::pipeline::changes::Cursor::START,
    )
    .await
    .expect("the database's id")
    .database;
    let cursor = |name: &str| -> tributary::pipeline::changes::Cursor {
        let cursor: tributary::pipeline::changes::FeedCursor = body["cursors"][name]
            .as_str()
            .expect("a cursor")
            .parse()
            .expect("a valid cursor");
        assert_eq!(cursor.database, database, "issued by this database");
        cursor.position
    };
    let (changes, next) = crate::helpers::read_feed(&app.db, cursor("before"), 100).await;
    assert_eq!(changes.len(), 3);
    assert!(changes.iter().all(|change| change.run_id == run.run_id));
    if crate::helpers::backend() == crate::helpers::Backend::Postgres {
        // The head has moved on with the server's other transactions.
        assert!(next >= cursor("after"));
    } else {
        assert_eq!(next, cursor("after"));
    }
    assert_eq!(
        String::from_utf8_lossy(&requests[0].body),
        delivery.body,
        "the body sent is the body stored"
    );
}

#[tokio::test]
async fn a_run_that_changed_nothing_sends_nothing_unless_always() {
    let (app, receiver) = alice_listing(2).await;
    answer(&receiver, 200).await;
    let settings = notifying(&app, &receiver, &["alice"], "").await;
    let first = app.sync_one(&settings).await;
    let unchanged = app.sync_one(&settings).await;
    assert_eq!(
        (unchanged.counts.inserted, unchanged.counts.unchanged),
        (0, 2)
    );
    let worker = notifier(&app, &settings);
    deliver_until(&app, &worker, Duration::from_secs(20), all_settled).await;
    let rows = deliveries(&app).await;
    assert_eq!(
        rows.iter().map(|d| d.run_id).collect::<Vec<_>>(),
        vec![Some(first.run_id)],
        "the unchanged run wrote no delivery"
    );
    assert_eq!(received(&receiver).await.len(), 1);

    // A run whose only change is a record it could not store still notifies.
    let mut listing = items("k", "alice", 0..2);
    listing.push(serde_json::json!({"no_id": true}));
    mount_records(&app, listing).await;
    let partial = app.sync_one(&settings).await;
    assert_eq!((partial.counts.inserted, partial.counts.failed), (0, 1));

    let always = notifying(&app, &receiver, &["alice"], "always = true").await;
    mount_records(&app, items("k", "alice", 0..2)).await;
    let quiet = app.sync_one(&always).await;
    assert_eq!((quiet.counts.inserted, quiet.counts.updated), (0, 0));
    deliver_until(
        &app,
        &notifier(&app, &always),
        Duration::from_secs(20),
        all_settled,
    )
    .await;
    let runs: Vec<Option<i64>> = deliveries(&app).await.iter().map(|d| d.run_id).collect();
    assert_eq!(
        runs,
        vec![Some(first.run_id), Some(partial.run_id), Some(quiet.run_id)]
    );
    let bodies: Vec<Value> = received(&receiver).await.iter().map(verified).collect();
    assert_eq!(bodies.len(), 3);
    assert_eq!(bodies[1]["status"], "partial");
    assert_eq!(bodies[1]["counts"]["failed"], 1);
    assert_eq!(bodies[2]["counts"]["inserted"], 0);
}

#[tokio::test]
async fn a_receiver_failing_three_times_gets_the_delivery_four_times_then_it_is_delivered() {
    let (app, receiver) = alice_listing(1).await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(500).set_body_string("upstream down"))
        .up_to_n_times(3)
        .with_priority(1)
        .mount(&receiver)
        .await;
    answer(&receiver, 200).await;
    let settings = notifying(&app, &receiver, &["alice"], "").await;
    app.sync_one(&settings).await;

    let worker = notifier(&app, &settings);
    let passes = deliver_until(&app, &worker, Duration::from_secs(20), all_settled).await;
    let delivery = &deliveries(&app).await[0];
    assert_eq!(delivery.status, DeliveryStatus::Delivered);
    assert_eq!(delivery.attempts, 4);
    assert!(
        delivery
            .last_error
            .as_deref()
            .unwrap_or("")
            .contains("HTTP 500 Internal Server Error: upstream down"),
        "{delivery:?}"
    );
    let retried: usize = passes.iter().map(|p| p.retrying).sum();
    assert_eq!(retried, 3);
    let requests = received(&receiver).await;
    assert_eq!(requests.len(), 4, "once more after each failure");
    let ids: Vec<&str> = requests
        .iter()
        .map(|r| {
            r.headers
                .get("tributary-delivery")
                .unwrap()
                .to_str()
                .unwrap()
        })
        .collect();
    assert!(ids.iter().all(|id| *id == delivery.delivery_id), "{ids:?}");
    let bodies: Vec<Value> = requests.iter().map(verified).collect();
    assert!(bodies.windows(2).all(|pair| pair[0] == pair[1]));
}

/// The `run_id` of each request, in the order the receiver got them.
async fn run_ids_received(receiver: &MockServer) -> Vec<(String, i64)> {
    received(receiver)
        .await
        .iter()
        .map(|request| {
            let body = verified(request);
            (
                body["user_id"].as_str().unwrap_or("").to_string(),
                body["run_id"].as_i64().unwrap_or(-1),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_connections_deliveries_arrive_in_order_while_other_connections_go_on() {
    let app = crate::helpers::spawn_app().await;
    let receiver = MockServer::start().await;
    // Alice's first delivery fails twice; bob's gets through at once.
    Mock::given(method("POST"))
        .and(wiremock::matchers::body_partial_json(
            serde_json::json!({"user_id": "alice"}),
        ))
        .respond_with(ResponseTemplate::new(503))
        .up_to_n_times(2)
        .with_priority(1)
        .mount(&receiver)
        .await;
    answer(&receiver, 200).await;
    let settings = notifying(&app, &receiver, &["alice", "bob"], "").await;
    mount_records(&app, items("k", "u", 0..2)).await;
    let first = app.sync(&settings).await;
    let mut changed = items("k", "u", 0..2);
    changed[0]["n"] = Value::from(100);
    mount_records(&app, changed).await;
    let second = app.sync(&settings).await;
    assert!(second.iter().all(|run| run.counts.updated == 1));

    let worker = notifier(&app, &settings);
    let first_pass = worker
        .deliver_due(&CancellationToken::new())
        .await
        .expect("pass");
    assert_eq!(
        (first_pass.delivered, first_pass.retrying),
        (1, 1),
        "only the head of each connection's queue is tried: bob's first, alice's first"
    );
    deliver_until(&app, &worker, Duration::from_secs(20), all_settled).await;

    let sequence = run_ids_received(&receiver).await;
    let of = |user: &str| -> Vec<i64> {
        sequence
            .iter()
            .filter(|(u, _)| u == user)
            .map(|(_, run)| *run)
            .collect()
    };
    let (alice_1, alice_2) = (first[0].run_id, second[0].run_id);
    let (bob_1, bob_2) = (first[1].run_id, second[1].run_id);
    assert_eq!(of("alice"), vec![alice_1, alice_1, alice_1, alice_2]);
    assert_eq!(of("bob"), vec![bob_1, bob_2]);
    let rows = deliveries(&app).await;
    assert!(rows.iter().all(|d| d.status == DeliveryStatus::Delivered));
}

#[tokio::test]
async fn several_workers_keep_each_connections_deliveries_in_order() {
    let app = crate::helpers::spawn_app().await;
    let receiver = MockServer::start().await;
    // Alice's first delivery fails twice, slowly; everything else gets through.
    Mock::given(method("POST"))
        .and(wiremock::matchers::body_partial_json(
            serde_json::json!({"user_id": "alice"}),
        ))
        .respond_with(ResponseTemplate::new(503).set_delay(Duration::from_millis(300)))
        .up_to_n_times(2)
        .with_priority(1)
        .mount(&receiver)
        .await;
    answer(&receiver, 200).await;
    let settings = notifying(&app, &receiver, &["alice", "bob"], "").await;
    mount_records(&app, items("k", "u", 0..2)).await;
    let first = app.sync(&settings).await;
    let mut changed = items("k", "u", 0..2);
    changed[0]["n"] = Value::from(100);
    mount_records(&app, changed).await;
    let second = app.sync(&settings).await;
    assert!(second.iter().all(|run| run.counts.updated == 1));

    // Three workers, as three instances would run them, pass over the queue at once
    // until everything is delivered.
    let workers: Vec<Notifier> = (0..3).map(|_| notifier(&app, &settings)).collect();
    let (alice_1, alice_2) = (first[0].run_id, second[0].run_id);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !all_settled(&deliveries(&app).await) {
        assert!(Instant::now() < deadline, "{:#?}", deliveries(&app).await);
        let cancel = CancellationToken::new();
        futures::future::join_all(workers.iter().map(|w| w.deliver_due(&cancel))).await;
        let alice: Vec<i64> = run_ids_received(&receiver)
            .await
            .into_iter()
            .filter(|(user, _)| user == "alice")
            .map(|(_, run)| run)
            .collect();
        let first_delivered = alice.len() > 2;
        assert!(
            first_delivered || alice.iter().all(|run| *run == alice_1),
            "alice's second delivery was sent while her first was still owed: {alice:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let sequence = run_ids_received(&receiver).await;
    let of = |user: &str| -> Vec<i64> {
        sequence
            .iter()
            .filter(|(u, _)| u == user)
            .map(|(_, run)| *run)
            .collect()
    };
    assert_eq!(of("alice"), vec![alice_1, alice_1, alice_1, alice_2]);
    assert_eq!(of("bob"), vec![first[1].run_id, second[1].run_id]);
    let rows = deliveries(&app).await;
    assert!(rows.iter().all(|d| d.status == DeliveryStatus::Delivered));
}

#[tokio::test]
async fn a_delivery_still_failing_after_give_up_after_ends_failed_and_is_listed() {
    let (app, receiver) = alice_listing(1).await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(503).set_body_string("maintenance"))
        .mount(&receiver)
        .await;
    let text = providers(
        &app,
        &receiver,
        &["alice"],
        "give_up_after = \"1s\"\nretry_max_delay = \"200ms\"",
    );
    let settings = app.settings(&text).await;
    let given_up_run = app.sync_one(&settings).await;
    let worker = notifier(&app, &settings);
    deliver_until(&app, &worker, Duration::from_secs(20), all_settled).await;

    let delivery = &deliveries(&app).await[0];
    assert_eq!(delivery.status, DeliveryStatus::Failed);
    assert!(delivery.attempts >= 2, "{delivery:?}");
    // `give_up_after` runs from the delivery's creation, in the run's commit, not from
    // whenever this test got round to starting the worker: the row's own times say when.
    assert!(
        delivery.next_attempt_at - delivery.created_at >= chrono::TimeDelta::seconds(1),
        "given up before give_up_after: {delivery:?}"
    );
    let stored: Vec<String> = notification_delivery::Entity::find()
        .select_only()
        .column(notification_delivery::Column::Status)
        .into_tuple()
        .all(&app.db)
        .await
        .expect("status as text");
    assert_eq!(stored, vec!["failed".to_string()]);
    assert!(
        delivery
            .last_error
            .as_deref()
            .unwrap_or("")
            .contains("HTTP 503 Service Unavailable: maintenance"),
        "{delivery:?}"
    );
    assert_eq!(received(&receiver).await.len() as i64, delivery.attempts);
    let worker_again = worker
        .deliver_due(&CancellationToken::new())
        .await
        .expect("pass");
    assert_eq!(
        worker_again,
        DeliveryPass::default(),
        "given up stays given up"
    );
    // As docs/operations.md tells: made pending again, it is tried once more.
    app.execute(&format!(
        "UPDATE notification_deliveries SET status = 'pending' WHERE delivery_id = '{}'",
        delivery.delivery_id
    ))
    .await;
    let once_more = worker
        .deliver_due(&CancellationToken::new())
        .await
        .expect("pass");
    assert_eq!(
        once_more.given_up, 1,
        "past its deadline, one attempt: {once_more:?}"
    );
    let delivery = &deliveries(&app).await[0];
    assert_eq!(received(&receiver).await.len() as i64, delivery.attempts);

    let config = app.write_config(&text);
    let listed = run(tributary(&config).args(["notifications", "--failed"]));
    assert_eq!(listed.code, 0, "{}", listed.stderr);
    assert!(
        listed.stdout.contains(&delivery.delivery_id),
        "{}",
        listed.stdout
    );
    assert!(listed.stdout.contains("failed"), "{}", listed.stdout);
    assert!(listed.stdout.contains("HTTP 503"), "{}", listed.stdout);
    let json = run(tributary(&config).args(["notifications", "--failed", "--json"]));
    let shown: Vec<Value> = serde_json::from_str(&json.stdout).expect("JSON");
    assert_eq!(shown.len(), 1);
    assert_eq!(shown[0]["status"], "failed");
    assert_eq!(shown[0]["run_id"], given_up_run.run_id);
    assert_eq!(shown[0]["attempts"], delivery.attempts);
}

#[tokio::test]
async fn notifications_lists_every_delivery_and_failed_only_the_given_up() {
    let (app, receiver) = alice_listing(1).await;
    answer(&receiver, 200).await;
    let text = providers(&app, &receiver, &["alice"], "");
    let settings = app.settings(&text).await;
    let config = app.write_config(&text);
    let none = run(tributary(&config).arg("notifications"));
    assert_eq!(none.stdout.trim(), "No deliveries yet.");

    app.sync_one(&settings).await;
    let pending = run(tributary(&config).args(["notifications", "--json"]));
    let shown: Vec<Value> = serde_json::from_str(&pending.stdout).expect("JSON");
    assert_eq!(shown[0]["status"], "pending");
    deliver_until(
        &app,
        &notifier(&app, &settings),
        Duration::from_secs(20),
        all_settled,
    )
    .await;
    let all = run(tributary(&config).arg("notifications"));
    assert!(all.stdout.contains("delivered"), "{}", all.stdout);
    let failed = run(tributary(&config).args(["notifications", "--failed"]));
    assert_eq!(failed.stdout.trim(), "No failed deliveries.");
}

#[tokio::test]
async fn two_workers_on_one_database_never_send_one_delivery_at_once() {
    let app = crate::helpers::spawn_app().await;
    let receiver = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_delay(Duration::from_millis(200)))
        .mount(&receiver)
        .await;
    let users: Vec<String> = (0..6).map(|i| format!("user{i}")).collect();
    let names: Vec<&str> = users.iter().map(String::as_str).collect();
    let settings = notifying(&app, &receiver, &names, "").await;
    mount_records(&app, items("k", "u", 0..1)).await;
    app.sync(&settings).await;
    assert_eq!(deliveries(&app).await.len(), 6);

    let workers: Vec<Notifier> = (0..3).map(|_| notifier(&app, &settings)).collect();
    let cancel = CancellationToken::new();
    let passes = futures::future::join_all(workers.iter().map(|w| w.deliver_due(&cancel))).await;
    let delivered: usize = passes
        .iter()
        .map(|p| p.as_ref().expect("pass").delivered)
        .sum();
    assert_eq!(delivered, 6);
    let mut sent: Vec<String> = received(&receiver)
        .await
        .iter()
        .map(|r| {
            verified(r)["delivery_id"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    sent.sort();
    sent.dedup();
    assert_eq!(sent.len(), 6);
    assert_eq!(
        received(&receiver).await.len(),
        6,
        "each delivery sent once"
    );
    assert!(deliveries(&app).await.iter().all(|d| d.attempts == 1));
}

/// A receiver whose error page echoes the request's headers and, worse, the secret.
struct Echo;

impl Respond for Echo {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let headers: String = request
            .headers
            .iter()
            .map(|(name, value)| format!("{name}: {}\n", value.to_str().unwrap_or("")))
            .collect();
        ResponseTemplate::new(400).set_body_string(format!("{headers}secret was {SECRET}"))
    }
}

#[tokio::test]
async fn a_daemon_killed_after_the_run_committed_delivers_after_restart_and_no_secret_leaks() {
    let app = crate::helpers::spawn_app().await;
    let receiver = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(Echo)
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&receiver)
        .await;
    answer(&receiver, 200).await;
    mount_records(&app, items("k", "alice", 0..2)).await;
    let table = |poll: &str| {
        format!(
            "{}{}",
            daemon_table(None),
            every_second(providers(
                &app,
                &receiver,
                &["alice"],
                &format!("poll_interval = \"{poll}\""),
            ))
        )
    };
    let env = [(SECRET_ENV, SECRET)];
    let args = ["--log", "debug"];

    // The first daemon's worker would look only after an hour: it is killed before.
    let config = app.write_config(&table("1h"));
    let mut first = Daemon::start_with(&config, app.dir.path().join("first.log"), &args, &env);
    eventually(Duration::from_secs(30), "the run's delivery", || async {
        !deliveries(&app).await.is_empty()
    })
    .await;
    first.signal(Signal::SIGKILL);
    first.wait(Duration::from_secs(10));
    let rows = deliveries(&app).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        (rows[0].status, rows[0].attempts),
        (DeliveryStatus::Pending, 0)
    );
    assert!(received(&receiver).await.is_empty());
    let run_id = rows[0].run_id.expect("a run's delivery");

    let port = crate::daemon::free_port();
    let config = app.write_config(&table("50ms").replace(
        "[daemon]\n",
        &format!("[daemon]\nlisten = \"127.0.0.1:{port}\"\n"),
    ));
    let mut second = Daemon::start_with(&config, app.dir.path().join("second.log"), &args, &env);
    eventually(
        Duration::from_secs(30),
        "the delivery after restart",
        || async {
            deliveries(&app)
                .await
                .iter()
                .all(|d| d.status == DeliveryStatus::Delivered)
        },
    )
    .await;
    // The notifier starts before the listener binds, so a delivery can come first; the
    // daemon says it is ready once the listener serves.
    eventually(
        Duration::from_secs(30),
        "the second daemon ready",
        || async { second.log().contains("Daemon ready.") },
    )
    .await;
    let metrics = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .expect("metrics answer")
        .text()
        .await
        .expect("metrics text");
    for line in [
        "tributary_notification_attempts_total{outcome=\"retrying\"} 1",
        "tributary_notification_attempts_total{outcome=\"delivered\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in:\n{metrics}");
    }
    second.signal(Signal::SIGTERM);
    assert_eq!(second.wait(Duration::from_secs(15)), 0, "{}", second.log());
    assert!(
        second.log().contains("Notification worker stopped."),
        "{}",
        second.log()
    );

    let requests = received(&receiver).await;
    assert_eq!(requests.len(), 2, "refused once (echoing), then delivered");
    assert!(requests.iter().all(|r| verified(r)["run_id"] == run_id));
    let rows = deliveries(&app).await;
    assert_eq!(rows.len(), 1, "later runs changed nothing: {rows:?}");
    assert_eq!(rows[0].attempts, 2);
    let last_error = rows[0].last_error.clone().unwrap_or_default();
    assert!(last_error.contains("HTTP 400"), "{last_error}");
    assert!(last_error.contains("[REDACTED]"), "{last_error}");
    assert!(
        second.log().contains("Notification delivered."),
        "{}",
        second.log()
    );

    // The secret is in no table and no log line, and so is no signature it made.
    let signatures: Vec<String> = requests
        .iter()
        .map(|r| {
            r.headers["tributary-signature"]
                .to_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let tables = format!(
        "{:?}{:?}{:?}",
        deliveries(&app).await,
        sync_run::Entity::find().all(&app.db).await.unwrap(),
        run_error::Entity::find().all(&app.db).await.unwrap()
    );
    for text in [tables, first.log(), second.log()] {
        assert!(!text.contains(SECRET), "the secret leaked:\n{text}");
        for signature in &signatures {
            let v1 = signature.split("v1=").nth(1).unwrap();
            assert!(!text.contains(v1), "a signature leaked:\n{text}");
        }
    }
}

#[tokio::test]
async fn check_config_refuses_a_missing_or_short_signing_secret_without_printing_it() {
    let app = crate::helpers::spawn_app().await;
    let receiver = MockServer::start().await;
    let config = app.write_config(&providers(&app, &receiver, &["alice"], ""));

    let unset = run(tributary(&config)
        .arg("check-config")
        .env_remove(SECRET_ENV));
    assert_eq!(unset.code, 2, "{}", unset.stderr);
    assert!(
        unset.stderr.contains(&format!(
            "key `notify.secret_env`: environment variable {SECRET_ENV} is not set"
        )),
        "{}",
        unset.stderr
    );

    let short = "short-secret";
    let refused = run(tributary(&config)
        .arg("check-config")
        .env(SECRET_ENV, short));
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("notify.secret_env"),
        "{}",
        refused.stderr
    );
    assert!(refused.stderr.contains("at least 16"), "{}", refused.stderr);
    assert!(!refused.stderr.contains(short), "{}", refused.stderr);

    let valid = run(tributary(&config)
        .arg("check-config")
        .env(SECRET_ENV, SECRET));
    assert_eq!(valid.code, 0, "{}", valid.stderr);
    assert!(
        valid.stdout.contains(&format!(
            "Notifications to {}/hooks, signed with the secret in {SECRET_ENV}.",
            receiver.uri()
        )),
        "{}",
        valid.stdout
    );
    assert!(!valid.stdout.contains(SECRET) && !valid.stderr.contains(SECRET));

    let daemon = run(tributary(&config).arg("daemon").env(SECRET_ENV, short));
    assert_eq!(
        daemon.code, 2,
        "the daemon refuses it too: {}",
        daemon.stderr
    );
    assert!(!daemon.stderr.contains(short), "{}", daemon.stderr);
}

/// Syncs `user`'s connection only.
async fn sync_user(app: &TestApp, settings: &Settings, user: &str) -> i64 {
    let filter = tributary::sync::SyncFilter {
        user_id: Some(user.to_string()),
        ..Default::default()
    };
    let options = tributary::pipeline::RunOptions::manual();
    let report = tributary::sync::sync_matching(
        &app.db,
        settings,
        &filter,
        &options,
        &tributary::pipeline::NoProgress,
    )
    .await
    .expect("runs recorded");
    assert_eq!(report.outcomes.len(), 1, "{report:?}");
    report.outcomes[0].run_id
}

#[tokio::test]
async fn a_slow_receiver_holds_back_only_its_own_connections_deliveries() {
    let app = crate::helpers::spawn_app().await;
    let receiver = MockServer::start().await;
    // Alice's first delivery takes the receiver five seconds; everything else is quick.
    let slow = Duration::from_secs(5);
    Mock::given(method("POST"))
        .and(wiremock::matchers::body_partial_json(
            serde_json::json!({"user_id": "alice"}),
        ))
        .respond_with(ResponseTemplate::new(200).set_delay(slow))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&receiver)
        .await;
    answer(&receiver, 200).await;
    let users = ["alice", "bob"];
    let extra = "poll_interval = \"50ms\"\ntimeout = \"20s\"";
    // The daemon's schedule never fires during the test: the test makes the runs.
    let table = format!(
        "{}{}",
        daemon_table(None),
        providers(&app, &receiver, &users, extra).replace(
            "schedule = \"0 */15 * * * *\"",
            "schedule = \"0 0 0 1 1 *\""
        )
    );
    let config = app.write_config(&table);
    let settings = notifying(&app, &receiver, &users, extra).await;
    mount_records(&app, items("k", "u", 0..2)).await;
    let alice_1 = sync_user(&app, &settings, "alice").await;

    let env = [(SECRET_ENV, SECRET)];
    let mut daemon = Daemon::start_with(
        &config,
        app.dir.path().join("daemon.log"),
        &["--log", "debug"],
        &env,
    );
    eventually(Duration::from_secs(30), "alice's slow delivery", || async {
        !received(&receiver).await.is_empty()
    })
    .await;
    let slow_started = Instant::now();
    // While alice's receiver is busy: bob's run, and alice's next one.
    let bob = sync_user(&app, &settings, "bob").await;
    let mut changed = items("k", "u", 0..2);
    changed[0]["n"] = Value::from(100);
    mount_records(&app, changed).await;
    let alice_2 = sync_user(&app, &settings, "alice").await;

    let delivered = |user: &'static str| {
        let app = &app;
        async move {
            deliveries(app)
                .await
                .iter()
                .filter(|d| d.user_id == user)
                .map(|d| d.status)
                .collect::<Vec<_>>()
        }
    };
    eventually(Duration::from_secs(30), "bob's delivery", || async {
        delivered("bob").await == [DeliveryStatus::Delivered]
    })
    .await;
    assert_eq!(
        delivered("alice").await,
        [DeliveryStatus::Pending, DeliveryStatus::Pending],
        "bob's delivery must not wait for alice's slow receiver ({:?} into its {slow:?})",
        slow_started.elapsed()
    );
    assert!(
        slow_started.elapsed() < slow,
        "{:?}",
        slow_started.elapsed()
    );
    eventually(Duration::from_secs(30), "alice's deliveries", || async {
        delivered("alice").await == [DeliveryStatus::Delivered, DeliveryStatus::Delivered]
    })
    .await;
    daemon.signal(Signal::SIGTERM);
    assert_eq!(daemon.wait(Duration::from_secs(20)), 0, "{}", daemon.log());

    // Alice's second delivery went only after her first, each once.
    let sequence = run_ids_received(&receiver).await;
    let of = |user: &str| -> Vec<i64> {
        sequence
            .iter()
            .filter(|(u, _)| u == user)
            .map(|(_, run)| *run)
            .collect()
    };
    assert_eq!(of("alice"), [alice_1, alice_2]);
    assert_eq!(of("bob"), [bob]);
}
