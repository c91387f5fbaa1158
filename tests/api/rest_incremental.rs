//! The `rest` kind's incremental sync through the pipeline: a full pass from `start`, then
//! runs that ask from the stream's cursor, keep boundary ties and insert only what is new.

use serde_json::json;
use tributary::entities::sync_run::RunStatus;
use wiremock::matchers::{method, path, query_param, query_param_is_missing};
use wiremock::{Mock, ResponseTemplate};

use crate::helpers::{connections, kill_sync_at_parent, spawn_app, TestApp};

fn rest(app: &TestApp) -> String {
    format!(
        "[providers.acme]\nkind = \"rest\"\nbase_url = \"{}\"\npath = \"/v1/items\"\n\
         schedule = \"0 * * * * *\"\nrecords_path = \"data\"\nid_field = \"id\"\n\
         incremental = {{ cursor_field = \"updated_at\", param = \"updated_since\", \
         start = \"2024-01-01T00:00:00Z\" }}\n\
         [providers.acme.pagination]\ntype = \"has_more\"\nafter_param = \"after\"\n{}",
        app.api.uri(),
        connections("acme", &["alice"])
    )
}

fn item(id: &str, updated_at: &str) -> serde_json::Value {
    json!({"id": id, "updated_at": updated_at})
}

fn page(items: serde_json::Value, has_more: bool) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({"data": items, "has_more": has_more}))
}

#[tokio::test]
async fn the_second_run_asks_from_the_cursor_keeps_ties_and_inserts_only_what_is_new() {
    let app = spawn_app().await;
    let listing = |since: &str| {
        Mock::given(method("GET"))
            .and(path("/v1/items"))
            .and(query_param("updated_since", since))
    };
    // Run 1: from `start`, two pages by the last record's id.
    listing("2024-01-01T00:00:00Z")
        .and(query_param_is_missing("after"))
        .respond_with(page(
            json!([
                item("a", "2026-11-01T10:00:00Z"),
                item("b", "2026-11-02T10:00:00Z")
            ]),
            true,
        ))
        .expect(1)
        .mount(&app.api)
        .await;
    listing("2024-01-01T00:00:00Z")
        .and(query_param("after", "b"))
        .respond_with(page(json!([item("c", "2026-11-03T10:00:00Z")]), false))
        .expect(1)
        .mount(&app.api)
        .await;
    let settings = app.settings(&rest(&app)).await;
    let first = app.sync_one(&settings).await;
    assert_eq!(
        (
            first.status,
            first.counts.pages_fetched,
            first.counts.inserted
        ),
        (RunStatus::Succeeded, 2, 3)
    );
    let state = app.only_stream().await.expect("the stream's state");
    assert_eq!(
        state.cursor.as_deref(),
        Some(r#"{"time":"2026-11-03T10:00:00Z"}"#)
    );

    // Run 2 asks from the cursor, inclusively: c comes back unchanged beside d, which
    // changed in the same second after run 1 listed, and e.
    listing("2026-11-03T10:00:00Z")
        .and(query_param_is_missing("after"))
        .respond_with(page(
            json!([
                item("c", "2026-11-03T10:00:00Z"),
                item("d", "2026-11-03T10:00:00Z"),
                item("e", "2026-11-04T10:00:00Z"),
            ]),
            false,
        ))
        .expect(1)
        .mount(&app.api)
        .await;
    let second = app.sync_one(&settings).await;
    assert_eq!(
        (
            second.status,
            second.counts.inserted,
            second.counts.unchanged
        ),
        (RunStatus::Succeeded, 2, 1)
    );
    app.api.verify().await;
    assert_eq!(app.record_ids().await, ["a", "b", "c", "d", "e"]);
    let state = app.only_stream().await.expect("the stream's state");
    assert_eq!(
        state.cursor.as_deref(),
        Some(r#"{"time":"2026-11-04T10:00:00Z"}"#)
    );
}

#[tokio::test]
async fn records_the_filter_drops_are_counted_not_stored_nor_errors() {
    let app = spawn_app().await;
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": [
            {"id": "a", "status": "open"},
            {"id": "b", "status": "deleted"},
            {"id": "c", "status": "open"},
            {"no_id": true, "status": "deleted"},
        ]})))
        .mount(&app.api)
        .await;
    let providers = format!(
        "[providers.acme]\nkind = \"rest\"\nbase_url = \"{}\"\npath = \"/v1/items\"\n\
         schedule = \"0 * * * * *\"\nrecords_path = \"data\"\n\
         records_filter = {{ field = \"status\", not_in = [\"deleted\"] }}\n{}",
        app.api.uri(),
        connections("acme", &["alice"])
    );
    let settings = app.settings(&providers).await;
    let run = app.sync_one(&settings).await;
    assert_eq!(
        (
            run.status,
            run.counts.fetched,
            run.counts.inserted,
            run.counts.failed,
            run.counts.filtered
        ),
        (RunStatus::Succeeded, 2, 2, 0, 2)
    );
    assert_eq!(app.record_ids().await, ["a", "c"]);
    assert_eq!(app.run_row(run.run_id).await.records_filtered, 2);
}

#[tokio::test]
async fn a_rest_oauth2_refresh_token_is_rotated_committed_sealed_and_then_used() {
    let app = spawn_app().await;
    std::env::set_var("TRIBUTARY_TEST_REST_SECRET", "rest-client-secret");
    let providers = format!(
        "[providers.acme]\nkind = \"rest\"\nbase_url = \"{uri}\"\npath = \"/v1/items\"\n\
         schedule = \"0 * * * * *\"\nrecords_path = \"data\"\n\
         [providers.acme.auth]\noauth2 = \"refresh_token\"\n\
         token_url = \"{uri}/oauth/token\"\nclient_id = \"tributary\"\n\
         client_secret_env = \"TRIBUTARY_TEST_REST_SECRET\"\n\
         [[providers.acme.connections]]\nuser_id = \"alice\"\ntoken = \"old-access\"\n\
         refresh_token = \"old-refresh\"\nexpires_at = 1\n",
        uri = app.api.uri()
    );
    // RFC 6749 section 6: the refresh-token grant, answered per section 5.1.
    Mock::given(method("POST"))
        .and(path("/oauth/token"))
        .and(wiremock::matchers::body_string_contains(
            "grant_type=refresh_token",
        ))
        .and(wiremock::matchers::body_string_contains(
            "refresh_token=old-refresh",
        ))
        .and(wiremock::matchers::body_string_contains(
            "client_secret=rest-client-secret",
        ))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "access_token": "new-access", "token_type": "Bearer", "expires_in": 3600,
            "refresh_token": "new-refresh"
        })))
        .expect(1)
        .mount(&app.api)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .and(wiremock::matchers::header(
            "authorization",
            "Bearer new-access",
        ))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": [{"id": "a"}]})))
        .expect(2)
        .mount(&app.api)
        .await;
    let settings = app.settings(&providers).await;
    let run = app.sync_one(&settings).await;
    assert_eq!(
        (run.status, run.counts.inserted),
        (RunStatus::Succeeded, 1),
        "{:?}",
        run.error
    );
    let stored = app.stored_credentials("alice", "acme").await;
    let refreshed = stored.oauth.clone().expect("the rotated pair is stored");
    assert_eq!(refreshed.token.as_deref(), Some("new-access"));
    assert_eq!(refreshed.refresh_token.as_deref(), Some("new-refresh"));

    // A restart reloads config.toml: the rotated pair is used without another refresh.
    let settings = app.settings(&providers).await;
    let again = app.sync_one(&settings).await;
    assert_eq!(again.status, RunStatus::Succeeded, "{:?}", again.error);
    app.api.verify().await;
    let tokens = ["old-access", "old-refresh", "new-access", "new-refresh"];
    crate::secrets::assert_nowhere_in_clear(&app, &tokens).await;
}

#[tokio::test]
async fn a_rest_child_resource_is_listed_per_stored_parent_under_its_namespace() {
    let app = spawn_app().await;
    Mock::given(method("GET"))
        .and(path("/v1/projects"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": [
            {"id": 7, "name": "Seven"},
            {"id": 8, "name": "Eight"},
        ]})))
        .expect(1)
        .mount(&app.api)
        .await;
    for (project, tasks) in [("7", json!([{"id": 7}, {"id": 71}])), ("8", json!([]))] {
        Mock::given(method("GET"))
            .and(path(format!("/v1/projects/{project}/tasks")))
            .and(query_param("project", project))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": tasks})))
            .expect(1)
            .mount(&app.api)
            .await;
    }
    let providers = format!(
        "[providers.acme]\nkind = \"rest\"\nbase_url = \"{}\"\npath = \"/v1/items\"\n\
         schedule = \"0 * * * * *\"\nrecords_path = \"data\"\n\
         streams = [\"tasks\", \"projects\"]\n\
         [providers.acme.resources.projects]\npath = \"/v1/projects\"\n\
         [providers.acme.resources.tasks]\nparent = \"projects\"\n\
         path = \"/v1/projects/{{parent.id}}/tasks\"\nquery = {{ project = \"{{parent.id}}\" }}\n{}",
        app.api.uri(),
        connections("acme", &["alice"])
    );
    let settings = app.settings(&providers).await;
    let outcomes = app.sync(&settings).await;
    let ran: Vec<(&str, RunStatus, u64)> = outcomes
        .iter()
        .map(|o| (o.stream.as_str(), o.status, o.counts.inserted))
        .collect();
    assert_eq!(
        ran,
        [
            ("projects", RunStatus::Succeeded, 2),
            ("tasks", RunStatus::Succeeded, 2)
        ]
    );
    app.api.verify().await;
    let keys: Vec<(String, String)> = app
        .records()
        .await
        .into_iter()
        .map(|r| (r.provider, r.external_id))
        .collect();
    // Project 7 and task 7 are two records.
    let expected: Vec<(String, String)> = [
        ("acme.projects", "7"),
        ("acme.projects", "8"),
        ("acme.tasks", "7"),
        ("acme.tasks", "71"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(keys, expected);
}

#[tokio::test]
async fn a_rest_child_resource_killed_mid_parents_resumes_at_the_parent_it_reached() {
    let app = spawn_app().await;
    Mock::given(method("GET"))
        .and(path("/v1/projects"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": [
            {"id": 1}, {"id": 2}, {"id": 3},
        ], "next": null})))
        .mount(&app.api)
        .await;
    let tasks = |project: &str| {
        Mock::given(method("GET")).and(path(format!("/v1/projects/{project}/tasks")))
    };
    let answer = |ids: &[u32], next: Option<&str>| {
        let data: Vec<serde_json::Value> = ids.iter().map(|id| json!({"id": id})).collect();
        ResponseTemplate::new(200).set_body_json(json!({"data": data, "next": next}))
    };
    tasks("1")
        .respond_with(answer(&[11], None))
        .mount(&app.api)
        .await;
    tasks("2")
        .and(query_param_is_missing("cursor"))
        .respond_with(answer(&[21], Some("t2")))
        .mount(&app.api)
        .await;
    // Project two's second page answers slowly the first time: the process is killed
    // while it waits, with the first page committed.
    tasks("2")
        .and(query_param("cursor", "t2"))
        .respond_with(answer(&[22], None).set_delay(std::time::Duration::from_secs(60)))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&app.api)
        .await;
    tasks("2")
        .and(query_param("cursor", "t2"))
        .respond_with(answer(&[22], None))
        .mount(&app.api)
        .await;
    tasks("3")
        .respond_with(answer(&[31], None))
        .mount(&app.api)
        .await;
    let providers = format!(
        "[providers.acme]\nkind = \"rest\"\nbase_url = \"{}\"\npath = \"/v1/items\"\n\
         schedule = \"0 * * * * *\"\nrecords_path = \"data\"\n\
         streams = [\"projects\", \"tasks\"]\n\
         [providers.acme.pagination]\ntype = \"cursor\"\ncursor_path = \"next\"\n\
         cursor_param = \"cursor\"\n\
         [providers.acme.resources.projects]\npath = \"/v1/projects\"\n\
         [providers.acme.resources.tasks]\nparent = \"projects\"\n\
         path = \"/v1/projects/{{parent.id}}/tasks\"\n{}",
        app.api.uri(),
        connections("acme", &["alice"])
    );
    let config = app.write_config(&providers);
    let reached = kill_sync_at_parent(&app, &config, "tasks", "2").await;
    assert_eq!(reached["position"]["cursor"], "t2", "{reached}");

    let settings = app.settings(&providers).await;
    let resumed = app.sync(&settings).await;
    let tasks_run = resumed
        .iter()
        .find(|o| o.stream == "tasks")
        .expect("a tasks run");
    assert_eq!(tasks_run.status, RunStatus::Succeeded, "{resumed:?}");
    // Two's second page and three's: one's tasks and two's first page were not asked again.
    assert_eq!(
        (tasks_run.counts.pages_fetched, tasks_run.counts.inserted),
        (2, 2)
    );
    let received = app.api.received_requests().await.unwrap_or_default();
    let asked = |route: &str| received.iter().filter(|r| r.url.path() == route).count();
    assert_eq!(asked("/v1/projects/1/tasks"), 1);
    assert_eq!(asked("/v1/projects/2/tasks"), 3);
    assert_eq!(asked("/v1/projects/3/tasks"), 1);
    let tasks_stored: Vec<String> = app
        .records()
        .await
        .into_iter()
        .filter(|r| r.provider == "acme.tasks")
        .map(|r| r.external_id)
        .collect();
    assert_eq!(tasks_stored, ["11", "21", "22", "31"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runs_that_find_a_rest_token_expired_refresh_it_once() {
    let app = spawn_app().await;
    std::env::set_var("TRIBUTARY_TEST_REST_SECRET_2", "rest-client-secret");
    let providers = format!(
        "[providers.acme]\nkind = \"rest\"\nbase_url = \"{uri}\"\npath = \"/v1/items\"\n\
         schedule = \"0 * * * * *\"\nrecords_path = \"data\"\n\
         [providers.acme.auth]\noauth2 = \"refresh_token\"\n\
         token_url = \"{uri}/oauth/token\"\nclient_id = \"tributary\"\n\
         client_secret_env = \"TRIBUTARY_TEST_REST_SECRET_2\"\n\
         [[providers.acme.connections]]\nuser_id = \"alice\"\ntoken = \"old-access\"\n\
         refresh_token = \"old-refresh\"\nexpires_at = 1\n",
        uri = app.api.uri()
    );
    // A slow token endpoint that rotates the refresh token: a second refresh with the old
    // one would be refused by a real server, so exactly one may reach it.
    Mock::given(method("POST"))
        .and(path("/oauth/token"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!({
                    "access_token": "new-access", "token_type": "Bearer", "expires_in": 3600,
                    "refresh_token": "new-refresh"
                }))
                .set_delay(std::time::Duration::from_millis(300)),
        )
        .expect(1)
        .mount(&app.api)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .and(wiremock::matchers::header(
            "authorization",
            "Bearer new-access",
        ))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": [{"id": "a"}]})))
        .expect(2)
        .mount(&app.api)
        .await;
    let settings = app.settings(&providers).await;
    let provider_settings = &settings.providers["acme"];
    let provider = tributary::sync::build(provider_settings).expect("provider");
    let connection = {
        use sea_orm::EntityTrait;
        tributary::entities::connection::Entity::find()
            .one(&app.db)
            .await
            .expect("query")
            .expect("alice")
    };
    // Lease-free, as two processes whose leases overlapped after one stalled.
    let run = || {
        tributary::pipeline::sync_connection(
            &app.db,
            provider.as_ref(),
            provider_settings,
            &connection,
            tributary::pipeline::RunOptions::manual(),
            &tributary::pipeline::NoProgress,
        )
    };
    let (first, second) = tokio::join!(run(), run());
    for outcome in [first.expect("recorded"), second.expect("recorded")] {
        assert_eq!(outcome.status, RunStatus::Succeeded, "{:?}", outcome.error);
    }
    app.api.verify().await;
    let stored = app.stored_credentials("alice", "acme").await;
    let refreshed = stored.oauth.clone().expect("the rotated pair is stored");
    assert_eq!(refreshed.refresh_token.as_deref(), Some("new-refresh"));
}

#[tokio::test]
async fn rest_client_credentials_connections_sync_without_a_token_of_their_own() {
    let app = spawn_app().await;
    std::env::set_var("TRIBUTARY_TEST_CC_SECRET", "cc-client-secret");
    let providers = format!(
        "[providers.acme]\nkind = \"rest\"\nbase_url = \"{uri}\"\npath = \"/v1/items\"\n\
         schedule = \"0 * * * * *\"\nrecords_path = \"data\"\n\
         [providers.acme.auth]\noauth2 = \"client_credentials\"\n\
         token_url = \"{uri}/oauth/token\"\nclient_id = \"tributary\"\n\
         client_secret_env = \"TRIBUTARY_TEST_CC_SECRET\"\nscope = \"items:read\"\n\
         [[providers.acme.connections]]\nuser_id = \"alice\"\n\
         [[providers.acme.connections]]\nuser_id = \"bob\"\n",
        uri = app.api.uri()
    );
    // RFC 6749 section 4.4: one token for the provider, cached across its connections.
    Mock::given(method("POST"))
        .and(path("/oauth/token"))
        .and(wiremock::matchers::body_string_contains(
            "grant_type=client_credentials",
        ))
        .and(wiremock::matchers::body_string_contains(
            "client_secret=cc-client-secret",
        ))
        .and(wiremock::matchers::body_string_contains(
            "scope=items%3Aread",
        ))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "access_token": "cc-access", "token_type": "Bearer", "expires_in": 3600
        })))
        .expect(1)
        .mount(&app.api)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .and(wiremock::matchers::header(
            "authorization",
            "Bearer cc-access",
        ))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": [{"id": "a"}]})))
        .expect(2)
        .mount(&app.api)
        .await;
    let settings = app.settings(&providers).await;
    let runs = app.sync(&settings).await;
    assert_eq!(runs.len(), 2);
    for run in &runs {
        assert_eq!(
            (run.status, run.counts.inserted),
            (RunStatus::Succeeded, 1),
            "{:?}",
            run.error
        );
    }
    app.api.verify().await;
    for user in ["alice", "bob"] {
        let stored = app.stored_credentials(user, "acme").await;
        assert_eq!(
            (stored.token, stored.oauth),
            (None, None),
            "the provider's token is not stored on a connection"
        );
    }
}
