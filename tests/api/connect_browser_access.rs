//! The Connect page as issue 35 asks it to be used: a session offering several providers
//! shows a button each; at a phone's size nothing scrolls sideways; the keyboard alone
//! reaches a provider's key form and sends it; and with JavaScript off the form still
//! posts and connects. Each ends with the connection stored and its first sync's records.

use std::sync::{Arc, Mutex};

use fantoccini::actions::{InputSource, KeyAction, KeyActions};
use fantoccini::key::Key;
use fantoccini::{Client, Locator};
use serde_json::Value;

use crate::connect::{empty_list, mount_charges, session_offering, stripe_provider, with_connect};
use crate::connect_browser::{
    appeared, connect_stripe, landed_connected, mount_first_sync, return_page,
    stripe_connected_and_synced, Chromedriver, GOOD_KEY,
};
use crate::helpers::{spawn_app, TestApp};
use crate::http::Served;

/// The providers a session offers, in config order, and their buttons' labels.
const OFFERED: [&str; 2] = ["github", "stripe"];
const LABELS: [&str; 2] = ["Connect github", "Connect stripe"];

/// A session's link for a user to connect GitHub or Stripe, on its daemon, and the app's
/// page it goes back to.
struct Offered {
    _served: Served,
    link: String,
    return_url: String,
    visits: Arc<Mutex<Vec<String>>>,
}

/// A daemon with GitHub (an OAuth app) and Stripe (a key) on the app's wiremock, and a
/// session offering both to `user`; Stripe takes `GOOD_KEY` once and lists its charges.
async fn offer_github_and_stripe(app: &TestApp, user: &str) -> Offered {
    let (return_url, visits) = return_page().await;
    mount_charges(app, GOOD_KEY, empty_list(), 1).await;
    mount_first_sync(app).await;
    let github = format!(
        "\n[providers.github]\nkind = \"github\"\nbase_url = \"{uri}\"\noauth_url = \"{uri}\"\n\
         client_id = \"access-client\"\nclient_secret_env = \"TEST_ACCESS_GITHUB_SECRET\"\n\
         schedule = \"0 0 0 1 1 *\"\n",
        uri = app.api.uri()
    );
    let providers = format!("{github}{}", stripe_provider(app));
    let served = Served::start_with_env(
        app,
        &providers,
        &[("TEST_ACCESS_GITHUB_SECRET", "access-secret")],
        with_connect(&return_url),
    )
    .await;
    let admin = served.create_key("admin", &["admin"]);
    let link = session_offering(&served, &admin, user, &OFFERED, &return_url).await;
    Offered {
        _served: served,
        link,
        return_url,
        visits,
    }
}

/// The labels of the page's provider buttons, in page order.
async fn button_labels(browser: &Client) -> Vec<String> {
    appeared(browser, Locator::Css("form[method=get] button")).await;
    let mut labels = Vec::new();
    for button in browser
        .find_all(Locator::Css("form[method=get] button"))
        .await
        .expect("buttons")
    {
        labels.push(button.text().await.expect("its label"));
    }
    labels
}

/// Presses `keys` one after another, as a keyboard does.
async fn press(browser: &Client, keys: impl IntoIterator<Item = char>) {
    let mut typing = KeyActions::new("keyboard".to_string());
    for key in keys {
        typing = typing
            .then(KeyAction::Down { value: key })
            .then(KeyAction::Up { value: key });
    }
    browser.perform_actions(typing).await.expect("typed");
}

/// The focused element (`document.activeElement`) as `tag#id: text`.
async fn focused(browser: &Client) -> String {
    let element = browser.active_element().await.expect("a focused element");
    let tag = element.tag_name().await.expect("its tag");
    let id = element
        .attr("id")
        .await
        .expect("its id")
        .unwrap_or_default();
    let text = element.text().await.expect("its text");
    format!("{tag}#{id}: {text}")
}

/// Evaluates `script` (an expression) in the page.
async fn evaluate(browser: &Client, script: &str) -> Value {
    browser
        .execute(&format!("return {script};"), Vec::new())
        .await
        .expect("evaluated")
}

/// The page fits a phone's width: no sideways scroll, and each of `selector`'s elements
/// shown whole within the width.
async fn fits_the_width(browser: &Client, selector: &str, page: &str) {
    let width = evaluate(browser, "window.innerWidth").await;
    assert_eq!(width, Value::from(375), "a phone's viewport");
    let scroll_width = evaluate(browser, "document.documentElement.scrollWidth").await;
    assert!(
        scroll_width.as_i64() <= width.as_i64(),
        "the {page} scrolls sideways: {scroll_width} > {width}"
    );
    let elements = browser
        .find_all(Locator::Css(selector))
        .await
        .expect("elements");
    assert!(!elements.is_empty(), "no {selector} on the {page}");
    for element in elements {
        assert!(element.is_displayed().await.expect("shown"), "{selector}");
        let (x, _, w, h) = element.rectangle().await.expect("its box");
        assert!(
            x >= 0.0 && x + w <= 375.0 && h > 0.0,
            "{selector} on the {page} is outside the width: x {x}, width {w}"
        );
    }
}

#[tokio::test]
async fn on_a_phone_the_keyboard_alone_picks_a_provider_and_sends_its_key() {
    let app = spawn_app().await;
    let offered = offer_github_and_stripe(&app, "keyboard").await;
    let driver = Chromedriver::start().await;
    let browser = driver.browser().await;
    browser.set_window_size(375, 667).await.expect("resized");

    browser.goto(&offered.link).await.expect("the page opens");
    assert_eq!(button_labels(&browser).await, LABELS);
    fits_the_width(&browser, "form[method=get] button", "session page").await;

    // Tab goes through the buttons in order; Enter on Stripe's opens its form.
    let mut passed = Vec::new();
    for _ in 0..LABELS.len() {
        press(&browser, [char::from(Key::Tab)]).await;
        passed.push(focused(&browser).await);
    }
    assert_eq!(
        passed,
        vec!["button#: Connect github", "button#: Connect stripe"]
    );
    press(&browser, [char::from(Key::Enter)]).await;
    appeared(&browser, Locator::Css("input#key")).await;
    fits_the_width(&browser, "input#key, form button, a.button", "key form").await;

    // The field comes first, then the form's button, which Enter presses.
    press(&browser, [char::from(Key::Tab)]).await;
    assert_eq!(focused(&browser).await, "input#key: ");
    press(&browser, GOOD_KEY.chars()).await;
    press(&browser, [char::from(Key::Tab)]).await;
    assert_eq!(focused(&browser).await, "button#: Connect");
    press(&browser, [char::from(Key::Enter)]).await;

    landed_connected(&browser, &offered.return_url, &offered.visits).await;
    stripe_connected_and_synced(&app, "keyboard").await;
    browser.close().await.expect("closed");
}

#[tokio::test]
async fn with_javascript_off_the_key_form_still_posts_and_connects() {
    let app = spawn_app().await;
    let offered = offer_github_and_stripe(&app, "no-script").await;
    let driver = Chromedriver::start().await;
    let browser = driver.browser_without_javascript().await;
    browser.goto(&offered.link).await.expect("the page opens");
    assert_eq!(button_labels(&browser).await, LABELS);
    connect_stripe(&browser, &offered.link, GOOD_KEY).await;
    landed_connected(&browser, &offered.return_url, &offered.visits).await;
    stripe_connected_and_synced(&app, "no-script").await;
    browser.close().await.expect("closed");
}
