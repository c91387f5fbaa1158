//! Connect with the presets whose APIs offer OAuth2 (GitLab, Asana, Harvest, Pipedrive):
//! the page sends the browser to the vendor's documented authorization endpoint with the
//! documented parameters, and the code is exchanged in the form the vendor documents
//! (client credentials in the form or as HTTP Basic, PKCE where supported). The
//! authorization server is emulated on wiremock: the test overrides only the host of the
//! preset's endpoints; `providers/src/presets/tests/mechanism.rs` checks the hosts.

use base64::Engine;
use reqwest::StatusCode;
use serde_json::json;
use sha2::Digest;
use wiremock::matchers::{method, path};
use wiremock::{Mock, ResponseTemplate};

use crate::connect::{connections_of, open, RETURN_URL};
use crate::connect_oauth::{
    authorize, callback, code_and_state, session, token_authorization, token_requests, CODE,
};
use crate::helpers::spawn_app;
use crate::http::Served;

const CLIENT_SECRET: &str = "preset-app-secret-0123";

/// What a vendor documents of its authorization code grant.
struct Documented {
    preset: &'static str,
    /// The keys the preset requires.
    requires: &'static str,
    authorize_path: &'static str,
    token_path: &'static str,
    pkce: bool,
    /// The client credentials go as HTTP Basic rather than in the form.
    basic: bool,
    scope: Option<&'static str>,
}

/// Connects `u1` through the preset's consent and checks both requests against `doc`.
async fn connects_as_documented(doc: Documented) {
    let app = spawn_app().await;
    let uri = app.api.uri();
    let provider = format!(
        "\n[providers.vendor]\npreset = \"{}\"\nbase_url = \"{uri}/api\"\n{}\n\
         schedule = \"0 0 0 1 1 *\"\n\
         auth = {{ oauth2 = \"refresh_token\", client_id = \"app-1\", \
         client_secret_env = \"TEST_APP_SECRET\", authorize_url = \"{uri}{}\", \
         token_url = \"{uri}{}\" }}\n",
        doc.preset, doc.requires, doc.authorize_path, doc.token_path
    );
    Mock::given(method("POST"))
        .and(path(doc.token_path))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "access_token": "vendor-access-0123", "token_type": "Bearer", "expires_in": 3600,
            "refresh_token": "vendor-refresh-0123"
        })))
        .expect(1)
        .mount(&app.api)
        .await;
    let served = Served::start_with_env(
        &app,
        &provider,
        &[("TEST_APP_SECRET", CLIENT_SECRET)],
        crate::connect::with_connect(RETURN_URL),
    )
    .await;
    let admin = served.create_key("admin", &["admin"]);
    let url = session(&served, &admin, "u1", "vendor").await;
    let (cookie, _) = open(&url).await;
    let (query, endpoint, callback_cookie) = authorize(&url, &cookie, "vendor").await;
    let redirect_uri = format!("{}/connect/callback", served.base);
    assert_eq!(endpoint, format!("{uri}{}", doc.authorize_path));
    assert_eq!(query["response_type"], "code");
    assert_eq!(query["client_id"], "app-1");
    assert_eq!(query["redirect_uri"], redirect_uri);
    assert!(query["state"].len() >= 32, "{query:?}");
    assert_eq!(query.get("scope").map(String::as_str), doc.scope);
    match doc.pkce {
        true => assert_eq!(query["code_challenge_method"], "S256", "{query:?}"),
        false => assert!(!query.contains_key("code_challenge"), "{query:?}"),
    }

    let (status, location, body) = callback(
        &served,
        &code_and_state(CODE, &query["state"]),
        Some(&callback_cookie),
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    assert_eq!(location, format!("{RETURN_URL}?outcome=connected"));
    let requests = token_requests(&app, doc.token_path).await;
    assert_eq!(requests.len(), 1);
    let (fields, _) = &requests[0];
    assert_eq!(fields["grant_type"], "authorization_code");
    assert_eq!(fields["code"], CODE);
    assert_eq!(fields["redirect_uri"], redirect_uri);
    let authorization = token_authorization(&app, doc.token_path).await;
    if doc.basic {
        let basic =
            base64::engine::general_purpose::STANDARD.encode(format!("app-1:{CLIENT_SECRET}"));
        assert_eq!(authorization, Some(format!("Basic {basic}")));
        assert!(!fields.contains_key("client_secret"), "{fields:?}");
    } else {
        assert_eq!(authorization, None);
        assert_eq!(fields["client_id"], "app-1");
        assert_eq!(fields["client_secret"], CLIENT_SECRET);
    }
    match doc.pkce {
        true => {
            let derived = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .encode(sha2::Sha256::digest(fields["code_verifier"].as_bytes()));
            assert_eq!(derived, query["code_challenge"]);
        }
        false => assert!(!fields.contains_key("code_verifier"), "{fields:?}"),
    }
    assert_eq!(connections_of(&app, "u1").await.len(), 1);
    let stored = app.stored_credentials("u1", "vendor").await;
    assert_eq!(stored.token.as_deref(), Some("vendor-access-0123"));
    assert_eq!(stored.refresh_token.as_deref(), Some("vendor-refresh-0123"));
}

#[tokio::test]
async fn gitlab_authorizes_with_pkce_and_read_api_and_takes_the_secret_in_the_form() {
    connects_as_documented(Documented {
        preset: "gitlab_issues",
        requires: "path = \"/groups/7/issues\"",
        authorize_path: "/oauth/authorize",
        token_path: "/oauth/token",
        pkce: true,
        basic: false,
        scope: Some("read_api"),
    })
    .await;
}

#[tokio::test]
async fn asana_authorizes_with_pkce_and_takes_the_secret_in_the_form() {
    connects_as_documented(Documented {
        preset: "asana_tasks",
        requires: "query = { project = \"1200000000000000\" }",
        authorize_path: "/-/oauth_authorize",
        token_path: "/-/oauth_token",
        pkce: true,
        basic: false,
        scope: None,
    })
    .await;
}

#[tokio::test]
async fn harvest_authorizes_at_its_id_service_and_takes_the_secret_in_the_form() {
    connects_as_documented(Documented {
        preset: "harvest_time_entries",
        requires: "headers = { \"Harvest-Account-Id\" = \"123456\" }",
        authorize_path: "/oauth2/authorize",
        token_path: "/api/v2/oauth2/token",
        pkce: false,
        basic: false,
        scope: None,
    })
    .await;
}

#[tokio::test]
async fn pipedrive_authorizes_and_takes_the_client_credentials_as_http_basic() {
    connects_as_documented(Documented {
        preset: "pipedrive_deals",
        requires: "",
        authorize_path: "/oauth/authorize",
        token_path: "/oauth/token",
        pkce: false,
        basic: true,
        scope: None,
    })
    .await;
}
