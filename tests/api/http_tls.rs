//! The API over its own TLS (`[api] tls_cert`, `tls_key`): HTTPS with the configured
//! certificate and nothing in plain HTTP, and a certificate or key the daemon cannot use
//! stopping it before it serves, naming the key and the file.

use std::time::Duration;

use reqwest::{Method, StatusCode};

use crate::daemon::{daemon_table, free_port, Daemon};
use crate::helpers::{cursor_provider, run, spawn_app, tributary, TestApp};
use crate::http::Served;

/// A self-signed certificate for the address the tests serve on.
fn identity() -> rcgen::CertifiedKey<rcgen::KeyPair> {
    rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string(), "localhost".to_string()])
        .expect("a self-signed certificate")
}

#[tokio::test]
async fn the_api_serves_https_with_the_configured_certificate_and_no_plain_http() {
    let app = spawn_app().await;
    let providers = cursor_provider("acme", &app.api.uri(), &["alice"]);
    let served = Served::start_https(&app, &providers, &identity()).await;
    assert!(served.base.starts_with("https://"), "{}", served.base);

    let (status, _, health) = served.call(Method::GET, "/v1/health", None, None).await;
    assert_eq!(status, StatusCode::OK, "{health}");
    assert_eq!(health["status"], "ok", "{health}");
    let reader = served.create_key("reader", &["connections:read"]);
    let (status, page) = served.get("/v1/connections?provider=acme", &reader).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let users: Vec<&str> = page["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|connection| connection["user_id"].as_str())
        .collect();
    assert_eq!(users, ["alice"], "{page}");
    let (status, _, problem) = served
        .call(Method::GET, "/v1/connections", None, None)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{problem}");

    // The same port answers no plain HTTP request.
    let plain = served.base.replace("https://", "http://");
    let answered = reqwest::Client::new()
        .get(format!("{plain}/v1/health"))
        .timeout(Duration::from_secs(10))
        .send()
        .await;
    assert!(answered.is_err(), "plain HTTP answered: {answered:?}");
    // The API still serves HTTPS after the plain client's failed handshake.
    let (status, _, _) = served.call(Method::GET, "/v1/health", None, None).await;
    assert_eq!(status, StatusCode::OK);

    let log = served.daemon.log();
    assert!(
        log.contains(&format!("url={}", served.base)),
        "the log does not say {}:\n{log}",
        served.base
    );

    // SIGTERM stops the HTTPS API with the daemon, as it does the plain one.
    let mut served = served;
    served.daemon.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(
        served.daemon.wait(Duration::from_secs(15)),
        0,
        "{}",
        served.daemon.log()
    );
    assert!(served.daemon.log().contains("The API stopped serving."));
}

/// The config of a daemon serving the API on a free port with `tls` in its `[api]` table.
fn config_with(app: &TestApp, name: &str, tls: &str) -> std::path::PathBuf {
    let port = free_port();
    let providers = cursor_provider("acme", &app.api.uri(), &["alice"]);
    let text = app.config_text(&format!(
        "{}[api]\nlisten = \"127.0.0.1:{port}\"\n{tls}{providers}",
        daemon_table(None)
    ));
    let config = app.dir.path().join(format!("{name}.toml"));
    std::fs::write(&config, text).expect("config written");
    config
}

/// `tributary daemon` with `config`: its exit code and its log, once it exited.
fn daemon_refusal(app: &TestApp, config: &std::path::Path, name: &str) -> (i32, String) {
    let mut daemon = Daemon::start(config, app.dir.path().join(format!("{name}.log")));
    let code = daemon.wait(Duration::from_secs(30));
    (code, daemon.log())
}

#[tokio::test]
async fn a_certificate_or_key_the_daemon_cannot_use_stops_it_before_it_serves() {
    let app = spawn_app().await;
    let one = identity();
    let other = identity();
    let dir = app.dir.path();
    std::fs::write(dir.join("cert.pem"), one.cert.pem()).expect("written");
    std::fs::write(dir.join("key.pem"), one.signing_key.serialize_pem()).expect("written");
    std::fs::write(dir.join("other.pem"), other.signing_key.serialize_pem()).expect("written");
    std::fs::write(dir.join("garbage.pem"), "not a certificate\n").expect("written");

    // One key alone.
    let config = config_with(&app, "alone", "tls_cert = \"cert.pem\"\n");
    let (code, log) = daemon_refusal(&app, &config, "alone");
    assert_eq!(code, 2, "{log}");
    assert!(log.contains(&config.display().to_string()), "{log}");
    assert!(log.contains("key `api.tls_key`: missing"), "{log}");

    // A certificate file that is not PEM, named as the daemon resolved it.
    let config = config_with(
        &app,
        "garbage",
        "tls_cert = \"garbage.pem\"\ntls_key = \"key.pem\"\n",
    );
    let garbage = dir.join("garbage.pem").display().to_string();
    let (code, log) = daemon_refusal(&app, &config, "garbage");
    assert_eq!(code, 2, "{log}");
    assert!(log.contains("key `api.tls_cert`"), "{log}");
    assert!(log.contains(&garbage), "{log}");
    assert!(!log.contains("Serving the API."), "{log}");
    assert!(!log.contains("Daemon starting."), "{log}");
    let checked = run(tributary(&config).arg("check-config"));
    assert_eq!(checked.code, 2, "{}", checked.stderr);
    assert!(checked.stderr.contains(&garbage), "{}", checked.stderr);

    // Another certificate's key, named without its text.
    let config = config_with(
        &app,
        "mismatch",
        "tls_cert = \"cert.pem\"\ntls_key = \"other.pem\"\n",
    );
    let (code, log) = daemon_refusal(&app, &config, "mismatch");
    assert_eq!(code, 2, "{log}");
    assert!(log.contains("key `api.tls_key`"), "{log}");
    assert!(
        log.contains(&format!(
            "{} is not the private key of the certificate in {}",
            dir.join("other.pem").display(),
            dir.join("cert.pem").display()
        )),
        "{log}"
    );
    let secret = other.signing_key.serialize_pem();
    let body = secret.lines().nth(1).expect("a line of the key");
    assert!(!log.contains(body), "the key is in the log");

    // The pair that matches passes check-config, which says the API serves HTTPS.
    let config = config_with(
        &app,
        "valid",
        "tls_cert = \"cert.pem\"\ntls_key = \"key.pem\"\n",
    );
    let checked = run(tributary(&config).arg("check-config"));
    assert_eq!(checked.code, 0, "{}", checked.stderr);
    assert!(
        checked.stdout.contains("serves HTTPS"),
        "{}",
        checked.stdout
    );
}
