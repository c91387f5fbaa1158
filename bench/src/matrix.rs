//! `tributary-bench --matrix`: the standard configurations, each run by a fresh copy of
//! this binary (`std::env::current_exe()`), because the peak RSS (VmHWM) is process-wide.

use std::process::ExitCode;

use anyhow::Context;
use serde::Serialize;

use super::repeats;
use super::report::{self, ScaleReport};
use super::{write_json, BenchArgs, BenchDatabase};

/// One configuration of the matrix.
struct Config {
    users: u32,
    records: u64,
    database: BenchDatabase,
    latency_ms: u64,
    concurrency: usize,
}

/// The standard matrix: 100k (10 x 10k) and 1M (100 x 10k) on each database, then 1M
/// with 20 ms per request and 64 connections at once.
fn configs(args: &BenchArgs) -> Vec<Config> {
    let mut configs = Vec::new();
    for database in [BenchDatabase::Sqlite, BenchDatabase::Postgres] {
        for users in [10, 100] {
            if users == 100 && args.no_1m {
                continue;
            }
            configs.push(Config {
                users,
                records: 10_000,
                database,
                latency_ms: 0,
                concurrency: args.concurrency,
            });
        }
    }
    if !args.no_1m {
        for database in [BenchDatabase::Sqlite, BenchDatabase::Postgres] {
            configs.push(Config {
                users: 100,
                records: 10_000,
                database,
                latency_ms: 20,
                concurrency: 64,
            });
        }
    }
    configs
}

/// The figures measured by others on a 2-core machine for 10 users x 10k Stripe-shaped
/// records (dlt 1.31), shown beside ours.
#[derive(Serialize)]
struct Reference {
    tool: &'static str,
    sqlite_first_per_sec: f64,
    sqlite_unchanged_per_sec: f64,
    postgres_first_per_sec: f64,
    postgres_unchanged_per_sec: f64,
    peak_rss_mb: &'static str,
}

const DLT: Reference = Reference {
    tool: "dlt 1.31",
    sqlite_first_per_sec: 6_700.0,
    sqlite_unchanged_per_sec: 81.0,
    postgres_first_per_sec: 4_500.0,
    postgres_unchanged_per_sec: 4_600.0,
    peak_rss_mb: "160-210",
};

#[derive(Serialize)]
struct MatrixReport {
    machine: Machine,
    reference: Reference,
    /// How many times each configuration ran (`--repeat`).
    repeat: u32,
    /// One report per configuration: the median of its runs when it ran more than once.
    runs: Vec<ScaleReport>,
    /// Every run, by configuration, when they ran more than once.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    every_run: Vec<Vec<ScaleReport>>,
}

#[derive(Serialize)]
struct Machine {
    cpus: usize,
    memory_bytes: Option<u64>,
}

fn mem_total() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|line| line.starts_with("MemTotal:"))?;
    let kib: u64 = line
        .trim_start_matches("MemTotal:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

pub async fn run(args: &BenchArgs) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("finding this program to run each configuration")?;
    let scratch = tempfile_dir()?;
    let configs = configs(args);
    let mut every_run: Vec<Vec<ScaleReport>> = configs.iter().map(|_| Vec::new()).collect();
    // Round after round, so that the machine's drift over time touches every
    // configuration alike.
    for round in 1..=args.repeat {
        if args.repeat > 1 {
            eprintln!("== round {round} of {}", args.repeat);
        }
        for (n, config) in configs.iter().enumerate() {
            let run = run_config(&exe, args, config, &scratch.join(format!("run-{n}.json")))?;
            every_run[n].push(run);
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    let runs: Vec<ScaleReport> = every_run
        .iter()
        .filter_map(|runs| repeats::median_report(runs))
        .collect();

    println!("{}", report::table(&runs));
    if args.repeat > 1 {
        println!("Medians of {} runs each; every run:", args.repeat);
        for runs in &every_run {
            println!("{}", repeats::ranges(runs));
        }
    }
    for note in report::latency_notes(&runs) {
        println!("{note}");
    }
    for note in report::tls_notes(&runs) {
        println!("{note}");
    }
    for line in scale_comparison(&runs) {
        println!("{line}");
    }
    let failed: Vec<String> = every_run
        .iter()
        .flatten()
        .flat_map(report::failures)
        .collect();
    for failure in &failed {
        eprintln!("check failed: {failure}");
    }
    if let Some(path) = &args.json {
        let report = MatrixReport {
            machine: Machine {
                cpus: std::thread::available_parallelism().map_or(0, usize::from),
                memory_bytes: mem_total(),
            },
            reference: DLT,
            repeat: args.repeat,
            runs,
            every_run: if args.repeat > 1 {
                every_run
            } else {
                Vec::new()
            },
        };
        write_json(path, &report)?;
    }
    Ok(if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Runs one configuration in a fresh copy of this binary and reads its results.
fn run_config(
    exe: &std::path::Path,
    args: &BenchArgs,
    config: &Config,
    json: &std::path::Path,
) -> anyhow::Result<ScaleReport> {
    let database = match config.database {
        BenchDatabase::Sqlite => "sqlite",
        BenchDatabase::Postgres => "postgres",
    };
    eprintln!(
        "== {} users x {} records on {database}, latency {} ms, concurrency {}",
        config.users, config.records, config.latency_ms, config.concurrency
    );
    // The parent waits for each child and does nothing else meanwhile.
    let status =
        std::process::Command::new(exe)
            .args(["--users", &config.users.to_string()])
            .args(["--records", &config.records.to_string()])
            .args(["--database", database])
            .args(["--latency-ms", &config.latency_ms.to_string()])
            .args(["--concurrency", &config.concurrency.to_string()])
            .args(["--seed", &args.seed.to_string()])
            .args(args.no_postgres_tls.then_some("--no-postgres-tls"))
            .args(args.provider_options.iter().flat_map(|(key, value)| {
                ["--provider-option".to_string(), format!("{key}={value}")]
            }))
            .arg("--json")
            .arg(json)
            .stdout(std::process::Stdio::null())
            .status()
            .context("running a benchmark configuration")?;
    let text = std::fs::read_to_string(json)
        .with_context(|| format!("the configuration's results ({status})"))?;
    Ok(serde_json::from_str(&text)?)
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("tributary-bench-matrix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// 1M against 100k on the same database (no latency): records/s and peak RSS ratios.
fn scale_comparison(runs: &[ScaleReport]) -> Vec<String> {
    let plain = |backend: &str, users: u32| {
        runs.iter()
            .find(|run| run.backend == backend && run.users == users && run.latency_ms == 0)
    };
    let mut lines = Vec::new();
    for backend in ["sqlite", "postgres"] {
        let (Some(small), Some(large)) = (plain(backend, 10), plain(backend, 100)) else {
            continue;
        };
        let speeds: Vec<String> = small
            .phases
            .iter()
            .zip(&large.phases)
            .map(|(s, l)| {
                format!(
                    "{} {:.0}%",
                    s.name,
                    100.0 * l.records_per_sec / s.records_per_sec.max(1e-9)
                )
            })
            .collect();
        let rss = match (small.peak_rss_bytes, large.peak_rss_bytes) {
            (Some(s), Some(l)) => format!("{:.0}%", 100.0 * l as f64 / s as f64),
            _ => "n/a".to_string(),
        };
        lines.push(format!(
            "{backend}: 1M records/s as a share of 100k: {}; peak RSS 1M/100k: {rss}",
            speeds.join(", ")
        ));
    }
    lines
}
