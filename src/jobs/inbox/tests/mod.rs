//! The inbox's processing on the three databases: routing by account, coalescing a
//! burst into one job, two instances settling one inbox, unmatched deliveries, and
//! failures retried with backoff until `failed`.

use chrono::TimeDelta;
use sea_orm::{ActiveModelTrait, ConnectionTrait, EntityTrait, IntoActiveModel, QueryOrder};

use super::*;
use crate::testing::TestDb;

mod objects;

/// `acme` (a `rest` provider with `records` and `events` streams) receiving webhooks
/// whose account is the body's `/account`.
const ACME: &str = "\n[api]\nlisten = \"127.0.0.1:0\"\n[providers.acme]\nkind = \"rest\"\nbase_url = \"https://api.example.com\"\n\
    schedule = \"0 0 0 1 1 *\"\nauth = \"none\"\nstreams = [\"records\", \"events\"]\n\
    path = \"/records\"\nrecords_path = \"data\"\nid_field = \"id\"\n\
    [providers.acme.resources.events]\npath = \"/events\"\nrecords_path = \"data\"\nid_field = \"id\"\n\
    [providers.acme.webhooks]\nscheme = \"hmac\"\nsecret_env = \"HOOK\"\nheader = \"X-Signature\"\n\
    account_pointer = \"/account\"\n";

/// Alice's connection, with the account `acct_alice`.
async fn alice(test: &TestDb) -> connection::Model {
    let mut alice = test.alice().await.into_active_model();
    alice.account_id = Set(Some("acct_alice".to_string()));
    alice.update(test.main()).await.expect("account id")
}

/// `count` deliveries received now naming `account`, of event type `event_type`.
async fn receive(test: &TestDb, count: usize, account: Option<&str>, event_type: Option<&str>) {
    let now = crate::db::now();
    let rows = (0..count).map(|n| webhook_delivery::ActiveModel {
        provider: Set("acme".to_string()),
        delivery_id: Set(format!(
            "{}-{n}-{}",
            account.unwrap_or("none"),
            now.timestamp_micros()
        )),
        event_type: Set(event_type.map(str::to_string)),
        received_at: Set(now),
        body: Set("{}".to_string()),
        status: Set(InboxStatus::Received),
        attempts: Set(0),
        next_attempt_at: Set(now),
        error: Set(None),
        applied_at: Set(None),
        account_ids: Set(account.map(str::to_string)),
        connection_id: Set(None),
        job_id: Set(None),
        ..Default::default()
    });
    webhook_delivery::Entity::insert_many(rows)
        .exec(test.main())
        .await
        .expect("deliveries");
}

/// Every row of `E`, by `id`.
async fn all<E: EntityTrait>(test: &TestDb, id: E::Column) -> Vec<E::Model> {
    E::find()
        .order_by_asc(id)
        .all(test.main())
        .await
        .expect("rows")
}

/// [`process_due`] now, on the test's own pool.
async fn process(test: &TestDb, settings: &Settings) -> Processed {
    process_due(&test.db, settings, crate::db::now())
        .await
        .expect("processed")
}

async fn deliveries(test: &TestDb) -> Vec<webhook_delivery::Model> {
    all::<webhook_delivery::Entity>(test, webhook_delivery::Column::Id).await
}

async fn jobs(test: &TestDb) -> Vec<sync_job::Model> {
    all::<sync_job::Entity>(test, sync_job::Column::Id).await
}

#[tokio::test]
async fn a_burst_of_a_hundred_deliveries_queues_one_webhook_job_and_a_later_one_another() {
    let test = TestDb::new().await;
    let settings = test.settings(ACME);
    let alice = alice(&test).await;
    receive(&test, 100, Some("acct_alice"), Some("events.created")).await;

    let processed = process(&test, &settings).await;
    assert_eq!((processed.applied, processed.jobs_queued), (100, 1));
    assert_eq!((processed.unmatched, processed.failed), (0, 0));
    let queued = jobs(&test).await;
    assert_eq!(queued.len(), 1, "{queued:?}");
    let job = &queued[0];
    assert_eq!(
        (
            job.kind,
            job.status,
            job.stream.as_str(),
            job.connection_id,
            job.full
        ),
        (
            JobKind::Webhook,
            JobStatus::Queued,
            "events",
            alice.id,
            false
        )
    );
    assert!(job.priority < JobKind::Manual.priority());
    assert!(job.priority > JobKind::Scheduled.priority());
    for delivery in deliveries(&test).await {
        assert_eq!(
            (
                delivery.status,
                delivery.connection_id,
                delivery.job_id,
                delivery.attempts
            ),
            (InboxStatus::Applied, Some(alice.id), Some(job.id), 1)
        );
        assert!(delivery.applied_at.is_some());
    }

    // Once the job started, a delivery queues the next run rather than joining it; an
    // event of no known stream asks for every stream.
    test.main()
        .execute_unprepared("UPDATE sync_jobs SET status = 'running'")
        .await
        .expect("started");
    receive(&test, 2, Some("acct_alice"), Some("events.created")).await;
    receive(&test, 1, Some("acct_alice"), Some("ping")).await;
    let processed = process(&test, &settings).await;
    assert_eq!((processed.applied, processed.jobs_queued), (3, 2));
    let streams: Vec<(String, JobStatus)> = jobs(&test)
        .await
        .into_iter()
        .map(|job| (job.stream, job.status))
        .collect();
    assert_eq!(
        streams,
        [
            ("events".to_string(), JobStatus::Running),
            ("events".to_string(), JobStatus::Queued),
            (String::new(), JobStatus::Queued),
        ]
    );
}

#[tokio::test]
async fn a_delivery_of_an_unknown_account_or_of_none_is_unmatched_and_queues_nothing() {
    let test = TestDb::new().await;
    let settings = test.settings(ACME);
    alice(&test).await;
    receive(&test, 1, Some("acct_mallory"), None).await;
    receive(&test, 1, None, None).await;

    let processed = process(&test, &settings).await;
    assert_eq!(
        processed,
        Processed {
            unmatched: 2,
            ..Processed::default()
        }
    );
    assert!(jobs(&test).await.is_empty());
    for delivery in deliveries(&test).await {
        assert_eq!(
            (delivery.status, delivery.connection_id, delivery.job_id),
            (InboxStatus::Unmatched, None, None)
        );
    }
}

#[tokio::test]
async fn a_disabled_connection_matches_nothing_and_a_disabled_provider_s_deliveries_wait() {
    let test = TestDb::new().await;
    let alice = alice(&test).await;
    let mut disabled = alice.into_active_model();
    disabled.enabled = Set(false);
    disabled.update(test.main()).await.expect("disabled");
    receive(&test, 1, Some("acct_alice"), None).await;

    let off = test.settings(&ACME.replace("auth = \"none\"", "auth = \"none\"\nenabled = false"));
    let processed = process(&test, &off).await;
    assert_eq!(processed, Processed::default());
    assert_eq!(deliveries(&test).await[0].status, InboxStatus::Received);

    let processed = process(&test, &test.settings(ACME)).await;
    assert_eq!(processed.unmatched, 1);
    assert!(jobs(&test).await.is_empty());
}

#[tokio::test]
async fn two_instances_settling_one_burst_queue_one_job_and_settle_each_delivery_once() {
    let test = TestDb::new().await;
    let settings = test.settings(ACME);
    alice(&test).await;
    receive(&test, 100, Some("acct_alice"), None).await;
    let (one, two) = (test.pool(4).await, test.pool(4).await);

    // An instance whose claim meets only rows the other holds stops until its next poll;
    // rounds go on until neither settles anything.
    let (mut applied, mut jobs_queued) = (0, 0);
    loop {
        let now = crate::db::now();
        let (first, second) = tokio::join!(
            process_due(&one, &settings, now),
            process_due(&two, &settings, now)
        );
        let (first, second) = (first.expect("first"), second.expect("second"));
        if first.applied == 0 && second.applied == 0 {
            break;
        }
        applied += first.applied + second.applied;
        jobs_queued += first.jobs_queued + second.jobs_queued;
    }
    assert_eq!((applied, jobs_queued), (100, 1));
    assert_eq!(jobs(&test).await.len(), 1);
    for delivery in deliveries(&test).await {
        assert_eq!(
            (delivery.status, delivery.attempts),
            (InboxStatus::Applied, 1)
        );
    }
}

#[tokio::test]
async fn a_delivery_that_fails_is_retried_with_backoff_and_ends_failed_with_its_error() {
    let test = TestDb::new().await;
    let settings = test.settings(ACME);
    alice(&test).await;
    receive(&test, 1, Some("acct_alice"), None).await;
    // Every attempt fails: there is no queue to put its job in.
    test.main()
        .execute_unprepared("DROP TABLE sync_jobs")
        .await
        .expect("dropped");

    let mut now = crate::db::now();
    let mut waits = Vec::new();
    for attempt in 1..=MAX_ATTEMPTS {
        let processed = process_due(&test.db, &settings, now)
            .await
            .expect("processed");
        assert_eq!(processed.failed, 1, "attempt {attempt}");
        let delivery = &deliveries(&test).await[0];
        assert_eq!(delivery.attempts, attempt);
        assert!(
            delivery
                .error
                .as_deref()
                .is_some_and(|error| error.contains("sync_jobs")),
            "{:?}",
            delivery.error
        );
        // Whole seconds: the databases keep microseconds at most.
        let wait = delivery.next_attempt_at.signed_duration_since(now);
        waits.push((wait.num_milliseconds() + 500) / 1000);
        // Not due again before its backoff.
        let early = process_due(&test.db, &settings, now)
            .await
            .expect("processed");
        assert_eq!(early, Processed::default(), "attempt {attempt}");
        now = delivery.next_attempt_at;
    }
    assert_eq!(waits[..4], [10, 20, 40, 80]);
    let delivery = &deliveries(&test).await[0];
    assert_eq!(delivery.status, InboxStatus::Failed);
    let after = process_due(&test.db, &settings, now + TimeDelta::days(1))
        .await
        .expect("processed");
    assert_eq!(
        after,
        Processed::default(),
        "a failed delivery is not tried again"
    );
}
