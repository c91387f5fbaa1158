//! Shopify's per-shop flow on the Connect page, in process (docs/decisions/connect-shopify.md):
//! the page, the shop form, the shop's authorization and the callback signed as Shopify
//! signs it, with the code exchanged on an emulated shop over TLS at
//! `test-shop.myshopify.com`, which only the client handed in through
//! [`ShopifyClients`] resolves to loopback and trusts. And the attacks: a bad `hmac`,
//! another shop, a shop off `myshopify.com`, a replayed callback.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::RawQuery;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Router;
use hmac::{Hmac, Mac};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
use sha2::Sha256;
use tributary_providers::{HttpClient, HttpSettings};

use super::super::state::ApiState;
use crate::entities::{connect_session, connection, sync_job};
use crate::ops::connect::oauth::ShopifyClients;
use crate::testing::TestDb;

const TEST_SHOP: &str = "test-shop.myshopify.com";
const RETURN_URL: &str = "https://app.example/connected";
const CLIENT_ID: &str = "api-key-1";
/// The client secret: the value of `CARGO_PKG_NAME`, which cargo sets for every test.
const CLIENT_SECRET: &str = env!("CARGO_PKG_NAME");
const CODE: &str = "0907a61c0c8d55e99db179b68161bc00";
const ACCESS_TOKEN: &str = "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";

/// What the emulated shop received: each request's path and its query or form body.
type Received = Arc<Mutex<Vec<(String, HashMap<String, String>)>>>;

fn fields(text: &str) -> HashMap<String, String> {
    form_urlencoded::parse(text.as_bytes())
        .into_owned()
        .collect()
}

/// The callback's query as Shopify sends it: `params` and their `hmac` keyed by `secret`.
fn signed(params: &[(&str, &str)], secret: &str) -> String {
    let mut sorted: Vec<(&str, &str)> = params.to_vec();
    sorted.sort();
    let message = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(sorted.iter())
        .finish();
    // Shopify's documented message is `name=value` joined by `&`; these values need no
    // escaping, so the form encoding above is the same text.
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("a key");
    mac.update(message.as_bytes());
    let hmac = const_hex::encode(mac.finalize().into_bytes());
    let mut query = form_urlencoded::Serializer::new(String::new());
    query.extend_pairs(params.iter());
    query.append_pair("hmac", &hmac);
    query.finish()
}

/// The emulated shop: its authorization page consents at once and redirects to the
/// `redirect_uri` with a callback signed with the app's secret; its token endpoint
/// answers an offline token. Served over TLS with a certificate for `TEST_SHOP`.
async fn emulated_shop(received: Received) -> (std::net::SocketAddr, reqwest::Certificate) {
    use axum::routing::{get, post};
    use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
    let identity =
        rcgen::generate_simple_self_signed(vec![TEST_SHOP.to_string()]).expect("a certificate");
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        identity.signing_key.serialize_der(),
    ));
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(vec![identity.cert.der().clone()], key)
        .expect("the certificate");
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let on_authorize = received.clone();
    let on_token = received;
    let shop = Router::new()
        .route(
            "/admin/oauth/authorize",
            get(move |RawQuery(query): RawQuery| async move {
                let query = fields(&query.unwrap_or_default());
                on_authorize
                    .lock()
                    .expect("lock")
                    .push(("/admin/oauth/authorize".to_string(), query.clone()));
                let back = signed(
                    &[
                        ("code", CODE),
                        ("host", "YWRtaW4uc2hvcGlmeS5jb20vc3RvcmUvdGVzdC1zaG9w"),
                        ("shop", TEST_SHOP),
                        ("state", query.get("state").map_or("", String::as_str)),
                        ("timestamp", "1765000000"),
                    ],
                    CLIENT_SECRET,
                );
                let redirect_uri = query.get("redirect_uri").cloned().unwrap_or_default();
                (
                    StatusCode::FOUND,
                    [(header::LOCATION, format!("{redirect_uri}?{back}"))],
                )
                    .into_response()
            }),
        )
        .route(
            "/admin/oauth/access_token",
            post(move |body: String| async move {
                on_token
                    .lock()
                    .expect("lock")
                    .push(("/admin/oauth/access_token".to_string(), fields(&body)));
                (
                    [(header::CONTENT_TYPE, "application/json")],
                    format!(r#"{{"access_token":"{ACCESS_TOKEN}","scope":"read_orders"}}"#),
                )
                    .into_response()
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bound");
    let address = listener.local_addr().expect("address");
    let listener =
        super::super::tls::TlsListener::new(listener, Arc::new(config), Duration::from_secs(10));
    tokio::spawn(async move { axum::serve(listener, shop).await });
    let certificate = reqwest::Certificate::from_pem(identity.cert.pem().as_bytes()).expect("PEM");
    (address, certificate)
}

/// The test's browser: no redirects followed, `TEST_SHOP` at `shop`, trusting its
/// certificate alone.
fn browser(shop: std::net::SocketAddr, certificate: reqwest::Certificate) -> reqwest::Client {
    reqwest::Client::builder()
        .resolve(TEST_SHOP, shop)
        .tls_certs_only([certificate])
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("a client")
}

/// The API with a Shopify app `shop`, serving on loopback, its exchanges sent with
/// `client`.
struct Served {
    test: TestDb,
    base: String,
    browser: reqwest::Client,
    received: Received,
    settings: Arc<crate::config::Settings>,
}

async fn serve() -> Served {
    let test = TestDb::new().await;
    let received = Received::default();
    let (shop, certificate) = emulated_shop(received.clone()).await;
    let browser = browser(shop, certificate.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bound");
    let listen = listener.local_addr().expect("address");
    let settings = test.settings(&format!(
        "[api]\nlisten = \"{listen}\"\n\
         [connect]\npublic_url = \"http://{listen}\"\nreturn_urls = [\"{RETURN_URL}\"]\n\
         [providers.shop]\npreset = \"shopify_orders\"\nschedule = \"0 0 0 1 1 *\"\n\
         auth = {{ shopify_app = {{ client_id = \"{CLIENT_ID}\", client_secret_env = \"CARGO_PKG_NAME\", scope = \"read_orders\" }} }}\n"
    ));
    let api = settings.api.clone().expect("[api]");
    let mut state = ApiState::new(test.db.clone(), settings.clone(), Arc::default());
    let exchanges = HttpClient::new(HttpSettings {
        max_retries: 0,
        ..HttpSettings::default()
    })
    .expect("a client")
    .with_reqwest(browser.clone());
    state.shopify_clients = ShopifyClients::with("shop", exchanges);
    let app = super::super::app(&api, state);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Served {
        test,
        base: format!("http://{listen}"),
        browser,
        received,
        settings,
    }
}

impl Served {
    /// A session's link for user `u1` to connect `shop`.
    async fn session(&self) -> String {
        let new = crate::ops::connect::NewSession {
            user_id: "u1".to_string(),
            providers: vec!["shop".to_string()],
            return_url: RETURN_URL.to_string(),
            reconnect: None,
        };
        crate::ops::connect::create_session(&self.test.db, &self.settings, new)
            .await
            .expect("a session")
            .url
    }

    async fn get(&self, url: &str, cookie: Option<&str>) -> reqwest::Response {
        let mut request = self.browser.get(url);
        if let Some(cookie) = cookie {
            request = request.header(header::COOKIE, cookie);
        }
        request.send().await.expect("an answer")
    }

    /// The link opened and the shop's button pressed: the page's cookie, the shop form's
    /// page and its CSRF token.
    async fn shop_form(&self, url: &str) -> (String, reqwest::Response, String) {
        let opened = self.get(url, None).await;
        assert_eq!(opened.status(), StatusCode::OK);
        let cookie = cookie_pair(&opened);
        let page = opened.text().await.expect("page");
        assert!(page.contains("Connect shop"), "{page}");
        let form = self.get(&format!("{url}/shop"), Some(&cookie)).await;
        assert_eq!(form.status(), StatusCode::OK);
        let policy = form.headers()[header::CONTENT_SECURITY_POLICY]
            .to_str()
            .expect("policy")
            .to_string();
        assert!(
            policy.contains("form-action 'self' https://*.myshopify.com;"),
            "{policy}"
        );
        let html = form.text().await.expect("form");
        let csrf = csrf_of(&html);
        let again = self.get(&format!("{url}/shop"), Some(&cookie)).await;
        (cookie, again, csrf)
    }

    async fn post_shop(
        &self,
        url: &str,
        cookie: &str,
        csrf: &str,
        shop: &str,
    ) -> reqwest::Response {
        let body = form_urlencoded::Serializer::new(String::new())
            .append_pair("csrf", csrf)
            .append_pair("shop", shop)
            .finish();
        self.browser
            .post(format!("{url}/shop"))
            .header(header::COOKIE, cookie)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(body)
            .send()
            .await
            .expect("an answer")
    }

    /// The shop form posted with `TEST_SHOP`: the authorization URL and the callback's
    /// cookie.
    async fn authorize(&self, url: &str) -> (url::Url, String) {
        let (cookie, _, csrf) = self.shop_form(url).await;
        self.authorize_with(url, &cookie, &csrf).await
    }

    /// As [`Served::authorize`], on a form already open.
    async fn authorize_with(&self, url: &str, cookie: &str, csrf: &str) -> (url::Url, String) {
        let posted = self.post_shop(url, cookie, csrf, "Test-Shop").await;
        assert_eq!(posted.status(), StatusCode::SEE_OTHER);
        let location = location_of(&posted);
        (
            url::Url::parse(&location).expect("a URL"),
            cookie_pair(&posted),
        )
    }

    async fn callback(&self, query: &str, cookie: &str) -> reqwest::Response {
        self.get(
            &format!("{}/connect/callback?{query}", self.base),
            Some(cookie),
        )
        .await
    }

    async fn connections(&self) -> Vec<connection::Model> {
        connection::Entity::find()
            .all(self.test.main())
            .await
            .expect("connections")
    }

    async fn session_row(&self) -> connect_session::Model {
        connect_session::Entity::find()
            .one(self.test.main())
            .await
            .expect("read")
            .expect("a session")
    }

    fn requests_to(&self, at: &str) -> Vec<HashMap<String, String>> {
        self.received
            .lock()
            .expect("lock")
            .iter()
            .filter(|(path, _)| path == at)
            .map(|(_, fields)| fields.clone())
            .collect()
    }
}

fn cookie_pair(response: &reqwest::Response) -> String {
    let set = response.headers()[header::SET_COOKIE]
        .to_str()
        .expect("cookie");
    set.split(';').next().expect("pair").to_string()
}

fn location_of(response: &reqwest::Response) -> String {
    response.headers()[header::LOCATION]
        .to_str()
        .expect("location")
        .to_string()
}

fn csrf_of(page: &str) -> String {
    let start = page.find("name=\"csrf\" value=\"").expect("csrf field") + 19;
    let end = page[start..].find('"').expect("end") + start;
    page[start..end].to_string()
}

/// The query of `url` as a map.
fn query_of(url: &url::Url) -> HashMap<String, String> {
    url.query_pairs().into_owned().collect()
}

#[tokio::test]
async fn a_shop_connects_through_its_own_authorization_with_its_origin_as_base() {
    let served = serve().await;
    let url = served.session().await;
    let (cookie, form, csrf) = served.shop_form(&url).await;
    let html = form.text().await.expect("form");
    assert!(html.contains("<label for=\"shop\">"), "{html}");
    assert!(
        html.contains("id=\"shop\" name=\"shop\" required"),
        "{html}"
    );

    // NAME alone stands for NAME.myshopify.com.
    let (authorize, callback_cookie) = served.authorize_with(&url, &cookie, &csrf).await;
    assert_eq!(
        authorize.origin().ascii_serialization(),
        "https://test-shop.myshopify.com"
    );
    assert_eq!(authorize.path(), "/admin/oauth/authorize");
    let asked = query_of(&authorize);
    assert_eq!(asked["client_id"], CLIENT_ID);
    assert_eq!(asked["scope"], "read_orders");
    assert_eq!(
        asked["redirect_uri"],
        format!("{}/connect/callback", served.base)
    );
    let state = asked["state"].clone();
    assert_eq!(state.len(), 43);
    // Only a hash of the state is kept, beside the shop.
    let kept = served.session_row().await;
    assert_eq!(kept.oauth_shop.as_deref(), Some(TEST_SHOP));
    assert_ne!(kept.state_hash.as_deref(), Some(state.as_str()));

    // The browser follows to the shop, which consents and sends it back signed.
    let consented = served.get(authorize.as_str(), None).await;
    assert_eq!(consented.status(), StatusCode::FOUND);
    let back = url::Url::parse(&location_of(&consented)).expect("a URL");
    assert_eq!(
        served.requests_to("/admin/oauth/authorize"),
        vec![asked.clone()]
    );
    let query = back.query().expect("a query").to_string();
    let answered = served.callback(&query, &callback_cookie).await;
    assert_eq!(answered.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        location_of(&answered),
        format!("{RETURN_URL}?outcome=connected")
    );

    let exchanges = served.requests_to("/admin/oauth/access_token");
    assert_eq!(exchanges.len(), 1);
    assert_eq!(exchanges[0]["client_id"], CLIENT_ID);
    assert_eq!(exchanges[0]["client_secret"], CLIENT_SECRET);
    assert_eq!(exchanges[0]["code"], CODE);

    let connections = served.connections().await;
    assert_eq!(connections.len(), 1);
    let row = &connections[0];
    assert_eq!(
        (row.user_id.as_str(), row.provider.as_str()),
        ("u1", "shop")
    );
    assert_eq!(row.account_id.as_deref(), Some(TEST_SHOP));
    assert_eq!(
        row.base_url.as_deref(),
        Some("https://test-shop.myshopify.com")
    );
    assert!(row.credentials.starts_with("sealed:"), "not sealed");
    assert!(!row.credentials.contains(ACCESS_TOKEN));
    let opened = crate::credentials::StoredCredentials::from_column(
        served.test.db.secrets(),
        row.binding(),
        &row.credentials,
    )
    .expect("opened");
    assert_eq!(opened.token.as_deref(), Some(ACCESS_TOKEN));
    let jobs = sync_job::Entity::find()
        .filter(sync_job::Column::ConnectionId.eq(row.id))
        .all(served.test.main())
        .await
        .expect("jobs");
    assert_eq!(jobs.len(), 1, "the first sync is queued");

    // A replayed callback is refused and exchanges nothing more.
    let replayed = served.callback(&query, &callback_cookie).await;
    assert_eq!(replayed.status(), StatusCode::GONE);
    assert_eq!(served.requests_to("/admin/oauth/access_token").len(), 1);
    assert_eq!(served.connections().await.len(), 1);
}

/// What the app logged, at every level, while a [`capture_log`] guard lived.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Log {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("lock")).into_owned()
    }

    /// The log holds none of `secrets`.
    fn assert_holds_none_of(&self, secrets: &[&str]) {
        let text = self.text();
        for secret in secrets {
            assert!(!text.contains(secret), "{secret:?} is in the log:\n{text}");
        }
    }
}

/// Captures the log of this thread, which runs the served app too (a `#[tokio::test]`
/// runtime has one thread): every level of the crates' own events and the HTTP layer's.
/// Without targets, and without the database drivers' (which name the scratch
/// database): the client secret here is the crate's name.
fn capture_log() -> (Log, tracing::subscriber::DefaultGuard) {
    let log = Log::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("off,tributary=trace,tributary_providers=trace,tower_http=trace")
        .with_target(false)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    (log, tracing::subscriber::set_default(subscriber))
}

/// The value of a `name=value` cookie pair.
fn value_of(pair: &str) -> &str {
    pair.split_once('=').map(|(_, value)| value).unwrap_or(pair)
}

/// The callback Shopify would send for `state`, with `shop`, signed with `secret`.
fn callback_query(state: &str, shop: &str, secret: &str) -> String {
    signed(
        &[
            ("code", CODE),
            ("shop", shop),
            ("state", state),
            ("timestamp", "1765000000"),
        ],
        secret,
    )
}

#[tokio::test]
async fn a_forged_callback_spends_nothing_and_the_genuine_one_still_connects() {
    let served = serve().await;
    let (log, _guard) = capture_log();
    let url = served.session().await;
    let (authorize, cookie) = served.authorize(&url).await;
    let state = query_of(&authorize)["state"].clone();

    let tampered = callback_query(&state, TEST_SHOP, CLIENT_SECRET).replace("code=09", "code=19");
    let unsigned = format!("code={CODE}&shop={TEST_SHOP}&state={state}&timestamp=1765000000");
    for forged in [
        // Signed by someone without the app's secret.
        callback_query(&state, TEST_SHOP, "another secret"),
        // A parameter changed after signing.
        tampered,
        unsigned,
        // Signed, but for a shop other than the one the user named.
        callback_query(&state, "other-shop.myshopify.com", CLIENT_SECRET),
    ] {
        let answered = served.callback(&forged, &cookie).await;
        assert_eq!(answered.status(), StatusCode::BAD_REQUEST, "{forged}");
        let page = answered.text().await.expect("page");
        assert!(page.contains("start again from the app"), "{page}");
        assert!(served.connections().await.is_empty());
        assert!(served.session_row().await.used_at.is_none(), "{forged}");
    }
    assert!(served.requests_to("/admin/oauth/access_token").is_empty());

    assert!(
        log.text()
            .contains("A Shopify callback was refused; nothing was stored."),
        "{}",
        log.text()
    );
    log.assert_holds_none_of(&[CODE, &state, value_of(&cookie), CLIENT_SECRET]);

    let genuine = callback_query(&state, TEST_SHOP, CLIENT_SECRET);
    let answered = served.callback(&genuine, &cookie).await;
    assert_eq!(answered.status(), StatusCode::SEE_OTHER);
    assert_eq!(served.connections().await.len(), 1);
    let token = url.rsplit('/').next().expect("token");
    log.assert_holds_none_of(&[
        CODE,
        &state,
        value_of(&cookie),
        CLIENT_SECRET,
        ACCESS_TOKEN,
        token,
    ]);
}

#[tokio::test]
async fn a_shop_off_myshopify_com_is_refused_on_the_form_and_nothing_is_kept() {
    let served = serve().await;
    let (log, _guard) = capture_log();
    let url = served.session().await;
    let (cookie, _, csrf) = served.shop_form(&url).await;
    for typed in [
        "evil.com",
        "test-shop.myshopify.com.evil.com",
        "https://test-shop.myshopify.com",
        "evil.com/.myshopify.com",
        "127.0.0.1",
        "",
    ] {
        let posted = served.post_shop(&url, &cookie, &csrf, typed).await;
        assert_eq!(posted.status(), StatusCode::BAD_REQUEST, "{typed}");
        assert!(posted.headers().get(header::LOCATION).is_none());
        let page = posted.text().await.expect("page");
        assert!(page.contains("is not a Shopify shop"), "{page}");
        assert!(page.contains("name=\"shop\""), "the form again: {page}");
        let kept = served.session_row().await;
        assert_eq!((kept.state_hash, kept.oauth_shop), (None, None), "{typed}");
    }
    // The form is the key form's: a post without its CSRF token is refused.
    let forged = served.post_shop(&url, &cookie, "0000", TEST_SHOP).await;
    assert_eq!(forged.status(), StatusCode::FORBIDDEN);
    assert_eq!(served.session_row().await.oauth_shop, None);
    assert!(served.requests_to("/admin/oauth/authorize").is_empty());
    // These refusals log nothing of ours today; whatever is logged may hold no secret.
    let token = url.rsplit('/').next().expect("token");
    log.assert_holds_none_of(&[value_of(&cookie), &csrf, token, CLIENT_SECRET]);
}
