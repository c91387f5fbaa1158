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
