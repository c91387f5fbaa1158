//! `preset = "shopify_orders"` against an emulation of the REST Admin API's orders list:
//! `X-Shopify-Access-Token`, `status=any&limit=250` on the first request, Link headers
//! whose next URL carries only `page_info` and `limit`, and `X-Shopify-Shop-Api-Call-Limit`
//! on every answer.

use serde_json::json;
use wiremock::matchers::{header, method, path};
use wiremock::Mock;

use super::*;

const ORDERS: &str = "/admin/api/2025-10/orders.json";

fn shopify(server: &MockServer) -> Box<dyn Provider> {
    provider(&format!(
        "preset = \"shopify_orders\"\nbase_url = \"{}\"\n",
        server.uri()
    ))
}

fn orders(ids_and_times: &[(u64, &str)]) -> Json {
    let orders: Vec<Json> = ids_and_times
        .iter()
        .map(|(id, updated_at)| json!({"id": id, "name": format!("#{id}"), "updated_at": updated_at}))
        .collect();
    json!({ "orders": orders })
}

/// An answer with the call-limit header Shopify sends on every REST Admin response.
fn answer(body: Json, used: u32) -> ResponseTemplate {
    json(body).insert_header(
        "X-Shopify-Shop-Api-Call-Limit",
        format!("{used}/40").as_str(),
    )
}

fn page_link(server: &MockServer, page_info: &str) -> String {
    format!("{}{ORDERS}?limit=250&page_info={page_info}", server.uri())
}

#[tokio::test]
async fn shopify_orders_follow_link_headers_with_only_page_info_and_limit() {
    let server = MockServer::start().await;
    let token = || header("X-Shopify-Access-Token", TOKEN);
    Mock::given(method("GET"))
        .and(path(ORDERS))
        .and(token())
        .and(exact_query(&[("status", "any"), ("limit", "250")]))
        .respond_with(
            answer(orders(&[(450789469, "2024-03-01T10:15:00-05:00")]), 1).insert_header(
                "Link",
                format!("<{}>; rel=\"next\"", page_link(&server, "p2")).as_str(),
            ),
        )
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(ORDERS))
        .and(token())
        .and(exact_query(&[("page_info", "p2"), ("limit", "250")]))
        .respond_with(
            answer(orders(&[(450789470, "2024-03-02T09:00:00-05:00")]), 2).insert_header(
                "Link",
                format!(
                    "<{}>; rel=\"previous\", <{}>; rel=\"next\"",
                    page_link(&server, "p1"),
                    page_link(&server, "p3")
                )
                .as_str(),
            ),
        )
        .expect(1)
        .mount(&server)
        .await;
    // The last page links only back.
    Mock::given(method("GET"))
        .and(path(ORDERS))
        .and(token())
        .and(exact_query(&[("page_info", "p3"), ("limit", "250")]))
        .respond_with(
            answer(orders(&[(450789471, "2024-02-28T08:00:00-05:00")]), 3).insert_header(
                "Link",
                format!("<{}>; rel=\"previous\"", page_link(&server, "p2")).as_str(),
            ),
        )
        .expect(1)
        .mount(&server)
        .await;

    let walk = walk(shopify(&server).as_ref(), TOKEN, None).await.unwrap();
    assert_eq!(walk.ids, ["450789469", "450789470", "450789471"]);
    assert_eq!(walk.pages, 3);
    assert_eq!(
        walk.watermark,
        Some(Watermark::Time(time("2024-03-02T14:00:00Z")))
    );
}

#[tokio::test]
async fn shopify_orders_wait_out_retry_after_on_429() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(ORDERS))
        .respond_with(
            ResponseTemplate::new(429)
                // Shopify writes it with a decimal point.
                .insert_header("Retry-After", "1.0")
                .insert_header("X-Shopify-Shop-Api-Call-Limit", "40/40")
                .set_body_json(json!({"errors": "Exceeded 2 calls per second for api client. Reduce request rates to resume uninterrupted service."})),
        )
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(ORDERS))
        .and(exact_query(&[("status", "any"), ("limit", "250")]))
        .respond_with(answer(orders(&[(1, "2024-03-01T10:15:00-05:00")]), 40))
        .mount(&server)
        .await;
    assert_waits_out_429(shopify(&server).as_ref(), TOKEN, &["1"]).await;
    assert_eq!(requests(&server).await, 2);
}

#[tokio::test]
async fn shopify_orders_surface_the_errors_body_of_a_401() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(ORDERS))
        .respond_with(ResponseTemplate::new(401).set_body_json(json!({
            "errors": "[API] Invalid API key or access token (unrecognized login or wrong password)"
        })))
        .expect(1)
        .mount(&server)
        .await;
    let message = unauthorized(shopify(&server).as_ref(), "wrong").await;
    assert!(
        message.contains("Invalid API key or access token"),
        "{message}"
    );
}

#[tokio::test]
async fn shopify_orders_incremental_run_sends_updated_at_min() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(ORDERS))
        .and(header("X-Shopify-Access-Token", TOKEN))
        .and(exact_query(&[
            ("status", "any"),
            ("limit", "250"),
            ("updated_at_min", "2024-03-01T15:00:00Z"),
        ]))
        .respond_with(answer(orders(&[(7, "2024-03-05T12:00:00-05:00")]), 1))
        .expect(1)
        .mount(&server)
        .await;
    let walk = walk(
        shopify(&server).as_ref(),
        TOKEN,
        Some(time("2024-03-01T15:00:00Z")),
    )
    .await
    .unwrap();
    assert_eq!(walk.ids, ["7"]);
    assert_eq!(
        walk.watermark,
        Some(Watermark::Time(time("2024-03-05T17:00:00Z")))
    );
}
