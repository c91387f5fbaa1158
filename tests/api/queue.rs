//! The job queue: runs asked for start before scheduled ones, failed runs are retried
//! after a backoff, a run asked for that finds its connection busy waits for the lease,
//! and the queue is visible through `tributary jobs`.

use std::time::Duration;

use sea_orm::{ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, QueryOrder, Set};
use tributary::entities::sync_job::{self, JobKind, JobStatus};
use tributary::entities::sync_run::RunStatus;
use tributary::entities::{connection, sync_run};
use wiremock::matchers::{method, path};
use wiremock::{Mock, ResponseTemplate};

use crate::daemon::{daemon_table, eventually, runs_of, Daemon};
use crate::helpers::{cursor_provider, mount_cursor_listing, run, spawn_app, tributary, TestApp};

/// `acme` synced once a year, so only the jobs a test queues run.
fn yearly(app: &TestApp, users: &[&str]) -> String {
    cursor_provider("acme", &app.api.uri(), users).replace(
        "schedule = \"0 */15 * * * *\"",
        "schedule = \"0 0 0 1 1 *\"",
    )
}

async fn connection_of(app: &TestApp, user: &str) -> connection::Model {
    connection::Entity::find()
        .filter(connection::Column::UserId.eq(user))
        .one(&app.db)
        .await
        .unwrap()
        .expect("the connection")
}

async fn jobs(app: &TestApp) -> Vec<sync_job::Model> {
    sync_job::Entity::find()
        .order_by_asc(sync_job::Column::Id)
        .all(&app.db)
        .await
        .unwrap()
}

/// Queues a scheduled job of `acme` for connection `connection_id` at `slot`, as a
/// firing of the provider's schedule would.
pub(crate) async fn queue_slot_job(
    app: &TestApp,
    connection_id: i64,
    slot: chrono::DateTime<chrono::Utc>,
) {
    sync_job::ActiveModel {
        connection_id: Set(connection_id),
        provider: Set("acme".to_string()),
        stream: Set(String::new()),
        kind: Set(JobKind::Scheduled),
        slot_at: Set(Some(slot)),
        status: Set(JobStatus::Queued),
        priority: Set(JobKind::Scheduled.priority()),
        not_before: Set(Some(slot)),
        created_at: Set(slot),
        ..Default::default()
    }
    .insert(&app.db)
    .await
    .unwrap();
}

/// Queues `user`'s connection through `tributary sync --queue`; returns the job's id.
fn queue_manual(config: &std::path::Path, user: &str) -> i64 {
    let queued = run(tributary(config).args(["sync", "--queue", "--user", user, "--json"]));
    assert_eq!(queued.code, 0, "{}", queued.stderr);
    let queued: serde_json::Value = serde_json::from_str(&queued.stdout).expect("JSON");
    assert_eq!(queued.as_array().map(Vec::len), Some(1), "{queued}");
    assert_eq!(queued[0]["user_id"], user);
    queued[0]["job_id"].as_i64().expect("a job id")
}

#[tokio::test]
async fn a_queued_manual_run_starts_before_scheduled_jobs_that_were_due_earlier() {
    let app = spawn_app().await;
    for user in ["alice", "bob", "carol"] {
        mount_cursor_listing(&app.api, user, user, 1, 1, Duration::ZERO).await;
    }
    // One run at a time, so the order of claims is the order of runs.
    let providers = yearly(&app, &["alice", "bob", "carol"]).replacen(
        "kind = \"rest\"\n",
        "kind = \"rest\"\nmax_concurrent_connections = 1\n",
        1,
    );
    let config = app.write_config(&format!("{}{providers}", daemon_table(None)));
    app.settings(&providers).await;
    let earlier = chrono::Utc::now() - chrono::Duration::minutes(1);
    for user in ["alice", "bob"] {
        let connection = connection_of(&app, user).await;
        queue_slot_job(&app, connection.id, earlier).await;
    }
    let manual = queue_manual(&config, "carol");
    let mut daemon = Daemon::start(&config, app.dir.path().join("daemon.log"));
    eventually(Duration::from_secs(30), "the three jobs done", || async {
        jobs(&app)
            .await
            .iter()
            .all(|job| job.status == JobStatus::Done)
    })
    .await;
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(daemon.wait(Duration::from_secs(15)), 0, "{}", daemon.log());
    let runs = sync_run::Entity::find()
        .order_by_asc(sync_run::Column::Id)
        .all(&app.db)
        .await
        .unwrap();
    let order: Vec<&str> = runs.iter().map(|run| run.user_id.as_str()).collect();
    assert_eq!(order, ["carol", "alice", "bob"], "{runs:?}");
    let jobs = jobs(&app).await;
    let carol = jobs
        .iter()
        .find(|job| job.id == manual)
        .expect("carol's job");
    assert_eq!(carol.kind, JobKind::Manual);
    assert_eq!(
        carol.outcome.as_deref(),
        Some(format!("run {} succeeded", runs[0].id).as_str())
    );
}

#[tokio::test]
async fn a_failed_run_is_retried_after_its_backoff_until_it_succeeds() {
    let app = spawn_app().await;
    // Three answers fail (the client's own retries included), then the API recovers.
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .respond_with(ResponseTemplate::new(500).set_body_string("down"))
        .up_to_n_times(3)
        .with_priority(1)
        .mount(&app.api)
        .await;
    mount_cursor_listing(&app.api, "alice", "alice", 1, 1, Duration::ZERO).await;
    let providers = yearly(&app, &["alice"]);
    let config = app.write_config(&format!(
        "{}retries = 2\nretry_delay = \"2s\"\nretry_max_delay = \"4s\"\n{providers}",
        daemon_table(None)
    ));
    app.settings(&providers).await;
    let manual = queue_manual(&config, "alice");
    let mut daemon = Daemon::start(&config, app.dir.path().join("daemon.log"));
    eventually(Duration::from_secs(30), "a succeeded run", || async {
        runs_of(&app, "alice")
            .await
            .iter()
            .any(|run| run.status == RunStatus::Succeeded)
    })
    .await;
    eventually(Duration::from_secs(10), "the retry done", || async {
        jobs(&app).await.len() == 2 && jobs(&app).await[1].status == JobStatus::Done
    })
    .await;
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(daemon.wait(Duration::from_secs(15)), 0, "{}", daemon.log());
    let runs = runs_of(&app, "alice").await;
    let statuses: Vec<RunStatus> = runs.iter().map(|run| run.status).collect();
    assert_eq!(
        statuses,
        [RunStatus::Failed, RunStatus::Succeeded],
        "{runs:?}"
    );
    let jobs = jobs(&app).await;
    let (first, retry) = (&jobs[0], &jobs[1]);
    assert_eq!(first.id, manual);
    let outcome = first.outcome.as_deref().unwrap_or_default();
    assert!(
        outcome.starts_with(&format!("run {} failed; retry 1 queued for", runs[0].id)),
        "{outcome}"
    );
    assert_eq!(
        (retry.kind, retry.attempt),
        (JobKind::Retry, 1),
        "{retry:?}"
    );
    // Half the first backoff at least: 2 s doubled 0 times, jittered within [1 s, 2 s].
    let waited = retry.not_before.expect("a due time") - first.finished_at.expect("finished");
    assert!(
        waited >= chrono::Duration::milliseconds(990) && waited <= chrono::Duration::seconds(2),
        "{waited}"
    );
    assert!(
        runs[1].started_at >= retry.not_before.expect("a due time"),
        "{runs:?}"
    );
}

#[tokio::test]
async fn retries_end_when_they_are_spent() {
    let app = spawn_app().await;
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .respond_with(ResponseTemplate::new(500).set_body_string("down"))
        .mount(&app.api)
        .await;
    let providers = yearly(&app, &["alice"]);
    let config = app.write_config(&format!(
        "{}retries = 1\nretry_delay = \"1s\"\nretry_max_delay = \"1s\"\n{providers}",
        daemon_table(None)
    ));
    app.settings(&providers).await;
    queue_manual(&config, "alice");
    let mut daemon = Daemon::start(&config, app.dir.path().join("daemon.log"));
    eventually(Duration::from_secs(30), "the retry done", || async {
        let jobs = jobs(&app).await;
        jobs.len() == 2 && jobs[1].status == JobStatus::Done
    })
    .await;
    // Longer than any backoff: a third run would have started.
    tokio::time::sleep(Duration::from_secs(3)).await;
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(daemon.wait(Duration::from_secs(15)), 0, "{}", daemon.log());
    let runs = runs_of(&app, "alice").await;
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert!(runs.iter().all(|run| run.status == RunStatus::Failed));
    let jobs = jobs(&app).await;
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    let outcome = jobs[1].outcome.as_deref().unwrap_or_default();
    assert!(
        outcome.ends_with("; not retried: 1 retries spent"),
        "{outcome}"
    );
}

#[tokio::test]
async fn a_queued_run_that_finds_its_connection_busy_waits_for_the_lease() {
    let app = spawn_app().await;
    mount_cursor_listing(&app.api, "alice", "alice", 1, 1, Duration::ZERO).await;
    let providers = yearly(&app, &["alice"]);
    let config = app.write_config(&format!("{}{providers}", daemon_table(None)));
    app.settings(&providers).await;
    // A run of another process holds the lease for a few more seconds.
    let held_until = chrono::Utc::now() + chrono::Duration::seconds(4);
    let mut alice: connection::ActiveModel = connection_of(&app, "alice").await.into();
    alice.lease_holder = Set(Some("elsewhere:7:feed".to_string()));
    alice.lease_expires_at = Set(Some(held_until));
    alice.update(&app.db).await.unwrap();
    let manual = queue_manual(&config, "alice");
    let mut daemon = Daemon::start(&config, app.dir.path().join("daemon.log"));
    eventually(Duration::from_secs(20), "the job waiting", || async {
        let job = &jobs(&app).await[0];
        job.status == JobStatus::Queued
            && job.outcome.as_deref().is_some_and(|outcome| {
                outcome.starts_with(
                    "waiting: a run of the connection was going (held by elsewhere:7:feed)",
                )
            })
    })
    .await;
    let deferred = run(tributary(&config).args(["jobs", "--status", "deferred", "--json"]));
    let deferred: serde_json::Value = serde_json::from_str(&deferred.stdout).expect("JSON");
    assert_eq!(deferred[0]["id"], manual, "{deferred}");
    assert!(
        deferred[0]["not_before"]
            .as_str()
            .and_then(|at| at.parse::<chrono::DateTime<chrono::Utc>>().ok())
            .is_some_and(|at| at > held_until),
        "{deferred}"
    );
    eventually(Duration::from_secs(20), "the job done", || async {
        jobs(&app).await[0].status == JobStatus::Done
    })
    .await;
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(daemon.wait(Duration::from_secs(15)), 0, "{}", daemon.log());
    let runs = runs_of(&app, "alice").await;
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert!(runs[0].started_at > held_until, "{runs:?}");
    assert_eq!(app.record_ids().await, ["alice0"]);
}

#[tokio::test]
async fn a_sync_run_here_is_a_manual_job_and_the_queue_is_listed() {
    let app = spawn_app().await;
    mount_cursor_listing(&app.api, "alice", "alice", 1, 1, Duration::ZERO).await;
    let providers = yearly(&app, &["alice", "bob"]);
    let config = app.write_config(&providers);
    app.settings(&providers).await;
    let synced = run(tributary(&config).args(["sync", "--user", "alice"]));
    assert_eq!(synced.code, 0, "{}", synced.stderr);
    let jobs_now = jobs(&app).await;
    assert_eq!(jobs_now.len(), 1, "{jobs_now:?}");
    let runs = runs_of(&app, "alice").await;
    assert_eq!(
        (
            jobs_now[0].kind,
            jobs_now[0].status,
            jobs_now[0].outcome.as_deref()
        ),
        (
            JobKind::Manual,
            JobStatus::Done,
            Some(format!("run {} succeeded", runs[0].id).as_str())
        )
    );

    let queued = run(tributary(&config).args(["sync", "--queue", "--user", "bob"]));
    assert_eq!(queued.code, 0, "{}", queued.stderr);
    let job = jobs(&app).await.pop().expect("bob's job");
    assert_eq!(
        queued.stdout.trim(),
        format!("queued job {} bob@acme (every stream)", job.id)
    );
    assert_eq!((job.status, job.kind), (JobStatus::Queued, JobKind::Manual));
    let listed = run(tributary(&config).args(["jobs", "--status", "queued"]));
    assert!(listed.stdout.contains("bob"), "{}", listed.stdout);
    assert!(!listed.stdout.contains("alice"), "{}", listed.stdout);

    let next = run(tributary(&config).args(["jobs", "--next", "--json"]));
    assert_eq!(next.code, 0, "{}", next.stderr);
    let next: serde_json::Value = serde_json::from_str(&next.stdout).expect("JSON");
    let year = chrono::Datelike::year(&chrono::Utc::now()) + 1;
    assert_eq!(next[0]["user_id"], "alice", "{next}");
    assert_eq!(next[0]["queued"], 0, "{next}");
    assert_eq!(
        next[0]["next_slot"],
        format!("{year}-01-01T00:00:00Z"),
        "{next}"
    );
    assert_eq!(
        (&next[1]["user_id"], &next[1]["queued"]),
        (&"bob".into(), &1.into()),
        "{next}"
    );

    let unknown = run(tributary(&config).args(["sync", "--queue", "--provider", "nope"]));
    assert_eq!(unknown.code, 2, "{}", unknown.stderr);
    assert!(
        unknown.stderr.contains("no provider named \"nope\""),
        "{}",
        unknown.stderr
    );
    assert_eq!(jobs(&app).await.len(), 2, "nothing queued");
}

#[tokio::test]
async fn a_long_run_yields_to_the_jobs_due_and_its_rest_goes_on_from_the_checkpoint() {
    let app = spawn_app().await;
    // Alice's listing takes five slow pages; bob's is one.
    mount_cursor_listing(&app.api, "alice", "alice", 5, 2, Duration::from_millis(400)).await;
    mount_cursor_listing(&app.api, "bob", "bob", 1, 1, Duration::ZERO).await;
    let providers = yearly(&app, &["alice", "bob"]).replacen(
        "kind = \"rest\"\n",
        "kind = \"rest\"\nmax_concurrent_connections = 1\nmax_run_duration = \"1s\"\n",
        1,
    );
    let config = app.write_config(&format!("{}{providers}", daemon_table(None)));
    app.settings(&providers).await;
    let alices = queue_manual(&config, "alice");
    // Bob's slot falls due while alice's first sync is going.
    let bob = connection_of(&app, "bob").await;
    let due = chrono::Utc::now() + chrono::Duration::milliseconds(300);
    queue_slot_job(&app, bob.id, due).await;
    let mut daemon = Daemon::start(&config, app.dir.path().join("daemon.log"));
    eventually(Duration::from_secs(30), "alice synced whole", || async {
        app.record_ids().await.len() == 11
    })
    .await;
    eventually(Duration::from_secs(10), "every job done", || async {
        jobs(&app)
            .await
            .iter()
            .all(|job| job.status == JobStatus::Done)
    })
    .await;
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(daemon.wait(Duration::from_secs(15)), 0, "{}", daemon.log());
    let runs = sync_run::Entity::find()
        .order_by_asc(sync_run::Column::Id)
        .all(&app.db)
        .await
        .unwrap();
    // Alice yields after her first pages; bob, due meanwhile, goes next; alice's rest
    // follows, yielding again as often as it takes.
    let (yielded, rest) = runs.split_at(2);
    assert_eq!(
        (yielded[0].user_id.as_str(), yielded[0].status),
        ("alice", RunStatus::Partial),
        "{runs:?}"
    );
    assert_eq!(
        (yielded[1].user_id.as_str(), yielded[1].status),
        ("bob", RunStatus::Succeeded),
        "{runs:?}"
    );
    assert!(rest.iter().all(|run| run.user_id == "alice"), "{runs:?}");
    assert_eq!(
        rest.last().map(|run| run.status),
        Some(RunStatus::Succeeded)
    );
    for run in runs.iter().filter(|run| run.status == RunStatus::Partial) {
        let reason = run.error.as_deref().unwrap_or_default();
        assert!(reason.contains("past max_run_duration"), "{reason}");
        assert!(run.pages_fetched >= 1, "{runs:?}");
    }
    let alice_pages: i64 = runs
        .iter()
        .filter(|run| run.user_id == "alice")
        .map(|run| run.pages_fetched)
        .sum();
    assert_eq!(alice_pages, 5, "each went on from the checkpoint: {runs:?}");
    let jobs = jobs(&app).await;
    let first = jobs
        .iter()
        .find(|job| job.id == alices)
        .expect("alice's job");
    let outcome = first.outcome.as_deref().unwrap_or_default();
    assert!(
        outcome.ends_with("; yielded after max_run_duration, the rest queued"),
        "{outcome}"
    );
    let rest = jobs.last().expect("the rest");
    assert_eq!(
        (rest.kind, rest.connection_id),
        (JobKind::Resume, first.connection_id)
    );
}

#[tokio::test]
async fn a_backed_up_queue_runs_a_connections_latest_slot_only() {
    // Claimed together, the earlier slots are skipped as they are claimed.
    latest_slot_only(4).await;
}

#[tokio::test]
async fn a_slot_claimed_alone_is_skipped_when_a_later_one_is_due() {
    // One claim at a time: the earliest slot is claimed alone, and its claim finds the
    // later ones due.
    latest_slot_only(1).await;
}

async fn latest_slot_only(max_concurrent_connections: usize) {
    let app = spawn_app().await;
    mount_cursor_listing(&app.api, "alice", "alice", 1, 1, Duration::ZERO).await;
    let providers = yearly(&app, &["alice"]).replacen(
        "kind = \"rest\"\n",
        &format!("kind = \"rest\"\nmax_concurrent_connections = {max_concurrent_connections}\n"),
        1,
    );
    let config = app.write_config(&format!("{}{providers}", daemon_table(None)));
    app.settings(&providers).await;
    let alice = connection_of(&app, "alice").await;
    // Three slots queued while no instance ran (the queue backed up).
    let now = chrono::Utc::now();
    let slots: Vec<_> = [3, 2, 1]
        .iter()
        .map(|minutes| {
            use chrono::Timelike;
            let at = now - chrono::Duration::minutes(*minutes);
            at.with_nanosecond(0).unwrap_or(at)
        })
        .collect();
    for slot in &slots {
        queue_slot_job(&app, alice.id, *slot).await;
    }
    let mut daemon = Daemon::start(&config, app.dir.path().join("daemon.log"));
    eventually(Duration::from_secs(20), "every job ended", || async {
        jobs(&app)
            .await
            .iter()
            .all(|job| job.status != JobStatus::Queued && job.status != JobStatus::Running)
    })
    .await;
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(daemon.wait(Duration::from_secs(15)), 0, "{}", daemon.log());
    let runs = runs_of(&app, "alice").await;
    assert_eq!(runs.len(), 1, "{runs:?}");
    let ended: Vec<(JobStatus, String)> = jobs(&app)
        .await
        .into_iter()
        .map(|job| (job.status, job.outcome.unwrap_or_default()))
        .collect();
    let superseded = format!("superseded by the slot at {}, queued behind it", slots[2]);
    assert_eq!(
        ended,
        [
            (JobStatus::Skipped, superseded.clone()),
            (JobStatus::Skipped, superseded),
            (JobStatus::Done, format!("run {} succeeded", runs[0].id)),
        ]
    );
}

#[tokio::test]
async fn a_queue_backed_up_by_many_connections_skips_its_superseded_slots_without_waiting() {
    // Thirty connections, each with an old slot and a later one queued, and room for one
    // run at a time: each claim reads one old slot and skips it. Waiting a poll (a
    // second) after each such claim would run nothing for thirty seconds.
    let app = spawn_app().await;
    let users: Vec<String> = (0..30).map(|n| format!("user{n:02}")).collect();
    let names: Vec<&str> = users.iter().map(String::as_str).collect();
    for user in &names {
        mount_cursor_listing(&app.api, user, user, 1, 1, Duration::ZERO).await;
    }
    let providers = yearly(&app, &names).replacen(
        "kind = \"rest\"\n",
        "kind = \"rest\"\nmax_concurrent_connections = 1\n",
        1,
    );
    let config = app.write_config(&format!("{}{providers}", daemon_table(None)));
    app.settings(&providers).await;
    let now = chrono::Utc::now();
    let slot = |minutes: i64| {
        use chrono::Timelike;
        let at = now - chrono::Duration::minutes(minutes);
        at.with_nanosecond(0).unwrap_or(at)
    };
    for minutes in [2, 1] {
        for user in &names {
            let connection = connection_of(&app, user).await;
            queue_slot_job(&app, connection.id, slot(minutes)).await;
        }
    }
    let started = std::time::Instant::now();
    let mut daemon = Daemon::start(&config, app.dir.path().join("daemon.log"));
    eventually(Duration::from_secs(60), "every job ended", || async {
        jobs(&app)
            .await
            .iter()
            .all(|job| job.status != JobStatus::Queued && job.status != JobStatus::Running)
    })
    .await;
    let took = started.elapsed();
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(daemon.wait(Duration::from_secs(15)), 0, "{}", daemon.log());
    let ended = jobs(&app).await;
    let skipped = ended
        .iter()
        .filter(|job| job.status == JobStatus::Skipped)
        .count();
    let done = ended
        .iter()
        .filter(|job| job.status == JobStatus::Done)
        .count();
    assert_eq!((skipped, done), (30, 30), "{ended:?}");
    assert!(
        took < Duration::from_secs(20),
        "the old slots took a poll each: {took:?}"
    );
}

/// Queues a job of each of the four connections of `providers`, then lets a daemon with
/// room for `max_concurrent_runs` run them all and stops it.
async fn queue_four_and_run_them(app: &TestApp, max_concurrent_runs: usize, providers: &str) {
    let config = app.write_config(&format!(
        "{}max_concurrent_runs = {max_concurrent_runs}\n{providers}",
        daemon_table(None)
    ));
    app.settings(providers).await;
    let queued = run(tributary(&config).args(["sync", "--queue"]));
    assert_eq!(queued.code, 0, "{}", queued.stderr);
    assert_eq!(queued.stdout.lines().count(), 4, "{}", queued.stdout);
    let mut daemon = Daemon::start(&config, app.dir.path().join("daemon.log"));
    eventually(Duration::from_secs(30), "the four jobs done", || async {
        let jobs = jobs(app).await;
        jobs.len() == 4 && jobs.iter().all(|job| job.status == JobStatus::Done)
    })
    .await;
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(daemon.wait(Duration::from_secs(15)), 0, "{}", daemon.log());
}

#[tokio::test]
async fn an_instance_runs_at_most_max_concurrent_runs_jobs_at_once_over_all_providers() {
    let app = spawn_app().await;
    for user in ["alice", "bob"] {
        mount_cursor_listing(&app.api, user, user, 1, 1, Duration::from_millis(300)).await;
    }
    // Two providers on the same API, each allowed four runs at once.
    let providers = [
        yearly(&app, &["alice", "bob"]),
        yearly(&app, &["alice", "bob"]).replace("acme", "beta"),
    ]
    .join("\n");
    queue_four_and_run_them(&app, 1, &providers).await;
    let runs = sync_run::Entity::find()
        .order_by_asc(sync_run::Column::StartedAt)
        .all(&app.db)
        .await
        .unwrap();
    assert_eq!(runs.len(), 4, "{runs:?}");
    for pair in runs.windows(2) {
        let ended = pair[0].finished_at.expect("finished");
        assert!(pair[1].started_at >= ended, "two runs at once: {:?}", pair);
    }
}

#[tokio::test]
async fn an_instance_runs_at_most_max_concurrent_connections_jobs_of_a_provider_at_once() {
    use crate::concurrency::{mount_slow_pages, peak_overlap, USERS};
    let app = spawn_app().await;
    mount_slow_pages(&app, Duration::from_millis(600)).await;
    // Room for eight runs in the instance, two in the provider.
    let providers = yearly(&app, &USERS).replace(
        "schedule = \"0 0 0 1 1 *\"",
        "schedule = \"0 0 0 1 1 *\"\nmax_concurrent_connections = 2",
    );
    queue_four_and_run_them(&app, 8, &providers).await;
    assert_eq!(app.records().await.len(), 8);
    assert_eq!(peak_overlap(&app).await, 2);
}
