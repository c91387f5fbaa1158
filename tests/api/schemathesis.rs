//! Schemathesis (`st`, from PyPI; `.ci/run` installs it) against a live daemon's API
//! and its own `/v1/openapi.json`: generated requests, the document's stateful links,
//! and the checks that no answer is a server error or strays from the document.

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
    let report = app.dir.path().join("schemathesis-report");
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
    let junit = std::fs::read_dir(&report)
        .into_iter()
        .flatten()
        .flatten()
        .map(|file| std::fs::read_to_string(file.path()).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n");
    // The seed and the report in the test's output, whether it passes or not.
    println!(
        "schemathesis {VERSION}, seed {SEED}, {:?}:\n{stdout}\n{stderr}",
        started.elapsed()
    );
    assert!(
        output.status.success(),
        "schemathesis failed (seed {SEED}; exit {:?}):\n{stdout}\n{stderr}\nJUnit report:\n{junit}\nDaemon log (its end):\n{}",
        output.status.code(),
        tail(&served.daemon.log(), 200)
    );
}

/// The last `lines` lines of `text`.
fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
