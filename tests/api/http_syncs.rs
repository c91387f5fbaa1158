//! Sync status, jobs and their cancelling, and the per-key rate limit, over the HTTP API
//! of real `tributary daemon` processes (several on PostgreSQL and MariaDB, where
//! instances share the database), driven by a real client.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use sea_orm::{ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, Set};
use serde_json::Value;
use tributary::entities::sync_job::{self, JobKind, JobStatus};
use tributary::entities::sync_run::RunStatus;

use crate::daemon::{eventually, runs_of};
use crate::helpers::{
    backend, cursor_provider, mount_cursor_listing, run, spawn_app, tributary, Backend, TestApp,
};
use crate::http::{assert_problem, audit_rows, query, Served};
use crate::http_feed::ids;

/// Synced once a year: only the jobs a test queues run.
fn yearly(providers: String) -> String {
    providers.replace(
        "schedule = \"0 */15 * * * *\"",
        "schedule = \"0 0 0 1 1 *\"",
    )
}

fn json(text: &str) -> Option<(&str, Vec<u8>)> {
    Some(("application/json", text.as_bytes().to_vec()))
}

async fn connection_id(app: &TestApp, user: &str) -> i64 {
    query(
        app,
        &format!("SELECT id FROM connections WHERE user_id = '{user}'"),
    )
    .await[0]
        .try_get_by_index(0)
        .expect("the connection's id")
}

async fn job(app: &TestApp, id: i64) -> sync_job::Model {
    sync_job::Entity::find_by_id(id)
        .one(&app.db)
        .await
        .expect("sync_jobs")
        .expect("the job")
}

/// Queues a manual job for `connection_id`, due in an hour, as no daemon claims it yet.
async fn queue_later(app: &TestApp, connection_id: i64) -> i64 {
    let now = chrono::Utc::now();
    sync_job::ActiveModel {
        connection_id: Set(connection_id),
        provider: Set("acme".to_string()),
        stream: Set(String::new()),
        kind: Set(JobKind::Manual),
        status: Set(JobStatus::Queued),
        priority: Set(JobKind::Manual.priority()),
        not_before: Set(Some(now + chrono::TimeDelta::hours(1))),
        created_at: Set(now),
        ..Default::default()
    }
    .insert(&app.db)
    .await
    .expect("job queued")
    .id
}

/// Queues `count` manual jobs for `connection_id`, due in an hour; their ids, the newest
/// first.
async fn queue_later_many(app: &TestApp, connection_id: i64, count: usize) -> Vec<i64> {
    let mut ids = Vec::with_capacity(count);
    for _ in 0..count {
        ids.push(queue_later(app, connection_id).await);
    }
    ids.reverse();
    ids
}

#[tokio::test]
async fn a_connections_sync_status_shows_its_runs_jobs_schedule_and_health_as_the_cli_does() {
    let app = spawn_app().await;
    mount_cursor_listing(&app.api, "alice", "alice_", 1, 2, Duration::ZERO).await;
    // Bob's listing is not served: his runs fail.
    let providers = yearly(cursor_provider("acme", &app.api.uri(), &["alice", "bob"]));
    let settings = app.settings(&providers).await;
    app.sync(&settings).await;
    app.sync(&settings).await;
    let served = Served::start(&app, &providers).await;
    let reader = served.create_key("reader", &["connections:read"]);
    let records = served.create_key("records", &["records:read"]);
    let (alice, bob) = (
        connection_id(&app, "alice").await,
        connection_id(&app, "bob").await,
    );
    let own = run(tributary(&served.config).args([
        "connections",
        "schedule",
        "--provider",
        "acme",
        "--user",
        "bob",
        "--cron",
        "0 0 5 * * *",
    ]));
    assert_eq!(own.code, 0, "{}", own.stderr);
    let later = queue_later(&app, alice).await;

    let (status, body) = served
        .get(&format!("/v1/connections/{alice}/syncs"), &reader)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (&body["connection_id"], &body["user_id"], &body["health"]),
        (&alice.into(), &"alice".into(), &"healthy".into()),
        "{body}"
    );
    let stream = &body["streams"][0];
    assert_eq!(stream["stream"], "records", "{body}");
    assert_eq!(stream["health"], "healthy");
    assert_eq!(stream["last_run"]["status"], "succeeded");
    assert_eq!(stream["last_run"]["records_fetched"], 2);
    assert_eq!(stream["last_success_run_id"], stream["last_run"]["id"]);
    assert!(stream["running"].is_null(), "{stream}");
    assert_eq!(
        (&stream["schedule"], &stream["schedule_from"]),
        (&"0 0 0 1 1 *".into(), &"provider".into())
    );
    assert!(stream["next_slot"].is_string(), "{stream}");
    assert_eq!(stream["unfinished_run"], false);
    assert_eq!(body["jobs"].as_array().map(Vec::len), Some(1), "{body}");
    assert_eq!(
        (&body["jobs"][0]["id"], &body["jobs"][0]["status"]),
        (&later.into(), &"queued".into())
    );
    assert!(body["jobs_next"].is_null(), "one page holds them: {body}");

    let (status, body) = served
        .get(&format!("/v1/connections/{bob}/syncs"), &reader)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let stream = &body["streams"][0];
    assert_eq!(body["health"], "failing", "{body}");
    assert_eq!(stream["failures_in_a_row"], 2, "{stream}");
    assert_eq!(stream["last_run"]["status"], "failed");
    assert!(stream["last_run"]["error"].is_string(), "{stream}");
    assert!(stream["last_success_run_id"].is_null(), "{stream}");
    assert_eq!(
        (&stream["schedule"], &stream["schedule_from"]),
        (&"0 0 5 * * *".into(), &"connection".into())
    );
    // The CLI shows the same status, from the same operation.
    let cli = run(tributary(&served.config).args([
        "connections",
        "status",
        "--provider",
        "acme",
        "--user",
        "bob",
        "--json",
    ]));
    assert_eq!(cli.code, 0, "{}", cli.stderr);
    let cli: Value = serde_json::from_str(&cli.stdout).expect("status --json");
    assert_eq!(cli["streams"], body["streams"]);
    assert_eq!(cli["health"], body["health"]);
    let table = run(tributary(&served.config).args([
        "connections",
        "status",
        "--provider",
        "acme",
        "--user",
        "bob",
    ]));
    assert_eq!(table.code, 0, "{}", table.stderr);
    assert!(
        table.stdout.contains("failing (2 failed in a row)"),
        "{}",
        table.stdout
    );

    for (path, key, expected) in [
        (
            "/v1/connections/999999/syncs",
            &reader,
            StatusCode::NOT_FOUND,
        ),
        (
            "/v1/connections/abc/syncs",
            &reader,
            StatusCode::BAD_REQUEST,
        ),
        (
            &*format!("/v1/connections/{alice}/syncs"),
            &records,
            StatusCode::FORBIDDEN,
        ),
        ("/v1/jobs/999999", &reader, StatusCode::NOT_FOUND),
    ] {
        let (status, body) = served.get(path, key).await;
        assert_eq!(status, expected, "{path}: {body}");
    }
    let (status, body) = served.get(&format!("/v1/jobs/{later}"), &reader).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (&body["connection_id"], &body["kind"], &body["status"]),
        (&alice.into(), &"manual".into(), &"queued".into())
    );
}

#[tokio::test]
async fn the_jobs_are_listed_newest_first_by_their_filters_a_page_at_a_time_as_the_cli_lists_them()
{
    let app = spawn_app().await;
    let providers = yearly(cursor_provider("acme", &app.api.uri(), &["alice", "bob"]));
    let served = Served::start(&app, &providers).await;
    let reader = served.create_key("reader", &["connections:read"]);
    let records = served.create_key("records", &["records:read"]);
    let (alice, bob) = (
        connection_id(&app, "alice").await,
        connection_id(&app, "bob").await,
    );
    let alices = queue_later_many(&app, alice, 3).await;
    let bobs = queue_later_many(&app, bob, 1).await;
    // Alice's oldest job ended: it is listed, but not among the active ones.
    let done = alices[2];
    sync_job::Entity::update_many()
        .col_expr(
            sync_job::Column::Status,
            sea_orm::sea_query::Expr::value(JobStatus::Done.to_string()),
        )
        .filter(sync_job::Column::Id.eq(done))
        .exec(&app.db)
        .await
        .expect("job ended");

    // Every job, newest first, two a page.
    let (status, first) = served.get("/v1/jobs?limit=2", &reader).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(ids(&first), [bobs[0], alices[0]], "{first}");
    let next = first["next"].as_str().expect("next");
    let (status, second) = served
        .get(&format!("/v1/jobs?limit=2&cursor={next}"), &reader)
        .await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(ids(&second), [alices[1], alices[2]], "{second}");
    assert!(second["next"].is_null(), "{second}");
    assert_eq!(second["items"][1]["status"], "done", "{second}");
    assert_eq!(second["items"][1]["user_id"], "alice", "{second}");

    // By connection and state, as `tributary jobs` lists them.
    let path = format!("/v1/jobs?connection_id={alice}&status=active&limit=1");
    let (status, active) = served.get(&path, &reader).await;
    assert_eq!(status, StatusCode::OK, "{active}");
    assert_eq!(ids(&active), [alices[0]], "{active}");
    let next = active["next"].as_str().expect("next");
    let (_, rest) = served.get(&format!("{path}&cursor={next}"), &reader).await;
    assert_eq!(ids(&rest), [alices[1]], "{rest}");
    assert!(rest["next"].is_null(), "{rest}");
    let cli = run(tributary(&served.config).args([
        "jobs",
        "--connection",
        &alice.to_string(),
        "--status",
        "active",
        "--json",
    ]));
    assert_eq!(cli.code, 0, "{}", cli.stderr);
    let cli: Value = serde_json::from_str(&cli.stdout).expect("jobs --json");
    let cli_ids: Vec<i64> = cli
        .as_array()
        .expect("jobs")
        .iter()
        .filter_map(|job| job["id"].as_i64())
        .collect();
    assert_eq!(cli_ids, [alices[0], alices[1]], "{cli}");
    let (_, ended) = served.get("/v1/jobs?status=done", &reader).await;
    assert_eq!(ids(&ended), [done], "{ended}");
    let (_, deferred) = served
        .get(
            &format!("/v1/jobs?status=deferred&connection_id={bob}"),
            &reader,
        )
        .await;
    assert_eq!(ids(&deferred), bobs, "due in an hour: {deferred}");

    // A cursor is good only for the filters it was issued under; bad input names its
    // parameter; the list needs connections:read.
    let other = format!("/v1/jobs?status=done&cursor={next}");
    for (path, field) in [
        (other.as_str(), "cursor"),
        ("/v1/jobs?cursor=abc", "cursor"),
        ("/v1/jobs?status=sleeping", "status"),
        ("/v1/jobs?limit=0", "limit"),
        ("/v1/jobs?limit=1001", "limit"),
        ("/v1/jobs?connection_id=0", "connection_id"),
        ("/v1/jobs?connection_id=x", "connection_id"),
        ("/v1/jobs?page=2", "page"),
    ] {
        let (status, body) = served.get(path, &reader).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
        assert_eq!(body["field"], field, "{path}: {body}");
    }
    let (status, body) = served.get("/v1/jobs", &records).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
}

#[tokio::test]
async fn a_streams_sync_status_shows_where_its_next_incremental_run_starts() {
    use wiremock::matchers::{header, method, path, query_param};
    let app = spawn_app().await;
    wiremock::Mock::given(method("GET"))
        .and(path("/v1/items"))
        .and(header("authorization", "Bearer token-alice"))
        .and(query_param("updated_since", "2024-01-01T00:00:00Z"))
        .respond_with(
            wiremock::ResponseTemplate::new(200).set_body_json(serde_json::json!({
                "data": [
                    {"id": "a", "updated_at": "2026-11-01T10:00:00Z"},
                    {"id": "b", "updated_at": "2026-11-03T10:00:00Z"},
                ],
                "has_more": false,
            })),
        )
        .mount(&app.api)
        .await;
    let providers = yearly(format!(
        "[providers.acme]\nkind = \"rest\"\nbase_url = \"{}\"\npath = \"/v1/items\"\n\
         schedule = \"0 */15 * * * *\"\nrecords_path = \"data\"\nid_field = \"id\"\n\
         incremental = {{ cursor_field = \"updated_at\", param = \"updated_since\", \
         start = \"2024-01-01T00:00:00Z\" }}\n\
         [providers.acme.pagination]\ntype = \"has_more\"\nafter_param = \"after\"\n{}",
        app.api.uri(),
        crate::helpers::connections("acme", &["alice", "bob"])
    ));
    let settings = app.settings(&providers).await;
    // bob's listing is not served: his run fails and leaves no cursor.
    app.sync(&settings).await;
    let served = Served::start(&app, &providers).await;
    let reader = served.create_key("reader", &["connections:read"]);

    let cursor_of = |user: &'static str| {
        let (app, served, reader) = (&app, &served, &reader);
        async move {
            let id = connection_id(app, user).await;
            let (status, body) = served
                .get(&format!("/v1/connections/{id}/syncs"), reader)
                .await;
            assert_eq!(status, StatusCode::OK, "{body}");
            body["streams"][0]["cursor"].clone()
        }
    };
    assert_eq!(
        cursor_of("alice").await,
        r#"{"time":"2026-11-03T10:00:00Z"}"#,
        "the latest updated_at alice's run stored"
    );
    assert!(cursor_of("bob").await.is_null());
    let stored: Option<String> = query(
        &app,
        "SELECT cs.cursor FROM connection_streams cs \
         JOIN connections c ON c.id = cs.connection_id WHERE c.user_id = 'alice'",
    )
    .await[0]
        .try_get_by_index(0)
        .expect("the stream's cursor");
    assert_eq!(cursor_of("alice").await.as_str(), stored.as_deref());
}

#[tokio::test]
async fn a_queued_job_cancelled_never_runs_and_an_ended_job_cannot_be_cancelled() {
    let app = spawn_app().await;
    for user in ["alice", "bob"] {
        mount_cursor_listing(&app.api, user, &format!("{user}_"), 1, 1, Duration::ZERO).await;
    }
    let providers = yearly(cursor_provider("acme", &app.api.uri(), &["alice", "bob"]));
    let config = app.write_config(&providers);
    // Queued while no daemon runs, due at once, and cancelled from the CLI.
    let queued = run(tributary(&config).args(["sync", "--queue", "--user", "alice", "--json"]));
    assert_eq!(queued.code, 0, "{}", queued.stderr);
    let queued: Value = serde_json::from_str(&queued.stdout).expect("JSON");
    let first = queued[0]["job_id"].as_i64().expect("a job id");
    let cancelled = run(tributary(&config).args(["jobs", "cancel", &first.to_string()]));
    assert_eq!(cancelled.code, 0, "{}", cancelled.stderr);
    assert!(
        cancelled.stdout.contains("cancelled; it never ran"),
        "{}",
        cancelled.stdout
    );

    let served = Served::start(&app, &providers).await;
    let syncs = served.create_key("syncer", &["syncs:write"]);
    let reader = served.create_key("reader", &["connections:read"]);
    let alice = connection_id(&app, "alice").await;
    let later = queue_later(&app, alice).await;
    let (status, headers, body) = served
        .call(
            Method::POST,
            &format!("/v1/jobs/{later}/cancel"),
            Some(&reader),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_problem(status, &headers, &body);
    let (status, _, body) = served
        .call(
            Method::POST,
            &format!("/v1/jobs/{later}/cancel"),
            Some(&syncs),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "cancelled", "{body}");
    assert!(body["finished_at"].is_string(), "{body}");

    // A job of bob's runs meanwhile: the worker polls every second, so three seconds show
    // the cancelled jobs left alone.
    let bob = connection_id(&app, "bob").await;
    let (status, _, body) = served
        .call(
            Method::POST,
            &format!("/v1/connections/{bob}/syncs"),
            Some(&syncs),
            json("{}"),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let done = body["job_id"].as_i64().expect("a job id");
    eventually(Duration::from_secs(20), "bob's job done", || async {
        job(&app, done).await.status == JobStatus::Done
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        runs_of(&app, "alice").await.is_empty(),
        "a cancelled job ran"
    );
    for id in [first, later] {
        let (status, body) = served.get(&format!("/v1/jobs/{id}"), &reader).await;
        assert_eq!(
            (status, &body["status"]),
            (StatusCode::OK, &"cancelled".into()),
            "{body}"
        );
    }

    for (id, ended) in [(first, "cancelled"), (done, "done")] {
        let (status, headers, body) = served
            .call(
                Method::POST,
                &format!("/v1/jobs/{id}/cancel"),
                Some(&syncs),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        assert_problem(status, &headers, &body);
        assert!(
            body["detail"]
                .as_str()
                .is_some_and(|detail| detail.contains(&format!("has ended ({ended})"))),
            "{body}"
        );
    }
    let (status, _, _) = served
        .call(Method::POST, "/v1/jobs/999999/cancel", Some(&syncs), None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let again = run(tributary(&config).args(["jobs", "cancel", &done.to_string()]));
    assert_ne!(again.code, 0);
    assert!(
        again.stderr.contains("has ended (done)"),
        "{}",
        again.stderr
    );
    // Every cancel through the API is audited, refused or not.
    let audit: Vec<(String, String, i32)> = audit_rows(&app)
        .await
        .into_iter()
        .filter(|(_, _, path, _)| path.ends_with("/cancel"))
        .map(|(_, method, path, status)| (method, path, status))
        .collect();
    let cancel =
        |id: i64, status: i32| ("POST".to_string(), format!("/v1/jobs/{id}/cancel"), status);
    assert_eq!(
        audit,
        [
            cancel(later, 403),
            cancel(later, 200),
            cancel(first, 409),
            cancel(done, 409),
            cancel(999_999, 404),
        ]
    );
}

#[tokio::test]
async fn a_running_job_cancelled_through_the_api_stops_between_pages_on_the_instance_running_it() {
    const PAGES: usize = 60;
    let app = spawn_app().await;
    // A slow provider: 60 pages of two records, each answered after 700 ms.
    mount_cursor_listing(
        &app.api,
        "alice",
        "alice_",
        PAGES,
        2,
        Duration::from_millis(700),
    )
    .await;
    let providers = yearly(cursor_provider("acme", &app.api.uri(), &["alice"]));
    let worker = Served::start_named(&app, &providers, "worker").await;
    let syncs = worker.create_key("syncer", &["syncs:write"]);
    let reader = worker.create_key("reader", &["connections:read"]);
    let alice = connection_id(&app, "alice").await;
    let (status, _, body) = worker
        .call(
            Method::POST,
            &format!("/v1/connections/{alice}/syncs"),
            Some(&syncs),
            json("{}"),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let job_id = body["job_id"].as_i64().expect("a job id");
    eventually(Duration::from_secs(20), "two pages committed", || async {
        app.record_ids().await.len() >= 4
    })
    .await;
    // On a server database the cancel goes to another instance, which holds nothing of
    // the job; SQLite has one daemon per file, which serves the API too.
    let front = match backend() {
        Backend::Sqlite => None,
        _ => Some(Served::start_named(&app, &providers, "front").await),
    };
    let front = front.as_ref().unwrap_or(&worker);

    // A hundred newer jobs fill the status's first page of jobs: the running one is
    // still its stream's `running_job_id`, and on the jobs list the page after.
    let queued = queue_later_many(&app, alice, 100).await;
    let (status, body) = front
        .get(&format!("/v1/connections/{alice}/syncs"), &reader)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let stream = &body["streams"][0];
    assert_eq!(stream["running"]["status"], "running", "{body}");
    assert_eq!(stream["running_job_id"], job_id, "{body}");
    let listed: Vec<i64> = body["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .filter_map(|job| job["id"].as_i64())
        .collect();
    assert_eq!(listed, queued, "the newest first");
    let next = body["jobs_next"].as_str().expect("jobs_next");
    let (status, page) = front
        .get(
            &format!("/v1/jobs?connection_id={alice}&status=active&cursor={next}"),
            &reader,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(
        (&page["items"][0]["id"], &page["items"][0]["status"]),
        (&job_id.into(), &"running".into()),
        "{page}"
    );
    assert_eq!(page["items"].as_array().map(Vec::len), Some(1), "{page}");
    assert!(page["next"].is_null(), "{page}");
    sync_job::Entity::delete_many()
        .filter(sync_job::Column::Id.is_in(queued))
        .exec(&app.db)
        .await
        .expect("the newer jobs removed");
    let run_id = stream["running"]["id"].as_i64().expect("the run's id");

    let pages_before = app.run_row(run_id).await.pages_fetched;
    let asked = Instant::now();
    let (status, _, body) = front
        .call(
            Method::POST,
            &format!("/v1/jobs/{job_id}/cancel"),
            Some(&syncs),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["status"], "running", "{body}");
    assert!(body["cancel_requested_at"].is_string(), "{body}");
    eventually(Duration::from_secs(15), "the job cancelled", || async {
        job(&app, job_id).await.status == JobStatus::Cancelled
    })
    .await;
    let took = asked.elapsed();

    let (status, body) = front.get(&format!("/v1/jobs/{job_id}"), &reader).await;
    assert_eq!(
        (status, &body["status"]),
        (StatusCode::OK, &"cancelled".into()),
        "{body}"
    );
    assert!(
        body["outcome"]
            .as_str()
            .is_some_and(|outcome| outcome.contains("cancelled on request")),
        "{body}"
    );
    let stopped = app.run_row(run_id).await;
    assert_eq!(stopped.status, RunStatus::Interrupted, "{stopped:?}");
    // The poll (a second) and the page in flight (0.7 s): a page or two, three at most on
    // a loaded machine; never the rest of the listing.
    assert!(
        stopped.pages_fetched <= pages_before + 3,
        "{} pages before the cancel, {} after, in {took:?}",
        pages_before,
        stopped.pages_fetched
    );
    // The committed pages stay, and the checkpoint points past them.
    let kept = app.record_ids().await.len();
    assert_eq!(
        i64::try_from(kept).expect("count"),
        stopped.pages_fetched * 2,
        "{stopped:?}"
    );
    assert!(
        app.stream_checkpoint().await.is_some(),
        "no checkpoint kept"
    );
    // Not failed, so not retried: no other job for the connection.
    let jobs = sync_job::Entity::find()
        .filter(sync_job::Column::ConnectionId.eq(alice))
        .all(&app.db)
        .await
        .expect("jobs");
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert!(
        worker.daemon.log().contains("Job asked to cancel"),
        "{}",
        worker.daemon.log()
    );
    let audit = audit_rows(&app).await;
    assert!(
        audit
            .iter()
            .any(|(_, method, path, status)| method == "POST"
                && *path == format!("/v1/jobs/{job_id}/cancel")
                && *status == 202),
        "{audit:#?}"
    );
}

#[tokio::test]
async fn a_key_past_its_rate_limit_is_answered_429_with_retry_after_until_its_window_rolls_over() {
    const WINDOW_MS: i64 = 4_000;
    let app = spawn_app().await;
    let providers = yearly(cursor_provider("acme", &app.api.uri(), &["alice"]));
    let limit = |text: String| {
        text.replace(
            "max_body_bytes = 1024\n",
            "max_body_bytes = 1024\nrate_limit = \"5/4s\"\n",
        )
    };
    let first = Served::start_with(&app, &providers, "first", limit).await;
    // Instances behind one load balancer share each key's count.
    let second = match backend() {
        Backend::Sqlite => None,
        _ => Some(Served::start_with(&app, &providers, "second", limit).await),
    };
    let instances: Vec<&Served> = std::iter::once(&first).chain(second.as_ref()).collect();
    let limited = first.create_key("limited", &["connections:read"]);
    let other = first.create_key("other", &["connections:read"]);
    // A key of its own limit, and one refused for a limit that does not parse.
    let create = |limit: &str| {
        run(tributary(&first.config).args([
            "api-keys",
            "create",
            "--name",
            &format!("own {limit}"),
            "--scope",
            "connections:read",
            "--rate-limit",
            limit,
        ]))
    };
    let refused = create("2/fortnight");
    assert_ne!(refused.code, 0);
    assert!(refused.stderr.contains("rate_limit"), "{}", refused.stderr);
    let created = create("2/4s");
    assert_eq!(created.code, 0, "{}", created.stderr);
    let own = created
        .stdout
        .lines()
        .find(|line| line.starts_with("trb_"))
        .expect("the key printed")
        .to_string();

    // Start early in a window, so that the six requests fall in one.
    while !(200..1_000).contains(&chrono::Utc::now().timestamp_millis().rem_euclid(WINDOW_MS)) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for turn in 0..5 {
        let served = instances[turn % instances.len()];
        let (status, body) = served.get("/v1/connections", &limited).await;
        assert_eq!(status, StatusCode::OK, "request {turn}: {body}");
    }
    let last = instances[5 % instances.len()];
    let (status, headers, body) = last
        .call(Method::GET, "/v1/connections", Some(&limited), None)
        .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_problem(status, &headers, &body);
    assert_eq!(body["type"], "urn:tributary:problem:rate-limited");
    assert!(
        body["detail"]
            .as_str()
            .is_some_and(|detail| detail.contains("rate_limit")),
        "{body}"
    );
    let retry_after: u64 = headers
        .get("retry-after")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse().ok())
        .expect("a Retry-After in seconds");
    assert!((1..=4).contains(&retry_after), "{retry_after}");
    // Another key has its own count, and a key of its own limit that limit.
    let (status, body) = last.get("/v1/connections", &other).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    for expected in [
        StatusCode::OK,
        StatusCode::OK,
        StatusCode::TOO_MANY_REQUESTS,
    ] {
        let (status, body) = last.get("/v1/connections", &own).await;
        assert_eq!(status, expected, "{body}");
    }
    // Once the window rolls over, the key is served again.
    tokio::time::sleep(Duration::from_secs(retry_after)).await;
    let (status, body) = last.get("/v1/connections", &limited).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}
