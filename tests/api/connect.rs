//! Connect: sessions made through the API, the page their link opens, and the key form,
//! over HTTP against a daemon and a provider on wiremock that answers as Stripe's docs say.

use reqwest::header::HeaderMap;
use reqwest::{Method, StatusCode};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
use serde_json::json;
use tributary::entities::{connection, sync_job};
use wiremock::matchers::{header, method, path, query_param};
use wiremock::{Mock, ResponseTemplate};

use crate::helpers::{spawn_app, TestApp};
use crate::http::{assert_problem, query, Served};

pub(crate) const RETURN_URL: &str = "http://127.0.0.1:9/connected";
const GOOD_KEY: &str = "sk_test_good_4eC39HqLyjWDarjtT1zdp7dc";
const STRIPE_ACCOUNT: &str = "acct_1032D82eZvKYlo2C";

/// A Stripe provider on the app's wiremock, synced once a year, retrying fast.
pub(crate) fn stripe_provider(app: &TestApp) -> String {
    format!(
        "\n[providers.stripe]\nkind = \"stripe\"\nbase_url = \"{}\"\nschedule = \"0 0 0 1 1 *\"\n[providers.stripe.http]\nmax_retries = 1\nretry_initial_delay = \"1ms\"\nretry_max_delay = \"5ms\"\n",
        app.api.uri()
    )
}

/// The config with `[connect]` whose `public_url` is the daemon's own address.
pub(crate) fn with_connect(return_url: &str) -> impl FnOnce(String) -> String + '_ {
    move |text: String| {
        let listen = text
            .lines()
            .find_map(|line| line.strip_prefix("listen = \""))
            .and_then(|rest| rest.strip_suffix('"'))
            .expect("[api] listen")
            .to_string();
        format!(
            "{text}\n[connect]\npublic_url = \"http://{listen}\"\nreturn_urls = [\"{return_url}\"]\n"
        )
    }
}

pub(crate) async fn serve_stripe(app: &TestApp, return_url: &str) -> Served {
    Served::start_with(
        app,
        &stripe_provider(app),
        "daemon",
        with_connect(return_url),
    )
    .await
}

/// POST `body` as JSON to `path` with `key`.
pub(crate) async fn post_json(
    served: &Served,
    path: &str,
    key: &str,
    body: &serde_json::Value,
) -> (StatusCode, HeaderMap, serde_json::Value) {
    let body = ("application/json", body.to_string().into_bytes());
    served.call(Method::POST, path, Some(key), Some(body)).await
}

/// A session's link for `user`, made with an admin key.
async fn session(served: &Served, key: &str, user: &str) -> String {
    session_to(served, key, user, RETURN_URL).await
}

/// A session's link for `user` to connect Stripe, sending the browser to `return_url`.
pub(crate) async fn session_to(served: &Served, key: &str, user: &str, return_url: &str) -> String {
    session_for(served, key, user, "stripe", return_url).await
}

/// A session's link for `user` to connect `provider`, going back to `return_url`.
pub(crate) async fn session_for(
    served: &Served,
    key: &str,
    user: &str,
    provider: &str,
    return_url: &str,
) -> String {
    session_offering(served, key, user, &[provider], return_url).await
}

/// A session's link for `user` to connect any of `providers`, going back to `return_url`.
pub(crate) async fn session_offering(
    served: &Served,
    key: &str,
    user: &str,
    providers: &[&str],
    return_url: &str,
) -> String {
    let body = json!({"user_id": user, "providers": providers, "return_url": return_url});
    let (status, _, created) = post_json(served, "/v1/connect/sessions", key, &body).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    created["url"].as_str().expect("url").to_string()
}

/// Every one of `parts` is in `text`.
pub(crate) fn assert_contains_all(text: &str, parts: &[&str]) {
    for part in parts {
        assert!(text.contains(part), "{part:?} is not in {text}");
    }
}

/// None of `secrets` (keys, codes, states, cookies, client secrets, link tokens) is in
/// the daemon's `log`.
pub(crate) fn assert_no_secret_in(log: &str, secrets: &[&str]) {
    assert!(!log.is_empty(), "an empty log proves nothing");
    for secret in secrets {
        assert!(secret.len() >= 8, "too short to be a secret: {secret:?}");
        assert!(!log.contains(secret), "{secret:?} is in the log:\n{log}");
    }
}

fn browser() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
}

/// GET `url` with `cookie`: status, headers, body.
pub(crate) async fn get(url: &str, cookie: Option<&str>) -> (StatusCode, HeaderMap, String) {
    send(browser().get(url), cookie).await
}

/// POST a urlencoded `body` to `url` with `cookie`.
pub(crate) async fn post(
    url: &str,
    cookie: Option<&str>,
    body: String,
) -> (StatusCode, HeaderMap, String) {
    let request = browser()
        .post(url)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body);
    send(request, cookie).await
}

async fn send(
    mut request: reqwest::RequestBuilder,
    cookie: Option<&str>,
) -> (StatusCode, HeaderMap, String) {
    if let Some(cookie) = cookie {
        request = request.header("cookie", cookie);
    }
    let response = request.send().await.expect("answer");
    let status = response.status();
    let headers = response.headers().clone();
    (status, headers, response.text().await.expect("body"))
}

/// Opens the link: the cookie it set (`name=value`), and the page.
pub(crate) async fn open(url: &str) -> (String, String) {
    let (status, headers, page) = get(url, None).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let set = headers["set-cookie"].to_str().expect("cookie").to_string();
    let cookie = set.split(';').next().expect("pair").to_string();
    (cookie, page)
}

/// A daemon with Stripe, a session's link for user `u1` opened, and Stripe's key form:
/// the daemon, the link, the cookie and the form's CSRF token.
async fn stripe_form(app: &TestApp) -> (Served, String, String, String) {
    let served = serve_stripe(app, RETURN_URL).await;
    let admin = served.create_key("admin", &["admin"]);
    let url = session(&served, &admin, "u1").await;
    let (cookie, _) = open(&url).await;
    let (_, _, form_page) = get(&format!("{url}/stripe"), Some(&cookie)).await;
    let csrf = csrf_of(&form_page);
    (served, url, cookie, csrf)
}

/// The form's CSRF token.
pub(crate) fn csrf_of(page: &str) -> String {
    let start = page.find("name=\"csrf\" value=\"").expect("csrf field") + 19;
    page[start..]
        .split('"')
        .next()
        .expect("csrf value")
        .to_string()
}

/// Posts `key` with `csrf` to Stripe's form of link `url`, as the browser with `cookie`.
pub(crate) async fn submit(
    url: &str,
    cookie: &str,
    csrf: &str,
    key: &str,
) -> (StatusCode, HeaderMap, String) {
    post(&format!("{url}/stripe"), Some(cookie), form(csrf, key)).await
}

fn form(csrf: &str, key: &str) -> String {
    form_urlencoded::Serializer::new(String::new())
        .append_pair("csrf", csrf)
        .append_pair("key", key)
        .finish()
}

pub(crate) async fn connections_of(app: &TestApp, user: &str) -> Vec<connection::Model> {
    connection::Entity::find()
        .filter(connection::Column::UserId.eq(user))
        .all(&app.db)
        .await
        .expect("connections")
}

/// The sync jobs of connection `id`.
pub(crate) async fn jobs_of(app: &TestApp, id: i64) -> Vec<sync_job::Model> {
    sync_job::Entity::find()
        .filter(sync_job::Column::ConnectionId.eq(id))
        .all(&app.db)
        .await
        .expect("jobs")
}

/// `connect_sessions` as (used, bound) per row.
pub(crate) async fn sessions(app: &TestApp) -> Vec<(bool, bool)> {
    query(
        app,
        "SELECT used_at IS NOT NULL AS used, binding_hash IS NOT NULL AS bound FROM connect_sessions ORDER BY id",
    )
    .await
    .iter()
    .map(|row| {
        let flag = |column: &str| {
            row.try_get::<bool>("", column)
                .or_else(|_| row.try_get::<i64>("", column).map(|v| v != 0))
                .or_else(|_| row.try_get::<i32>("", column).map(|v| v != 0))
                .expect(column)
        };
        (flag("used"), flag("bound"))
    })
    .collect()
}

pub(crate) async fn mount_charges(app: &TestApp, key: &str, answer: ResponseTemplate, times: u64) {
    Mock::given(method("GET"))
        .and(path("/v1/charges"))
        .and(query_param("limit", "1"))
        .and(header("authorization", format!("Bearer {key}").as_str()))
        .respond_with(answer)
        .expect(times)
        .mount(&app.api)
        .await;
}

pub(crate) fn empty_list() -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(
        json!({"object": "list", "data": [], "has_more": false, "url": "/v1/charges"}),
    )
}

#[tokio::test]
async fn a_session_is_made_for_an_allowed_return_url_and_provider_and_bad_input_is_refused() {
    let app = spawn_app().await;
    let served = serve_stripe(&app, RETURN_URL).await;
    let admin = served.create_key("admin", &["admin"]);
    let reader = served.create_key("reader", &["connections:read"]);
    let started = chrono::Utc::now();
    let body = json!({"user_id": "u1", "providers": ["stripe"], "return_url": RETURN_URL});
    let (status, _, created) = post_json(&served, "/v1/connect/sessions", &admin, &body).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let url = created["url"].as_str().expect("url");
    let token = url
        .strip_prefix(&format!("{}/connect/", served.base))
        .expect("a link on public_url");
    assert!(token.len() >= 40, "{token}");
    let expires: chrono::DateTime<chrono::Utc> = created["expires_at"]
        .as_str()
        .expect("expiry")
        .parse()
        .expect("RFC 3339");
    let ttl = expires.signed_duration_since(started);
    assert!(
        ttl > chrono::TimeDelta::minutes(29) && ttl <= chrono::TimeDelta::minutes(31),
        "{ttl}"
    );
    // The row keeps a hash, never the token.
    for row in query(
        &app,
        "SELECT token_hash, user_id, providers, return_url FROM connect_sessions",
    )
    .await
    {
        let hash: String = row.try_get("", "token_hash").expect("hash");
        assert_eq!(hash.len(), 64);
        assert!(!hash.contains(token));
        let providers: String = row.try_get("", "providers").expect("providers");
        assert_eq!(providers, "[\"stripe\"]");
    }

    for (body, field) in [
        (
            json!({"user_id": "u1", "providers": ["stripe"], "return_url": "https://evil.example/x"}),
            "return_url",
        ),
        (
            json!({"user_id": "u1", "providers": ["stripe"], "return_url": format!("{RETURN_URL}/")}),
            "return_url",
        ),
        (
            json!({"user_id": "u1", "providers": ["nope"], "return_url": RETURN_URL}),
            "providers",
        ),
        (
            json!({"user_id": "u1", "providers": [], "return_url": RETURN_URL}),
            "providers",
        ),
        (
            json!({"user_id": " ", "providers": ["stripe"], "return_url": RETURN_URL}),
            "user_id",
        ),
        (
            json!({"user_id": "a\u{1}b", "providers": ["stripe"], "return_url": RETURN_URL}),
            "user_id",
        ),
        (
            json!({"user_id": "u1", "providers": ["stripe"], "return_url": RETURN_URL, "reconnect": 99}),
            "reconnect",
        ),
    ] {
        let (status, headers, problem) =
            post_json(&served, "/v1/connect/sessions", &admin, &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {problem}");
        assert_problem(status, &headers, &problem);
        assert_eq!(problem["field"], field, "{body}: {problem}");
    }
    let (status, headers, problem) =
        post_json(&served, "/v1/connect/sessions", &reader, &body).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{problem}");
    assert_problem(status, &headers, &problem);
    assert_eq!(
        query(&app, "SELECT id FROM connect_sessions").await.len(),
        1
    );
}

#[tokio::test]
async fn the_page_offers_each_provider_and_refuses_other_browsers_expired_used_and_unknown_links() {
    let app = spawn_app().await;
    let served = serve_stripe(&app, RETURN_URL).await;
    let admin = served.create_key("admin", &["admin"]);
    let url = session(&served, &admin, "u1").await;

    let (status, headers, page) = get(&url, None).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(headers["content-type"]
        .to_str()
        .expect("type")
        .starts_with("text/html"));
    let policy = headers["content-security-policy"].to_str().expect("CSP");
    assert_contains_all(
        policy,
        &[
            "default-src 'none'",
            "style-src 'sha256-",
            "form-action 'self'",
            "frame-ancestors 'none'",
        ],
    );
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert_eq!(headers["referrer-policy"], "no-referrer");
    assert_eq!(headers["cache-control"], "no-store");
    let cookie = headers["set-cookie"].to_str().expect("cookie");
    assert_contains_all(
        cookie,
        &[
            "tributary_connect=",
            "HttpOnly",
            "SameSite=Lax",
            "Path=/connect/",
        ],
    );
    assert!(
        !cookie.contains("Secure"),
        "plain http on loopback: {cookie}"
    );
    assert_contains_all(
        &page,
        &[
            "<html lang=\"en\">",
            "name=\"viewport\"",
            "Connect stripe",
            "<button",
            "<title>",
        ],
    );
    assert!(!page.contains("<script"), "{page}");
    let pair = cookie.split(';').next().expect("pair").to_string();
    let (status, _, again) = get(&url, Some(&pair)).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    // Another browser (no cookie, or another one) is refused.
    for other in [None, Some("tributary_connect=forged")] {
        let (status, headers, page) = get(&url, other).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{page}");
        assert!(page.contains("another browser"), "{page}");
        assert!(headers.get("set-cookie").is_none());
    }

    let (status, headers, page) = get(&format!("{}/connect/not-a-token", served.base), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{page}");
    assert!(page.contains("not known"), "{page}");
    assert!(headers["content-type"]
        .to_str()
        .expect("type")
        .starts_with("text/html"));

    let expired = session(&served, &admin, "u2").await;
    let used = session(&served, &admin, "u3").await;
    let backend = app.db.get_database_backend();
    let past = match backend {
        sea_orm::DbBackend::Sqlite => "'2000-01-01 00:00:00+00:00'",
        _ => "'2000-01-01 00:00:00'",
    };
    query(
        &app,
        &format!("UPDATE connect_sessions SET expires_at = {past} WHERE user_id = 'u2'"),
    )
    .await;
    query(
        &app,
        &format!("UPDATE connect_sessions SET used_at = {past} WHERE user_id = 'u3'"),
    )
    .await;
    let before = sessions(&app).await;
    for (link, words) in [(&expired, "expired"), (&used, "used already")] {
        let (status, headers, page) = get(link, None).await;
        assert_eq!(status, StatusCode::GONE, "{page}");
        assert!(page.contains(words), "{page}");
        assert!(headers.get("set-cookie").is_none());
        let (status, _, page) = get(&format!("{link}/stripe"), None).await;
        assert_eq!(status, StatusCode::GONE, "{page}");
    }
    assert_eq!(
        sessions(&app).await,
        before,
        "a refused link stores nothing"
    );
    assert_eq!(before, vec![(false, true), (false, false), (true, false)]);
    // No link's token and no cookie in the log.
    let mut secrets: Vec<&str> = [&url, &expired, &used]
        .map(|link| link.rsplit('/').next().expect("token"))
        .to_vec();
    secrets.push(pair.split_once('=').expect("name=value").1);
    assert_no_secret_in(&served.daemon.log(), &secrets);
}

#[tokio::test]
async fn a_good_key_is_checked_once_sealed_its_sync_queued_and_the_browser_sent_back() {
    let app = spawn_app().await;
    mount_charges(&app, GOOD_KEY, empty_list(), 1).await;
    // Stripe's `GET /v1/account`: the account the key belongs to.
    Mock::given(method("GET"))
        .and(path("/v1/account"))
        .and(header(
            "authorization",
            format!("Bearer {GOOD_KEY}").as_str(),
        ))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!({"id": STRIPE_ACCOUNT, "object": "account", "country": "US"})),
        )
        .expect(1)
        .mount(&app.api)
        .await;
    let served = serve_stripe(&app, RETURN_URL).await;
    let admin = served.create_key("admin", &["admin"]);
    let url = session(&served, &admin, "u1").await;
    let (cookie, page) = open(&url).await;
    assert!(
        page.contains(&format!(
            "action=\"{}",
            url.trim_start_matches(&served.base)
        )),
        "{page}"
    );
    let (status, headers, form_page) = get(&format!("{url}/stripe"), Some(&cookie)).await;
    assert_eq!(status, StatusCode::OK, "{form_page}");
    let policy = headers["content-security-policy"].to_str().expect("CSP");
    assert!(
        policy.contains("form-action 'self' http://127.0.0.1:9"),
        "{policy}"
    );
    assert!(form_page.contains("<label for=\"key\""), "{form_page}");
    let csrf = csrf_of(&form_page);

    let (status, headers, body) = submit(&url, &cookie, &csrf, GOOD_KEY).await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    assert_eq!(
        headers["location"],
        format!("{RETURN_URL}?outcome=connected")
    );
    let rows = connections_of(&app, "u1").await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].provider, "stripe");
    assert!(
        !rows[0].credentials.contains(GOOD_KEY),
        "sealed: {}",
        rows[0].credentials
    );
    let stored = app.stored_credentials("u1", "stripe").await;
    assert_eq!(stored.token.as_deref(), Some(GOOD_KEY));
    let jobs = jobs_of(&app, rows[0].id).await;
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(sessions(&app).await, vec![(true, true)]);

    // Single use: the link and its form are gone.
    let (status, _, page) = submit(&url, &cookie, &csrf, GOOD_KEY).await;
    assert_eq!(status, StatusCode::GONE, "{page}");
    let (status, _, _) = get(&url, Some(&cookie)).await;
    assert_eq!(status, StatusCode::GONE);
    // Neither the token nor the key reached the log or the audit.
    let token = url.rsplit('/').next().expect("token");
    let log = served.daemon.log();
    assert!(!log.contains(token) && !log.contains(GOOD_KEY), "{log}");
    let audit = crate::http::audit_rows(&app).await;
    assert!(
        audit
            .iter()
            .any(|(_, _, path, status)| path == "/connect/{token}/stripe" && *status == 303),
        "{audit:?}"
    );
    assert!(
        audit.iter().all(|(_, _, path, _)| !path.contains(token)),
        "{audit:?}"
    );

    // The Stripe account the key belongs to, from `GET /v1/account`, in the row, the
    // API's connection object and `connections list --json`.
    assert_eq!(rows[0].account_id.as_deref(), Some(STRIPE_ACCOUNT));
    let reader = served.create_key("reader", &["connections:read"]);
    let (status, listed) = served.get("/v1/connections?user_id=u1", &reader).await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    assert_eq!(listed["items"][0]["account_id"], STRIPE_ACCOUNT);
    let output = crate::helpers::run(crate::helpers::tributary(&served.config).args([
        "connections",
        "list",
        "--json",
    ]));
    assert_eq!(output.code, 0, "{}", output.stderr);
    let listed: serde_json::Value = serde_json::from_str(&output.stdout).expect("JSON");
    assert_eq!(listed[0]["account_id"], STRIPE_ACCOUNT, "{listed}");
}

#[tokio::test]
async fn a_refused_key_or_a_failing_provider_stores_nothing_and_the_page_says_so() {
    let app = spawn_app().await;
    let refused = json!({"error": {"type": "invalid_request_error", "message": "Invalid API Key provided: sk_test_****"}});
    // A refused key is never retried; a 500 and an HTML page are, once (`max_retries`).
    mount_charges(
        &app,
        "sk_test_bad",
        ResponseTemplate::new(401).set_body_json(refused),
        1,
    )
    .await;
    mount_charges(
        &app,
        "sk_test_down",
        ResponseTemplate::new(500).set_body_string("oops"),
        2,
    )
    .await;
    mount_charges(
        &app,
        "sk_test_html",
        ResponseTemplate::new(200)
            .set_body_raw("<html><body>Maintenance</body></html>", "text/html"),
        2,
    )
    .await;
    let (served, url, cookie, csrf) = stripe_form(&app).await;

    let (status, _, page) = submit(&url, &cookie, &csrf, "sk_test_bad").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
    assert!(page.contains("stripe refused this key"), "{page}");
    assert!(
        page.contains("name=\"key\""),
        "the form is shown again: {page}"
    );
    assert!(!page.contains("sk_test_bad"), "{page}");
    for key in ["sk_test_down", "sk_test_html"] {
        let (status, _, page) = submit(&url, &cookie, &csrf, key).await;
        assert_eq!(status, StatusCode::BAD_GATEWAY, "{key}: {page}");
        assert!(page.contains("could not check the key"), "{page}");
    }
    let (status, _, page) = post(&format!("{url}/stripe"), Some(&cookie), form(&csrf, "  ")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
    assert!(page.contains("paste the key first"), "{page}");
    assert!(connections_of(&app, "u1").await.is_empty());
    assert_eq!(
        sessions(&app).await,
        vec![(false, true)],
        "the session is still open"
    );
    let log = served.daemon.log();
    assert!(
        !log.contains("sk_test_bad") && !log.contains("sk_test_down"),
        "{log}"
    );
}

#[tokio::test]
async fn a_form_without_its_cookie_or_csrf_token_or_with_repeated_or_oversized_fields_is_refused() {
    let app = spawn_app().await;
    mount_charges(&app, GOOD_KEY, empty_list(), 0).await;
    let (served, url, cookie, csrf) = stripe_form(&app).await;
    let action = format!("{url}/stripe");
    let other_csrf = "0".repeat(64);
    let repeated = format!("{}&key=again", form(&csrf, GOOD_KEY));
    let unknown = format!("{}&extra=1", form(&csrf, GOOD_KEY));
    let cases: Vec<(Option<&str>, String, StatusCode, &str)> = vec![
        (
            None,
            form(&csrf, GOOD_KEY),
            StatusCode::FORBIDDEN,
            "another browser",
        ),
        (
            Some("tributary_connect=forged"),
            form(&csrf, GOOD_KEY),
            StatusCode::FORBIDDEN,
            "another browser",
        ),
        (
            Some(&cookie),
            format!("key={GOOD_KEY}"),
            StatusCode::FORBIDDEN,
            "not sent from this page",
        ),
        (
            Some(&cookie),
            form(&other_csrf, GOOD_KEY),
            StatusCode::FORBIDDEN,
            "not sent from this page",
        ),
        (
            Some(&cookie),
            repeated,
            StatusCode::BAD_REQUEST,
            "more than once",
        ),
        (
            Some(&cookie),
            unknown,
            StatusCode::BAD_REQUEST,
            "unknown field",
        ),
    ];
    for (cookie, body, expected, words) in cases {
        let (status, _, page) = post(&action, cookie, body.clone()).await;
        assert_eq!(status, expected, "{body}: {page}");
        assert!(page.contains(words), "{words}: {page}");
    }
    // A body past [api] max_body_bytes (1 KiB here) is refused before it is read.
    let (status, _, _) = post(&action, Some(&cookie), form(&csrf, &"k".repeat(4096))).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    // A provider the session does not offer.
    let (status, _, page) = get(&format!("{url}/github"), Some(&cookie)).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{page}");
    assert!(page.contains("does not connect github"), "{page}");
    assert!(connections_of(&app, "u1").await.is_empty());
    assert_eq!(sessions(&app).await, vec![(false, true)]);
    let oversized = "k".repeat(4096);
    assert_no_secret_in(
        &served.daemon.log(),
        &[
            GOOD_KEY,
            &csrf,
            cookie.split_once('=').expect("name=value").1,
            url.rsplit('/').next().expect("token"),
            &oversized,
        ],
    );
}

/// A daemon with Stripe (its key check answering once for [`GOOD_KEY`]), an admin key,
/// and u1's Stripe connection made over the API with an old key: the daemon, the key and
/// the connection's id.
async fn stripe_and_a_connection_of_u1(app: &TestApp) -> (Served, String, i64) {
    mount_charges(app, GOOD_KEY, empty_list(), 1).await;
    let served = serve_stripe(app, RETURN_URL).await;
    let admin = served.create_key("admin", &["admin"]);
    let body = json!({"provider": "stripe", "user_id": "u1", "token": "sk_test_old"});
    let (status, _, created) = post_json(&served, "/v1/connections", &admin, &body).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["id"].as_i64().expect("id");
    (served, admin, id)
}

#[tokio::test]
async fn a_reconnect_replaces_the_key_and_keeps_the_connection() {
    let app = spawn_app().await;
    let (served, admin, id) = stripe_and_a_connection_of_u1(&app).await;
    let body = json!({"user_id": "u1", "providers": ["stripe"], "return_url": RETURN_URL, "reconnect": id});
    let (status, _, session) = post_json(&served, "/v1/connect/sessions", &admin, &body).await;
    assert_eq!(status, StatusCode::CREATED, "{session}");
    let url = session["url"].as_str().expect("url");
    let (cookie, page) = open(url).await;
    assert!(page.contains("Reconnect"), "{page}");
    let (_, _, form_page) = get(&format!("{url}/stripe"), Some(&cookie)).await;
    let (status, headers, body) = submit(url, &cookie, &csrf_of(&form_page), GOOD_KEY).await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    assert_eq!(
        headers["location"],
        format!("{RETURN_URL}?outcome=connected")
    );
    let rows = connections_of(&app, "u1").await;
    assert_eq!(rows.iter().map(|row| row.id).collect::<Vec<_>>(), vec![id]);
    let stored = app.stored_credentials("u1", "stripe").await;
    assert_eq!(stored.token.as_deref(), Some(GOOD_KEY));
}

/// A user who already has a connection at the provider, connecting again without
/// `reconnect`: the key is checked, nothing is written, and the browser goes back with
/// `outcome=error&code=already_connected`.
#[tokio::test]
async fn a_second_connection_of_one_user_and_provider_is_sent_back_as_already_connected() {
    let app = spawn_app().await;
    let (served, admin, _) = stripe_and_a_connection_of_u1(&app).await;
    let url = session(&served, &admin, "u1").await;
    let (cookie, _) = open(&url).await;
    let (_, _, form_page) = get(&format!("{url}/stripe"), Some(&cookie)).await;
    let (status, headers, body) = submit(&url, &cookie, &csrf_of(&form_page), GOOD_KEY).await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    assert_eq!(
        headers["location"],
        format!("{RETURN_URL}?outcome=error&code=already_connected")
    );
    let rows = connections_of(&app, "u1").await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let stored = app.stored_credentials("u1", "stripe").await;
    assert_eq!(
        stored.token.as_deref(),
        Some("sk_test_old"),
        "the old key stays"
    );
    let jobs = sync_job::Entity::find()
        .filter(sync_job::Column::ConnectionId.eq(rows[0].id))
        .all(&app.db)
        .await
        .expect("jobs");
    assert!(jobs.is_empty(), "no sync queued: {jobs:?}");
}

#[tokio::test]
async fn the_sweep_deletes_expired_sessions_and_keeps_live_ones() {
    let app = spawn_app().await;
    let now = chrono::Utc::now();
    for (hash, expires) in [
        ("a", now - chrono::TimeDelta::minutes(1)),
        ("b", now + chrono::TimeDelta::minutes(10)),
    ] {
        use sea_orm::sea_query::{Alias, Query};
        let insert = Query::insert()
            .into_table(Alias::new("connect_sessions"))
            .columns(
                [
                    "token_hash",
                    "user_id",
                    "providers",
                    "return_url",
                    "created_at",
                    "expires_at",
                ]
                .map(Alias::new),
            )
            .values_panic([
                hash.repeat(64).into(),
                "u".into(),
                "[\"stripe\"]".into(),
                RETURN_URL.into(),
                (now - chrono::TimeDelta::minutes(40)).into(),
                expires.into(),
            ])
            .to_owned();
        sea_orm::ConnectionTrait::execute(&*app.db, &insert)
            .await
            .expect("inserted");
    }
    let swept = tributary::retention::sweep(&app.db, &Default::default(), now)
        .await
        .expect("swept");
    assert_eq!(swept.connect_sessions, 1);
    let left: Vec<String> = query(&app, "SELECT token_hash FROM connect_sessions")
        .await
        .iter()
        .map(|row| row.try_get("", "token_hash").expect("hash"))
        .collect();
    assert_eq!(left, vec!["b".repeat(64)]);
}
