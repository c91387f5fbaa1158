//! Streams: a connection's listings, each with its own runs, cursor, checkpoint and
//! namespace, and child streams walked per stored parent record. GitHub's API as its
//! documentation describes it stands in.

use chrono::{DateTime, Utc};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder, Set,
    Statement,
};
use serde_json::json;
use tributary::entities::sync_run::RunStatus;
use tributary::entities::{connection, connection_stream, record, sync_run};
use wiremock::matchers::{header, method, path, query_param, query_param_is_missing};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::helpers::{connections, kill_sync_at_parent, run, spawn_app, tributary, TestApp};

/// A `github` provider named `gh` syncing `streams` for alice.
fn github(app: &TestApp, streams: &str) -> String {
    format!(
        "[providers.gh]\nkind = \"github\"\nbase_url = \"{}\"\nschedule = \"0 * * * * *\"\n\
         streams = {streams}\n\
         [providers.gh.http]\nmax_retries = 0\nretry_initial_delay = \"1ms\"\n{}",
        app.api.uri(),
        connections("gh", &["alice"])
    )
}

fn repo(id: u64, full_name: &str, updated_at: &str) -> serde_json::Value {
    let (owner, name) = full_name.split_once('/').expect("owner/name");
    json!({"id": id, "name": name, "full_name": full_name, "owner": {"login": owner},
           "private": false, "updated_at": updated_at})
}

fn issue(id: u64, updated_at: &str) -> serde_json::Value {
    json!({"id": id, "number": id, "title": format!("Issue {id}"), "state": "open",
           "updated_at": updated_at})
}

fn pull(id: u64, updated_at: &str) -> serde_json::Value {
    json!({"id": id, "number": id, "state": "open", "title": format!("PR {id}"),
           "updated_at": updated_at})
}

fn github_get(endpoint: &str) -> wiremock::MockBuilder {
    Mock::given(method("GET"))
        .and(path(endpoint))
        .and(header("authorization", "Bearer token-alice"))
        .and(header("x-github-api-version", "2022-11-28"))
}

async fn mount_repos(api: &MockServer, repos: serde_json::Value) {
    github_get("/user/repos")
        .and(query_param(
            "affiliation",
            "owner,collaborator,organization_member",
        ))
        .respond_with(ResponseTemplate::new(200).set_body_json(repos))
        .mount(api)
        .await;
}

async fn mount_issues(api: &MockServer, issues: serde_json::Value) {
    github_get("/issues")
        .and(query_param("filter", "all"))
        .respond_with(ResponseTemplate::new(200).set_body_json(issues))
        .mount(api)
        .await;
}

/// One page of `full_name`'s pull requests; `next`, when given, is the `page` of the
/// page after it, sent as GitHub's `Link` header.
fn pulls_page(
    api: &MockServer,
    full_name: &str,
    page: Option<u32>,
    next: Option<u32>,
    pulls: serde_json::Value,
) -> Mock {
    let endpoint = format!("/repos/{full_name}/pulls");
    let mut mock = github_get(&endpoint)
        .and(query_param("state", "all"))
        .and(query_param("sort", "updated"))
        .and(query_param("direction", "desc"));
    mock = match page {
        None => mock.and(query_param_is_missing("page")),
        Some(page) => mock.and(query_param("page", page.to_string())),
    };
    let mut response = ResponseTemplate::new(200).set_body_json(pulls);
    if let Some(next) = next {
        response = response.insert_header(
            "link",
            format!(
                "<{}{endpoint}?state=all&sort=updated&direction=desc&per_page=100&page={next}>; \
                 rel=\"next\"",
                api.uri()
            ),
        );
    }
    mock.respond_with(response)
}

/// The stored records as (namespace, external id), in key order.
async fn keys(app: &TestApp) -> Vec<(String, String)> {
    app.records()
        .await
        .into_iter()
        .map(|record| (record.provider, record.external_id))
        .collect()
}

fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected
        .iter()
        .map(|(namespace, id)| (namespace.to_string(), id.to_string()))
        .collect()
}

async fn stream_state(app: &TestApp, stream: &str) -> connection_stream::Model {
    connection_stream::Entity::find()
        .filter(connection_stream::Column::Stream.eq(stream))
        .one(&app.db)
        .await
        .expect("connection_streams")
        .unwrap_or_else(|| panic!("no state for stream {stream}"))
}

/// How many requests the API received for `endpoint`.
async fn requests_to(api: &MockServer, endpoint: &str) -> usize {
    api.received_requests()
        .await
        .unwrap_or_default()
        .iter()
        .filter(|request| request.url.path() == endpoint)
        .count()
}

#[tokio::test]
async fn each_stream_runs_with_its_own_state_and_equal_ids_of_two_streams_are_two_records() {
    let app = spawn_app().await;
    // A repository and an issue that share the number 7, as ids of two of GitHub's
    // resources can.
    mount_repos(
        &app.api,
        json!([repo(7, "octo/widgets", "2026-11-02T10:00:00Z")]),
    )
    .await;
    mount_issues(&app.api, json!([issue(7, "2026-11-03T10:00:00Z")])).await;
    pulls_page(
        &app.api,
        "octo/widgets",
        None,
        None,
        json!([pull(70, "2026-11-04T10:00:00Z")]),
    )
    .mount(&app.api)
    .await;
    let settings = app
        .settings(&github(&app, r#"["pull_requests", "issues", "repos"]"#))
        .await;

    let outcomes = app.sync(&settings).await;
    let ran: Vec<(&str, RunStatus, u64)> = outcomes
        .iter()
        .map(|o| (o.stream.as_str(), o.status, o.counts.inserted))
        .collect();
    // Parents before their children, otherwise in the order given.
    assert_eq!(
        ran,
        [
            ("issues", RunStatus::Succeeded, 1),
            ("repos", RunStatus::Succeeded, 1),
            ("pull_requests", RunStatus::Succeeded, 1)
        ]
    );
    assert_eq!(
        keys(&app).await,
        pairs(&[("gh", "7"), ("gh.pull_requests", "70"), ("gh.repos", "7")])
    );
    let runs = sync_run::Entity::find()
        .order_by_asc(sync_run::Column::Id)
        .all(&app.db)
        .await
        .expect("runs");
    let streams: Vec<Option<&str>> = runs.iter().map(|run| run.stream.as_deref()).collect();
    assert_eq!(
        streams,
        [Some("issues"), Some("repos"), Some("pull_requests")]
    );
    for (stream, cursor) in [
        ("issues", r#"{"time":"2026-11-03T10:00:00Z"}"#),
        ("repos", r#"{"time":"2026-11-02T10:00:00Z"}"#),
    ] {
        let state = stream_state(&app, stream).await;
        assert_eq!(state.cursor.as_deref(), Some(cursor), "{stream}");
        assert_eq!(state.checkpoint, None);
        let run = runs
            .iter()
            .find(|run| run.stream.as_deref() == Some(stream));
        assert_eq!(state.last_success_run_id, run.map(|run| run.id));
    }

    // Run twice, insert once, stream by stream.
    let again = app.sync(&settings).await;
    assert!(
        again
            .iter()
            .all(|o| o.counts.inserted == 0 && o.status == RunStatus::Succeeded),
        "{again:?}"
    );
    assert_eq!(app.records().await.len(), 3);
}

#[tokio::test]
async fn a_failing_stream_leaves_its_siblings_progress_committed() {
    let app = spawn_app().await;
    mount_issues(&app.api, json!([issue(1, "2026-11-03T10:00:00Z")])).await;
    github_get("/user/repos")
        .respond_with(ResponseTemplate::new(500).set_body_json(json!({"message": "boom"})))
        .mount(&app.api)
        .await;
    let settings = app.settings(&github(&app, r#"["repos", "issues"]"#)).await;

    let outcomes = app.sync(&settings).await;
    let ran: Vec<(&str, RunStatus)> = outcomes
        .iter()
        .map(|o| (o.stream.as_str(), o.status))
        .collect();
    assert_eq!(
        ran,
        [
            ("repos", RunStatus::Failed),
            ("issues", RunStatus::Succeeded)
        ]
    );
    assert!(
        outcomes[0].error.as_deref().unwrap_or("").contains("500"),
        "{:?}",
        outcomes[0].error
    );
    assert_eq!(keys(&app).await, pairs(&[("gh", "1")]));
    let issues = stream_state(&app, "issues").await;
    assert_eq!(
        issues.cursor.as_deref(),
        Some(r#"{"time":"2026-11-03T10:00:00Z"}"#)
    );
    assert_eq!(issues.last_success_run_id, Some(outcomes[1].run_id));
    let repos = stream_state(&app, "repos").await;
    assert_eq!((repos.cursor, repos.last_success_run_id), (None, None));
}

/// Stores repositories 1, 2 and 3 (external ids in that order) for alice.
async fn three_repositories(app: &TestApp) {
    mount_repos(
        &app.api,
        json!([
            repo(1, "octo/one", "2026-11-01T10:00:00Z"),
            repo(2, "octo/two", "2026-11-01T10:00:00Z"),
            repo(3, "octo/three", "2026-11-01T10:00:00Z"),
        ]),
    )
    .await;
}

/// The pull requests of the three repositories; two's span two pages.
async fn mount_three_repositories_pulls(api: &MockServer) {
    pulls_page(
        api,
        "octo/one",
        None,
        None,
        json!([pull(11, "2026-11-01T11:00:00Z")]),
    )
    .mount(api)
    .await;
    pulls_page(
        api,
        "octo/two",
        None,
        Some(2),
        json!([pull(21, "2026-11-01T12:00:00Z")]),
    )
    .mount(api)
    .await;
    pulls_page(
        api,
        "octo/two",
        Some(2),
        None,
        json!([pull(22, "2026-11-01T11:00:00Z")]),
    )
    .mount(api)
    .await;
    pulls_page(
        api,
        "octo/three",
        None,
        None,
        json!([pull(31, "2026-11-01T11:00:00Z")]),
    )
    .mount(api)
    .await;
}

#[tokio::test]
async fn a_child_stream_stopped_mid_parents_resumes_at_the_parent_it_reached() {
    let app = spawn_app().await;
    three_repositories(&app).await;
    let settings = app
        .settings(&github(&app, r#"["repos", "pull_requests"]"#))
        .await;
    // Repository two's second page fails once.
    pulls_page(
        &app.api,
        "octo/one",
        None,
        None,
        json!([pull(11, "2026-11-01T11:00:00Z")]),
    )
    .mount(&app.api)
    .await;
    pulls_page(
        &app.api,
        "octo/two",
        None,
        Some(2),
        json!([pull(21, "2026-11-01T12:00:00Z")]),
    )
    .mount(&app.api)
    .await;
    github_get("/repos/octo/two/pulls")
        .and(query_param("page", "2"))
        .respond_with(ResponseTemplate::new(502))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&app.api)
        .await;
    pulls_page(
        &app.api,
        "octo/two",
        Some(2),
        None,
        json!([pull(22, "2026-11-01T11:00:00Z")]),
    )
    .mount(&app.api)
    .await;
    pulls_page(
        &app.api,
        "octo/three",
        None,
        None,
        json!([pull(31, "2026-11-01T11:00:00Z")]),
    )
    .mount(&app.api)
    .await;

    let first = app.sync(&settings).await;
    assert_eq!(first[1].stream, "pull_requests");
    assert_eq!(first[1].status, RunStatus::Failed, "{:?}", first[1]);
    let checkpoint: serde_json::Value = serde_json::from_str(
        stream_state(&app, "pull_requests")
            .await
            .checkpoint
            .as_deref()
            .expect("a checkpoint"),
    )
    .expect("JSON");
    assert_eq!(checkpoint["parent"], "2", "{checkpoint}");
    assert!(
        checkpoint["position"]["url"]
            .as_str()
            .is_some_and(|url| url.ends_with("page=2")),
        "{checkpoint}"
    );
    assert_eq!(requests_to(&app.api, "/repos/octo/three/pulls").await, 0);

    let second = app.sync(&settings).await;
    assert_eq!(second[1].status, RunStatus::Succeeded, "{:?}", second[1]);
    // The second run went on at repository two's second page: one's pull requests and
    // two's first page were not asked for again.
    assert_eq!(requests_to(&app.api, "/repos/octo/one/pulls").await, 1);
    assert_eq!(requests_to(&app.api, "/repos/octo/two/pulls").await, 3);
    assert_eq!(requests_to(&app.api, "/repos/octo/three/pulls").await, 1);
    assert_eq!(second[1].counts.inserted, 2);
    assert_eq!(stream_state(&app, "pull_requests").await.checkpoint, None);

    // It ends as a run that was never stopped does.
    let uninterrupted = spawn_app().await;
    three_repositories(&uninterrupted).await;
    mount_three_repositories_pulls(&uninterrupted.api).await;
    let other = uninterrupted
        .settings(&github(&uninterrupted, r#"["repos", "pull_requests"]"#))
        .await;
    let clean = uninterrupted.sync(&other).await;
    assert!(clean.iter().all(|o| o.status == RunStatus::Succeeded));
    let payloads = |records: Vec<record::Model>| -> Vec<(String, String, String)> {
        records
            .into_iter()
            .map(|r| (r.provider, r.external_id, r.payload))
            .collect()
    };
    assert_eq!(
        payloads(app.records().await),
        payloads(uninterrupted.records().await)
    );
}

#[tokio::test]
async fn deleted_parents_are_skipped_and_a_repository_no_longer_visible_is_counted() {
    let app = spawn_app().await;
    three_repositories(&app).await;
    let settings = app
        .settings(&github(&app, r#"["repos", "pull_requests"]"#))
        .await;
    let repos_only = app.settings(&github(&app, r#"["repos"]"#)).await;
    app.sync(&repos_only).await;
    // Repository two was marked deleted by an earlier complete pass.
    app.db
        .execute_raw(Statement::from_string(
            app.db.get_database_backend(),
            "UPDATE records SET deleted_at = created_at WHERE provider = 'gh.repos' \
             AND external_id = '2'",
        ))
        .await
        .expect("marked");
    pulls_page(
        &app.api,
        "octo/one",
        None,
        None,
        json!([pull(11, "2026-11-01T11:00:00Z")]),
    )
    .mount(&app.api)
    .await;
    github_get("/repos/octo/three/pulls")
        .respond_with(ResponseTemplate::new(404).set_body_json(json!({
            "message": "Not Found",
            "documentation_url": "https://docs.github.com/rest/pulls/pulls#list-pull-requests"
        })))
        .mount(&app.api)
        .await;

    let outcomes = app.sync(&settings).await;
    let pulls = &outcomes[1];
    assert_eq!(pulls.stream, "pull_requests");
    assert_eq!(pulls.status, RunStatus::Succeeded, "{pulls:?}");
    assert_eq!(
        (pulls.counts.inserted, pulls.counts.parents_skipped),
        (1, 1)
    );
    assert_eq!(requests_to(&app.api, "/repos/octo/two/pulls").await, 0);
    let row = app.run_row(pulls.run_id).await;
    assert_eq!(row.parents_skipped, 1);
    assert_eq!(
        keys(&app)
            .await
            .into_iter()
            .filter(|(namespace, _)| namespace == "gh.pull_requests")
            .collect::<Vec<_>>(),
        pairs(&[("gh.pull_requests", "11")])
    );
}

#[tokio::test]
async fn a_new_parent_is_listed_in_full_and_a_known_one_down_to_the_cursor() {
    let app = spawn_app().await;
    mount_repos(
        &app.api,
        json!([repo(1, "octo/one", "2026-11-01T10:00:00Z")]),
    )
    .await;
    let settings = app
        .settings(&github(&app, r#"["repos", "pull_requests"]"#))
        .await;
    pulls_page(
        &app.api,
        "octo/one",
        None,
        None,
        json!([pull(11, "2026-11-01T11:00:00Z")]),
    )
    .up_to_n_times(1)
    .mount(&app.api)
    .await;
    let first = app.sync(&settings).await;
    assert_eq!(first[1].counts.inserted, 1, "{first:?}");

    // Repository two appears; both list a pull request older than the cursor.
    app.api.reset().await;
    mount_repos(
        &app.api,
        json!([
            repo(1, "octo/one", "2026-11-01T10:00:00Z"),
            repo(2, "octo/two", "2026-11-01T10:00:00Z"),
        ]),
    )
    .await;
    pulls_page(
        &app.api,
        "octo/one",
        None,
        None,
        json!([
            pull(12, "2026-11-05T09:00:00Z"),
            pull(11, "2026-11-01T11:00:00Z"),
            pull(10, "2026-10-01T00:00:00Z"),
        ]),
    )
    .mount(&app.api)
    .await;
    pulls_page(
        &app.api,
        "octo/two",
        None,
        None,
        json!([pull(21, "2020-01-01T00:00:00Z")]),
    )
    .mount(&app.api)
    .await;
    let second = app.sync(&settings).await;
    let pulls = &second[1];
    assert_eq!(pulls.status, RunStatus::Succeeded, "{pulls:?}");
    // One's listing stopped at the first pull request older than the cursor (the one of
    // the cursor's own second is read again); two's, new since the last complete run,
    // was read whole however old.
    assert_eq!((pulls.counts.fetched, pulls.counts.inserted), (3, 2));
    let stored: Vec<String> = keys(&app)
        .await
        .into_iter()
        .filter(|(namespace, _)| namespace == "gh.pull_requests")
        .map(|(_, id)| id)
        .collect();
    assert_eq!(stored, ["11", "12", "21"]);
}

/// Answers with `body` and notes when it was asked.
struct Noting {
    body: serde_json::Value,
    at: std::sync::Arc<std::sync::Mutex<Option<DateTime<Utc>>>>,
}

impl wiremock::Respond for Noting {
    fn respond(&self, _: &wiremock::Request) -> ResponseTemplate {
        if let Ok(mut at) = self.at.lock() {
            at.get_or_insert_with(Utc::now);
        }
        ResponseTemplate::new(200).set_body_json(self.body.clone())
    }
}

#[tokio::test]
async fn a_child_streams_cursor_never_passes_the_start_of_its_walk() {
    let app = spawn_app().await;
    mount_repos(
        &app.api,
        json!([
            repo(1, "octo/one", "2026-11-01T10:00:00Z"),
            repo(2, "octo/two", "2026-11-01T10:00:00Z"),
        ]),
    )
    .await;
    let first_asked = std::sync::Arc::new(std::sync::Mutex::new(None));
    github_get("/repos/octo/one/pulls")
        .respond_with(Noting {
            body: json!([pull(11, "2026-11-01T11:00:00Z")]),
            at: first_asked.clone(),
        })
        .mount(&app.api)
        .await;
    // Repository two's pull request changed after repository one was listed (a clock
    // ahead stands in for "later"): one's may have changed meanwhile too, unseen.
    github_get("/repos/octo/two/pulls")
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!([pull(21, "2999-01-01T00:00:00Z")]))
                .set_delay(std::time::Duration::from_millis(50)),
        )
        .mount(&app.api)
        .await;
    let settings = app
        .settings(&github(&app, r#"["repos", "pull_requests"]"#))
        .await;
    let outcomes = app.sync(&settings).await;
    assert_eq!(outcomes[1].status, RunStatus::Succeeded, "{outcomes:?}");

    let cursor = stream_state(&app, "pull_requests")
        .await
        .cursor
        .expect("a cursor");
    let cursor: serde_json::Value = serde_json::from_str(&cursor).expect("JSON");
    let cursor: DateTime<Utc> = cursor["time"]
        .as_str()
        .expect("a time cursor")
        .parse()
        .expect("RFC 3339");
    let first_asked = first_asked
        .lock()
        .expect("lock")
        .expect("repository one was listed");
    assert!(
        cursor <= first_asked,
        "the cursor {cursor} passed the walk's first request at {first_asked}"
    );
}

#[tokio::test]
async fn the_primary_stream_takes_over_the_cursor_the_connection_kept_before_streams() {
    let app = spawn_app().await;
    let settings = app.settings(&github(&app, r#"["issues"]"#)).await;
    // As an upgraded database holds it: the connection's own cursor, no stream rows.
    let alice = connection::Entity::find()
        .one(&app.db)
        .await
        .expect("query")
        .expect("alice");
    let mut legacy: connection::ActiveModel = alice.clone().into();
    legacy.cursor = Set(Some(r#"{"time":"2026-10-01T00:00:00Z"}"#.to_string()));
    legacy.last_success_run_id = Set(Some(41));
    legacy.update(&app.db).await.expect("legacy state");
    github_get("/issues")
        .and(query_param("since", "2026-10-01T00:00:00Z"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!([issue(5, "2026-11-05T00:00:00Z")])),
        )
        .expect(1)
        .mount(&app.api)
        .await;

    let run = app.sync_one(&settings).await;
    assert_eq!((run.status, run.counts.inserted), (RunStatus::Succeeded, 1));
    app.api.verify().await;
    let state = stream_state(&app, "issues").await;
    assert_eq!(
        state.cursor.as_deref(),
        Some(r#"{"time":"2026-11-05T00:00:00Z"}"#)
    );
    assert_eq!(state.last_success_run_id, Some(run.run_id));
    let alice = connection::Entity::find_by_id(alice.id)
        .one(&app.db)
        .await
        .expect("query")
        .expect("alice");
    assert_eq!(
        (alice.cursor, alice.checkpoint, alice.last_success_run_id),
        (None, None, None),
        "moved, not copied"
    );
    assert_eq!(keys(&app).await, pairs(&[("gh", "5")]));
}

#[tokio::test]
async fn the_cli_syncs_lists_and_filters_by_stream() {
    let app = spawn_app().await;
    mount_issues(&app.api, json!([issue(1, "2026-11-03T10:00:00Z")])).await;
    mount_repos(
        &app.api,
        json!([
            repo(7, "octo/widgets", "2026-11-02T10:00:00Z"),
            {"name": "no id"}
        ]),
    )
    .await;
    let config = app.write_config(&github(&app, r#"["issues", "repos"]"#));

    let one = run(tributary(&config).args(["sync", "--stream", "repos", "--json"]));
    assert_eq!(one.code, 0, "{}", one.stderr);
    let report: serde_json::Value = serde_json::from_str(&one.stdout).expect("JSON");
    let ran: Vec<&str> = report["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .map(|run| run["stream"].as_str().expect("a stream"))
        .collect();
    assert_eq!(ran, ["repos"]);

    let unknown = run(tributary(&config).args(["sync", "--stream", "wikis"]));
    assert_eq!(unknown.code, 1, "{}", unknown.stdout);
    assert!(
        unknown.stderr.contains(
            "no provider in the config syncs a stream named \"wikis\"; configured: \
             gh.issues, gh.repos"
        ),
        "{}",
        unknown.stderr
    );

    let both = run(tributary(&config).args(["sync", "--quiet"]));
    assert_eq!(both.code, 0, "{}", both.stderr);
    assert!(
        both.stdout
            .contains("alice@gh succeeded stream=issues pages=1")
            && both
                .stdout
                .contains("alice@gh partial stream=repos pages=1"),
        "{}",
        both.stdout
    );

    let runs = run(tributary(&config).args(["runs", "--stream", "repos", "--json"]));
    assert_eq!(runs.code, 0, "{}", runs.stderr);
    let runs: serde_json::Value = serde_json::from_str(&runs.stdout).expect("JSON");
    let streams: Vec<&str> = runs
        .as_array()
        .expect("runs")
        .iter()
        .map(|run| run["stream"].as_str().expect("a stream"))
        .collect();
    assert_eq!(streams, ["repos", "repos"]);

    let errors = |stream: &str| {
        let output =
            run(tributary(&config).args(["errors", "--open", "--stream", stream, "--json"]));
        assert_eq!(output.code, 0, "{}", output.stderr);
        let errors: serde_json::Value = serde_json::from_str(&output.stdout).expect("JSON");
        errors
            .as_array()
            .expect("errors")
            .iter()
            .map(|error| error["payload"].as_str().expect("a payload").to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        errors("repos"),
        [r#"{"name":"no id"}"#, r#"{"name":"no id"}"#]
    );
    assert!(errors("issues").is_empty());

    let list = run(tributary(&config).args(["connections", "list", "--json"]));
    assert_eq!(list.code, 0, "{}", list.stderr);
    let list: serde_json::Value = serde_json::from_str(&list.stdout).expect("JSON");
    let lines: Vec<(&str, &str, Option<&str>)> = list
        .as_array()
        .expect("connections")
        .iter()
        .map(|line| {
            (
                line["user_id"].as_str().expect("a user"),
                line["stream"].as_str().expect("a stream"),
                line["cursor"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        lines,
        [
            (
                "alice",
                "issues",
                Some(r#"{"time":"2026-11-03T10:00:00Z"}"#)
            ),
            ("alice", "repos", Some(r#"{"time":"2026-11-02T10:00:00Z"}"#)),
        ]
    );
    let table = run(tributary(&config).args(["connections", "list"]));
    assert!(table.stdout.contains("stream") && table.stdout.contains("repos"));
}

/// Strava as its documentation describes its budget: every answer carries the
/// application's 15-minute and daily usage, counting every request of the application.
struct StravaBudget {
    used: std::sync::atomic::AtomicUsize,
}

impl wiremock::Respond for StravaBudget {
    fn respond(&self, request: &wiremock::Request) -> ResponseTemplate {
        let used = self.used.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        let first_page = request
            .url
            .query_pairs()
            .any(|(name, value)| name == "page" && value == "1");
        // Strava's activities end with an empty page.
        let body = match (request.url.path(), first_page) {
            ("/api/v3/athlete", _) => json!({"id": 100, "username": "athlete"}),
            (_, true) => json!([{"id": used, "name": "Run", "start_date": "2026-11-01T07:00:00Z"}]),
            (_, false) => json!([]),
        };
        ResponseTemplate::new(200)
            .insert_header("x-ratelimit-limit", "100,1000")
            .insert_header("x-ratelimit-usage", format!("{used},{used}").as_str())
            .set_body_json(body)
    }
}

#[tokio::test]
async fn stravas_budget_is_shared_by_every_stream_and_connection_of_the_application() {
    let app = spawn_app().await;
    std::env::set_var("TRIBUTARY_TEST_STRAVA_BUDGET_SECRET", "client-secret-value");
    let later = chrono::Utc::now().timestamp() + 6 * 3600;
    let connection = |user: &str| {
        format!(
            "[[providers.strava.connections]]\nuser_id = \"{user}\"\ntoken = \"access-{user}\"\n\
             refresh_token = \"refresh-{user}\"\nexpires_at = {later}\n"
        )
    };
    // A reserve of 96 of the 100 requests of the window: four requests may go. One
    // connection at a time, so the order is known.
    let providers = format!(
        "[providers.strava]\nkind = \"strava\"\nbase_url = \"{uri}\"\noauth_url = \"{uri}\"\n\
         client_id = \"4242\"\nclient_secret_env = \"TRIBUTARY_TEST_STRAVA_BUDGET_SECRET\"\n\
         schedule = \"0 * * * * *\"\nstreams = [\"activities\", \"athlete\"]\n\
         rate_limit_reserve = 96\nmax_concurrent_connections = 1\n\
         [providers.strava.http]\nmax_rate_limit_wait = \"1s\"\n{}{}",
        connection("alice"),
        connection("bob"),
        uri = app.api.uri()
    );
    Mock::given(method("GET"))
        .respond_with(StravaBudget {
            used: std::sync::atomic::AtomicUsize::new(0),
        })
        .mount(&app.api)
        .await;
    let settings = app.settings(&providers).await;

    let outcomes = app.sync(&settings).await;
    let ran: Vec<(&str, &str, RunStatus, u64)> = outcomes
        .iter()
        .map(|o| {
            (
                o.user_id.as_str(),
                o.stream.as_str(),
                o.status,
                o.counts.pages_fetched,
            )
        })
        .collect();
    // Alice's two streams spent three requests; Bob's activities the fourth, and then
    // the window was spent for his athlete too.
    assert_eq!(
        ran,
        [
            ("alice", "activities", RunStatus::Succeeded, 2),
            ("alice", "athlete", RunStatus::Succeeded, 1),
            ("bob", "activities", RunStatus::Partial, 1),
            ("bob", "athlete", RunStatus::Partial, 0),
        ]
    );
    for limited in &outcomes[2..] {
        assert!(
            limited
                .error
                .as_deref()
                .is_some_and(|error| error.contains("rate limited")),
            "{limited:?}"
        );
    }
    assert_eq!(
        app.api.received_requests().await.unwrap_or_default().len(),
        4,
        "two streams of two connections shared the window's four requests"
    );
}

#[tokio::test]
async fn a_child_stream_killed_mid_parents_resumes_at_the_parent_it_reached() {
    let app = spawn_app().await;
    three_repositories(&app).await;
    // Repository two's second page answers slowly the first time: the process is killed
    // while it waits, with two's first page committed.
    pulls_page(
        &app.api,
        "octo/one",
        None,
        None,
        json!([pull(11, "2026-11-01T11:00:00Z")]),
    )
    .mount(&app.api)
    .await;
    pulls_page(
        &app.api,
        "octo/two",
        None,
        Some(2),
        json!([pull(21, "2026-11-01T12:00:00Z")]),
    )
    .mount(&app.api)
    .await;
    github_get("/repos/octo/two/pulls")
        .and(query_param("page", "2"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!([pull(22, "2026-11-01T11:00:00Z")]))
                .set_delay(std::time::Duration::from_secs(60)),
        )
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&app.api)
        .await;
    pulls_page(
        &app.api,
        "octo/two",
        Some(2),
        None,
        json!([pull(22, "2026-11-01T11:00:00Z")]),
    )
    .mount(&app.api)
    .await;
    pulls_page(
        &app.api,
        "octo/three",
        None,
        None,
        json!([pull(31, "2026-11-01T11:00:00Z")]),
    )
    .mount(&app.api)
    .await;
    let providers = github(&app, r#"["repos", "pull_requests"]"#);
    let config = app.write_config(&providers);

    let reached = kill_sync_at_parent(&app, &config, "pull_requests", "2").await;
    assert!(
        reached["position"]["url"]
            .as_str()
            .is_some_and(|url| url.ends_with("page=2")),
        "{reached}"
    );
    assert_eq!(requests_to(&app.api, "/repos/octo/three/pulls").await, 0);

    // The next run takes the dead process's lease over and goes on at two's second page.
    let settings = app.settings(&providers).await;
    let resumed = app.sync(&settings).await;
    let pulls = resumed
        .iter()
        .find(|o| o.stream == "pull_requests")
        .expect("a pull_requests run");
    assert_eq!(pulls.status, RunStatus::Succeeded, "{resumed:?}");
    assert_eq!(
        (pulls.counts.pages_fetched, pulls.counts.inserted),
        (2, 2),
        "two's second page and three's"
    );
    assert_eq!(requests_to(&app.api, "/repos/octo/one/pulls").await, 1);
    assert_eq!(requests_to(&app.api, "/repos/octo/two/pulls").await, 3);
    assert_eq!(requests_to(&app.api, "/repos/octo/three/pulls").await, 1);

    let uninterrupted = spawn_app().await;
    three_repositories(&uninterrupted).await;
    mount_three_repositories_pulls(&uninterrupted.api).await;
    let other = uninterrupted
        .settings(&github(&uninterrupted, r#"["repos", "pull_requests"]"#))
        .await;
    uninterrupted.sync(&other).await;
    let content = |records: Vec<record::Model>| -> Vec<(String, String, String)> {
        records
            .into_iter()
            .map(|r| (r.provider, r.external_id, r.payload))
            .collect()
    };
    assert_eq!(
        content(app.records().await),
        content(uninterrupted.records().await)
    );
}

#[tokio::test]
async fn a_full_pass_that_skipped_a_parent_marks_none_of_its_records_deleted() {
    let app = spawn_app().await;
    mount_repos(
        &app.api,
        json!([
            repo(1, "octo/one", "2026-11-01T10:00:00Z"),
            repo(2, "octo/two", "2026-11-01T10:00:00Z"),
        ]),
    )
    .await;
    pulls_page(
        &app.api,
        "octo/one",
        None,
        None,
        json!([pull(11, "2026-11-01T11:00:00Z")]),
    )
    .up_to_n_times(1)
    .mount(&app.api)
    .await;
    pulls_page(
        &app.api,
        "octo/two",
        None,
        None,
        json!([pull(21, "2026-11-01T11:00:00Z")]),
    )
    .up_to_n_times(1)
    .mount(&app.api)
    .await;
    let providers = github(&app, r#"["repos", "pull_requests"]"#)
        .replace("streams = ", "track_deletes = true\nstreams = ");
    let settings = app.settings(&providers).await;
    app.sync(&settings).await;

    // A full pass: repository one lists nothing now, and two answers 403 for a while.
    pulls_page(&app.api, "octo/one", None, None, json!([]))
        .mount(&app.api)
        .await;
    github_get("/repos/octo/two/pulls")
        .respond_with(ResponseTemplate::new(403).set_body_json(json!({
            "message": "Resource not accessible by personal access token",
            "documentation_url": "https://docs.github.com/rest/pulls/pulls#list-pull-requests"
        })))
        .mount(&app.api)
        .await;
    let full = tributary::sync::sync_matching(
        &app.db,
        &settings,
        &tributary::sync::SyncFilter {
            stream: Some("pull_requests".to_string()),
            ..Default::default()
        },
        &tributary::pipeline::RunOptions {
            full: true,
            ..tributary::pipeline::RunOptions::manual()
        },
        &tributary::pipeline::NoProgress,
    )
    .await
    .expect("runs recorded")
    .outcomes;
    let pulls = &full[0];
    assert_eq!(
        (
            pulls.status,
            pulls.counts.parents_skipped,
            pulls.counts.deleted
        ),
        (RunStatus::Succeeded, 1, 0),
        "{pulls:?}"
    );
    assert_eq!(
        pulls.error.as_deref(),
        Some(
            "deletions not applied: 1 parent record(s) could not be listed, so which of \
             their records still exist is not known"
        )
    );
    assert!(
        app.records().await.iter().all(|r| r.deleted_at.is_none()),
        "nothing marked deleted"
    );
}

/// A daemon's config with alice's GitHub connection syncing `issues` and `repos` every
/// second, one repository and one issue served.
async fn two_streams_every_second(app: &TestApp) -> std::path::PathBuf {
    mount_repos(
        &app.api,
        json!([repo(7, "octo/widgets", "2026-11-02T10:00:00Z")]),
    )
    .await;
    mount_issues(&app.api, json!([issue(7, "2026-11-03T10:00:00Z")])).await;
    let providers = github(app, r#"["issues", "repos"]"#)
        .replace("schedule = \"0 * * * * *\"", "schedule = \"* * * * * *\"");
    let config = app.write_config(&format!("{}{providers}", crate::daemon::daemon_table(None)));
    app.settings(&providers).await;
    config
}

#[tokio::test]
async fn a_stream_with_a_schedule_of_its_own_leaves_its_connections_and_keeps_its_own() {
    use crate::daemon::{eventually, Daemon};
    use std::time::Duration;
    let app = spawn_app().await;
    let config = two_streams_every_second(&app).await;
    let schedule = |args: &[&str]| {
        let mut all = vec![
            "connections",
            "schedule",
            "--provider",
            "gh",
            "--user",
            "alice",
        ];
        all.extend_from_slice(args);
        crate::helpers::run(crate::helpers::tributary(&config).args(&all))
    };
    let unknown = schedule(&["--stream", "wikis", "--cron", "* * * * * *"]);
    assert_eq!(unknown.code, 1, "{}", unknown.stderr);
    assert!(
        unknown
            .stderr
            .contains("provider \"gh\" syncs no stream named \"wikis\"; it syncs issues, repos"),
        "{}",
        unknown.stderr
    );
    let bad = schedule(&["--stream", "repos", "--cron", "hourly"]);
    assert!(
        bad.stderr.contains("\"hourly\" is not a cron expression"),
        "{}",
        bad.stderr
    );
    let stored = app
        .db
        .query_one_raw(Statement::from_string(
            app.db.get_database_backend(),
            "SELECT COUNT(*) AS n FROM stream_schedules",
        ))
        .await
        .expect("stream schedules counted")
        .expect("a count")
        .try_get::<i64>("", "n")
        .expect("a number");
    assert_eq!(stored, 0, "a bad stream schedule writes nothing");
    // Repos once a year: the provider's every-second slots run issues alone.
    let yearly = schedule(&["--stream", "repos", "--cron", "0 0 0 1 1 *"]);
    assert_eq!(yearly.code, 0, "{}", yearly.stderr);
    assert_eq!(
        yearly.stdout.trim(),
        "alice@gh syncs stream repos on its own schedule \"0 0 0 1 1 *\"."
    );
    let streams_run = || async {
        let mut streams: Vec<String> = sync_run::Entity::find()
            .all(&app.db)
            .await
            .unwrap()
            .into_iter()
            .filter_map(|run| run.stream)
            .collect();
        streams.sort();
        streams.dedup();
        streams
    };
    let mut daemon = Daemon::start(&config, app.dir.path().join("daemon.log"));
    eventually(Duration::from_secs(30), "issues synced", || async {
        requests_to(&app.api, "/issues").await >= 2
    })
    .await;
    assert_eq!(streams_run().await, ["issues"]);
    assert_eq!(requests_to(&app.api, "/user/repos").await, 0);

    // Now issues once a year and repos back on the connection's every second.
    let back = schedule(&["--stream", "repos", "--provider-schedule"]);
    assert_eq!(back.code, 0, "{}", back.stderr);
    let issues_yearly = schedule(&["--stream", "issues", "--cron", "0 0 0 1 1 *"]);
    assert_eq!(issues_yearly.code, 0, "{}", issues_yearly.stderr);
    eventually(Duration::from_secs(30), "repos synced", || async {
        requests_to(&app.api, "/user/repos").await >= 2
    })
    .await;
    let issues_before = requests_to(&app.api, "/issues").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(daemon.wait(Duration::from_secs(15)), 0, "{}", daemon.log());
    assert_eq!(streams_run().await, ["issues", "repos"]);
    assert_eq!(
        requests_to(&app.api, "/issues").await,
        issues_before,
        "issues follows its own yearly schedule"
    );
    let jobs = tributary::entities::sync_job::Entity::find()
        .all(&app.db)
        .await
        .unwrap();
    assert!(
        jobs.iter()
            .all(|job| job.stream == "issues" || job.stream == "repos"),
        "{jobs:?}"
    );
}

#[tokio::test]
async fn a_paused_stream_is_left_out_of_its_schedule_while_its_connections_other_streams_run() {
    use crate::daemon::{eventually, Daemon};
    use std::time::Duration;
    let app = spawn_app().await;
    let config = two_streams_every_second(&app).await;
    let connections = |args: &[&str]| {
        let mut all = vec!["connections"];
        all.extend_from_slice(args);
        run(tributary(&config).args(&all))
    };
    let stream_rows = || async {
        connection_stream::Entity::find()
            .all(&app.db)
            .await
            .expect("connection_streams")
    };

    // An unknown stream or connection: named, and nothing written.
    let unknown = connections(&[
        "pause",
        "--provider",
        "gh",
        "--user",
        "alice",
        "--stream",
        "wikis",
    ]);
    assert_eq!(unknown.code, 1, "{}", unknown.stderr);
    assert!(
        unknown
            .stderr
            .contains("provider \"gh\" syncs no stream named \"wikis\"; it syncs issues, repos"),
        "{}",
        unknown.stderr
    );
    let nobody = connections(&[
        "pause",
        "--provider",
        "gh",
        "--user",
        "nobody",
        "--stream",
        "repos",
    ]);
    assert_eq!(nobody.code, 1, "{}", nobody.stderr);
    assert!(
        nobody.stderr.contains("there is no connection nobody@gh"),
        "{}",
        nobody.stderr
    );
    assert!(stream_rows().await.is_empty(), "a refused pause wrote");

    let paused = connections(&[
        "pause",
        "--provider",
        "gh",
        "--user",
        "alice",
        "--stream",
        "repos",
    ]);
    assert_eq!(paused.code, 0, "{}", paused.stderr);
    assert_eq!(
        paused.stdout.trim(),
        "Stream \"repos\" of alice@gh is paused."
    );
    let rows = stream_rows().await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].stream, "repos");
    assert!(rows[0].paused_at.is_some(), "{rows:?}");
    let again = connections(&[
        "pause",
        "--provider",
        "gh",
        "--user",
        "alice",
        "--stream",
        "repos",
    ]);
    assert_eq!(
        again.stdout.trim(),
        "Stream \"repos\" of alice@gh was already paused."
    );
    assert_eq!(
        stream_state(&app, "repos").await.paused_at,
        rows[0].paused_at,
        "a pause keeps the time it began"
    );

    // Shown as paused by `connections status` and `jobs --next`.
    let status = connections(&["status", "--provider", "gh", "--user", "alice", "--json"]);
    let status: serde_json::Value = serde_json::from_str(&status.stdout).expect("JSON");
    let stream = |name: &str| {
        status["streams"]
            .as_array()
            .expect("streams")
            .iter()
            .find(|stream| stream["stream"] == name)
            .cloned()
            .expect("the stream")
    };
    assert!(stream("repos")["paused_at"].is_string(), "{status}");
    assert!(stream("repos")["next_slot"].is_null(), "{status}");
    assert!(stream("issues")["paused_at"].is_null(), "{status}");
    assert!(stream("issues")["next_slot"].is_string(), "{status}");
    let next = run(tributary(&config).args(["jobs", "--next", "--json"]));
    let next: serde_json::Value = serde_json::from_str(&next.stdout).expect("JSON");
    assert_eq!(next[0]["paused_streams"], json!(["repos"]), "{next}");
    assert_eq!(next[0]["paused"], false, "{next}");

    // A sync asked for still runs the paused stream.
    let synced = run(tributary(&config).args(["sync", "--json"]));
    assert_eq!(synced.code, 0, "{}", synced.stderr);
    assert_eq!(requests_to(&app.api, "/user/repos").await, 1);

    let mut daemon = Daemon::start(&config, app.dir.path().join("daemon.log"));
    eventually(Duration::from_secs(30), "issues synced twice", || async {
        requests_to(&app.api, "/issues").await >= 3
    })
    .await;
    assert_eq!(
        requests_to(&app.api, "/user/repos").await,
        1,
        "the paused stream's slots queue nothing"
    );
    let jobs = tributary::entities::sync_job::Entity::find()
        .all(&app.db)
        .await
        .unwrap();
    assert!(
        jobs.iter()
            .filter(|job| job.kind != tributary::entities::sync_job::JobKind::Manual)
            .all(|job| job.stream == "issues"),
        "{jobs:?}"
    );

    let resumed = connections(&[
        "resume",
        "--provider",
        "gh",
        "--user",
        "alice",
        "--stream",
        "repos",
    ]);
    assert_eq!(resumed.code, 0, "{}", resumed.stderr);
    assert_eq!(
        resumed.stdout.trim(),
        "Stream \"repos\" of alice@gh is resumed."
    );
    eventually(
        Duration::from_secs(30),
        "repos synced once resumed",
        || async { requests_to(&app.api, "/user/repos").await >= 2 },
    )
    .await;
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(daemon.wait(Duration::from_secs(15)), 0, "{}", daemon.log());
    assert!(stream_state(&app, "repos").await.paused_at.is_none());
}
