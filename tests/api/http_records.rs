//! `GET /v1/records` of a real daemon, read by a real client: paging that neither skips
//! nor repeats a record while syncs write between pages, `modified_after`, tombstones,
//! the filters of one user or connection, and every bad parameter refused naming it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::Value;
use tributary::config::Settings;
use tributary::entities::sync_run::RunStatus;

use crate::helpers::{cursor_provider, items, mount_cursor_listing, spawn_app, TestApp};
use crate::http::Served;

/// alice's and bob's connections to `acme`, on a schedule that never fires in a test, so
/// that only the test's own syncs write.
fn acme(app: &TestApp, extra: &str) -> String {
    cursor_provider("acme", &app.api.uri(), &["alice", "bob"])
        .replace(
            "schedule = \"0 */15 * * * *\"",
            "schedule = \"0 0 0 1 1 *\"",
        )
        .replacen(
            "auth = \"bearer\"\n",
            &format!("auth = \"bearer\"\n{extra}\n"),
            1,
        )
}

/// Syncs every connection of `settings` and checks that each run succeeded.
async fn sync(app: &TestApp, settings: &Settings) {
    for outcome in app.sync(settings).await {
        assert_eq!(outcome.status, RunStatus::Succeeded, "{outcome:?}");
    }
}

/// Every page of `path` (a query without `cursor`), following `next`.
async fn walk(served: &Served, key: &str, path: &str) -> Vec<Value> {
    let mut records = Vec::new();
    let mut next: Option<String> = None;
    loop {
        let url = match &next {
            Some(cursor) => format!("{path}&cursor={cursor}"),
            None => path.to_string(),
        };
        let (status, page) = served.get(&url, key).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        records.extend(page["items"].as_array().expect("items").iter().cloned());
        match page["next"].as_str() {
            Some(cursor) => next = Some(cursor.to_string()),
            None => return records,
        }
    }
}

/// The external ids of `records`, in their order.
fn ids(records: &[Value]) -> Vec<String> {
    records
        .iter()
        .map(|r| r["external_id"].as_str().expect("external_id").to_string())
        .collect()
}

/// `user`'s listing: `data` in one page.
async fn mount_listing(app: &TestApp, user: &str, data: Vec<Value>) {
    wiremock::Mock::given(wiremock::matchers::path("/v1/items"))
        .and(wiremock::matchers::header(
            "authorization",
            format!("Bearer token-{user}").as_str(),
        ))
        .respond_with(
            wiremock::ResponseTemplate::new(200)
                .set_body_json(serde_json::json!({"data": data, "next_cursor": null})),
        )
        .mount(&app.api)
        .await;
}

#[tokio::test]
async fn paging_reads_every_record_once_while_syncs_write_between_pages() {
    let app = spawn_app().await;
    let providers = acme(&app, "");
    let settings = app.settings(&providers).await;
    mount_cursor_listing(&app.api, "alice", "a", 3, 100, Duration::ZERO).await;
    mount_cursor_listing(&app.api, "bob", "b", 1, 50, Duration::ZERO).await;
    sync(&app, &settings).await;
    let served = Served::start(&app, &providers).await;
    let key = served.create_key("reader", &["records:read"]);

    let path = "/v1/records?provider=acme&limit=70";
    let mut seen: Vec<Value> = Vec::new();
    let mut next: Option<String> = None;
    let mut pages = 0;
    loop {
        let url = match &next {
            Some(cursor) => format!("{path}&cursor={cursor}"),
            None => path.to_string(),
        };
        let (status, page) = served.get(&url, &key).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        let read = page["items"].as_array().expect("items");
        assert!(read.len() <= 70);
        seen.extend(read.iter().cloned());
        pages += 1;
        // Between the first pages, syncs add 100 of alice's records, then change one
        // record already read and one not yet read.
        match pages {
            1 => {
                app.api.reset().await;
                mount_cursor_listing(&app.api, "alice", "a", 4, 100, Duration::ZERO).await;
                mount_cursor_listing(&app.api, "bob", "b", 1, 50, Duration::ZERO).await;
                sync(&app, &settings).await;
            }
            2 => {
                // The first record read, and bob's last, change.
                let first_read = seen[0]["external_id"].as_str().expect("id").to_string();
                let changed = |mut listing: Vec<Value>| {
                    for item in listing.iter_mut() {
                        if item["id"] == first_read.as_str() || item["id"] == "b49" {
                            item["changed"] = Value::Bool(true);
                        }
                    }
                    listing
                };
                app.api.reset().await;
                mount_listing(&app, "alice", changed(items("a", "alice", 0..400))).await;
                mount_listing(&app, "bob", changed(items("b", "bob", 0..50))).await;
                sync(&app, &settings).await;
            }
            _ => {}
        }
        match page["next"].as_str() {
            Some(cursor) => next = Some(cursor.to_string()),
            None => break,
        }
    }

    // Every record of the table was read; a record is read twice only when it changed
    // after it was read, and then the second time with its new content.
    let stored: BTreeSet<String> = app
        .records()
        .await
        .into_iter()
        .map(|r| r.external_id)
        .collect();
    assert_eq!(stored.len(), 450);
    let mut reads: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for record in &seen {
        let id = record["external_id"].as_str().expect("id").to_string();
        reads.entry(id).or_default().push(record);
    }
    assert_eq!(reads.keys().cloned().collect::<BTreeSet<_>>(), stored);
    // Only the two changed records can have been read twice, the first one read surely.
    let first_read = seen[0]["external_id"].as_str().expect("id");
    for (id, read) in &reads {
        let changed = id == first_read || id == "b49";
        assert!(read.len() == 1 || changed, "{id} read {} times", read.len());
    }
    assert_eq!(reads[first_read].len(), 2);
    assert_eq!(
        reads["b49"].last().expect("read")["payload"]["changed"],
        true
    );
    for (id, read) in &reads {
        match read.as_slice() {
            [_] => {}
            [before, after] => {
                assert!(before["payload"].get("changed").is_none(), "{id}");
                assert_eq!(after["payload"]["changed"], true, "{id}");
                assert!(after["changed_at"].as_str() > before["changed_at"].as_str());
            }
            more => panic!("{id} read {} times", more.len()),
        }
    }
    // Ordered by when each changed, and each record's fields are as stored.
    let times: Vec<&str> = seen
        .iter()
        .map(|r| r["changed_at"].as_str().expect("time"))
        .collect();
    let mut sorted = times.clone();
    sorted.sort();
    assert_eq!(times.len(), sorted.len());
    let a0 = seen.iter().find(|r| r["external_id"] == "a0").expect("a0");
    assert_eq!(a0["provider"], "acme");
    assert_eq!(a0["user_id"], "alice");
    assert_eq!(a0["deleted"], false);
    assert_eq!(
        a0["payload"],
        serde_json::json!({"id": "a0", "owner": "alice", "n": 0})
    );
    assert!(
        a0["connection_id"].as_i64().is_some_and(|id| id > 0),
        "{a0}"
    );
    assert!(
        a0["stream"].is_string() && a0["first_seen_at"].is_string(),
        "{a0}"
    );
}

#[tokio::test]
async fn filters_keep_to_one_user_and_tombstones_show_only_when_asked() {
    let app = spawn_app().await;
    let providers = acme(&app, "track_deletes = true");
    let settings = app.settings(&providers).await;
    mount_cursor_listing(&app.api, "alice", "a", 1, 10, Duration::ZERO).await;
    mount_cursor_listing(&app.api, "bob", "b", 1, 10, Duration::ZERO).await;
    sync(&app, &settings).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let between = chrono::Utc::now();
    tokio::time::sleep(Duration::from_millis(20)).await;
    // alice's a3 and a7 are gone from her listing: the complete pass marks them deleted.
    let mut kept = items("a", "alice", 0..10);
    kept.retain(|item| item["id"] != "a3" && item["id"] != "a7");
    app.api.reset().await;
    mount_listing(&app, "alice", kept).await;
    mount_cursor_listing(&app.api, "bob", "b", 1, 10, Duration::ZERO).await;
    for outcome in app.sync(&settings).await {
        assert_ne!(outcome.status, RunStatus::Failed, "{outcome:?}");
    }
    let served = Served::start(&app, &providers).await;
    let key = served.create_key("reader", &["records:read"]);
    let (_, connections) = served
        .get(
            "/v1/connections?provider=acme",
            &served.create_key("ops", &["connections:read"]),
        )
        .await;
    let connection_of = |user: &str| {
        connections["items"]
            .as_array()
            .expect("items")
            .iter()
            .find(|c| c["user_id"] == user)
            .and_then(|c| c["id"].as_i64())
            .expect("connection")
    };

    // One user's filter, by user id or by connection, never returns another's records.
    let alice = walk(
        &served,
        &key,
        "/v1/records?provider=acme&user_id=alice&limit=3",
    )
    .await;
    let mut alice_ids = ids(&alice);
    alice_ids.sort();
    assert_eq!(alice_ids, ["a0", "a1", "a2", "a4", "a5", "a6", "a8", "a9"]);
    assert!(alice
        .iter()
        .all(|r| r["user_id"] == "alice" && r["deleted"] == false));
    let bob_connection = connection_of("bob");
    let bob = walk(
        &served,
        &key,
        &format!("/v1/records?connection_id={bob_connection}&limit=4"),
    )
    .await;
    assert_eq!(bob.len(), 10);
    assert!(bob
        .iter()
        .all(|r| r["user_id"] == "bob" && r["connection_id"] == bob_connection));
    // Bob's connection asked with alice's user id is refused, not answered with either.
    let (status, problem) = served
        .get(
            &format!("/v1/records?connection_id={bob_connection}&user_id=alice"),
            &key,
        )
        .await;
    assert_eq!(
        (status, problem["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("connection_id"))
    );

    // Tombstones only with include_deleted: external id and deletion time, no payload.
    let everything = walk(
        &served,
        &key,
        "/v1/records?provider=acme&include_deleted=true",
    )
    .await;
    assert_eq!(everything.len(), 20);
    let tombstones: Vec<&Value> = everything.iter().filter(|r| r["deleted"] == true).collect();
    let mut tombstone_ids: Vec<&str> = tombstones
        .iter()
        .map(|r| r["external_id"].as_str().expect("id"))
        .collect();
    tombstone_ids.sort();
    assert_eq!(tombstone_ids, ["a3", "a7"]);
    for tombstone in &tombstones {
        assert!(tombstone["payload"].is_null(), "{tombstone}");
        assert_eq!(
            tombstone["deleted_at"], tombstone["changed_at"],
            "{tombstone}"
        );
    }
    let live = walk(&served, &key, "/v1/records?provider=acme").await;
    assert_eq!(live.len(), 18);
    assert!(live
        .iter()
        .all(|r| r["deleted"] == false && r["deleted_at"].is_null()));

    // Changed since the first sync: only the deletions (the second pass rewrote nothing).
    let since = between.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let changed = walk(
        &served,
        &key,
        &format!("/v1/records?provider=acme&include_deleted=true&modified_after={since}"),
    )
    .await;
    let mut changed_ids = ids(&changed);
    changed_ids.sort();
    assert_eq!(changed_ids, ["a3", "a7"]);
    let changed_live = walk(
        &served,
        &key,
        &format!("/v1/records?provider=acme&modified_after={since}"),
    )
    .await;
    assert!(changed_live.is_empty(), "{changed_live:?}");
}

#[tokio::test]
async fn a_non_primary_streams_filter_returns_that_streams_records_only() {
    let app = spawn_app().await;
    let providers = crate::http::two_streams_and_two_providers(&app).await;
    let settings = app.settings(&providers).await;
    sync(&app, &settings).await;
    let served = Served::start(&app, &providers).await;
    let key = served.create_key("reader", &["records:read"]);
    let of = |records: &[Value]| -> String {
        let mut found: Vec<String> = records
            .iter()
            .map(|r| format!("{} {} {}", r["stream"], r["user_id"], r["external_id"]))
            .collect();
        found.sort();
        found.join(", ").replace('"', "")
    };

    // Without `stream`, the provider's primary stream, as the API documents.
    for (filters, expected) in [
        ("provider=acme&stream=archive", "archive alice archive0"),
        (
            "provider=acme&stream=records",
            "records alice alice0, records alice alice1",
        ),
        (
            "provider=acme",
            "records alice alice0, records alice alice1",
        ),
        ("provider=beta", "records bob bob0"),
    ] {
        let records = walk(&served, &key, &format!("/v1/records?{filters}&limit=1")).await;
        assert_eq!(of(&records), expected, "{filters}");
    }
}

#[tokio::test]
async fn bad_parameters_foreign_cursors_and_a_missing_scope_are_problems_naming_them() {
    let app = spawn_app().await;
    let providers = acme(&app, "");
    let settings = app.settings(&providers).await;
    mount_cursor_listing(&app.api, "alice", "a", 1, 5, Duration::ZERO).await;
    mount_cursor_listing(&app.api, "bob", "b", 1, 5, Duration::ZERO).await;
    sync(&app, &settings).await;
    let served = Served::start(&app, &providers).await;
    let key = served.create_key("reader", &["records:read"]);
    let other = served.create_key("other", &["connections:read"]);

    let (status, page) = served.get("/v1/records?provider=acme&limit=2", &key).await;
    assert_eq!(status, StatusCode::OK);
    let cursor = page["next"].as_str().expect("a next page").to_string();
    let (_, runs) = served.get("/v1/runs?limit=1", &other).await;
    let runs_cursor = runs["next"]
        .as_str()
        .expect("a next page of runs")
        .to_string();
    let edited = {
        use base64::Engine;
        let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let text = String::from_utf8(engine.decode(&cursor).expect("base64")).expect("text");
        // The position's last digit (the row id) moved by one.
        let (head, check) = text.rsplit_once('.').expect("check");
        let (before, id) = head.rsplit_once('.').expect("id");
        let id: i64 = id.parse().expect("id");
        engine.encode(format!("{before}.{}.{check}", id + 1))
    };

    let cases: Vec<(String, &str)> = vec![
        ("provider=acme&limit=0".into(), "limit"),
        ("provider=acme&limit=-1".into(), "limit"),
        ("provider=acme&limit=1001".into(), "limit"),
        (
            "provider=acme&limit=99999999999999999999999".into(),
            "limit",
        ),
        ("provider=acme&limit=ten".into(), "limit"),
        ("provider=acme&cursor=garbage!".into(), "cursor"),
        (format!("provider=acme&cursor={runs_cursor}"), "cursor"),
        (format!("provider=acme&cursor={edited}"), "cursor"),
        // A cursor of other filters is another list's.
        (
            format!("provider=acme&user_id=alice&cursor={cursor}"),
            "cursor",
        ),
        (
            "provider=acme&modified_after=yesterday".into(),
            "modified_after",
        ),
        (
            "provider=acme&modified_after=2026-13-01T00:00:00Z".into(),
            "modified_after",
        ),
        (
            "provider=acme&include_deleted=maybe".into(),
            "include_deleted",
        ),
        ("provider=acme&connection_id=x".into(), "connection_id"),
        ("provider=acme&connection_id=999999".into(), "connection_id"),
        ("user_id=alice".into(), "provider"),
        ("provider=nope".into(), "provider"),
        ("provider=acme&stream=nope".into(), "stream"),
        ("provider=acme&token=trb_x".into(), "token"),
    ];
    for (query, field) in cases {
        let (status, problem) = served.get(&format!("/v1/records?{query}"), &key).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {problem}");
        assert_eq!(problem["field"], field, "{query}: {problem}");
        assert_eq!(
            problem["type"], "urn:tributary:problem:invalid-input",
            "{query}"
        );
    }
    // The cursor itself is good on its own list.
    let (status, _) = served
        .get(
            &format!("/v1/records?provider=acme&limit=2&cursor={cursor}"),
            &key,
        )
        .await;
    assert_eq!(status, StatusCode::OK);

    // A cursor another database issued: the same position, refused once this database's
    // id is another (as a copy of another tributary database would have).
    app.execute("UPDATE change_clock SET database_id = '0123456789abcdef0123456789abcdef'")
        .await;
    let (status, problem) = served
        .get(
            &format!("/v1/records?provider=acme&limit=2&cursor={cursor}"),
            &key,
        )
        .await;
    assert_eq!(
        (status, problem["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("cursor"))
    );

    // Another scope is 403, no key 401.
    let (status, problem) = served.get("/v1/records?provider=acme", &other).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{problem}");
    assert!(problem["detail"]
        .as_str()
        .is_some_and(|d| d.contains("records:read")));
    let (status, _, _) = served
        .call(
            reqwest::Method::GET,
            "/v1/records?provider=acme",
            None,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

/// Syncs `user`'s connection alone.
async fn sync_user(db: tributary::db::DatabasePools, settings: Settings, user: &str) -> RunStatus {
    let filter = tributary::sync::SyncFilter {
        user_id: Some(user.to_string()),
        ..tributary::sync::SyncFilter::default()
    };
    let outcomes = tributary::sync::sync_matching(
        &db,
        &settings,
        &filter,
        &tributary::pipeline::RunOptions::manual(),
        &tributary::pipeline::NoProgress,
    )
    .await
    .expect("runs recorded")
    .outcomes;
    assert_eq!(outcomes.len(), 1, "{outcomes:?}");
    outcomes[0].status
}

/// The records changed after `since` (all of them without), read to the end.
async fn poll(served: &Served, key: &str, since: Option<&str>) -> Vec<Value> {
    let path = match since {
        Some(since) => format!(
            "/v1/records?provider=acme&limit=100&modified_after={}",
            since.replace('+', "%2B")
        ),
        None => "/v1/records?provider=acme&limit=100".to_string(),
    };
    walk(served, key, &path).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_stamped_before_a_readers_position_but_committed_after_it_is_not_skipped() {
    use crate::helpers::{backend, Backend};
    use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, TransactionTrait};
    use tributary::entities::sync_run;
    if backend() == Backend::Sqlite {
        // A page takes SQLite's one write lock before it is stamped: stamps follow commits.
        return;
    }
    let app = spawn_app().await;
    let providers = acme(&app, "");
    let settings = app.settings(&providers).await;
    mount_listing(&app, "alice", items("a", "alice", 0..3)).await;
    mount_listing(&app, "bob", items("b", "bob", 0..3)).await;
    sync(&app, &settings).await;
    let served = Served::start(&app, &providers).await;
    let key = served.create_key("reader", &["records:read"]);
    let baseline = poll(&served, &key, None).await;
    assert_eq!(baseline.len(), 6, "{baseline:?}");
    let mut since = baseline
        .iter()
        .filter_map(|r| r["changed_at"].as_str())
        .max()
        .expect("changed_at")
        .to_string();

    // alice's a0 changes, in a page that is stamped, then held before its commit (the
    // test locks the run's row, which a page locks first) while bob's b0 changes and
    // commits later stamps.
    let changed = |prefix: &str, owner: &str| {
        let mut listing = items(prefix, owner, 0..3);
        listing[0]["changed"] = Value::Bool(true);
        listing
    };
    app.api.reset().await;
    wiremock::Mock::given(wiremock::matchers::path("/v1/items"))
        .and(wiremock::matchers::header(
            "authorization",
            "Bearer token-alice",
        ))
        .respond_with(
            wiremock::ResponseTemplate::new(200)
                .set_body_json(
                    serde_json::json!({"data": changed("a", "alice"), "next_cursor": null}),
                )
                .set_delay(Duration::from_secs(2)),
        )
        .mount(&app.api)
        .await;
    mount_listing(&app, "bob", changed("b", "bob")).await;
    let alice = tokio::spawn(sync_user(app.db.clone(), settings.clone(), "alice"));
    // Found well within the listing's 2 s, before the page is stamped.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let run = loop {
        let running = sync_run::Entity::find()
            .filter(sync_run::Column::UserId.eq("alice"))
            .filter(sync_run::Column::Status.eq(RunStatus::Running))
            .one(&app.db)
            .await
            .unwrap();
        if let Some(run) = running {
            break run;
        }
        assert!(std::time::Instant::now() < deadline, "alice's run started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let hold = app.db.begin().await.unwrap();
    hold.execute_unprepared(&format!(
        "SELECT id FROM sync_runs WHERE id = {} FOR UPDATE",
        run.id
    ))
    .await
    .unwrap();
    // The listing answers after 2 s; the page is then stamped and waits for the row.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!alice.is_finished(), "alice's page waits for its run's row");
    assert_eq!(
        sync_user(app.db.clone(), settings.clone(), "bob").await,
        RunStatus::Succeeded
    );

    // The app polls what changed since its last poll, then again once alice's page is in.
    let mut read = poll(&served, &key, Some(&since)).await;
    if let Some(latest) = read.iter().filter_map(|r| r["changed_at"].as_str()).max() {
        since = latest.to_string();
    }
    hold.commit().await.unwrap();
    assert_eq!(alice.await.unwrap(), RunStatus::Succeeded);
    read.extend(poll(&served, &key, Some(&since)).await);

    let changed_ids: BTreeSet<String> = read
        .iter()
        .filter(|r| r["payload"]["changed"] == true)
        .map(|r| r["external_id"].as_str().expect("external_id").to_string())
        .collect();
    assert_eq!(
        changed_ids,
        BTreeSet::from(["a0".to_string(), "b0".to_string()]),
        "both changes reach the app: {read:?}"
    );
}

#[tokio::test]
async fn records_are_filtered_by_their_ids_and_by_what_last_happened_to_them() {
    let app = spawn_app().await;
    let providers = acme(&app, "track_deletes = true");
    let settings = app.settings(&providers).await;
    mount_listing(&app, "alice", items("a", "alice", 0..6)).await;
    mount_listing(&app, "bob", items("b", "bob", 0..2)).await;
    sync(&app, &settings).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let between = chrono::Utc::now();
    tokio::time::sleep(Duration::from_millis(20)).await;
    // a1 changes, a2 is gone (deleted), a5 is gone then back (restored: updated).
    let mut second = items("a", "alice", 0..6);
    second[1]["changed"] = Value::Bool(true);
    second.retain(|item| item["id"] != "a2" && item["id"] != "a5");
    app.api.reset().await;
    mount_listing(&app, "alice", second).await;
    mount_listing(&app, "bob", items("b", "bob", 0..2)).await;
    sync(&app, &settings).await;
    let mut third = items("a", "alice", 0..6);
    third[1]["changed"] = Value::Bool(true);
    third.retain(|item| item["id"] != "a2");
    app.api.reset().await;
    mount_listing(&app, "alice", third).await;
    mount_listing(&app, "bob", items("b", "bob", 0..2)).await;
    sync(&app, &settings).await;
    let served = Served::start(&app, &providers).await;
    let key = served.create_key("reader", &["records:read"]);
    let sorted = |records: Vec<Value>| {
        let mut found: Vec<(String, String)> = records
            .iter()
            .map(|r| {
                (
                    r["external_id"].as_str().expect("id").to_string(),
                    r["last_action"].as_str().expect("last_action").to_string(),
                )
            })
            .collect();
        found.sort();
        found
    };
    let pairs = |expected: &[(&str, &str)]| -> Vec<(String, String)> {
        expected
            .iter()
            .map(|(id, action)| (id.to_string(), action.to_string()))
            .collect()
    };

    let all = walk(
        &served,
        &key,
        "/v1/records?provider=acme&include_deleted=true&limit=3",
    )
    .await;
    assert_eq!(
        sorted(all),
        pairs(&[
            ("a0", "added"),
            ("a1", "updated"),
            ("a2", "deleted"),
            ("a3", "added"),
            ("a4", "added"),
            ("a5", "updated"),
            ("b0", "added"),
            ("b1", "added"),
        ])
    );
    let by_id = walk(
        &served,
        &key,
        "/v1/records?provider=acme&external_id=a1&external_id=b1&external_id=a2&external_id=zz&limit=1",
    )
    .await;
    // a2 is a tombstone: left out without include_deleted.
    assert_eq!(sorted(by_id), pairs(&[("a1", "updated"), ("b1", "added")]));
    let updated = walk(
        &served,
        &key,
        "/v1/records?provider=acme&last_action=updated",
    )
    .await;
    assert_eq!(
        sorted(updated),
        pairs(&[("a1", "updated"), ("a5", "updated")])
    );
    let gone_or_changed = walk(
        &served,
        &key,
        "/v1/records?provider=acme&user_id=alice&last_action=deleted&last_action=updated&limit=1",
    )
    .await;
    assert_eq!(
        sorted(gone_or_changed.clone()),
        pairs(&[("a1", "updated"), ("a2", "deleted"), ("a5", "updated")])
    );
    let tombstone = gone_or_changed
        .iter()
        .find(|r| r["external_id"] == "a2")
        .expect("a2");
    assert_eq!(tombstone["payload"], Value::Null, "{tombstone}");
    let added = walk(
        &served,
        &key,
        "/v1/records?provider=acme&last_action=added&external_id=a0&external_id=a1",
    )
    .await;
    assert_eq!(sorted(added), pairs(&[("a0", "added")]));
    // Changed after the first sync: the change and the restore, and with tombstones the
    // deletion; what the later syncs found unchanged is not.
    let since = between.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let changed = walk(
        &served,
        &key,
        &format!("/v1/records?provider=acme&modified_after={since}&limit=1"),
    )
    .await;
    assert_eq!(
        sorted(changed),
        pairs(&[("a1", "updated"), ("a5", "updated")])
    );
    let changed = walk(
        &served,
        &key,
        &format!("/v1/records?provider=acme&include_deleted=true&modified_after={since}"),
    )
    .await;
    assert_eq!(
        sorted(changed),
        pairs(&[("a1", "updated"), ("a2", "deleted"), ("a5", "updated")])
    );

    // Bad filters are problems naming them, and a cursor is bound to its filters.
    for (query, field) in [
        ("last_action=renamed", "last_action"),
        ("external_id=", "external_id"),
        ("limit=", "limit"),
    ] {
        let (status, problem) = served
            .get(&format!("/v1/records?provider=acme&{query}"), &key)
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {problem}");
        assert_eq!(problem["field"], field, "{query}: {problem}");
    }
    let many: String = (0..101).map(|i| format!("&external_id=x{i}")).collect();
    let (status, problem) = served
        .get(&format!("/v1/records?provider=acme{many}"), &key)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");
    assert_eq!(problem["field"], "external_id", "{problem}");
    let (_, first) = served
        .get("/v1/records?provider=acme&last_action=added&limit=1", &key)
        .await;
    let cursor = first["next"].as_str().expect("a next page");

    // The `Link` header names the same next page with the filters kept: following it
    // reads what following `next` reads, and the last page has none.
    let start = "/v1/records?provider=acme&last_action=added&limit=1";
    let by_next = walk(&served, &key, start).await;
    let mut by_link = Vec::new();
    let mut path = start.to_string();
    loop {
        let (status, headers, page) = served.call(Method::GET, &path, Some(&key), None).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        by_link.extend(page["items"].as_array().expect("items").iter().cloned());
        let link = headers.get("link").and_then(|value| value.to_str().ok());
        match (link, page["next"].as_str()) {
            (Some(link), Some(next)) => {
                let query = link
                    .strip_prefix("<?")
                    .and_then(|link| link.strip_suffix(">; rel=\"next\""))
                    .expect("a relative link to the next page");
                assert_eq!(
                    query,
                    format!("provider=acme&last_action=added&limit=1&cursor={next}")
                );
                path = format!("/v1/records?{query}");
            }
            (None, None) => break,
            other => panic!("the Link header and next disagree: {other:?}"),
        }
    }
    assert!(by_next.len() >= 2, "more than one page: {by_next:?}");
    assert_eq!(ids(&by_link), ids(&by_next));

    let (status, problem) = served
        .get(
            &format!("/v1/records?provider=acme&last_action=updated&limit=1&cursor={cursor}"),
            &key,
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");
    assert_eq!(problem["field"], "cursor", "{problem}");
}

/// A page is one JSON body, its payloads the stored JSON itself and its times as
/// written everywhere else; a row holding text that is not JSON (written by other hands
/// than the pipeline's) is sent as that text in a string rather than breaking the page.
#[tokio::test]
async fn a_page_sends_stored_json_as_it_is_and_a_payload_that_is_not_json_as_text() {
    let app = spawn_app().await;
    let providers = acme(&app, "");
    let settings = app.settings(&providers).await;
    mount_cursor_listing(&app.api, "alice", "a", 1, 3, Duration::ZERO).await;
    mount_cursor_listing(&app.api, "bob", "b", 1, 1, Duration::ZERO).await;
    sync(&app, &settings).await;
    let broken = r#"{"id": "a1", cut off"#;
    crate::http::query(
        &app,
        &format!(
            "UPDATE records SET payload = '{broken}' WHERE user_id = 'alice' AND external_id = 'a1'"
        ),
    )
    .await;
    let served = Served::start(&app, &providers).await;
    let key = served.create_key("reader", &["records:read"]);
    let (status, headers, page) = served
        .call(
            reqwest::Method::GET,
            "/v1/records?provider=acme&user_id=alice",
            Some(&key),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(headers["content-type"], "application/json");
    let records = page["items"].as_array().expect("items");
    let payloads: BTreeMap<&str, &Value> = records
        .iter()
        .map(|r| (r["external_id"].as_str().expect("id"), &r["payload"]))
        .collect();
    let expected = items("a", "alice", 0..3);
    assert_eq!(payloads["a0"], &expected[0]);
    assert_eq!(payloads["a2"], &expected[2]);
    assert_eq!(payloads["a1"], &Value::String(broken.to_string()));
    for record in records {
        let changed = record["changed_at"].as_str().expect("changed_at");
        let time = chrono::DateTime::parse_from_rfc3339(changed).expect("RFC 3339");
        assert!(changed.ends_with('Z'), "{changed}");
        assert_eq!(
            serde_json::to_value(time.with_timezone(&chrono::Utc)).expect("time"),
            record["changed_at"]
        );
        assert_eq!(record["deleted_at"], Value::Null);
    }
}
