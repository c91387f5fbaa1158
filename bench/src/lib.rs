//! `tributary-bench`: throughput, memory and correctness at scale, through the library's
//! public API only.
//!
//! An in-process emulated Stripe ([`emulator`]) serves `users` x `records` charges, and the
//! real pipeline syncs them (`kind = "stripe"` pointed at the emulator, through
//! [`sync_matching`]) into a fresh database in three phases: the first sync (all new), a
//! second sync (all unchanged) and a sync after ~10 % of the charges changed. Every phase
//! is a full pass (`--full`): Stripe's incremental `created[gte]` would otherwise skip the
//! unchanged charges. After each phase [`verify`] checks the table. A fourth phase,
//! [`store_only`], stores as many new records with nothing fetched or parsed: the
//! database side alone, the ceiling of a first sync on the same machine in the same run.
//! [`matrix`] runs the standard configurations, each in a fresh process so each peak RSS
//! is its own.

pub mod api_phase;
pub mod cpu;
pub mod emulator;
pub mod fleet;
pub mod matrix;
pub mod repeats;
pub mod report;
pub mod retention;
pub mod store_only;
pub mod verify;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use sea_orm::ConnectionTrait;
use tokio_util::sync::CancellationToken;

use emulator::{Dataset, Emulator, TOKEN_PREFIX};
use report::{PhaseReport, ScaleReport};
use tributary::config::{redact_url, Settings};
use tributary::db::DatabasePools;
use tributary::entities::sync_run::{RunStatus, Trigger};
use tributary::pipeline::{NoProgress, RunOptions, RunOutcome};
use tributary::sync::{sync_matching, SyncFilter};
use verify::Check;

/// The provider name the benchmark's records are stored under.
pub const PROVIDER: &str = "bench";
/// The PostgreSQL server `--database postgres` creates its scratch database on.
pub const POSTGRES_URL_ENV: &str = "TRIBUTARY_BENCH_POSTGRES_URL";
const DEFAULT_POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432";

/// Which database a benchmark creates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchDatabase {
    /// A new SQLite file in a temporary folder, removed afterwards.
    Sqlite,
    /// A new database on the PostgreSQL server of `TRIBUTARY_BENCH_POSTGRES_URL`
    /// (default postgres://postgres@127.0.0.1:5432), dropped afterwards.
    Postgres,
}

/// Benchmark tributary: sync an emulated Stripe of USERS x RECORDS charges into a fresh
/// database (first sync, unchanged re-sync, 10 % changed, then as many new records stored
/// with nothing fetched), check the table, report records/s and peak RSS.
#[derive(Clone, Debug, clap::Parser)]
#[command(name = "tributary-bench", version, about)]
pub struct BenchArgs {
    /// Log filter (tracing's EnvFilter syntax). Defaults to "warn" (env RUST_LOG).
    #[arg(long, env = "RUST_LOG")]
    pub log: Option<String>,
    /// Connections (users) to sync.
    #[arg(long, default_value_t = 10)]
    pub users: u32,
    /// Charges per user.
    #[arg(long, default_value_t = 10_000)]
    pub records: u64,
    /// The database to create for the run.
    #[arg(long, value_enum, default_value_t = BenchDatabase::Sqlite)]
    pub database: BenchDatabase,
    /// Use this existing, empty database instead (it is kept afterwards).
    #[arg(long, conflicts_with = "database")]
    pub database_url: Option<String>,
    /// Delay of every emulated API answer, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub latency_ms: u64,
    /// Connections synced at once (the provider's max_concurrent_connections).
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Seed of the generated charges.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Run the standard matrix instead (100k and 1M records on SQLite and PostgreSQL,
    /// plus 1M with 20 ms latency), each configuration in a fresh process.
    #[arg(long)]
    pub matrix: bool,
    /// With --matrix: leave out the 1M-record configurations.
    #[arg(long, requires = "matrix")]
    pub no_1m: bool,
    /// With --matrix: run the whole matrix this many times, one round after another, and
    /// report each configuration's median (with the range of every run).
    #[arg(long, requires = "matrix", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub repeat: u32,
    /// With --database postgres: connect with `sslmode=disable` only. By default the run
    /// connects with sqlx's default `sslmode=prefer` (TLS when the server offers it), as a
    /// client of a production server would, and also times a first sync without TLS into
    /// a second scratch database, reporting the TLS/no-TLS ratio.
    #[arg(long)]
    pub no_postgres_tls: bool,
    /// A key of the provider's table, as TOML: `--provider-option track_deletes=true`.
    /// Repeatable; checked like any config.
    #[arg(long = "provider-option", value_name = "KEY=VALUE", value_parser = provider_option)]
    pub provider_options: Vec<(String, String)>,
    /// Run the retention scenario instead: seed this many old runs into a fresh database
    /// (--database) and sweep them while a writer commits pages.
    #[arg(long, value_name = "RUNS", conflicts_with = "matrix", value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub retention_runs: Option<u64>,
    /// With --retention-runs: the sweep's batch size.
    #[arg(long, requires = "retention_runs", default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub retention_batch: u64,
    /// Run the fleet scenario instead: several `tributary daemon` processes on one fresh
    /// PostgreSQL database sync `--fleet-connections` on a short schedule from an API
    /// with a global limit (and the provider's budget set to it); one is SIGKILLed
    /// halfway.
    #[arg(long, conflicts_with_all = ["matrix", "retention_runs"])]
    pub fleet: bool,
    /// With --fleet: connections.
    #[arg(long, requires = "fleet", default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub fleet_connections: u32,
    /// With --fleet: daemon processes.
    #[arg(long, requires = "fleet", default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=16))]
    pub fleet_daemons: u64,
    /// With --fleet: seconds between slots (divides 60).
    #[arg(long, requires = "fleet", default_value_t = 60)]
    pub fleet_period: u32,
    /// With --fleet: slots watched.
    #[arg(long, requires = "fleet", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=60))]
    pub fleet_slots: u32,
    /// With --fleet: the API's global limit and the budget, requests per 10 seconds.
    #[arg(long, requires = "fleet", default_value_t = 2_500, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub fleet_limit: u64,
    /// With --fleet: kill no daemon.
    #[arg(long, requires = "fleet")]
    pub fleet_no_kill: bool,
    /// With --fleet: the `tributary` binary (default: beside this one).
    #[arg(long, requires = "fleet")]
    pub fleet_binary: Option<PathBuf>,
}

/// `KEY=VALUE`, split at the first `=`.
fn provider_option(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.trim().is_empty() && !value.trim().is_empty() => {
            Ok((key.trim().to_string(), value.trim().to_string()))
        }
        _ => Err(format!(
            "expected KEY=VALUE, e.g. track_deletes=true; got {text:?}"
        )),
    }
}

/// What one configuration runs.
#[derive(Clone, Debug)]
pub struct ScaleOptions {
    pub users: u32,
    pub records_per_user: u64,
    /// A migrated-or-empty database without records of provider `bench`.
    pub database_url: String,
    pub latency: Duration,
    pub concurrency: usize,
    pub seed: u64,
    /// Extra keys of the provider's table, each `key = value` with the value as TOML.
    pub provider_options: Vec<(String, String)>,
}

/// Runs the benchmark `args` asks for.
pub async fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    if args.matrix {
        return matrix::run(&args).await;
    }
    if let Some(runs) = args.retention_runs {
        return run_retention_scenario(&args, runs).await;
    }
    if args.fleet {
        return run_fleet_scenario(&args).await;
    }
    anyhow::ensure!(args.users >= 1, "--users must be at least 1");
    anyhow::ensure!(args.records >= 1, "--records must be at least 1");
    anyhow::ensure!(args.concurrency >= 1, "--concurrency must be at least 1");
    let postgres_tls = !args.no_postgres_tls;
    let scratch_kind = args.database_url.is_none().then_some(args.database);
    let scratch = match &args.database_url {
        Some(url) => Scratch::Given(url.clone()),
        None => Scratch::create(args.database, postgres_tls).await?,
    };
    let options = ScaleOptions {
        users: args.users,
        records_per_user: args.records,
        database_url: scratch.url(),
        latency: Duration::from_millis(args.latency_ms),
        concurrency: args.concurrency,
        seed: args.seed,
        provider_options: args.provider_options.clone(),
    };
    let result = run_scale(&options).await;
    scratch.remove().await;
    let mut report = result?;
    let compare_tls = matches!(scratch_kind, Some(BenchDatabase::Postgres)) && postgres_tls;
    if compare_tls {
        report.postgres_tls = Some(first_sync_without_tls(&options, &report).await?);
    }
    println!("{}", report::table(std::slice::from_ref(&report)));
    for note in report::latency_notes(std::slice::from_ref(&report)) {
        println!("{note}");
    }
    for note in report::tls_notes(std::slice::from_ref(&report)) {
        println!("{note}");
    }
    for note in report::api_notes(std::slice::from_ref(&report)) {
        println!("{note}");
    }
    if let Some(path) = &args.json {
        write_json(path, &report)?;
    }
    let failures = report::failures(&report);
    for failure in &failures {
        eprintln!("check failed: {failure}");
    }
    Ok(if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The `--retention-runs` scenario in a scratch database, removed afterwards.
async fn run_retention_scenario(args: &BenchArgs, runs: u64) -> anyhow::Result<ExitCode> {
    let scratch = match &args.database_url {
        Some(url) => Scratch::Given(url.clone()),
        None => Scratch::create(args.database, false).await?,
    };
    let batch_size = usize::try_from(args.retention_batch)?;
    let result = retention::run_retention(&scratch.url(), runs, batch_size).await;
    scratch.remove().await;
    let report = result?;
    println!("{}", retention::table(&report));
    if let Some(path) = &args.json {
        write_json(path, &report)?;
    }
    Ok(verdict(&report.checks))
}

/// Prints each failed check; success only when none failed.
fn verdict(checks: &[Check]) -> ExitCode {
    let failed: Vec<&Check> = checks.iter().filter(|check| !check.passed).collect();
    for check in &failed {
        eprintln!("check failed: {}: {}", check.name, check.detail);
    }
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The `--fleet` scenario in a scratch PostgreSQL database, removed afterwards.
async fn run_fleet_scenario(args: &BenchArgs) -> anyhow::Result<ExitCode> {
    let scratch = match &args.database_url {
        Some(url) => Scratch::Given(url.clone()),
        None => {
            anyhow::ensure!(
                args.database == BenchDatabase::Postgres,
                "--fleet needs --database postgres (daemons share one server)"
            );
            Scratch::create(BenchDatabase::Postgres, false).await?
        }
    };
    let binary = match &args.fleet_binary {
        Some(path) => path.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("this binary's folder")?
            .join("tributary"),
    };
    let options = fleet::FleetOptions {
        database_url: scratch.url(),
        binary,
        connections: args.fleet_connections,
        daemons: usize::try_from(args.fleet_daemons)?,
        period: args.fleet_period,
        slots: args.fleet_slots,
        limit: args.fleet_limit,
        limit_window: Duration::from_secs(10),
        kill: !args.fleet_no_kill,
        concurrency: args.concurrency,
    };
    let result = fleet::run_fleet(&options).await;
    scratch.remove().await;
    let report = result?;
    println!("{}", fleet::table(&report));
    if let Some(path) = &args.json {
        write_json(path, &report)?;
    }
    Ok(verdict(&report.checks))
}

/// Times a first sync of the same dataset without TLS, into a scratch database of its
/// own on the same server, and compares it with `report`'s first sync over TLS. One run
/// measures both, so the machine's speed, which varies, cancels out of the ratio.
async fn first_sync_without_tls(
    options: &ScaleOptions,
    report: &ScaleReport,
) -> anyhow::Result<report::TlsComparison> {
    let tls_seconds = report
        .phases
        .iter()
        .find(|phase| phase.name == "first")
        .map(|phase| phase.seconds)
        .context("the run has no first sync")?;
    let scratch = Scratch::create(BenchDatabase::Postgres, false).await?;
    let plain = ScaleOptions {
        database_url: scratch.url(),
        ..options.clone()
    };
    let result = run_first_sync(&plain).await;
    scratch.remove().await;
    let first = result?;
    anyhow::ensure!(
        first.checks.iter().all(|check| check.passed),
        "the first sync without TLS failed its checks: {:?}",
        first.checks
    );
    eprintln!(
        "first without TLS: {} records in {:.2} s, {:.0} records/s",
        first.records, first.seconds, first.records_per_sec
    );
    Ok(report::TlsComparison::new(tls_seconds, first.seconds))
}

/// Writes `value` as pretty JSON to `path`.
pub fn write_json(path: &Path, value: &impl serde::Serialize) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}

/// The database a run uses, and whether it is ours to remove.
enum Scratch {
    Given(String),
    Sqlite {
        dir: PathBuf,
    },
    Postgres {
        server: String,
        name: String,
        tls: bool,
    },
}

impl Scratch {
    async fn create(database: BenchDatabase, postgres_tls: bool) -> anyhow::Result<Scratch> {
        let unique = format!(
            "{}_{}",
            std::process::id(),
            chrono::Utc::now().timestamp_subsec_nanos()
        );
        match database {
            BenchDatabase::Sqlite => {
                let dir = std::env::temp_dir().join(format!("tributary-bench-{unique}"));
                std::fs::create_dir_all(&dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
                Ok(Scratch::Sqlite { dir })
            }
            BenchDatabase::Postgres => {
                let server = std::env::var(POSTGRES_URL_ENV)
                    .unwrap_or_else(|_| DEFAULT_POSTGRES_URL.to_string());
                let server = server.trim_end_matches('/').to_string();
                let name = format!("tributary_bench_{unique}");
                let admin = sea_orm::Database::connect(format!("{server}/postgres"))
                    .await
                    .with_context(|| format!("connecting to {}", redact_url(&server)))?;
                admin
                    .execute_unprepared(&format!("CREATE DATABASE {name}"))
                    .await
                    .with_context(|| format!("creating database {name}"))?;
                admin.close().await?;
                Ok(Scratch::Postgres {
                    server,
                    name,
                    tls: postgres_tls,
                })
            }
        }
    }

    fn url(&self) -> String {
        match self {
            Scratch::Given(url) => url.clone(),
            Scratch::Sqlite { dir } => {
                format!("sqlite://{}?mode=rwc", dir.join("bench.db").display())
            }
            Scratch::Postgres { server, name, tls } => {
                let query = if *tls { "" } else { "?sslmode=disable" };
                format!("{server}/{name}{query}")
            }
        }
    }

    async fn remove(self) {
        match self {
            Scratch::Given(_) => {}
            Scratch::Sqlite { dir } => {
                if let Err(error) = std::fs::remove_dir_all(&dir) {
                    tracing::warn!(%error, dir = %dir.display(), "Removing the benchmark database failed.");
                }
            }
            Scratch::Postgres { server, name, .. } => {
                let dropped = async {
                    let admin = sea_orm::Database::connect(format!("{server}/postgres")).await?;
                    admin
                        .execute_unprepared(&format!("DROP DATABASE IF EXISTS {name}"))
                        .await?;
                    admin.close().await
                };
                if let Err(error) = dropped.await {
                    tracing::warn!(%error, name, "Dropping the benchmark database failed.");
                }
            }
        }
    }
}

/// The benchmark's config: one `stripe` provider on the emulator, one connection per user.
fn bench_config(options: &ScaleOptions, base_url: &str) -> String {
    let pages_per_user = options.records_per_user.div_ceil(100) + 10;
    let mut text = format!(
        r#"[database]
url = {url}
max_connections = {pool}

[providers.{PROVIDER}]
kind = "stripe"
base_url = "{base_url}"
schedule = "0 0 0 * * *"
max_concurrent_connections = {concurrency}
max_pages = {pages_per_user}
run_timeout = "24h"
"#,
        url = toml::Value::String(options.database_url.clone()),
        pool = (options.concurrency + 2).clamp(4, 32),
        concurrency = options.concurrency,
    );
    for (key, value) in &options.provider_options {
        text.push_str(&format!("{key} = {value}\n"));
    }
    for user in 1..=options.users {
        text.push_str(&format!(
            "\n[[providers.{PROVIDER}.connections]]\nuser_id = \"user{user:05}\"\ntoken = \"{TOKEN_PREFIX}{user}\"\n"
        ));
    }
    text
}

/// Runs the three sync phases of one configuration and then `store_only`, and checks the
/// table after each.
pub async fn run_scale(options: &ScaleOptions) -> anyhow::Result<ScaleReport> {
    run_phases(options, true).await
}

/// Runs only the first sync of one configuration, checked like any.
pub async fn run_first_sync(options: &ScaleOptions) -> anyhow::Result<PhaseReport> {
    let report = run_phases(options, false).await?;
    report
        .phases
        .into_iter()
        .next()
        .context("the first sync reported nothing")
}

/// The first sync, and with `all` the other phases too.
async fn run_phases(options: &ScaleOptions, all: bool) -> anyhow::Result<ScaleReport> {
    let dataset = Dataset {
        users: options.users,
        records_per_user: options.records_per_user,
        seed: options.seed,
    };
    let emulator = Emulator::start(dataset, options.latency)
        .await
        .context("starting the emulated API on 127.0.0.1")?;
    let settings = Settings::parse(
        Path::new("(bench config)"),
        &bench_config(options, &emulator.base_url()),
        None,
        &|_| true,
    )?;
    // A fresh database that only this run reads: a key of its own seals the tokens.
    let keyring = tributary::secrets::Keyring::ephemeral();
    let access = tributary::app::Access::Work {
        command: "bench",
        older: tributary::db::OlderInstances::Refuse,
    };
    let app = tributary::app::App::open_with_keyring(settings, access, keyring).await?;
    let (db, settings) = (app.db().clone(), app.settings());
    let before = verify::fingerprint(&db, PROVIDER).await?;
    anyhow::ensure!(
        before.rows == 0,
        "the database already holds {} records of provider {PROVIDER:?}; use an empty one",
        before.rows
    );

    let total = u64::from(options.users) * options.records_per_user;
    let changed = dataset.changed_total();
    let mut phases = Vec::new();
    let syncs: &[(&str, u32)] = match all {
        true => &[("first", 0), ("unchanged", 0), ("changed_10pct", 1)],
        false => &[("first", 0)],
    };
    for &(name, generation) in syncs {
        emulator.set_generation(generation);
        let phase = run_phase(&db, settings, &emulator, options, name, total, changed).await?;
        eprintln!(
            "{name}: {} records in {:.2} s, {:.0} records/s",
            phase.records, phase.seconds, phase.records_per_sec
        );
        phases.push(phase);
    }
    if all {
        let config = bench_config(options, &emulator.base_url());
        phases.extend(api_phase::run_api_phase(&db, &config, total).await?);
        let phase = store_only::run_store_only(&db, &dataset, options.concurrency).await?;
        eprintln!(
            "store_only: {} records in {:.2} s, {:.0} records/s (the database side alone)",
            phase.records, phase.seconds, phase.records_per_sec
        );
        phases.push(phase);
    }
    app.close().await;
    db.close().await?;
    let checks_passed = phases
        .iter()
        .all(|phase| phase.checks.iter().all(|check| check.passed));
    Ok(ScaleReport {
        users: options.users,
        records_per_user: options.records_per_user,
        total_records: total,
        backend: backend_of(&options.database_url).to_string(),
        database: redact_url(&options.database_url),
        concurrency: options.concurrency,
        latency_ms: u64::try_from(options.latency.as_millis()).unwrap_or(u64::MAX),
        seed: options.seed,
        phases,
        peak_rss_bytes: report::peak_rss(),
        checks_passed,
        postgres_tls: None,
    })
}

fn backend_of(url: &str) -> &'static str {
    if url.starts_with("sqlite:") {
        "sqlite"
    } else if url.starts_with("postgres") {
        "postgres"
    } else if url.starts_with("mysql") || url.starts_with("mariadb") {
        "mysql"
    } else {
        "unknown"
    }
}

async fn run_phase(
    db: &DatabasePools,
    settings: &Settings,
    emulator: &Emulator,
    options: &ScaleOptions,
    name: &str,
    total: u64,
    changed: u64,
) -> anyhow::Result<PhaseReport> {
    let unchanged_phase = name == "unchanged";
    let before = verify::fingerprint(db, PROVIDER).await?;
    if unchanged_phase {
        verify::install_write_counter(db).await?;
    }
    let run_options = RunOptions {
        trigger: Trigger::Manual,
        full: true,
        cancel: CancellationToken::new(),
        stream: None,
        lease: None,
        yield_after: None,
    };
    let filter = SyncFilter {
        provider: Some(PROVIDER.to_string()),
        user_id: None,
        stream: None,
    };
    let pages_before = emulator.pages_served();
    let started = Instant::now();
    let sync = sync_matching(db, settings, &filter, &run_options, &NoProgress).await;
    let seconds = started.elapsed().as_secs_f64();
    let pages = emulator.pages_served() - pages_before;
    let written = if unchanged_phase {
        let counted = verify::writes_counted(db).await;
        verify::remove_write_counter(db).await?;
        Some(counted?)
    } else {
        None
    };
    let report = sync?;
    let outcomes = &report.outcomes;
    let sum = |field: fn(&RunOutcome) -> u64| outcomes.iter().map(field).sum::<u64>();
    let (inserted, updated, unchanged) = (
        sum(|o| o.counts.inserted),
        sum(|o| o.counts.updated),
        sum(|o| o.counts.unchanged),
    );
    let failed = sum(|o| o.counts.failed);
    let after = verify::fingerprint(db, PROVIDER).await?;

    let succeeded = outcomes
        .iter()
        .filter(|o| o.status == RunStatus::Succeeded)
        .count();
    let mut checks = vec![
        Check::equal("runs succeeded", succeeded, options.users as usize),
        Check::equal("records fetched", sum(|o| o.counts.fetched), total),
        Check::equal("records failed", failed, 0),
        Check::equal("rows in records", after.rows, total as i64),
        Check::equal("duplicate keys", verify::duplicate_keys(db).await?, 0),
    ];
    match name {
        "first" => checks.push(Check::equal("inserted", inserted, total)),
        "unchanged" => {
            checks.push(Check::equal(
                "inserted/updated/unchanged",
                (inserted, updated, unchanged),
                (0, 0, total),
            ));
            checks.push(Check::equal("rows written (triggers)", written, Some(0)));
            checks.push(Check::equal("table fingerprint", after, before));
        }
        _ => {
            checks.push(Check::equal(
                "inserted/updated/unchanged",
                (inserted, updated, unchanged),
                (0, changed, total - changed),
            ));
            let first_run = outcomes.iter().map(|o| o.run_id).min().unwrap_or(i64::MAX);
            let rewritten = verify::rows_written_since(db, PROVIDER, first_run).await?;
            checks.push(Check::equal("rows rewritten", rewritten, changed as i64));
        }
    }
    let latency = options.latency.as_secs_f64();
    Ok(PhaseReport {
        name: name.to_string(),
        seconds,
        records: total,
        records_per_sec: total as f64 / seconds.max(1e-9),
        pages,
        inserted,
        updated,
        unchanged,
        failed,
        records_rows_written: written,
        sequential_latency_seconds: pages as f64 * latency,
        latency_floor_seconds: pages as f64 * latency / options.concurrency as f64,
        peak_rss_bytes: report::peak_rss(),
        checks,
    })
}
