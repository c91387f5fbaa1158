//! Operator tools: replay, open errors, reconcile with its audit log, append-only mode.

use chrono::{Duration, Utc};
use sea_orm::{ActiveModelTrait, EntityTrait, Set};
use serde_json::json;
use tributary::entities::run_error::Stage;
use tributary::entities::sync_run::RunStatus;
use tributary::entities::sync_run::Trigger;
use tributary::entities::{processed_key, record};
use wiremock::matchers::method;
use wiremock::{Mock, ResponseTemplate};

use crate::helpers::{backend, cursor_provider, items, spawn_app, Backend, TestApp};

fn tributary(config: &std::path::Path, args: &[&str]) -> (i32, String, String) {
    let output = assert_cmd::Command::cargo_bin("tributary")
        .expect("binary")
        .arg("--config")
        .arg(config)
        .args(args)
        .env_remove("TRIBUTARY_DATABASE_URL")
        .output()
        .expect("tributary runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

async fn serve(app: &TestApp, data: serde_json::Value) {
    app.api.reset().await;
    Mock::given(method("GET"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({"data": data, "next_cursor": null})),
        )
        .mount(&app.api)
        .await;
}

async fn drop_refusal(app: &TestApp) {
    match backend() {
        Backend::Postgres => app.execute("DROP TRIGGER refuse_insert ON records").await,
        _ => app.execute("DROP TRIGGER refuse_insert").await,
    }
}

#[tokio::test]
async fn replay_resolves_what_now_goes_through_and_is_idempotent() {
    let app = spawn_app().await;
    app.refuse_inserts_of("poison", "poison refused").await;
    serve(
        &app,
        json!([{"id": "a"}, {"id": "poison", "v": 1}, {"v": "no id"}]),
    )
    .await;
    let config = app.write_config(&cursor_provider("acme", &app.api.uri(), &["alice"]));
    let settings = app
        .settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;
    let run = app.sync_one(&settings).await;
    assert_eq!((run.status, run.counts.failed), (RunStatus::Partial, 2));

    let (code, stdout, _) = tributary(&config, &["errors", "--open", "--json"]);
    assert_eq!(code, 0);
    let open: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(open.as_array().unwrap().len(), 2);

    // The database stops refusing; the record without an id still has none.
    drop_refusal(&app).await;
    let (code, stdout, stderr) = tributary(&config, &["replay", &run.run_id.to_string()]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("1 resolved, 1 still failing"), "{stdout}");
    assert!(stdout.contains("has no id field"), "{stdout}");
    let ids: Vec<String> = app
        .records()
        .await
        .into_iter()
        .map(|r| r.external_id)
        .collect();
    assert_eq!(ids, ["a", "poison"]);
    let errors = app.run_errors(run.run_id).await;
    let replay_run = errors
        .iter()
        .find(|e| e.external_id.as_deref() == Some("poison"))
        .and_then(|e| e.resolved_by_run_id)
        .expect("the poison error is resolved");
    let replay = app.run_row(replay_run).await;
    assert_eq!(
        (replay.trigger, replay.status),
        (Trigger::Replay, RunStatus::Partial)
    );
    assert_eq!((replay.records_inserted, replay.records_failed), (1, 1));
    assert!(errors
        .iter()
        .any(|e| e.resolved_by_run_id.is_none() && e.stage == Stage::Validate));

    // A second replay changes nothing: the table is the same, the open error stays open.
    let before = app.dump_records().await;
    let (code, stdout, _) = tributary(&config, &["replay", &run.run_id.to_string(), "--json"]);
    assert_eq!(code, 0);
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["resolved"], json!([]));
    assert_eq!(report["still_failing"].as_array().unwrap().len(), 1);
    assert_eq!(app.dump_records().await, before);
    let (_, stdout, _) = tributary(&config, &["errors", "--open", "--json"]);
    let open: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(open.as_array().unwrap().len(), 1);
    assert_eq!(open[0]["payload"], r#"{"v":"no id"}"#);

    let (code, _, stderr) = tributary(&config, &["replay", "999"]);
    assert_ne!(code, 0);
    assert!(stderr.contains("no run with id 999"), "{stderr}");
}

#[tokio::test]
async fn open_errors_come_a_page_at_a_time_without_gaps_or_repeats() {
    let app = spawn_app().await;
    let nameless: Vec<serde_json::Value> = (0..45).map(|n| json!({"n": n})).collect();
    serve(&app, json!(nameless)).await;
    let providers = cursor_provider("acme", &app.api.uri(), &["alice"]);
    let config = app.write_config(&providers);
    let run = app.sync_one(&app.settings(&providers).await).await;
    assert_eq!((run.status, run.counts.failed), (RunStatus::Partial, 45));
    let all: Vec<i64> = app
        .run_errors(run.run_id)
        .await
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(all.len(), 45);

    // The default page is 20; each next page starts after the last id shown.
    let mut seen: Vec<i64> = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = Vec::new();
    loop {
        let mut args = vec!["errors", "--open", "--json"];
        if let Some(after) = &after {
            args.extend(["--after", after.as_str()]);
        }
        let (code, stdout, stderr) = tributary(&config, &args);
        assert_eq!(code, 0, "{stderr}");
        let page: Vec<serde_json::Value> = serde_json::from_str(&stdout).unwrap();
        pages.push(page.len());
        let Some(last) = page.last() else { break };
        after = Some(last["id"].to_string());
        seen.extend(page.iter().map(|error| error["id"].as_i64().unwrap()));
    }
    assert_eq!(pages, [20, 20, 5, 0]);
    assert_eq!(seen, all);

    // A table says how to get the next page, and the last page says nothing more.
    let (code, stdout, _) = tributary(&config, &["errors", "--open", "--limit", "40"]);
    assert_eq!(code, 0);
    assert_eq!(stdout.matches("has no id field").count(), 40, "{stdout}");
    assert!(
        stdout.contains(&format!("add --after {} for the next page", all[39])),
        "{stdout}"
    );
    let after = all[39].to_string();
    let (_, stdout, _) = tributary(&config, &["errors", "--open", "--after", &after]);
    assert_eq!(stdout.matches("has no id field").count(), 5, "{stdout}");
    assert!(!stdout.contains("--after"), "{stdout}");

    // One run's report comes in pages the same way, resolved errors included.
    let run_id = run.run_id.to_string();
    let (code, stdout, stderr) = tributary(&config, &["errors", &run_id, "--limit", "30"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("30 error(s) on this page"), "{stdout}");
    assert_eq!(stdout.matches("has no id field").count(), 30, "{stdout}");
    let next = all[29].to_string();
    assert!(
        stdout.contains(&format!("add --after {next} for the next page")),
        "{stdout}"
    );
    let (_, stdout, _) = tributary(&config, &["errors", &run_id, "--after", &next, "--json"]);
    let rest: Vec<serde_json::Value> = serde_json::from_str(&stdout).unwrap();
    let rest: Vec<i64> = rest.iter().map(|e| e["id"].as_i64().unwrap()).collect();
    assert_eq!(rest, all[30..]);
    let (code, _, stderr) = tributary(&config, &["errors", &run_id, "--limit", "0"]);
    assert_ne!(code, 0);
    assert!(stderr.contains("--limit"), "{stderr}");
}

/// Inserts a record row by hand, as an older system or an import would have.
async fn raw_record(
    app: &TestApp,
    user: &str,
    id: &str,
    payload: &str,
    updated_minutes_ago: i64,
) -> i64 {
    let at = Utc::now() - Duration::minutes(updated_minutes_ago);
    record::ActiveModel {
        user_id: Set(user.to_string()),
        provider: Set("acme".to_string()),
        external_id: Set(id.to_string()),
        payload: Set(payload.to_string()),
        content_hash: Set(tributary_providers::record::sha256_hex(payload.as_bytes())),
        first_seen_run_id: Set(0),
        last_seen_run_id: Set(0),
        created_at: Set(at),
        updated_at: Set(at),
        ..Default::default()
    }
    .insert(&app.db)
    .await
    .unwrap()
    .id
}

#[tokio::test]
async fn the_library_sync_refuses_a_records_table_without_the_key_index() {
    let app = spawn_app().await;
    serve(&app, json!(items("s", "alice", 0..3))).await;
    let settings = app
        .settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;
    app.execute(match backend() {
        Backend::Mysql => "DROP INDEX records_user_provider_external_id_key ON records",
        _ => "DROP INDEX records_user_provider_external_id_key",
    })
    .await;
    let refused = tributary::sync::sync_matching(
        &app.db,
        &settings,
        &Default::default(),
        &tributary::pipeline::RunOptions::manual(),
        &tributary::pipeline::NoProgress,
    )
    .await
    .expect_err("sync refuses a table without the key index");
    assert!(
        refused
            .to_string()
            .contains("tributary reconcile --dry-run"),
        "{refused}"
    );
    assert!(app.records().await.is_empty(), "nothing was stored");
    let runs = tributary::entities::sync_run::Entity::find()
        .all(&app.db)
        .await
        .unwrap();
    assert!(runs.is_empty(), "no run started: {runs:?}");
}

#[tokio::test]
async fn reconcile_removes_duplicates_by_the_key_with_an_audit_log_then_creates_the_index() {
    let app = spawn_app().await;
    let drop_index = match backend() {
        Backend::Mysql => "DROP INDEX records_user_provider_external_id_key ON records",
        _ => "DROP INDEX records_user_provider_external_id_key",
    };
    app.execute(drop_index).await;
    let old = raw_record(&app, "alice", "x", r#"{"v":"old"}"#, 60).await;
    let newest = raw_record(&app, "alice", "x", r#"{"v":"new"}"#, 5).await;
    let _middle = raw_record(&app, "alice", "x", r#"{"v":"mid"}"#, 30).await;
    let tie_low = raw_record(&app, "alice", "y", r#"{"v":1}"#, 10).await;
    // The same instant as tie_low: the lowest id wins the tie.
    let tie_high = tie_low + 1;
    let at = record::Entity::find_by_id(tie_low)
        .one(&app.db)
        .await
        .unwrap()
        .unwrap()
        .updated_at;
    record::ActiveModel {
        user_id: Set("alice".into()),
        provider: Set("acme".into()),
        external_id: Set("y".into()),
        payload: Set(r#"{"v":2}"#.into()),
        content_hash: Set("h".into()),
        first_seen_run_id: Set(0),
        last_seen_run_id: Set(0),
        created_at: Set(at),
        updated_at: Set(at),
        ..Default::default()
    }
    .insert(&app.db)
    .await
    .unwrap();
    // Same external id under another user or provider is not a duplicate.
    raw_record(&app, "bob", "x", r#"{"v":"bob"}"#, 1).await;
    raw_record(&app, "alice", "z", r#"{"v":"single"}"#, 1).await;
    assert_eq!(app.records().await.len(), 7);

    serve(&app, json!(items("s", "alice", 0..1))).await;
    let config = app.write_config(&cursor_provider("acme", &app.api.uri(), &["alice"]));
    let (code, _, stderr) = tributary(&config, &["sync", "--quiet"]);
    assert_eq!(code, 1, "sync refuses a table without the key index");
    assert!(stderr.contains("tributary reconcile --dry-run"), "{stderr}");

    let (code, stdout, stderr) = tributary(&config, &["reconcile", "--dry-run"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("2 duplicate key(s); would remove 3 row(s)."),
        "{stdout}"
    );
    assert_eq!(stdout.matches("would remove: {").count(), 3);
    assert_eq!(app.records().await.len(), 7, "a dry run changes nothing");
    assert!(
        app.unique_indexes_on_records().await.is_empty(),
        "a dry run creates no index"
    );

    // Deleting without a record of what went needs saying so.
    let (code, _, stderr) = tributary(&config, &["reconcile"]);
    assert_ne!(code, 0);
    assert!(
        stderr.contains("give --audit-log FILE") && stderr.contains("--no-audit-log"),
        "{stderr}"
    );
    assert_eq!(
        app.records().await.len(),
        7,
        "a refused reconcile changes nothing"
    );

    let audit = app.dir.path().join("audit.jsonl");
    let (code, stdout, stderr) = tributary(
        &config,
        &["reconcile", "--audit-log", audit.to_str().unwrap()],
    );
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&audit).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "the audit log holds payloads");
    }
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("removed 3 row(s)") && stdout.contains("Created the unique index"),
        "{stdout}"
    );
    let kept: Vec<i64> = app.records().await.iter().map(|r| r.id).collect();
    assert_eq!(kept.len(), 4);
    assert!(kept.contains(&newest) && kept.contains(&tie_low));
    assert!(!kept.contains(&old) && !kept.contains(&tie_high));
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    for line in &lines {
        let removed = line["removed"]["id"].as_i64().unwrap();
        assert!(!kept.contains(&removed));
        assert!(kept.contains(&line["kept_id"].as_i64().unwrap()));
        assert_eq!(line["key"]["user_id"], "alice");
        assert!(
            line["removed"]["payload"].is_string(),
            "the removed row is logged whole"
        );
        assert!(line["reason"]
            .as_str()
            .unwrap()
            .contains("most recently updated"));
        assert!(line["at"].is_string());
    }
    assert_eq!(
        app.unique_indexes_on_records().await,
        vec![vec!["user_id", "provider", "external_id"]]
    );

    // Now the pipeline runs again, and a second reconcile finds nothing.
    let (code, _, stderr) = tributary(&config, &["sync", "--quiet"]);
    assert_eq!(code, 0, "{stderr}");
    let (code, stdout, _) = tributary(&config, &["reconcile", "--no-audit-log"]);
    assert_eq!(code, 0);
    assert!(
        stdout.contains("0 duplicate key(s); removed 0 row(s).")
            && stdout.contains("already there"),
        "{stdout}"
    );
}

#[tokio::test]
async fn append_mode_rejects_a_late_retry_inside_the_retention_and_sweeps_expired_keys() {
    let app = spawn_app().await;
    let providers = cursor_provider("events", &app.api.uri(), &["alice"]).replace(
        "schedule = \"0 */15 * * * *\"",
        "schedule = \"0 */15 * * * *\"\nmode = \"append\"\nretention = \"30d\"",
    );
    let settings = app.settings(&providers).await;
    serve(
        &app,
        json!([{"id": "evt_1", "type": "charge.created"}, {"id": "evt_2", "type": "charge.paid"}]),
    )
    .await;
    let first = app.sync_one(&settings).await;
    assert_eq!(first.counts.inserted, 2);
    let before = app.dump_records().await;

    // A late retry of evt_1, with content that differs: an event is never updated in place.
    serve(
        &app,
        json!([{"id": "evt_1", "type": "charge.created", "retry": true}, {"id": "evt_3"}]),
    )
    .await;
    let retry = app.sync_one(&settings).await;
    assert_eq!(
        (
            retry.counts.inserted,
            retry.counts.duplicate,
            retry.counts.updated
        ),
        (1, 1, 0)
    );
    let after = app.dump_records().await;
    assert_eq!(after.len(), 3);
    assert!(
        after.contains(&before[0]) && after.contains(&before[1]),
        "evt_1 and evt_2 untouched"
    );

    let keys = processed_key::Entity::find().all(&app.db).await.unwrap();
    assert_eq!(keys.len(), 3);
    assert!(keys
        .iter()
        .all(|k| k.expires_at > Utc::now() + Duration::days(29)));

    assert!(
        app.run_errors(retry.run_id).await.is_empty(),
        "a duplicate is not an error"
    );
}

#[test]
fn append_mode_needs_a_retention_and_the_mode_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let base = format!(
        "[database]\nurl = \"sqlite://{}?mode=rwc\"\n{}",
        dir.path().join("t.db").display(),
        cursor_provider("events", "http://127.0.0.1:9", &["alice"])
    );
    let parse = |text: String| {
        tributary::config::Settings::parse(std::path::Path::new("c.toml"), &text, None, &|_| true)
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let with = |extra: &str| {
        base.replace(
            "schedule = \"0 */15 * * * *\"",
            &format!("schedule = \"0 */15 * * * *\"\n{extra}"),
        )
    };
    let error = parse(with("mode = \"append\"")).unwrap_err();
    assert!(
        error.contains("providers.events.retention") && error.contains("needs a retention"),
        "{error}"
    );
    let error = parse(with("mode = \"merge\"")).unwrap_err();
    assert!(error.contains("providers.events.mode"), "{error}");
    let error = parse(with("retention = \"30d\"")).unwrap_err();
    assert!(
        error.contains("only applies with mode = \"append\""),
        "{error}"
    );
    assert!(parse(with("mode = \"append\"\nretention = \"7d\"")).is_ok());
}

#[tokio::test]
async fn replay_never_puts_an_old_payload_over_a_record_a_newer_run_stored() {
    let app = spawn_app().await;
    app.refuse_inserts_of("poison", "poison refused").await;
    serve(&app, json!([{"id": "a"}, {"id": "poison", "v": 1}])).await;
    let config = app.write_config(&cursor_provider("acme", &app.api.uri(), &["alice"]));
    let settings = app
        .settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;
    let failed = app.sync_one(&settings).await;
    assert_eq!(
        (failed.status, failed.counts.failed),
        (RunStatus::Partial, 1)
    );

    // The database is fixed, and a newer run stores the record's newer version.
    drop_refusal(&app).await;
    serve(&app, json!([{"id": "a"}, {"id": "poison", "v": 2}])).await;
    let newer = app.sync_one(&settings).await;
    assert_eq!(newer.status, RunStatus::Succeeded, "{:?}", newer.error);
    let before = app.dump_records().await;

    let (code, stdout, stderr) =
        tributary(&config, &["replay", &failed.run_id.to_string(), "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["resolved"], json!([]), "{report}");
    assert_eq!(
        report["superseded"].as_array().map(Vec::len),
        Some(1),
        "{report}"
    );
    assert_eq!(app.dump_records().await, before, "the newer payload stays");
    let poison = app
        .records()
        .await
        .into_iter()
        .find(|r| r.external_id == "poison")
        .expect("stored by the newer run");
    assert_eq!(poison.payload, r#"{"id":"poison","v":2}"#);
    // Closed: no longer open, so a later replay does nothing.
    let (_, stdout, _) = tributary(&config, &["errors", "--open", "--json"]);
    let open: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(open, json!([]));
}

#[tokio::test]
async fn replay_never_brings_back_a_record_a_newer_run_deleted() {
    let app = spawn_app().await;
    let provider = cursor_provider("acme", &app.api.uri(), &["alice"]).replacen(
        "auth = \"bearer\"\n",
        "auth = \"bearer\"\ntrack_deletes = true\n",
        1,
    );
    let config = app.write_config(&provider);
    let settings = app.settings(&provider).await;
    serve(&app, json!([{"id": "a"}, {"id": "poison", "v": 1}])).await;
    assert_eq!(app.sync_one(&settings).await.counts.inserted, 2);
    // Run 2 cannot store poison's update; a later complete pass no longer lists poison.
    app.refuse_updates_of("poison", "poison refused").await;
    serve(&app, json!([{"id": "a"}, {"id": "poison", "v": 2}])).await;
    let failed = app.sync_one(&settings).await;
    assert_eq!(
        (failed.status, failed.counts.failed),
        (RunStatus::Partial, 1)
    );
    match backend() {
        Backend::Postgres => app.execute("DROP TRIGGER refuse_update ON records").await,
        _ => app.execute("DROP TRIGGER refuse_update").await,
    }
    serve(&app, json!([{"id": "a"}])).await;
    let pass = app.sync_one(&settings).await;
    assert_eq!(
        (pass.status, pass.counts.deleted),
        (RunStatus::Succeeded, 1),
        "{pass:?}"
    );
    let before = app.dump_records().await;

    let (code, stdout, stderr) =
        tributary(&config, &["replay", &failed.run_id.to_string(), "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["resolved"], json!([]), "{report}");
    assert_eq!(
        report["superseded"].as_array().map(Vec::len),
        Some(1),
        "{report}"
    );
    assert_eq!(app.dump_records().await, before, "poison stays deleted");
    let poison = app
        .records()
        .await
        .into_iter()
        .find(|r| r.external_id == "poison")
        .expect("marked, never removed");
    assert_eq!(
        (poison.deleted_by_run_id, poison.payload.as_str()),
        (Some(pass.run_id), r#"{"id":"poison","v":1}"#)
    );
}

#[tokio::test]
async fn replay_checks_the_cursor_field_as_a_fetch_does() {
    let app = spawn_app().await;
    let provider = cursor_provider("acme", &app.api.uri(), &["alice"]).replacen(
        "id_field = \"id\"\n",
        "id_field = \"id\"\nincremental = { cursor_field = \"updated_at\", param = \"since\" }\n",
        1,
    );
    let config = app.write_config(&provider);
    let settings = app.settings(&provider).await;
    serve(
        &app,
        json!([
            {"id": "a", "updated_at": "2026-11-01T10:00:00Z"},
            {"id": "bad", "updated_at": "last tuesday"}
        ]),
    )
    .await;
    let run = app.sync_one(&settings).await;
    assert_eq!(
        (run.status, run.counts.inserted, run.counts.failed),
        (RunStatus::Partial, 1, 1),
        "{run:?}"
    );
    let rejected = app.run_errors(run.run_id).await;
    assert_eq!(rejected[0].stage, Stage::Validate);

    let (code, stdout, stderr) = tributary(&config, &["replay", &run.run_id.to_string(), "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["resolved"], json!([]), "{report}");
    let still = report["still_failing"].to_string();
    assert!(
        still.contains("incremental.cursor_field `updated_at`") && still.contains("last tuesday"),
        "{report}"
    );
    let ids: Vec<String> = app
        .records()
        .await
        .into_iter()
        .map(|r| r.external_id)
        .collect();
    assert_eq!(ids, ["a"], "the record the fetch set aside is not stored");
    let open = app.run_errors(run.run_id).await;
    assert!(open.iter().all(|e| e.resolved_by_run_id.is_none()));
}
