//! The built-in adapters through the whole pipeline: incremental cursors that never skip a
//! record, rate limits that end a run `partial` and resume, and OAuth refreshes committed
//! before use.

use sea_orm::EntityTrait;
use serde_json::json;
use tributary::entities::connection;
use tributary::entities::sync_run::RunStatus;
use wiremock::matchers::{
    body_string_contains, header, method, path, query_param, query_param_is_missing,
};
use wiremock::{Mock, ResponseTemplate};

use crate::helpers::{connections, spawn_app};

pub(crate) fn issue(id: u64, updated_at: &str) -> serde_json::Value {
    json!({"id": id, "number": id, "title": format!("Issue {id}"), "state": "open", "updated_at": updated_at})
}

#[tokio::test]
async fn github_syncs_incrementally_and_refetches_boundary_ties_without_skipping() {
    let app = spawn_app().await;
    let providers = format!(
        "[providers.gh]\nkind = \"github\"\nbase_url = \"{}\"\nschedule = \"0 * * * * *\"\n{}",
        app.api.uri(),
        connections("gh", &["alice"])
    );
    let list = || {
        Mock::given(method("GET"))
            .and(path("/issues"))
            .and(query_param("filter", "all"))
            .and(query_param("state", "all"))
            .and(query_param("sort", "updated"))
            .and(query_param("direction", "desc"))
            .and(header("authorization", "Bearer token-alice"))
            .and(header("x-github-api-version", "2022-11-28"))
    };
    // Run 1, a full listing: three issues, two of them on the newest timestamp.
    list()
        .and(query_param_is_missing("since"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([
            issue(1, "2026-11-01T10:00:00Z"),
            issue(2, "2026-11-01T10:05:00Z"),
            issue(3, "2026-11-01T10:05:00Z"),
        ])))
        .expect(1)
        .mount(&app.api)
        .await;
    let settings = app.settings(&providers).await;
    let first = app.sync_one(&settings).await;
    assert_eq!(
        (first.status, first.counts.inserted),
        (RunStatus::Succeeded, 3)
    );
    let row = app.only_stream().await.expect("the stream's state");
    assert_eq!(
        row.cursor.as_deref(),
        Some(r#"{"time":"2026-11-01T10:05:00Z"}"#)
    );

    // Run 2 asks from the cursor, inclusively: the boundary ties come back, along with a
    // fourth issue that landed on the same second after run 1 listed.
    list()
        .and(query_param("since", "2026-11-01T10:05:00Z"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([
            issue(2, "2026-11-01T10:05:00Z"),
            issue(3, "2026-11-01T10:05:00Z"),
            issue(4, "2026-11-01T10:05:00Z"),
        ])))
        .expect(1)
        .mount(&app.api)
        .await;
    let second = app.sync_one(&settings).await;
    assert_eq!(
        (second.counts.inserted, second.counts.unchanged),
        (1, 2),
        "the late tie is stored and the re-fetched ones are absorbed by the key"
    );
    let ids: Vec<String> = app
        .records()
        .await
        .into_iter()
        .map(|r| r.external_id)
        .collect();
    assert_eq!(ids, ["1", "2", "3", "4"]);
    app.api.verify().await;
}

#[tokio::test]
async fn a_full_sync_ignores_the_cursor() {
    let app = spawn_app().await;
    let providers = format!(
        "[providers.gh]\nkind = \"github\"\nbase_url = \"{}\"\nschedule = \"0 * * * * *\"\n{}",
        app.api.uri(),
        connections("gh", &["alice"])
    );
    Mock::given(method("GET"))
        .and(path("/issues"))
        .and(query_param_is_missing("since"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!([issue(1, "2026-11-01T10:00:00Z")])),
        )
        .expect(2)
        .mount(&app.api)
        .await;
    let settings = app.settings(&providers).await;
    app.sync_one(&settings).await;
    let report = tributary::sync::sync_matching(
        &app.db,
        &settings,
        &Default::default(),
        &tributary::pipeline::RunOptions {
            full: true,
            ..tributary::pipeline::RunOptions::manual()
        },
        &tributary::pipeline::NoProgress,
    )
    .await
    .unwrap();
    assert_eq!(report.outcomes[0].status, RunStatus::Succeeded);
    app.api.verify().await;
}

fn charge(id: &str, created: i64) -> serde_json::Value {
    json!({"id": id, "object": "charge", "amount": 1000, "currency": "eur", "created": created})
}

#[tokio::test]
async fn a_rate_limit_longer_than_allowed_ends_the_run_partial_and_the_next_run_resumes() {
    let app = spawn_app().await;
    let providers = format!(
        "[providers.stripe]\nkind = \"stripe\"\nbase_url = \"{}\"\nschedule = \"0 * * * * *\"\n\
         [providers.stripe.http]\nmax_rate_limit_wait = \"2s\"\nretry_initial_delay = \"1ms\"\n{}",
        app.api.uri(),
        connections("stripe", &["alice"])
    );
    let charges = || {
        Mock::given(method("GET"))
            .and(path("/v1/charges"))
            .and(query_param("limit", "100"))
            .and(header("authorization", "Bearer token-alice"))
    };
    charges()
        .and(query_param_is_missing("starting_after"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "object": "list", "url": "/v1/charges", "has_more": true,
            "data": [charge("ch_3", 300), charge("ch_2", 200)]
        })))
        .mount(&app.api)
        .await;
    charges()
        .and(query_param("starting_after", "ch_2"))
        .respond_with(
            ResponseTemplate::new(429)
                .insert_header("retry-after", "600")
                .set_body_json(
                    json!({"error": {"type": "rate_limit_error", "message": "Too many requests"}}),
                ),
        )
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&app.api)
        .await;
    charges()
        .and(query_param("starting_after", "ch_2"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "object": "list", "url": "/v1/charges", "has_more": false,
            "data": [charge("ch_1", 100)]
        })))
        .mount(&app.api)
        .await;
    let settings = app.settings(&providers).await;

    let asked_from = chrono::Utc::now().timestamp();
    let limited = app.sync_one(&settings).await;
    let asked_until = chrono::Utc::now().timestamp();
    assert_eq!(limited.status, RunStatus::Partial);
    let reason = limited.error.clone().unwrap();
    assert!(
        reason.contains("rate limited") && reason.contains("resumes"),
        "{reason}"
    );
    assert_eq!(limited.counts.inserted, 2);
    let row = app.only_stream().await.expect("the stream's state");
    assert_eq!(
        row.cursor, None,
        "the cursor does not advance past an unfinished listing"
    );
    assert!(row.checkpoint.as_deref().unwrap().contains("ch_2"));
    assert_eq!(row.last_success_run_id, None);

    let resumed = app.sync_one(&settings).await;
    assert_eq!(resumed.status, RunStatus::Succeeded, "{:?}", resumed.error);
    assert_eq!(
        (resumed.counts.pages_fetched, resumed.counts.inserted),
        (1, 1)
    );
    let row = app.only_stream().await.expect("the stream's state");
    assert_eq!(row.checkpoint, None);
    // A full pass's cursor is when its first page was asked for, in the run the resumed
    // one went on from: the next run reads the events since.
    let cursor: serde_json::Value =
        serde_json::from_str(row.cursor.as_deref().expect("a cursor")).expect("JSON");
    let epoch = cursor["epoch"].as_i64().expect("an epoch cursor");
    assert!(
        (asked_from..=asked_until).contains(&epoch),
        "{epoch} not in {asked_from}..={asked_until}"
    );
    assert_eq!(app.records().await.len(), 3);
}

#[tokio::test]
async fn an_expired_strava_token_is_refreshed_committed_and_then_used() {
    let app = spawn_app().await;
    std::env::set_var("TRIBUTARY_TEST_STRAVA_SECRET", "client-secret-value");
    let providers = format!(
        "[providers.strava]\nkind = \"strava\"\nbase_url = \"{uri}\"\noauth_url = \"{uri}\"\n\
         client_id = \"4242\"\nclient_secret_env = \"TRIBUTARY_TEST_STRAVA_SECRET\"\n\
         schedule = \"0 * * * * *\"\n\
         [[providers.strava.connections]]\nuser_id = \"alice\"\ntoken = \"old-access\"\n\
         refresh_token = \"old-refresh\"\nexpires_at = 1\n",
        uri = app.api.uri()
    );
    let in_six_hours = chrono::Utc::now().timestamp() + 6 * 3600;
    Mock::given(method("POST"))
        .and(path("/oauth/token"))
        .and(body_string_contains("grant_type=refresh_token"))
        .and(body_string_contains("refresh_token=old-refresh"))
        .and(body_string_contains("client_id=4242"))
        .and(body_string_contains("client_secret=client-secret-value"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "token_type": "Bearer", "access_token": "new-access", "refresh_token": "new-refresh",
            "expires_at": in_six_hours, "expires_in": 21600
        })))
        .expect(1)
        .mount(&app.api)
        .await;
    Mock::given(method("GET"))
        .and(path("/api/v3/athlete/activities"))
        .and(header("authorization", "Bearer new-access"))
        .and(query_param("page", "1"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([
            {"id": 11, "name": "Morning Run", "start_date": "2026-11-01T07:00:00Z"}
        ])))
        .mount(&app.api)
        .await;
    Mock::given(method("GET"))
        .and(path("/api/v3/athlete/activities"))
        .and(query_param("page", "2"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([])))
        .mount(&app.api)
        .await;
    let settings = app.settings(&providers).await;

    let run = app.sync_one(&settings).await;
    assert_eq!(run.status, RunStatus::Succeeded, "{:?}", run.error);
    assert_eq!(run.counts.inserted, 1);
    let stored = app.stored_credentials("alice", "strava").await;
    let refreshed = stored.oauth.clone().expect("the refreshed pair is stored");
    assert_eq!(refreshed.token.as_deref(), Some("new-access"));
    assert_eq!(refreshed.refresh_token.as_deref(), Some("new-refresh"));
    assert_eq!(refreshed.expires_at, Some(in_six_hours));

    // A restart reloads config.toml: the rotated pair survives, and the next run uses it
    // without refreshing again (the token endpoint expects exactly one call).
    let settings = app.settings(&providers).await;
    let again = app.sync_one(&settings).await;
    assert_eq!(again.status, RunStatus::Succeeded, "{:?}", again.error);
    app.api.verify().await;
    let errors = serde_json::to_string(&again).unwrap();
    assert!(!errors.contains("new-access") && !errors.contains("client-secret-value"));
    // Sealed at rest: no token is in the database's files (or, on a server, its column).
    let key_id = app.db.secrets().current_key_id().unwrap().to_string();
    let row = connection::Entity::find()
        .one(&app.db)
        .await
        .unwrap()
        .unwrap();
    assert!(row.credentials.starts_with(&format!("sealed:v1:{key_id}:")));
    let tokens = ["old-access", "old-refresh", "new-access", "new-refresh"];
    crate::secrets::assert_nowhere_in_clear(&app, &tokens).await;
}
