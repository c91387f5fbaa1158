//! `--fleet`: the job queue at scale. Several `tributary daemon` processes share one
//! PostgreSQL database and sync many connections on a short schedule from one emulated
//! API whose application-wide limit answers 429 past it, with the provider's request
//! budget set to that limit; one daemon is killed with SIGKILL halfway.
//!
//! Measured and checked from the database and the emulator afterwards: every watched
//! slot of every connection is one job, run at most once (a run named by one job only),
//! none missed but those deferred by the budget, which ran later; no 429 answered; the
//! delay from a slot to its run's start (p50, p99); the statements each daemon sent per
//! slot (its `/metrics` counter, read at the first slot and before it is killed or
//! stopped) and the database's transactions per slot (`pg_stat_database`); peak RSS per
//! daemon (VmHWM); how soon each of the killed daemon's jobs was claimed again elsewhere,
//! checked against the heartbeat's lapse; and where the machine's CPU went from the first
//! slot on: each daemon, PostgreSQL, this process (the emulator).

use std::collections::{BTreeMap, BTreeSet};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{DateTime, Utc};
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, Statement};
use serde::Serialize;
use tributary::entities::sync_job::{self, JobKind, JobStatus};
use tributary::entities::sync_run;

use super::cpu::{CpuMeter, CpuSpent};
use super::emulator::{Dataset, Emulator, GlobalLimit, TOKEN_PREFIX};
use super::verify::Check;
use super::PROVIDER;

/// How long after its last heartbeat an instance is taken for gone and its jobs re-queued
/// (`STALE_AFTER` in src/db/instances.rs), how often a daemon looks for such jobs
/// (`ORPHANS_EVERY`) and reads the queue (`POLL_EVERY`, both in src/daemon/worker.rs).
const HEARTBEAT_LAPSE: Duration = Duration::from_secs(120);
const ORPHANS_LOOK: Duration = Duration::from_secs(5);
const CLAIM_POLL: Duration = Duration::from_secs(1);
/// Room for a re-queued job to wait for a free run slot of a busy daemon.
const RECLAIM_SLACK: Duration = Duration::from_secs(10);

/// What the fleet runs.
#[derive(Clone, Debug)]
pub struct FleetOptions {
    pub database_url: String,
    /// The `tributary` binary the daemons run.
    pub binary: PathBuf,
    pub connections: u32,
    pub daemons: usize,
    /// Seconds between slots (divides 60).
    pub period: u32,
    pub slots: u32,
    /// The emulator's limit and the provider's budget, per `limit_window`.
    pub limit: u64,
    pub limit_window: Duration,
    /// SIGKILL the first daemon halfway.
    pub kill: bool,
    /// Each daemon's `max_concurrent_runs` and the provider's `max_concurrent_connections`.
    pub concurrency: usize,
}

/// What the fleet measured.
#[derive(Clone, Debug, Serialize)]
pub struct FleetReport {
    pub connections: u32,
    pub daemons: usize,
    pub period_seconds: u32,
    pub slots: u32,
    pub limit: String,
    pub slot_jobs: usize,
    pub runs: usize,
    pub runs_by_status: BTreeMap<String, usize>,
    pub jobs_by_status: BTreeMap<String, usize>,
    pub deferred_jobs: usize,
    /// Skipped while the killed daemon's lease lasted, or the killed daemon's own jobs
    /// superseded when put back, served by a later run.
    pub skipped_served_later: usize,
    pub requests: u64,
    pub answered_429: u64,
    pub delay_p50_seconds: f64,
    pub delay_p99_seconds: f64,
    pub transactions_per_slot: f64,
    pub transactions_per_run: f64,
    /// Statements each daemon sent per watched slot, from the first slot until it was
    /// killed or stopped.
    pub statements_per_slot: Vec<f64>,
    pub statements_per_slot_total: f64,
    pub statements_per_run: f64,
    pub peak_rss_mib: Vec<f64>,
    /// CPU seconds from the first slot to the end: each daemon, then this process.
    pub cpu: CpuSpent,
    /// CPU milliseconds a run: the daemons', PostgreSQL's, this process's.
    pub cpu_ms_per_run: (f64, f64, f64),
    pub killed_jobs: usize,
    pub killed_jobs_rerun_within_seconds: Option<f64>,
    /// From the kill to each killed job's claim by another daemon: the most, the median.
    pub reclaimed_max_seconds: Option<f64>,
    pub reclaimed_p50_seconds: Option<f64>,
    pub seconds: f64,
    pub checks: Vec<Check>,
}

/// A daemon process and its log.
struct Daemon {
    child: Child,
    log: PathBuf,
    /// Where its `/metrics` is served.
    metrics_port: u16,
    /// Its statement count at the first slot, then when it was killed or stopped.
    statements_from: u64,
    statements_to: u64,
    peak_rss_kib: u64,
    killed: bool,
}

impl Daemon {
    fn start(
        binary: &Path,
        config: &Path,
        log: PathBuf,
        metrics_port: u16,
    ) -> anyhow::Result<Daemon> {
        let file =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = Command::new(binary)
            .arg("--config")
            .arg(config)
            .args(["--log", "warn,tributary::daemon=info"])
            .arg("daemon")
            .env_remove("TRIBUTARY_DATABASE_URL")
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        Ok(Daemon {
            child,
            log,
            metrics_port,
            statements_from: 0,
            statements_to: 0,
            peak_rss_kib: 0,
            killed: false,
        })
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Reads the process's VmHWM (its peak RSS so far) while it runs.
    fn sample_rss(&mut self) {
        if self.killed {
            return;
        }
        let path = format!("/proc/{}/status", self.child.id());
        let Ok(file) = std::fs::File::open(path) else {
            return;
        };
        for line in std::io::BufReader::new(file).lines().map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix("VmHWM:") {
                let kib = rest
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse()
                    .unwrap_or(0);
                self.peak_rss_kib = self.peak_rss_kib.max(kib);
            }
        }
    }

    /// The statements it has sent so far, from its `/metrics`.
    async fn statements(&self, client: &reqwest::Client) -> anyhow::Result<u64> {
        let url = format!("http://127.0.0.1:{}/metrics", self.metrics_port);
        let text = client
            .get(&url)
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .with_context(|| format!("reading {url}"))?
            .text()
            .await?;
        text.lines()
            .find_map(|line| line.strip_prefix("tributary_database_statements_total "))
            .and_then(|value| value.trim().parse::<f64>().ok())
            // Prometheus' text format writes every value as a float.
            .map(|value| value as u64)
            .with_context(|| format!("{url} has no tributary_database_statements_total"))
    }

    fn signal(&self, signal: &str) {
        let _ = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The config the daemons read; each daemon's serves `/metrics` on `metrics_port`.
fn config_text(options: &FleetOptions, base_url: &str, metrics_port: Option<u16>) -> String {
    let schedule = if options.period >= 60 {
        "0 * * * * *".to_string()
    } else {
        format!("*/{} * * * * *", options.period)
    };
    let window = options.limit_window.as_secs().max(1);
    let listen = metrics_port
        .map(|port| format!("listen = \"127.0.0.1:{port}\"\n"))
        .unwrap_or_default();
    let mut text = format!(
        r#"[database]
url = {url}
max_connections = {pool}

[daemon]
{listen}lease_ttl = "10s"
shutdown_grace = "10s"
max_concurrent_runs = {concurrency}
retries = 0

[providers.{PROVIDER}]
kind = "stripe"
base_url = "{base_url}"
schedule = "{schedule}"
max_concurrent_connections = {concurrency}
streams = ["charges"]

[providers.{PROVIDER}.budget]
app = [{{ requests = {limit}, per = "{window}s" }}]
"#,
        url = toml::Value::String(options.database_url.clone()),
        pool = (options.concurrency + 4).clamp(4, 64),
        concurrency = options.concurrency,
        limit = options.limit,
    );
    for user in 1..=options.connections {
        text.push_str(&format!(
            "\n[[providers.{PROVIDER}.connections]]\nuser_id = \"user{user:05}\"\ntoken = \"{TOKEN_PREFIX}{user}\"\n"
        ));
    }
    text
}

/// The database's committed and rolled-back transactions so far.
async fn transactions(db: &sea_orm::DatabaseConnection) -> anyhow::Result<i64> {
    let row = db
        .query_one_raw(Statement::from_string(
            db.get_database_backend(),
            "SELECT (xact_commit + xact_rollback)::bigint AS n FROM pg_stat_database \
             WHERE datname = current_database()",
        ))
        .await?
        .context("pg_stat_database has no row for the database")?;
    Ok(row.try_get("", "n")?)
}

/// A port free on 127.0.0.1 now.
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The first slot time at least `ahead` from now.
fn next_slot(period: u32, ahead: Duration) -> DateTime<Utc> {
    let period = i64::from(period.max(1));
    let from = Utc::now() + chrono::TimeDelta::from_std(ahead).unwrap_or_default();
    let seconds = from.timestamp();
    let next = seconds - seconds.rem_euclid(period) + period;
    DateTime::from_timestamp(next, 0).unwrap_or(from)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// The run ids a job's outcome names (`run 12 succeeded, run 13 partial; ...`).
fn runs_named(job: &sync_job::Model) -> Vec<i64> {
    job.outcome
        .as_deref()
        .unwrap_or_default()
        .split([',', ';'])
        .filter_map(|part| part.trim().strip_prefix("run "))
        .filter_map(|rest| rest.split(' ').next()?.parse().ok())
        .collect()
}

/// Runs the fleet and checks it.
pub async fn run_fleet(options: &FleetOptions) -> anyhow::Result<FleetReport> {
    anyhow::ensure!(
        options.period >= 1 && 60 % options.period == 0,
        "--fleet-period must divide 60 (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30 or 60)"
    );
    anyhow::ensure!(
        options.database_url.starts_with("postgres"),
        "the fleet runs on PostgreSQL only (--database postgres or a postgres:// --database-url): \
         several daemons share one server"
    );
    anyhow::ensure!(options.daemons >= 1, "--fleet-daemons must be at least 1");
    anyhow::ensure!(options.slots >= 1, "--fleet-slots must be at least 1");
    anyhow::ensure!(
        options.binary.is_file(),
        "no tributary binary at {} (build it: cargo build --release --bins; or pass --fleet-binary)",
        options.binary.display()
    );
    let started = Instant::now();
    let dataset = Dataset {
        users: options.connections,
        records_per_user: 3,
        seed: 1,
    };
    let limit = GlobalLimit {
        requests: options.limit,
        window: options.limit_window,
    };
    let emulator = Emulator::start_limited(dataset, Duration::ZERO, Some(limit))
        .await
        .context("starting the emulated API on 127.0.0.1")?;
    let dir = std::env::temp_dir().join(format!("tributary-fleet-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let config = dir.join("config.toml");
    let key_file = dir.join("secrets.key");
    tributary::secrets::Keyring::generate_key_file(&key_file)?;
    let secrets = format!(
        "\n[secrets]\nkey_file = {}\n",
        toml::Value::String(key_file.display().to_string())
    );
    let text = format!(
        "{}{secrets}",
        config_text(options, &emulator.base_url(), None)
    );
    std::fs::write(&config, &text).with_context(|| format!("writing {}", config.display()))?;

    // The schema and the connections first, by one process, so that the daemons start
    // on a ready database as they would in production.
    let settings = tributary::config::Settings::parse(&config, &text, None, &|_| true)?;
    let access = tributary::app::Access::Work {
        command: "bench",
        older: tributary::db::OlderInstances::Refuse,
    };
    let app = tributary::app::App::open(settings, access).await?;
    app.close().await;
    let db = sea_orm::Database::connect(&options.database_url).await?;

    let mut daemons = Vec::new();
    for i in 0..options.daemons {
        let port = free_port()?;
        let own = dir.join(format!("daemon{i}.toml"));
        let text = format!(
            "{}{secrets}",
            config_text(options, &emulator.base_url(), Some(port))
        );
        std::fs::write(&own, text).with_context(|| format!("writing {}", own.display()))?;
        daemons.push(Daemon::start(
            &options.binary,
            &own,
            dir.join(format!("daemon{i}.log")),
            port,
        )?);
    }
    let client = reqwest::Client::new();
    let ready_by = Instant::now() + Duration::from_secs(120);
    while !daemons
        .iter()
        .all(|daemon| daemon.log_text().contains("Daemon ready."))
    {
        anyhow::ensure!(Instant::now() < ready_by, "the daemons did not get ready");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let period = chrono::TimeDelta::seconds(i64::from(options.period));
    let first = next_slot(options.period, Duration::from_secs(2));
    let slots: Vec<DateTime<Utc>> = (0..options.slots)
        .map(|i| first + period * i32::try_from(i).unwrap_or(i32::MAX))
        .collect();
    let last = slots.last().copied().unwrap_or(first);
    let kill_at = first + (last - first) / 2 + period / 3;
    let mut transactions_at = Vec::new();
    let mut killed_jobs: Vec<i64> = Vec::new();
    let mut killed_when: Option<DateTime<Utc>> = None;
    let mut next_boundary = 0usize;
    let mut cpu: Option<CpuMeter> = None;
    // Watch until every slot job ended, or two periods past the last slot at most
    // beyond the ten minutes that a budget's deferrals may take.
    let give_up = last + period * 2 + chrono::TimeDelta::minutes(10);
    loop {
        let now = Utc::now();
        for daemon in &mut daemons {
            daemon.sample_rss();
        }
        if let Some(cpu) = &mut cpu {
            cpu.sample();
        }
        if next_boundary < slots.len() && now >= slots[next_boundary] {
            if cpu.is_none() {
                let mut pids: Vec<u32> = daemons.iter().map(|daemon| daemon.child.id()).collect();
                pids.push(std::process::id());
                cpu = Some(CpuMeter::start(pids));
                for daemon in &mut daemons {
                    daemon.statements_from = daemon.statements(&client).await?;
                }
            }
            transactions_at.push(transactions(&db).await?);
            next_boundary += 1;
        }
        if options.kill && killed_when.is_none() && options.daemons > 1 && now >= kill_at {
            let victim = &mut daemons[0];
            let pid = victim.child.id();
            victim.statements_to = victim.statements(&client).await?;
            victim.signal("-KILL");
            victim.killed = true;
            killed_when = Some(Utc::now());
            let running = sync_job::Entity::find()
                .filter(sync_job::Column::Status.eq(JobStatus::Running))
                .all(&db)
                .await?;
            killed_jobs = running
                .iter()
                .filter(|job| {
                    job.holder
                        .as_deref()
                        .is_some_and(|holder| holder.split(':').nth(1) == Some(&pid.to_string()))
                })
                .map(|job| job.id)
                .collect();
        }
        if now > last + period {
            // The watched slots' jobs and the jobs without a slot (resumes of deferred
            // runs, re-queued jobs): the daemons go on firing later slots meanwhile.
            let open = sync_job::Entity::find()
                .filter(sync_job::Column::Status.is_in([JobStatus::Queued, JobStatus::Running]))
                .filter(sync_job::Column::NotBefore.lte(now))
                .filter(
                    sea_orm::Condition::any()
                        .add(sync_job::Column::SlotAt.is_null())
                        .add(sync_job::Column::SlotAt.lte(last)),
                )
                .all(&db)
                .await?
                .len();
            if open == 0 || now > give_up {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let transactions_end = transactions(&db).await?;
    let cpu = cpu.map(|mut cpu| {
        cpu.sample();
        cpu.spent()
    });
    for daemon in &mut daemons {
        if !daemon.killed {
            daemon.statements_to = daemon.statements(&client).await?;
        }
    }
    for daemon in &daemons {
        if !daemon.killed {
            daemon.signal("-TERM");
        }
    }
    for daemon in &mut daemons {
        let _ = daemon.child.wait();
    }

    let jobs = sync_job::Entity::find().all(&db).await?;
    let runs = sync_run::Entity::find().all(&db).await?;
    let report = measure(
        options,
        &slots,
        &jobs,
        &runs,
        &transactions_at,
        transactions_end,
        &emulator,
        &daemons,
        &killed_jobs,
        killed_when,
        started,
        cpu.unwrap_or_default(),
    );
    if report.checks.iter().any(|check| !check.passed) {
        for (i, daemon) in daemons.iter().enumerate() {
            let text = daemon.log_text();
            let tail: Vec<&str> = text.lines().rev().take(20).collect();
            eprintln!("--- daemon {i}, last lines:");
            for line in tail.iter().rev() {
                eprintln!("{line}");
            }
        }
    }
    drop(daemons);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(report)
}

#[allow(clippy::too_many_arguments)]
fn measure(
    options: &FleetOptions,
    slots: &[DateTime<Utc>],
    jobs: &[sync_job::Model],
    runs: &[sync_run::Model],
    transactions_at: &[i64],
    transactions_end: i64,
    emulator: &Emulator,
    daemons: &[Daemon],
    killed_jobs: &[i64],
    killed_when: Option<DateTime<Utc>>,
    started: Instant,
    cpu: CpuSpent,
) -> FleetReport {
    let watched: BTreeSet<DateTime<Utc>> = slots.iter().copied().collect();
    let run_by_id: BTreeMap<i64, &sync_run::Model> = runs.iter().map(|run| (run.id, run)).collect();
    let slot_jobs: Vec<&sync_job::Model> = jobs
        .iter()
        .filter(|job| job.kind == JobKind::Scheduled)
        .filter(|job| job.slot_at.is_some_and(|slot| watched.contains(&slot)))
        .collect();
    let mut jobs_by_status = BTreeMap::new();
    for job in &slot_jobs {
        *jobs_by_status
            .entry(job.status.to_string())
            .or_insert(0usize) += 1;
    }
    let mut runs_by_status = BTreeMap::new();
    for run in runs {
        *runs_by_status
            .entry(run.status.to_string())
            .or_insert(0usize) += 1;
    }
    let slot_runs_not_succeeded = slot_jobs
        .iter()
        .flat_map(|job| runs_named(job))
        .filter_map(|id| run_by_id.get(&id))
        .filter(|run| run.status != tributary::entities::sync_run::RunStatus::Succeeded)
        .count();
    // Each run named by one job only; no job names two runs of one stream.
    let mut named_by: BTreeMap<i64, i64> = BTreeMap::new();
    let mut named_twice = Vec::new();
    for job in jobs {
        for run in runs_named(job) {
            if let Some(other) = named_by.insert(run, job.id) {
                named_twice.push((run, other, job.id));
            }
        }
    }
    // A run of the killed daemon ends `interrupted` (marked by the next claim of its
    // connection's lease) and no job names it: its job was put back and ran again. So
    // does one that closed just before the kill, whose job's end was never recorded.
    let killed_connections: BTreeSet<i64> = killed_jobs
        .iter()
        .filter_map(|id| jobs.iter().find(|job| job.id == *id))
        .map(|job| job.connection_id)
        .collect();
    // Jobs know their connection, runs their user: joined through the runs jobs name.
    let connection_of_user: BTreeMap<&str, i64> = jobs
        .iter()
        .flat_map(|job| {
            runs_named(job)
                .into_iter()
                .filter_map(|id| run_by_id.get(&id))
                .map(|run| (run.user_id.as_str(), job.connection_id))
                .collect::<Vec<_>>()
        })
        .collect();
    let killed_daemons_run = |run: &sync_run::Model| {
        killed_when.is_some_and(|killed| run.started_at < killed)
            && connection_of_user
                .get(run.user_id.as_str())
                .is_some_and(|id| killed_connections.contains(id))
    };
    let unnamed: Vec<i64> = runs
        .iter()
        .filter(|run| run.status != tributary::entities::sync_run::RunStatus::Interrupted)
        .filter(|run| !killed_daemons_run(run))
        .map(|run| run.id)
        .filter(|id| !named_by.contains_key(id))
        .collect();
    let slot_jobs_twice: Vec<i64> = slot_jobs
        .iter()
        .filter(|job| runs_named(job).len() > 1)
        .map(|job| job.id)
        .collect();
    // A deferred slot's rest runs as a resume job of its connection; its slot counts as
    // run when the connection has a later run that ended.
    let deferred: Vec<&&sync_job::Model> = slot_jobs
        .iter()
        .filter(|job| {
            job.outcome
                .as_deref()
                .is_some_and(|outcome| outcome.contains("deferred"))
        })
        .collect();
    // A slot skipped because the connection's lease was held (by the killed daemon,
    // until it expired) is served by the connection's next run that started after it.
    // Each connection's latest start of a finished run one of its jobs names, read once
    // rather than per skipped slot.
    let mut last_finished_start: BTreeMap<i64, DateTime<Utc>> = BTreeMap::new();
    for job in jobs {
        for run in runs_named(job).iter().filter_map(|id| run_by_id.get(id)) {
            if run.finished_at.is_some() {
                let latest = last_finished_start
                    .entry(job.connection_id)
                    .or_insert(run.started_at);
                *latest = (*latest).max(run.started_at);
            }
        }
    }
    // A killed daemon's job put back once its heartbeat lapsed meets its connection's
    // later slot, due by then, and is superseded by it: one run serves both, and it is
    // served when the connection has a finished run that started after the kill.
    let killed_superseded = |job: &sync_job::Model| {
        job.status == JobStatus::Skipped
            && killed_jobs.contains(&job.id)
            && job
                .outcome
                .as_deref()
                .is_some_and(|outcome| outcome.contains("superseded"))
            && killed_when.is_some_and(|killed| {
                last_finished_start
                    .get(&job.connection_id)
                    .is_some_and(|started| *started >= killed)
            })
    };
    let served_later = |job: &sync_job::Model| {
        let (Some(slot), JobStatus::Skipped) = (job.slot_at, job.status) else {
            return false;
        };
        if killed_superseded(job) {
            return true;
        }
        // Not a slot superseded by a later one of a backed-up queue: that one is missed.
        let busy = job
            .outcome
            .as_deref()
            .is_some_and(|outcome| outcome.contains("a run of the connection was going"));
        if !busy {
            return false;
        }
        last_finished_start
            .get(&job.connection_id)
            .is_some_and(|started| *started >= slot)
    };
    let skipped_served = slot_jobs.iter().filter(|job| served_later(job)).count();
    let missed: Vec<i64> = slot_jobs
        .iter()
        .filter(|job| job.status != JobStatus::Done && !served_later(job))
        .map(|job| job.id)
        .collect();
    let expected_jobs = usize::try_from(options.connections)
        .unwrap_or(usize::MAX)
        .saturating_mul(slots.len());
    let mut delays: Vec<f64> = slot_jobs
        .iter()
        .filter_map(|job| {
            let slot = job.slot_at?;
            let run = runs_named(job).first().and_then(|id| run_by_id.get(id))?;
            Some((run.started_at - slot).num_milliseconds() as f64 / 1000.0)
        })
        .collect();
    delays.sort_by(f64::total_cmp);
    let transactions_total =
        transactions_end.saturating_sub(transactions_at.first().copied().unwrap_or(0));
    let transactions_per_slot = transactions_total as f64 / slots.len().max(1) as f64;
    let first = slots.first().copied().unwrap_or_default();
    let watched_runs = runs.iter().filter(|run| run.started_at >= first).count();
    let transactions_per_run = transactions_total as f64 / watched_runs.max(1) as f64;
    let rerun_within = killed_when.and_then(|killed| {
        killed_jobs
            .iter()
            .filter_map(|id| jobs.iter().find(|job| job.id == *id))
            .filter_map(|job| match job.status {
                // Superseded: served by the connection's later run (its latest, at most).
                JobStatus::Skipped => last_finished_start.get(&job.connection_id).copied(),
                _ => job.started_at,
            })
            .map(|started| (started - killed).num_milliseconds() as f64 / 1000.0)
            .reduce(f64::max)
    });
    // The moment another daemon's claim took each killed job: its claim's start (a claim
    // that found the lease held puts the job back with `waiting:`, keeping that start), or,
    // for a job superseded by a later slot at that claim, the claim's end of it.
    let victim = daemons
        .iter()
        .find(|daemon| daemon.killed)
        .map(|daemon| daemon.child.id().to_string());
    let mut reclaimed: Vec<f64> = Vec::new();
    let mut not_reclaimed = 0usize;
    for job in killed_jobs
        .iter()
        .filter_map(|id| jobs.iter().find(|job| job.id == *id))
    {
        let elsewhere = job
            .holder
            .as_deref()
            .is_some_and(|holder| holder.split(':').nth(1) != victim.as_deref());
        let outcome = job.outcome.as_deref().unwrap_or_default();
        let at = match job.status {
            JobStatus::Skipped if outcome.contains("superseded") => job.finished_at,
            JobStatus::Queued if outcome.starts_with("waiting:") => job.started_at,
            JobStatus::Queued => None,
            _ if elsewhere => job.started_at,
            _ => None,
        };
        match (at, killed_when) {
            (Some(at), Some(killed)) if at >= killed => {
                reclaimed.push((at - killed).num_milliseconds() as f64 / 1000.0);
            }
            _ => not_reclaimed += 1,
        }
    }
    reclaimed.sort_by(f64::total_cmp);
    let reclaim_bound = (HEARTBEAT_LAPSE + ORPHANS_LOOK + CLAIM_POLL + RECLAIM_SLACK).as_secs_f64();
    // Put back once the killed daemon's heartbeat is stale, a job whose connection has a
    // later slot due by then is superseded by it at the claim: served when the connection
    // has a finished run that started after the kill.
    let killed_done = killed_jobs
        .iter()
        .filter_map(|id| jobs.iter().find(|job| job.id == *id))
        .filter(|job| job.status == JobStatus::Done || killed_superseded(job))
        .count();
    let mut checks = vec![
        Check::equal(
            "one job per slot of each connection",
            slot_jobs.len(),
            expected_jobs,
        ),
        Check::equal("runs named by two jobs", named_twice.len(), 0),
        Check::equal("runs named by no job", unnamed.len(), 0),
        Check::equal("slot jobs that ran twice", slot_jobs_twice.len(), 0),
        Check::equal("slot jobs not done", missed.len(), 0),
        Check::equal("slot runs that did not succeed", slot_runs_not_succeeded, 0),
        Check::equal("429 answers", emulator.rate_limited(), 0),
    ];
    if options.kill && options.daemons > 1 {
        checks.push(Check::equal(
            "the killed daemon's jobs done elsewhere",
            killed_done,
            killed_jobs.len(),
        ));
        checks.push(Check::equal(
            "the killed daemon's jobs not claimed again",
            not_reclaimed,
            0,
        ));
        let latest = reclaimed.last().copied().unwrap_or(0.0);
        checks.push(Check {
            name: format!(
                "the killed daemon's jobs claimed again within the heartbeat's lapse ({} s) \
                 + the look for them ({} s) + a claim poll ({} s) + {} s",
                HEARTBEAT_LAPSE.as_secs(),
                ORPHANS_LOOK.as_secs(),
                CLAIM_POLL.as_secs(),
                RECLAIM_SLACK.as_secs()
            ),
            passed: latest <= reclaim_bound,
            detail: format!("the latest after {latest:.1} s, at most {reclaim_bound:.0} s"),
        });
    }
    // Each daemon's statements from the first slot to its kill or stop.
    let statements: Vec<u64> = daemons
        .iter()
        .map(|daemon| daemon.statements_to.saturating_sub(daemon.statements_from))
        .collect();
    let statements_total: u64 = statements.iter().sum();
    let per_run = |seconds: f64| seconds * 1000.0 / runs.len().max(1) as f64;
    let daemons_cpu: f64 = cpu.processes.iter().take(daemons.len()).sum();
    let own_cpu = cpu.processes.get(daemons.len()).copied().unwrap_or(0.0);
    let cpu_ms_per_run = (
        per_run(daemons_cpu),
        per_run(cpu.postgres),
        per_run(own_cpu),
    );
    FleetReport {
        connections: options.connections,
        daemons: options.daemons,
        period_seconds: options.period,
        slots: options.slots,
        limit: format!("{} per {} s", options.limit, options.limit_window.as_secs()),
        slot_jobs: slot_jobs.len(),
        runs: runs.len(),
        runs_by_status,
        jobs_by_status,
        deferred_jobs: deferred.len(),
        skipped_served_later: skipped_served,
        requests: emulator
            .pages_served()
            .saturating_add(emulator.rate_limited()),
        answered_429: emulator.rate_limited(),
        delay_p50_seconds: percentile(&delays, 50.0),
        delay_p99_seconds: percentile(&delays, 99.0),
        transactions_per_slot,
        transactions_per_run,
        statements_per_slot: statements
            .iter()
            .map(|count| *count as f64 / slots.len().max(1) as f64)
            .collect(),
        statements_per_slot_total: statements_total as f64 / slots.len().max(1) as f64,
        statements_per_run: statements_total as f64 / watched_runs.max(1) as f64,
        peak_rss_mib: daemons
            .iter()
            .map(|daemon| daemon.peak_rss_kib as f64 / 1024.0)
            .collect(),
        cpu,
        cpu_ms_per_run,
        killed_jobs: killed_jobs.len(),
        killed_jobs_rerun_within_seconds: rerun_within,
        reclaimed_max_seconds: reclaimed.last().copied(),
        reclaimed_p50_seconds: (!reclaimed.is_empty()).then(|| percentile(&reclaimed, 50.0)),
        seconds: started.elapsed().as_secs_f64(),
        checks,
    }
}

/// The report as a two-column table.
pub fn table(report: &FleetReport) -> String {
    let mut table = comfy_table::Table::new();
    table.set_header(["fleet", "value"]);
    let rss: Vec<String> = report
        .peak_rss_mib
        .iter()
        .map(|mib| format!("{mib:.0}"))
        .collect();
    let rows = [
        (
            "connections x daemons",
            format!("{} x {}", report.connections, report.daemons),
        ),
        (
            "slots watched",
            format!("{} every {} s", report.slots, report.period_seconds),
        ),
        ("limit = budget", report.limit.clone()),
        ("slot jobs", report.slot_jobs.to_string()),
        ("jobs by status", format!("{:?}", report.jobs_by_status)),
        ("deferred by the budget", report.deferred_jobs.to_string()),
        (
            "skipped, served by a later run",
            report.skipped_served_later.to_string(),
        ),
        (
            "runs",
            format!("{} {:?}", report.runs, report.runs_by_status),
        ),
        (
            "requests / 429s",
            format!("{} / {}", report.requests, report.answered_429),
        ),
        (
            "slot to run start p50 / p99",
            format!(
                "{:.1} s / {:.1} s",
                report.delay_p50_seconds, report.delay_p99_seconds
            ),
        ),
        (
            "transactions per slot / per run",
            format!(
                "{:.0} / {:.1}",
                report.transactions_per_slot, report.transactions_per_run
            ),
        ),
        (
            "statements per slot: each daemon / all / per run",
            format!(
                "{} / {:.0} / {:.1}",
                report
                    .statements_per_slot
                    .iter()
                    .map(|count| format!("{count:.0}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                report.statements_per_slot_total,
                report.statements_per_run
            ),
        ),
        ("peak RSS per daemon (MiB)", rss.join(", ")),
        (
            "CPU s: daemons / PostgreSQL / bench / machine",
            format!(
                "{} / {:.0} / {:.0} / {:.0} busy of {:.0}",
                report
                    .cpu
                    .processes
                    .iter()
                    .take(report.daemons)
                    .map(|seconds| format!("{seconds:.0}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                report.cpu.postgres,
                report.cpu.processes.last().copied().unwrap_or(0.0),
                report.cpu.machine_busy,
                report.cpu.machine_total
            ),
        ),
        (
            "CPU ms a run: daemons / PostgreSQL / bench",
            format!(
                "{:.1} / {:.1} / {:.1}",
                report.cpu_ms_per_run.0, report.cpu_ms_per_run.1, report.cpu_ms_per_run.2
            ),
        ),
        (
            "killed daemon's jobs re-run within",
            match report.killed_jobs_rerun_within_seconds {
                Some(seconds) => format!("{} jobs, {seconds:.1} s", report.killed_jobs),
                None => format!("{} jobs", report.killed_jobs),
            },
        ),
        (
            "killed daemon's jobs claimed again after: max / p50",
            match (report.reclaimed_max_seconds, report.reclaimed_p50_seconds) {
                (Some(max), Some(p50)) => format!("{max:.1} s / {p50:.1} s"),
                _ => "-".to_string(),
            },
        ),
        ("wall time", format!("{:.0} s", report.seconds)),
    ];
    for (name, value) in rows {
        table.add_row([name.to_string(), value]);
    }
    table.to_string()
}
