//! `tributary connections`: add, list, disable and remove connections besides config.toml.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::json;
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, ResponseTemplate};

use crate::helpers::{cursor_provider, items, spawn_app};

struct Output {
    code: i32,
    stdout: String,
    stderr: String,
}

fn tributary(config: &std::path::Path, args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(assert_cmd::cargo::cargo_bin("tributary"))
        .arg("--config")
        .arg(config)
        .args(args)
        .env_remove("TRIBUTARY_DATABASE_URL")
        .env_remove("TRIBUTARY_SECRETS_KEY")
        .env_remove("CREDENTIALS_DIRECTORY")
        .env("BOB_TOKEN_FOR_TEST", "token-bob")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tributary starts");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    let output = child.wait_with_output().expect("tributary runs");
    Output {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// One page of `count` items per user, answered only with that user's token.
async fn mount_listings(app: &crate::helpers::TestApp, users: &[&str], count: usize) {
    for user in users {
        Mock::given(method("GET"))
            .and(path("/v1/items"))
            .and(header(
                "authorization",
                format!("Bearer token-{user}").as_str(),
            ))
            .respond_with(
                ResponseTemplate::new(200).set_body_json(
                    json!({"data": items("c", user, 0..count), "next_cursor": null}),
                ),
            )
            .mount(&app.api)
            .await;
    }
}

#[tokio::test]
async fn connections_added_on_the_command_line_sync_and_can_be_disabled_and_removed() {
    let app = spawn_app().await;
    mount_listings(&app, &["alice", "bob", "carol"], 3).await;
    let config = app.write_config(&cursor_provider("acme", &app.api.uri(), &["alice"]));
    let add = |args: &[&str], stdin: &str| {
        let mut all = vec!["connections", "add", "--provider", "acme"];
        all.extend_from_slice(args);
        tributary(&config, &all, stdin)
    };

    let bob = add(&["--user", "bob", "--token-env", "BOB_TOKEN_FOR_TEST"], "");
    assert_eq!(bob.code, 0, "{}", bob.stderr);
    let carol = add(&["--user", "carol", "--token-stdin"], "token-carol\n");
    assert_eq!(carol.code, 0, "{}", carol.stderr);
    let again = add(&["--user", "carol", "--token-stdin"], "token-carol\n");
    assert_ne!(again.code, 0);
    assert!(
        again.stderr.contains("carol@acme already exists"),
        "{}",
        again.stderr
    );
    let config_defined = add(&["--user", "alice", "--token-stdin"], "x\n");
    assert_ne!(config_defined.code, 0);
    assert!(
        config_defined.stderr.contains("is defined in"),
        "{}",
        config_defined.stderr
    );
    let no_token = add(&["--user", "dave"], "");
    assert!(
        no_token.stderr.contains("needs a token"),
        "{}",
        no_token.stderr
    );
    let unknown = tributary(
        &config,
        &["connections", "add", "--provider", "nope", "--user", "x"],
        "",
    );
    assert!(
        unknown.stderr.contains("no provider named \"nope\""),
        "{}",
        unknown.stderr
    );

    let sync = tributary(&config, &["sync", "--quiet"], "");
    assert_eq!(sync.code, 0, "{}", sync.stderr);
    assert_eq!(sync.stdout.lines().count(), 3, "{}", sync.stdout);
    assert_eq!(app.records().await.len(), 9);

    // Connections of config.toml are stored by the first command that syncs.
    let list = tributary(&config, &["connections", "list", "--json"], "");
    assert_eq!(list.code, 0, "{}", list.stderr);
    assert!(!list.stdout.contains("token-carol"), "secrets never listed");
    let listed: serde_json::Value = serde_json::from_str(&list.stdout).unwrap();
    let summary: Vec<(String, String, bool)> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["user_id"].as_str().unwrap().to_string(),
                c["defined_in"].as_str().unwrap().to_string(),
                c["enabled"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("alice".to_string(), "config".to_string(), true),
            ("bob".to_string(), "cli".to_string(), true),
            ("carol".to_string(), "cli".to_string(), true),
        ]
    );
    assert_eq!(listed[1]["credentials"], "token from $BOB_TOKEN_FOR_TEST");
    let carol = listed[2]["credentials"].as_str().unwrap();
    assert!(
        carol.starts_with("token stored; sealed with key "),
        "{carol}"
    );

    // `connections disable` or `enable` of bob@acme.
    let switch = |verb: &str| {
        let args = ["connections", verb, "--provider", "acme", "--user", "bob"];
        tributary(&config, &args, "")
    };
    let disable = switch("disable");
    assert_eq!(disable.code, 0, "{}", disable.stderr);
    let sync = tributary(&config, &["sync", "--quiet"], "");
    assert!(!sync.stdout.contains("bob@acme"), "{}", sync.stdout);
    assert_eq!(sync.stdout.lines().count(), 2);

    let enable = switch("enable");
    assert_eq!(enable.code, 0, "{}", enable.stderr);
    let sync = tributary(&config, &["sync", "--quiet"], "");
    assert_eq!(sync.code, 0, "{}", sync.stderr);
    assert!(sync.stdout.contains("bob@acme"), "{}", sync.stdout);
    assert_eq!(sync.stdout.lines().count(), 3, "{}", sync.stdout);
    let bob_runs = tributary(&config, &["runs", "--user", "bob", "--json"], "");
    let bob_runs: serde_json::Value = serde_json::from_str(&bob_runs.stdout).expect("JSON");
    assert_eq!(
        bob_runs.as_array().map(Vec::len),
        Some(2),
        "bob ran before the disable and after the enable: {bob_runs}"
    );

    let remove = tributary(
        &config,
        &[
            "connections",
            "remove",
            "--provider",
            "acme",
            "--user",
            "carol",
            "--delete-records",
        ],
        "",
    );
    assert_eq!(remove.code, 0, "{}", remove.stderr);
    assert!(
        remove.stdout.contains("and its 3 record(s)"),
        "{}",
        remove.stdout
    );
    let records = app.records().await;
    assert_eq!(records.len(), 6);
    assert!(records.iter().all(|r| r.user_id != "carol"));
    let refused = tributary(
        &config,
        &[
            "connections",
            "disable",
            "--provider",
            "acme",
            "--user",
            "alice",
        ],
        "",
    );
    assert_ne!(refused.code, 0);
    assert!(
        refused.stderr.contains("change it there"),
        "{}",
        refused.stderr
    );
}

#[tokio::test]
async fn a_connection_taken_out_of_the_config_is_disabled_its_records_kept() {
    let app = spawn_app().await;
    mount_listings(&app, &["alice", "bob", "carol"], 2).await;
    let both = cursor_provider("acme", &app.api.uri(), &["alice", "bob"]);
    let config = app.write_config(&both);
    let carol = tributary(
        &config,
        &[
            "connections",
            "add",
            "--provider",
            "acme",
            "--user",
            "carol",
            "--token-stdin",
        ],
        "token-carol\n",
    );
    assert_eq!(carol.code, 0, "{}", carol.stderr);
    let first = tributary(&config, &["sync", "--quiet"], "");
    assert_eq!(first.code, 0, "{}", first.stderr);
    assert_eq!(app.records().await.len(), 6);

    // bob is taken out of the file; a read-only command changes nothing yet.
    let config = app.write_config(&cursor_provider("acme", &app.api.uri(), &["alice"]));
    let listed = tributary(&config, &["connections", "list", "--json"], "");
    assert_eq!(listed.code, 0, "{}", listed.stderr);
    let second = tributary(&config, &["sync", "--quiet"], "");
    assert_eq!(second.code, 0, "{}", second.stderr);
    assert!(
        second.stderr.contains("no longer lists was disabled"),
        "{}",
        second.stderr
    );

    let listed = tributary(&config, &["connections", "list", "--json"], "");
    let rows: serde_json::Value = serde_json::from_str(&listed.stdout).expect("JSON");
    let by_user = |user: &str| {
        rows.as_array()
            .and_then(|rows| rows.iter().find(|row| row["user_id"] == user))
            .cloned()
            .unwrap_or_else(|| panic!("{user} listed: {rows}"))
    };
    let bob = by_user("bob");
    assert_eq!(bob["defined_in"], "removed", "{bob}");
    assert_eq!(bob["enabled"], false, "{bob}");
    assert_eq!(bob["credentials"], "no token", "{bob}");
    assert_eq!(by_user("alice")["defined_in"], "config");
    let carol = by_user("carol");
    assert_eq!(
        (carol["defined_in"].clone(), carol["enabled"].clone()),
        (json!("cli"), json!(true))
    );
    // Records are kept, and bob's token was used by the first sync only.
    assert_eq!(app.records().await.len(), 6);
    let bob_requests = app
        .api
        .received_requests()
        .await
        .unwrap_or_default()
        .iter()
        .filter(|r| {
            r.headers
                .get("authorization")
                .is_some_and(|v| v == "Bearer token-bob")
        })
        .count();
    assert_eq!(bob_requests, 1);
}

#[tokio::test]
async fn runs_are_listed_by_user_and_by_provider() {
    let app = spawn_app().await;
    mount_listings(&app, &["alice", "bob"], 1).await;
    let config = app.write_config(&format!(
        "{}{}",
        cursor_provider("acme", &app.api.uri(), &["alice", "bob"]),
        cursor_provider("zeta", &app.api.uri(), &["alice"])
    ));
    let sync = tributary(&config, &["sync", "--quiet"], "");
    assert_eq!(sync.code, 0, "{}", sync.stderr);
    let runs = |args: &[&str]| -> Vec<(String, String)> {
        let mut all = vec!["runs", "--json"];
        all.extend_from_slice(args);
        let output = tributary(&config, &all, "");
        assert_eq!(output.code, 0, "{args:?}: {}", output.stderr);
        let rows: serde_json::Value = serde_json::from_str(&output.stdout).expect("JSON");
        let mut listed: Vec<(String, String)> = rows
            .as_array()
            .expect("an array of runs")
            .iter()
            .map(|run| {
                let field = |name: &str| run[name].as_str().unwrap_or_default().to_string();
                (field("user_id"), field("provider"))
            })
            .collect();
        listed.sort();
        listed
    };
    let pair = |user: &str, provider: &str| (user.to_string(), provider.to_string());
    assert_eq!(runs(&[]).len(), 3);
    assert_eq!(runs(&["--user", "bob"]), [pair("bob", "acme")]);
    assert_eq!(runs(&["--provider", "zeta"]), [pair("alice", "zeta")]);
    assert_eq!(
        runs(&["--provider", "acme"]),
        [pair("alice", "acme"), pair("bob", "acme")]
    );
    assert_eq!(
        runs(&["--user", "alice", "--provider", "acme"]),
        [pair("alice", "acme")]
    );
    assert!(runs(&["--user", "nobody"]).is_empty());
}

#[tokio::test]
async fn lists_come_a_page_at_a_time_in_a_stable_order() {
    let app = spawn_app().await;
    let users = ["ann", "ben", "cat", "dan", "eve"];
    mount_listings(&app, &users, 1).await;
    let config = app.write_config(&cursor_provider("acme", &app.api.uri(), &users));
    let sync = tributary(&config, &["sync", "--quiet"], "");
    assert_eq!(sync.code, 0, "{}", sync.stderr);

    // Connections by user, two at a time, each page pointing at the next.
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..users.len() {
        let mut args = vec!["connections", "list", "--limit", "2", "--json"];
        if let Some(after) = &after {
            args.extend(["--after", after.as_str()]);
        }
        let page = tributary(&config, &args, "");
        assert_eq!(page.code, 0, "{}", page.stderr);
        let rows: serde_json::Value = serde_json::from_str(&page.stdout).expect("JSON");
        let rows = rows.as_array().expect("an array");
        assert!(rows.len() <= 2, "{rows:?}");
        seen.extend(
            rows.iter()
                .map(|row| row["user_id"].as_str().unwrap_or("").to_string()),
        );
        let table = {
            let mut args = vec!["connections", "list", "--limit", "2"];
            if let Some(after) = &after {
                args.extend(["--after", after.as_str()]);
            }
            tributary(&config, &args, "")
        };
        match table.stdout.split("add --after ").nth(1) {
            Some(rest) => {
                let next: String = rest.chars().take_while(char::is_ascii_digit).collect();
                assert_eq!(
                    rows.last().map(|row| row["id"].to_string()),
                    Some(next.clone())
                );
                after = Some(next);
            }
            None => break,
        }
    }
    assert_eq!(seen, users, "every connection once, in order");

    // Runs, newest first, one at a time.
    let first = tributary(&config, &["runs", "--limit", "2"], "");
    assert_eq!(first.code, 0, "{}", first.stderr);
    let before: String = first
        .stdout
        .split("add --before ")
        .nth(1)
        .expect("a next page")
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    let rest = tributary(
        &config,
        &["runs", "--before", &before, "--json", "--limit", "1000"],
        "",
    );
    let rest: serde_json::Value = serde_json::from_str(&rest.stdout).expect("JSON");
    let ids: Vec<i64> = rest
        .as_array()
        .expect("an array")
        .iter()
        .filter_map(|run| run["id"].as_i64())
        .collect();
    let before: i64 = before.parse().expect("an id");
    assert_eq!(ids.len(), users.len() - 2);
    assert!(ids.iter().all(|id| *id < before), "{ids:?} before {before}");
    let refused = tributary(&config, &["runs", "--limit", "0"], "");
    assert_ne!(refused.code, 0);
    assert!(refused.stderr.contains("--limit"), "{}", refused.stderr);
}
