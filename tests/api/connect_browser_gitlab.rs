//! A preset's OAuth2 flow in a real browser: a user connects `preset = "gitlab_issues"`
//! on the Connect page through an emulated GitLab that behaves as its "OAuth 2.0 identity
//! provider API" documentation says (the authorization code flow with PKCE), and the
//! connection is stored with sealed tokens and the GitLab user's id.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use base64::Engine;
use fantoccini::Locator;
use serde_json::json;
use sha2::Digest;

use crate::connect_browser::{
    appeared, first_sync_succeeded, form_fields, landed_connected, press_connect, return_page,
    sealed_connection, serve_oauth, serve_router, AuthorizationSeen, Chromedriver,
};
use crate::helpers::spawn_app;

const APP_ID: &str = "browser-gitlab-app-id";
const APP_SECRET: &str = "gloas-browser-secret-0123";
const ACCESS_TOKEN: &str = "de6780bc506a0446309bd9362820ba8aed28aa506c71eedbe1c5c4f9dd350e54";
const REFRESH_TOKEN: &str = "8257e65c97202ed1726cf9571600918f3bffb2544b26e00a61df9897668c33a1";
const GITLAB_USER_ID: i64 = 4242;

/// A grant GitLab issued: what the token request must match.
struct Grant {
    client_id: String,
    redirect_uri: String,
    code_challenge: String,
}

type Shared = Arc<Mutex<AuthorizationSeen<Grant>>>;

/// `GET /oauth/authorize`: GitLab's consent page, which posts the request's parameters
/// back to the same path when the user presses "Authorize". Only `response_type=code`
/// with an S256 challenge is offered consent.
async fn consent(
    State(seen): State<Shared>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    seen.lock()
        .expect("seen")
        .authorize_requests
        .push(query.clone());
    let value = |name: &str| query.get(name).cloned().unwrap_or_default();
    if value("response_type") != "code" || value("code_challenge_method") != "S256" {
        return (StatusCode::BAD_REQUEST, "unsupported request").into_response();
    }
    let fields: String = [
        "client_id",
        "redirect_uri",
        "state",
        "scope",
        "code_challenge",
    ]
    .into_iter()
    .map(|name| {
        let escaped = value(name).replace('&', "&amp;").replace('"', "&quot;");
        format!("<input type=\"hidden\" name=\"{name}\" value=\"{escaped}\">")
    })
    .collect();
    Html(format!(
        "<!doctype html><title>Authorize application · GitLab</title>\
         <h1>Authorize {} to use your account?</h1><p>Scopes: {}</p>\
         <form method=\"post\" action=\"/oauth/authorize\">{fields}\
         <input type=\"submit\" name=\"commit\" value=\"Authorize\" id=\"gitlab-authorize\">\
         </form>",
        value("client_id"),
        value("scope"),
    ))
    .into_response()
}

/// `POST /oauth/authorize`: the user consented; a 302 to `redirect_uri` with `code` and
/// `state`, as Doorkeeper answers.
async fn consented(State(seen): State<Shared>, body: String) -> Response {
    let form = form_fields(&body);
    let value = |name: &str| form.get(name).cloned().unwrap_or_default();
    let mut seen = seen.lock().expect("seen");
    let code = format!("gitlab-code-{}", seen.grants.len());
    seen.grants.insert(
        code.clone(),
        Grant {
            client_id: value("client_id"),
            redirect_uri: value("redirect_uri"),
            code_challenge: value("code_challenge"),
        },
    );
    let Ok(mut back) = url::Url::parse(&value("redirect_uri")) else {
        return (StatusCode::BAD_REQUEST, "bad redirect_uri").into_response();
    };
    back.query_pairs_mut()
        .append_pair("code", &code)
        .append_pair("state", &value("state"));
    (StatusCode::FOUND, [(header::LOCATION, back.to_string())]).into_response()
}

/// `POST /oauth/token`: `client_id`, `client_secret`, `code`, `grant_type`,
/// `redirect_uri` and `code_verifier` in the form; a code is redeemed once. Answers the
/// documented JSON, or 400 `invalid_grant`.
async fn token(State(seen): State<Shared>, body: String) -> Response {
    let mut seen = seen.lock().expect("seen");
    let form = seen.token_request(&body);
    let value = |name: &str| form.get(name).cloned().unwrap_or_default();
    let grant = seen.grants.remove(&value("code"));
    let challenge = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(sha2::Sha256::digest(value("code_verifier").as_bytes()));
    let valid = grant.is_some_and(|grant| {
        grant.client_id == value("client_id")
            && grant.redirect_uri == value("redirect_uri")
            && grant.code_challenge == challenge
    }) && value("grant_type") == "authorization_code"
        && value("client_id") == APP_ID
        && value("client_secret") == APP_SECRET;
    let no_store = [
        (header::CACHE_CONTROL, "no-store"),
        (header::PRAGMA, "no-cache"),
    ];
    match valid {
        true => (
            no_store,
            axum::Json(json!({
                "access_token": ACCESS_TOKEN, "token_type": "bearer", "expires_in": 7200,
                "refresh_token": REFRESH_TOKEN, "created_at": chrono::Utc::now().timestamp()
            })),
        )
            .into_response(),
        false => (
            StatusCode::BAD_REQUEST,
            no_store,
            axum::Json(json!({
                "error": "invalid_grant",
                "error_description": "The provided authorization grant is invalid, expired, revoked, does not match the redirection URI used in the authorization request, or was issued to another client."
            })),
        )
            .into_response(),
    }
}

/// The API answers only the access token it issued, as `Authorization: Bearer`.
fn bearer_is_ours(headers: &HeaderMap) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        == Some(format!("Bearer {ACCESS_TOKEN}").as_str())
}

fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        axum::Json(json!({"message": "401 Unauthorized"})),
    )
        .into_response()
}

/// `GET /api/v4/user`: the token's user.
async fn user(headers: HeaderMap) -> Response {
    match bearer_is_ours(&headers) {
        true => axum::Json(json!({
            "id": GITLAB_USER_ID, "username": "john_smith", "name": "John Smith",
            "state": "active"
        }))
        .into_response(),
        false => unauthorized(),
    }
}

/// `GET /api/v4/groups/7/issues`: no issues yet.
async fn issues(headers: HeaderMap) -> Response {
    match bearer_is_ours(&headers) {
        true => (
            [("x-total", "0"), ("x-total-pages", "1")],
            axum::Json(json!([])),
        )
            .into_response(),
        false => unauthorized(),
    }
}

/// GitLab's OAuth2 endpoints and the two API calls a connection makes, on one origin.
async fn emulated_gitlab() -> (String, Shared) {
    let seen: Shared = Arc::default();
    let router = axum::Router::new()
        .route(
            "/oauth/authorize",
            axum::routing::get(consent).post(consented),
        )
        .route("/oauth/token", axum::routing::post(token))
        .route("/api/v4/user", axum::routing::get(user))
        .route("/api/v4/groups/7/issues", axum::routing::get(issues))
        .with_state(Arc::clone(&seen));
    (serve_router(router).await, seen)
}

#[tokio::test]
async fn a_user_connects_the_gitlab_preset_in_a_browser_through_its_authorization_page() {
    let app = spawn_app().await;
    let (gitlab, seen) = emulated_gitlab().await;
    let (return_url, visits) = return_page().await;
    // The preset's endpoints, on the emulation's host instead of gitlab.com.
    let provider = format!(
        "\n[providers.gitlab]\npreset = \"gitlab_issues\"\nbase_url = \"{gitlab}/api/v4\"\n\
         path = \"/groups/7/issues\"\nschedule = \"0 0 0 1 1 *\"\n\
         auth = {{ oauth2 = \"refresh_token\", client_id = \"{APP_ID}\", \
         client_secret_env = \"TEST_BROWSER_GITLAB_SECRET\", \
         authorize_url = \"{gitlab}/oauth/authorize\", token_url = \"{gitlab}/oauth/token\" }}\n"
    );
    let secret = ("TEST_BROWSER_GITLAB_SECRET", APP_SECRET);
    let (served, link) = serve_oauth(&app, &provider, secret, &return_url, "browser-gl").await;
    let driver = Chromedriver::start().await;
    let browser = driver.browser().await;
    press_connect(&browser, &link, "gitlab").await;
    // GitLab's consent page: the user authorizes the application.
    let authorize = appeared(&browser, Locator::Css("input#gitlab-authorize")).await;
    let consent = browser.source().await.expect("source");
    assert!(
        consent.contains(&format!("Authorize {APP_ID} to use your account?")),
        "{consent}"
    );
    assert!(consent.contains("Scopes: read_api"), "{consent}");
    authorize.click().await.expect("authorized");
    landed_connected(&browser, &return_url, &visits).await;

    let redirect_uri = format!("{}/connect/callback", served.base);
    seen.lock()
        .expect("seen")
        .one_code_exchanged(APP_ID, &redirect_uri, "read_api");
    let account = GITLAB_USER_ID.to_string();
    let user = ("browser-gl", "gitlab", account.as_str());
    let stored = sealed_connection(&app, user, ACCESS_TOKEN, Some(REFRESH_TOKEN)).await;
    let expires_in = stored.expires_at.expect("an expiry") - chrono::Utc::now().timestamp();
    assert!((7000..=7200).contains(&expires_in), "{expires_in}");
    // Its first sync runs with the access token against the emulated Issues API.
    first_sync_succeeded(&app, "browser-gl").await;
    browser.close().await.expect("closed");
}
