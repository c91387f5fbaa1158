//! The `tributary` binary: exit codes, messages, JSON output, bad configs and the demo.

use serde_json::json;
use wiremock::matchers::{method, path};
use wiremock::{Mock, ResponseTemplate};

use crate::helpers::{cursor_provider, items, run, spawn_app, tributary, TestApp};

async fn mount_listing(app: &TestApp) {
    let mut data = items("c", "alice", 0..4);
    data.push(json!({"no_id": "poison"}));
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({"data": data, "next_cursor": null})),
        )
        .mount(&app.api)
        .await;
}

#[tokio::test]
async fn sync_prints_a_line_per_run_and_runs_and_errors_show_the_history() {
    let app = spawn_app().await;
    mount_listing(&app).await;
    let config = app.write_config(&cursor_provider("acme", &app.api.uri(), &["alice"]));

    let sync = run(tributary(&config).args(["sync", "--quiet"]));
    assert_eq!(sync.code, 0, "{}", sync.stderr);
    assert!(
        sync.stdout.contains("alice@acme partial"),
        "{}",
        sync.stdout
    );
    assert!(sync.stdout.contains("inserted=4") && sync.stdout.contains("failed=1"));

    let again = run(tributary(&config).args(["sync", "--json"]));
    assert_eq!(again.code, 0, "{}", again.stderr);
    let outcomes: serde_json::Value = serde_json::from_str(&again.stdout).unwrap();
    assert_eq!(outcomes["runs"][0]["counts"]["inserted"], 0);
    assert_eq!(outcomes["runs"][0]["counts"]["unchanged"], 4);
    assert_eq!(outcomes["skipped"], json!([]));

    let runs = run(tributary(&config).args(["runs", "--json"]));
    assert_eq!(runs.code, 0, "{}", runs.stderr);
    let runs: serde_json::Value = serde_json::from_str(&runs.stdout).unwrap();
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0]["records_inserted"], 0, "newest first");
    assert_eq!(runs[1]["records_inserted"], 4);
    assert_eq!(runs[1]["status"], "partial");
    let first_run = runs[1]["id"].as_i64().unwrap();

    let table = run(tributary(&config).args(["runs"]));
    assert_eq!(table.code, 0);
    assert!(table.stdout.contains("partial") && table.stdout.contains("acme"));

    let errors = run(tributary(&config).args(["errors", &first_run.to_string(), "--json"]));
    assert_eq!(errors.code, 0, "{}", errors.stderr);
    let errors: serde_json::Value = serde_json::from_str(&errors.stdout).unwrap();
    assert_eq!(errors.as_array().unwrap().len(), 1);
    assert_eq!(errors[0]["stage"], "validate");
    assert_eq!(errors[0]["payload"], r#"{"no_id":"poison"}"#);

    let missing = run(tributary(&config).args(["errors", "999"]));
    assert_ne!(missing.code, 0);
    assert!(
        missing.stderr.contains("no run with id 999"),
        "{}",
        missing.stderr
    );

    for output in [&sync, &again] {
        assert!(!output.stdout.contains("token-alice") && !output.stderr.contains("token-alice"));
    }
}

#[tokio::test]
async fn runs_fits_120_columns_by_default_and_shows_every_column_when_wide() {
    let app = spawn_app().await;
    mount_listing(&app).await;
    let config = app.write_config(&cursor_provider("helpdesk", &app.api.uri(), &["alice"]));
    for _ in 0..2 {
        let sync = run(tributary(&config).args(["sync", "--quiet"]));
        assert_eq!(sync.code, 0, "{}", sync.stderr);
    }
    let width = |table: &str| table.lines().map(|line| line.chars().count()).max();

    let compact = run(tributary(&config).args(["runs"]));
    assert_eq!(compact.code, 0, "{}", compact.stderr);
    let table = compact.stdout;
    assert!(width(&table).is_some_and(|width| width <= 120), "{table}");
    for column in [
        "id",
        "user",
        "provider/stream",
        "trigger",
        "status",
        "started (UTC)",
    ] {
        assert!(table.contains(column), "{column}: {table}");
    }
    for column in ["secs", "inserted", "updated", "failed", "partial", "alice"] {
        assert!(table.contains(column), "{column}: {table}");
    }
    assert!(!table.contains("parents skipped"), "{table}");

    let wide = run(tributary(&config).args(["runs", "--wide"]));
    assert_eq!(wide.code, 0, "{}", wide.stderr);
    let table = wide.stdout;
    for column in [
        "pages",
        "fetched",
        "unchanged",
        "dup",
        "parents skipped",
        "ahead",
        "error",
    ] {
        assert!(table.contains(column), "{column}: {table}");
    }
    assert!(width(&table).is_some_and(|width| width > 120), "{table}");
}

#[tokio::test]
async fn log_lines_written_to_a_pipe_carry_no_colour_codes() {
    let app = spawn_app().await;
    mount_listing(&app).await;
    let config = app.write_config(&cursor_provider("acme", &app.api.uri(), &["alice"]));
    for no_color in [None, Some("1")] {
        let mut command = tributary(&config);
        command.args(["--log", "info", "sync", "--quiet"]);
        match no_color {
            Some(value) => command.env("NO_COLOR", value),
            None => command.env_remove("NO_COLOR"),
        };
        let sync = run(&mut command);
        assert_eq!(sync.code, 0, "{}", sync.stderr);
        assert!(sync.stderr.contains("INFO"), "{}", sync.stderr);
        assert!(
            !sync.stderr.contains('\u{1b}'),
            "NO_COLOR {no_color:?}: {:?}",
            sync.stderr
        );
    }
}

#[tokio::test]
async fn sync_exits_non_zero_when_a_run_fails() {
    let app = spawn_app().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(401))
        .mount(&app.api)
        .await;
    let config = app.write_config(&cursor_provider("acme", &app.api.uri(), &["alice"]));
    let sync = run(tributary(&config).args(["--log", "trace", "sync", "--quiet"]));
    assert_eq!(sync.code, 1);
    assert!(
        sync.stderr.len() > 1000,
        "trace logging is on: {}",
        sync.stderr
    );
    assert!(
        !sync.stderr.contains("token-alice") && !sync.stdout.contains("token-alice"),
        "the token leaked into the output"
    );
    assert!(sync.stdout.contains("alice@acme failed"), "{}", sync.stdout);
    assert!(sync.stdout.contains("credentials"), "{}", sync.stdout);
}

#[tokio::test]
async fn sync_of_an_unknown_provider_names_the_configured_ones() {
    let app = spawn_app().await;
    let config = app.write_config(&cursor_provider("acme", &app.api.uri(), &["alice"]));
    let sync = run(tributary(&config).args(["sync", "--provider", "nope"]));
    assert_eq!(sync.code, 2);
    assert!(sync.stderr.contains("no provider named \"nope\"") && sync.stderr.contains("acme"));
}

/// Each bad config: what to change in a valid one, and what the message must name.
#[test]
fn bad_configs_fail_at_start_naming_the_file_and_key_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db_path = dir.path().join("never.db");
    let key_file = dir.path().join("secrets.key");
    tributary::secrets::Keyring::generate_key_file(&key_file).unwrap();
    let secrets = format!("[secrets]\nkey_file = \"{}\"\n", key_file.display());
    let valid = format!(
        "[database]\nurl = \"sqlite://{}?mode=rwc\"\n{secrets}{}",
        db_path.display(),
        cursor_provider("acme", "http://127.0.0.1:9", &["alice"])
    );
    let rest_key =
        |line: &str| valid.replace("kind = \"rest\"", &format!("kind = \"rest\"\n{line}"));
    let cases: Vec<(String, &str, &str)> = vec![
        (
            rest_key("streams = [\"records\", \"tasks\"]"),
            "providers.acme.streams",
            "unknown stream \"tasks\"",
        ),
        (
            rest_key("incremental = { cursor_field = \"t\", param = \"since\", format = \"%Q\" }"),
            "providers.acme.incremental.format",
            "incremental.format",
        ),
        (
            rest_key("incremental = { cursor_field = \"t\", param = \"since\", lookback = \"90d\" }"),
            "providers.acme.incremental.lookback",
            "must be between 0s and 30days",
        ),
        (
            valid.replace("page_size = 100", "page_size = 100\nmax_page = 300"),
            "providers.acme.pagination.max_page",
            "pagination.type = \"cursor\" does not use it",
        ),
        (
            rest_key("records_filter = { field = \"status\", equls = \"open\" }"),
            "providers.acme",
            "unknown field `equls`",
        ),
        (
            valid.replace(
                "auth = \"bearer\"",
                "auth = { oauth2 = \"client_credentials\", token_url = \"https://auth.example.com/token\", \
                 client_id = \"app\", client_secret_env = \"TRIBUTARY_TEST_NOT_SET_SECRET\" }",
            ),
            "providers.acme.auth.client_secret_env",
            "TRIBUTARY_TEST_NOT_SET_SECRET is not set",
        ),
        (
            valid.replace(
                "kind = \"rest\"",
                "preset = \"gitlab_issues\"\nquery_params = { state = \"opened\" }",
            ),
            "providers.acme",
            "unknown field `query_params`",
        ),
        (
            format!(
                "{valid}[providers.acme.resources.tasks]\nparent = \"records\"\n\
                 path = \"/v1/items/{{parent.owner.login}}/tasks\"\n"
            ),
            "providers.acme.resources.tasks.path",
            "parent.owner.login",
        ),
        (
            format!("{valid}[providers.acme.resources.tasks]\nparent = \"records\"\npaht = \"/t\"\n"),
            "providers.acme",
            "unknown field `paht`",
        ),
        (
            rest_key("preset = \"nope\""),
            "providers.acme.preset",
            "gitlab_issues",
        ),
        (
            rest_key("account_id = { path = \"v1/me\", pointer = \"/id\" }"),
            "providers.acme.account_id.path",
            "must start with '/'",
        ),
        (
            format!("{valid}[providers.gh]\nkind = \"github\"\nschedule = \"0 0 0 1 1 *\"\nclient_id = \"Iv1.abc\"\n"),
            "providers.gh.client_id",
            "client_id needs client_secret_env",
        ),
        (
            format!(
                "{valid}[providers.gh]\nkind = \"github\"\nschedule = \"0 0 0 1 1 *\"\nclient_id = \"Iv1.abc\"\n\
                 client_secret_env = \"TRIBUTARY_TEST_NOT_SET_GH_SECRET\"\n"
            ),
            "providers.gh.client_secret_env",
            "TRIBUTARY_TEST_NOT_SET_GH_SECRET is not set",
        ),
        (
            valid.replace(
                "auth = \"bearer\"",
                "auth = { oauth2 = \"client_credentials\", token_url = \"https://a.example/t\", \
                 client_id = \"app\", client_secret_env = \"PATH\", authorize_url = \"https://a.example/a\" }",
            ),
            "providers.acme",
            "auth.authorize_url is for users who authorize",
        ),
        (
            valid.replace("records_path", "recrods_path"),
            "providers.acme",
            "unknown field `recrods_path`",
        ),
        (
            valid.replace("page_size = 100", "page_size = \"big\""),
            "providers.acme.pagination.page_size",
            "invalid type",
        ),
        (
            valid.replace("0 */15 * * * *", "every five minutes"),
            "providers.acme.schedule",
            "not a valid cron expression",
        ),
        (
            valid.replace("0 */15 * * * *", "*/15 * * * *"),
            "providers.acme.schedule",
            "six fields",
        ),
        (
            valid.replace("http://127.0.0.1:9", "not a url"),
            "providers.acme.base_url",
            "",
        ),
        (
            valid.replace("kind = \"rest\"", "kind = \"soap\""),
            "providers.acme",
            "unknown provider kind \"soap\", expected one of: rest",
        ),
        (
            valid.replace(
                "token = \"token-alice\"",
                "token_env = \"TRIBUTARY_TEST_NOT_SET\"",
            ),
            "providers.acme.connections[0].token_env",
            "TRIBUTARY_TEST_NOT_SET is not set",
        ),
        (
            valid.replace(&secrets, ""),
            "providers.acme.connections[0].token",
            "no secrets key is configured: generate a key with `tributary secrets generate-key",
        ),
        (
            valid.replace("max_retries = 2", "max_retries = -1"),
            "providers.acme.http.max_retries",
            "",
        ),
        (
            format!("[daemon]\nkey_sweep_schedule = \"hourly\"\n{valid}"),
            "daemon.key_sweep_schedule",
            "not a valid cron expression",
        ),
        (
            valid.replace("[database]", "[databse]"),
            "",
            "unknown field `databse`",
        ),
        (
            valid.replace("sqlite://", "oracle://"),
            "database.url",
            "expected a sqlite://, postgres:// or mysql:// URL",
        ),
        (
            format!(
                "{valid}\n[[providers.acme.connections]]\nuser_id = \"alice\"\ntoken = \"x\"\n"
            ),
            "providers.acme.connections[1].user_id",
            "listed twice",
        ),
        (
            valid.replace("user_id = \"alice\"", "user_id = \"al\\u0000ice\""),
            "providers.acme.connections[0].user_id",
            "control characters",
        ),
        (
            format!("[telemetry]\nendpoint = \"http://127.0.0.1:4318\"\nsampling_ratio = 1.5\n{valid}"),
            "telemetry.sampling_ratio",
            "between 0.0 and 1.0, got 1.5",
        ),
        (
            format!("[telemetry]\nendpoint = \"http://127.0.0.1:4318\"\nheaders = {{ \"x-api-key\" = \"hny_Secret123\" }}\n{valid}"),
            "telemetry.headers.x-api-key",
            "never the value itself",
        ),
        (
            format!("[telemetry]\nendpoint = \"http://127.0.0.1:4318\"\nheaders = {{ \"x-api-key\" = \"TRIBUTARY_TEST_NOT_SET_OTLP\" }}\n{valid}"),
            "telemetry.headers.x-api-key",
            "TRIBUTARY_TEST_NOT_SET_OTLP is not set",
        ),
        (
            format!("[telemetry]\nendpoint = \"https://user:pass@collector.example\"\n{valid}"),
            "telemetry.endpoint",
            "credentials in the URL",
        ),
    ];
    for (index, (text, key, expected)) in cases.iter().enumerate() {
        let config = dir.path().join(format!("bad-{index}.toml"));
        std::fs::write(&config, text).unwrap();
        for args in [&["check-config"][..], &["sync", "--quiet"][..]] {
            let output = run(tributary(&config).args(args));
            assert_eq!(output.code, 2, "case {index} {args:?}: {}", output.stderr);
            assert!(
                output.stderr.contains(&config.display().to_string()),
                "case {index}: the message names the file: {}",
                output.stderr
            );
            assert!(
                output.stderr.contains(key),
                "case {index}: names `{key}`: {}",
                output.stderr
            );
            assert!(
                output.stderr.contains(expected),
                "case {index}: says `{expected}`: {}",
                output.stderr
            );
        }
    }
    assert!(
        !db_path.exists(),
        "a bad config must not create the database"
    );

    let config = dir.path().join("good.toml");
    std::fs::write(&config, &valid).unwrap();
    let output = run(tributary(&config).arg("check-config"));
    assert_eq!(output.code, 0, "{}", output.stderr);
    assert!(output
        .stdout
        .contains("is valid: 1 provider(s), 1 connection(s)"));
    assert!(
        !db_path.exists(),
        "check-config does not touch the database"
    );

    let missing = dir.path().join("missing.toml");
    let output = run(tributary(&missing).arg("check-config"));
    assert_eq!(output.code, 2);
    assert!(
        output.stderr.contains("cannot read config file") && output.stderr.contains("missing.toml")
    );
}

#[test]
fn the_shipped_config_is_valid_once_its_token_variable_is_set() {
    let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config.toml");
    let output = run(tributary(&config)
        .arg("check-config")
        .env("ACME_ALICE_TOKEN", "x"));
    assert_eq!(output.code, 0, "{}", output.stderr);
}

#[test]
fn demo_shows_that_the_second_pass_inserts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    let db_path = dir.path().join("demo.db");
    // Like the shipped config.toml: a connection whose token variable is not set, and
    // no secrets key.
    let acme = cursor_provider("acme", "http://127.0.0.1:9", &["alice"]).replace(
        "token = \"token-alice\"",
        "token_env = \"TRIBUTARY_TEST_UNSET_TOKEN\"",
    );
    std::fs::write(
        &config,
        format!(
            "[database]\nurl = \"sqlite://{}?mode=rwc\"\n{acme}",
            db_path.display()
        ),
    )
    .unwrap();
    let output = run(tributary(&config).args(["demo", "--quiet"]));
    assert_eq!(
        output.code, 0,
        "stdout: {}\nstderr: {}",
        output.stdout, output.stderr
    );
    assert!(
        output.stdout.contains("Pass 2 inserted 0 records"),
        "{}",
        output.stdout
    );
    assert!(output
        .stdout
        .contains("The malformed record sits in run_errors"));
    assert!(
        output.stdout.contains("ada@demo partial"),
        "{}",
        output.stdout
    );
    assert!(output.stdout.contains("grace@demo succeeded"));
    assert!(
        output.stdout.contains("sealed with key") && output.stdout.contains("ada: sealed:v1:"),
        "{}",
        output.stdout
    );
    let file = std::fs::read(&db_path).unwrap();
    let wal = std::fs::read(dir.path().join("demo.db-wal")).unwrap_or_default();
    for bytes in [&file, &wal] {
        assert!(
            !bytes.windows(11).any(|w| w == b"demo-token-"),
            "a demo token in clear"
        );
    }

    let runs = run(tributary(&config).args(["runs", "--json"]));
    assert_eq!(runs.code, 0, "the demo's hint works: {}", runs.stderr);
    let runs: serde_json::Value = serde_json::from_str(&runs.stdout).unwrap();
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.len(), 6, "two passes over three users");
    let inserted: i64 = runs
        .iter()
        .map(|r| r["records_inserted"].as_i64().unwrap())
        .sum();
    assert_eq!(
        inserted, 35,
        "3 users x 12 records, less the one without an id"
    );
}
