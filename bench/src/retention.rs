//! `--retention-runs N`: the retention sweep on a large history, beside a writer.
//!
//! A fresh database gets N runs older than the retention, spread over 1,000 connections,
//! in one `INSERT ... SELECT` (`generate_series` on PostgreSQL, a recursive CTE on SQLite;
//! PostgreSQL then analyzes the table, as autovacuum does after a load). A page writer
//! then commits a page of 10 new records every 20 ms through `Run::store`, first alone
//! for a few seconds (its baseline), then while [`tributary::retention::sweep`] deletes
//! every old run but each connection's last. The report gives the sweep's rows per
//! second, its batches and its longest statement, and the page writer's commit times
//! with and without the sweep.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::Utc;
use sea_orm::{ConnectionTrait, DbBackend, EntityTrait, PaginatorTrait, Statement};
use serde::Serialize;
use tributary::config::{NotifyRuns, RetentionSettings, Settings, StreamSettings, WriteMode};
use tributary::db::DatabasePools;
use tributary::entities::sync_run::{RunStatus, Trigger};
use tributary::entities::{connection, sync_run};
use tributary::pipeline::{CheckpointMove, DeletionPass, PageExpectation, Run, RunEnd, RunPage};
use tributary_providers::record::sha256_hex;
use tributary_providers::{PageItem, Record};

use super::verify::Check;
use super::PROVIDER;

/// Connections the seeded runs belong to: each keeps its last run.
const CONNECTIONS: u64 = 1_000;
/// The retention the sweep applies; every seeded run is older.
const RETENTION: Duration = Duration::from_secs(30 * 24 * 60 * 60);
/// How long the page writer runs alone first.
const BASELINE: Duration = Duration::from_secs(5);
/// The page writer's pause between two pages.
const PAGE_EVERY: Duration = Duration::from_millis(20);
/// Records per page the writer commits.
const PAGE_RECORDS: usize = 10;

/// What the scenario measured.
#[derive(Clone, Debug, Serialize)]
pub struct RetentionReport {
    pub backend: String,
    pub seeded_runs: u64,
    pub seed_seconds: f64,
    pub swept_runs: u64,
    pub sweep_seconds: f64,
    pub runs_per_sec: f64,
    pub batch_size: usize,
    pub batches: u64,
    pub statements: u64,
    pub longest_statement_ms: f64,
    pub pages_alone: Latencies,
    pub pages_during_sweep: Latencies,
    pub checks: Vec<Check>,
}

/// The page writer's commit times.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Latencies {
    pub pages: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Latencies {
    fn of(mut samples: Vec<Duration>) -> Latencies {
        samples.sort_unstable();
        let at = |share: f64| {
            let index = ((samples.len() as f64 - 1.0) * share).round() as usize;
            samples
                .get(index)
                .map_or(0.0, |sample| sample.as_secs_f64() * 1e3)
        };
        Latencies {
            pages: samples.len(),
            p50_ms: at(0.5),
            p99_ms: at(0.99),
            max_ms: at(1.0),
        }
    }
}

/// Runs the scenario on the empty database at `database_url`.
pub async fn run_retention(
    database_url: &str,
    runs: u64,
    batch_size: usize,
) -> anyhow::Result<RetentionReport> {
    let text = format!(
        "[database]\nurl = {url}\n\n[providers.{PROVIDER}]\nkind = \"stripe\"\n\
         base_url = \"http://127.0.0.1:9\"\nschedule = \"0 0 0 * * *\"\n\n\
         [[providers.{PROVIDER}.connections]]\nuser_id = \"writer\"\ntoken = \"sk_test_writer\"\n",
        url = toml::Value::String(database_url.to_string()),
    );
    let settings = Settings::parse(Path::new("(bench config)"), &text, None, &|_| true)?;
    let keyring = tributary::secrets::Keyring::ephemeral();
    let access = tributary::app::Access::Work {
        command: "bench",
        older: tributary::db::OlderInstances::Refuse,
    };
    let app = tributary::app::App::open_with_keyring(settings, access, keyring).await?;
    let db = app.db().clone();
    let backend = db.get_database_backend();

    let started = Instant::now();
    seed(&db, runs).await.context("seeding the runs")?;
    let seed_seconds = started.elapsed().as_secs_f64();
    eprintln!("seeded {runs} runs in {seed_seconds:.1} s");

    let connection = connection::Entity::find()
        .one(&*db)
        .await?
        .context("the writer's connection")?;
    let writer = Writer::open(&db, &connection).await?;
    let alone = writer.write_for(BASELINE).await?;

    let settings = RetentionSettings {
        runs: RETENTION,
        batch_size,
        ..RetentionSettings::default()
    };
    let sweeping = AtomicBool::new(true);
    let started = Instant::now();
    let sweep = async {
        let swept = tributary::retention::sweep(&db, &settings, Utc::now()).await;
        let seconds = started.elapsed().as_secs_f64();
        sweeping.store(false, Ordering::SeqCst);
        (swept, seconds)
    };
    let ((swept, sweep_seconds), during) = tokio::join!(sweep, writer.write_while(&sweeping));
    let during = during?;
    let swept = swept?;
    writer.finish().await?;

    let left = sync_run::Entity::find().count(&**app.db()).await?;
    let expected_swept = runs.saturating_sub(CONNECTIONS.min(runs));
    let checks = vec![
        Check::equal("runs swept", swept.runs, expected_swept),
        // Each connection's last run, and the writer's.
        Check::equal("runs left", left, runs - expected_swept + 1),
        Check::equal(
            "largest batch within batch_size",
            swept.largest_batch <= batch_size as u64,
            true,
        ),
    ];
    app.close().await;
    Ok(RetentionReport {
        backend: format!("{backend:?}"),
        seeded_runs: runs,
        seed_seconds,
        swept_runs: swept.runs,
        sweep_seconds,
        runs_per_sec: swept.runs as f64 / sweep_seconds.max(1e-9),
        batch_size,
        batches: swept.batches,
        statements: swept.statements,
        longest_statement_ms: swept.longest_statement.as_secs_f64() * 1e3,
        pages_alone: Latencies::of(alone),
        pages_during_sweep: Latencies::of(during),
        checks,
    })
}

/// Inserts `runs` finished runs older than [`RETENTION`], one a second, over
/// [`CONNECTIONS`] connections, in one statement.
async fn seed(db: &DatabasePools, runs: u64) -> anyhow::Result<()> {
    let newest = Utc::now() - chrono::TimeDelta::from_std(RETENTION)? - chrono::TimeDelta::days(1);
    let first = newest.timestamp() - i64::try_from(runs)?;
    let columns = "user_id, provider, stream, \"trigger\", status, started_at, finished_at, \
                   heartbeat_at";
    let values = |n: &str, at: &str| {
        format!(
            "'hist' || ({n} % {CONNECTIONS}), '{PROVIDER}', 'charges', 'schedule', \
             'succeeded', {at}, {at}, {at}"
        )
    };
    let sql = match db.get_database_backend() {
        DbBackend::Postgres => format!(
            "INSERT INTO sync_runs ({columns}) SELECT {} FROM generate_series(1, {runs}) AS g",
            values("g", &format!("to_timestamp({first} + g)"))
        ),
        // The instant as sqlx writes a whole-second `DateTime<Utc>` (RFC 3339), so that
        // text comparisons order it among the rest.
        DbBackend::Sqlite => format!(
            "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {runs}) \
             INSERT INTO sync_runs ({columns}) SELECT {} FROM g",
            values(
                "n",
                &format!("strftime('%Y-%m-%dT%H:%M:%S+00:00', {first} + n, 'unixepoch')")
            )
        ),
        other => {
            anyhow::bail!("the retention scenario runs on SQLite and PostgreSQL, not {other:?}")
        }
    };
    let backend = db.get_database_backend();
    db.execute_raw(Statement::from_string(backend, sql)).await?;
    if backend == DbBackend::Postgres {
        db.execute_unprepared("ANALYZE sync_runs").await?;
    }
    Ok(())
}

/// The connection whose pages are timed, with a run of its own.
struct Writer<'a> {
    run: tokio::sync::Mutex<Run<'a>>,
    written: std::sync::atomic::AtomicU64,
}

impl<'a> Writer<'a> {
    async fn open(
        db: &'a DatabasePools,
        connection: &'a connection::Model,
    ) -> anyhow::Result<Writer<'a>> {
        let settings = StreamSettings {
            name: "charges".to_string(),
            namespace: connection.provider.clone(),
            parent: None,
        };
        let run = Run::open(db, connection, &settings, Trigger::Manual, None).await?;
        Ok(Writer {
            run: tokio::sync::Mutex::new(run),
            written: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Commits one page of new records; returns how long it took.
    async fn page(&self) -> anyhow::Result<Duration> {
        let first = self
            .written
            .fetch_add(PAGE_RECORDS as u64, Ordering::SeqCst);
        let items: Vec<PageItem> = (0..PAGE_RECORDS as u64)
            .map(|index| {
                let payload = format!("{{\"id\":\"w{}\"}}", first + index);
                PageItem::Record(Record {
                    external_id: format!("w{}", first + index),
                    content_hash: sha256_hex(payload.as_bytes()),
                    payload,
                })
            })
            .collect();
        let page = RunPage {
            items,
            next_checkpoint: None,
            mode: WriteMode::Upsert,
            leave_checkpoint: true,
            expect: PageExpectation::New,
            pages: 1,
            ..RunPage::default()
        };
        let mut run = self.run.lock().await;
        let started = Instant::now();
        run.store(page).await?;
        Ok(started.elapsed())
    }

    async fn write_for(&self, period: Duration) -> anyhow::Result<Vec<Duration>> {
        let until = Instant::now() + period;
        let mut samples = Vec::new();
        while Instant::now() < until {
            samples.push(self.page().await?);
            tokio::time::sleep(PAGE_EVERY).await;
        }
        Ok(samples)
    }

    async fn write_while(&self, going: &AtomicBool) -> anyhow::Result<Vec<Duration>> {
        let mut samples = Vec::new();
        while going.load(Ordering::SeqCst) {
            samples.push(self.page().await?);
            tokio::time::sleep(PAGE_EVERY).await;
        }
        Ok(samples)
    }

    async fn finish(self) -> anyhow::Result<()> {
        let end = RunEnd {
            status: RunStatus::Succeeded,
            error: None,
            listing_complete: false,
            checkpoint: CheckpointMove::Write(None),
            watermark: None,
            notify: NotifyRuns::None,
            deletions: DeletionPass::Off,
            full_passes_served: 0,
            authorization_refused: false,
        };
        self.run.into_inner().close(end).await?;
        Ok(())
    }
}

/// The report as a table of figures.
pub fn table(report: &RetentionReport) -> String {
    let mut table = comfy_table::Table::new();
    table.set_header(["figure", "value"]);
    let rows = [
        ("backend", report.backend.clone()),
        ("runs seeded", report.seeded_runs.to_string()),
        ("seed time", format!("{:.1} s", report.seed_seconds)),
        ("runs swept", report.swept_runs.to_string()),
        ("sweep time", format!("{:.1} s", report.sweep_seconds)),
        ("runs/s", format!("{:.0}", report.runs_per_sec)),
        (
            "delete statements",
            format!(
                "{}, at most {} rows each",
                report.batches, report.batch_size
            ),
        ),
        ("statements", report.statements.to_string()),
        (
            "longest statement",
            format!("{:.1} ms", report.longest_statement_ms),
        ),
        ("page commit alone", latencies(&report.pages_alone)),
        (
            "page commit during sweep",
            latencies(&report.pages_during_sweep),
        ),
    ];
    for (name, value) in rows {
        table.add_row([name.to_string(), value]);
    }
    table.to_string()
}

fn latencies(latencies: &Latencies) -> String {
    format!(
        "{} pages: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        latencies.pages, latencies.p50_ms, latencies.p99_ms, latencies.max_ms
    )
}
