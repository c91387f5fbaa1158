//! Strava's OAuth2 flow in a real browser: a user connects `kind = "strava"` on the Connect
//! page through an emulated Strava that behaves as its authentication documentation says
//! (<https://developers.strava.com/docs/authentication/>: the authorize page with the
//! requested scopes to consent to, the redirect back with `code`, `scope` and `state`, a
//! token endpoint that takes no PKCE and answers with the athlete), and the connection's
//! first sync stores the athlete's activities from the API on wiremock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use fantoccini::Locator;
use serde_json::json;
use wiremock::matchers::{header as has_header, method, path, query_param};
use wiremock::{Mock, ResponseTemplate};

use crate::connect_browser::{
    appeared, first_sync_succeeded, landed_connected, press_connect, return_page,
    sealed_connection, serve_oauth, serve_router, stored_records, AuthorizationSeen, Chromedriver,
};
use crate::helpers::{spawn_app, TestApp};

const CLIENT_ID: &str = "31337";
const CLIENT_SECRET: &str = "strava-browser-secret-7a8f6a7s8d6f";
const ACCESS_TOKEN: &str = "a4b945687g7a8f6a7s8d6f7as8d6f7as8d6f7a";
const REFRESH_TOKEN: &str = "e5n567567ert4657vv4e5nq5p5n6w4567e5n";
const ATHLETE_ID: i64 = 134815;

/// An authorization Strava issued: what the token request must match.
struct Grant {
    client_id: String,
    scope: String,
}

type Shared = Arc<Mutex<AuthorizationSeen<Grant>>>;

/// Strava's answer to a request it cannot take, as its API shapes errors.
fn bad_request(resource: &str, field: &str) -> Response {
    let body = json!({
        "message": "Bad Request",
        "errors": [{"resource": resource, "field": field, "code": "invalid"}]
    });
    (StatusCode::BAD_REQUEST, axum::Json(body)).into_response()
}

/// `GET /oauth/authorize`: `client_id`, `redirect_uri`, `response_type=code`, an optional
/// `approval_prompt` (`auto` or `force`) and comma-separated `scope`. The redirect's host
/// must be the application's callback domain (here `127.0.0.1`, which Strava allows as
/// it does `localhost`). The page lists each requested scope as a box the athlete may
/// clear, and posts the decision back.
async fn consent(
    State(seen): State<Shared>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    seen.lock()
        .expect("seen")
        .authorize_requests
        .push(query.clone());
    let value = |name: &str| query.get(name).cloned().unwrap_or_default();
    if value("client_id") != CLIENT_ID {
        return bad_request("Application", "client_id");
    }
    let callback_host = url::Url::parse(&value("redirect_uri"))
        .ok()
        .and_then(|url| url.host_str().map(str::to_string));
    if callback_host.as_deref() != Some("127.0.0.1") {
        return bad_request("Application", "redirect_uri");
    }
    if value("response_type") != "code" {
        return bad_request("Application", "response_type");
    }
    if !matches!(
        query.get("approval_prompt").map(String::as_str),
        None | Some("auto" | "force")
    ) {
        return bad_request("Application", "approval_prompt");
    }
    let escape = |text: &str| text.replace('&', "&amp;").replace('"', "&quot;");
    let hidden: String = ["redirect_uri", "state"]
        .into_iter()
        .map(|name| {
            format!(
                "<input type=\"hidden\" name=\"{name}\" value=\"{}\">",
                escape(&value(name))
            )
        })
        .collect();
    let boxes: String = value("scope")
        .split(',')
        .filter(|scope| !scope.is_empty())
        .map(|scope| {
            let scope = escape(scope);
            format!(
                "<label><input type=\"checkbox\" name=\"scope\" value=\"{scope}\" checked> {scope}</label>"
            )
        })
        .collect();
    Html(format!(
        "<!doctype html><title>Authorize | Strava</title>\
         <h1>Authorize tributary test app to connect to Strava</h1>\
         <form method=\"post\" action=\"/oauth/accept_application\">{hidden}{boxes}\
         <button type=\"submit\" name=\"decision\" value=\"authorize\" id=\"authorize\">Authorize</button>\
         <button type=\"submit\" name=\"decision\" value=\"cancel\" id=\"cancel\">Cancel</button>\
         </form>"
    ))
    .into_response()
}

/// The athlete's decision: back to `redirect_uri` with `state`, `code` and the scopes
/// accepted, or with `error=access_denied`.
async fn decide(State(seen): State<Shared>, body: String) -> Response {
    let form = form_urlencoded::parse(body.as_bytes())
        .map(|(name, value)| (name.into_owned(), value.into_owned()))
        .collect::<Vec<_>>();
    let value = |name: &str| {
        form.iter()
            .find(|(found, _)| found == name)
            .map(|(_, value)| value.clone())
            .unwrap_or_default()
    };
    let Ok(mut back) = url::Url::parse(&value("redirect_uri")) else {
        return bad_request("Application", "redirect_uri");
    };
    back.query_pairs_mut().append_pair("state", &value("state"));
    if value("decision") == "authorize" {
        let scope = form
            .iter()
            .filter(|(name, _)| name == "scope")
            .map(|(_, scope)| scope.as_str())
            .collect::<Vec<_>>()
            .join(",");
        let mut seen = seen.lock().expect("seen");
        let code = format!("strava-code-{}", seen.grants.len());
        seen.grants.insert(
            code.clone(),
            Grant {
                client_id: CLIENT_ID.to_string(),
                scope: scope.clone(),
            },
        );
        back.query_pairs_mut()
            .append_pair("code", &code)
            .append_pair("scope", &scope);
    } else {
        back.query_pairs_mut().append_pair("error", "access_denied");
    }
    (StatusCode::FOUND, [(header::LOCATION, back.to_string())]).into_response()
}

/// `POST /oauth/token` with `client_id`, `client_secret`, `code` and
/// `grant_type=authorization_code`: a code is redeemed once, for the documented answer
/// with the summary athlete.
async fn token(State(seen): State<Shared>, body: String) -> Response {
    let mut seen = seen.lock().expect("seen");
    let form = seen.token_request(&body);
    let value = |name: &str| form.get(name).cloned().unwrap_or_default();
    if value("client_id") != CLIENT_ID || value("client_secret") != CLIENT_SECRET {
        let body = json!({
            "message": "Authorization Error",
            "errors": [{"resource": "Application", "field": "", "code": "invalid"}]
        });
        return (StatusCode::UNAUTHORIZED, axum::Json(body)).into_response();
    }
    let grant = seen.grants.remove(&value("code"));
    match grant {
        Some(grant)
            if grant.client_id == value("client_id")
                && value("grant_type") == "authorization_code"
                && grant.scope.contains("activity:read") =>
        {
            let expires_in = 21600;
            axum::Json(json!({
                "token_type": "Bearer",
                "expires_at": chrono::Utc::now().timestamp() + expires_in,
                "expires_in": expires_in,
                "refresh_token": REFRESH_TOKEN,
                "access_token": ACCESS_TOKEN,
                "athlete": {
                    "id": ATHLETE_ID, "username": "marianne_t", "resource_state": 2,
                    "firstname": "Marianne", "lastname": "Teutenberg", "city": "San Francisco",
                    "country": "US", "sex": "F", "premium": true, "summit": true,
                    "created_at": "2017-11-14T02:30:05Z", "updated_at": "2018-02-06T19:32:20Z"
                }
            }))
            .into_response()
        }
        _ => bad_request("AuthorizationCode", "code"),
    }
}

/// Strava's OAuth endpoints on one origin, as `oauth_url`.
async fn emulated_strava() -> (String, Shared) {
    let seen: Shared = Arc::default();
    let router = axum::Router::new()
        .route("/oauth/authorize", axum::routing::get(consent))
        .route("/oauth/accept_application", axum::routing::post(decide))
        .route("/oauth/token", axum::routing::post(token))
        .with_state(Arc::clone(&seen));
    (serve_router(router).await, seen)
}

/// A summary activity as `GET /athlete/activities` lists it.
fn activity(id: i64, name: &str, start_date: &str) -> serde_json::Value {
    json!({
        "resource_state": 2, "athlete": {"id": ATHLETE_ID, "resource_state": 1},
        "name": name, "distance": 28099.0, "moving_time": 4207, "elapsed_time": 4410,
        "total_elevation_gain": 516.0, "type": "Ride", "sport_type": "MountainBikeRide",
        "id": id, "start_date": start_date, "timezone": "(GMT-08:00) America/Los_Angeles",
        "private": false
    })
}

/// The activities API on the app's wiremock: two activities on page 1 and an empty page 2,
/// only for the access token the emulated Strava issued, with Strava's usage headers.
async fn mount_activities(app: &TestApp) {
    let listing = |page: &str| {
        Mock::given(method("GET"))
            .and(path("/api/v3/athlete/activities"))
            .and(query_param("page", page))
            .and(has_header(
                "authorization",
                format!("Bearer {ACCESS_TOKEN}").as_str(),
            ))
    };
    let answer = |body: serde_json::Value| {
        ResponseTemplate::new(200)
            .insert_header("x-ratelimit-limit", "600,6000")
            .insert_header("x-ratelimit-usage", "2,2")
            .set_body_json(body)
    };
    listing("1")
        .respond_with(answer(json!([
            activity(154504250376, "Happy Friday", "2026-11-27T16:35:00Z"),
            activity(154504250377, "Bondcliff", "2026-11-28T07:10:00Z"),
        ])))
        .expect(1)
        .mount(&app.api)
        .await;
    listing("2")
        .respond_with(answer(json!([])))
        .expect(1)
        .mount(&app.api)
        .await;
}

#[tokio::test]
async fn a_user_connects_strava_in_a_browser_and_the_first_sync_stores_their_activities() {
    let app = spawn_app().await;
    mount_activities(&app).await;
    let (strava, seen) = emulated_strava().await;
    let (return_url, visits) = return_page().await;
    let provider = format!(
        "\n[providers.strava]\nkind = \"strava\"\nbase_url = \"{}\"\noauth_url = \"{strava}\"\n\
         client_id = \"{CLIENT_ID}\"\nclient_secret_env = \"TEST_BROWSER_STRAVA_SECRET\"\n\
         schedule = \"0 0 0 1 1 *\"\n",
        app.api.uri()
    );
    let secret = ("TEST_BROWSER_STRAVA_SECRET", CLIENT_SECRET);
    let (served, link) = serve_oauth(&app, &provider, secret, &return_url, "browser-strava").await;
    let driver = Chromedriver::start().await;
    let browser = driver.browser().await;
    press_connect(&browser, &link, "strava").await;
    // Strava's page: the athlete keeps both scopes and authorizes.
    let authorize = appeared(&browser, Locator::Css("button#authorize")).await;
    let consent = browser.source().await.expect("source");
    assert!(
        consent.contains("Authorize tributary test app to connect to Strava"),
        "{consent}"
    );
    for scope in ["read", "activity:read_all"] {
        let checkbox = format!("input[type=checkbox][value='{scope}']");
        let found = appeared(&browser, Locator::Css(&checkbox)).await;
        assert!(found.is_selected().await.expect("its state"), "{scope}");
    }
    authorize.click().await.expect("authorized");
    landed_connected(&browser, &return_url, &visits).await;

    let redirect_uri = format!("{}/connect/callback", served.base);
    let (asked, exchanged) = seen.lock().expect("seen").one_code_exchanged(
        CLIENT_ID,
        &redirect_uri,
        "read,activity:read_all",
    );
    assert_eq!(asked["response_type"], "code");
    assert_eq!(exchanged["client_id"], CLIENT_ID);
    // Strava's documentation has no PKCE: none is asked for, none is sent.
    assert!(!asked.contains_key("code_challenge"), "{asked:?}");
    assert!(!exchanged.contains_key("code_verifier"), "{exchanged:?}");
    // The athlete's id is the connection's account.
    let athlete = ATHLETE_ID.to_string();
    let user = ("browser-strava", "strava", athlete.as_str());
    let stored = sealed_connection(&app, user, ACCESS_TOKEN, Some(REFRESH_TOKEN)).await;
    let expires_in = stored.expires_at.expect("an expiry") - chrono::Utc::now().timestamp();
    assert!((21000..=21600).contains(&expires_in), "{expires_in}");

    // Its first sync lists the activities with the access token and stores them.
    first_sync_succeeded(&app, "browser-strava").await;
    let records = stored_records(&app, "browser-strava").await;
    assert_eq!(
        records,
        vec![
            ("strava".to_string(), "154504250376".to_string()),
            ("strava".to_string(), "154504250377".to_string()),
        ]
    );
    app.api.verify().await;
    browser.close().await.expect("closed");
}
