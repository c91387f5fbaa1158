//! Time from the outside is not trusted: a watermark in the future never carries the cursor
//! past the fetch, and rate-limit headers of any value end a run cleanly.

use assert_cmd::Command;
use chrono::{DateTime, Utc};
use sea_orm::EntityTrait;
use serde_json::json;
use tributary::entities::connection;
use tributary::entities::sync_run::RunStatus;
use tributary_providers::Watermark;
use wiremock::matchers::{method, path, query_param_is_missing};
use wiremock::{Mock, ResponseTemplate};

use crate::adapters::issue;
use crate::helpers::{connections, spawn_app, TestApp};

fn github(app: &TestApp) -> String {
    format!(
        "[providers.gh]\nkind = \"github\"\nbase_url = \"{}\"\nschedule = \"0 * * * * *\"\n\
         [providers.gh.http]\nmax_retries = 1\nretry_initial_delay = \"1ms\"\nretry_max_delay = \"5ms\"\n{}",
        app.api.uri(),
        connections("gh", &["alice"])
    )
}

async fn stored_cursor(app: &TestApp) -> Option<Watermark> {
    app.only_stream()
        .await
        .and_then(|state| state.cursor)
        .map(|text| serde_json::from_str(&text).expect("a readable cursor"))
}

/// The `since` of every request the mock API received, in order (`None`: absent).
async fn asked_since(app: &TestApp) -> Vec<Option<String>> {
    let requests = app.api.received_requests().await.unwrap_or_default();
    requests
        .iter()
        .map(|request| {
            request
                .url
                .query_pairs()
                .find(|(name, _)| name == "since")
                .map(|(_, value)| value.into_owned())
        })
        .collect()
}

#[tokio::test]
async fn a_watermark_in_the_future_is_stored_counted_and_never_carries_the_cursor_past_the_fetch() {
    let app = spawn_app().await;
    Mock::given(method("GET"))
        .and(path("/issues"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([
            issue(1, "2026-11-01T10:00:00Z"),
            issue(2, "9999-12-31T23:59:59Z"),
        ])))
        .mount(&app.api)
        .await;
    let settings = app.settings(&github(&app)).await;
    let before = Utc::now();
    let first = app.sync_one(&settings).await;
    let after = Utc::now();
    assert_eq!(
        (first.status, first.counts.inserted),
        (RunStatus::Succeeded, 2),
        "{first:?}"
    );
    assert_eq!(first.counts.watermark_anomalies, 1);
    let ids: Vec<String> = app
        .records()
        .await
        .into_iter()
        .map(|r| r.external_id)
        .collect();
    assert_eq!(ids, ["1", "2"], "the record from the future is stored");
    assert_eq!(app.run_row(first.run_id).await.watermark_anomalies, 1);
    let Some(Watermark::Time(cursor)) = stored_cursor(&app).await else {
        panic!("expected a time cursor");
    };
    assert!(
        before <= cursor && cursor <= after,
        "the cursor {cursor} is the fetch time, between {before} and {after}"
    );

    let second = app.sync_one(&settings).await;
    assert_eq!(second.counts.watermark_anomalies, 1);
    let since = asked_since(&app).await;
    assert_eq!(since.len(), 2, "{since:?}");
    assert_eq!(since[0], None, "the first run is a full pass");
    let asked: DateTime<Utc> = since[1]
        .as_deref()
        .and_then(|text| DateTime::parse_from_rfc3339(text).ok())
        .map(Into::into)
        .expect("the second run asks from a readable since");
    // GitHub is asked `since` in whole seconds.
    assert!(
        asked <= cursor && cursor - asked < chrono::TimeDelta::seconds(1),
        "asked since {asked}, cursor {cursor}"
    );

    let config = app.write_config(&github(&app));
    let runs: serde_json::Value =
        serde_json::from_str(&runs_command(&config, &["--json"])).expect("JSON");
    assert_eq!(runs[0]["watermark_anomalies"], 1, "{runs}");
    let table = runs_command(&config, &["--wide"]);
    assert!(table.contains("ahead"), "{table}");
}

/// `tributary --config CONFIG ARGS`, without the environment's database URL.
fn tributary(config: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::cargo_bin("tributary")
        .expect("binary built")
        .arg("--config")
        .arg(config)
        .args(args)
        .env_remove("TRIBUTARY_DATABASE_URL")
        .output()
        .expect("binary runs")
}

/// `tributary runs ARGS` on `config`, which must succeed; its standard output.
fn runs_command(config: &std::path::Path, args: &[&str]) -> String {
    let output = tributary(config, &[&["runs"], args].concat());
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test]
async fn a_cursor_stored_in_the_future_is_ignored_and_the_run_walks_the_whole_listing() {
    let app = spawn_app().await;
    Mock::given(method("GET"))
        .and(path("/issues"))
        .and(query_param_is_missing("since"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!([issue(1, "2026-11-01T10:00:00Z")])),
        )
        .expect(1)
        .mount(&app.api)
        .await;
    let settings = app.settings(&github(&app)).await;
    // As a version that did not clamp cursors left it.
    connection::Entity::update_many()
        .col_expr(
            connection::Column::Cursor,
            sea_orm::sea_query::Expr::value(r#"{"time":"9999-12-31T23:59:59Z"}"#),
        )
        .exec(&app.db)
        .await
        .expect("cursor set");
    let run = app.sync_one(&settings).await;
    assert_eq!((run.status, run.counts.inserted), (RunStatus::Succeeded, 1));
    assert_eq!(
        stored_cursor(&app).await,
        Some(Watermark::Time(
            DateTime::parse_from_rfc3339("2026-11-01T10:00:00Z")
                .unwrap()
                .into()
        )),
        "the wedged cursor is replaced by the listing's own"
    );
    app.api.verify().await;
}

#[tokio::test]
async fn a_rate_limit_reset_past_any_clock_ends_the_run_cleanly_and_releases_the_lease() {
    let app = spawn_app().await;
    Mock::given(method("GET"))
        .and(path("/issues"))
        .respond_with(
            ResponseTemplate::new(403)
                .insert_header("x-ratelimit-remaining", "0")
                .insert_header("x-ratelimit-reset", "18446744073709551615")
                .set_body_json(json!({"message": "API rate limit exceeded"})),
        )
        .up_to_n_times(1)
        .mount(&app.api)
        .await;
    Mock::given(method("GET"))
        .and(path("/issues"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!([issue(1, "2026-11-01T10:00:00Z")])),
        )
        .mount(&app.api)
        .await;
    let config = app.write_config(&github(&app));
    let sync = || tributary(&config, &["sync", "--quiet"]);
    let first = sync();
    let stderr = String::from_utf8_lossy(&first.stderr);
    assert_eq!(first.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let run = app.run_row(1).await;
    assert_eq!(run.status, RunStatus::Partial, "{run:?}");
    let error = run.error.unwrap_or_default();
    assert!(
        error.contains("rate limited") && error.contains("86400s"),
        "the wait is read as a day at most: {error}"
    );
    let row = connection::Entity::find()
        .one(&app.db)
        .await
        .expect("query")
        .expect("alice's connection");
    assert_eq!(row.lease_holder, None, "the lease is released");

    let second = sync();
    assert_eq!(second.status.code(), Some(0), "{second:?}");
    assert_eq!(app.run_row(2).await.status, RunStatus::Succeeded);
    assert_eq!(app.records().await.len(), 1);
}
