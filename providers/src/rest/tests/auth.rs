//! `auth`: HTTP basic, and OAuth2's refresh-token and client-credentials grants against a
//! wiremock emulation of an RFC 6749 token endpoint and an API.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use chrono::Utc;
use secrecy::SecretString;
use serde::Deserialize;
use serde_json::{json, Value};
use wiremock::matchers::{header, method, path};
use wiremock::{Match, Mock, MockServer, Request, ResponseTemplate};

use super::{ids, provider, provider_config, rest_config, walk};
use crate::http::{HttpClient, HttpSettings};
use crate::rest::{Auth, ClientAuth, Grant, OAuth2, RestProvider};
use crate::test_support::fast_settings;
use crate::{
    build_provider, CredentialStore, Credentials, FetchContext, FetchError, PagePosition, Provider,
    ProviderConfig, TokenRefresher,
};

const CLIENT_ID: &str = "tributary app";
const CLIENT_SECRET: &str = "cs-f00dfeed0123456789";
const OLD_TOKEN: &str = "at-old-0123456789";
const OLD_REFRESH: &str = "rt-old-0123456789";
const NEW_TOKEN: &str = "at-new-9876543210";
const NEW_REFRESH: &str = "rt-new-9876543210";
const PASSWORD: &str = "pw-correct-horse-battery";

fn now() -> i64 {
    Utc::now().timestamp()
}

/// A `CredentialStore` that refreshes with the refresher it is given and notes what it
/// was asked and what it handed back.
#[derive(Default)]
struct FakeStore {
    asked: Mutex<Vec<Credentials>>,
    gave: Mutex<Vec<Credentials>>,
}

#[async_trait::async_trait]
impl CredentialStore for FakeStore {
    async fn refresh(
        &self,
        stale: &Credentials,
        refresher: std::sync::Arc<dyn TokenRefresher>,
    ) -> Result<Credentials, FetchError> {
        self.asked.lock().unwrap().push(stale.clone());
        let fresh = refresher.refresh(stale).await?;
        self.gave.lock().unwrap().push(fresh.clone());
        Ok(fresh)
    }
}

fn context<'a>(credentials: &'a Credentials, store: &'a FakeStore) -> FetchContext<'a> {
    FetchContext {
        stream: "records",
        parent: None,
        credentials,
        since: None,
        credential_store: store,
        base_url: None,
    }
}

fn credentials(token: &str, refresh_token: Option<&str>, expires_at: Option<i64>) -> Credentials {
    Credentials {
        token: Some(SecretString::from(token)),
        refresh_token: refresh_token.map(SecretString::from),
        expires_at,
    }
}

/// Asserts that no secret of these tests shows in `text`.
fn assert_no_secret(text: &str) {
    for secret in [
        CLIENT_SECRET,
        OLD_TOKEN,
        OLD_REFRESH,
        NEW_TOKEN,
        NEW_REFRESH,
        PASSWORD,
    ] {
        assert!(!text.contains(secret), "{secret} shows in {text}");
    }
}

/// A provider of `auth = { oauth2 = grant, token_url = SERVER/oauth/token, client_id,
/// client_secret_env }` with `auth` merged in and `extra` merged into the table, holding
/// the client secret.
fn oauth_provider(server: &MockServer, grant: &str, auth: Value, extra: Value) -> RestProvider {
    let mut table = json!({
        "oauth2": grant,
        "token_url": format!("{}/oauth/token", server.uri()),
        "client_id": CLIENT_ID,
        "client_secret_env": "ACME_CLIENT_SECRET",
    });
    if let (Some(table), Value::Object(auth)) = (table.as_object_mut(), auth) {
        table.extend(auth);
    }
    let mut config = json!({ "auth": table });
    if let (Some(config), Value::Object(extra)) = (config.as_object_mut(), extra) {
        config.extend(extra);
    }
    RestProvider::with_client_secret(
        rest_config(server, config),
        HttpClient::new(fast_settings()).unwrap(),
        Some(SecretString::from(CLIENT_SECRET)),
    )
}

/// Matches a url-encoded form body holding exactly these fields.
struct FormIs(BTreeMap<String, String>);

impl Match for FormIs {
    fn matches(&self, request: &Request) -> bool {
        let got: BTreeMap<String, String> = url::form_urlencoded::parse(&request.body)
            .into_owned()
            .collect();
        got == self.0
    }
}

fn form(fields: &[(&str, &str)]) -> FormIs {
    FormIs(
        fields
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect(),
    )
}

/// The token endpoint, expecting a `client_secret_post` form with `fields`.
fn token_endpoint(fields: &[(&str, &str)]) -> wiremock::MockBuilder {
    let mut all = vec![("client_id", CLIENT_ID), ("client_secret", CLIENT_SECRET)];
    all.extend_from_slice(fields);
    Mock::given(method("POST"))
        .and(path("/oauth/token"))
        .and(header("content-type", "application/x-www-form-urlencoded"))
        .and(header("accept", "application/json"))
        .and(form(&all))
}

/// An RFC 6749 §5.1 answer.
fn granted(access_token: &str, refresh_token: Option<&str>, expires_in: i64) -> ResponseTemplate {
    let mut body = json!({
        "access_token": access_token,
        "token_type": "Bearer",
        "expires_in": expires_in,
    });
    if let Some(refresh_token) = refresh_token {
        body["refresh_token"] = json!(refresh_token);
    }
    ResponseTemplate::new(200)
        .set_body_json(body)
        .insert_header("cache-control", "no-store")
}

/// The API's list endpoint, for requests bearing `token`.
fn api_with(token: &str) -> wiremock::MockBuilder {
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .and(header("authorization", format!("Bearer {token}").as_str()))
}

fn records(ids: &[u64]) -> ResponseTemplate {
    let records: Vec<Value> = ids.iter().map(|id| json!({"id": id})).collect();
    ResponseTemplate::new(200).set_body_json(json!({ "data": records }))
}

fn unauthorized() -> ResponseTemplate {
    ResponseTemplate::new(401).set_body_json(json!({"error": "invalid_token"}))
}

/// The form bodies the token endpoint received, in order.
async fn token_requests(server: &MockServer) -> Vec<BTreeMap<String, String>> {
    server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .filter(|request| request.url.path() == "/oauth/token")
        .map(|request| {
            url::form_urlencoded::parse(&request.body)
                .into_owned()
                .collect()
        })
        .collect()
}

#[tokio::test]
async fn basic_auth_sends_user_and_password_and_never_shows_them() {
    let server = MockServer::start().await;
    let fixed_user = format!("Basic {}", STANDARD.encode(format!("api:{PASSWORD}")));
    let own_user = format!("Basic {}", STANDARD.encode(format!("alice:{PASSWORD}")));
    for (auth, token, expected) in [
        (json!({"basic": "api"}), PASSWORD.to_string(), &fixed_user),
        (json!("basic"), format!("alice:{PASSWORD}\n"), &own_user),
    ] {
        server.reset().await;
        Mock::given(path("/v1/items"))
            .and(header("authorization", expected.as_str()))
            .respond_with(records(&[1]))
            .expect(1)
            .mount(&server)
            .await;
        let provider = provider(&server, json!({ "auth": auth }));
        let connection = crate::test_support::token_credentials(&token);
        let page = provider
            .fetch_page(&FetchContext::full(&connection, "records"), None)
            .await
            .unwrap();
        assert_eq!(ids(&page.items), ["1"]);
        let headers = provider
            .request_headers(provider.config(), Some(token.trim()))
            .unwrap();
        let shown = format!("{headers:?} {provider:?}");
        assert!(
            !shown.contains(PASSWORD) && !shown.contains(&expected[6..]),
            "{shown}"
        );
    }

    // An API that echoes the credentials back, in clear and encoded.
    server.reset().await;
    Mock::given(path("/v1/items"))
        .respond_with(
            ResponseTemplate::new(401)
                .set_body_string(format!("bad credentials {PASSWORD} in {fixed_user}")),
        )
        .mount(&server)
        .await;
    let provider = provider(&server, json!({"auth": {"basic": "api"}}));
    let connection = crate::test_support::token_credentials(PASSWORD);
    let error = provider
        .fetch_page(&FetchContext::full(&connection, "records"), None)
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "credentials were rejected (HTTP 401): bad credentials [redacted] in Basic [redacted]"
    );
    assert_no_secret(&format!("{error:?}"));

    // `auth = "basic"` needs USER:PASSWORD; the message never quotes the token.
    let provider = super::provider(&server, json!({"auth": "basic"}));
    let error = provider
        .fetch_page(&FetchContext::full(&connection, "records"), None)
        .await
        .unwrap_err();
    assert!(
        matches!(&error, FetchError::MissingCredentials { message }
            if message.contains("USER:PASSWORD") && !message.contains(PASSWORD)),
        "{error:?}"
    );
}

#[tokio::test]
async fn an_expired_token_is_refreshed_through_the_store_before_the_request() {
    let server = MockServer::start().await;
    token_endpoint(&[
        ("grant_type", "refresh_token"),
        ("refresh_token", OLD_REFRESH),
        ("scope", "items:read"),
    ])
    .respond_with(granted(NEW_TOKEN, Some(NEW_REFRESH), 3600))
    .expect(1)
    .mount(&server)
    .await;
    api_with(NEW_TOKEN)
        .respond_with(records(&[7]))
        .expect(1)
        .mount(&server)
        .await;
    api_with(OLD_TOKEN)
        .respond_with(unauthorized())
        .expect(0)
        .mount(&server)
        .await;
    let provider = oauth_provider(
        &server,
        "refresh_token",
        json!({"scope": "items:read"}),
        json!({}),
    );
    let store = FakeStore::default();
    let stale = credentials(OLD_TOKEN, Some(OLD_REFRESH), Some(now() - 10));
    let page = provider
        .fetch_page(&context(&stale, &store), None)
        .await
        .unwrap();
    assert_eq!(ids(&page.items), ["7"]);
    let asked = store.asked.lock().unwrap();
    assert_eq!(asked.len(), 1);
    assert!(asked[0].same_as(&stale));
    let gave = store.gave.lock().unwrap();
    let expires_at = gave[0].expires_at.unwrap();
    assert!((expires_at - (now() + 3600)).abs() <= 2, "{expires_at}");
    // The rotated refresh token is what the store was handed to commit.
    let expected = credentials(NEW_TOKEN, Some(NEW_REFRESH), Some(expires_at));
    assert!(gave[0].same_as(&expected), "{:?}", gave[0]);
}

#[tokio::test]
async fn an_answer_without_a_refresh_token_keeps_the_current_one() {
    let server = MockServer::start().await;
    token_endpoint(&[
        ("grant_type", "refresh_token"),
        ("refresh_token", OLD_REFRESH),
    ])
    .respond_with(granted(NEW_TOKEN, None, 600))
    .expect(1)
    .mount(&server)
    .await;
    api_with(NEW_TOKEN)
        .respond_with(records(&[]))
        .expect(1)
        .mount(&server)
        .await;
    let provider = oauth_provider(&server, "refresh_token", json!({}), json!({}));
    let store = FakeStore::default();
    // No known expiry: refreshed first.
    let stale = credentials(OLD_TOKEN, Some(OLD_REFRESH), None);
    provider
        .fetch_page(&context(&stale, &store), None)
        .await
        .unwrap();
    let gave = store.gave.lock().unwrap();
    let expected = credentials(NEW_TOKEN, Some(OLD_REFRESH), gave[0].expires_at);
    assert!(gave[0].same_as(&expected), "{:?}", gave[0]);
}

#[tokio::test]
async fn a_401_refreshes_once_and_the_retried_request_succeeds() {
    let server = MockServer::start().await;
    api_with(OLD_TOKEN)
        .respond_with(unauthorized())
        .expect(1)
        .mount(&server)
        .await;
    token_endpoint(&[
        ("grant_type", "refresh_token"),
        ("refresh_token", OLD_REFRESH),
    ])
    .respond_with(granted(NEW_TOKEN, Some(NEW_REFRESH), 3600))
    .expect(1)
    .mount(&server)
    .await;
    api_with(NEW_TOKEN)
        .respond_with(records(&[8]))
        .expect(1)
        .mount(&server)
        .await;
    let provider = oauth_provider(&server, "refresh_token", json!({}), json!({}));
    let store = FakeStore::default();
    let valid = credentials(OLD_TOKEN, Some(OLD_REFRESH), Some(now() + 3600));
    let page = provider
        .fetch_page(&context(&valid, &store), None)
        .await
        .unwrap();
    assert_eq!(ids(&page.items), ["8"]);
    let asked = store.asked.lock().unwrap();
    assert_eq!(asked.len(), 1);
    assert!(asked[0].same_as(&valid));
    let gave = store.gave.lock().unwrap();
    assert!(gave[0].same_as(&credentials(
        NEW_TOKEN,
        Some(NEW_REFRESH),
        gave[0].expires_at
    )));
}

#[tokio::test]
async fn a_second_401_is_unauthorized_without_secrets() {
    let server = MockServer::start().await;
    Mock::given(path("/v1/items"))
        .respond_with(
            ResponseTemplate::new(401)
                .set_body_string(format!("token {NEW_TOKEN} or {OLD_TOKEN} is not valid")),
        )
        .expect(2)
        .mount(&server)
        .await;
    token_endpoint(&[
        ("grant_type", "refresh_token"),
        ("refresh_token", OLD_REFRESH),
    ])
    .respond_with(granted(NEW_TOKEN, Some(NEW_REFRESH), 3600))
    .expect(1)
    .mount(&server)
    .await;
    let provider = oauth_provider(&server, "refresh_token", json!({}), json!({}));
    let store = FakeStore::default();
    let valid = credentials(OLD_TOKEN, Some(OLD_REFRESH), Some(now() + 3600));
    let error = provider
        .fetch_page(&context(&valid, &store), None)
        .await
        .unwrap_err();
    assert!(
        matches!(error, FetchError::Unauthorized { status: 401, .. }),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "credentials were rejected (HTTP 401): token [redacted] or [redacted] is not valid"
    );
    assert_eq!(store.asked.lock().unwrap().len(), 1);
    assert_no_secret(&format!("{error} {error:?} {provider:?}"));
}

#[tokio::test]
async fn the_token_endpoints_invalid_grant_is_surfaced_without_secrets() {
    let server = MockServer::start().await;
    token_endpoint(&[
        ("grant_type", "refresh_token"),
        ("refresh_token", OLD_REFRESH),
    ])
    .respond_with(ResponseTemplate::new(400).set_body_json(json!({
        "error": "invalid_grant",
        "error_description": format!("refresh token {OLD_REFRESH} was revoked for {CLIENT_SECRET}"),
    })))
    .expect(1)
    .mount(&server)
    .await;
    Mock::given(path("/v1/items"))
        .respond_with(records(&[]))
        .expect(0)
        .mount(&server)
        .await;
    let provider = oauth_provider(&server, "refresh_token", json!({}), json!({}));
    let store = FakeStore::default();
    let stale = credentials(OLD_TOKEN, Some(OLD_REFRESH), Some(now() - 10));
    let error = provider
        .fetch_page(&context(&stale, &store), None)
        .await
        .unwrap_err();
    assert!(
        matches!(error, FetchError::Unauthorized { status: 400, .. }),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "credentials were rejected (HTTP 400): the token endpoint refused the refresh: \
         invalid_grant: refresh token [redacted] was revoked for [redacted]"
    );
    assert!(store.gave.lock().unwrap().is_empty());
    assert_no_secret(&format!("{error} {error:?} {provider:?} {stale:?}"));
}

#[tokio::test]
async fn unusable_token_answers_are_shape_errors_without_the_tokens() {
    let server = MockServer::start().await;
    let answers = [
        (
            json!({"refresh_token": NEW_REFRESH, "expires_in": 60}),
            "has no access_token",
        ),
        (
            json!({"access_token": NEW_TOKEN, "token_type": "mac", "refresh_token": NEW_REFRESH}),
            "has token_type \"mac\"; only bearer tokens can be sent",
        ),
        (
            json!({"access_token": format!("{NEW_TOKEN}\u{7}"), "token_type": "bearer"}),
            "has an access_token with characters other than visible ASCII",
        ),
    ];
    for (body, expected) in answers {
        server.reset().await;
        token_endpoint(&[
            ("grant_type", "refresh_token"),
            ("refresh_token", OLD_REFRESH),
        ])
        .respond_with(ResponseTemplate::new(200).set_body_json(&body))
        .expect(1)
        .mount(&server)
        .await;
        let provider = oauth_provider(&server, "refresh_token", json!({}), json!({}));
        let store = FakeStore::default();
        let stale = credentials(OLD_TOKEN, Some(OLD_REFRESH), Some(now() - 10));
        let error = provider
            .fetch_page(&context(&stale, &store), None)
            .await
            .unwrap_err();
        assert_no_secret(&format!("{error:?}"));
        // A refresh token the refused answer rotated is handed to the store to keep, with
        // the access token that was the connection's.
        let (error, kept) = match error {
            FetchError::RefusedWithRotation { error, kept } => (*error, Some(kept)),
            error => (error, None),
        };
        let kept = kept.map(|kept| {
            use secrecy::ExposeSecret;
            let secret = |token: Option<SecretString>| token.map(|t| t.expose_secret().to_string());
            (secret(kept.token), secret(kept.refresh_token))
        });
        let rotated = body.get("refresh_token").is_some();
        assert_eq!(
            kept,
            rotated.then(|| (Some(OLD_TOKEN.to_string()), Some(NEW_REFRESH.to_string()))),
            "{body}"
        );
        assert!(matches!(error, FetchError::Shape { .. }), "{error:?}");
        assert!(error.to_string().contains(expected), "{error}");
        assert_no_secret(&format!("{error} {error:?} {:?}", error.body()));
    }
}

#[tokio::test]
async fn client_auth_basic_sends_the_form_encoded_id_and_secret_in_the_header() {
    let server = MockServer::start().await;
    let basic = STANDARD.encode(format!("tributary+app:{CLIENT_SECRET}"));
    Mock::given(method("POST"))
        .and(path("/oauth/token"))
        .and(header("authorization", format!("Basic {basic}").as_str()))
        .and(form(&[("grant_type", "client_credentials")]))
        .respond_with(granted(NEW_TOKEN, None, 3600))
        .expect(1)
        .mount(&server)
        .await;
    api_with(NEW_TOKEN)
        .respond_with(records(&[1]))
        .expect(1)
        .mount(&server)
        .await;
    let provider = oauth_provider(
        &server,
        "client_credentials",
        json!({"client_auth": "basic"}),
        json!({}),
    );
    let page = provider
        .fetch_page(
            &FetchContext::full(&Credentials::default(), "records"),
            None,
        )
        .await
        .unwrap();
    assert_eq!(ids(&page.items), ["1"]);
}

#[tokio::test]
async fn one_client_credentials_token_serves_several_pages_and_concurrent_fetches() {
    let server = MockServer::start().await;
    token_endpoint(&[
        ("grant_type", "client_credentials"),
        ("scope", "items:read"),
    ])
    // Slow enough that the concurrent fetches below wait on the same request.
    .respond_with(granted(NEW_TOKEN, None, 3600).set_delay(Duration::from_millis(200)))
    .expect(1)
    .mount(&server)
    .await;
    let page = |ids: &[u64], next: Value| {
        let records: Vec<Value> = ids.iter().map(|id| json!({"id": id})).collect();
        ResponseTemplate::new(200).set_body_json(json!({"data": records, "next": next}))
    };
    api_with(NEW_TOKEN)
        .and(wiremock::matchers::query_param_is_missing("cursor"))
        .respond_with(page(&[1], json!("c2")))
        .mount(&server)
        .await;
    api_with(NEW_TOKEN)
        .and(wiremock::matchers::query_param("cursor", "c2"))
        .respond_with(page(&[2], json!("c3")))
        .mount(&server)
        .await;
    api_with(NEW_TOKEN)
        .and(wiremock::matchers::query_param("cursor", "c3"))
        .respond_with(page(&[3], Value::Null))
        .mount(&server)
        .await;
    let provider = oauth_provider(
        &server,
        "client_credentials",
        json!({"scope": "items:read"}),
        json!({"pagination": {"type": "cursor", "cursor_path": "next", "cursor_param": "cursor"}}),
    );
    let none = Credentials::default();
    let first = PagePosition::Cursor {
        cursor: "c2".into(),
    };
    let context = FetchContext::full(&none, "records");
    let (a, b) = tokio::join!(
        provider.fetch_page(&context, None),
        provider.fetch_page(&context, Some(&first)),
    );
    assert_eq!(ids(&a.unwrap().items), ["1"]);
    assert_eq!(ids(&b.unwrap().items), ["2"]);
    let (all, _) = walk(&provider, &none).await.unwrap();
    assert_eq!(all, ["1", "2", "3"]);
    assert_eq!(token_requests(&server).await.len(), 1);
}

#[tokio::test]
async fn a_client_credentials_token_near_expiry_is_fetched_again() {
    let server = MockServer::start().await;
    // Thirty seconds to live is within the refresh margin: the next page fetches anew.
    token_endpoint(&[("grant_type", "client_credentials")])
        .respond_with(granted(OLD_TOKEN, None, 30))
        .up_to_n_times(1)
        .expect(1)
        .mount(&server)
        .await;
    token_endpoint(&[("grant_type", "client_credentials")])
        .respond_with(granted(NEW_TOKEN, None, 3600))
        .expect(1)
        .mount(&server)
        .await;
    api_with(OLD_TOKEN)
        .respond_with(records(&[1]))
        .expect(1)
        .mount(&server)
        .await;
    api_with(NEW_TOKEN)
        .respond_with(records(&[2]))
        .expect(2)
        .mount(&server)
        .await;
    let provider = oauth_provider(&server, "client_credentials", json!({}), json!({}));
    let none = Credentials::default();
    let context = FetchContext::full(&none, "records");
    let mut seen = Vec::new();
    for _ in 0..3 {
        let page = provider.fetch_page(&context, None).await.unwrap();
        seen.extend(ids(&page.items));
    }
    assert_eq!(seen, ["1", "2", "2"]);
    assert_eq!(token_requests(&server).await.len(), 2);
}

#[tokio::test]
async fn a_client_credentials_token_without_a_lifetime_serves_several_pages() {
    for expires_in in [0, -5] {
        let server = MockServer::start().await;
        // No lifetime would mean a token before every page; it is taken to live the floor.
        token_endpoint(&[("grant_type", "client_credentials")])
            .respond_with(granted(NEW_TOKEN, None, expires_in))
            .mount(&server)
            .await;
        api_with(NEW_TOKEN)
            .respond_with(records(&[1]))
            .expect(4)
            .mount(&server)
            .await;
        let provider = oauth_provider(&server, "client_credentials", json!({}), json!({}));
        let none = Credentials::default();
        let context = FetchContext::full(&none, "records");
        for _ in 0..4 {
            provider.fetch_page(&context, None).await.unwrap();
        }
        assert_eq!(
            token_requests(&server).await.len(),
            1,
            "expires_in {expires_in}"
        );
    }
    let now = Utc::now();
    for (expires_at, expires_in) in [(None, Some(0)), (None, Some(i64::MIN)), (Some(0), None)] {
        assert_eq!(
            crate::oauth2::expiry(expires_at, expires_in, now),
            Some(now.timestamp() + crate::oauth2::MIN_TOKEN_LIFETIME_SECONDS)
        );
    }
}

#[tokio::test]
async fn a_401_fetches_a_new_client_credentials_token_once() {
    let server = MockServer::start().await;
    token_endpoint(&[("grant_type", "client_credentials")])
        .respond_with(granted(OLD_TOKEN, None, 3600))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    token_endpoint(&[("grant_type", "client_credentials")])
        .respond_with(granted(NEW_TOKEN, None, 3600))
        .mount(&server)
        .await;
    api_with(OLD_TOKEN)
        .respond_with(unauthorized())
        .expect(1)
        .mount(&server)
        .await;
    api_with(NEW_TOKEN)
        .respond_with(records(&[5]))
        .up_to_n_times(1)
        .expect(1)
        .mount(&server)
        .await;
    let provider = oauth_provider(&server, "client_credentials", json!({}), json!({}));
    let none = Credentials::default();
    let context = FetchContext::full(&none, "records");
    let page = provider.fetch_page(&context, None).await.unwrap();
    assert_eq!(ids(&page.items), ["5"]);
    assert_eq!(token_requests(&server).await.len(), 2);

    // The new token is refused too: one more token, then the 401 stands.
    api_with(NEW_TOKEN)
        .respond_with(unauthorized())
        .mount(&server)
        .await;
    let error = provider.fetch_page(&context, None).await.unwrap_err();
    assert!(
        matches!(error, FetchError::Unauthorized { status: 401, .. }),
        "{error:?}"
    );
    assert_eq!(token_requests(&server).await.len(), 3);
    assert_no_secret(&format!("{error} {error:?} {provider:?}"));
}

#[test]
fn oauth2_config_parses_from_toml_and_declares_its_secret() {
    let text = r#"
        kind = "rest"
        base_url = "https://api.acme.example"
        path = "/v1/items"
        [auth]
        oauth2 = "client_credentials"
        token_url = "https://auth.acme.example/oauth/token"
        client_id = "tributary"
        client_secret_env = "ACME_CLIENT_SECRET"
        scope = "items:read items:write"
        client_auth = "basic"
    "#;
    let table: toml::Table = toml::from_str(text).unwrap();
    let config = ProviderConfig::deserialize(table).unwrap();
    config.validate().unwrap();
    assert!(!config.needs_token());
    assert_eq!(
        config.required_env_vars(),
        [(
            "auth.client_secret_env".to_string(),
            "ACME_CLIENT_SECRET".to_string()
        )]
    );
    let ProviderConfig::Rest(rest) = config else {
        panic!("expected a rest config, got {config:?}");
    };
    assert_eq!(
        rest.auth,
        Auth::OAuth2(OAuth2 {
            grant: Grant::ClientCredentials,
            token_url: "https://auth.acme.example/oauth/token".parse().unwrap(),
            client_id: "tributary".into(),
            client_secret_env: Some("ACME_CLIENT_SECRET".into()),
            scope: Some("items:read items:write".into()),
            client_auth: ClientAuth::Basic,
            authorize_url: None,
            pkce: true,
        })
    );

    // A public client refreshing tokens sends no secret; its connections need tokens.
    let public = provider_config(json!({
        "kind": "rest", "base_url": "https://api.acme.example",
        "auth": {"oauth2": "refresh_token", "token_url": "https://auth.acme.example/token",
                 "client_id": "tributary"},
    }))
    .unwrap();
    public.validate().unwrap();
    assert!(public.needs_token());
    assert!(public.required_env_vars().is_empty());
}

#[test]
fn auth_errors_name_the_key_that_is_wrong() {
    let with_auth = |auth: Value| {
        provider_config(
            json!({"kind": "rest", "base_url": "https://api.acme.example", "auth": auth}),
        )
    };
    let oauth2 = |extra: Value| {
        let mut auth = json!({
            "oauth2": "client_credentials",
            "token_url": "https://auth.acme.example/token",
            "client_id": "tributary",
            "client_secret_env": "ACME_CLIENT_SECRET",
        });
        if let (Some(auth), Value::Object(extra)) = (auth.as_object_mut(), extra) {
            auth.extend(extra);
        }
        auth
    };
    let without = |key: &str| {
        let mut auth = oauth2(json!({}));
        auth.as_object_mut().unwrap().remove(key);
        auth
    };
    let refused_by_the_parser = [
        (
            without("token_url"),
            "auth.token_url is required with auth.oauth2 = \"client_credentials\"",
        ),
        (without("client_id"), "auth.client_id is required"),
        (
            without("client_secret_env"),
            "auth.client_secret_env is required",
        ),
        (
            oauth2(json!({"token_url": "not a url"})),
            "auth.token_url \"not a url\" is not a valid URL",
        ),
        (
            oauth2(json!({"scopes": "x"})),
            "auth.scopes is not a key of auth = { oauth2 = ... }",
        ),
        (
            oauth2(json!({"oauth2": "password"})),
            "auth.oauth2 must be \"refresh_token\" or \"client_credentials\", not \"password\"",
        ),
        (
            oauth2(json!({"client_auth": "jwt"})),
            "auth.client_auth must be \"post\" or \"basic\", not \"jwt\"",
        ),
        (
            oauth2(json!({"client_id": 42})),
            "auth.client_id must be a string, not a number",
        ),
        (
            json!({"basic": "api", "header": "X"}),
            "found a table with the keys \"basic\" and \"header\"",
        ),
    ];
    for (auth, expected) in refused_by_the_parser {
        let error = with_auth(auth.clone()).unwrap_err().to_string();
        assert!(error.contains(expected), "{auth}: {error}");
    }
    let secret = "0123456789abcdef0123456789abcdef01234567";
    let refused_by_validate = [
        (
            oauth2(json!({"token_url": "http://auth.acme.example/token"})),
            "auth.token_url must be an https URL",
        ),
        (
            oauth2(json!({"token_url": "ftp://auth.acme.example/token"})),
            "auth.token_url must be an http or https URL",
        ),
        (
            oauth2(json!({"token_url": "https://id:pw@auth.acme.example/token"})),
            "auth.token_url must not carry user:password@",
        ),
        (
            oauth2(json!({"client_id": " "})),
            "auth.client_id must not be empty",
        ),
        (
            oauth2(json!({"client_secret_env": "A B"})),
            "auth.client_secret_env must be the name of an environment variable",
        ),
        (
            oauth2(json!({"client_secret_env": secret})),
            "auth.client_secret_env looks like a client secret itself",
        ),
        (oauth2(json!({"scope": "read \"all\""})), "auth.scope"),
        (
            json!({"basic": "a:b"}),
            "auth.basic \"a:b\" must not contain ':'",
        ),
        (json!({"basic": ""}), "auth.basic must name a user"),
    ];
    for (auth, expected) in refused_by_validate {
        let error = with_auth(auth.clone()).unwrap().validate().unwrap_err();
        assert!(error.contains(expected), "{auth}: {error}");
        assert!(!error.contains(secret) && !error.contains("pw@"), "{error}");
    }
    let public_basic = json!({"oauth2": "refresh_token", "token_url": "https://a.example/t",
                              "client_id": "x", "client_auth": "basic"});
    let error = with_auth(public_basic).unwrap().validate().unwrap_err();
    assert!(
        error.contains("auth.client_auth = \"basic\" needs auth.client_secret_env"),
        "{error}"
    );
    let error = provider_config(json!({
        "kind": "rest", "base_url": "https://api.acme.example", "auth": {"basic": "api"},
        "headers": {"Authorization": "x"},
    }))
    .unwrap()
    .validate()
    .unwrap_err();
    assert!(
        error.contains("headers.Authorization would clash"),
        "{error}"
    );
}

#[test]
fn build_provider_reads_the_client_secret_from_the_named_variable() {
    let config = |name: &str| {
        provider_config(json!({
            "kind": "rest", "base_url": "https://api.acme.example",
            "auth": {"oauth2": "client_credentials", "token_url": "https://auth.acme.example/t",
                     "client_id": "tributary", "client_secret_env": name},
        }))
        .unwrap()
    };
    let unset = "TRIBUTARY_TEST_UNSET_REST_SECRET_5B1C";
    let error = build_provider(&config(unset), &HttpSettings::default())
        .err()
        .unwrap();
    assert!(
        matches!(&error, FetchError::Client { message } if message.contains(unset)
            && message.contains("auth.client_secret_env")),
        "{error:?}"
    );
    // Cargo sets CARGO_PKG_NAME for the tests it runs.
    assert!(build_provider(&config("CARGO_PKG_NAME"), &HttpSettings::default()).is_ok());
}
