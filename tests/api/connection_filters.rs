//! `GET /v1/connections?stream=&health=` and `tributary connections list --stream
//! --health`: which connections each filter keeps, page by page, and the same answer from
//! both faces.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use wiremock::matchers::{header, method, path, query_param};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::helpers::{
    connections, cursor_provider, mount_cursor_listing, run, spawn_app, tributary,
};
use crate::http::Served;

/// A `rest` provider `acme` syncing stream `records` and a `github` provider `gh` syncing
/// `issues` and `repos`, both on a yearly schedule so that only the test's syncs run.
fn providers(app: &crate::helpers::TestApp, acme_users: &[&str]) -> String {
    let acme = cursor_provider("acme", &app.api.uri(), acme_users).replace(
        "schedule = \"0 */15 * * * *\"",
        "schedule = \"0 0 0 1 1 *\"",
    );
    format!(
        "{acme}\n[providers.gh]\nkind = \"github\"\nbase_url = \"{}\"\n\
         schedule = \"0 0 0 1 1 *\"\nstreams = [\"issues\", \"repos\"]\n\
         [providers.gh.http]\nmax_retries = 0\nretry_initial_delay = \"1ms\"\n{}",
        app.api.uri(),
        connections("gh", &["alice"])
    )
}

/// `user`'s listing at `acme`: one record with an id and one without, so that its run
/// stores one and fails one (`partial`: degraded).
async fn mount_one_bad_record(api: &MockServer, user: &str) {
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .and(header(
            "authorization",
            format!("Bearer token-{user}").as_str(),
        ))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "data": [{"id": format!("{user}_1")}, {"name": "no id"}],
            "next_cursor": null,
        })))
        .mount(api)
        .await;
}

/// gh alice's `issues` (all stored) and `repos` (one without an id: degraded).
async fn mount_github(api: &MockServer) {
    let github = |endpoint: &str| {
        Mock::given(method("GET"))
            .and(path(endpoint))
            .and(header("authorization", "Bearer token-alice"))
    };
    github("/issues")
        .and(query_param("filter", "all"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([{
            "id": 1, "number": 1, "title": "Issue 1", "state": "open",
            "updated_at": "2026-11-03T10:00:00Z"
        }])))
        .mount(api)
        .await;
    github("/user/repos")
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([
            {"id": 7, "name": "widgets", "full_name": "octo/widgets",
             "owner": {"login": "octo"}, "private": false,
             "updated_at": "2026-11-02T10:00:00Z"},
            {"name": "no id"}
        ])))
        .mount(api)
        .await;
}

/// `provider/user` of every connection of a page.
fn names(page: &Value) -> Vec<String> {
    page["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|c| {
            format!(
                "{}/{}",
                c["provider"].as_str().unwrap_or(""),
                c["user_id"].as_str().unwrap_or("")
            )
        })
        .collect()
}

/// Every page of `/v1/connections?{filter}&limit={limit}`, followed by `next`: the
/// connections of each page. Every page but the last is full.
async fn pages(served: &Served, key: &str, filter: &str, limit: usize) -> Vec<Vec<String>> {
    let mut pages = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let after = cursor
            .as_ref()
            .map(|cursor| format!("&cursor={cursor}"))
            .unwrap_or_default();
        let url = format!("/v1/connections?{filter}&limit={limit}{after}");
        let (status, page) = served.get(&url, key).await;
        assert_eq!(status, StatusCode::OK, "{url}: {page}");
        pages.push(names(&page));
        match page["next"].as_str() {
            Some(next) => {
                assert_eq!(
                    pages.last().map(Vec::len),
                    Some(limit),
                    "{url}: a short page before the last: {page}"
                );
                cursor = Some(next.to_string());
            }
            None => return pages,
        }
    }
}

#[tokio::test]
async fn connections_are_filtered_by_stream_and_health_page_by_page_through_api_and_cli() {
    let app = spawn_app().await;
    // acme: alice healthy, bob failing (nothing mounted: 404), carol and erin degraded,
    // dave and 120 fillers added after the sync (never synced), more than a health
    // filter reads at a time. gh alice: issues healthy, repos degraded.
    mount_cursor_listing(&app.api, "alice", "alice_", 1, 2, Duration::ZERO).await;
    mount_one_bad_record(&app.api, "carol").await;
    mount_one_bad_record(&app.api, "erin").await;
    mount_github(&app.api).await;
    let synced = providers(&app, &["alice", "bob", "carol", "erin"]);
    let settings = app.settings(&synced).await;
    app.sync(&settings).await;
    let fillers: Vec<String> = (0..120).map(|n| format!("f{n:03}")).collect();
    let mut users = vec!["alice", "bob", "carol", "dave", "erin"];
    users.extend(fillers.iter().map(String::as_str));
    let served = Served::start(&app, &providers(&app, &users)).await;
    let key = served.create_key("reader", &["connections:read"]);

    let at = |provider: &str, users: &[&str]| -> Vec<String> {
        users
            .iter()
            .map(|user| format!("{provider}/{user}"))
            .collect()
    };
    let never_synced: Vec<String> = at("acme", &["dave"])
        .into_iter()
        .chain(fillers.iter().map(|user| format!("acme/{user}")))
        .collect();
    let records: Vec<String> = at("acme", &users);
    let mut all = records.clone();
    all.push("gh/alice".to_string());
    let (_, everything) = served.get("/v1/connections?limit=1000", &key).await;
    assert_eq!(names(&everything), all);

    // The health filter keeps exactly the connections whose sync status shows that health.
    let mut by_health: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for connection in everything["items"].as_array().expect("items") {
        let id = connection["id"].as_i64().expect("id");
        let (status, syncs) = served
            .get(&format!("/v1/connections/{id}/syncs"), &key)
            .await;
        assert_eq!(status, StatusCode::OK, "{syncs}");
        by_health
            .entry(syncs["health"].as_str().expect("health").to_string())
            .or_default()
            .push(format!(
                "{}/{}",
                connection["provider"].as_str().unwrap_or(""),
                connection["user_id"].as_str().unwrap_or("")
            ));
    }
    let degraded = at("acme", &["carol", "erin"])
        .into_iter()
        .chain(at("gh", &["alice"]))
        .collect::<Vec<_>>();
    let expected = [
        ("healthy", at("acme", &["alice"])),
        ("never_synced", never_synced.clone()),
        ("degraded", degraded.clone()),
        ("failing", at("acme", &["bob"])),
    ];
    for (health, want) in &expected {
        assert_eq!(
            by_health.get(*health).cloned().unwrap_or_default(),
            *want,
            "the syncs' health of {health}"
        );
    }

    // Pages by a cursor: erin's page reads past the 120 fillers for the next match.
    for (filter, want, limit) in [
        ("health=healthy", at("acme", &["alice"]), 1),
        ("health=never_synced", never_synced.clone(), 50),
        ("health=degraded", degraded.clone(), 1),
        ("health=degraded", degraded.clone(), 2),
        ("health=failing", at("acme", &["bob"]), 1),
        ("stream=records", records.clone(), 50),
        ("stream=issues", at("gh", &["alice"]), 1),
        ("provider=gh&stream=repos", at("gh", &["alice"]), 1),
        (
            "stream=records&health=degraded",
            at("acme", &["carol", "erin"]),
            1,
        ),
        ("stream=issues&health=healthy", at("gh", &["alice"]), 1),
        ("stream=repos&health=degraded", at("gh", &["alice"]), 1),
        ("stream=issues&health=degraded", vec![], 1),
        ("user_id=alice&health=degraded", at("gh", &["alice"]), 1),
    ] {
        let got = pages(&served, &key, filter, limit).await;
        let flat: Vec<String> = got.iter().flatten().cloned().collect();
        assert_eq!(flat, want, "{filter}&limit={limit}: {got:?}");
        // Full pages, then the last (empty only when nothing matches).
        let expected_pages = want.len().div_ceil(limit).max(1);
        assert_eq!(got.len(), expected_pages, "{filter}&limit={limit}: {got:?}");
    }

    // A stream no provider in scope syncs, and an unknown health, are problems naming them.
    for (filter, field, detail) in [
        (
            "stream=wikis",
            "stream",
            "no provider in the config syncs a stream named \"wikis\"; configured: \
             acme.records, gh.issues, gh.repos",
        ),
        (
            "provider=acme&stream=issues",
            "stream",
            "no provider named \"acme\" syncs a stream named \"issues\"; configured: acme.records",
        ),
        (
            "health=sick",
            "health",
            "health: must be one of healthy, never_synced, degraded, failing, not \"sick\"",
        ),
    ] {
        let (status, problem) = served.get(&format!("/v1/connections?{filter}"), &key).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{filter}: {problem}");
        assert_eq!(problem["field"], field, "{filter}: {problem}");
        assert!(
            problem["detail"]
                .as_str()
                .is_some_and(|d| d.contains(detail)),
            "{filter}: {problem}"
        );
    }

    // The CLI lists the same connections from the same operation (one row per stream).
    let (_, api) = served
        .get("/v1/connections?stream=records&health=degraded", &key)
        .await;
    let cli = run(tributary(&served.config).args([
        "connections",
        "list",
        "--stream",
        "records",
        "--health",
        "degraded",
        "--json",
    ]));
    assert_eq!(cli.code, 0, "{}", cli.stderr);
    let rows: Value = serde_json::from_str(&cli.stdout).expect("list --json");
    let mut cli_names: Vec<String> = rows
        .as_array()
        .expect("rows")
        .iter()
        .map(|row| {
            format!(
                "{}/{}",
                row["provider"].as_str().unwrap_or(""),
                row["user_id"].as_str().unwrap_or("")
            )
        })
        .collect();
    cli_names.dedup();
    assert_eq!(cli_names, names(&api));
    assert_eq!(cli_names, at("acme", &["carol", "erin"]));
    for (args, message) in [
        (
            ["--stream", "wikis"],
            "error: stream: no provider in the config syncs a stream named \"wikis\"",
        ),
        (
            ["--health", "sick"],
            "error: health: must be one of healthy, never_synced, degraded, failing, not \"sick\"",
        ),
    ] {
        let refused = run(tributary(&served.config)
            .args(["connections", "list"])
            .args(args));
        assert_eq!(refused.code, 1, "{}", refused.stderr);
        assert!(refused.stderr.contains(message), "{}", refused.stderr);
        assert!(refused.stdout.is_empty(), "{}", refused.stdout);
    }
}
