//! Connect by OAuth2: a provider's button redirects to its authorization endpoint, and the
//! callback exchanges the code once, against wiremock authorization servers that answer
//! as GitHub's (OAuth apps, PKCE) and Strava's (no PKCE, the athlete in the answer)
//! documentation says.

use std::collections::HashMap;

use base64::Engine;
use reqwest::StatusCode;
use serde_json::json;
use sha2::Digest;
use wiremock::matchers::{body_string_contains, header, method, path};
use wiremock::{Mock, ResponseTemplate};

use crate::connect::{
    assert_contains_all, assert_no_secret_in, connections_of, get, jobs_of, open, post_json,
    sessions, RETURN_URL,
};
use crate::helpers::{spawn_app, TestApp};
use crate::http::Served;

const GITHUB_SECRET: &str = "gh-client-secret-0123456789";
const STRAVA_SECRET: &str = "strava-client-secret-0123456789";
const GITHUB_TOKEN: &str = "gho_16C7e42F292c6912E7710c838347Ae178B4a";
const STRAVA_ACCESS: &str = "a4b945687g7a8f6a7s8d6f7as8d6f7as";
const STRAVA_REFRESH: &str = "e5n567567ert4657vv4e5nq5p5n6w4567";
pub(crate) const CODE: &str = "the-code-f00dcafe";
const GITHUB_USER_ID: i64 = 583231;

/// GitHub (an OAuth app) and Strava, their API and OAuth hosts on the app's wiremock,
/// synced once a year.
fn providers(app: &TestApp) -> String {
    let uri = app.api.uri();
    format!(
        "\n[providers.github]\nkind = \"github\"\nbase_url = \"{uri}\"\noauth_url = \"{uri}\"\n\
         client_id = \"gh-client\"\nclient_secret_env = \"TEST_GITHUB_SECRET\"\nschedule = \"0 0 0 1 1 *\"\n\
         [providers.github.http]\nmax_retries = 1\nretry_initial_delay = \"1ms\"\nretry_max_delay = \"5ms\"\n\
         \n[providers.strava]\nkind = \"strava\"\nbase_url = \"{uri}\"\noauth_url = \"{uri}\"\n\
         client_id = \"12345\"\nclient_secret_env = \"TEST_STRAVA_SECRET\"\nschedule = \"0 0 0 1 1 *\"\n\
         [providers.strava.http]\nmax_retries = 1\nretry_initial_delay = \"1ms\"\nretry_max_delay = \"5ms\"\n"
    )
}

pub(crate) async fn serve(app: &TestApp) -> Served {
    Served::start_with_env(
        app,
        &providers(app),
        &[
            ("TEST_GITHUB_SECRET", GITHUB_SECRET),
            ("TEST_STRAVA_SECRET", STRAVA_SECRET),
        ],
        crate::connect::with_connect(RETURN_URL),
    )
    .await
}

/// A session's link for `user` to connect `provider`.
pub(crate) async fn session(served: &Served, key: &str, user: &str, provider: &str) -> String {
    let body = json!({"user_id": user, "providers": [provider], "return_url": RETURN_URL});
    let (status, _, created) = post_json(served, "/v1/connect/sessions", key, &body).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    created["url"].as_str().expect("url").to_string()
}

/// What pressing `provider`'s button gives: the authorization URL's query, and the
/// callback cookie (`name=value`).
pub(crate) async fn authorize(
    url: &str,
    cookie: &str,
    provider: &str,
) -> (HashMap<String, String>, String, String) {
    let (status, headers, body) = get(&format!("{url}/{provider}"), Some(cookie)).await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    let location = headers["location"].to_str().expect("location").to_string();
    let parsed = url::Url::parse(&location).expect("URL");
    let mut query = HashMap::new();
    for (name, value) in parsed.query_pairs() {
        assert!(
            query.insert(name.to_string(), value.to_string()).is_none(),
            "{name} twice in {location}"
        );
    }
    let set = headers["set-cookie"].to_str().expect("cookie").to_string();
    assert_contains_all(
        &set,
        &[
            "tributary_connect_callback=",
            "Path=/connect/callback",
            "HttpOnly",
            "SameSite=Lax",
        ],
    );
    let callback_cookie = set.split(';').next().expect("pair").to_string();
    let endpoint = format!("{}{}", parsed.origin().ascii_serialization(), parsed.path());
    (query, endpoint, callback_cookie)
}

/// The provider's redirect back, as a browser with `cookie` follows it.
pub(crate) async fn callback(
    served: &Served,
    query: &str,
    cookie: Option<&str>,
) -> (StatusCode, String, String) {
    let (status, headers, body) =
        get(&format!("{}/connect/callback?{query}", served.base), cookie).await;
    let location = headers
        .get("location")
        .map(|value| value.to_str().expect("location").to_string())
        .unwrap_or_default();
    (status, location, body)
}

pub(crate) fn code_and_state(code: &str, state: &str) -> String {
    form_urlencoded::Serializer::new(String::new())
        .append_pair("code", code)
        .append_pair("state", state)
        .finish()
}

/// The form fields of the requests wiremock received at `at`.
pub(crate) async fn token_requests(
    app: &TestApp,
    at: &str,
) -> Vec<(HashMap<String, String>, Option<String>)> {
    app.api
        .received_requests()
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|request| request.url.path() == at)
        .map(|request| {
            let fields = form_urlencoded::parse(&request.body)
                .map(|(name, value)| (name.to_string(), value.to_string()))
                .collect();
            let accept = request
                .headers
                .get("accept")
                .map(|value| value.to_str().unwrap_or_default().to_string());
            (fields, accept)
        })
        .collect()
}

/// The `Authorization` header of the first request wiremock received at `at`.
pub(crate) async fn token_authorization(app: &TestApp, at: &str) -> Option<String> {
    let received = app.api.received_requests().await.unwrap_or_default();
    let request = received
        .iter()
        .find(|request| request.url.path() == at)
        .expect("the token request");
    request
        .headers
        .get("authorization")
        .map(|value| value.to_str().unwrap_or_default().to_string())
}

/// The key form's body with `key`, as the browser holding `cookie` (`name=value`) would
/// post it: its CSRF token (an HMAC of the cookie's value) and the body.
fn key_form_of(cookie: &str, key: &str) -> (String, String) {
    use hmac::Mac;
    let value = cookie.split_once('=').expect("name=value").1;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(value.as_bytes()).expect("key");
    mac.update(b"tributary connect csrf");
    let csrf = const_hex::encode(mac.finalize().into_bytes());
    let form = form_urlencoded::Serializer::new(String::new())
        .append_pair("csrf", &csrf)
        .append_pair("key", key)
        .finish();
    (csrf, form)
}

/// GitHub's `GET /user` with the new token: the user's numeric id.
async fn mount_github_user(app: &TestApp) {
    Mock::given(method("GET"))
        .and(path("/user"))
        .and(header(
            "authorization",
            format!("Bearer {GITHUB_TOKEN}").as_str(),
        ))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!({"login": "octocat", "id": GITHUB_USER_ID, "type": "User"})),
        )
        .mount(&app.api)
        .await;
}

/// `user` connects GitHub from a new session: the callback's status, location and page.
async fn connect_github(served: &Served, key: &str, user: &str) -> (StatusCode, String, String) {
    let body = json!({"user_id": user, "providers": ["github"], "return_url": RETURN_URL});
    connect_with(served, key, &body, CODE).await
}

/// A session made of `body` is opened and its one provider authorized, the provider
/// answering with `code`: the callback's status, location and page.
pub(crate) async fn connect_with(
    served: &Served,
    key: &str,
    body: &serde_json::Value,
    code: &str,
) -> (StatusCode, String, String) {
    let (status, _, created) = post_json(served, "/v1/connect/sessions", key, body).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let url = created["url"].as_str().expect("url");
    let provider = body["providers"][0].as_str().expect("provider");
    let (cookie, _) = open(url).await;
    let (query, _, callback_cookie) = authorize(url, &cookie, provider).await;
    callback(
        served,
        &code_and_state(code, &query["state"]),
        Some(&callback_cookie),
    )
    .await
}

/// GitHub's token endpoint: JSON when asked for it, form-encoded otherwise, as its
/// documentation says.
async fn mount_github_token(app: &TestApp, expected: u64) {
    Mock::given(method("POST"))
        .and(path("/login/oauth/access_token"))
        .and(header("accept", "application/json"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "access_token": GITHUB_TOKEN, "scope": "repo", "token_type": "bearer"
        })))
        .expect(expected)
        .with_priority(1)
        .mount(&app.api)
        .await;
    Mock::given(method("POST"))
        .and(path("/login/oauth/access_token"))
        .respond_with(ResponseTemplate::new(200).set_body_raw(
            format!("access_token={GITHUB_TOKEN}&scope=repo&token_type=bearer"),
            "application/x-www-form-urlencoded",
        ))
        .expect(0)
        .with_priority(2)
        .mount(&app.api)
        .await;
}

#[tokio::test]
async fn github_redirects_with_pkce_and_its_callback_exchanges_the_code_once_and_seals_the_token() {
    let app = spawn_app().await;
    mount_github_token(&app, 1).await;
    mount_github_user(&app).await;
    let served = serve(&app).await;
    let admin = served.create_key("admin", &["admin"]);
    let url = session(&served, &admin, "u1", "github").await;
    let (status, headers, page) = get(&url, None).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    // The button's redirect goes to GitHub's origin: the page's policy allows it.
    let policy = headers["content-security-policy"].to_str().expect("CSP");
    assert!(
        policy.contains(&format!("form-action 'self' {}", app.api.uri())),
        "{policy}"
    );
    let cookie = headers["set-cookie"].to_str().expect("cookie");
    let cookie = cookie.split(';').next().expect("pair").to_string();

    let (query, endpoint, callback_cookie) = authorize(&url, &cookie, "github").await;
    assert_eq!(endpoint, format!("{}/login/oauth/authorize", app.api.uri()));
    let redirect_uri = format!("{}/connect/callback", served.base);
    assert_eq!(query["response_type"], "code");
    assert_eq!(query["client_id"], "gh-client");
    assert_eq!(query["redirect_uri"], redirect_uri);
    assert_eq!(query["scope"], "repo");
    assert_eq!(query["code_challenge_method"], "S256");
    let state = &query["state"];
    assert!(state.len() >= 40, "{state}");
    let challenge = &query["code_challenge"];
    assert_eq!(challenge.len(), 43, "{challenge}");
    // The row keeps a hash of the state, and no verifier.
    let rows = crate::http::query(
        &app,
        "SELECT state_hash, oauth_provider FROM connect_sessions",
    )
    .await;
    let state_hash: String = rows[0].try_get("", "state_hash").expect("state_hash");
    assert_eq!(
        state_hash,
        const_hex::encode(sha2::Sha256::digest(state.as_bytes()))
    );

    let (status, location, body) = callback(
        &served,
        &code_and_state(CODE, state),
        Some(&callback_cookie),
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    assert_eq!(location, format!("{RETURN_URL}?outcome=connected"));

    // One token request: the grant, the code, the identical redirect_uri, the client, and
    // a verifier whose S256 is the challenge.
    let requests = token_requests(&app, "/login/oauth/access_token").await;
    assert_eq!(requests.len(), 1);
    let (fields, accept) = &requests[0];
    assert_eq!(accept.as_deref(), Some("application/json"));
    assert_eq!(fields["grant_type"], "authorization_code");
    assert_eq!(fields["code"], CODE);
    assert_eq!(fields["redirect_uri"], redirect_uri);
    assert_eq!(fields["client_id"], "gh-client");
    assert_eq!(fields["client_secret"], GITHUB_SECRET);
    let verifier = &fields["code_verifier"];
    let derived = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(sha2::Sha256::digest(verifier.as_bytes()));
    assert_eq!(&derived, challenge);
    assert!(verifier.len() >= 43 && verifier.len() <= 128, "{verifier}");

    // The connection, its token sealed, and its first sync queued.
    let rows = connections_of(&app, "u1").await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].provider, "github");
    assert!(
        !rows[0].credentials.contains(GITHUB_TOKEN),
        "{}",
        rows[0].credentials
    );
    let stored = app.stored_credentials("u1", "github").await;
    assert_eq!(stored.token.as_deref(), Some(GITHUB_TOKEN));
    assert_eq!(stored.refresh_token, None);
    assert_eq!(
        stored.expires_at, None,
        "GitHub's OAuth app tokens do not expire"
    );
    let user_id = GITHUB_USER_ID.to_string();
    assert_eq!(rows[0].account_id.as_deref(), Some(user_id.as_str()));
    let jobs = jobs_of(&app, rows[0].id).await;
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(sessions(&app).await, vec![(true, true)]);

    // A replayed callback exchanges nothing and is refused.
    let (status, location, page) = callback(
        &served,
        &code_and_state(CODE, state),
        Some(&callback_cookie),
    )
    .await;
    assert_eq!(status, StatusCode::GONE, "{page}");
    assert!(location.is_empty());
    assert!(page.contains("used already"), "{page}");
    assert_eq!(
        token_requests(&app, "/login/oauth/access_token")
            .await
            .len(),
        1
    );
    assert_eq!(connections_of(&app, "u1").await.len(), 1);

    // No secret in the log: not the code, the verifier, the client secret, the token,
    // the state or the cookie.
    assert_no_secret_in(
        &served.daemon.log(),
        &[
            CODE,
            verifier,
            GITHUB_SECRET,
            GITHUB_TOKEN,
            state,
            cookie.split_once('=').expect("name=value").1,
        ],
    );
}

#[tokio::test]
async fn strava_asks_without_pkce_and_a_callback_from_another_browser_or_with_a_bad_state_is_refused(
) {
    let app = spawn_app().await;
    let expires_at = chrono::Utc::now().timestamp() + 21600;
    Mock::given(method("POST"))
        .and(path("/oauth/token"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "token_type": "Bearer", "expires_at": expires_at, "expires_in": 21600,
            "refresh_token": STRAVA_REFRESH, "access_token": STRAVA_ACCESS,
            "athlete": {"id": 134815, "username": "marianne_t", "firstname": "Marianne"}
        })))
        .expect(1)
        .mount(&app.api)
        .await;
    let served = serve(&app).await;
    let admin = served.create_key("admin", &["admin"]);
    let url = session(&served, &admin, "u1", "strava").await;
    let (cookie, _) = open(&url).await;
    let (query, endpoint, callback_cookie) = authorize(&url, &cookie, "strava").await;
    assert_eq!(endpoint, format!("{}/oauth/authorize", app.api.uri()));
    assert_eq!(query["client_id"], "12345");
    assert_eq!(query["scope"], "read,activity:read_all");
    assert!(!query.contains_key("code_challenge"), "{query:?}");
    let state = query["state"].clone();

    // Another browser's cookie, or none: refused, nothing exchanged.
    for other in [Some("tributary_connect_callback=forged"), None] {
        let (status, _, page) = callback(&served, &code_and_state(CODE, &state), other).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{page}");
        assert!(page.contains("another browser"), "{page}");
    }
    // A state that is unknown, missing or given twice.
    let (status, _, page) = callback(
        &served,
        &code_and_state(CODE, "not-our-state"),
        Some(&callback_cookie),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{page}");
    assert!(page.contains("not known"), "{page}");
    let (status, _, page) =
        callback(&served, &format!("code={CODE}"), Some(&callback_cookie)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
    assert!(page.contains("no state"), "{page}");
    let twice = format!("{}&state=x", code_and_state(CODE, &state));
    let (status, _, page) = callback(&served, &twice, Some(&callback_cookie)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
    assert!(page.contains("more than once"), "{page}");
    // An over-long state matches nothing; an oversized answer is refused whole.
    let long_state = code_and_state(CODE, &"s".repeat(200));
    let (status, _, page) = callback(&served, &long_state, Some(&callback_cookie)).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{page}");
    let oversized = format!(
        "{}&scope={}",
        code_and_state(CODE, &state),
        "r".repeat(9000)
    );
    let (status, _, page) = callback(&served, &oversized, Some(&callback_cookie)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
    assert!(page.contains("larger than"), "{page}");
    // A key posted for an OAuth2 provider, with the right cookie and CSRF token, is
    // refused: its tokens come from its token endpoint only.
    let (csrf, form) = key_form_of(&cookie, "a-pasted-access-token");
    let (status, _, page) =
        crate::connect::post(&format!("{url}/strava"), Some(&cookie), form).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{page}");
    assert!(page.contains("does not connect strava"), "{page}");
    assert!(token_requests(&app, "/oauth/token").await.is_empty());
    assert!(connections_of(&app, "u1").await.is_empty());
    assert_eq!(sessions(&app).await, vec![(false, true)]);

    // Strava adds the scope granted to its redirect.
    let query = format!(
        "{}&scope=read,activity:read_all",
        code_and_state(CODE, &state)
    );
    let (status, location, body) = callback(&served, &query, Some(&callback_cookie)).await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    assert_eq!(location, format!("{RETURN_URL}?outcome=connected"));
    let requests = token_requests(&app, "/oauth/token").await;
    assert_eq!(requests.len(), 1);
    let (fields, _) = &requests[0];
    assert_eq!(fields["grant_type"], "authorization_code");
    assert_eq!(fields["code"], CODE);
    assert_eq!(fields["client_id"], "12345");
    assert_eq!(fields["client_secret"], STRAVA_SECRET);
    assert_eq!(
        fields["redirect_uri"],
        format!("{}/connect/callback", served.base)
    );
    assert!(!fields.contains_key("code_verifier"), "{fields:?}");
    let rows = connections_of(&app, "u1").await;
    assert_eq!(
        rows[0].account_id.as_deref(),
        Some("134815"),
        "the athlete's id"
    );
    let stored = app.stored_credentials("u1", "strava").await;
    assert_eq!(stored.token.as_deref(), Some(STRAVA_ACCESS));
    assert_eq!(stored.refresh_token.as_deref(), Some(STRAVA_REFRESH));
    assert_eq!(stored.expires_at, Some(expires_at));
    for secret in [STRAVA_ACCESS, STRAVA_REFRESH] {
        assert!(!rows[0].credentials.contains(secret));
    }
    // None of the attacks above, nor the flow, logged a secret.
    assert_no_secret_in(
        &served.daemon.log(),
        &[
            CODE,
            &state,
            cookie.split_once('=').expect("name=value").1,
            &csrf,
            "a-pasted-access-token",
            STRAVA_SECRET,
            STRAVA_ACCESS,
            STRAVA_REFRESH,
        ],
    );
}

#[tokio::test]
async fn a_denied_authorization_and_a_refused_code_go_back_with_their_outcome_and_store_nothing() {
    let app = spawn_app().await;
    Mock::given(method("POST"))
        .and(path("/login/oauth/access_token"))
        .respond_with(ResponseTemplate::new(400).set_body_json(json!({
            "error": "invalid_grant", "error_description": "The code passed is incorrect or expired."
        })))
        .expect(1)
        .mount(&app.api)
        .await;
    let served = serve(&app).await;
    let admin = served.create_key("admin", &["admin"]);

    let url = session(&served, &admin, "u1", "github").await;
    let (cookie, _) = open(&url).await;
    let (query, _, callback_cookie) = authorize(&url, &cookie, "github").await;
    let denied = form_urlencoded::Serializer::new(String::new())
        .append_pair("error", "access_denied")
        .append_pair(
            "error_description",
            "The user has denied your application access.",
        )
        .append_pair("state", &query["state"])
        .finish();
    let (status, location, body) = callback(&served, &denied, Some(&callback_cookie)).await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    assert_eq!(location, format!("{RETURN_URL}?outcome=denied"));

    let (status, location, body) = connect_github(&served, &admin, "u1").await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    assert_eq!(
        location,
        format!("{RETURN_URL}?outcome=error&code=token_exchange_failed")
    );
    assert!(connections_of(&app, "u1").await.is_empty());
    assert_eq!(sessions(&app).await, vec![(true, true), (true, true)]);
    let log = served.daemon.log();
    assert!(log.contains("invalid_grant"), "{log}");
    for secret in [CODE, GITHUB_SECRET] {
        assert!(!log.contains(secret), "{secret} in {log}");
    }
}

#[tokio::test]
async fn one_github_account_for_two_users_shows_in_the_api_and_is_refused_when_config_says_so() {
    let app = spawn_app().await;
    mount_github_token(&app, 3).await;
    mount_github_user(&app).await;
    let served = serve(&app).await;
    let admin = served.create_key("admin", &["admin"]);
    for user in ["u1", "u2"] {
        let (status, location, body) = connect_github(&served, &admin, user).await;
        assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
        assert_eq!(location, format!("{RETURN_URL}?outcome=connected"));
    }
    // The API shows both users' connections with the one account.
    let (status, listed) = served.get("/v1/connections?provider=github", &admin).await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    let accounts: Vec<(String, String)> = listed["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|item| {
            let field = |name: &str| item[name].as_str().expect(name).to_string();
            (field("user_id"), field("account_id"))
        })
        .collect();
    let account = GITHUB_USER_ID.to_string();
    assert_eq!(
        accounts,
        vec![
            ("u1".to_string(), account.clone()),
            ("u2".to_string(), account)
        ]
    );
    drop(served);

    // With `one_user_per_account`, a third user gets a page saying so, and no connection.
    let served = Served::start_with_env(
        &app,
        &providers(&app),
        &[
            ("TEST_GITHUB_SECRET", GITHUB_SECRET),
            ("TEST_STRAVA_SECRET", STRAVA_SECRET),
        ],
        |text| {
            let text = crate::connect::with_connect(RETURN_URL)(text);
            format!("{text}one_user_per_account = true\n")
        },
    )
    .await;
    let admin = served.create_key("admin2", &["admin"]);
    let (status, location, page) = connect_github(&served, &admin, "u3").await;
    assert_eq!(status, StatusCode::CONFLICT, "{page}");
    assert!(location.is_empty());
    assert!(
        page.contains("already connected for another user"),
        "{page}"
    );
    assert!(connections_of(&app, "u3").await.is_empty());
}

#[tokio::test]
async fn a_token_endpoint_failing_answering_html_or_a_token_of_another_type_stores_nothing() {
    let app = spawn_app().await;
    let answers = [
        (
            "code-500",
            ResponseTemplate::new(500).set_body_string("upstream down"),
        ),
        (
            "code-html",
            ResponseTemplate::new(200)
                .set_body_raw("<html><body>Sign in</body></html>", "text/html"),
        ),
        (
            "code-mac",
            ResponseTemplate::new(200)
                .set_body_json(json!({"access_token": "mac-token-1", "token_type": "mac"})),
        ),
    ];
    for (code, answer) in answers {
        Mock::given(method("POST"))
            .and(path("/login/oauth/access_token"))
            .and(body_string_contains(format!("code={code}")))
            .respond_with(answer)
            .expect(1)
            .mount(&app.api)
            .await;
    }
    let served = serve(&app).await;
    let admin = served.create_key("admin", &["admin"]);
    let body = json!({"user_id": "u1", "providers": ["github"], "return_url": RETURN_URL});
    for code in ["code-500", "code-html", "code-mac"] {
        let (status, location, page) = connect_with(&served, &admin, &body, code).await;
        assert_eq!(status, StatusCode::SEE_OTHER, "{code}: {page}");
        assert_eq!(
            location,
            format!("{RETURN_URL}?outcome=error&code=token_exchange_failed"),
            "{code}"
        );
    }
    assert!(connections_of(&app, "u1").await.is_empty());
    let log = served.daemon.log();
    assert!(!log.contains("mac-token-1"), "{log}");
}

#[tokio::test]
async fn a_reconnect_by_oauth_replaces_the_tokens_and_keeps_the_connection() {
    let app = spawn_app().await;
    let expires_at = chrono::Utc::now().timestamp() + 21600;
    for (code, access, refresh) in [
        ("code-first", "access-first-0123", "refresh-first-0123"),
        ("code-again", "access-again-4567", "refresh-again-4567"),
    ] {
        Mock::given(method("POST"))
            .and(path("/oauth/token"))
            .and(body_string_contains(format!("code={code}")))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({
                "token_type": "Bearer", "expires_at": expires_at, "access_token": access,
                "refresh_token": refresh, "athlete": {"id": 134815}
            })))
            .expect(1)
            .mount(&app.api)
            .await;
    }
    let served = serve(&app).await;
    let admin = served.create_key("admin", &["admin"]);
    let body = json!({"user_id": "u1", "providers": ["strava"], "return_url": RETURN_URL});
    let (status, location, page) = connect_with(&served, &admin, &body, "code-first").await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{page}");
    assert_eq!(location, format!("{RETURN_URL}?outcome=connected"));
    let id = connections_of(&app, "u1").await[0].id;

    let body = json!({"user_id": "u1", "providers": ["strava"], "return_url": RETURN_URL, "reconnect": id});
    let (status, location, page) = connect_with(&served, &admin, &body, "code-again").await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{page}");
    assert_eq!(location, format!("{RETURN_URL}?outcome=connected"));
    let rows = connections_of(&app, "u1").await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].id, id, "the same connection");
    let stored = app.stored_credentials("u1", "strava").await;
    assert_eq!(stored.token.as_deref(), Some("access-again-4567"));
    assert_eq!(stored.refresh_token.as_deref(), Some("refresh-again-4567"));
}

#[tokio::test]
async fn a_rest_provider_with_an_authorize_url_sends_pkce_authenticates_by_basic_and_reads_its_account(
) {
    let app = spawn_app().await;
    let uri = app.api.uri();
    let auth = format!(
        "auth = {{ oauth2 = \"refresh_token\", token_url = \"{uri}/oauth2/token\", \
         authorize_url = \"{uri}/oauth2/authorize\", client_id = \"acme-client\", \
         client_secret_env = \"TEST_ACME_SECRET\", client_auth = \"basic\", scope = \"items:read\" }}\n\
         account_id = {{ path = \"/v1/me\", pointer = \"/data/id\" }}"
    );
    let provider =
        crate::helpers::cursor_provider("acme", &uri, &[]).replace("auth = \"bearer\"", &auth);
    Mock::given(method("POST"))
        .and(path("/oauth2/token"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "access_token": "acme-access-0123", "token_type": "Bearer", "expires_in": 3600,
            "refresh_token": "acme-refresh-0123"
        })))
        .expect(1)
        .mount(&app.api)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/me"))
        .and(header("authorization", "Bearer acme-access-0123"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": {"id": "acct-9"}})))
        .expect(1)
        .mount(&app.api)
        .await;
    let served = Served::start_with_env(
        &app,
        &provider,
        &[("TEST_ACME_SECRET", "acme-secret")],
        crate::connect::with_connect(RETURN_URL),
    )
    .await;
    let admin = served.create_key("admin", &["admin"]);
    let url = session(&served, &admin, "u1", "acme").await;
    let (cookie, _) = open(&url).await;
    let (query, endpoint, callback_cookie) = authorize(&url, &cookie, "acme").await;
    assert_eq!(endpoint, format!("{uri}/oauth2/authorize"));
    assert_eq!(query["client_id"], "acme-client");
    assert_eq!(query["scope"], "items:read");
    assert_eq!(
        query["code_challenge_method"], "S256",
        "PKCE is on by default"
    );
    let challenge = query["code_challenge"].clone();

    let (status, location, body) = callback(
        &served,
        &code_and_state(CODE, &query["state"]),
        Some(&callback_cookie),
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    assert_eq!(location, format!("{RETURN_URL}?outcome=connected"));
    let basic = base64::engine::general_purpose::STANDARD.encode("acme-client:acme-secret");
    assert_eq!(
        token_authorization(&app, "/oauth2/token").await,
        Some(format!("Basic {basic}"))
    );
    let (fields, _) = &token_requests(&app, "/oauth2/token").await[0];
    assert_eq!(fields["grant_type"], "authorization_code");
    assert!(!fields.contains_key("client_secret"), "{fields:?}");
    let derived = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(sha2::Sha256::digest(fields["code_verifier"].as_bytes()));
    assert_eq!(derived, challenge);
    let rows = connections_of(&app, "u1").await;
    assert_eq!(rows[0].account_id.as_deref(), Some("acct-9"));
    let stored = app.stored_credentials("u1", "acme").await;
    assert_eq!(stored.token.as_deref(), Some("acme-access-0123"));
    assert_eq!(stored.refresh_token.as_deref(), Some("acme-refresh-0123"));
    assert!(stored.expires_at.is_some());
}

/// Two instances behind one `public_url`: the session is made, opened and sent to
/// GitHub through one, and the callback lands on the other, which finds everything it
/// needs in the database (the verifier is derived from the cookie).
#[tokio::test]
async fn an_authorization_begun_on_one_instance_completes_on_another() {
    if crate::helpers::backend() == crate::helpers::Backend::Sqlite {
        return; // One daemon per SQLite file.
    }
    let app = spawn_app().await;
    mount_github_token(&app, 1).await;
    mount_github_user(&app).await;
    let env = [
        ("TEST_GITHUB_SECRET", GITHUB_SECRET),
        ("TEST_STRAVA_SECRET", STRAVA_SECRET),
    ];
    let first = Served::start_named_with_env(
        &app,
        &providers(&app),
        "first",
        &env,
        crate::connect::with_connect(RETURN_URL),
    )
    .await;
    let public_url = first.base.clone();
    let second = Served::start_named_with_env(&app, &providers(&app), "second", &env, |text| {
        format!(
            "{text}\n[connect]\npublic_url = \"{public_url}\"\nreturn_urls = [\"{RETURN_URL}\"]\n"
        )
    })
    .await;
    let admin = first.create_key("admin", &["admin"]);
    let url = session(&first, &admin, "u1", "github").await;
    let (cookie, _) = open(&url).await;
    let (query, _, callback_cookie) = authorize(&url, &cookie, "github").await;
    let (status, location, body) = callback(
        &second,
        &code_and_state(CODE, &query["state"]),
        Some(&callback_cookie),
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    assert_eq!(location, format!("{RETURN_URL}?outcome=connected"));
    let (fields, _) = &token_requests(&app, "/login/oauth/access_token").await[0];
    assert_eq!(
        fields["redirect_uri"],
        format!("{public_url}/connect/callback")
    );
    let rows = connections_of(&app, "u1").await;
    assert_eq!(rows.len(), 1);
    let stored = app.stored_credentials("u1", "github").await;
    assert_eq!(stored.token.as_deref(), Some(GITHUB_TOKEN));
}

/// GitHub and Strava with `[connect] public_url` set to `public_url(port)`, the daemon
/// listening on loopback at that port.
async fn serve_at(app: &TestApp, public_url: impl FnOnce(&str) -> String) -> Served {
    Served::start_with_env(
        app,
        &providers(app),
        &[
            ("TEST_GITHUB_SECRET", GITHUB_SECRET),
            ("TEST_STRAVA_SECRET", STRAVA_SECRET),
        ],
        move |text: String| {
            let port = text
                .lines()
                .find_map(|line| line.strip_prefix("listen = \"127.0.0.1:"))
                .and_then(|rest| rest.strip_suffix('"'))
                .expect("[api] listen")
                .to_string();
            let public_url = public_url(&port);
            format!(
                "{text}\n[connect]\npublic_url = \"{public_url}\"\nreturn_urls = [\"{RETURN_URL}\"]\n"
            )
        },
    )
    .await
}

/// The `Set-Cookie` of `headers`.
fn set_cookie(headers: &reqwest::header::HeaderMap) -> String {
    headers["set-cookie"].to_str().expect("cookie").to_string()
}

#[tokio::test]
async fn the_connect_cookies_are_secure_under_an_https_public_url_and_not_on_http_localhost() {
    for (public_url, secure) in [
        (
            (|_: &str| "https://connect.example.com".to_string()) as fn(&str) -> String,
            true,
        ),
        (|port: &str| format!("http://localhost:{port}"), false),
    ] {
        let app = spawn_app().await;
        let served = serve_at(&app, public_url).await;
        let admin = served.create_key("admin", &["admin"]);
        let link = session(&served, &admin, "u1", "github").await;
        // The daemon behind a proxy that ends TLS: the link's path, asked over loopback.
        let path = url::Url::parse(&link).expect("a URL").path().to_string();
        let page_url = format!("{}{path}", served.base);
        let (status, headers, page) = get(&page_url, None).await;
        assert_eq!(status, StatusCode::OK, "{link}: {page}");
        let page_cookie = set_cookie(&headers);
        let pair = page_cookie.split(';').next().expect("pair").to_string();
        let (status, headers, body) = get(&format!("{page_url}/github"), Some(&pair)).await;
        assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
        let callback_cookie = set_cookie(&headers);
        for cookie in [&page_cookie, &callback_cookie] {
            let attributes: Vec<&str> = cookie.split(';').map(str::trim).skip(1).collect();
            assert_eq!(attributes.contains(&"Secure"), secure, "{link}: {cookie}");
            assert!(attributes.contains(&"HttpOnly"), "{cookie}");
            assert!(attributes.contains(&"SameSite=Lax"), "{cookie}");
        }
    }
}

/// Strava's token endpoint, answering `expected` exchanges for athlete 134815.
async fn mount_strava_token(app: &TestApp, expected: u64) {
    Mock::given(method("POST"))
        .and(path("/oauth/token"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "token_type": "Bearer", "expires_at": chrono::Utc::now().timestamp() + 21600,
            "refresh_token": STRAVA_REFRESH, "access_token": STRAVA_ACCESS,
            "athlete": {"id": 134815}
        })))
        .expect(expected)
        .mount(&app.api)
        .await;
}

/// `connect_sessions` of `user` as (state_hash, oauth_provider, used).
async fn authorization_of(app: &TestApp, user: &str) -> (Option<String>, Option<String>, bool) {
    let rows = crate::http::query(
        app,
        &format!(
            "SELECT state_hash, oauth_provider, used_at IS NOT NULL AS used FROM connect_sessions WHERE user_id = '{user}'"
        ),
    )
    .await;
    let row = rows.first().expect("a session");
    let text = |column: &str| row.try_get::<Option<String>>("", column).expect(column);
    let used = row
        .try_get::<bool>("", "used")
        .or_else(|_| row.try_get::<i64>("", "used").map(|v| v != 0))
        .or_else(|_| row.try_get::<i32>("", "used").map(|v| v != 0))
        .expect("used");
    (text("state_hash"), text("oauth_provider"), used)
}

#[tokio::test]
async fn a_configured_provider_the_session_did_not_allow_is_refused_and_a_callback_completes_only_its_own(
) {
    let app = spawn_app().await;
    mount_github_token(&app, 1).await;
    mount_github_user(&app).await;
    mount_strava_token(&app, 1).await;
    // Stripe takes a key; its check must never be asked for.
    crate::connect::mount_charges(&app, "sk_test_not_allowed", crate::connect::empty_list(), 0)
        .await;
    let served = Served::start_with_env(
        &app,
        &format!(
            "{}{}",
            providers(&app),
            crate::connect::stripe_provider(&app)
        ),
        &[
            ("TEST_GITHUB_SECRET", GITHUB_SECRET),
            ("TEST_STRAVA_SECRET", STRAVA_SECRET),
        ],
        crate::connect::with_connect(RETURN_URL),
    )
    .await;
    let admin = served.create_key("admin", &["admin"]);
    let github_link = session(&served, &admin, "u1", "github").await;
    let (github_cookie, _) = open(&github_link).await;

    // Strava (OAuth2) and Stripe (a key) are configured, but not in this session: their
    // buttons, Stripe's form post and Strava's authorization are refused.
    for provider in ["strava", "stripe"] {
        let (status, headers, page) =
            get(&format!("{github_link}/{provider}"), Some(&github_cookie)).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{page}");
        assert!(
            page.contains(&format!("does not connect {provider}")),
            "{page}"
        );
        assert!(headers.get("location").is_none());
        assert!(headers.get("set-cookie").is_none());
    }
    let (csrf, form) = key_form_of(&github_cookie, "sk_test_not_allowed");
    let (status, _, page) =
        crate::connect::post(&format!("{github_link}/stripe"), Some(&github_cookie), form).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{page}");
    assert!(page.contains("does not connect stripe"), "{page}");
    assert_eq!(authorization_of(&app, "u1").await, (None, None, false));
    assert!(connections_of(&app, "u1").await.is_empty());

    // u1's browser begins GitHub; u2's, in another session, Strava.
    let (github_query, _, github_callback) =
        authorize(&github_link, &github_cookie, "github").await;
    let strava_link = session(&served, &admin, "u2", "strava").await;
    let (strava_cookie, _) = open(&strava_link).await;
    let (strava_query, _, strava_callback) =
        authorize(&strava_link, &strava_cookie, "strava").await;
    let github_state = github_query["state"].clone();
    let strava_state = strava_query["state"].clone();
    // Each state with the other session's cookie: refused, nothing exchanged or spent.
    for (state, cookie) in [
        (&github_state, &strava_callback),
        (&strava_state, &github_callback),
    ] {
        let (status, location, page) =
            callback(&served, &code_and_state(CODE, state), Some(cookie)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{page}");
        assert!(location.is_empty());
        assert!(page.contains("another browser"), "{page}");
    }
    // The callback takes its provider from the session: a GitHub session whose row says
    // Strava (as if tampered with) is refused, not completed at Strava.
    let set_provider = |provider: &str| {
        format!("UPDATE connect_sessions SET oauth_provider = '{provider}' WHERE user_id = 'u1'")
    };
    crate::http::query(&app, &set_provider("strava")).await;
    let (status, _, page) = callback(
        &served,
        &code_and_state(CODE, &github_state),
        Some(&github_callback),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{page}");
    assert!(page.contains("does not connect strava"), "{page}");
    assert!(token_requests(&app, "/oauth/token").await.is_empty());
    assert!(token_requests(&app, "/login/oauth/access_token")
        .await
        .is_empty());
    assert!(!authorization_of(&app, "u1").await.2, "not spent");
    assert!(!authorization_of(&app, "u2").await.2, "not spent");
    crate::http::query(&app, &set_provider("github")).await;

    // Each session completes with its own state and cookie, at its own provider.
    for (state, cookie) in [
        (&github_state, &github_callback),
        (&strava_state, &strava_callback),
    ] {
        let (status, location, page) =
            callback(&served, &code_and_state(CODE, state), Some(cookie)).await;
        assert_eq!(status, StatusCode::SEE_OTHER, "{page}");
        assert_eq!(location, format!("{RETURN_URL}?outcome=connected"));
    }
    assert_eq!(
        token_requests(&app, "/login/oauth/access_token")
            .await
            .len(),
        1
    );
    assert_eq!(token_requests(&app, "/oauth/token").await.len(), 1);
    let providers_of = |rows: Vec<tributary::entities::connection::Model>| {
        rows.into_iter().map(|row| row.provider).collect::<Vec<_>>()
    };
    assert_eq!(
        providers_of(connections_of(&app, "u1").await),
        vec!["github"]
    );
    assert_eq!(
        providers_of(connections_of(&app, "u2").await),
        vec!["strava"]
    );
    let cookies = [&github_cookie, &strava_cookie].map(|c| c.split_once('=').expect("pair").1);
    assert_no_secret_in(
        &served.daemon.log(),
        &[
            CODE,
            &github_state,
            &strava_state,
            cookies[0],
            cookies[1],
            &csrf,
            "sk_test_not_allowed",
            GITHUB_SECRET,
            STRAVA_SECRET,
        ],
    );
}

#[tokio::test]
async fn a_session_that_expires_between_begin_and_callback_ends_on_a_page_and_exchanges_nothing() {
    let app = spawn_app().await;
    mount_github_token(&app, 0).await;
    let served = serve(&app).await;
    let admin = served.create_key("admin", &["admin"]);
    let link = session(&served, &admin, "u1", "github").await;
    let (cookie, _) = open(&link).await;
    let (query, _, callback_cookie) = authorize(&link, &cookie, "github").await;
    let past = match app.db.get_database_backend() {
        sea_orm::DbBackend::Sqlite => "'2000-01-01 00:00:00+00:00'",
        _ => "'2000-01-01 00:00:00'",
    };
    crate::http::query(
        &app,
        &format!("UPDATE connect_sessions SET expires_at = {past}"),
    )
    .await;
    let (status, location, page) = callback(
        &served,
        &code_and_state(CODE, &query["state"]),
        Some(&callback_cookie),
    )
    .await;
    assert_eq!(status, StatusCode::GONE, "{page}");
    assert!(location.is_empty());
    assert!(page.contains("This did not work"), "{page}");
    assert!(page.contains("expired"), "{page}");
    assert!(token_requests(&app, "/login/oauth/access_token")
        .await
        .is_empty());
    assert!(connections_of(&app, "u1").await.is_empty());
    assert!(!authorization_of(&app, "u1").await.2, "not marked used");
    let cookie_value = cookie.split_once('=').expect("pair").1;
    assert_no_secret_in(
        &served.daemon.log(),
        &[CODE, &query["state"], cookie_value, GITHUB_SECRET],
    );
}
