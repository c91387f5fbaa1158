//! The operator page in headless Chromium (as the Connect page's browser tests drive it):
//! signing in, the seeded data on each page, the links from a connection to its runs and
//! from a run to its errors, no console errors, and every page valid HTML and accessible.

use fantoccini::{Client, Locator};

use crate::connect_browser::{appeared, assert_accessible, assert_valid_html, Chromedriver};
use crate::operator::{get, seeded, LONG_NOTE};

/// The browser's console errors since the last read, through chromedriver's log
/// endpoint, but for the favicon the browser asks for on its own.
async fn console_errors(driver: &Chromedriver, browser: &Client) -> Vec<String> {
    let session = browser
        .session_id()
        .await
        .expect("session id")
        .expect("a session");
    let log: serde_json::Value = reqwest::Client::new()
        .post(format!("{}/session/{session}/se/log", driver.url))
        .json(&serde_json::json!({"type": "browser"}))
        .send()
        .await
        .expect("the driver answers")
        .json()
        .await
        .expect("JSON");
    log["value"]
        .as_array()
        .expect("log entries")
        .iter()
        .filter(|entry| entry["level"] == "SEVERE")
        .filter_map(|entry| entry["message"].as_str())
        .filter(|message| !message.contains("favicon.ico"))
        .map(str::to_string)
        .collect()
}

/// Types `key` into the login form's `field` and submits it: the overview then shows.
async fn sign_in(browser: &Client, field: fantoccini::elements::Element, key: &str) {
    field.send_keys(key).await.expect("typed");
    appeared(browser, Locator::Css("main form button[type=submit]"))
        .await
        .click()
        .await
        .expect("submitted");
    appeared(
        browser,
        Locator::XPath("//h2[normalize-space()='Job queue']"),
    )
    .await;
}

#[tokio::test]
async fn an_operator_signs_in_and_follows_a_connection_to_its_runs_and_a_run_to_its_errors() {
    let seeded = seeded().await;
    let driver = Chromedriver::start().await;
    let browser = driver.browser().await;

    // Without a session: the login page.
    browser.goto(&seeded.page).await.expect("the page opens");
    let field = appeared(&browser, Locator::Css("input#key")).await;
    assert_accessible(&browser, "login").await;
    let _ = console_errors(&driver, &browser).await; // The login page's own 401.
    sign_in(&browser, field, &seeded.admin).await;

    // The overview: the queue's depth, the deferred job, the feed.
    let overview = browser.source().await.expect("source");
    assert!(overview.contains("<td>queued</td><td>1</td>"), "{overview}");
    assert!(overview.contains("Change feed"), "{overview}");
    assert!(
        overview.contains("alice@acme"),
        "the deferred job: {overview}"
    );
    assert_accessible(&browser, "overview").await;
    assert_eq!(
        console_errors(&driver, &browser).await,
        Vec::<String>::new()
    );

    // A connection, with its health, leads to its runs.
    browser
        .goto(&format!("{}/connections", seeded.page))
        .await
        .expect("the page opens");
    let alice = appeared(&browser, Locator::LinkText("alice@acme")).await;
    let listed = browser.source().await.expect("source");
    assert!(listed.contains("<td>degraded</td>"), "{listed}");
    assert_accessible(&browser, "connections").await;
    alice.click().await.expect("clicked");
    let run = format!("Run {}", seeded.run_id);
    let run_link = appeared(&browser, Locator::LinkText(&run)).await;
    let url = browser.current_url().await.expect("URL");
    assert_eq!(url.query(), Some("provider=acme&user_id=alice"), "{url}");
    let runs = browser.source().await.expect("source");
    assert!(runs.contains("<td>partial</td>"), "{runs}");
    assert_accessible(&browser, "runs").await;

    // A run leads to its errors, the long payload folded.
    run_link.click().await.expect("clicked");
    appeared(&browser, Locator::XPath("//h2[normalize-space()='Errors']")).await;
    let errors = browser.source().await.expect("source");
    assert!(errors.contains("poison refused"), "{errors}");
    assert!(errors.contains("<summary>Payload ("), "folded: {errors}");
    assert!(
        errors.contains("\"note\": \"nnn"),
        "pretty-printed: {errors}"
    );
    assert!(errors.contains(&"n".repeat(LONG_NOTE)), "{errors}");
    assert_accessible(&browser, "run").await;

    browser
        .goto(&format!("{}/webhooks", seeded.page))
        .await
        .expect("the page opens");
    appeared(
        &browser,
        Locator::XPath("//h2[starts-with(normalize-space(), 'In')]"),
    )
    .await;
    let webhooks = browser.source().await.expect("source");
    assert!(webhooks.contains(&seeded.delivery_in), "{webhooks}");
    assert!(webhooks.contains(&seeded.delivery_out), "{webhooks}");
    assert_accessible(&browser, "webhooks").await;
    assert_eq!(
        console_errors(&driver, &browser).await,
        Vec::<String>::new()
    );

    // At a laptop's size and at a phone's width the page fits: only the tables' boxes
    // scroll.
    for (width, height) in [(1280, 800), (390, 844)] {
        browser
            .set_window_size(width, height)
            .await
            .expect("resized");
        for path in ["/runs", "/connections"] {
            browser
                .goto(&format!("{}{path}", seeded.page))
                .await
                .expect("the page opens");
            appeared(&browser, Locator::LinkText("alice@acme")).await;
            let overflow = browser
                .execute(
                    "return document.documentElement.scrollWidth > window.innerWidth;",
                    Vec::new(),
                )
                .await
                .expect("measured");
            assert_eq!(
                overflow,
                serde_json::Value::Bool(false),
                "{path} scrolls sideways at {width}x{height}"
            );
        }
    }
    browser.close().await.expect("closed");
}

#[tokio::test]
async fn with_javascript_off_an_operator_signs_in_by_the_form_and_follows_links() {
    let seeded = seeded().await;
    let driver = Chromedriver::start().await;
    let browser = driver.browser_without_javascript().await;
    browser.goto(&seeded.page).await.expect("the page opens");
    let field = appeared(&browser, Locator::Css("input#key")).await;
    sign_in(&browser, field, &seeded.admin).await;
    for link in [
        "Connections",
        "alice@acme",
        &format!("Run {}", seeded.run_id),
    ] {
        appeared(&browser, Locator::LinkText(link))
            .await
            .click()
            .await
            .expect("clicked");
    }
    appeared(&browser, Locator::XPath("//h2[normalize-space()='Errors']")).await;
    let errors = browser.source().await.expect("source");
    assert!(errors.contains("poison refused"), "{errors}");
    let url = browser.current_url().await.expect("URL");
    assert_eq!(url.path(), format!("/runs/{}", seeded.run_id), "{url}");
    browser.close().await.expect("closed");
}

#[tokio::test]
async fn the_operator_pages_pass_an_html_validator() {
    let seeded = seeded().await;
    let admin = Some(seeded.admin.as_str());
    let run = format!("/runs/{}", seeded.run_id);
    for (name, path, key) in [
        ("login", "/", None),
        ("overview", "/", admin),
        ("connections", "/connections", admin),
        ("runs", "/runs", admin),
        ("run", run.as_str(), admin),
        ("webhooks", "/webhooks", admin),
        ("unknown run", "/runs/999999", admin),
        ("bad filter", "/runs?status=bogus", admin),
    ] {
        let (_, _, html) = get(&seeded, path, key, None).await;
        assert_valid_html(name, &html);
    }
}
