//! `tributary-bench` at a tiny scale against the test database (`TRIBUTARY_TEST_DB`): its
//! correctness checks and its JSON output (never its timings).

#[path = "../../tests/common/scratch.rs"]
mod scratch;

use std::time::Duration;

use assert_cmd::Command;
use sea_orm::{EntityTrait, QueryOrder, QuerySelect};
use tributary::entities::sync_run::RunStatus;
use tributary::entities::{connection, connection_stream, record, sync_run};
use tributary_bench::{run_scale, ScaleOptions};

use scratch::scratch_database_url;

#[tokio::test]
async fn the_harness_checks_every_phase_and_an_unchanged_resync_writes_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let database_url = scratch_database_url(dir.path()).await;
    let report = run_scale(&ScaleOptions {
        users: 3,
        records_per_user: 250,
        database_url: database_url.clone(),
        latency: Duration::ZERO,
        concurrency: 2,
        seed: 7,
        provider_options: Vec::new(),
    })
    .await
    .expect("benchmark ran");

    assert!(report.checks_passed, "{:#?}", report.phases);
    assert_eq!(report.total_records, 750);
    let names: Vec<&str> = report.phases.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "first",
            "unchanged",
            "changed_10pct",
            "direct_sql",
            "api_records",
            "store_only"
        ]
    );
    let [first, unchanged, changed, direct, api, store_only] = &report.phases[..] else {
        panic!("six phases");
    };
    // The API phase read every record through the API and with SQL, the same ones, and
    // 50 concurrent clients got no error.
    assert_eq!((direct.records, api.records), (750, 750));
    assert_eq!((direct.pages, api.pages), (1, 1));
    assert_eq!(first.inserted, 750);
    // 250 charges at 100 per page: 3 pages per user.
    assert_eq!(first.pages, 9);
    assert_eq!(
        (unchanged.inserted, unchanged.updated, unchanged.unchanged),
        (0, 0, 750)
    );
    assert_eq!(unchanged.records_rows_written, Some(0));
    assert!(changed.updated > 0 && changed.updated < 150, "{changed:?}");
    assert_eq!(changed.updated + changed.unchanged, 750);
    // The database side alone stores as many new records, in as many pages, once each.
    assert_eq!(
        (store_only.inserted, store_only.pages, store_only.failed),
        (750, 9, 0)
    );
    for phase in report
        .phases
        .iter()
        .filter(|p| !p.name.contains("_sql") && !p.name.starts_with("api"))
    {
        let names: Vec<&str> = phase.checks.iter().map(|c| c.name.as_str()).collect();
        assert!(names.contains(&"rows in records"), "{names:?}");
        assert!(names.contains(&"duplicate keys"), "{names:?}");
    }

    // The harness's own verification agrees with the table: the synced charges, and
    // beside them the store_only phase's records under keys of their own.
    let db = sea_orm::Database::connect(&database_url)
        .await
        .expect("database");
    let records = record::Entity::find()
        .order_by_asc(record::Column::UserId)
        .order_by_asc(record::Column::Provider)
        .order_by_asc(record::Column::ExternalId)
        .all(&db)
        .await
        .expect("records");
    let (stored_alone, synced): (Vec<_>, Vec<_>) = records
        .iter()
        .partition(|r| r.external_id.starts_with("store-"));
    assert_eq!((synced.len(), stored_alone.len()), (750, 750));
    let users: std::collections::BTreeSet<&str> =
        synced.iter().map(|r| r.user_id.as_str()).collect();
    assert_eq!(users.len(), 3);
    // Ids overlap across users: each id is stored once per user.
    let ids: std::collections::BTreeSet<&str> =
        synced.iter().map(|r| r.external_id.as_str()).collect();
    assert_eq!(ids.len(), 250);
    let alone_ids: std::collections::BTreeSet<&str> = stored_alone
        .iter()
        .map(|r| r.external_id.trim_start_matches("store-"))
        .collect();
    assert_eq!(alone_ids, ids, "the same ids, under the phase's prefix");
    // Its runs are closed like any run, with the counters of what they stored.
    let store_runs = sync_run::Entity::find()
        .order_by_desc(sync_run::Column::Id)
        .limit(3)
        .all(&db)
        .await
        .expect("runs");
    assert_eq!(store_runs.len(), 3);
    for run in store_runs {
        assert_eq!(run.status, RunStatus::Succeeded, "{run:?}");
        assert_eq!(
            (run.records_fetched, run.records_inserted, run.pages_fetched),
            (250, 250, 3),
            "{run:?}"
        );
    }
    // ... and leave no checkpoint behind for the next sync of these connections.
    let connections = connection::Entity::find()
        .all(&db)
        .await
        .expect("connections");
    assert_eq!(connections.len(), 3);
    let streams = connection_stream::Entity::find()
        .all(&db)
        .await
        .expect("connection_streams");
    assert_eq!(streams.len(), 3, "{streams:?}");
    assert!(
        streams.iter().all(|s| s.checkpoint.is_none()),
        "{streams:?}"
    );
}

#[tokio::test]
async fn the_command_writes_its_results_as_json() {
    let dir = tempfile::tempdir().expect("temp dir");
    let database_url = scratch_database_url(dir.path()).await;
    let json = dir.path().join("bench.json");
    let output = Command::cargo_bin("tributary-bench")
        .expect("binary built")
        .env_remove("RUST_LOG")
        .args(["--users", "2", "--records", "120", "--concurrency", "2"])
        .arg("--database-url")
        .arg(&database_url)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("records/s"), "{stdout}");

    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("JSON written")).unwrap();
    assert_eq!(report["users"], 2);
    assert_eq!(report["records_per_user"], 120);
    assert_eq!(report["total_records"], 240);
    assert_eq!(report["checks_passed"], true);
    assert!(report["backend"].is_string());
    let phases = report["phases"].as_array().expect("phases");
    assert_eq!(phases.len(), 6);
    assert_eq!(phases[5]["name"], "store_only");
    for phase in phases {
        assert_eq!(phase["records"], 240);
        assert!(phase["seconds"].as_f64().is_some());
        assert!(phase["records_per_sec"].as_f64().is_some_and(|r| r > 0.0));
        assert!(phase["checks"].as_array().is_some_and(|c| !c.is_empty()));
        if cfg!(target_os = "linux") {
            assert!(phase["peak_rss_bytes"].as_u64().is_some_and(|b| b > 0));
        }
    }
    assert_eq!(phases[1]["records_rows_written"], 0);
    assert_eq!(phases[2]["inserted"], 0);
}

#[tokio::test]
async fn with_track_deletes_an_unchanged_resync_still_writes_no_record() {
    let dir = tempfile::tempdir().expect("temp dir");
    let database_url = scratch_database_url(dir.path()).await;
    let report = run_scale(&ScaleOptions {
        users: 2,
        records_per_user: 250,
        database_url: database_url.clone(),
        latency: Duration::ZERO,
        concurrency: 2,
        seed: 7,
        provider_options: vec![("track_deletes".into(), "true".into())],
    })
    .await
    .expect("benchmark ran");
    assert!(report.checks_passed, "{:#?}", report.phases);
    let unchanged = &report.phases[1];
    assert_eq!(unchanged.name, "unchanged");
    assert_eq!(unchanged.unchanged, 500);
    assert_eq!(unchanged.records_rows_written, Some(0));
    // Every full pass tracked its keys and removed them as it closed.
    let db = sea_orm::Database::connect(&database_url)
        .await
        .expect("database");
    let sightings = tributary::entities::run_sighting::Entity::find()
        .all(&db)
        .await
        .expect("sightings");
    assert!(sightings.is_empty(), "{sightings:?}");
    let deleted = record::Entity::find()
        .all(&db)
        .await
        .expect("records")
        .into_iter()
        .filter(|r| r.deleted_at.is_some())
        .count();
    assert_eq!(deleted, 0);
}

/// On PostgreSQL a run connects over TLS (the server offers it) unless told not to, and
/// times a first sync without TLS beside its own, reporting the ratio; a SQLite run has
/// nothing to compare.
#[tokio::test]
async fn on_postgresql_the_first_sync_over_tls_is_compared_with_one_without() {
    let dir = tempfile::tempdir().expect("temp dir");
    let json = dir.path().join("bench.json");
    let postgres = scratch::backend() == scratch::Backend::Postgres;
    let mut command = Command::cargo_bin("tributary-bench").expect("binary built");
    command
        .env_remove("RUST_LOG")
        .args(["--users", "2", "--records", "2000", "--concurrency", "2"])
        .arg("--json")
        .arg(&json);
    match postgres {
        true => {
            let server = std::env::var("TRIBUTARY_TEST_POSTGRES_URL")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".to_string());
            command
                .args(["--database", "postgres"])
                .env(tributary_bench::POSTGRES_URL_ENV, server)
        }
        false => command.args(["--database", "sqlite"]),
    };
    let output = command.output().expect("binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("JSON written")).unwrap();
    assert_eq!(report["checks_passed"], true);
    let tls = &report["postgres_tls"];
    if !postgres {
        assert!(tls.is_null(), "{tls}");
        assert!(!stdout.contains("over TLS"), "{stdout}");
        return;
    }
    let database = report["database"].as_str().expect("database");
    assert!(!database.contains("sslmode"), "TLS by default: {database}");
    let seconds = |key: &str| tls[key].as_f64().filter(|s| *s > 0.0);
    let (with, without) = (seconds("tls_seconds"), seconds("no_tls_seconds"));
    let ratio = tls["first_sync_ratio"].as_f64().expect("ratio reported");
    assert!(with.is_some() && without.is_some(), "{tls}");
    assert!(
        stdout.contains("first sync over TLS / without TLS"),
        "{stdout}"
    );
    // Both syncs are timed in one process, one after the other, so a shared machine's
    // speed cancels out; Nagle's stalls made TLS several times slower at this size, and
    // the bound leaves room for noise.
    assert!(
        ratio < 2.5,
        "the first sync over TLS took {ratio:.2}x as long: {tls}"
    );
}

#[tokio::test]
async fn the_retention_scenario_sweeps_every_run_but_each_connections_last() {
    let dir = tempfile::tempdir().expect("temp dir");
    let database_url = scratch_database_url(dir.path()).await;
    let json = dir.path().join("retention.json");
    let output = Command::cargo_bin("tributary-bench")
        .expect("binary built")
        .env_remove("RUST_LOG")
        .args(["--retention-runs", "3000", "--retention-batch", "250"])
        .arg("--database-url")
        .arg(&database_url)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("binary runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    if scratch::backend() == scratch::Backend::Mysql {
        assert!(!output.status.success(), "{stdout}");
        assert!(stderr.contains("runs on SQLite and PostgreSQL"), "{stderr}");
        return;
    }
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("JSON written")).unwrap();
    // 1,000 connections of 3 runs each keep their last.
    assert_eq!(report["swept_runs"], 2000, "{report}");
    assert_eq!(report["batches"], 8, "{report}");
    let checks = report["checks"].as_array().expect("checks");
    assert!(
        checks.iter().all(|check| check["passed"] == true),
        "{report}"
    );
    assert!(report["pages_during_sweep"]["pages"].as_u64().is_some());
}

/// The fleet at a tiny scale: three daemon processes (the `tributary` binary beside the
/// bench's, built by the workspace's tests) share 24 connections on a 5-second schedule
/// under a global limit, one killed halfway; the scenario's own checks (one job per
/// slot, no run twice, none missed, no 429) pass. It needs PostgreSQL and says so
/// elsewhere.
#[tokio::test]
async fn the_fleet_runs_each_slot_once_across_daemons_with_no_429() {
    let dir = tempfile::tempdir().expect("temp dir");
    let database_url = scratch_database_url(dir.path()).await;
    let json = dir.path().join("fleet.json");
    let output = Command::cargo_bin("tributary-bench")
        .expect("binary built")
        .env_remove("RUST_LOG")
        .args([
            "--fleet",
            "--fleet-connections",
            "24",
            "--fleet-period",
            "5",
        ])
        .args([
            "--fleet-slots",
            "3",
            "--fleet-limit",
            "200",
            "--concurrency",
            "4",
        ])
        .arg("--database-url")
        .arg(&database_url)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("binary runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    if scratch::backend() != scratch::Backend::Postgres {
        assert!(!output.status.success(), "{stdout}");
        assert!(
            stderr.contains("the fleet runs on PostgreSQL only"),
            "{stderr}"
        );
        return;
    }
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("JSON written")).unwrap();
    assert_eq!(report["slot_jobs"], 72, "{report}");
    assert_eq!(report["answered_429"], 0, "{report}");
    assert_eq!(
        report["peak_rss_mib"].as_array().map(Vec::len),
        Some(3),
        "{report}"
    );
    let checks = report["checks"].as_array().expect("checks");
    assert!(checks.len() >= 7, "{report}");
    assert!(
        checks.iter().all(|check| check["passed"] == true),
        "{report}"
    );
}
