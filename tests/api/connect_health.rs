//! `needs_reconnect`: a connection whose refresh the token endpoint refuses with
//! `invalid_grant` shows it in the API, the CLI and `/metrics`, its scheduled jobs end
//! `skipped` without a request to the provider, and a reconnect on the Connect page
//! clears it so that the next run syncs.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use tributary::entities::sync_job::{JobKind, JobStatus};
use tributary::entities::sync_run::RunStatus;
use wiremock::matchers::{body_string_contains, header, method, path};
use wiremock::{Mock, ResponseTemplate};

use crate::connect::{connections_of, jobs_of, RETURN_URL};
use crate::connect_oauth::connect_with;
use crate::daemon::{eventually, free_port, runs_of};
use crate::helpers::{run, spawn_app, tributary, TestApp};
use crate::http::Served;

pub(crate) const FIRST_ACCESS: &str = "acme-access-first-0123";
pub(crate) const FIRST_REFRESH: &str = "acme-refresh-first-0123";
pub(crate) const AGAIN_ACCESS: &str = "acme-access-again-4567";
pub(crate) const AGAIN_REFRESH: &str = "acme-refresh-again-4567";

/// A `rest` provider with OAuth2 (refresh tokens and an authorization endpoint), synced
/// once a year so that only the jobs a test makes run.
pub(crate) fn acme(app: &TestApp) -> String {
    let uri = app.api.uri();
    let auth = format!(
        "auth = {{ oauth2 = \"refresh_token\", token_url = \"{uri}/oauth2/token\", \
         authorize_url = \"{uri}/oauth2/authorize\", client_id = \"acme-client\", \
         client_secret_env = \"TEST_ACME_SECRET\" }}"
    );
    crate::helpers::cursor_provider("acme", &uri, &[])
        .replace("auth = \"bearer\"", &auth)
        .replace(
            "schedule = \"0 */15 * * * *\"",
            "schedule = \"0 0 0 1 1 *\"",
        )
}

/// The token endpoint: each code once, and each of `refreshes` refreshes refused as
/// RFC 6749 §5.2 says a revoked grant is.
pub(crate) async fn mount_token_endpoint(app: &TestApp, refreshes: u64) {
    for (code, access, refresh) in [
        ("code-first", FIRST_ACCESS, FIRST_REFRESH),
        ("code-again", AGAIN_ACCESS, AGAIN_REFRESH),
    ] {
        Mock::given(method("POST"))
            .and(path("/oauth2/token"))
            .and(body_string_contains(format!("code={code}")))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({
                "access_token": access, "token_type": "Bearer", "expires_in": 3600,
                "refresh_token": refresh
            })))
            .expect(1)
            .mount(&app.api)
            .await;
    }
    Mock::given(method("POST"))
        .and(path("/oauth2/token"))
        .and(body_string_contains("grant_type=refresh_token"))
        .respond_with(ResponseTemplate::new(400).set_body_json(json!({
            "error": "invalid_grant", "error_description": "The refresh token was revoked."
        })))
        .expect(refreshes)
        .mount(&app.api)
        .await;
}

/// The listing: the first token is refused (the user revoked the app) `refused` times,
/// the second works once.
pub(crate) async fn mount_listing(app: &TestApp, refused: u64) {
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .and(header("authorization", format!("Bearer {FIRST_ACCESS}")))
        .respond_with(ResponseTemplate::new(401).set_body_json(json!({"error": "revoked"})))
        .expect(refused)
        .mount(&app.api)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .and(header("authorization", format!("Bearer {AGAIN_ACCESS}")))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "data": [{"id": "item-1", "name": "one"}], "next_cursor": null
        })))
        .expect(1)
        .mount(&app.api)
        .await;
}

/// `tributary_connections_needing_reconnect{provider="acme"}` as `/metrics` shows it.
async fn gauge(metrics_port: u16) -> String {
    let text = reqwest::get(format!("http://127.0.0.1:{metrics_port}/metrics"))
        .await
        .expect("metrics answer")
        .text()
        .await
        .expect("text");
    text.lines()
        .find(|line| line.starts_with("tributary_connections_needing_reconnect{provider=\"acme\"}"))
        .and_then(|line| line.rsplit(' ').next())
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn a_revoked_grant_needs_a_reconnect_until_the_connect_page_reconnects_it() {
    let app = spawn_app().await;
    mount_token_endpoint(&app, 1).await;
    mount_listing(&app, 1).await;
    let metrics_port = free_port();
    let served = Served::start_with_env(
        &app,
        &acme(&app),
        &[("TEST_ACME_SECRET", "acme-secret")],
        |text| {
            crate::connect::with_connect(RETURN_URL)(text).replace(
                "[daemon]\n",
                &format!("[daemon]\nlisten = \"127.0.0.1:{metrics_port}\"\n"),
            )
        },
    )
    .await;
    let admin = served.create_key("admin", &["admin"]);

    // Connected; its first sync meets a 401, and the refresh is refused with invalid_grant.
    let body = json!({"user_id": "u1", "providers": ["acme"], "return_url": RETURN_URL});
    let (status, location, page) = connect_with(&served, &admin, &body, "code-first").await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{page}");
    assert_eq!(location, format!("{RETURN_URL}?outcome=connected"));
    let id = connections_of(&app, "u1").await[0].id;
    // The state is set while the run is still closing: wait for both.
    eventually(Duration::from_secs(30), "a failed run", || async {
        runs_of(&app, "u1")
            .await
            .iter()
            .any(|run| run.status == RunStatus::Failed)
    })
    .await;
    assert!(connections_of(&app, "u1").await[0]
        .needs_reconnect_since
        .is_some());
    let runs = runs_of(&app, "u1").await;
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0].status, RunStatus::Failed);
    assert!(
        runs[0]
            .error
            .as_deref()
            .unwrap_or_default()
            .contains("invalid_grant"),
        "{:?}",
        runs[0].error
    );

    let (status, listed) = served.get("/v1/connections", &admin).await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    assert_eq!(listed["items"][0]["needs_reconnect"], true, "{listed}");
    assert!(listed["items"][0]["needs_reconnect_since"].is_string());
    let cli = run(tributary(&served.config).args(["connections", "list", "--json"]));
    assert_eq!(cli.code, 0, "{}", cli.stderr);
    let rows: serde_json::Value = serde_json::from_str(&cli.stdout).expect("JSON");
    assert!(rows[0]["needs_reconnect_since"].is_string(), "{rows}");
    let status_cli = run(tributary(&served.config).args([
        "connections",
        "status",
        "--provider",
        "acme",
        "--user",
        "u1",
    ]));
    assert_eq!(status_cli.code, 0, "{}", status_cli.stderr);
    assert!(
        status_cli.stdout.contains("needs a reconnect since"),
        "{}",
        status_cli.stdout
    );
    assert_eq!(gauge(metrics_port).await, "1");

    // The next scheduled slot ends skipped, without a request to the provider.
    let slot = chrono::Utc::now();
    crate::queue::queue_slot_job(&app, id, slot).await;
    eventually(Duration::from_secs(30), "the slot skipped", || async {
        jobs_of(&app, id)
            .await
            .iter()
            .any(|job| job.kind == JobKind::Scheduled && job.status == JobStatus::Skipped)
    })
    .await;
    let jobs = jobs_of(&app, id).await;
    let scheduled = jobs
        .iter()
        .find(|job| job.kind == JobKind::Scheduled)
        .expect("the slot's job");
    assert_eq!(
        scheduled.outcome.as_deref(),
        Some("the connection needs a reconnect"),
        "{jobs:?}"
    );
    assert_eq!(runs_of(&app, "u1").await.len(), 1, "no run for the slot");

    // A reconnect clears it, and the sync it queues succeeds with the new token.
    let body =
        json!({"user_id": "u1", "providers": ["acme"], "return_url": RETURN_URL, "reconnect": id});
    let (status, location, page) = connect_with(&served, &admin, &body, "code-again").await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{page}");
    assert_eq!(location, format!("{RETURN_URL}?outcome=connected"));
    assert_eq!(
        connections_of(&app, "u1").await[0].needs_reconnect_since,
        None
    );
    eventually(Duration::from_secs(30), "a run that syncs", || async {
        runs_of(&app, "u1")
            .await
            .iter()
            .any(|run| run.status == RunStatus::Succeeded)
    })
    .await;
    assert_eq!(app.records().await.len(), 1);
    assert_eq!(gauge(metrics_port).await, "0");
    let (_, listed) = served.get("/v1/connections", &admin).await;
    assert_eq!(listed["items"][0]["needs_reconnect"], false, "{listed}");
    // The refresh was asked once, the revoked token listed once: wiremock's expectations.
    app.api.verify().await;
}

/// The `needs_reconnect_since` of `user`'s connection.
async fn needs_reconnect(app: &TestApp, user: &str) -> bool {
    connections_of(app, user).await[0]
        .needs_reconnect_since
        .is_some()
}

#[tokio::test]
async fn a_key_the_provider_refuses_with_401_needs_a_reconnect_and_a_403_does_not() {
    let app = spawn_app().await;
    // Bob's key was revoked (401); carol's lacks a permission (403); a key that cannot be
    // refreshed has nothing else to try.
    for (user, status) in [("bob", 401), ("carol", 403)] {
        Mock::given(method("GET"))
            .and(path("/v1/items"))
            .and(header("authorization", format!("Bearer token-{user}")))
            .respond_with(ResponseTemplate::new(status).set_body_json(json!({"message": "no"})))
            .up_to_n_times(1)
            .mount(&app.api)
            .await;
    }
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "data": [{"id": "item-1"}], "next_cursor": null
        })))
        .mount(&app.api)
        .await;
    let settings = app
        .settings(&crate::helpers::cursor_provider(
            "acme",
            &app.api.uri(),
            &["bob", "carol"],
        ))
        .await;

    let outcomes = app.sync(&settings).await;
    let statuses: Vec<_> = outcomes
        .iter()
        .map(|o| (o.user_id.as_str(), o.status))
        .collect();
    assert_eq!(
        statuses,
        [("bob", RunStatus::Failed), ("carol", RunStatus::Failed)]
    );
    assert!(needs_reconnect(&app, "bob").await, "a 401 marks it");
    assert!(
        !needs_reconnect(&app, "carol").await,
        "a 403 is a permission, not a revocation"
    );

    // The key works again (say the provider restored it): a run that succeeds clears it.
    let outcomes = app.sync(&settings).await;
    assert!(
        outcomes.iter().all(|o| o.status == RunStatus::Succeeded),
        "{outcomes:?}"
    );
    assert!(!needs_reconnect(&app, "bob").await);
}
