//! Shopify's shop form (docs/decisions/connect-shopify.md) as served and in headless
//! Chromium: valid HTML, accessible, a shop off `myshopify.com` said so on the form, and a
//! good shop's answer followed to the shop's own authorization page, which the page's
//! `form-action` must allow. The flow past the shop runs in process
//! (`src/api/connect/tests.rs`): this daemon cannot reach an emulated shop.

use fantoccini::Locator;
use reqwest::StatusCode;

use crate::connect::{csrf_of, get, open, post, session_for};
use crate::connect_browser::{
    appeared, assert_accessible, assert_valid_html, press_connect, return_page, serve_oauth,
    submit_form, wait_for_url, Chromedriver,
};
use crate::helpers::spawn_app;

const SHOP_TABLE: &str = "[providers.shop]\npreset = \"shopify_orders\"\n\
    schedule = \"0 0 0 1 1 *\"\n\
    auth = { shopify_app = { client_id = \"api-key-1\", client_secret_env = \"TEST_SHOP_SECRET\", scope = \"read_orders\" } }\n";

/// The shop form's body with `csrf` and `shop`.
fn shop_form(csrf: &str, shop: &str) -> String {
    form_urlencoded::Serializer::new(String::new())
        .append_pair("csrf", csrf)
        .append_pair("shop", shop)
        .finish()
}

#[tokio::test]
async fn the_shop_form_is_valid_and_accessible_and_sends_a_good_shop_to_its_authorization() {
    let app = spawn_app().await;
    let (return_url, _) = return_page().await;
    let (served, link) = serve_oauth(
        &app,
        SHOP_TABLE,
        ("TEST_SHOP_SECRET", "shop-client-secret"),
        &return_url,
        "u-shop",
    )
    .await;

    // The HTML as served: the form, and the form saying a shop is not one.
    let (cookie, _) = open(&link).await;
    let (status, headers, form_page) = get(&format!("{link}/shop"), Some(&cookie)).await;
    assert_eq!(status, StatusCode::OK, "{form_page}");
    let policy = headers["content-security-policy"].to_str().expect("policy");
    assert!(
        policy.contains("form-action 'self' https://*.myshopify.com;"),
        "{policy}"
    );
    let csrf = csrf_of(&form_page);
    let (status, headers, bad_shop) = post(
        &format!("{link}/shop"),
        Some(&cookie),
        shop_form(&csrf, "shop.example.com"),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{bad_shop}");
    assert!(headers.get("location").is_none());
    assert!(bad_shop.contains("is not a Shopify shop"), "{bad_shop}");
    for (name, html) in [("shop form", &form_page), ("bad shop", &bad_shop)] {
        assert_valid_html(name, html);
    }

    // The same in a browser, on a link of its own.
    let admin = served.create_key("browser", &["admin"]);
    let link = session_for(&served, &admin, "u-shop-2", "shop", &return_url).await;
    let driver = Chromedriver::start().await;
    let browser = driver.browser().await;
    press_connect(&browser, &link, "shop").await;
    let field = appeared(&browser, Locator::Css("input#shop")).await;
    assert_accessible(&browser, "shop form").await;
    field.send_keys("evil.example").await.expect("typed");
    submit_form(&browser).await;
    appeared(&browser, Locator::Css("p.error[role=alert]")).await;
    assert_accessible(&browser, "bad shop").await;
    let field = appeared(&browser, Locator::Css("input#shop")).await;
    field.send_keys("test-shop").await.expect("typed");
    submit_form(&browser).await;
    // The policy let the form's answer redirect to the shop (which does not resolve here).
    let at = wait_for_url(&browser, |url| {
        url.host_str() == Some("test-shop.myshopify.com")
    })
    .await;
    assert_eq!(at.path(), "/admin/oauth/authorize");
    let asked: std::collections::HashMap<String, String> = at.query_pairs().into_owned().collect();
    assert_eq!(asked["client_id"], "api-key-1");
    assert_eq!(asked["scope"], "read_orders");
    browser.close().await.expect("closed");
}
