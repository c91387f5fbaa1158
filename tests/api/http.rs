//! The HTTP API of a real `tributary daemon` process, driven by a real client: keys and
//! scopes, paged lists, problems for every error, the audit of writes and the OpenAPI
//! document.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use sea_orm::{ConnectionTrait, EntityTrait, Statement};
use serde_json::Value;
use tributary::entities::connection;

use crate::daemon::{daemon_table, free_port, Daemon};
use crate::helpers::{
    backend, cursor_provider, mount_cursor_listing, run, spawn_app, tributary, Backend, TestApp,
};

/// A daemon serving the API on a free port, its config and its base URL.
pub(crate) struct Served {
    pub(crate) daemon: Daemon,
    pub(crate) config: std::path::PathBuf,
    pub(crate) base: String,
    client: reqwest::Client,
}

impl Served {
    /// Starts a daemon over `providers` with `[api]` on a free port and a body limit of
    /// 1 KiB, and waits until the API answers.
    pub(crate) async fn start(app: &TestApp, providers: &str) -> Served {
        Served::start_named(app, providers, "daemon").await
    }

    /// [`Served::start`] with its config and log named after `name`, so that several
    /// instances can share the test's folder.
    pub(crate) async fn start_named(app: &TestApp, providers: &str, name: &str) -> Served {
        Served::start_with(app, providers, name, |text| text).await
    }

    /// [`Served::start_named`] with its config text passed through `edit` first.
    pub(crate) async fn start_with(
        app: &TestApp,
        providers: &str,
        name: &str,
        edit: impl FnOnce(String) -> String,
    ) -> Served {
        Served::launch(app, providers, name, edit, None, &[]).await
    }

    /// [`Served::start_with`] with `env` set in the daemon's environment.
    pub(crate) async fn start_with_env(
        app: &TestApp,
        providers: &str,
        env: &[(&str, &str)],
        edit: impl FnOnce(String) -> String,
    ) -> Served {
        Served::start_named_with_env(app, providers, "daemon", env, edit).await
    }

    /// [`Served::start_with_env`] with its config and log named after `name`.
    pub(crate) async fn start_named_with_env(
        app: &TestApp,
        providers: &str,
        name: &str,
        env: &[(&str, &str)],
        edit: impl FnOnce(String) -> String,
    ) -> Served {
        Served::launch(app, providers, name, edit, None, env).await
    }

    /// [`Served::start`] over HTTPS: `[api] tls_cert` and `tls_key` name `cert.pem` and
    /// `key.pem`, written beside the config from `identity` and given as paths relative to
    /// it; the client trusts that certificate alone.
    pub(crate) async fn start_https(
        app: &TestApp,
        providers: &str,
        identity: &rcgen::CertifiedKey<rcgen::KeyPair>,
    ) -> Served {
        Served::launch(app, providers, "daemon", |text| text, Some(identity), &[]).await
    }

    async fn launch(
        app: &TestApp,
        providers: &str,
        name: &str,
        edit: impl FnOnce(String) -> String,
        tls: Option<&rcgen::CertifiedKey<rcgen::KeyPair>>,
        env: &[(&str, &str)],
    ) -> Served {
        let port = free_port();
        let config = app.dir.path().join(format!("{name}.toml"));
        let (scheme, tls_keys, client) = match tls {
            Some(identity) => {
                let cert = identity.cert.pem();
                std::fs::write(app.dir.path().join("cert.pem"), &cert).expect("cert written");
                std::fs::write(
                    app.dir.path().join("key.pem"),
                    identity.signing_key.serialize_pem(),
                )
                .expect("key written");
                let trusted = reqwest::Certificate::from_pem(cert.as_bytes()).expect("PEM");
                let client = reqwest::Client::builder()
                    .tls_certs_only([trusted])
                    .build()
                    .expect("client");
                (
                    "https",
                    "tls_cert = \"cert.pem\"\ntls_key = \"key.pem\"\n",
                    client,
                )
            }
            None => ("http", "", reqwest::Client::new()),
        };
        let text = app.config_text(&format!(
            "{}[api]\nlisten = \"127.0.0.1:{port}\"\nmax_body_bytes = 1024\n{tls_keys}{providers}",
            daemon_table(None)
        ));
        std::fs::write(&config, edit(text)).expect("config written");
        let daemon = Daemon::start_with(
            &config,
            app.dir.path().join(format!("{name}.log")),
            &["--log", "debug"],
            env,
        );
        let served = Served {
            daemon,
            config,
            base: format!("{scheme}://127.0.0.1:{port}"),
            client,
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let answered = served
                .client
                .get(format!("{}/v1/openapi.json", served.base))
                .send()
                .await;
            if matches!(&answered, Ok(response) if response.status() == StatusCode::OK) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the API did not answer: {answered:?}\n{}",
                served.daemon.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        served
    }

    /// `tributary api-keys create --name NAME --scope ...`: the key it printed.
    pub(crate) fn create_key(&self, name: &str, scopes: &[&str]) -> String {
        let mut command = tributary(&self.config);
        command.args(["api-keys", "create", "--name", name]);
        for scope in scopes {
            command.args(["--scope", scope]);
        }
        let output = run(&mut command);
        assert_eq!(output.code, 0, "{}{}", output.stdout, output.stderr);
        output
            .stdout
            .lines()
            .find(|line| line.starts_with("trb_"))
            .unwrap_or_else(|| panic!("no key printed: {}", output.stdout))
            .to_string()
    }

    /// A request with `key` as its bearer token (none when `None`); the status, the
    /// headers and the body as JSON.
    pub(crate) async fn call(
        &self,
        method: Method,
        path: &str,
        key: Option<&str>,
        body: Option<(&str, Vec<u8>)>,
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        self.call_with(method, path, key, body, &[]).await
    }

    /// [`Served::call`] with `headers` added to the request.
    pub(crate) async fn call_with(
        &self,
        method: Method,
        path: &str,
        key: Option<&str>,
        body: Option<(&str, Vec<u8>)>,
        headers: &[(String, String)],
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        for (name, value) in headers {
            request = request.header(name.as_str(), value.as_str());
        }
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        if let Some((content_type, body)) = body {
            request = request.header("content-type", content_type).body(body);
        }
        let response = request.send().await.expect("the API answers");
        let status = response.status();
        let headers = response.headers().clone();
        let text = response.text().await.expect("a body");
        let json = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, headers, json)
    }

    pub(crate) async fn get(&self, path: &str, key: &str) -> (StatusCode, Value) {
        let (status, headers, json) = self.call(Method::GET, path, Some(key), None).await;
        if !status.is_success() {
            assert_problem(status, &headers, &json);
        }
        (status, json)
    }
}

/// An answer is an RFC 9457 problem of its status.
pub(crate) fn assert_problem(
    status: StatusCode,
    headers: &reqwest::header::HeaderMap,
    json: &Value,
) {
    assert_eq!(
        headers.get("content-type").and_then(|v| v.to_str().ok()),
        Some("application/problem+json"),
        "{status} {json}"
    );
    assert_eq!(json["status"], status.as_u16(), "{json}");
    assert!(
        json["type"]
            .as_str()
            .is_some_and(|t| t.starts_with("urn:tributary:problem:")),
        "{json}"
    );
    assert!(json["title"].is_string(), "{json}");
}

/// Every text column of `api_keys` and `api_audit`, row by row.
async fn key_and_audit_text(app: &TestApp) -> Vec<String> {
    let mut text = Vec::new();
    for row in query(
        app,
        "SELECT name, prefix, secret_hash, scopes FROM api_keys",
    )
    .await
    {
        for column in ["name", "prefix", "secret_hash", "scopes"] {
            text.push(row.try_get::<String>("", column).expect(column));
        }
    }
    for row in audit_rows(app).await {
        text.push(format!("{row:?}"));
    }
    text
}

/// `api_audit`'s rows in order: key id, method, path, status.
pub(crate) async fn audit_rows(app: &TestApp) -> Vec<(Option<i64>, String, String, i32)> {
    query(
        app,
        "SELECT key_id, method, path, status FROM api_audit ORDER BY id",
    )
    .await
    .iter()
    .map(|row| {
        (
            row.try_get("", "key_id").expect("key_id"),
            row.try_get("", "method").expect("method"),
            row.try_get("", "path").expect("path"),
            row.try_get("", "status").expect("status"),
        )
    })
    .collect()
}

pub(crate) async fn query(app: &TestApp, sql: &str) -> Vec<sea_orm::QueryResult> {
    let backend = app.db.get_database_backend();
    app.db
        .query_all_raw(Statement::from_string(backend, sql.to_string()))
        .await
        .expect("query")
}

async fn three_connections(app: &TestApp) -> String {
    cursor_provider("acme", &app.api.uri(), &["alice", "bob", "carol"])
}

#[tokio::test]
async fn a_key_is_needed_its_scope_is_checked_and_a_revoked_key_stops_at_once() {
    let app = spawn_app().await;
    let providers = three_connections(&app).await;
    let metrics_port = crate::daemon::free_port();
    let served = Served::start_with(&app, &providers, "daemon", |text| {
        text.replace(
            "[daemon]\n",
            &format!("[daemon]\nlisten = \"127.0.0.1:{metrics_port}\"\n"),
        )
    })
    .await;
    // Whole seconds: MariaDB keeps no fraction unless told.
    let before = chrono::Utc::now() - chrono::TimeDelta::seconds(1);
    let reader = served.create_key("reader", &["connections:read"]);
    let records = served.create_key("records", &["records:read"]);
    let admin = served.create_key("admin", &["admin"]);
    let created = chrono::Utc::now() + chrono::TimeDelta::seconds(1);
    let again = run(tributary(&served.config)
        .args(["api-keys", "create", "--name", "reader", "--scope", "admin"]));
    assert_ne!(again.code, 0);
    assert!(again.stderr.contains("already exists"), "{}", again.stderr);
    let unknown = run(tributary(&served.config).args([
        "api-keys",
        "create",
        "--name",
        "other",
        "--scope",
        "records:write",
    ]));
    assert_ne!(unknown.code, 0);
    assert!(
        unknown.stderr.contains("unknown scope"),
        "{}",
        unknown.stderr
    );
    let missing =
        run(tributary(&served.config).args(["api-keys", "revoke", "--prefix", "0123456789ab"]));
    assert_ne!(missing.code, 0);
    assert!(
        missing.stderr.contains("no API key with prefix"),
        "{}",
        missing.stderr
    );

    let (status, headers, json) = served
        .call(Method::GET, "/v1/connections", None, None)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{json}");
    assert_problem(status, &headers, &json);
    assert!(
        headers
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("Bearer")),
        "{headers:?}"
    );
    let (prefix, _) = reader
        .strip_prefix("trb_")
        .and_then(|rest| rest.split_once('_'))
        .expect("trb_<prefix>_<secret>");
    let wrong_secret = format!("trb_{prefix}_{}", "A".repeat(43));
    let unknown_prefix = format!("trb_0123456789ab_{}", "B".repeat(43));
    let malformed = format!("trb_{prefix}_{}", "C".repeat(7));
    for wrong in [
        "nonsense",
        "trb_zz_x",
        &wrong_secret,
        &unknown_prefix,
        &malformed,
    ] {
        let (status, headers, json) = served
            .call(Method::GET, "/v1/connections", Some(wrong), None)
            .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{wrong}: {json}");
        assert_problem(status, &headers, &json);
        assert!(headers.contains_key("www-authenticate"), "{headers:?}");
        // The key sent is not echoed back, whole or its secret.
        let answer = format!("{headers:?} {json}");
        let secret = wrong.rsplit('_').next().unwrap_or(wrong);
        assert!(!answer.contains(wrong), "{wrong}: {answer}");
        assert!(
            secret.len() < 7 || !answer.contains(secret),
            "{wrong}: {answer}"
        );
    }

    let (status, json) = served.get("/v1/connections", &records).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{json}");
    assert!(!json.to_string().contains(&records[4..]), "{json}");
    assert!(
        json["detail"]
            .as_str()
            .is_some_and(|d| d.contains("connections:read")),
        "{json}"
    );
    for key in [&reader, &admin] {
        let (status, json) = served.get("/v1/connections", key).await;
        assert_eq!(status, StatusCode::OK, "{json}");
        assert_eq!(json["items"].as_array().map(Vec::len), Some(3), "{json}");
    }

    let listed = run(tributary(&served.config).args(["api-keys", "list", "--json"]));
    assert_eq!(listed.code, 0, "{}", listed.stderr);
    let keys: Value = serde_json::from_str(&listed.stdout).expect("JSON list");
    let reader_row = keys
        .as_array()
        .and_then(|keys| keys.iter().find(|k| k["name"] == "reader"))
        .expect("reader listed");
    assert_eq!(reader_row["prefix"], prefix);
    assert_eq!(
        reader_row["scopes"],
        serde_json::json!(["connections:read"])
    );
    assert!(reader_row["last_used_at"].is_string(), "{reader_row}");
    let created_at = reader_row["created_at"]
        .as_str()
        .and_then(|text| chrono::DateTime::parse_from_rfc3339(text).ok())
        .expect("created_at, an RFC 3339 time");
    assert!(
        before <= created_at && created_at <= created,
        "{reader_row}: created between {before} and {created}"
    );
    assert!(reader_row["revoked_at"].is_null(), "{reader_row}");

    let revoked = run(tributary(&served.config).args(["api-keys", "revoke", "--name", "reader"]));
    assert_eq!(revoked.code, 0, "{}", revoked.stderr);
    let (status, json) = served.get("/v1/connections", &reader).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{json}");
    assert!(
        json["detail"]
            .as_str()
            .is_some_and(|d| d.contains("revoked")),
        "{json}"
    );
    assert!(!json.to_string().contains(&reader[4..]), "{json}");

    // The keys are nowhere in clear: not in the listing, the log, the metrics, the tables
    // or the file.
    let metrics = reqwest::get(format!("http://127.0.0.1:{metrics_port}/metrics"))
        .await
        .expect("metrics answer")
        .text()
        .await
        .expect("metrics text");
    assert!(
        metrics.contains("tributary_"),
        "the metrics are served: {metrics}"
    );
    let secret_of = |key: &str| -> String {
        let (_, secret) = key
            .strip_prefix("trb_")
            .and_then(|rest| rest.split_once('_'))
            .expect("trb_<prefix>_<secret>");
        assert_eq!(secret.len(), 43, "{key}");
        secret.to_string()
    };
    let tables = key_and_audit_text(&app).await;
    assert!(tables.iter().any(|text| text == prefix), "{tables:?}");
    let log = served.daemon.log();
    assert!(log.contains("Serving the API."), "{log}");
    for key in [&reader, &records, &admin] {
        let secret = secret_of(key);
        assert!(!listed.stdout.contains(&secret), "{}", listed.stdout);
        assert!(!log.contains(&secret), "the key is in the daemon's log");
        assert!(!metrics.contains(&secret), "the key is in the metrics");
        assert!(
            tables.iter().all(|row| !row.contains(&secret)),
            "the key is in a table"
        );
    }
    if backend() == Backend::Sqlite {
        let secret = secret_of(&reader);
        for file in std::fs::read_dir(app.dir.path()).expect("dir").flatten() {
            let bytes = std::fs::read(file.path()).unwrap_or_default();
            assert!(
                !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
                "the key is in {}",
                file.path().display()
            );
        }
    }
}

/// alice's, bob's and carol's connections to `acme`, two records each, synced once and
/// served.
async fn three_synced_and_served() -> (TestApp, Served) {
    let app = spawn_app().await;
    for user in ["alice", "bob", "carol"] {
        mount_cursor_listing(&app.api, user, &format!("{user}_"), 1, 2, Duration::ZERO).await;
    }
    let providers = three_connections(&app).await;
    let settings = app.settings(&providers).await;
    app.sync(&settings).await;
    let served = Served::start(&app, &providers).await;
    (app, served)
}

#[tokio::test]
async fn connections_and_runs_are_paged_by_their_cursor_and_bad_input_is_a_problem_naming_it() {
    let (_app, served) = three_synced_and_served().await;
    let key = served.create_key("reader", &["connections:read"]);

    // Three connections, two a page, the second page by the first's `next`.
    let (status, first) = served.get("/v1/connections?limit=2", &key).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let users = |page: &Value| -> Vec<String> {
        page["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|c| c["user_id"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    assert_eq!(users(&first), ["alice", "bob"]);
    let next = first["next"].as_str().expect("a next page");
    let (status, second) = served
        .get(&format!("/v1/connections?limit=2&cursor={next}"), &key)
        .await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(users(&second), ["carol"]);
    assert!(second["next"].is_null(), "{second}");
    let alice = &first["items"][0];
    assert_eq!(alice["provider"], "acme");
    assert_eq!(alice["streams"][0]["name"], "records");
    assert!(
        alice["streams"][0]["last_success_run_id"].is_i64(),
        "{alice}"
    );
    assert!(
        !first.to_string().contains("token-alice"),
        "a secret in the list: {first}"
    );

    let (_, filtered) = served
        .get(
            "/v1/connections?provider=acme&user_id=bob&enabled=true",
            &key,
        )
        .await;
    assert_eq!(users(&filtered), ["bob"]);
    let (_, none) = served.get("/v1/connections?enabled=false", &key).await;
    assert_eq!(users(&none), Vec::<String>::new());

    let id = alice["id"].as_i64().expect("id");
    let (status, one) = served.get(&format!("/v1/connections/{id}"), &key).await;
    assert_eq!(status, StatusCode::OK, "{one}");
    assert_eq!(one["user_id"], "alice");

    // Runs, newest first, two a page, the rest by the first page's `next`.
    let (status, runs) = served.get("/v1/runs?limit=2", &key).await;
    assert_eq!(status, StatusCode::OK, "{runs}");
    let next = runs["next"].as_str().expect("more runs");
    let (_, older) = served
        .get(&format!("/v1/runs?limit=2&cursor={next}"), &key)
        .await;
    assert!(older["next"].is_null(), "{older}");
    let listed: Vec<&Value> = runs["items"]
        .as_array()
        .into_iter()
        .chain(older["items"].as_array())
        .flatten()
        .collect();
    let ids: Vec<i64> = listed.iter().filter_map(|run| run["id"].as_i64()).collect();
    assert_eq!(ids.len(), 3, "{runs}\n{older}");
    assert!(
        ids.windows(2).all(|w| w[0] > w[1]),
        "not newest first: {ids:?}"
    );
    let mut run_users: Vec<&str> = listed
        .iter()
        .filter_map(|run| run["user_id"].as_str())
        .collect();
    run_users.sort();
    assert_eq!(run_users, ["alice", "bob", "carol"]);
    assert!(
        listed.iter().all(|run| run["status"] == "succeeded"),
        "{runs}"
    );
    // The CLI and the API return the same runs, from the same operation.
    let cli = run(tributary(&served.config).args(["runs", "--json"]));
    assert_eq!(cli.code, 0, "{}", cli.stderr);
    let cli_runs: Value = serde_json::from_str(&cli.stdout).expect("runs --json");
    let api_runs: Vec<Value> = listed.iter().map(|run| (*run).clone()).collect();
    assert_eq!(cli_runs, Value::Array(api_runs));
    let (status, run_json) = served.get(&format!("/v1/runs/{}", ids[2]), &key).await;
    assert_eq!(status, StatusCode::OK, "{run_json}");
    assert_eq!(run_json["id"], ids[2], "{run_json}");
    assert_eq!(run_json["records_inserted"], 2, "{run_json}");
    // One run is as the list (and so the CLI) shows it, every counter and time.
    assert_eq!(&run_json, listed[2]);
    assert_eq!(
        (
            &run_json["pages_fetched"],
            &run_json["records_fetched"],
            &run_json["records_failed"]
        ),
        (&1.into(), &2.into(), &0.into()),
        "{run_json}"
    );

    // Problems: unknown ids and routes, bad parameters named.
    for (path, status, field) in [
        ("/v1/connections/999999", StatusCode::NOT_FOUND, None),
        ("/v1/runs/999999", StatusCode::NOT_FOUND, None),
        ("/v1/nothing", StatusCode::NOT_FOUND, None),
        ("/v2/connections", StatusCode::NOT_FOUND, None),
        ("/v1/connections/abc", StatusCode::BAD_REQUEST, Some("id")),
        (
            "/v1/connections?limit=abc",
            StatusCode::BAD_REQUEST,
            Some("limit"),
        ),
        (
            "/v1/connections?limit=-1",
            StatusCode::BAD_REQUEST,
            Some("limit"),
        ),
        (
            "/v1/connections?limit=0",
            StatusCode::BAD_REQUEST,
            Some("limit"),
        ),
        (
            "/v1/runs?limit=100000",
            StatusCode::BAD_REQUEST,
            Some("limit"),
        ),
        (
            "/v1/connections?enabled=maybe",
            StatusCode::BAD_REQUEST,
            Some("enabled"),
        ),
        (
            "/v1/connections?token=x",
            StatusCode::BAD_REQUEST,
            Some("token"),
        ),
        (
            "/v1/connections?cursor=bm9wZQ",
            StatusCode::BAD_REQUEST,
            Some("cursor"),
        ),
        (
            &format!(
                "/v1/runs?cursor={}",
                first["next"].as_str().unwrap_or_default()
            ),
            StatusCode::BAD_REQUEST,
            Some("cursor"),
        ),
    ] {
        let (got, json) = served.get(path, &key).await;
        assert_eq!(got, status, "{path}: {json}");
        assert_eq!(json["field"].as_str(), field, "{path}: {json}");
        assert!(json["detail"].is_string(), "{path}: {json}");
    }
    let (status, headers, json) = served
        .call(Method::DELETE, "/v1/runs", Some(&key), None)
        .await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{json}");
    assert_problem(status, &headers, &json);

    // Path traversal in an id is a problem about the id, and reads no file.
    for path in [
        "/v1/connections/..%2F..%2Fetc",
        "/v1/connections/..%2F..%2F..%2Fetc%2Fpasswd",
        "/v1/connections/..%2F..%2Fetc%2Fpasswd/syncs",
        "/v1/runs/1%2F..",
        "/v1/runs/1%2F..%2F..%2Fconnections",
        "/v1/runs/%2E%2E%2F1",
        "/v1/runs/..%5C..%5Cetc",
    ] {
        let (status, headers, json) = served.call(Method::GET, path, Some(&key), None).await;
        assert!(status.is_client_error(), "{path}: {status} {json}");
        assert_problem(status, &headers, &json);
        assert!(
            status == StatusCode::NOT_FOUND || json["field"] == "id",
            "{path}: {json}"
        );
        assert!(!json.to_string().contains("root:"), "{path}: {json}");
    }
}

/// The cursor `next` with its id replaced by `id`, as a client editing it by hand would.
fn with_id(next: &str, id: &str) -> String {
    use base64::Engine;
    let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let text = String::from_utf8(engine.decode(next).expect("base64url")).expect("text");
    let mut parts: Vec<&str> = text.split('.').collect();
    assert_eq!(parts.len(), 3, "list, id and check: {text}");
    assert_ne!(parts[1], id, "{text}");
    parts[1] = id;
    engine.encode(parts.join("."))
}

#[tokio::test]
async fn id_cursors_edited_of_other_filters_or_from_another_database_are_refused() {
    let (app, served) = three_synced_and_served().await;
    let key = served.create_key("reader", &["connections:read"]);
    let refused = |path: String, status: StatusCode, json: Value| {
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {json}");
        assert_eq!(json["field"], "cursor", "{path}: {json}");
        assert!(
            json["detail"]
                .as_str()
                .is_some_and(|d| d.contains("same filters") && d.contains("leave cursor out")),
            "{path}: {json}"
        );
    };

    let mut firsts = Vec::new();
    for list in ["connections", "runs"] {
        let (status, first) = served.get(&format!("/v1/{list}?limit=2"), &key).await;
        assert_eq!(status, StatusCode::OK, "{first}");
        let next = first["next"].as_str().expect("a next page").to_string();
        let last = first["items"][1]["id"].as_i64().expect("an id");
        // The cursor as issued reads the next page.
        let (status, second) = served
            .get(&format!("/v1/{list}?limit=2&cursor={next}"), &key)
            .await;
        assert_eq!(status, StatusCode::OK, "{second}");
        assert_eq!(
            second["items"].as_array().map(Vec::len),
            Some(1),
            "{second}"
        );

        // Edited by hand to the id next to it: refused, not another page.
        for id in [last + 1, last - 1] {
            let path = format!(
                "/v1/{list}?limit=2&cursor={}",
                with_id(&next, &id.to_string())
            );
            let (status, json) = served.get(&path, &key).await;
            refused(path, status, json);
        }
        // The same cursor with other filters, or with a filter dropped.
        for filters in ["provider=acme", "user_id=carol"] {
            let path = format!("/v1/{list}?limit=2&{filters}&cursor={next}");
            let (status, json) = served.get(&path, &key).await;
            refused(path, status, json);
        }
        firsts.push((list, next));
    }
    let (status, filtered) = served.get("/v1/runs?limit=1&provider=acme", &key).await;
    assert_eq!(status, StatusCode::OK, "{filtered}");
    let next = filtered["next"].as_str().expect("a next page");
    let path = format!("/v1/runs?limit=1&cursor={next}");
    let (status, json) = served.get(&path, &key).await;
    refused(path, status, json);

    // A cursor another database issued: the same list and filters, refused once this
    // database's id is another (as a copy of another tributary database would have).
    app.execute("UPDATE change_clock SET database_id = '0123456789abcdef0123456789abcdef'")
        .await;
    for (list, next) in firsts {
        let path = format!("/v1/{list}?limit=2&cursor={next}");
        let (status, json) = served.get(&path, &key).await;
        refused(path, status, json);
        // The first page still reads, and its own cursor the next.
        let (status, first) = served.get(&format!("/v1/{list}?limit=2"), &key).await;
        assert_eq!(status, StatusCode::OK, "{first}");
        let next = first["next"].as_str().expect("a next page");
        let (status, second) = served
            .get(&format!("/v1/{list}?limit=2&cursor={next}"), &key)
            .await;
        assert_eq!(status, StatusCode::OK, "{second}");
    }
}

/// The keys listed by the CLI, a page at a time.
#[tokio::test]
async fn api_keys_are_listed_a_page_at_a_time_without_gaps_or_repeats() {
    let app = spawn_app().await;
    let config = app.write_config("");
    let names: Vec<String> = (1..=5).map(|n| format!("key-{n}")).collect();
    for name in &names {
        let created = run(
            tributary(&config).args(["api-keys", "create", "--name", name, "--scope", "admin"])
        );
        assert_eq!(created.code, 0, "{}", created.stderr);
    }
    let list = |args: &[&str]| {
        let mut all = vec!["api-keys", "list", "--limit", "2"];
        all.extend_from_slice(args);
        let output = run(tributary(&config).args(&all));
        assert_eq!(output.code, 0, "{args:?}: {}", output.stderr);
        output.stdout
    };

    // JSON pages, each after the last id of the one before.
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut args = vec!["--json"];
        if let Some(after) = &after {
            args.extend(["--after", after.as_str()]);
        }
        let keys: Value = serde_json::from_str(&list(&args)).expect("JSON");
        let keys = keys.as_array().expect("an array of keys").clone();
        assert!(keys.len() <= 2, "{keys:?}");
        pages += 1;
        if keys.is_empty() {
            break;
        }
        seen.extend(
            keys.iter()
                .map(|key| key["name"].as_str().unwrap_or("").to_string()),
        );
        after = keys.last().map(|key| key["id"].to_string());
        assert!(pages <= names.len(), "paging never ends: {seen:?}");
    }
    assert_eq!(seen, names);

    // The table says where the next page starts, and says nothing on the last.
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut args = Vec::new();
        if let Some(after) = &after {
            args.extend(["--after", after.as_str()]);
        }
        let table = list(&args);
        seen.extend(
            names
                .iter()
                .filter(|name| {
                    table
                        .lines()
                        .any(|line| line.split_whitespace().any(|cell| cell == name.as_str()))
                })
                .cloned(),
        );
        match table.split("add --after ").nth(1) {
            Some(rest) => after = rest.split_whitespace().next().map(str::to_string),
            None => break,
        }
        assert!(seen.len() <= names.len(), "{seen:?}");
    }
    assert_eq!(seen, names);

    let refused = run(tributary(&config).args(["api-keys", "list", "--limit", "0"]));
    assert_ne!(refused.code, 0);
}

/// Two instances on one server database: a key revoked through one is refused by both
/// at their next request, since every request reads the key's row.
#[tokio::test]
async fn a_revoked_key_is_refused_by_every_instance_at_the_next_request() {
    if backend() == Backend::Sqlite {
        return; // One daemon per SQLite file.
    }
    let app = spawn_app().await;
    let providers = three_connections(&app).await;
    let first = Served::start_named(&app, &providers, "first").await;
    let second = Served::start_named(&app, &providers, "second").await;
    let key = first.create_key("shared", &["connections:read"]);
    for instance in [&first, &second] {
        let (status, json) = instance.get("/v1/connections", &key).await;
        assert_eq!(status, StatusCode::OK, "{json}");
    }
    let revoked = run(tributary(&first.config).args(["api-keys", "revoke", "--name", "shared"]));
    assert_eq!(revoked.code, 0, "{}", revoked.stderr);
    for instance in [&first, &second] {
        let (status, json) = instance.get("/v1/connections", &key).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{json}");
    }
}

#[tokio::test]
async fn a_write_is_audited_and_bad_or_oversized_bodies_are_refused_before_any_change() {
    let began = chrono::Utc::now() - chrono::TimeDelta::seconds(1);
    let app = spawn_app().await;
    let providers = three_connections(&app).await;
    let served = Served::start(&app, &providers).await;
    let writer = served.create_key("writer", &["connections:read", "connections:write"]);
    let reader = served.create_key("reader", &["connections:read"]);
    let (_, page) = served.get("/v1/connections?user_id=alice", &writer).await;
    let id = page["items"][0]["id"].as_i64().expect("alice's id");
    let path = format!("/v1/connections/{id}");
    let json_body = |text: &str| Some(("application/json", text.as_bytes().to_vec()));

    let (status, headers, json) = served
        .call(
            Method::PATCH,
            &path,
            Some(&reader),
            json_body(r#"{"paused": true}"#),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{json}");
    assert_problem(status, &headers, &json);

    for (body, field) in [
        (r#"{"paused": true, "token": "x"}"#, Some("token")),
        (r#"{"paused": "yes"}"#, Some("paused")),
        (r#"{"paused": tru"#, Some("paused")),
        ("not json", None),
    ] {
        let (status, headers, json) = served
            .call(Method::PATCH, &path, Some(&writer), json_body(body))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {json}");
        assert_problem(status, &headers, &json);
        assert_eq!(json["field"].as_str(), field, "{body}: {json}");
    }
    let oversized = format!(r#"{{"paused": true, "pad": "{}"}}"#, "x".repeat(4096));
    let (status, headers, json) = served
        .call(Method::PATCH, &path, Some(&writer), json_body(&oversized))
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{json}");
    assert_problem(status, &headers, &json);
    let (status, _, json) = served
        .call(
            Method::PATCH,
            &path,
            Some(&writer),
            Some(("text/plain", b"paused".to_vec())),
        )
        .await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{json}");
    let row = connection::Entity::find_by_id(id)
        .one(&app.db)
        .await
        .unwrap()
        .expect("alice");
    assert!(row.paused_at.is_none(), "a refused write changed the row");

    let (status, _, json) = served
        .call(
            Method::PATCH,
            &path,
            Some(&writer),
            json_body(r#"{"paused": true}"#),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{json}");
    assert!(json["paused_at"].is_string(), "{json}");
    let row = connection::Entity::find_by_id(id)
        .one(&app.db)
        .await
        .unwrap()
        .expect("alice");
    assert!(row.paused_at.is_some(), "the pause was not stored");

    // Every write request left its row: the refused ones too, with their status.
    let audit = audit_rows(&app).await;
    let statuses: Vec<i32> = audit.iter().map(|row| row.3).collect();
    assert_eq!(
        statuses,
        [403, 400, 400, 400, 400, 413, 415, 200],
        "{audit:#?}"
    );
    let keys = query(&app, "SELECT id, name FROM api_keys ORDER BY id").await;
    let writer_id: i64 = keys[0].try_get("", "id").expect("id");
    let reader_id: i64 = keys[1].try_get("", "id").expect("id");
    assert_eq!(
        audit.last(),
        Some(&(Some(writer_id), "PATCH".to_string(), path.clone(), 200))
    );
    assert_eq!(audit[0].0, Some(reader_id), "{audit:#?}");
    // And when: each row's time lies within the test.
    let ended = chrono::Utc::now() + chrono::TimeDelta::seconds(1);
    let times = query(&app, "SELECT at FROM api_audit ORDER BY id").await;
    assert_eq!(times.len(), audit.len());
    for row in times {
        let at: chrono::DateTime<chrono::Utc> = row.try_get("", "at").expect("at");
        assert!(began <= at && at <= ended, "{at} not in {began} .. {ended}");
    }
}

#[tokio::test]
async fn the_openapi_document_describes_every_route_and_the_api_stops_with_the_daemon() {
    let app = spawn_app().await;
    let served = Served::start(&app, &three_connections(&app).await).await;
    let (status, _, doc) = served
        .call(Method::GET, "/v1/openapi.json", None, None)
        .await;
    assert_eq!(status, StatusCode::OK, "{doc}");
    assert_eq!(doc["openapi"], "3.1.0");
    for (path, method) in [
        ("/v1/connections", "get"),
        ("/v1/connections/{id}", "get"),
        ("/v1/connections/{id}", "patch"),
        ("/v1/runs", "get"),
        ("/v1/runs/{id}", "get"),
        ("/v1/runs/{id}/errors", "get"),
        ("/v1/runs/{id}/replay", "post"),
        ("/v1/errors", "get"),
        ("/v1/changes", "get"),
        ("/v1/changes/head", "get"),
        ("/v1/changes/readers", "get"),
        ("/v1/jobs", "get"),
        ("/v1/notifications", "get"),
        ("/v1/notifications/{id}/redeliver", "post"),
        ("/v1/health", "get"),
        ("/v1/openapi.json", "get"),
    ] {
        assert!(doc["paths"][path][method].is_object(), "{method} {path}");
    }
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    assert!(doc["components"]["schemas"]["Problem"].is_object());
    let limit = doc["paths"]["/v1/connections"]["get"]["parameters"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == "limit"))
        .expect("limit documented");
    assert_eq!(limit["in"], "query");
    // Every documented operation is served: without a key it is refused, not missing,
    // unless the document names no security for it.
    for (path, operations) in doc["paths"].as_object().expect("paths") {
        for (method, operation) in operations.as_object().expect("operations") {
            let method = Method::from_bytes(method.to_uppercase().as_bytes()).expect("method");
            let (status, _, json) = served
                .call(method.clone(), &path.replace("{id}", "1"), None, None)
                .await;
            let expected = match operation.get("security") {
                // The webhook receiver authenticates by signature: for a provider that
                // receives none its own handler answers 404, which the router's would not
                // explain.
                None if path.contains("{provider}") => {
                    let detail = json["detail"].as_str().unwrap_or_default();
                    assert!(detail.contains("receives webhooks"), "{path}: {json}");
                    StatusCode::NOT_FOUND
                }
                None => StatusCode::OK,
                Some(_) => StatusCode::UNAUTHORIZED,
            };
            assert_eq!(status, expected, "{method} {path}: {json}");
        }
    }

    // SIGTERM stops the API with the daemon, cleanly.
    let mut served = served;
    served.daemon.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(
        served.daemon.wait(Duration::from_secs(15)),
        0,
        "{}",
        served.daemon.log()
    );
    let log = served.daemon.log();
    assert!(log.contains("The API stopped serving."), "{log}");
    assert!(
        served
            .client
            .get(format!("{}/v1/openapi.json", served.base))
            .send()
            .await
            .is_err(),
        "the API still answers"
    );
}

/// Providers synced once a year: `acme` with two streams for alice, `records` (two
/// items on `/v1/items`) and `archive` (one item, `archive0`, on `/v1/archive`), and
/// `beta` with `records` for bob (one item).
pub(crate) async fn two_streams_and_two_providers(app: &TestApp) -> String {
    use wiremock::matchers::{header, method, path};
    mount_cursor_listing(&app.api, "alice", "alice", 1, 2, Duration::ZERO).await;
    mount_cursor_listing(&app.api, "bob", "bob", 1, 1, Duration::ZERO).await;
    wiremock::Mock::given(method("GET"))
        .and(path("/v1/archive"))
        .and(header("authorization", "Bearer token-alice"))
        .respond_with(wiremock::ResponseTemplate::new(200).set_body_json(
            serde_json::json!({"data": crate::helpers::items("archive", "alice", 0..1)}),
        ))
        .mount(&app.api)
        .await;
    let acme = cursor_provider("acme", &app.api.uri(), &["alice"]).replacen(
        "kind = \"rest\"\n",
        "kind = \"rest\"\nstreams = [\"records\", \"archive\"]\n",
        1,
    );
    let beta = cursor_provider("beta", &app.api.uri(), &["bob"]);
    format!("{acme}[providers.acme.resources.archive]\npath = \"/v1/archive\"\n{beta}").replace(
        "schedule = \"0 */15 * * * *\"",
        "schedule = \"0 0 0 1 1 *\"",
    )
}

#[tokio::test]
async fn a_sync_asked_for_one_stream_runs_it_only_and_runs_are_filtered_by_each_parameter() {
    use tributary::entities::sync_job::{self, JobStatus};
    let app = spawn_app().await;
    let providers = two_streams_and_two_providers(&app).await;
    let served = Served::start(&app, &providers).await;
    let syncs = served.create_key("syncer", &["syncs:write"]);
    let reader = served.create_key("reader", &["connections:read"]);
    let id_of = |user: &'static str| {
        let app = &app;
        async move {
            query(
                app,
                &format!("SELECT id FROM connections WHERE user_id = '{user}'"),
            )
            .await[0]
                .try_get_by_index::<i64>(0)
                .expect("the connection's id")
        }
    };
    let (alice, bob) = (id_of("alice").await, id_of("bob").await);
    let json = |text: &str| Some(("application/json", text.as_bytes().to_vec()));
    let sync = |id: i64, body: &'static str| {
        let (served, syncs, app) = (&served, &syncs, &app);
        async move {
            let (status, _, job) = served
                .call(
                    Method::POST,
                    &format!("/v1/connections/{id}/syncs"),
                    Some(syncs),
                    json(body),
                )
                .await;
            assert_eq!(status, StatusCode::ACCEPTED, "{job}");
            let job_id = job["job_id"].as_i64().expect("a job id");
            crate::daemon::eventually(Duration::from_secs(20), "the job run", || async {
                sync_job::Entity::find_by_id(job_id)
                    .one(&app.db)
                    .await
                    .expect("sync_jobs")
                    .is_some_and(|job| job.status == JobStatus::Done)
            })
            .await;
        }
    };

    // One stream asked for: its run only, its records only, its listing only asked.
    sync(alice, r#"{"stream": "archive"}"#).await;
    let runs = crate::daemon::runs_of(&app, "alice").await;
    let streams: Vec<Option<&str>> = runs.iter().map(|run| run.stream.as_deref()).collect();
    assert_eq!(streams, [Some("archive")], "{runs:?}");
    assert_eq!(app.record_ids().await, ["archive0"]);
    let asked: Vec<String> = app
        .api
        .received_requests()
        .await
        .unwrap_or_default()
        .iter()
        .map(|request| request.url.path().to_string())
        .collect();
    assert_eq!(asked, ["/v1/archive"]);

    // Then every stream of both: the runs' filters each keep their own runs only.
    sync(alice, "{}").await;
    sync(bob, "{}").await;
    let listed = |filters: &'static str| {
        let (served, reader) = (&served, &reader);
        async move {
            let (status, page) = served.get(&format!("/v1/runs?{filters}"), reader).await;
            assert_eq!(status, StatusCode::OK, "{filters}: {page}");
            let mut runs: Vec<String> = page["items"]
                .as_array()
                .expect("items")
                .iter()
                .map(|run| format!("{} {} {}", run["provider"], run["user_id"], run["stream"]))
                .collect();
            runs.sort();
            runs.join(", ").replace('"', "")
        }
    };
    assert_eq!(
        listed("limit=10").await,
        "acme alice archive, acme alice archive, acme alice records, beta bob records"
    );
    assert_eq!(listed("provider=beta").await, "beta bob records");
    assert_eq!(listed("user_id=bob").await, "beta bob records");
    assert_eq!(
        listed("stream=archive").await,
        "acme alice archive, acme alice archive"
    );
    assert_eq!(
        listed("stream=records").await,
        "acme alice records, beta bob records"
    );
    assert_eq!(
        listed("provider=acme&user_id=alice&stream=records").await,
        "acme alice records"
    );
    assert_eq!(listed("provider=beta&stream=archive").await, "");
    assert_eq!(listed("user_id=carol").await, "");
}

#[tokio::test]
async fn a_sync_asked_for_is_queued_as_a_job_that_the_daemon_runs() {
    use tributary::entities::sync_job::{self, JobKind, JobStatus};
    let app = spawn_app().await;
    crate::helpers::mount_cursor_listing(&app.api, "alice", "alice", 1, 1, Duration::ZERO).await;
    // Synced once a year: only the job asked for runs.
    let providers = three_connections(&app).await.replace(
        "schedule = \"0 */15 * * * *\"",
        "schedule = \"0 0 0 1 1 *\"",
    );
    let served = Served::start(&app, &providers).await;
    let syncs = served.create_key("syncer", &["syncs:write"]);
    let reader = served.create_key("reader", &["connections:read"]);
    let alice: i64 = query(&app, "SELECT id FROM connections WHERE user_id = 'alice'").await[0]
        .try_get_by_index(0)
        .expect("alice's id");
    let json = |text: &str| Some(("application/json", text.as_bytes().to_vec()));
    let path = format!("/v1/connections/{alice}/syncs");

    let (status, headers, body) = served
        .call(Method::POST, &path, Some(&reader), json("{}"))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_problem(status, &headers, &body);
    let (status, headers, body) = served
        .call(
            Method::POST,
            &path,
            Some(&syncs),
            json(r#"{"stream": "wikis"}"#),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_problem(status, &headers, &body);
    assert!(
        body["detail"]
            .as_str()
            .is_some_and(|detail| detail.contains("syncs no stream named \"wikis\"")),
        "{body}"
    );
    let (status, _, body) = served
        .call(
            Method::POST,
            "/v1/connections/999999/syncs",
            Some(&syncs),
            json("{}"),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, _, body) = served
        .call(Method::POST, &path, Some(&syncs), json(r#"{"fast": true}"#))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let jobs = || async { sync_job::Entity::find().all(&app.db).await.expect("jobs") };
    assert!(
        jobs().await.is_empty(),
        "nothing queued by a refused request"
    );

    let (status, _, body) = served
        .call(Method::POST, &path, Some(&syncs), json(r#"{"full": true}"#))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["connection_id"], alice);
    assert_eq!(
        (&body["user_id"], &body["status"], &body["full"]),
        (&"alice".into(), &"queued".into(), &true.into())
    );
    let job_id = body["job_id"].as_i64().expect("a job id");
    crate::daemon::eventually(Duration::from_secs(20), "the job run", || async {
        jobs()
            .await
            .iter()
            .any(|job| job.id == job_id && job.status == JobStatus::Done)
    })
    .await;
    let job = jobs()
        .await
        .into_iter()
        .find(|job| job.id == job_id)
        .expect("the job");
    assert_eq!((job.kind, job.full), (JobKind::Manual, true));
    let runs = crate::daemon::runs_of(&app, "alice").await;
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(
        runs[0].status,
        tributary::entities::sync_run::RunStatus::Succeeded
    );
    assert_eq!(app.record_ids().await, ["alice0"]);
    let audit = audit_rows(&app).await;
    assert!(
        audit
            .iter()
            .any(|(_, method, audited, status)| method == "POST"
                && *audited == path
                && *status == 202),
        "{audit:?}"
    );
}
