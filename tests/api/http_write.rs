//! Connections written over the HTTP API of a real daemon: created with their tokens
//! (sealed, never shown), changed, deleted with or without their records, on two
//! instances at once, and every route against every scope.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
use serde_json::{json, Value};
use tributary::entities::change::ChangeKind;
use tributary::entities::{connection, sync_job};
use tributary::pipeline::changes::Cursor;

use crate::daemon::eventually;
use crate::helpers::{
    backend, cursor_provider, mount_cursor_listing, read_feed, spawn_app, Backend, TestApp,
};
use crate::http::{assert_problem, audit_rows, query, Served};

const ALL_SCOPES: [&str; 8] = [
    "connections:read",
    "connections:write",
    "syncs:write",
    "records:read",
    "notifications:read",
    "notifications:write",
    "webhooks:read",
    "admin",
];

fn json_body(body: &Value) -> Option<(&'static str, Vec<u8>)> {
    Some(("application/json", body.to_string().into_bytes()))
}

/// `acme` with `users` in config.toml, synced once a year so that only the runs asked
/// for run.
fn yearly(app: &TestApp, users: &[&str]) -> String {
    cursor_provider("acme", &app.api.uri(), users).replace(
        "schedule = \"0 */15 * * * *\"",
        "schedule = \"0 0 0 1 1 *\"",
    )
}

async fn connection_row(app: &TestApp, user: &str) -> Option<connection::Model> {
    connection::Entity::find()
        .filter(connection::Column::UserId.eq(user))
        .one(&app.db)
        .await
        .expect("connections")
}

async fn create(served: &Served, key: &str, body: Value) -> (StatusCode, Value) {
    let (status, headers, json) = served
        .call(Method::POST, "/v1/connections", Some(key), json_body(&body))
        .await;
    if !status.is_success() {
        assert_problem(status, &headers, &json);
    }
    (status, json)
}

/// Queues a sync of connection `id` through the API and waits until its job is done.
async fn sync_through_api(app: &TestApp, served: &Served, key: &str, id: i64) {
    let (status, _, job) = served
        .call(
            Method::POST,
            &format!("/v1/connections/{id}/syncs"),
            Some(key),
            json_body(&json!({})),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{job}");
    let job_id = job["job_id"].as_i64().expect("a job id");
    eventually(Duration::from_secs(30), "the job done", || async {
        sync_job::Entity::find_by_id(job_id)
            .one(&app.db)
            .await
            .expect("sync_jobs")
            .is_some_and(|job| job.status == sync_job::JobStatus::Done)
    })
    .await;
}

#[tokio::test]
async fn a_connection_created_over_the_api_is_stored_sealed_and_shown_without_its_secrets() {
    let app = spawn_app().await;
    let served = Served::start(&app, &yearly(&app, &["alice"])).await;
    let writer = served.create_key("writer", &["connections:read", "connections:write"]);
    let token = "tok-dora-5f1c0a9e7b";
    let refresh = "refresh-dora-93be1d";

    // Refused bodies name their field, quote no secret and write nothing.
    for (body, status, field) in [
        (
            json!({"provider": "nope", "user_id": "dora", "token": token}),
            StatusCode::BAD_REQUEST,
            "provider",
        ),
        (
            json!({"provider": "acme", "user_id": "dora"}),
            StatusCode::BAD_REQUEST,
            "token",
        ),
        (
            json!({"provider": "acme", "user_id": "do\u{0}ra", "token": token}),
            StatusCode::BAD_REQUEST,
            "user_id",
        ),
        (
            json!({"provider": "acme", "user_id": "dora", "token": {"value": token}}),
            StatusCode::BAD_REQUEST,
            "token",
        ),
        (
            json!({"provider": "acme", "user_id": "dora", "token": token, "token_env": "HOME"}),
            StatusCode::BAD_REQUEST,
            "token_env",
        ),
        (
            json!({"provider": "acme", "user_id": "dora", "token": token,
                   "streams": {"wikis": {"schedule": "0 0 * * * *"}}}),
            StatusCode::BAD_REQUEST,
            "streams",
        ),
        (
            json!({"provider": "acme", "user_id": "dora", "token": token, "schedule": "often"}),
            StatusCode::BAD_REQUEST,
            "schedule",
        ),
        (
            json!({"provider": "acme", "user_id": "alice", "token": token}),
            StatusCode::CONFLICT,
            "",
        ),
    ] {
        let (got, problem) = create(&served, &writer, body.clone()).await;
        assert_eq!(got, status, "{body}: {problem}");
        assert_eq!(
            problem["field"].as_str().unwrap_or_default(),
            field,
            "{body}: {problem}"
        );
        assert!(!problem.to_string().contains(token), "{problem}");
    }
    assert!(connection_row(&app, "dora").await.is_none());
    // PostgreSQL cannot compare with a NUL: refused before the database, on every backend.
    for path in [
        "/v1/connections?user_id=a%00b",
        "/v1/connections?provider=%00",
        "/v1/runs?user_id=a%00b",
        "/v1/runs?stream=%00",
    ] {
        let (status, problem) = served.get(path, &writer).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {problem}");
        assert!(problem["field"].is_string(), "{path}: {problem}");
    }

    let (status, created) = create(
        &served,
        &writer,
        json!({
            "provider": "acme",
            "user_id": "dora",
            "token": token,
            "refresh_token": refresh,
            "expires_at": 4_102_444_800_i64,
            "schedule": "0 0 * * * *",
            "streams": {"records": {"schedule": "0 30 * * * *"}},
        }),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["id"].as_i64().expect("an id");
    assert_eq!(
        (
            &created["user_id"],
            &created["defined_in"],
            &created["enabled"]
        ),
        (&json!("dora"), &json!("cli"), &json!(true))
    );
    assert_eq!(created["schedule"], "0 0 * * * *");
    assert_eq!(created["streams"][0]["schedule"], "0 30 * * * *");

    let (status, shown) = served.get(&format!("/v1/connections/{id}"), &writer).await;
    assert_eq!(status, StatusCode::OK, "{shown}");
    assert_eq!(shown, created);
    assert!(
        shown["credentials"]
            .as_str()
            .is_some_and(|c| c.contains("sealed")),
        "{shown}"
    );
    let (_, listed) = served.get("/v1/connections", &writer).await;
    for text in [created.to_string(), listed.to_string()] {
        assert!(!text.contains(token) && !text.contains(refresh), "{text}");
    }

    // The column holds the sealed form, which opens to the tokens sent.
    let row = connection_row(&app, "dora").await.expect("dora's row");
    assert!(row.credentials.starts_with("sealed:"), "not sealed");
    assert!(!row.credentials.contains(token) && !row.credentials.contains(refresh));
    let stored = app.stored_credentials("dora", "acme").await;
    assert_eq!(stored.token.as_deref(), Some(token));
    assert_eq!(stored.refresh_token.as_deref(), Some(refresh));
    assert_eq!(stored.expires_at, Some(4_102_444_800));
    assert_eq!(row.schedule.as_deref(), Some("0 0 * * * *"));

    // The same connection again is a conflict, as `connections add` answers.
    let (status, problem) = create(
        &served,
        &writer,
        json!({"provider": "acme", "user_id": "dora", "token": "other"}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("already exists")),
        "{problem}"
    );

    // Creates of one connection at once: one is created, the others are conflicts (the
    // unique index refuses what the lookup did not see), none a server error.
    let racing = json!({"provider": "acme", "user_id": "racer", "token": "t"});
    let answers =
        futures::future::join_all((0..6).map(|_| create(&served, &writer, racing.clone()))).await;
    let mut statuses: Vec<u16> = answers.iter().map(|(status, _)| status.as_u16()).collect();
    statuses.sort();
    assert_eq!(statuses, [201, 409, 409, 409, 409, 409], "{answers:?}");

    // PATCH: disable, pause, the connection's schedule back to the provider's, the
    // stream's changed; an unknown stream changes nothing.
    let path = format!("/v1/connections/{id}");
    let (status, _, problem) = served
        .call(
            Method::PATCH,
            &path,
            Some(&writer),
            json_body(&json!({"paused": true, "streams": {"wikis": {"schedule": null}}})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");
    assert_eq!(problem["field"], "streams", "{problem}");
    // A body must be an object: serde would read `[true, true]` as paused and enabled.
    let (status, _, problem) = served
        .call(
            Method::PATCH,
            &path,
            Some(&writer),
            Some(("application/json", b" [true, true]".to_vec())),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("JSON object")),
        "{problem}"
    );
    let row = connection_row(&app, "dora").await.expect("dora's row");
    assert!(row.paused_at.is_none(), "a refused change wrote");
    let (status, _, changed) = served
        .call(
            Method::PATCH,
            &path,
            Some(&writer),
            json_body(&json!({
                "enabled": false,
                "paused": true,
                "schedule": null,
                "streams": {"records": {"schedule": "0 45 * * * *"}},
            })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{changed}");
    assert_eq!(changed["enabled"], false, "{changed}");
    assert!(changed["paused_at"].is_string(), "{changed}");
    assert!(changed["schedule"].is_null(), "{changed}");
    assert_eq!(changed["streams"][0]["schedule"], "0 45 * * * *");
    let row = connection_row(&app, "dora").await.expect("dora's row");
    assert_eq!((row.enabled, row.schedule), (false, None));
    let (_, _, changed) = served
        .call(
            Method::PATCH,
            &path,
            Some(&writer),
            json_body(&json!({"streams": {"records": {"schedule": null}}})),
        )
        .await;
    assert!(changed["streams"][0]["schedule"].is_null(), "{changed}");
    let schedules = query(&app, "SELECT stream FROM stream_schedules").await;
    assert!(
        schedules.is_empty(),
        "{} stream schedules left",
        schedules.len()
    );
    // config.toml's connections are enabled there.
    let alice = connection_row(&app, "alice").await.expect("alice").id;
    let (status, _, problem) = served
        .call(
            Method::PATCH,
            &format!("/v1/connections/{alice}"),
            Some(&writer),
            json_body(&json!({"enabled": false})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{problem}");

    let log = served.daemon.log();
    assert!(
        !log.contains(token) && !log.contains(refresh),
        "a token in the log"
    );
    let audit = audit_rows(&app).await;
    let posts: Vec<i32> = audit
        .iter()
        .filter(|row| row.1 == "POST" && row.2 == "/v1/connections")
        .map(|row| row.3)
        .collect();
    assert_eq!(
        &posts[..10],
        [400, 400, 400, 400, 400, 400, 400, 409, 201, 409]
    );
    assert_eq!(posts.len(), 16, "{posts:?}");
    assert!(
        audit.iter().all(|row| !format!("{row:?}").contains(token)),
        "{audit:?}"
    );
}

#[tokio::test]
async fn without_a_secrets_key_a_token_is_refused_unless_plaintext_is_allowed() {
    let app = spawn_app().await;
    let no_key = |text: String| {
        let line = format!("key_file = \"{}\"\n", app.key_file.display());
        text.replace(&line, "")
    };
    let served = Served::start_with(&app, &yearly(&app, &[]), "no-key", no_key).await;
    let writer = served.create_key("writer", &["connections:write"]);
    let (status, problem) = create(
        &served,
        &writer,
        json!({"provider": "acme", "user_id": "erin", "token": "tok-erin"}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{problem}");
    assert_eq!(problem["field"], "token", "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("no secrets key is configured")),
        "{problem}"
    );
    assert!(!problem.to_string().contains("tok-erin"), "{problem}");
    assert!(connection_row(&app, "erin").await.is_none());
    drop(served);

    let plaintext = |text: String| {
        let line = format!("key_file = \"{}\"\n", app.key_file.display());
        text.replace(&line, "allow_plaintext = true\n")
    };
    let served = Served::start_with(&app, &yearly(&app, &[]), "plain", plaintext).await;
    let (status, created) = create(
        &served,
        &writer,
        json!({"provider": "acme", "user_id": "erin", "token": "tok-erin"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert!(!created.to_string().contains("tok-erin"), "{created}");
}

#[tokio::test]
async fn deleting_a_connection_keeps_or_deletes_its_records_and_deletions_enter_the_feed() {
    let app = spawn_app().await;
    for user in ["bob", "carol"] {
        mount_cursor_listing(&app.api, user, &format!("{user}_"), 1, 2, Duration::ZERO).await;
    }
    let served = Served::start(&app, &yearly(&app, &["alice"])).await;
    let key = served.create_key(
        "writer",
        &["connections:read", "connections:write", "syncs:write"],
    );
    let mut ids = Vec::new();
    for user in ["bob", "carol"] {
        let token = format!("token-{user}");
        let (status, created) = create(
            &served,
            &key,
            json!({"provider": "acme", "user_id": user, "token": token}),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{created}");
        let id = created["id"].as_i64().expect("an id");
        sync_through_api(&app, &served, &key, id).await;
        ids.push(id);
    }
    let (bob, carol) = (ids[0], ids[1]);
    assert_eq!(
        app.record_ids().await,
        ["bob_0", "bob_1", "carol_0", "carol_1"]
    );
    let (_, since) = read_feed(&app.db, Cursor::START, 100).await;

    for (query, field) in [("", "records"), ("?records=maybe", "records")] {
        let (status, headers, problem) = served
            .call(
                Method::DELETE,
                &format!("/v1/connections/{bob}{query}"),
                Some(&key),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {problem}");
        assert_problem(status, &headers, &problem);
        assert_eq!(problem["field"], field, "{problem}");
    }
    let alice = connection_row(&app, "alice").await.expect("alice").id;
    let (status, _, problem) = served
        .call(
            Method::DELETE,
            &format!("/v1/connections/{alice}?records=delete"),
            Some(&key),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{problem}");

    let (status, _, deleted) = served
        .call(
            Method::DELETE,
            &format!("/v1/connections/{carol}?records=keep"),
            Some(&key),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{deleted}");
    assert_eq!(
        deleted,
        json!({"id": carol, "provider": "acme", "user_id": "carol", "records_deleted": 0})
    );
    assert!(connection_row(&app, "carol").await.is_none());
    let (status, _, deleted) = served
        .call(
            Method::DELETE,
            &format!("/v1/connections/{bob}?records=delete"),
            Some(&key),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{deleted}");
    assert_eq!(deleted["records_deleted"], 2, "{deleted}");
    assert!(connection_row(&app, "bob").await.is_none());
    assert_eq!(app.record_ids().await, ["carol_0", "carol_1"]);
    let (feed, _) = read_feed(&app.db, since, 100).await;
    let mut changes: Vec<(String, String, ChangeKind)> = feed
        .into_iter()
        .map(|change| (change.user_id, change.external_id, change.kind))
        .collect();
    changes.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(
        changes,
        [
            ("bob".into(), "bob_0".into(), ChangeKind::Deleted),
            ("bob".into(), "bob_1".into(), ChangeKind::Deleted),
        ]
    );
    let (status, _, problem) = served
        .call(
            Method::DELETE,
            &format!("/v1/connections/{bob}?records=delete"),
            Some(&key),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{problem}");
    let deletes: Vec<(String, i32)> = audit_rows(&app)
        .await
        .into_iter()
        .filter(|row| row.1 == "DELETE")
        .map(|row| (row.2, row.3))
        .collect();
    let at = |id: i64| format!("/v1/connections/{id}");
    assert_eq!(
        deletes,
        [
            (at(bob), 400),
            (at(bob), 400),
            (at(alice), 409),
            (at(carol), 200),
            (at(bob), 200),
            (at(bob), 404),
        ]
    );
}

/// Two instances on one server database: a connection created through one is synced by
/// a job asked for through the other.
#[tokio::test]
async fn two_instances_serve_a_create_on_one_and_a_trigger_on_the_other() {
    if backend() == Backend::Sqlite {
        return; // One daemon per SQLite file.
    }
    let app = spawn_app().await;
    mount_cursor_listing(&app.api, "frank", "frank_", 2, 2, Duration::ZERO).await;
    let providers = yearly(&app, &["alice"]);
    let first = Served::start_named(&app, &providers, "first").await;
    let second = Served::start_named(&app, &providers, "second").await;
    let key = first.create_key("both", &ALL_SCOPES[..3]);
    let (status, created) = create(
        &first,
        &key,
        json!({"provider": "acme", "user_id": "frank", "token": "token-frank"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["id"].as_i64().expect("an id");
    sync_through_api(&app, &second, &key, id).await;
    assert_eq!(
        app.record_ids().await,
        ["frank_0", "frank_1", "frank_2", "frank_3"]
    );
    for instance in [&first, &second] {
        let (status, shown) = instance.get(&format!("/v1/connections/{id}"), &key).await;
        assert_eq!(status, StatusCode::OK, "{shown}");
        assert!(
            shown["streams"][0]["last_success_run_id"].is_i64(),
            "{shown}"
        );
    }
}

/// One route of the matrix: what it asks and the scope it needs (`None`: none).
struct Route {
    method: Method,
    path: &'static str,
    body: Option<Value>,
    needs: Option<&'static str>,
    /// What it names does not exist: a caller with the scope is answered 404, not 403.
    missing: bool,
}

/// Every route against a key of every scope: the scope it needs (or admin) is served
/// (2xx), any other is 403; the document needs none.
#[tokio::test]
async fn every_route_serves_its_scope_and_admin_and_refuses_every_other_scope() {
    let app = spawn_app().await;
    mount_cursor_listing(&app.api, "alice", "alice_", 1, 1, Duration::ZERO).await;
    let providers = yearly(&app, &["alice"]);
    let settings = app.settings(&providers).await;
    app.sync(&settings).await;
    let served = Served::start_with(&app, &providers, "daemon", |text| {
        format!("{text}\n[connect]\npublic_url = \"http://127.0.0.1:9\"\nreturn_urls = [\"http://127.0.0.1:9/back\"]\n")
    })
    .await;
    let alice = connection_row(&app, "alice").await.expect("alice").id;
    let run = crate::daemon::runs_of(&app, "alice").await[0].id;
    let admin = served.create_key("matrix-admin", &["admin"]);

    let routes = [
        Route {
            method: Method::GET,
            path: "/v1/connections",
            body: None,
            needs: Some("connections:read"),
            missing: false,
        },
        Route {
            method: Method::GET,
            path: "/v1/connections/{alice}",
            body: None,
            needs: Some("connections:read"),
            missing: false,
        },
        Route {
            method: Method::POST,
            path: "/v1/connections",
            body: Some(json!({"provider": "acme", "user_id": "{user}", "token": "t"})),
            needs: Some("connections:write"),
            missing: false,
        },
        Route {
            method: Method::PATCH,
            path: "/v1/connections/{alice}",
            body: Some(json!({"paused": false})),
            needs: Some("connections:write"),
            missing: false,
        },
        Route {
            method: Method::DELETE,
            path: "/v1/connections/{victim}?records=keep",
            body: None,
            needs: Some("connections:write"),
            missing: false,
        },
        Route {
            method: Method::POST,
            path: "/v1/connect/sessions",
            body: Some(
                json!({"user_id": "{user}", "providers": ["acme"], "return_url": "http://127.0.0.1:9/back"}),
            ),
            needs: Some("connections:write"),
            missing: false,
        },
        Route {
            method: Method::POST,
            path: "/v1/connections/{alice}/syncs",
            body: Some(json!({})),
            needs: Some("syncs:write"),
            missing: false,
        },
        Route {
            method: Method::GET,
            path: "/v1/connections/{alice}/syncs",
            body: None,
            needs: Some("connections:read"),
            missing: false,
        },
        Route {
            method: Method::GET,
            path: "/v1/jobs",
            body: None,
            needs: Some("connections:read"),
            missing: false,
        },
        Route {
            method: Method::GET,
            path: "/v1/jobs/987654",
            body: None,
            needs: Some("connections:read"),
            missing: true,
        },
        Route {
            method: Method::POST,
            path: "/v1/jobs/987654/cancel",
            body: None,
            needs: Some("syncs:write"),
            missing: true,
        },
        Route {
            method: Method::GET,
            path: "/v1/runs",
            body: None,
            needs: Some("connections:read"),
            missing: false,
        },
        Route {
            method: Method::GET,
            path: "/v1/runs/{run}",
            body: None,
            needs: Some("connections:read"),
            missing: false,
        },
        Route {
            method: Method::GET,
            path: "/v1/openapi.json",
            body: None,
            needs: None,
            missing: false,
        },
        Route {
            method: Method::GET,
            path: "/v1/runs/{run}/errors",
            body: None,
            needs: Some("records:read"),
            missing: false,
        },
        Route {
            method: Method::POST,
            path: "/v1/runs/{run}/replay",
            body: None,
            needs: Some("syncs:write"),
            missing: false,
        },
        Route {
            method: Method::GET,
            path: "/v1/errors",
            body: None,
            needs: Some("records:read"),
            missing: false,
        },
        Route {
            method: Method::GET,
            path: "/v1/changes",
            body: None,
            needs: Some("records:read"),
            missing: false,
        },
        Route {
            method: Method::GET,
            path: "/v1/changes/head",
            body: None,
            needs: Some("records:read"),
            missing: false,
        },
        Route {
            method: Method::GET,
            path: "/v1/changes/readers",
            body: None,
            needs: Some("admin"),
            missing: false,
        },
        Route {
            method: Method::GET,
            path: "/v1/notifications",
            body: None,
            needs: Some("notifications:read"),
            missing: false,
        },
        Route {
            method: Method::POST,
            path: "/v1/notifications/987654/redeliver",
            body: None,
            needs: Some("notifications:write"),
            missing: true,
        },
        Route {
            method: Method::GET,
            path: "/v1/webhooks/deliveries",
            body: None,
            needs: Some("webhooks:read"),
            missing: false,
        },
        Route {
            method: Method::GET,
            path: "/v1/records?provider=acme",
            body: None,
            needs: Some("records:read"),
            missing: false,
        },
        // Not a key's route: a provider without `webhooks` is 404 to every caller.
        Route {
            method: Method::POST,
            path: "/webhooks/acme",
            body: Some(json!({})),
            needs: None,
            missing: true,
        },
        Route {
            method: Method::GET,
            path: "/webhooks/acme",
            body: None,
            needs: None,
            missing: true,
        },
        Route {
            method: Method::GET,
            path: "/v1/health",
            body: None,
            needs: None,
            missing: false,
        },
    ];
    // The matrix covers every documented operation.
    let (_, _, doc) = served
        .call(Method::GET, "/v1/openapi.json", None, None)
        .await;
    let documented: usize = doc["paths"]
        .as_object()
        .expect("paths")
        .values()
        .map(|operations| operations.as_object().map_or(0, |o| o.len()))
        .sum();
    assert_eq!(
        documented,
        routes.len(),
        "a route is missing from the matrix"
    );

    let mut failures = Vec::new();
    for (index, scope) in ALL_SCOPES.iter().enumerate() {
        let key = served.create_key(&format!("matrix-{index}"), &[scope]);
        for (number, route) in routes.iter().enumerate() {
            let user = format!("matrix-{index}-{number}");
            let victim = match route.method {
                Method::DELETE => {
                    let (status, created) = create(
                        &served,
                        &admin,
                        json!({"provider": "acme", "user_id": user, "token": "t"}),
                    )
                    .await;
                    assert_eq!(status, StatusCode::CREATED, "{created}");
                    created["id"].as_i64().expect("an id")
                }
                _ => 0,
            };
            let path = route
                .path
                .replace("{alice}", &alice.to_string())
                .replace("{run}", &run.to_string())
                .replace("{victim}", &victim.to_string());
            let body = route
                .body
                .as_ref()
                .map(|body| Value::from(body.to_string().replace("{user}", &user)));
            let body = body.map(|text| {
                let text = text.as_str().unwrap_or_default().as_bytes().to_vec();
                ("application/json", text)
            });
            let (status, _, json) = served
                .call(route.method.clone(), &path, Some(&key), body)
                .await;
            let allowed = route
                .needs
                .is_none_or(|needs| needs == *scope || *scope == "admin");
            let served_it = match route.missing {
                true => status == StatusCode::NOT_FOUND,
                false => status.is_success(),
            };
            if allowed != served_it || (!allowed && status != StatusCode::FORBIDDEN) {
                failures.push(format!(
                    "{scope}: {} {path} answered {status}: {json}",
                    route.method
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
async fn a_stream_is_paused_and_resumed_over_the_api_and_an_unknown_one_changes_nothing() {
    let app = spawn_app().await;
    let served = Served::start(&app, &yearly(&app, &["alice"])).await;
    let writer = served.create_key("writer", &["connections:read", "connections:write"]);
    let id = connection_row(&app, "alice").await.expect("alice").id;
    let path = format!("/v1/connections/{id}");
    let patch = |path: String, body: Value| {
        let (served, writer) = (&served, &writer);
        async move {
            served
                .call(Method::PATCH, &path, Some(writer), json_body(&body))
                .await
        }
    };

    // An unknown stream or connection: a problem naming it, and nothing written.
    let (status, headers, problem) = patch(
        path.clone(),
        json!({"paused": true, "streams": {"wikis": {"paused": true}}}),
    )
    .await;
    assert_problem(status, &headers, &problem);
    assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");
    assert_eq!(problem["field"], "streams", "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|detail| detail.contains("no stream named \"wikis\"")),
        "{problem}"
    );
    let missing = id + 1000;
    let (status, _, problem) = patch(
        format!("/v1/connections/{missing}"),
        json!({"streams": {"records": {"paused": true}}}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|detail| detail.contains(&format!("connection with id {missing}"))),
        "{problem}"
    );
    assert!(
        query(&app, "SELECT id FROM connection_streams")
            .await
            .is_empty(),
        "a refused change wrote a stream"
    );
    let row = connection_row(&app, "alice").await.expect("alice");
    assert!(
        row.paused_at.is_none(),
        "a refused change paused the connection"
    );

    let (status, _, changed) = patch(
        path.clone(),
        json!({"streams": {"records": {"paused": true}}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{changed}");
    assert!(changed["paused_at"].is_null(), "{changed}");
    assert!(changed["streams"][0]["paused_at"].is_string(), "{changed}");
    let (_, _, syncs) = served
        .call(Method::GET, &format!("{path}/syncs"), Some(&writer), None)
        .await;
    assert!(syncs["streams"][0]["paused_at"].is_string(), "{syncs}");
    assert!(syncs["streams"][0]["next_slot"].is_null(), "{syncs}");

    let (status, _, changed) = patch(
        path.clone(),
        json!({"streams": {"records": {"paused": false}}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{changed}");
    assert!(changed["streams"][0]["paused_at"].is_null(), "{changed}");
    let (_, _, syncs) = served
        .call(Method::GET, &format!("{path}/syncs"), Some(&writer), None)
        .await;
    assert!(syncs["streams"][0]["next_slot"].is_string(), "{syncs}");
}
