//! The Connect page in a real browser: headless Chromium (Debian's `chromium` and
//! `chromium-driver`, which `.ci/run` installs) driven through chromedriver's WebDriver.
//! Fails, never skips, when either is missing: the page would otherwise go untested.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
use serde_json::json;
use tributary::entities::{connection, record, sync_run};
use wiremock::matchers::{header, method, path, query_param};
use wiremock::{Mock, ResponseTemplate};

use crate::connect::{empty_list, mount_charges, serve_stripe, session_for, session_to};
use crate::daemon::free_port;
use crate::helpers::spawn_app;

pub(crate) const GOOD_KEY: &str = "sk_test_browser_good_51H8";
const BAD_KEY: &str = "sk_test_browser_bad_51H8";

/// chromedriver on a free port, killed (by its own handle) when dropped.
pub(crate) struct Chromedriver {
    child: Child,
    pub(crate) url: String,
}

impl Chromedriver {
    pub(crate) async fn start() -> Chromedriver {
        let program = std::env::var("TRIBUTARY_TEST_CHROMEDRIVER")
            .unwrap_or_else(|_| "chromedriver".to_string());
        let port = free_port();
        let child = Command::new(&program)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| {
                panic!(
                    "chromedriver ({program}) could not start: {error}; install the Debian packages \
                     `chromium` and `chromium-driver` (apt-get install chromium chromium-driver) \
                     or set TRIBUTARY_TEST_CHROMEDRIVER"
                )
            });
        let driver = Chromedriver {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let status = reqwest::get(format!("{}/status", driver.url)).await;
            if let Ok(answer) = status {
                let body: serde_json::Value = answer.json().await.unwrap_or_default();
                if body["value"]["ready"] == true {
                    return driver;
                }
            }
            assert!(Instant::now() < deadline, "chromedriver did not get ready");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A headless Chromium session.
    pub(crate) async fn browser(&self) -> Client {
        self.browser_with_prefs(json!({})).await
    }

    /// A headless Chromium session with JavaScript off, checked: a page's script does not
    /// run.
    pub(crate) async fn browser_without_javascript(&self) -> Client {
        let browser = self
            .browser_with_prefs(json!({"profile.managed_default_content_settings.javascript": 2}))
            .await;
        browser
            .goto("data:text/html,<title>off</title><script>document.title='on'</script>")
            .await
            .expect("the page opens");
        assert_eq!(browser.title().await.expect("title"), "off");
        browser
    }

    /// A headless Chromium session with Chrome preferences `prefs`.
    async fn browser_with_prefs(&self, prefs: serde_json::Value) -> Client {
        let binary = std::env::var("TRIBUTARY_TEST_CHROMIUM")
            .unwrap_or_else(|_| "/usr/bin/chromium".to_string());
        assert!(
            std::path::Path::new(&binary).exists(),
            "chromium is missing at {binary}: install the Debian package `chromium` or set \
             TRIBUTARY_TEST_CHROMIUM"
        );
        let mut args = vec!["--headless=new", "--disable-gpu", "--disable-dev-shm-usage"];
        // Chromium's sandbox refuses to run as root (CI containers).
        if running_as_root() {
            args.push("--no-sandbox");
        }
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".to_string(),
            json!({"binary": binary, "args": args, "prefs": prefs}),
        );
        // The console, for tests that read it through the driver.
        capabilities.insert("goog:loggingPrefs".to_string(), json!({"browser": "ALL"}));
        // sqlx turns on rustls' ring beside aws-lc-rs, so rustls cannot pick one alone;
        // the process takes the one the app uses. Err: another test installed it first.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        ClientBuilder::rustls()
            .expect("TLS roots")
            .capabilities(capabilities)
            .connect(&self.url)
            .await
            .expect("a Chromium session")
    }
}

impl Drop for Chromedriver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|id| id == "0"))
        })
        .unwrap_or(false)
}

/// The app's page the user comes back to: records the query of each visit.
pub(crate) async fn return_page() -> (String, Arc<Mutex<Vec<String>>>) {
    let visits: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = Arc::clone(&visits);
    let app = axum::Router::new().route(
        "/connected",
        axum::routing::get(move |uri: axum::http::Uri| {
            let seen = Arc::clone(&seen);
            async move {
                seen.lock()
                    .expect("visits")
                    .push(uri.query().unwrap_or_default().to_string());
                axum::response::Html("<!doctype html><title>Back in the app</title><p>Thanks")
            }
        }),
    );
    let url = format!("{}/connected", serve_router(app).await);
    (url, visits)
}

/// Serves `router` on a free loopback port: its origin, `http://127.0.0.1:PORT`.
pub(crate) async fn serve_router(router: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bound");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    tokio::spawn(async move { axum::serve(listener, router).await });
    url
}

/// Opens `link`, chooses Stripe, types `key` and submits.
pub(crate) async fn connect_stripe(browser: &Client, link: &str, key: &str) {
    browser.goto(link).await.expect("the page opens");
    let stripe = Locator::XPath("//button[normalize-space()='Connect stripe']");
    appeared(browser, stripe)
        .await
        .click()
        .await
        .expect("clicked");
    let field = appeared(browser, Locator::Css("input#key")).await;
    field.send_keys(key).await.expect("typed");
    submit_form(browser).await;
}

/// Presses the submit button of the page's form.
pub(crate) async fn submit_form(browser: &Client) {
    let submit = Locator::XPath("//form[@method='post']//button[@type='submit']");
    appeared(browser, submit)
        .await
        .click()
        .await
        .expect("submitted");
}

/// The fields of a urlencoded form body.
pub(crate) fn form_fields(body: &str) -> std::collections::HashMap<String, String> {
    form_urlencoded::parse(body.as_bytes())
        .map(|(name, value)| (name.into_owned(), value.into_owned()))
        .collect()
}

/// The element `locator` finds once it is on the page (at most 20 s), else the page.
pub(crate) async fn appeared(
    browser: &Client,
    locator: Locator<'_>,
) -> fantoccini::elements::Element {
    let found = browser
        .wait()
        .at_most(Duration::from_secs(20))
        .for_element(locator)
        .await;
    match found {
        Ok(element) => element,
        Err(error) => {
            let source = browser.source().await.unwrap_or_default();
            panic!("{locator:?} is not on the page ({error}): {source}")
        }
    }
}

/// Polls the browser's URL until `done` holds for it (at most 20 s).
pub(crate) async fn wait_for_url(browser: &Client, done: impl Fn(&url::Url) -> bool) -> url::Url {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let url = browser.current_url().await.expect("the URL");
        if done(&url) {
            return url;
        }
        assert!(Instant::now() < deadline, "the browser stayed at {url}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What an emulated authorization server saw: the authorization requests' queries, the
/// grants it issued by code (`G`: what the token request must match), and the token
/// requests' form fields.
pub(crate) struct AuthorizationSeen<G> {
    pub(crate) authorize_requests: Vec<HashMap<String, String>>,
    pub(crate) grants: HashMap<String, G>,
    pub(crate) token_requests: Vec<HashMap<String, String>>,
}

impl<G> Default for AuthorizationSeen<G> {
    fn default() -> Self {
        AuthorizationSeen {
            authorize_requests: Vec::new(),
            grants: HashMap::new(),
            token_requests: Vec::new(),
        }
    }
}

impl<G> AuthorizationSeen<G> {
    /// Notes a token request's urlencoded `body`: its fields.
    pub(crate) fn token_request(&mut self, body: &str) -> HashMap<String, String> {
        let form = form_fields(body);
        self.token_requests.push(form.clone());
        form
    }

    /// One authorization was asked for `client_id` with `redirect_uri`, `scope` and an
    /// unguessable `state`, and its code redeemed by one exchange with the same
    /// `redirect_uri`: that request's query and the exchange's fields.
    pub(crate) fn one_code_exchanged(
        &self,
        client_id: &str,
        redirect_uri: &str,
        scope: &str,
    ) -> (HashMap<String, String>, HashMap<String, String>) {
        assert_eq!(self.authorize_requests.len(), 1);
        let asked = self.authorize_requests[0].clone();
        assert_eq!(asked["client_id"], client_id);
        assert_eq!(asked["redirect_uri"], redirect_uri);
        assert_eq!(asked["scope"], scope);
        assert!(asked["state"].len() >= 32, "{asked:?}");
        assert_eq!(self.token_requests.len(), 1, "the code is exchanged once");
        let exchanged = self.token_requests[0].clone();
        assert_eq!(exchanged["grant_type"], "authorization_code");
        assert_eq!(exchanged["redirect_uri"], redirect_uri);
        assert!(self.grants.is_empty(), "the code was redeemed");
        (asked, exchanged)
    }
}

/// `user`'s one connection, of `provider` for account `account_id`, holds `access` and
/// `refresh` sealed (neither in clear in its row): its credentials, opened.
pub(crate) async fn sealed_connection(
    app: &crate::helpers::TestApp,
    (user, provider, account_id): (&str, &str, &str),
    access: &str,
    refresh: Option<&str>,
) -> tributary::credentials::StoredCredentials {
    let rows = crate::connect::connections_of(app, user).await;
    assert_eq!(rows.len(), 1, "the connection is stored");
    let row = &rows[0];
    assert_eq!(row.provider, provider);
    assert_eq!(row.account_id.as_deref(), Some(account_id));
    for token in std::iter::once(access).chain(refresh) {
        assert!(!row.credentials.contains(token), "sealed");
    }
    let stored = app.stored_credentials(user, provider).await;
    assert_eq!(stored.token.as_deref(), Some(access));
    assert_eq!(stored.refresh_token.as_deref(), refresh);
    stored
}

/// The browser lands on `return_url` with `outcome=connected`, the app's page's one visit.
pub(crate) async fn landed_connected(
    browser: &Client,
    return_url: &str,
    visits: &Mutex<Vec<String>>,
) {
    let landed = wait_for_url(browser, |url| url.as_str().starts_with(return_url)).await;
    assert_eq!(landed.query(), Some("outcome=connected"));
    assert_eq!(
        *visits.lock().expect("visits"),
        vec!["outcome=connected".to_string()]
    );
}

/// Stripe refuses `BAD_KEY` as its API does an unknown key, `times` times.
async fn refuse_bad_key(app: &crate::helpers::TestApp, times: u64) {
    let refused =
        json!({"error": {"type": "invalid_request_error", "message": "Invalid API Key provided"}});
    mount_charges(
        app,
        BAD_KEY,
        ResponseTemplate::new(401).set_body_json(refused),
        times,
    )
    .await;
}

/// The charges `GOOD_KEY`'s first sync finds, oldest first.
const FIRST_SYNC_CHARGES: [&str; 2] =
    ["ch_3MmlLrLkdIwHu7ix0snN0B15", "ch_3MmlLrLkdIwHu7ix0snN0B16"];

/// Stripe's charges for `GOOD_KEY`'s first sync: one page, newest first, as its list API
/// answers.
pub(crate) async fn mount_first_sync(app: &crate::helpers::TestApp) {
    let data: Vec<serde_json::Value> = (1_764_000_100..1_764_000_102)
        .zip(FIRST_SYNC_CHARGES)
        .rev()
        .map(|(created, id)| {
            json!({"id": id, "object": "charge", "amount": 2000, "currency": "usd",
                   "created": created, "paid": true, "status": "succeeded"})
        })
        .collect();
    Mock::given(method("GET"))
        .and(path("/v1/charges"))
        .and(query_param("limit", "100"))
        .and(header(
            "authorization",
            format!("Bearer {GOOD_KEY}").as_str(),
        ))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "object": "list", "url": "/v1/charges", "has_more": false, "data": data
        })))
        .mount(&app.api)
        .await;
}

/// `user` has one Stripe connection, `GOOD_KEY` sealed in it, whose first sync ran and
/// stored the charges of [`mount_first_sync`].
pub(crate) async fn stripe_connected_and_synced(app: &crate::helpers::TestApp, user: &str) {
    let rows = crate::connect::connections_of(app, user).await;
    assert_eq!(rows.len(), 1, "one connection");
    assert_eq!(rows[0].provider, "stripe");
    assert!(!rows[0].credentials.contains(GOOD_KEY), "sealed");
    let stored = app.stored_credentials(user, "stripe").await;
    assert_eq!(stored.token.as_deref(), Some(GOOD_KEY));
    first_sync_succeeded(app, user).await;
    let expected: Vec<(String, String)> = FIRST_SYNC_CHARGES
        .iter()
        .map(|id| ("stripe".to_string(), id.to_string()))
        .collect();
    assert_eq!(stored_records(app, user).await, expected);
}

#[tokio::test]
async fn a_user_connects_stripe_in_a_browser_its_charges_sync_and_a_refused_key_is_said_so() {
    let app = spawn_app().await;
    mount_charges(&app, GOOD_KEY, empty_list(), 1).await;
    mount_first_sync(&app).await;
    refuse_bad_key(&app, 1).await;
    let (return_url, visits) = return_page().await;
    let served = serve_stripe(&app, &return_url).await;
    let admin = served.create_key("admin", &["admin"]);
    let driver = Chromedriver::start().await;
    let browser = driver.browser().await;

    let good = session_to(&served, &admin, "browser-good", &return_url).await;
    connect_stripe(&browser, &good, GOOD_KEY).await;
    landed_connected(&browser, &return_url, &visits).await;
    // Stored, sealed, and its first sync lists the charges with the key and stores them.
    stripe_connected_and_synced(&app, "browser-good").await;

    let bad = session_to(&served, &admin, "browser-bad", &return_url).await;
    connect_stripe(&browser, &bad, BAD_KEY).await;
    let alert = appeared(&browser, Locator::Css("p.error[role=alert]")).await;
    let message = alert.text().await.expect("its text");
    assert!(message.contains("stripe refused this key"), "{message}");
    let url = browser.current_url().await.expect("URL");
    assert!(url.as_str().starts_with(&bad), "still on the page: {url}");
    let stored = connection::Entity::find()
        .filter(connection::Column::UserId.eq("browser-bad"))
        .all(&app.db)
        .await
        .expect("connections");
    assert!(stored.is_empty(), "a refused key stores nothing");
    assert_eq!(visits.lock().expect("visits").len(), 1);
    browser.close().await.expect("closed");
}

/// What the emulated GitHub saw; a code's grant is its PKCE challenge and `redirect_uri`.
type GithubSeen = AuthorizationSeen<(String, String)>;

const GITHUB_TOKEN: &str = "gho_browser_16C7e42F292c6912E7710c8383";

/// An authorization server and API that behave as GitHub's documentation says for an
/// OAuth app: `/login/oauth/authorize` renders a page with an "Authorize" button that
/// redirects back with `code` and `state`; `/login/oauth/access_token` checks the client,
/// the code, the `redirect_uri` and the PKCE verifier, and answers JSON only when asked
/// for it; `GET /user` and an empty `GET /issues` for the first sync.
async fn emulated_github() -> (String, Arc<Mutex<GithubSeen>>) {
    use axum::extract::{Query, State};
    use axum::response::{Html, IntoResponse, Redirect};
    type Seen = Arc<Mutex<GithubSeen>>;

    async fn authorize(
        State(seen): State<Seen>,
        Query(query): Query<HashMap<String, String>>,
    ) -> Html<String> {
        seen.lock()
            .expect("seen")
            .authorize_requests
            .push(query.clone());
        let field = |name: &str| query.get(name).cloned().unwrap_or_default();
        let hidden: String = ["redirect_uri", "state", "code_challenge"]
            .iter()
            .map(|name| {
                format!(
                    "<input type=\"hidden\" name=\"{name}\" value=\"{}\">",
                    field(name).replace('"', "&quot;")
                )
            })
            .collect();
        Html(format!(
            "<!doctype html><title>Authorize application</title>\
             <p>tributary test by {} would like access to your account ({})</p>\
             <form method=\"post\" action=\"/login/oauth/authorize/decision\">{hidden}\
             <button type=\"submit\" id=\"authorize\">Authorize</button></form>",
            field("client_id"),
            field("scope"),
        ))
    }

    async fn decide(State(seen): State<Seen>, body: String) -> Redirect {
        let form = form_fields(&body);
        let field = |name: &str| form.get(name).cloned().unwrap_or_default();
        let code = format!("code-{}", seen.lock().expect("seen").grants.len());
        seen.lock().expect("seen").grants.insert(
            code.clone(),
            (field("code_challenge"), field("redirect_uri")),
        );
        let mut back = url::Url::parse(&field("redirect_uri")).expect("redirect_uri");
        back.query_pairs_mut()
            .append_pair("code", &code)
            .append_pair("state", &field("state"));
        Redirect::to(back.as_str())
    }

    async fn token(
        State(seen): State<Seen>,
        headers: axum::http::HeaderMap,
        body: String,
    ) -> axum::response::Response {
        use base64::Engine;
        use sha2::Digest;
        let mut seen = seen.lock().expect("seen");
        let form = seen.token_request(&body);
        let field = |name: &str| form.get(name).cloned().unwrap_or_default();
        let issued = seen.grants.remove(&field("code"));
        let verified = issued.is_some_and(|(challenge, redirect_uri)| {
            let derived = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .encode(sha2::Sha256::digest(field("code_verifier").as_bytes()));
            derived == challenge && redirect_uri == field("redirect_uri")
        }) && field("client_id") == "browser-client"
            && field("client_secret") == "browser-secret";
        let json = headers
            .get("accept")
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| value.contains("application/json"));
        match (verified, json) {
            (true, true) => axum::Json(json!({
                "access_token": GITHUB_TOKEN, "scope": "repo", "token_type": "bearer"
            }))
            .into_response(),
            (true, false) => {
                format!("access_token={GITHUB_TOKEN}&scope=repo&token_type=bearer").into_response()
            }
            // GitHub answers a bad code with 200 and an error.
            (false, _) => axum::Json(json!({"error": "bad_verification_code"})).into_response(),
        }
    }

    let seen: Seen = Arc::default();
    let app = axum::Router::new()
        .route("/login/oauth/authorize", axum::routing::get(authorize))
        .route(
            "/login/oauth/authorize/decision",
            axum::routing::post(decide),
        )
        .route("/login/oauth/access_token", axum::routing::post(token))
        .route(
            "/user",
            axum::routing::get(|| async { axum::Json(json!({"login": "octocat", "id": 583231})) }),
        )
        .route(
            "/issues",
            axum::routing::get(|| async { axum::Json(json!([])) }),
        )
        .with_state(Arc::clone(&seen));
    (serve_router(app).await, seen)
}

#[tokio::test]
async fn a_user_connects_github_in_a_browser_through_its_authorization_page() {
    let app = spawn_app().await;
    let (github, seen) = emulated_github().await;
    let (return_url, visits) = return_page().await;
    let provider = format!(
        "\n[providers.github]\nkind = \"github\"\nbase_url = \"{github}\"\noauth_url = \"{github}\"\n\
         client_id = \"browser-client\"\nclient_secret_env = \"TEST_BROWSER_GITHUB_SECRET\"\n\
         schedule = \"0 0 0 1 1 *\"\n"
    );
    let secret = ("TEST_BROWSER_GITHUB_SECRET", "browser-secret");
    let (served, link) = serve_oauth(&app, &provider, secret, &return_url, "browser-gh").await;
    let driver = Chromedriver::start().await;
    let browser = driver.browser().await;
    press_connect(&browser, &link, "github").await;
    // GitHub's page: the user consents.
    let authorize = appeared(&browser, Locator::Css("button#authorize")).await;
    let consent = browser.source().await.expect("source");
    assert!(
        consent.contains("tributary test by browser-client"),
        "{consent}"
    );
    authorize.click().await.expect("authorized");
    landed_connected(&browser, &return_url, &visits).await;
    let redirect_uri = format!("{}/connect/callback", served.base);
    let (asked, _) =
        seen.lock()
            .expect("seen")
            .one_code_exchanged("browser-client", &redirect_uri, "repo");
    assert_eq!(asked["code_challenge_method"], "S256");
    let user = ("browser-gh", "github", "583231");
    sealed_connection(&app, user, GITHUB_TOKEN, None).await;
    // Its first sync runs, with the token, against the emulated API.
    first_sync_succeeded(&app, "browser-gh").await;
    browser.close().await.expect("closed");
}

/// A daemon serving `provider_table` (one OAuth2 provider, its client secret in the
/// environment variable `secret`) with Connect back to `return_url`, and a session's link
/// for `user` to connect it.
pub(crate) async fn serve_oauth(
    app: &crate::helpers::TestApp,
    provider_table: &str,
    secret: (&str, &str),
    return_url: &str,
    user: &str,
) -> (crate::http::Served, String) {
    let provider = provider_table
        .split_once("[providers.")
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(name, _)| name.to_string())
        .expect("a [providers.NAME] table");
    let served = crate::http::Served::start_with_env(
        app,
        provider_table,
        &[secret],
        crate::connect::with_connect(return_url),
    )
    .await;
    let admin = served.create_key("admin", &["admin"]);
    let link = session_for(&served, &admin, user, &provider, return_url).await;
    (served, link)
}

/// Opens `link` and presses `provider`'s button.
pub(crate) async fn press_connect(browser: &Client, link: &str, provider: &str) {
    browser.goto(link).await.expect("the page opens");
    let button = format!("//button[normalize-space()='Connect {provider}']");
    appeared(browser, Locator::XPath(&button))
        .await
        .click()
        .await
        .expect("clicked");
}

/// Waits (at most 30 s) until a run of `user`'s connection has succeeded.
pub(crate) async fn first_sync_succeeded(app: &crate::helpers::TestApp, user: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let runs = sync_run::Entity::find()
            .filter(sync_run::Column::UserId.eq(user))
            .all(&app.db)
            .await
            .expect("runs");
        if runs
            .iter()
            .any(|run| run.status == sync_run::RunStatus::Succeeded)
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no first sync succeeded: {runs:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `user`'s stored records as (namespace, external id), in that order.
pub(crate) async fn stored_records(
    app: &crate::helpers::TestApp,
    user: &str,
) -> Vec<(String, String)> {
    let mut stored: Vec<(String, String)> = record::Entity::find()
        .filter(record::Column::UserId.eq(user))
        .all(&app.db)
        .await
        .expect("records")
        .into_iter()
        .map(|row| (row.provider, row.external_id))
        .collect();
    stored.sort();
    stored
}

/// `html`, as served for `name`, checked by html-validate's `standard` preset (the HTML
/// specification's rules, not a style guide).
pub(crate) fn assert_valid_html(name: &str, html: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join(format!("{name}.html"));
    std::fs::write(&file, html).expect("page written");
    let checked = Command::new("node")
        .arg(crate::helpers::test_tool(
            "html-validate/bin/html-validate.mjs",
        ))
        .args(["--preset", "standard", "--formatter", "text"])
        .arg(&file)
        .output()
        .expect("node runs html-validate");
    assert!(
        checked.status.success(),
        "the {name} page is not valid HTML:\n{}{}\n{html}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
}

/// The page the browser shows, checked by axe-core against WCAG 2.1 A and AA and its best
/// practices: no violation of any impact.
pub(crate) async fn assert_accessible(browser: &Client, name: &str) {
    let engine = std::fs::read_to_string(crate::helpers::test_tool("axe-core/axe.min.js"))
        .expect("axe-core");
    browser
        .execute(&engine, Vec::new())
        .await
        .expect("axe-core loaded");
    let found = browser
        .execute_async(
            "const done = arguments[arguments.length - 1];
             axe.run(document, {runOnly: {type: 'tag', values:
                 ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa', 'best-practice']}})
               .then(result => done(result.violations.map(v =>
                   ({id: v.id, impact: v.impact, help: v.help,
                     nodes: v.nodes.map(n => n.html)}))))
               .catch(error => done([{id: 'axe failed', help: String(error)}]));",
            Vec::new(),
        )
        .await
        .expect("axe-core ran");
    assert_eq!(
        found.as_array().map(Vec::len),
        Some(0),
        "the {name} page has accessibility violations: {found:#}"
    );
}

#[tokio::test]
async fn the_connect_pages_pass_an_html_validator_and_an_accessibility_check() {
    let app = spawn_app().await;
    refuse_bad_key(&app, 2).await;
    let (return_url, _) = return_page().await;
    let served = serve_stripe(&app, &return_url).await;
    let admin = served.create_key("admin", &["admin"]);

    // The HTML as served: the link's page, the key form, the form saying the key was
    // refused, and the pages of a link opened in another browser and of an unknown one.
    let link = session_to(&served, &admin, "html", &return_url).await;
    let (cookie, session_page) = crate::connect::open(&link).await;
    let (_, _, form_page) = crate::connect::get(&format!("{link}/stripe"), Some(&cookie)).await;
    let csrf = crate::connect::csrf_of(&form_page);
    let (_, _, refused_page) = crate::connect::submit(&link, &cookie, &csrf, BAD_KEY).await;
    assert!(refused_page.contains("refused this key"), "{refused_page}");
    let (other, _, other_browser) = crate::connect::get(&link, None).await;
    assert_eq!(other, reqwest::StatusCode::FORBIDDEN, "{other_browser}");
    let unknown_link = format!(
        "{}/{}",
        link.rsplit_once('/').expect("a path").0,
        "A".repeat(43)
    );
    let (unknown, _, unknown_page) = crate::connect::get(&unknown_link, None).await;
    assert_eq!(unknown, reqwest::StatusCode::NOT_FOUND, "{unknown_page}");
    for (name, html) in [
        ("session", &session_page),
        ("key form", &form_page),
        ("refused key", &refused_page),
        ("other browser", &other_browser),
        ("unknown link", &unknown_page),
    ] {
        assert_valid_html(name, html);
    }

    // The same pages as a browser shows them.
    let driver = Chromedriver::start().await;
    let browser = driver.browser().await;
    let link = session_to(&served, &admin, "a11y", &return_url).await;
    browser.goto(&link).await.expect("the page opens");
    let stripe = Locator::XPath("//button[normalize-space()='Connect stripe']");
    let button = appeared(&browser, stripe).await;
    assert_accessible(&browser, "session").await;
    button.click().await.expect("clicked");
    let field = appeared(&browser, Locator::Css("input#key")).await;
    assert_accessible(&browser, "key form").await;
    field.send_keys(BAD_KEY).await.expect("typed");
    submit_form(&browser).await;
    appeared(&browser, Locator::Css("p.error[role=alert]")).await;
    assert_accessible(&browser, "refused key").await;
    browser.goto(&unknown_link).await.expect("the page opens");
    assert_accessible(&browser, "unknown link").await;
    browser.close().await.expect("closed");
}
