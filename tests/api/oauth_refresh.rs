//! OAuth refreshes against a slow or failing token endpoint: no database lock held while it
//! answers, no refresh lost to a cancelled run, no refresh token spent twice by a retry.

use std::time::{Duration, Instant};

use sea_orm::EntityTrait;
use serde_json::json;
use tributary::entities::connection;
use tributary::entities::sync_run::RunStatus;
use wiremock::matchers::{method, path};
use wiremock::{Mock, ResponseTemplate};

use crate::helpers::{spawn_app, TestApp};

/// A Strava provider whose one connection's access token has expired, so every run
/// refreshes first. `extra` goes into the provider table; `http_timeout` bounds each
/// request.
fn strava(app: &TestApp, extra: &str, http_timeout: &str) -> String {
    std::env::set_var("TRIBUTARY_TEST_STRAVA_SECRET", "client-secret-value");
    format!(
        "[providers.strava]\nkind = \"strava\"\nbase_url = \"{uri}\"\noauth_url = \"{uri}\"\n\
         client_id = \"4242\"\nclient_secret_env = \"TRIBUTARY_TEST_STRAVA_SECRET\"\n\
         schedule = \"0 * * * * *\"\n{extra}\n\
         [providers.strava.http]\nmax_retries = 3\nretry_initial_delay = \"1ms\"\n\
         retry_max_delay = \"5ms\"\ntimeout = \"{http_timeout}\"\n\
         [[providers.strava.connections]]\nuser_id = \"alice\"\ntoken = \"old-access\"\n\
         refresh_token = \"old-refresh\"\nexpires_at = 1\n",
        uri = app.api.uri()
    )
}

fn token_answer() -> ResponseTemplate {
    let in_six_hours = chrono::Utc::now().timestamp() + 6 * 3600;
    ResponseTemplate::new(200).set_body_json(json!({
        "token_type": "Bearer", "access_token": "new-access", "refresh_token": "new-refresh",
        "expires_at": in_six_hours
    }))
}

async fn mount_activities(app: &TestApp) {
    Mock::given(method("GET"))
        .and(path("/api/v3/athlete/activities"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([])))
        .mount(&app.api)
        .await;
}

async fn the_row(app: &TestApp) -> connection::Model {
    connection::Entity::find()
        .one(&app.db)
        .await
        .expect("query")
        .expect("the connection")
}

#[tokio::test]
async fn a_slow_token_endpoint_holds_no_database_lock_while_it_answers() {
    let app = spawn_app().await;
    Mock::given(method("POST"))
        .and(path("/oauth/token"))
        .respond_with(token_answer().set_delay(Duration::from_millis(800)))
        .expect(1)
        .mount(&app.api)
        .await;
    mount_activities(&app).await;
    let settings = app.settings(&strava(&app, "", "1s")).await;
    let id = the_row(&app).await.id;

    let (run, write) = tokio::join!(app.sync_one(&settings), async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        // While the token endpoint answers, another writer touches the same row (and, on
        // SQLite, takes the one write lock).
        let started = Instant::now();
        app.execute(&format!(
            "UPDATE connections SET enabled = enabled WHERE id = {id}"
        ))
        .await;
        started.elapsed()
    });
    assert_eq!(run.status, RunStatus::Succeeded, "{:?}", run.error);
    assert!(
        write < Duration::from_millis(400),
        "a write waited {write:?} for the refresh"
    );
    let row = the_row(&app).await;
    let stored = app.stored_credentials("alice", "strava").await;
    let refreshed = stored.oauth.expect("the refreshed pair is stored");
    assert_eq!(refreshed.refresh_token.as_deref(), Some("new-refresh"));
    assert_eq!(
        row.refresh_holder, None,
        "the claim is cleared with the commit"
    );
    assert_eq!(row.refresh_claimed_until, None);
}

#[tokio::test]
async fn a_refresh_in_flight_is_committed_though_its_run_timed_out() {
    let app = spawn_app().await;
    Mock::given(method("POST"))
        .and(path("/oauth/token"))
        .respond_with(token_answer().set_delay(Duration::from_millis(2500)))
        .expect(1)
        .mount(&app.api)
        .await;
    mount_activities(&app).await;
    // The token endpoint answers within the HTTP timeout but after the run's own limit.
    let providers = strava(&app, "run_timeout = \"1s\"", "5s");
    let settings = app.settings(&providers).await;

    let run = app.sync_one(&settings).await;
    assert_eq!(run.status, RunStatus::Failed, "{:?}", run.error);
    // The refresh outlives the run: its own task commits the rotated pair.
    crate::daemon::eventually(
        Duration::from_secs(10),
        "the rotated pair committed",
        || async {
            let stored = app.stored_credentials("alice", "strava").await;
            stored.oauth.and_then(|oauth| oauth.token).as_deref() == Some("new-access")
        },
    )
    .await;
    let stored = app.stored_credentials("alice", "strava").await;
    let refreshed = stored.oauth.expect("the rotated pair was committed");
    assert_eq!(refreshed.token.as_deref(), Some("new-access"));
    assert_eq!(refreshed.refresh_token.as_deref(), Some("new-refresh"));
}

#[tokio::test]
async fn a_token_post_that_reached_the_server_is_never_sent_again() {
    for (what, answer) in [
        ("a 500", ResponseTemplate::new(500).set_body_string("oops")),
        (
            "a timeout",
            token_answer().set_delay(Duration::from_millis(1500)),
        ),
    ] {
        let app = spawn_app().await;
        Mock::given(method("POST"))
            .and(path("/oauth/token"))
            .respond_with(answer)
            .expect(1)
            .mount(&app.api)
            .await;
        mount_activities(&app).await;
        let settings = app.settings(&strava(&app, "", "1s")).await;
        let before = the_row(&app).await.credentials;

        let run = app.sync_one(&settings).await;
        assert_eq!(run.status, RunStatus::Failed, "{what}: {:?}", run.error);
        let error = run.error.unwrap_or_default();
        assert!(error.contains("oauth/token"), "{what}: {error}");
        let row = the_row(&app).await;
        assert_eq!(
            row.credentials, before,
            "{what}: the tokens it had are kept"
        );
        assert_eq!(row.refresh_holder, None, "{what}: the claim is released");
        app.api.verify().await;
    }
}

/// The first column of every row `sql` returns, as integers.
async fn integers(app: &TestApp, sql: &str) -> Vec<i64> {
    use sea_orm::{ConnectionTrait, Statement};
    let backend = app.db.get_database_backend();
    app.db
        .query_all_raw(Statement::from_string(backend, sql))
        .await
        .expect("query")
        .iter()
        .map(|row| row.try_get_by_index::<i64>(0).expect("an integer"))
        .collect()
}

#[tokio::test]
async fn rotated_tokens_are_committed_durably() {
    let app = spawn_app().await;
    match crate::helpers::backend() {
        crate::helpers::Backend::Sqlite => {
            // A trigger notes the durability level each write of the credentials ran at.
            app.execute("CREATE TABLE durability_log (level INTEGER NOT NULL)")
                .await;
            app.execute(
                "CREATE TRIGGER note_durability AFTER UPDATE OF credentials ON connections \
                 BEGIN INSERT INTO durability_log SELECT synchronous FROM pragma_synchronous; END",
            )
            .await;
        }
        // The servers commit durably unless configured not to; the suite's servers are not.
        crate::helpers::Backend::Postgres => {
            use sea_orm::{ConnectionTrait, Statement};
            let row = app
                .db
                .query_one_raw(Statement::from_string(
                    app.db.get_database_backend(),
                    "SHOW synchronous_commit",
                ))
                .await
                .expect("query")
                .expect("a row");
            assert_eq!(row.try_get_by_index::<String>(0).expect("text"), "on");
        }
        crate::helpers::Backend::Mysql => {
            let level = integers(
                &app,
                "SELECT CAST(@@innodb_flush_log_at_trx_commit AS SIGNED)",
            )
            .await;
            assert_eq!(level, [1]);
        }
    }
    Mock::given(method("POST"))
        .and(path("/oauth/token"))
        .respond_with(token_answer())
        .expect(1)
        .mount(&app.api)
        .await;
    mount_activities(&app).await;
    let settings = app.settings(&strava(&app, "", "1s")).await;
    let run = app.sync_one(&settings).await;
    assert_eq!(run.status, RunStatus::Succeeded, "{:?}", run.error);
    let stored = app.stored_credentials("alice", "strava").await;
    assert!(stored.oauth.is_some(), "the rotated pair is stored");
    if crate::helpers::backend() == crate::helpers::Backend::Sqlite {
        // FULL is 2, NORMAL 1: the refresh's write was the last one, at FULL, and the
        // writer is back at NORMAL for everything else.
        let levels = integers(&app, "SELECT level FROM durability_log ORDER BY rowid").await;
        assert_eq!(levels.last(), Some(&2), "{levels:?}");
        assert_eq!(integers(&app, "PRAGMA synchronous").await, [1]);
    }
}

#[tokio::test]
async fn a_rotated_refresh_token_is_kept_when_the_answer_is_refused() {
    let oversized = "a".repeat(17 * 1024);
    for (refused, answer) in [
        (
            "token_type",
            json!({"token_type": "mac", "access_token": "new-access",
                   "refresh_token": "new-refresh", "expires_in": 3600}),
        ),
        (
            "longer than",
            json!({"token_type": "Bearer", "access_token": oversized,
                   "refresh_token": "new-refresh", "expires_in": 3600}),
        ),
    ] {
        let app = spawn_app().await;
        Mock::given(method("POST"))
            .and(path("/oauth/token"))
            .respond_with(ResponseTemplate::new(200).set_body_json(answer))
            .expect(1)
            .mount(&app.api)
            .await;
        mount_activities(&app).await;
        let settings = app.settings(&strava(&app, "", "1s")).await;

        let run = app.sync_one(&settings).await;
        assert_eq!(run.status, RunStatus::Failed, "{refused}: {:?}", run.error);
        let error = run.error.unwrap_or_default();
        assert!(error.contains(refused), "{error}");
        // The old refresh token may be revoked already: the one the endpoint rotated is
        // stored, sealed, beside the access token that was still the connection's.
        let row = the_row(&app).await;
        assert!(
            row.credentials.starts_with("sealed:"),
            "{refused}: stored sealed"
        );
        assert_eq!(row.refresh_holder, None, "{refused}: the claim is cleared");
        let stored = app.stored_credentials("alice", "strava").await;
        let kept = stored.oauth.expect("the rotated refresh token is stored");
        assert_eq!(
            kept.refresh_token.as_deref(),
            Some("new-refresh"),
            "{refused}"
        );
        assert_eq!(kept.token.as_deref(), Some("old-access"), "{refused}");
    }
}
