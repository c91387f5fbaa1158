//! Schemathesis (`st`, from PyPI; `.ci/run` installs it) against a live daemon's API
//! and its own `/v1/openapi.json`: generated requests, the document's stateful links,
//! and the checks that no answer is a server error or strays from the document.

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::helpers::{backend, cursor_provider, mount_cursor_listing, spawn_app, Backend};
use crate::http::Served;

/// The version `.ci/run` installs.
const VERSION: &str = "4.32.5";
/// A fixed seed, so that a failure is repeated by running the test again.
const SEED: &str = "20261204";

#[tokio::test]
async fn schemathesis_finds_no_server_error_and_no_answer_outside_the_document() {
    // One run is enough: it tests the API, which is the same on every backend.
    if backend() != Backend::Sqlite {
        return;
    }
    let app = spawn_app().await;
    for user in ["alice", "bob"] {
        mount_cursor_listing(&app.api, user, &format!("{user}_"), 1, 2, Duration::ZERO).await;
    }
    let providers = cursor_provider("acme", &app.api.uri(), &["alice", "bob"]).replace(
        "schedule = \"0 */15 * * * *\"",
        "schedule = \"0 0 0 1 1 *\"",
    );
    let settings = app.settings(&providers).await;
    app.sync(&settings).await;
    // Its thousands of requests a minute stay under the key's rate limit: a 429 is
    // documented, but would cut the stateful phase's links short.
    let served = Served::start_with(&app, &providers, "daemon", |text| {
        text.replace(
            "max_body_bytes = 1024\n",
            "max_body_bytes = 1024\nrate_limit = \"1000000/minute\"\n",
        )
    })
    .await;
    let key = served.create_key(
        "schemathesis",
        &[
            "connections:read",
            "connections:write",
            "syncs:write",
            "records:read",
            "admin",
        ],
    );
    let report = report_dir();
    // A stale report from a run before must not pass for this one's.
    let _ = std::fs::remove_dir_all(&report);
    // Every check but `positive_data_acceptance`, which expects any request the document
    // allows to succeed: the document cannot say which providers, streams and cron
    // expressions the daemon's config accepts, nor which cursors its earlier answers gave.
    let excluded = "positive_data_acceptance";
    // A body over `max_body_bytes` is refused with 413, which schemathesis does not count
    // as a refusal by default.
    let config = app.dir.path().join("schemathesis.toml");
    std::fs::write(
        &config,
        "[checks.negative_data_rejection]\n\
         expected-statuses = [400, 401, 403, 404, 405, 406, 409, 413, 415, 422]\n",
    )
    .expect("schemathesis.toml written");
    let mut command = Command::new("st");
    command
        .arg("--config-file")
        .arg(&config)
        .args(["run", &format!("{}/v1/openapi.json", served.base)])
        .args(["--url", &served.base])
        .args(["--checks", "all", "--exclude-checks", excluded])
        .args(["--phases", "examples,coverage,fuzzing,stateful"])
        .args(["--mode", "all"])
        .args(["--seed", SEED])
        .args(["--max-examples", "100"])
        .args(["--workers", "1"])
        .args(["--request-timeout", "10"])
        .args(["--header", &format!("Authorization: Bearer {key}")])
        .args(["--report", "junit"])
        .arg("--report-dir")
        .arg(&report)
        .env("NO_COLOR", "1")
        .env("SCHEMATHESIS_TELEMETRY", "false")
        // Hypothesis keeps its examples database in the working directory otherwise.
        .current_dir(app.dir.path());
    let started = std::time::Instant::now();
    let output = command.output().unwrap_or_else(|error| {
        panic!(
            "schemathesis (`st`) could not be run: {error}. Install it with \
             pip install 'schemathesis=={VERSION}' (.ci/run does)"
        )
    });
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&report)
        .into_iter()
        .flatten()
        .flatten()
        .map(|file| file.path())
        .collect();
    // Schemathesis names the report by the time; one stable name is easier to find.
    let mut summary = summary_of(&stdout);
    if let [file] = files.as_mut_slice() {
        let stable = report.join("report.xml");
        if std::fs::rename(&file, &stable).is_ok() {
            summary = summary.replace(&file.display().to_string(), &stable.display().to_string());
            *file = stable;
        }
    }
    let junit = files
        .iter()
        .map(|file| std::fs::read_to_string(file).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n");
    // The seed, the summary and where the report is, in the test's output whether it
    // passes or not: libtest captures `println!` of a passing test, not stderr itself.
    let summary = format!(
        "schemathesis {VERSION}, seed {SEED}, {:.1?}: {}\n{}\nJUnit report: {:?}\n",
        started.elapsed(),
        junit_counts(&junit),
        summary,
        files
    );
    let _ = std::io::stderr().write_all(summary.as_bytes());
    assert!(
        output.status.success(),
        "schemathesis failed (seed {SEED}; exit {:?}):\n{stdout}\n{stderr}\nJUnit report:\n{junit}\nDaemon log (its end):\n{}",
        output.status.code(),
        tail(&served.daemon.log(), 200)
    );
}

/// Where the JUnit report is kept after the test: `schemathesis/` in the target
/// directory (`CARGO_TARGET_DIR`, or the one this binary was built in:
/// `target/debug/deps/api-…`), not in the test's folder, which is deleted.
fn report_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            let binary = std::env::current_exe().ok()?;
            Some(binary.ancestors().nth(3)?.to_path_buf())
        })
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
    target.join("schemathesis")
}

/// The JUnit report's test cases (one per operation, and one for the stateful phase),
/// and the failures and errors its `<testsuites>` counts.
fn junit_counts(junit: &str) -> String {
    let attribute = |name: &str| {
        let start = junit.find("<testsuites")?;
        let tag = &junit[start..];
        let tag = &tag[..tag.find('>')?];
        let value = tag.split(&format!(" {name}=\"")).nth(1)?;
        value.split('"').next().map(str::to_string)
    };
    let or_unknown = |value: Option<String>| value.unwrap_or_else(|| "?".into());
    format!(
        "JUnit: {} test cases, {} failures, {} errors",
        junit.matches("<testcase").count(),
        or_unknown(attribute("failures")),
        or_unknown(attribute("errors"))
    )
}

/// Schemathesis's own summary (operations, phases, checks, failures, test cases,
/// seed): its output from the `SUMMARY` rule on, or its last 40 lines.
fn summary_of(stdout: &str) -> String {
    match stdout.find(" SUMMARY ") {
        Some(at) => {
            let start = stdout[..at].rfind('\n').map_or(0, |line| line + 1);
            stdout[start..].trim_end().to_string()
        }
        None => tail(stdout, 40),
    }
}

/// The last `lines` lines of `text`.
fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
