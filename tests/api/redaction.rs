//! Secrets stay out of quoted URLs, messages and `Debug` output, and plain HTTP is refused
//! where a token would travel in clear.

use wiremock::matchers::{method, path, query_param};
use wiremock::{Mock, ResponseTemplate};

use sea_orm::EntityTrait;
use tributary::entities::sync_run;

use crate::helpers::spawn_app;

const API_KEY: &str = "query-key-4f1d2c";
const STATIC_SECRET: &str = "static-signature-9a8b7c";

/// A rest provider that takes its key as `?key=` and a static signature in `query`.
fn query_auth_provider(base_url: &str) -> String {
    format!(
        r#"
[providers.acme]
kind = "rest"
base_url = "{base_url}"
path = "/v1/items"
schedule = "0 */15 * * * *"
records_path = "data"
auth = {{ query = "key" }}
query = {{ signature = "{STATIC_SECRET}", region = "eu" }}

[providers.acme.http]
max_retries = 2
retry_initial_delay = "1ms"
retry_max_delay = "5ms"

[[providers.acme.connections]]
user_id = "alice"
token_env = "ACME_QUERY_KEY"
"#
    )
}

#[tokio::test]
async fn a_key_sent_in_the_query_never_shows_in_logs_errors_or_the_run_history() {
    let app = spawn_app().await;
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .and(query_param("key", API_KEY))
        .and(query_param("signature", STATIC_SECRET))
        .respond_with(ResponseTemplate::new(503).set_body_string("down for maintenance"))
        .expect(3)
        .mount(&app.api)
        .await;
    let config = app.write_config(&query_auth_provider(&app.api.uri()));

    let output = std::process::Command::new(assert_cmd::cargo::cargo_bin("tributary"))
        .arg("--config")
        .arg(&config)
        .args(["sync", "--quiet"])
        .env("ACME_QUERY_KEY", API_KEY)
        .env("RUST_LOG", "info")
        .env_remove("TRIBUTARY_DATABASE_URL")
        .output()
        .expect("tributary runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stdout}\n{stderr}");
    // The retry warnings and the run's line quote the URL, with the values hidden.
    assert!(stderr.contains("retrying"), "{stderr}");
    assert!(stderr.contains("key=REDACTED"), "{stderr}");
    assert!(stderr.contains("region=eu"), "{stderr}");

    let runs = sync_run::Entity::find().all(&app.db).await.expect("runs");
    assert_eq!(runs.len(), 1);
    let run = &runs[0];
    let error = run.error.clone().unwrap_or_default();
    assert!(error.contains("HTTP 503"), "{error}");
    assert!(error.contains("signature=REDACTED"), "{error}");
    for text in [&*stdout, &*stderr, &error] {
        assert!(!text.contains(API_KEY), "{text}");
        assert!(!text.contains(STATIC_SECRET), "{text}");
    }
}

#[test]
fn debug_output_of_everything_holding_a_secret_is_redacted() {
    use tributary::config::Settings;
    use tributary::credentials::{RefreshedCredentials, StoredCredentials};
    use tributary::entities::connection;

    let secrets = [
        "db-pw-1a2b",
        "ssl-pw-3c4d",
        "literal-token-5e6f",
        "literal-refresh-7a8b",
        "header-secret-9c0d",
        "query-secret-1e2f",
    ];
    let text = format!(
        r#"
[database]
url = "postgres://app:{}@db.internal:5432/app?sslpassword={}&sslmode=require"

[providers.acme]
kind = "rest"
base_url = "https://api.acme.example"
schedule = "0 */15 * * * *"
query = {{ api_key = "{}", region = "eu" }}
headers = {{ X-Signature = "{}" }}

[[providers.acme.connections]]
user_id = "alice"
token = "{}"
refresh_token = "{}"
"#,
        secrets[0], secrets[1], secrets[5], secrets[4], secrets[2], secrets[3]
    );
    let settings = Settings::parse(std::path::Path::new("config.toml"), &text, None, &|_| true)
        .expect("valid config");
    let stored = StoredCredentials {
        token: Some(secrets[2].to_string()),
        refresh_token: Some(secrets[3].to_string()),
        oauth: Some(RefreshedCredentials {
            token: Some(secrets[2].to_string()),
            refresh_token: Some(secrets[3].to_string()),
            expires_at: Some(1),
        }),
        ..StoredCredentials::default()
    };
    let now = chrono::Utc::now();
    let row = connection::Model {
        id: 1,
        user_id: "alice".into(),
        provider: "acme".into(),
        enabled: true,
        credentials: stored.to_column(),
        cursor: None,
        checkpoint: None,
        last_success_run_id: None,
        last_success_at: None,
        lease_holder: None,
        lease_expires_at: None,
        lease_generation: 0,
        refresh_holder: None,
        refresh_claimed_until: None,
        defined_in: tributary::entities::connection::DefinedIn::Config,
        paused_at: None,
        schedule: None,
        account_id: None,
        needs_reconnect_since: None,
        base_url: None,
        created_at: now,
        updated_at: now,
    };
    let shown = [
        format!("{settings:?}"),
        format!("{:?}", settings.database),
        format!("{stored:?}"),
        format!("{row:?}"),
        tributary::config::redact_url(&settings.database.url),
    ];
    for (text, secret) in shown
        .iter()
        .flat_map(|t| secrets.iter().map(move |s| (t, s)))
    {
        assert!(!text.contains(secret), "{secret} in {text}");
    }
    // What is not secret still shows, so the output stays useful.
    assert!(
        shown[0].contains("db.internal:5432") && shown[0].contains("region"),
        "{}",
        shown[0]
    );
    assert!(shown[2].contains("[REDACTED]"), "{}", shown[2]);
    assert!(shown[4].contains("sslmode=require"), "{}", shown[4]);
}

/// A port nothing listens on: bound, then closed again.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    drop(listener);
    port
}

#[test]
fn an_unreachable_database_fails_within_seconds_naming_its_address_not_its_password() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        "[database]\nurl = \"sqlite://unused.db?mode=rwc\"\n",
    )
    .expect("write");
    for scheme in ["postgres", "mysql"] {
        let port = closed_port();
        let url = format!("{scheme}://app:pw-5a6b7c@127.0.0.1:{port}/app?sslpassword=pw-8d9e");
        let started = std::time::Instant::now();
        let output = std::process::Command::new(assert_cmd::cargo::cargo_bin("tributary"))
            .arg("--config")
            .arg(&config)
            .arg("runs")
            .env("TRIBUTARY_DATABASE_URL", &url)
            .output()
            .expect("tributary runs");
        let elapsed = started.elapsed();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_ne!(output.status.code(), Some(0), "{stderr}");
        assert!(
            elapsed < std::time::Duration::from_secs(10),
            "{scheme}: took {elapsed:?}"
        );
        assert!(stderr.contains(&format!("127.0.0.1:{port}")), "{stderr}");
        assert!(
            !stderr.contains("pw-5a6b7c") && !stderr.contains("pw-8d9e"),
            "{stderr}"
        );
    }
}

#[test]
fn a_sqlite_database_tributary_creates_is_readable_by_its_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("fresh.db");
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[database]\nurl = \"sqlite://{}?mode=rwc\"\n",
            file.display()
        ),
    )
    .expect("write");
    let output = std::process::Command::new(assert_cmd::cargo::cargo_bin("tributary"))
        .arg("--config")
        .arg(&config)
        .arg("migrate")
        .env_remove("TRIBUTARY_DATABASE_URL")
        .output()
        .expect("tributary runs");
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mode = std::fs::metadata(&file)
        .expect("created")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}
