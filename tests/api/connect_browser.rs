//! The Connect page in a real browser: headless Chromium (Debian's `chromium` and
//! `chromium-driver`, which `.ci/run` installs) driven through chromedriver's WebDriver.
//! Fails, never skips, when either is missing: the page would otherwise go untested.

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
use serde_json::json;
use tributary::entities::connection;
use wiremock::ResponseTemplate;

use crate::connect::{empty_list, mount_charges, serve_stripe, session_to};
use crate::daemon::free_port;
use crate::helpers::spawn_app;

const GOOD_KEY: &str = "sk_test_browser_good_51H8";
const BAD_KEY: &str = "sk_test_browser_bad_51H8";

/// chromedriver on a free port, killed (by its own handle) when dropped.
struct Chromedriver {
    child: Child,
    url: String,
}

impl Chromedriver {
    async fn start() -> Chromedriver {
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
    async fn browser(&self) -> Client {
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
            json!({"binary": binary, "args": args}),
        );
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
async fn return_page() -> (String, Arc<Mutex<Vec<String>>>) {
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
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bound");
    let url = format!(
        "http://{}/connected",
        listener.local_addr().expect("address")
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, visits)
}

/// Opens `link`, chooses Stripe, types `key` and submits.
async fn connect_stripe(browser: &Client, link: &str, key: &str) {
    browser.goto(link).await.expect("the page opens");
    let stripe = Locator::XPath("//button[normalize-space()='Connect stripe']");
    appeared(browser, stripe)
        .await
        .click()
        .await
        .expect("clicked");
    let field = appeared(browser, Locator::Css("input#key")).await;
    field.send_keys(key).await.expect("typed");
    let submit = Locator::XPath("//form[@method='post']//button[@type='submit']");
    appeared(browser, submit)
        .await
        .click()
        .await
        .expect("submitted");
}

/// The element `locator` finds once it is on the page (at most 20 s), else the page.
async fn appeared(browser: &Client, locator: Locator<'_>) -> fantoccini::elements::Element {
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
async fn wait_for_url(browser: &Client, done: impl Fn(&url::Url) -> bool) -> url::Url {
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

#[tokio::test]
async fn a_user_connects_stripe_in_a_browser_and_a_refused_key_is_said_so_on_the_page() {
    let app = spawn_app().await;
    mount_charges(&app, GOOD_KEY, empty_list(), 1).await;
    let refused =
        json!({"error": {"type": "invalid_request_error", "message": "Invalid API Key provided"}});
    mount_charges(
        &app,
        BAD_KEY,
        ResponseTemplate::new(401).set_body_json(refused),
        1,
    )
    .await;
    let (return_url, visits) = return_page().await;
    let served = serve_stripe(&app, &return_url).await;
    let admin = served.create_key("admin", &["admin"]);
    let driver = Chromedriver::start().await;
    let browser = driver.browser().await;

    let good = session_to(&served, &admin, "browser-good", &return_url).await;
    connect_stripe(&browser, &good, GOOD_KEY).await;
    let landed = wait_for_url(&browser, |url| url.as_str().starts_with(&return_url)).await;
    assert_eq!(landed.query(), Some("outcome=connected"));
    assert_eq!(
        *visits.lock().expect("visits"),
        vec!["outcome=connected".to_string()]
    );
    let row = connection::Entity::find()
        .filter(connection::Column::UserId.eq("browser-good"))
        .one(&app.db)
        .await
        .expect("connections")
        .expect("the connection is stored");
    assert_eq!(row.provider, "stripe");
    assert!(!row.credentials.contains(GOOD_KEY), "sealed");
    let stored = app.stored_credentials("browser-good", "stripe").await;
    assert_eq!(stored.token.as_deref(), Some(GOOD_KEY));

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
