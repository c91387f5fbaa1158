//! Memory stays proportional to the body, whatever its shape: `tributary sync` against a
//! loopback API whose one page is a body at the default size cap (32 MiB) of the worst
//! shapes we know keeps its peak RSS under [`PEAK_RSS_LIMIT_MIB`].
//!
//! The peak is the kernel's own count (`VmHWM` in `/proc/PID/status`), read from the
//! daemon after its first run finished and before it is stopped. No database backend is
//! involved beyond a SQLite file, so this is a test target of its own rather than part of
//! the `api` suite, which runs once per backend.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use sea_orm::{ColumnTrait, Database, EntityTrait, QueryFilter};
use tributary::entities::sync_run;
use tributary::entities::sync_run::RunStatus;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

/// The bound stated in docs/performance.md: one page of a body at the default caps.
const PEAK_RSS_LIMIT_MIB: i64 = 256;

/// The default `http.max_body_bytes`, less room for the shapes' ends.
const BODY_BYTES: usize = 32 * 1024 * 1024 - 256;

/// `head`, then `unit` repeated (without its last character, a separator) to fill the
/// body, then `tail`.
fn fill(head: &str, unit: &str, tail: &str) -> String {
    let count = (BODY_BYTES - head.len() - tail.len()) / unit.len();
    let mut body = String::with_capacity(BODY_BYTES);
    body.push_str(head);
    body.push_str(&unit.repeat(count));
    body.pop();
    body.push_str(tail);
    body
}

/// The shapes, each with what the run should end as.
fn shapes() -> Vec<(&'static str, String, RunStatus)> {
    let padding = "x".repeat(3_300);
    let at_the_cap: Vec<String> = (0..10_000)
        .map(|i| format!(r#"{{"id":"r{i}","p":"{padding}"}}"#))
        .collect();
    vec![
        (
            "millions of tiny items",
            fill(r#"{"next_cursor":null,"data":["#, "0,", "]}"),
            RunStatus::Failed,
        ),
        (
            "one record of millions of fields",
            fill(r#"{"next_cursor":null,"data":[{"#, r#""a":0,"#, "}]}"),
            RunStatus::Partial,
        ),
        (
            "millions of top-level fields",
            fill(r#"{"next_cursor":null,"#, r#""a":0,"#, r#","data":[]}"#),
            RunStatus::Succeeded,
        ),
        (
            "one record of the whole body",
            fill(
                r#"{"next_cursor":null,"data":[{"id":1,"p":""#,
                "xx",
                r#""}]}"#,
            ),
            RunStatus::Succeeded,
        ),
        (
            "the most records a page may hold",
            format!(
                r#"{{"next_cursor":null,"data":[{}]}}"#,
                at_the_cap.join(",")
            ),
            RunStatus::Succeeded,
        ),
    ]
}

fn config(database: &Path, api: &str) -> String {
    format!(
        r#"[database]
url = "sqlite://{}?mode=rwc"

[providers.acme]
kind = "rest"
base_url = "{api}"
path = "/v1/items"
schedule = "* * * * * *"
records_path = "data"
id_field = "id"
auth = "none"

[providers.acme.http]
max_retries = 0

[providers.acme.pagination]
type = "cursor"
cursor_path = "next_cursor"
cursor_param = "cursor"

[[providers.acme.connections]]
user_id = "alice"
"#,
        database.display()
    )
}

/// The first run of the daemon once it has finished (a first firing can take a while in
/// a debug build).
async fn first_finished_run(database: &Path) -> sync_run::Model {
    let url = format!("sqlite://{}?mode=ro", database.display());
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let Ok(db) = Database::connect(&url).await else {
            continue;
        };
        let finished = sync_run::Entity::find()
            .filter(sync_run::Column::Status.ne("running"))
            .one(&db)
            .await;
        if let Ok(Some(run)) = finished {
            return run;
        }
    }
    panic!("the daemon finished no run within two minutes");
}

/// The process's peak resident set (`VmHWM`), in KiB.
fn peak_rss_kib(pid: u32) -> i64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

#[tokio::test]
async fn one_page_at_the_body_cap_of_any_shape_stays_under_the_stated_peak_rss() {
    for (name, body, status) in shapes() {
        assert!(body.len() <= BODY_BYTES, "{name}");
        let api = MockServer::start().await;
        Mock::given(method("GET"))
            .and(path("/v1/items"))
            .respond_with(ResponseTemplate::new(200).set_body_raw(body, "application/json"))
            .mount(&api)
            .await;
        let dir = tempfile::tempdir().expect("temp dir");
        let config_path = dir.path().join("config.toml");
        let database = dir.path().join("tributary.db");
        std::fs::write(&config_path, config(&database, &api.uri())).expect("config");
        // The daemon stays alive after its run, so its peak can be read from /proc.
        let mut daemon = Command::new(env!("CARGO_BIN_EXE_tributary"))
            .arg("--config")
            .arg(&config_path)
            .arg("daemon")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("daemon started");
        let run = first_finished_run(&database).await;
        let peak_kib = peak_rss_kib(daemon.id());
        let pid = Pid::from_raw(i32::try_from(daemon.id()).expect("pid"));
        kill(pid, Signal::SIGTERM).expect("SIGTERM");
        daemon.wait().expect("daemon ended");
        assert_eq!(run.status, status, "{name}: {:?}", run.error);
        assert!(
            peak_kib < PEAK_RSS_LIMIT_MIB * 1024,
            "{name}: peak RSS {} MiB, over the stated {PEAK_RSS_LIMIT_MIB} MiB",
            peak_kib / 1024
        );
        eprintln!("{name}: peak RSS {} MiB", peak_kib / 1024);
    }
}
