//! Inbound provider webhooks through a real daemon's API: each scheme's good delivery is
//! kept once and its replay answered 200 with nothing new; a tampered byte, a wrong
//! secret, a stale timestamp or no signature is 401 and kept nowhere; the body cap is the
//! provider's; unknown providers are 404 and verified non-JSON 400.

use base64::Engine;
use hmac::{Hmac, Mac};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use sha2::Sha256;

use crate::helpers::{spawn_app, TestApp};
use crate::http::{assert_problem, query, Served};

const GITHUB_SECRET: &str = "It's a Secret to Everybody";
const STRIPE_SECRET: &str = "whsec_stripe_test_secret";
const SHOPIFY_SECRET: &str = "shopify_secret";
const GITLAB_TOKEN: &str = "gitlab-token-0123456789";
const STANDARD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const CUSTOM_SECRET: &str = "legacy_secret";

/// The variables the daemon gets: GitHub's secret is the second of its list, as after a
/// rotation started.
const ENV: [(&str, &str); 7] = [
    ("HOOK_GH_NEXT", "a-secret-not-yet-used-by-github"),
    ("HOOK_GH", GITHUB_SECRET),
    ("HOOK_STRIPE", STRIPE_SECRET),
    ("HOOK_SHOPIFY", SHOPIFY_SECRET),
    ("HOOK_GITLAB", GITLAB_TOKEN),
    ("HOOK_STD", STANDARD_SECRET),
    ("HOOK_CUSTOM", CUSTOM_SECRET),
];

fn rest(name: &str, webhooks: &str) -> String {
    format!(
        "\n[providers.{name}]\nkind = \"rest\"\nbase_url = \"https://api.example.com\"\n\
         path = \"/items\"\nrecords_path = \"data\"\nid_field = \"id\"\nauth = \"none\"\n\
         schedule = \"0 0 0 1 1 *\"\n{webhooks}"
    )
}

/// One provider per scheme, and `plain` without webhooks; disabled, so that their
/// deliveries stay `received` (routing them is the tests' at the end of this file).
fn providers() -> String {
    let disabled = |table: String| table.replacen("schedule =", "enabled = false\nschedule =", 1);
    [
        "\n[providers.gh]\nkind = \"github\"\nschedule = \"0 0 0 1 1 *\"\n\
         [providers.gh.webhooks]\nsecret_env = [\"HOOK_GH_NEXT\", \"HOOK_GH\"]\nmax_body_bytes = 2048\n"
            .to_string(),
        "\n[providers.stripe]\nkind = \"stripe\"\nschedule = \"0 0 0 1 1 *\"\n\
         [providers.stripe.webhooks]\nsecret_env = \"HOOK_STRIPE\"\n"
            .to_string(),
        rest(
            "shop",
            "[providers.shop.webhooks]\nscheme = \"shopify\"\nsecret_env = \"HOOK_SHOPIFY\"\n",
        ),
        rest(
            "lab",
            "[providers.lab.webhooks]\nscheme = \"gitlab\"\nsecret_env = \"HOOK_GITLAB\"\n",
        ),
        rest(
            "std",
            "[providers.std.webhooks]\nscheme = \"standard\"\nsecret_env = \"HOOK_STD\"\n",
        ),
        rest(
            "custom",
            "[providers.custom.webhooks]\nscheme = \"hmac\"\nsecret_env = \"HOOK_CUSTOM\"\n\
             header = \"X-Signature\"\nalgorithm = \"sha1\"\nencoding = \"hex\"\nprefix = \"sha1=\"\n\
             timestamp_header = \"X-Timestamp\"\ntolerance = \"1m\"\nid_header = \"X-Id\"\n",
        ),
        rest("plain", ""),
    ]
    .map(disabled)
    .concat()
}

async fn serve(app: &TestApp) -> Served {
    Served::start_with_env(app, &providers(), &ENV, |text| text).await
}

/// [`serve`] with `/metrics` on the port returned.
async fn serve_with_metrics(app: &TestApp) -> (Served, u16) {
    let metrics_port = crate::daemon::free_port();
    let served = Served::start_with_env(app, &providers(), &ENV, |text| {
        text.replace(
            "[daemon]\n",
            &format!("[daemon]\nlisten = \"127.0.0.1:{metrics_port}\"\n"),
        )
    })
    .await;
    (served, metrics_port)
}

fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("any key");
    parts.iter().for_each(|part| mac.update(part));
    mac.finalize().into_bytes().to_vec()
}

fn hmac_sha1(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut mac = Hmac::<sha1::Sha1>::new_from_slice(key).expect("any key");
    parts.iter().for_each(|part| mac.update(part));
    mac.finalize().into_bytes().to_vec()
}

fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// A delivery as its provider would send it: the provider, the headers and the body.
struct Delivery {
    provider: &'static str,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// What the inbox row's `delivery_id` and `event_type` should be.
    id: String,
    event_type: Option<&'static str>,
}

/// How a delivery is signed.
#[derive(Clone, Copy, PartialEq)]
enum Signing {
    Good,
    WrongSecret,
    /// Timestamped schemes: ten minutes old.
    Stale,
}

fn secret_for(signing: Signing, good: &str) -> String {
    match signing {
        Signing::WrongSecret => "whsec_bm90IHRoZSBzZWNyZXQgYXQgYWxs".to_string(),
        _ => good.to_string(),
    }
}

fn timestamp_for(signing: Signing) -> i64 {
    match signing {
        Signing::Stale => now() - 600,
        _ => now(),
    }
}

fn header(name: &str, value: impl Into<String>) -> (String, String) {
    (name.to_string(), value.into())
}

fn github(tag: &str, signing: Signing) -> Delivery {
    github_with(
        tag,
        signing,
        json!({"action": "opened", "issue": {"id": 1, "title": tag}}),
    )
}

/// A GitHub `issues` delivery of `body`.
fn github_with(tag: &str, signing: Signing, body: Value) -> Delivery {
    let body = body.to_string();
    let secret = secret_for(signing, GITHUB_SECRET);
    let signature = const_hex::encode(hmac_sha256(secret.as_bytes(), &[body.as_bytes()]));
    let id = format!("gh-{tag}");
    Delivery {
        provider: "gh",
        headers: vec![
            header("X-Hub-Signature-256", format!("sha256={signature}")),
            header("X-GitHub-Delivery", &id),
            header("X-GitHub-Event", "issues"),
        ],
        body: body.into_bytes(),
        id,
        event_type: Some("issues"),
    }
}

fn stripe(tag: &str, signing: Signing) -> Delivery {
    let id = format!("evt_{tag}");
    let body = json!({"id": id, "object": "event", "type": "charge.refunded", "data": {"object": {"id": "ch_1"}}}).to_string();
    let t = timestamp_for(signing).to_string();
    let secret = secret_for(signing, STRIPE_SECRET);
    let v1 = const_hex::encode(hmac_sha256(
        secret.as_bytes(),
        &[t.as_bytes(), b".", body.as_bytes()],
    ));
    Delivery {
        provider: "stripe",
        headers: vec![header("Stripe-Signature", format!("t={t},v1={v1},v0=0000"))],
        body: body.into_bytes(),
        id,
        event_type: Some("charge.refunded"),
    }
}

fn shopify(tag: &str, signing: Signing) -> Delivery {
    let body = json!({"id": 820982911946154508_u64, "name": tag}).to_string();
    let secret = secret_for(signing, SHOPIFY_SECRET);
    let id = format!("shop-{tag}");
    Delivery {
        provider: "shop",
        headers: vec![
            header(
                "X-Shopify-Hmac-Sha256",
                base64(&hmac_sha256(secret.as_bytes(), &[body.as_bytes()])),
            ),
            header("X-Shopify-Webhook-Id", &id),
            header("X-Shopify-Topic", "orders/create"),
        ],
        body: body.into_bytes(),
        id,
        event_type: Some("orders/create"),
    }
}

fn gitlab(tag: &str, signing: Signing) -> Delivery {
    let body = json!({"object_kind": "issue", "object_attributes": {"title": tag}}).to_string();
    let id = format!("lab-{tag}");
    Delivery {
        provider: "lab",
        headers: vec![
            header("X-Gitlab-Token", secret_for(signing, GITLAB_TOKEN)),
            header("X-Gitlab-Event-UUID", &id),
            header("X-Gitlab-Event", "Issue Hook"),
        ],
        body: body.into_bytes(),
        id,
        event_type: Some("Issue Hook"),
    }
}

fn standard(tag: &str, signing: Signing) -> Delivery {
    let body = json!({"type": "invoice.paid", "data": {"tag": tag}}).to_string();
    let id = format!("msg_{tag}");
    let timestamp = timestamp_for(signing).to_string();
    let secret = secret_for(signing, STANDARD_SECRET);
    let key = base64::engine::general_purpose::STANDARD
        .decode(secret.trim_start_matches("whsec_"))
        .expect("base64");
    let signature = base64(&hmac_sha256(
        &key,
        &[
            id.as_bytes(),
            b".",
            timestamp.as_bytes(),
            b".",
            body.as_bytes(),
        ],
    ));
    Delivery {
        provider: "std",
        headers: vec![
            header("webhook-id", &id),
            header("webhook-timestamp", timestamp),
            header("webhook-signature", format!("v1,{signature}")),
        ],
        body: body.into_bytes(),
        id,
        event_type: Some("invoice.paid"),
    }
}

fn custom(tag: &str, signing: Signing) -> Delivery {
    let body = json!({"type": "item.changed", "tag": tag}).to_string();
    let timestamp = timestamp_for(signing).to_string();
    let secret = secret_for(signing, CUSTOM_SECRET);
    let signature = const_hex::encode(hmac_sha1(
        secret.as_bytes(),
        &[timestamp.as_bytes(), b".", body.as_bytes()],
    ));
    let id = format!("custom-{tag}");
    Delivery {
        provider: "custom",
        headers: vec![
            header("X-Signature", format!("sha1={signature}")),
            header("X-Timestamp", timestamp),
            header("X-Id", &id),
        ],
        body: body.into_bytes(),
        id,
        event_type: Some("item.changed"),
    }
}

type Scheme = fn(&str, Signing) -> Delivery;

const SCHEMES: [(&str, Scheme); 6] = [
    ("github", github),
    ("stripe", stripe),
    ("shopify", shopify),
    ("gitlab", gitlab),
    ("standard", standard),
    ("hmac", custom),
];

/// POSTs `delivery` (with `body` in place of its own when given): the status, the
/// headers and the answer as JSON.
async fn send(
    served: &Served,
    delivery: &Delivery,
    body: Option<Vec<u8>>,
) -> (StatusCode, reqwest::header::HeaderMap, Value) {
    let body = body.unwrap_or_else(|| delivery.body.clone());
    let path = format!("/webhooks/{}", delivery.provider);
    served
        .call_with(
            Method::POST,
            &path,
            None,
            Some(("application/json", body)),
            &delivery.headers,
        )
        .await
}

/// The inbox: (provider, delivery id, event type, status, attempts, body), oldest first.
async fn inbox(app: &TestApp) -> Vec<(String, String, Option<String>, String, i64, String)> {
    query(
        app,
        "SELECT provider, delivery_id, event_type, status, attempts, body FROM webhook_deliveries ORDER BY id",
    )
    .await
    .into_iter()
    .map(|row| {
        (
            row.try_get("", "provider").expect("provider"),
            row.try_get("", "delivery_id").expect("delivery_id"),
            row.try_get("", "event_type").expect("event_type"),
            row.try_get("", "status").expect("status"),
            row.try_get("", "attempts").expect("attempts"),
            row.try_get("", "body").expect("body"),
        )
    })
    .collect()
}

#[tokio::test]
async fn each_scheme_keeps_a_good_delivery_once_and_answers_its_replay_200() {
    let app = spawn_app().await;
    let served = serve(&app).await;
    let mut expected = Vec::new();
    for (scheme, make) in SCHEMES {
        let delivery = make("first", Signing::Good);
        let started = std::time::Instant::now();
        let (status, _, answer) = send(&served, &delivery, None).await;
        assert_eq!(status, StatusCode::OK, "{scheme}: {answer}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(1),
            "{scheme}"
        );
        assert_eq!(
            answer,
            json!({"status": "accepted", "delivery_id": delivery.id}),
            "{scheme}"
        );
        let (status, _, answer) = send(&served, &delivery, None).await;
        assert_eq!(status, StatusCode::OK, "{scheme}: {answer}");
        assert_eq!(answer["status"], "duplicate", "{scheme}");
        expected.push((
            delivery.provider.to_string(),
            delivery.id.clone(),
            delivery.event_type.map(str::to_string),
            "received".to_string(),
            0,
            String::from_utf8(delivery.body.clone()).expect("UTF-8"),
        ));
    }
    assert_eq!(inbox(&app).await, expected);

    // A Stripe event id that differs only in case is another delivery on every backend.
    let mut upper = stripe("first", Signing::Good);
    upper.body = String::from_utf8(upper.body)
        .expect("UTF-8")
        .replace("evt_first", "evt_FIRST")
        .into_bytes();
    let upper = Delivery {
        headers: stripe_headers_for(&upper.body),
        ..upper
    };
    let (status, _, answer) = send(&served, &upper, None).await;
    assert_eq!(
        (status, &answer["status"]),
        (StatusCode::OK, &json!("accepted")),
        "{answer}"
    );
    assert_eq!(inbox(&app).await.len(), expected.len() + 1);
}

fn stripe_headers_for(body: &[u8]) -> Vec<(String, String)> {
    let t = now().to_string();
    let v1 = const_hex::encode(hmac_sha256(
        STRIPE_SECRET.as_bytes(),
        &[t.as_bytes(), b".", body],
    ));
    vec![header("Stripe-Signature", format!("t={t},v1={v1}"))]
}

/// A `Stripe-Signature` header made by Stripe's own Node library,
/// `stripe.webhooks.generateTestHeaderString` (pinned in tests/tools), not by our code.
fn signed_by_stripes_library(body: &str, secret: &str, timestamp: i64) -> String {
    let script = "const stripe = require(process.env.STRIPE_LIB)('sk_test_unused');\n\
        process.stdout.write(stripe.webhooks.generateTestHeaderString({\n\
          payload: process.env.BODY, secret: process.env.SECRET,\n\
          timestamp: Number(process.env.TIMESTAMP) }));";
    let output = std::process::Command::new("node")
        .args(["-e", script])
        .env("STRIPE_LIB", crate::helpers::test_tool("stripe"))
        .env("BODY", body)
        .env("SECRET", secret)
        .env("TIMESTAMP", timestamp.to_string())
        .output()
        .expect("node runs Stripe's library");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8")
}

#[tokio::test]
async fn a_delivery_signed_by_stripes_own_library_is_kept_and_its_forgeries_are_not() {
    let app = spawn_app().await;
    let served = serve(&app).await;
    let body = json!({
        "id": "evt_1QLibrarySigned", "object": "event", "api_version": "2024-06-20",
        "created": now(), "type": "customer.updated", "livemode": false,
        "data": {"object": {"id": "cus_Library", "object": "customer", "email": "a@example.com"}}
    })
    .to_string();
    let post = |signature: String, body: &str| Delivery {
        provider: "stripe",
        headers: vec![header("Stripe-Signature", signature)],
        body: body.as_bytes().to_vec(),
        id: "evt_1QLibrarySigned".to_string(),
        event_type: Some("customer.updated"),
    };

    let header_value = signed_by_stripes_library(&body, STRIPE_SECRET, now());
    assert!(header_value.starts_with("t="), "{header_value}");
    let (status, _, answer) = send(&served, &post(header_value.clone(), &body), None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["status"], "accepted", "{answer}");

    // The same library's header over another secret, over a stale time, or over a body
    // changed in one byte: refused, and nothing more is kept.
    let other_secret = signed_by_stripes_library(&body, "whsec_another_endpoint", now());
    let stale = signed_by_stripes_library(&body, STRIPE_SECRET, now() - 301);
    let changed = body.replace("a@example.com", "b@example.com");
    for (what, signature, sent) in [
        ("another secret", other_secret, body.as_str()),
        ("a stale time", stale, body.as_str()),
        ("a changed byte", header_value, changed.as_str()),
    ] {
        let (status, _, problem) = send(&served, &post(signature, sent), None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}: {problem}");
    }
    let kept = inbox(&app).await;
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(
        (kept[0].1.as_str(), kept[0].2.as_deref(), kept[0].5.as_str()),
        (
            "evt_1QLibrarySigned",
            Some("customer.updated"),
            body.as_str()
        )
    );
}

#[tokio::test]
async fn the_inbox_is_listed_over_the_api_newest_first_paged_and_filtered_with_its_own_scope() {
    let app = spawn_app().await;
    let served = serve(&app).await;
    let mut sent = Vec::new();
    for (_, make) in SCHEMES {
        let delivery = make("listed", Signing::Good);
        let (status, _, answer) = send(&served, &delivery, None).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        sent.push((delivery.provider, delivery.id));
    }
    app.execute(
        "UPDATE webhook_deliveries SET status = 'failed', attempts = 5, error = 'the record was refused' \
         WHERE delivery_id = 'evt_listed'",
    )
    .await;
    let reader = served.create_key("inbox", &["webhooks:read"]);
    let list = |query: &str| {
        let path = format!("/v1/webhooks/deliveries{query}");
        let served = &served;
        let reader = reader.clone();
        async move {
            let (status, headers, json) =
                served.call(Method::GET, &path, Some(&reader), None).await;
            (status, headers, json)
        }
    };

    // Newest first, two at a time, every delivery once.
    let mut seen = Vec::new();
    let mut query = "?limit=2".to_string();
    loop {
        let (status, _, page) = list(&query).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        let items = page["items"].as_array().expect("items");
        assert!(items.len() <= 2, "{page}");
        seen.extend(items.iter().map(|item| {
            (
                item["provider"].as_str().expect("provider").to_string(),
                item["delivery_id"]
                    .as_str()
                    .expect("delivery_id")
                    .to_string(),
            )
        }));
        match page["next"].as_str() {
            Some(next) => query = format!("?limit=2&cursor={next}"),
            None => break,
        }
    }
    let newest_first: Vec<(String, String)> = sent
        .iter()
        .rev()
        .map(|(provider, id)| (provider.to_string(), id.clone()))
        .collect();
    assert_eq!(seen, newest_first);

    let (status, _, failed) = list("?status=failed").await;
    assert_eq!(status, StatusCode::OK, "{failed}");
    assert_eq!(
        failed["items"].as_array().map(Vec::len),
        Some(1),
        "{failed}"
    );
    let item = &failed["items"][0];
    assert_eq!(
        (
            &item["provider"],
            &item["status"],
            &item["attempts"],
            &item["error"]
        ),
        (
            &json!("stripe"),
            &json!("failed"),
            &json!(5),
            &json!("the record was refused")
        )
    );
    assert!(
        item["body"]
            .as_str()
            .is_some_and(|body| body.contains("evt_listed")),
        "{item}"
    );
    let (_, _, by_provider) = list("?provider=gh").await;
    assert_eq!(
        by_provider["items"].as_array().map(Vec::len),
        Some(1),
        "{by_provider}"
    );
    assert_eq!(by_provider["items"][0]["provider"], "gh");

    for bad in [
        "?status=lost",
        "?limit=0",
        "?cursor=bm90LWEtY3Vyc29y",
        "?since=1",
    ] {
        let (status, headers, problem) = list(bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {problem}");
        assert_problem(status, &headers, &problem);
    }
    let notifications = served.create_key("outbound", &["notifications:read", "records:read"]);
    let (status, _, problem) = served
        .call(
            Method::GET,
            "/v1/webhooks/deliveries",
            Some(&notifications),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{problem}");
}

#[tokio::test]
async fn a_tampered_byte_a_wrong_secret_a_stale_timestamp_or_no_signature_is_401_and_kept_nowhere()
{
    let app = spawn_app().await;
    let (served, metrics_port) = serve_with_metrics(&app).await;
    let mut secrets_and_signatures = Vec::new();
    for (scheme, make) in SCHEMES {
        let good = make("tampered", Signing::Good);
        // GitLab's token signs nothing, so a changed body cannot be told by it.
        if scheme != "gitlab" {
            let mut tampered = good.body.clone();
            let last = tampered.len() - 2;
            tampered[last] ^= 0x01;
            let (status, headers, problem) = send(&served, &good, Some(tampered)).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{scheme}: {problem}");
            assert_problem(status, &headers, &problem);
        }

        let wrong = make("wrong", Signing::WrongSecret);
        let (status, _, problem) = send(&served, &wrong, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{scheme}: {problem}");
        assert!(
            problem["detail"]
                .as_str()
                .is_some_and(|d| d.contains("signature")),
            "{scheme}: {problem}"
        );

        let mut unsigned = make("unsigned", Signing::Good);
        unsigned.headers.remove(0);
        let (status, _, problem) = send(&served, &unsigned, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{scheme}: {problem}");
        assert!(
            problem["detail"]
                .as_str()
                .is_some_and(|d| d.contains("missing")),
            "{scheme}: {problem}"
        );
        secrets_and_signatures.extend(good.headers.iter().map(|(_, value)| value.clone()));
        secrets_and_signatures.extend(wrong.headers.iter().take(1).map(|(_, value)| value.clone()));
    }
    for (scheme, make, tolerance) in [
        ("stripe", stripe as Scheme, "300 seconds"),
        ("standard", standard, "300 seconds"),
        ("hmac", custom, "60 seconds"),
    ] {
        let stale = make("stale", Signing::Stale);
        let (status, _, problem) = send(&served, &stale, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{scheme}: {problem}");
        assert!(
            problem["detail"]
                .as_str()
                .is_some_and(|d| d.contains(tolerance)),
            "{scheme}: {problem}"
        );
    }
    assert_eq!(inbox(&app).await, Vec::new());
    let metrics = metrics_text(metrics_port).await;
    for (provider, outcome, count) in [
        ("gh", "unauthorized", 3),
        ("lab", "unauthorized", 2),
        ("stripe", "unauthorized", 3),
        ("stripe", "stale", 1),
        ("custom", "stale", 1),
    ] {
        let counted = metrics.lines().any(|line| {
            line.starts_with("tributary_webhook_deliveries_total{")
                && line.contains(&format!("provider=\"{provider}\""))
                && line.contains(&format!("outcome=\"{outcome}\""))
                && line.ends_with(&format!(" {count}"))
        });
        assert!(counted, "{provider} {outcome} {count}:\n{metrics}");
    }
    // The log says which check failed, never the signature, the token or the secret.
    let log = served.daemon.log();
    assert!(log.contains("A webhook delivery was refused."), "{log}");
    for (_, secret) in ENV {
        assert!(!log.contains(secret), "a secret is in the log");
    }
    for value in secrets_and_signatures
        .iter()
        .filter(|value| value.len() > 20 && !value.starts_with("gh-"))
    {
        assert!(!log.contains(value.as_str()), "{value} is in the log");
    }
}

#[tokio::test]
async fn the_body_cap_is_the_providers_and_unknown_providers_and_verified_non_json_are_refused() {
    let app = spawn_app().await;
    let served = serve(&app).await;

    // 1,500 bytes: over the API's own cap of 1 KiB, within gh's 2,048.
    let padded = |tag: &str, size: usize| {
        let mut delivery = github(tag, Signing::Good);
        let body = json!({"padding": "x".repeat(size)}).to_string();
        let signature =
            const_hex::encode(hmac_sha256(GITHUB_SECRET.as_bytes(), &[body.as_bytes()]));
        delivery.headers[0] = header("X-Hub-Signature-256", format!("sha256={signature}"));
        delivery.body = body.into_bytes();
        delivery
    };
    let (status, _, answer) = send(&served, &padded("within", 1500), None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let (status, headers, problem) = send(&served, &padded("over", 3000), None).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{problem}");
    assert_problem(status, &headers, &problem);
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("providers.gh.webhooks.max_body_bytes")),
        "{problem}"
    );

    for provider in ["nobody", "plain"] {
        let mut delivery = github("nowhere", Signing::Good);
        delivery.provider = provider;
        let (status, headers, problem) = send(&served, &delivery, None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{provider}: {problem}");
        assert_problem(status, &headers, &problem);
    }

    // Signed correctly, but not JSON.
    let body = b"{\"id\": evt_broken".to_vec();
    let mut broken = github("broken", Signing::Good);
    let signature = const_hex::encode(hmac_sha256(GITHUB_SECRET.as_bytes(), &[&body]));
    broken.headers[0] = header("X-Hub-Signature-256", format!("sha256={signature}"));
    let (status, headers, problem) = send(&served, &broken, Some(body)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");
    assert_problem(status, &headers, &problem);
    assert_eq!(problem["field"], "body", "{problem}");

    let kept: Vec<String> = inbox(&app).await.into_iter().map(|row| row.1).collect();
    assert_eq!(kept, ["gh-within"]);
}

/// Whether `/metrics` counts `count` deliveries of `provider` with `outcome`.
fn counted(metrics: &str, provider: &str, outcome: &str, count: u64) -> bool {
    metrics.lines().any(|line| {
        line.starts_with("tributary_webhook_deliveries_total{")
            && line.contains(&format!("provider=\"{provider}\""))
            && line.contains(&format!("outcome=\"{outcome}\""))
            && line.ends_with(&format!(" {count}"))
    })
}

#[tokio::test]
async fn a_verified_malformed_body_is_400_and_counted_and_no_refused_body_reaches_the_log() {
    let app = spawn_app().await;
    let (served, metrics_port) = serve_with_metrics(&app).await;
    let marker = "zq-distinctive-body-8731";
    let signed = |body: &[u8], secret: &str| {
        let mut delivery = github("malformed", Signing::Good);
        let signature = const_hex::encode(hmac_sha256(secret.as_bytes(), &[body]));
        delivery.headers[0] = header("X-Hub-Signature-256", format!("sha256={signature}"));
        delivery
    };

    // Signed with the secret, but not JSON.
    let broken = format!("{{\"id\": {marker}").into_bytes();
    let (status, headers, problem) = send(
        &served,
        &signed(&broken, GITHUB_SECRET),
        Some(broken.clone()),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");
    assert_problem(status, &headers, &problem);
    assert_eq!(problem["field"], "body", "{problem}");

    // JSON, but signed with another secret.
    let forged = json!({"action": "opened", "issue": {"id": 1, "title": marker}})
        .to_string()
        .into_bytes();
    let (status, _, problem) = send(
        &served,
        &signed(&forged, "not the secret"),
        Some(forged.clone()),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{problem}");
    assert!(!problem.to_string().contains(marker), "{problem}");

    assert_eq!(inbox(&app).await, Vec::new());
    let metrics = metrics_text(metrics_port).await;
    assert!(counted(&metrics, "gh", "malformed", 1), "{metrics}");
    assert!(counted(&metrics, "gh", "unauthorized", 1), "{metrics}");
    let log = served.daemon.log();
    assert!(
        log.contains("A verified webhook delivery was malformed.")
            && log.contains("A webhook delivery was refused."),
        "{log}"
    );
    assert!(!log.contains(marker), "a body is in the log:\n{log}");
}

/// A secret's variable that is not set stops the daemon before it starts, naming the key
/// and the variable.
#[tokio::test]
async fn a_webhook_secret_variable_that_is_not_set_stops_the_daemon_naming_it() {
    let app = spawn_app().await;
    let config = app.write_config(&format!("[api]\nlisten = \"127.0.0.1:0\"\n{}", providers()));
    let mut command = crate::helpers::tributary(&config);
    command
        .arg("daemon")
        .timeout(std::time::Duration::from_secs(30));
    for (name, value) in ENV.iter().filter(|(name, _)| *name != "HOOK_GH_NEXT") {
        command.env(name, value);
    }
    let output = crate::helpers::run(&mut command);
    assert_ne!(output.code, 0, "{}", output.stderr);
    assert!(
        output.stderr.contains("providers.gh.webhooks.secret_env")
            && output
                .stderr
                .contains("environment variable HOOK_GH_NEXT is not set"),
        "{}",
        output.stderr
    );
}

/// Strava's subscription: the verify token is the secret, 120475 the subscription.
fn strava_provider(extra: &str) -> String {
    "\n[providers.strava]\nkind = \"strava\"\nbase_url = \"https://www.strava.com/api/v3\"\n\
     client_id = \"4242\"\nclient_secret_env = \"HOOK_STRAVA_CLIENT\"\nschedule = \"0 0 0 1 1 *\"\n\
     [providers.strava.webhooks]\nsecret_env = \"HOOK_STRAVA_VERIFY\"\nsubscription_id = 120475\n"
        .to_string()
        + extra
}

const STRAVA_ENV: [(&str, &str); 3] = [
    ("HOOK_STRAVA_CLIENT", "client-secret-value"),
    ("HOOK_STRAVA_VERIFY", "STRAVA-verify-token"),
    ("HOOK_GH", GITHUB_SECRET),
];

/// Strava's own example event (developers.strava.com/docs/webhooks), with `changes`.
fn strava_event(changes: Value) -> Vec<u8> {
    let mut event = json!({
        "aspect_type": "update",
        "event_time": 1516126040,
        "object_id": 1360128428,
        "object_type": "activity",
        "owner_id": 134815,
        "subscription_id": 120475,
        "updates": {"title": "Messy"}
    });
    if let (Some(event), Some(changes)) = (event.as_object_mut(), changes.as_object()) {
        for (key, value) in changes {
            match value {
                Value::Null => event.remove(key),
                _ => event.insert(key.clone(), value.clone()),
            };
        }
    }
    event.to_string().into_bytes()
}

#[tokio::test]
async fn strava_s_handshake_echoes_the_challenge_only_for_the_verify_token() {
    let app = spawn_app().await;
    let gh = "\n[providers.gh]\nkind = \"github\"\nschedule = \"0 0 0 1 1 *\"\n\
              [providers.gh.webhooks]\nsecret_env = \"HOOK_GH\"\n";
    let served = Served::start_with_env(&app, &strava_provider(gh), &STRAVA_ENV, |text| text).await;
    let handshake = |provider: &str, mode: &str, token: Option<&str>| {
        let token = token.map_or(String::new(), |token| format!("&hub.verify_token={token}"));
        format!("/webhooks/{provider}?hub.mode={mode}&hub.challenge=15f7d1a91c1f40f8a748fd134752feb3{token}")
    };
    let (status, _, answer) = served
        .call(
            Method::GET,
            &handshake("strava", "subscribe", Some("STRAVA-verify-token")),
            None,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(
        answer,
        json!({"hub.challenge": "15f7d1a91c1f40f8a748fd134752feb3"})
    );

    for token in [Some("STRAVA-verify-tokeN"), Some("STRAVA"), Some(""), None] {
        let (status, headers, problem) = served
            .call(
                Method::GET,
                &handshake("strava", "subscribe", token),
                None,
                None,
            )
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{token:?}: {problem}");
        assert_problem(status, &headers, &problem);
        assert!(
            !problem.to_string().contains("15f7d1a9"),
            "the challenge is not echoed: {problem}"
        );
    }
    let (status, _, problem) = served
        .call(
            Method::GET,
            &handshake("strava", "unsubscribe", Some("STRAVA-verify-token")),
            None,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");
    // A provider of another scheme answers no handshake.
    let (status, _, problem) = served
        .call(
            Method::GET,
            &handshake("gh", "subscribe", Some(GITHUB_SECRET)),
            None,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{problem}");
    let log = served.daemon.log();
    assert!(
        !log.contains("STRAVA-verify-token"),
        "the token is in the log"
    );
}

#[tokio::test]
async fn strava_events_are_kept_once_under_their_fields_only_for_the_configured_subscription() {
    let app = spawn_app().await;
    let served = Served::start_with_env(&app, &strava_provider(""), &STRAVA_ENV, |text| text).await;
    let post = |body: Vec<u8>| {
        let served = &served;
        async move {
            served
                .call(
                    Method::POST,
                    "/webhooks/strava",
                    None,
                    Some(("application/json", body)),
                )
                .await
        }
    };
    let (status, _, answer) = post(strava_event(json!({}))).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let id = "activity:1360128428:update:1516126040:134815";
    assert_eq!(answer, json!({"status": "accepted", "delivery_id": id}));
    // Strava's retry of the same event.
    let (status, _, answer) = post(strava_event(json!({}))).await;
    assert_eq!(
        (status, &answer["status"]),
        (StatusCode::OK, &json!("duplicate"))
    );
    // Another event of the same activity is another delivery.
    let (status, _, answer) = post(strava_event(
        json!({"aspect_type": "delete", "event_time": 1516126100, "updates": {}}),
    ))
    .await;
    assert_eq!(
        (status, &answer["status"]),
        (StatusCode::OK, &json!("accepted")),
        "{answer}"
    );

    for (refused, why) in [
        (
            json!({"subscription_id": 999, "owner_id": 1}),
            "another subscription",
        ),
        (
            json!({"subscription_id": "120475", "owner_id": 2}),
            "the id as text",
        ),
        (
            json!({"subscription_id": null, "owner_id": 3}),
            "no subscription",
        ),
    ] {
        let (status, headers, problem) = post(strava_event(refused)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{why}: {problem}");
        assert_problem(status, &headers, &problem);
        assert!(
            problem["detail"]
                .as_str()
                .is_some_and(|d| d.contains("subscription_id")),
            "{why}: {problem}"
        );
    }
    let (status, _, problem) = post(strava_event(json!({"owner_id": null}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");

    let kept: Vec<(String, String, Option<String>)> = inbox(&app)
        .await
        .into_iter()
        .map(|row| (row.0, row.1, row.2))
        .collect();
    assert_eq!(
        kept,
        [
            (
                "strava".to_string(),
                id.to_string(),
                Some("activity.update".to_string())
            ),
            (
                "strava".to_string(),
                "activity:1360128428:delete:1516126100:134815".to_string(),
                Some("activity.delete".to_string())
            ),
        ]
    );
}

/// The limit counts verified deliveries only: forged ones before it spend none of it, and
/// past it a good delivery is 429 with `Retry-After` and kept nowhere.
#[tokio::test]
async fn past_the_rate_limit_a_delivery_is_429_with_retry_after_and_forgeries_spend_none_of_it() {
    let app = spawn_app().await;
    let providers = "\n[providers.gh]\nkind = \"github\"\nschedule = \"0 0 0 1 1 *\"\n\
                     [providers.gh.webhooks]\nsecret_env = \"HOOK_GH\"\nrate_limit = \"2/day\"\n";
    let served =
        Served::start_with_env(&app, providers, &[("HOOK_GH", GITHUB_SECRET)], |text| text).await;
    for tag in ["forged-1", "forged-2", "forged-3"] {
        let (status, _, problem) = send(&served, &github(tag, Signing::WrongSecret), None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{problem}");
    }
    for tag in ["first", "second"] {
        let (status, _, answer) = send(&served, &github(tag, Signing::Good), None).await;
        assert_eq!(status, StatusCode::OK, "{tag}: {answer}");
    }
    let (status, headers, problem) = send(&served, &github("third", Signing::Good), None).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{problem}");
    assert_problem(status, &headers, &problem);
    let retry_after: u64 = headers
        .get("retry-after")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse().ok())
        .expect("a Retry-After in seconds");
    assert!((1..=86_400).contains(&retry_after), "{retry_after}");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("rate_limit")),
        "{problem}"
    );
    let kept: Vec<String> = inbox(&app).await.into_iter().map(|row| row.1).collect();
    assert_eq!(kept, ["gh-first", "gh-second"]);
}

fn gh_with_secret(secret: &str) -> String {
    format!(
        "\n[providers.gh]\nkind = \"github\"\nschedule = \"0 0 0 1 1 *\"\n\
         [providers.gh.webhooks]\nsecret = \"{secret}\"\n"
    )
}

/// `tributary secrets seal-webhook PROVIDER` with `secret` on standard input: the sealed
/// text it printed.
fn seal_webhook(app: &TestApp, provider: &str, secret: &str) -> String {
    let config = app.write_config(
        "\n[providers.gh]\nkind = \"github\"\nschedule = \"0 0 0 1 1 *\"\n\
         [providers.other]\nkind = \"github\"\nschedule = \"0 0 0 1 1 *\"\n",
    );
    let mut command = crate::helpers::tributary(&config);
    command
        .args(["secrets", "seal-webhook", provider])
        .write_stdin(format!("{secret}\n"));
    let output = crate::helpers::run(&mut command);
    assert_eq!(output.code, 0, "{}", output.stderr);
    let sealed = output.stdout.trim().to_string();
    assert!(sealed.starts_with("sealed:v1:"), "{sealed}");
    assert!(!sealed.contains(secret));
    sealed
}

/// The daemon's stderr when it refuses to start with `providers` (and `edit` applied).
fn refused_start(app: &TestApp, providers: &str) -> String {
    let config = app.write_config(&format!("[api]\nlisten = \"127.0.0.1:0\"\n{providers}"));
    let mut command = crate::helpers::tributary(&config);
    command
        .arg("daemon")
        .timeout(std::time::Duration::from_secs(30));
    let output = crate::helpers::run(&mut command);
    assert_ne!(output.code, 0, "{}", output.stderr);
    assert!(
        output.stderr.contains(&config.display().to_string()),
        "{}",
        output.stderr
    );
    output.stderr
}

#[tokio::test]
async fn a_sealed_secret_verifies_deliveries_and_a_literal_one_needs_allow_plaintext() {
    let app = spawn_app().await;
    let sealed = seal_webhook(&app, "gh", GITHUB_SECRET);
    let served = Served::start_with_env(&app, &gh_with_secret(&sealed), &[], |text| text).await;
    let (status, _, answer) = send(&served, &github("sealed", Signing::Good), None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let (status, _, answer) = send(&served, &github("wrong", Signing::WrongSecret), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{answer}");
    assert!(!served.daemon.log().contains(GITHUB_SECRET));
    drop(served);

    // Written in clear: refused at load, naming the file and the key, never the value.
    let stderr = refused_start(&app, &gh_with_secret(GITHUB_SECRET));
    assert!(
        stderr.contains("providers.gh.webhooks.secret") && stderr.contains("allow_plaintext"),
        "{stderr}"
    );
    assert!(!stderr.contains(GITHUB_SECRET), "{stderr}");

    // Sealed for another provider: it does not open as gh's.
    let other = seal_webhook(&app, "other", GITHUB_SECRET);
    let stderr = refused_start(&app, &gh_with_secret(&other));
    assert!(
        stderr.contains("providers.gh.webhooks.secret")
            && stderr.contains("sealed for another provider"),
        "{stderr}"
    );

    // With allow_plaintext, the literal is taken as written.
    let served = Served::start_with_env(&app, &gh_with_secret(GITHUB_SECRET), &[], |text| {
        text.replace("[secrets]\n", "[secrets]\nallow_plaintext = true\n")
    })
    .await;
    let (status, _, answer) = send(&served, &github("plain", Signing::Good), None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let kept: Vec<String> = inbox(&app).await.into_iter().map(|row| row.1).collect();
    assert_eq!(kept, ["gh-sealed", "gh-plain"]);
}

async fn metrics_text(metrics_port: u16) -> String {
    reqwest::get(format!("http://127.0.0.1:{metrics_port}/metrics"))
        .await
        .expect("metrics answer")
        .text()
        .await
        .expect("metrics text")
}

/// `/metrics`' `tributary_webhook_lag_seconds` of `provider`.
async fn lag_of(metrics_port: u16, provider: &str) -> f64 {
    let metrics = metrics_text(metrics_port).await;
    metrics
        .lines()
        .find(|line| {
            line.starts_with("tributary_webhook_lag_seconds{")
                && line.contains(&format!("provider=\"{provider}\""))
        })
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no lag for {provider}:\n{metrics}"))
}

#[tokio::test]
async fn the_lag_is_the_age_of_the_oldest_delivery_not_yet_applied_by_provider() {
    use sea_orm::ConnectionTrait;

    let app = spawn_app().await;
    let (served, metrics_port) = serve_with_metrics(&app).await;
    assert_eq!(lag_of(metrics_port, "gh").await, 0.0, "nothing waits yet");

    // A delivery received two hours ago and not applied since, and one just now.
    let two_hours_ago = chrono::Utc::now() - chrono::TimeDelta::hours(2);
    crate::retention::webhook_at(&app, "received", two_hours_ago).await;
    let (status, _, answer) = send(&served, &github("new", Signing::Good), None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");

    let lag = lag_of(metrics_port, "gh").await;
    assert!((7_190.0..7_300.0).contains(&lag), "{lag}");
    assert_eq!(lag_of(metrics_port, "stripe").await, 0.0);

    // Once the old one is applied, the lag is the new one's.
    app.db
        .execute_unprepared(
            "UPDATE webhook_deliveries SET status = 'applied' WHERE delivery_id LIKE 'received-%'",
        )
        .await
        .expect("applied");
    let lag = lag_of(metrics_port, "gh").await;
    assert!((0.0..60.0).contains(&lag), "{lag}");
}

/// `gh` enabled, syncing `issues` from the mock API for alice, whose GitHub user id is
/// 4242; `/metrics` on the port returned.
async fn serve_routing(app: &TestApp) -> (Served, u16) {
    let providers = format!(
        "\n[providers.gh]\nkind = \"github\"\nbase_url = \"{}\"\nschedule = \"0 0 0 1 1 *\"\n\
         [providers.gh.webhooks]\nsecret_env = \"HOOK_GH\"\n{}",
        app.api.uri(),
        crate::helpers::connections("gh", &["alice"]),
    );
    let metrics_port = crate::daemon::free_port();
    let served = Served::start_with_env(app, &providers, &ENV, |text| {
        text.replace(
            "[daemon]\n",
            &format!("[daemon]\nlisten = \"127.0.0.1:{metrics_port}\"\n"),
        )
    })
    .await;
    use sea_orm::ConnectionTrait;
    app.db
        .execute_unprepared("UPDATE connections SET account_id = '4242' WHERE user_id = 'alice'")
        .await
        .expect("alice's account id");
    (served, metrics_port)
}

/// A GitHub `issues` delivery signed with the secret, sent by user `sender`.
fn github_from(tag: &str, sender: u64) -> Delivery {
    let body =
        json!({"action": "opened", "issue": {"id": 1, "title": tag}, "sender": {"id": sender}});
    github_with(tag, Signing::Good, body)
}

/// Waits up to 30 s for `sql`'s first column of its first row to be `expected`.
async fn until_text(app: &TestApp, sql: &str, expected: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let rows = query(app, sql).await;
        let got: Option<String> = rows.first().and_then(|row| row.try_get_by_index(0).ok());
        if got.as_deref() == Some(expected) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{sql}: {got:?}, expected {expected}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// `GET /issues` with alice's token answers `body`, at least once.
async fn mount_alices_issues(app: &TestApp, body: Value) {
    wiremock::Mock::given(wiremock::matchers::method("GET"))
        .and(wiremock::matchers::path("/issues"))
        .and(wiremock::matchers::header(
            "authorization",
            "Bearer token-alice",
        ))
        .respond_with(wiremock::ResponseTemplate::new(200).set_body_json(body))
        .expect(1..)
        .mount(&app.api)
        .await;
}

#[tokio::test]
async fn a_delivery_for_a_connected_account_queues_one_webhook_run_that_fetches_its_stream() {
    let app = spawn_app().await;
    mount_alices_issues(
        &app,
        json!([crate::adapters::issue(1, "2026-12-05T10:00:00Z"),]),
    )
    .await;
    let (served, metrics_port) = serve_routing(&app).await;

    let (status, _, answer) = send(&served, &github_from("opened", 4242), None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    until_text(&app, "SELECT status FROM sync_jobs", "done").await;

    let jobs = query(&app, "SELECT id, kind, stream, status FROM sync_jobs").await;
    assert_eq!(jobs.len(), 1);
    let job_id: i64 = jobs[0].try_get("", "id").expect("id");
    let kind: String = jobs[0].try_get("", "kind").expect("kind");
    let stream: String = jobs[0].try_get("", "stream").expect("stream");
    assert_eq!((kind.as_str(), stream.as_str()), ("webhook", "issues"));
    let delivery = query(
        &app,
        "SELECT d.status, d.job_id, c.user_id FROM webhook_deliveries d \
         JOIN connections c ON c.id = d.connection_id",
    )
    .await;
    assert_eq!(delivery.len(), 1);
    let status: String = delivery[0].try_get("", "status").expect("status");
    let delivery_job: Option<i64> = delivery[0].try_get("", "job_id").expect("job_id");
    let user: String = delivery[0].try_get("", "user_id").expect("user_id");
    assert_eq!(
        (status.as_str(), delivery_job, user.as_str()),
        ("applied", Some(job_id), "alice")
    );
    let records = app.records().await;
    assert_eq!(records.len(), 1, "the run stored the issue it fetched");
    assert_eq!(records[0].external_id, "1");
    assert_eq!(
        lag_of(metrics_port, "gh").await,
        0.0,
        "nothing waits once settled"
    );
    app.api.verify().await;
}

#[tokio::test]
async fn a_delivery_for_an_unknown_account_is_unmatched_counted_and_queues_nothing() {
    let app = spawn_app().await;
    let (served, metrics_port) = serve_routing(&app).await;

    let (status, _, answer) = send(&served, &github_from("stranger", 7), None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    until_text(&app, "SELECT status FROM webhook_deliveries", "unmatched").await;

    assert!(query(&app, "SELECT id FROM sync_jobs").await.is_empty());
    let metrics = metrics_text(metrics_port).await;
    assert!(
        metrics.lines().any(
            |line| line.starts_with("tributary_webhook_deliveries_total{")
                && line.contains("outcome=\"unmatched\"")
                && line.contains("provider=\"gh\"")
                && line.ends_with(" 1")
        ),
        "{metrics}"
    );
    assert_eq!(lag_of(metrics_port, "gh").await, 0.0);

    // `tributary webhooks` shows it; `--failed` only a delivery that ended failed, with
    // its error.
    let webhooks = |args: &[&str]| {
        let output = crate::helpers::tributary(&served.config)
            .arg("webhooks")
            .args(args)
            .env("HOOK_GH", GITHUB_SECRET)
            .output()
            .expect("ran");
        assert!(output.status.success(), "{output:?}");
        String::from_utf8(output.stdout).expect("UTF-8")
    };
    let listed = webhooks(&[]);
    assert!(
        listed.contains("gh-stranger") && listed.contains("unmatched"),
        "{listed}"
    );
    assert!(webhooks(&["--failed"]).contains("No failed deliveries."));
    assert!(webhooks(&["--provider", "gh"]).contains("gh-stranger"));
    assert!(webhooks(&["--provider", "stripe"]).contains("No deliveries yet."));
    let failed = crate::retention::webhook_at(&app, "failed", chrono::Utc::now()).await;
    use sea_orm::ConnectionTrait;
    app.db
        .execute_unprepared(&format!(
            "UPDATE webhook_deliveries SET attempts = 5, error = 'the database went away' WHERE id = {failed}"
        ))
        .await
        .expect("error kept");
    let listed = webhooks(&["--failed"]);
    assert!(
        listed.contains("the database went away") && !listed.contains("gh-stranger"),
        "{listed}"
    );

    // `webhooks replay` puts it back, its error and attempts cleared; once only.
    let replayed = webhooks(&["replay", &failed.to_string()]);
    assert!(
        replayed.contains("1 failed deliveries put back in the inbox"),
        "{replayed}"
    );
    let row = query(
        &app,
        &format!("SELECT status, attempts, error FROM webhook_deliveries WHERE id = {failed}"),
    )
    .await;
    let status: String = row[0].try_get("", "status").expect("status");
    let error: Option<String> = row[0].try_get("", "error").expect("error");
    assert!(status != "failed" && error.is_none(), "{status} {error:?}");
    let again = webhooks(&["replay", &failed.to_string()]);
    assert!(again.contains("has not failed; left as it is"), "{again}");
    let missing = crate::helpers::tributary(&served.config)
        .args(["webhooks", "replay", "987654"])
        .env("HOOK_GH", GITHUB_SECRET)
        .output()
        .expect("ran");
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("webhook delivery with id 987654"),
        "{missing:?}"
    );
}

/// A GitHub `issues` delivery of issue 1 with `action`, `title` and `updated_at`, sent
/// by alice's GitHub user.
fn github_issue(tag: &str, action: &str, title: &str, updated_at: &str) -> Delivery {
    let issue = json!({"id": 1, "title": title, "updated_at": updated_at});
    let body = json!({"action": action, "issue": issue, "sender": {"id": 4242}});
    github_with(tag, Signing::Good, body)
}

/// The feed's kinds in order.
async fn feed_kinds(app: &TestApp) -> Vec<String> {
    query(app, "SELECT kind FROM changes ORDER BY batch_id, ordinal")
        .await
        .iter()
        .map(|row| row.try_get("", "kind").expect("kind"))
        .collect()
}

#[tokio::test]
async fn an_issue_edited_delivery_updates_the_record_and_the_feed_within_seconds() {
    let app = spawn_app().await;
    let (served, _) = serve_routing(&app).await;
    let applied =
        |tag: &str| format!("SELECT status FROM webhook_deliveries WHERE delivery_id = 'gh-{tag}'");

    let opened = github_issue("opened", "opened", "Bug", "2026-12-05T10:00:00Z");
    let (status, _, answer) = send(&served, &opened, None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    until_text(&app, &applied("opened"), "applied").await;
    let edited = github_issue("edited", "edited", "Bug, clearer", "2026-12-05T10:05:00Z");
    let (status, _, answer) = send(&served, &edited, None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    until_text(&app, &applied("edited"), "applied").await;

    let records = app.records().await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].external_id, "1");
    assert!(records[0].payload.contains("Bug, clearer"), "{records:?}");
    assert_eq!(feed_kinds(&app).await, ["inserted", "updated"]);
    assert!(
        query(&app, "SELECT id FROM sync_jobs").await.is_empty(),
        "stored from the delivery, with no run of the listing"
    );
}

#[tokio::test]
async fn a_daemon_killed_between_accepting_and_applying_a_delivery_applies_it_once_after_restart() {
    use sea_orm::sea_query::Expr;
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
    use tributary::entities::connection;
    use tributary::entities::sync_run::{self, Trigger};

    let app = spawn_app().await;
    let (served, _) = serve_routing(&app).await;
    // Another process's run holds alice's connection, so the delivery waits unapplied.
    let hold = |holder: Option<&str>| {
        connection::Entity::update_many()
            .col_expr(
                connection::Column::LeaseHolder,
                Expr::value(holder.map(str::to_string)),
            )
            .col_expr(
                connection::Column::LeaseExpiresAt,
                Expr::value(holder.map(|_| chrono::Utc::now() + chrono::TimeDelta::hours(1))),
            )
            .filter(connection::Column::UserId.eq("alice"))
            .exec(&app.db)
    };
    hold(Some("another-host:1:00000000")).await.expect("held");
    let opened = github_issue("opened", "opened", "Bug", "2026-12-05T10:00:00Z");
    let (status, _, answer) = send(&served, &opened, None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    // Past a poll or two of the inbox, which finds the connection busy.
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    drop(served); // SIGKILL
    assert!(app.records().await.is_empty());
    hold(None).await.expect("released");

    let (_restarted, _) = serve_routing(&app).await;
    until_text(
        &app,
        "SELECT status FROM webhook_deliveries WHERE delivery_id = 'gh-opened'",
        "applied",
    )
    .await;

    let records = app.records().await;
    assert_eq!(records.len(), 1, "{records:?}");
    let delivery = query(&app, "SELECT attempts FROM webhook_deliveries").await;
    assert_eq!(delivery.len(), 1);
    let attempts: i64 = delivery[0].try_get("", "attempts").expect("attempts");
    assert_eq!(attempts, 1, "a wait for the lease is no failed attempt");
    let inserted: Vec<i64> = sync_run::Entity::find()
        .filter(sync_run::Column::Trigger.eq(Trigger::Webhook))
        .all(&app.db)
        .await
        .expect("runs")
        .iter()
        .map(|run| run.records_inserted)
        .collect();
    assert_eq!(inserted, [1], "one webhook run stored it");
    assert_eq!(feed_kinds(&app).await, ["inserted"]);
}

const SHOP_DOMAIN: &str = "example.myshopify.com";

/// `shop`, Shopify's orders through `preset = "shopify_orders"` against the mock API,
/// for alice, whose shop is [`SHOP_DOMAIN`].
async fn serve_shop(app: &TestApp) -> Served {
    let providers = format!(
        "\n[providers.shop]\npreset = \"shopify_orders\"\nbase_url = \"{}\"\n\
         schedule = \"0 0 0 1 1 *\"\n[providers.shop.webhooks]\nscheme = \"shopify\"\n\
         secret_env = \"HOOK_SHOPIFY\"\n{}",
        app.api.uri(),
        crate::helpers::connections("shop", &["alice"]),
    );
    let served = Served::start_with_env(app, &providers, &ENV, |text| text).await;
    use sea_orm::ConnectionTrait;
    app.db
        .execute_unprepared(&format!(
            "UPDATE connections SET account_id = '{SHOP_DOMAIN}' WHERE user_id = 'alice'"
        ))
        .await
        .expect("alice's shop");
    served
}

/// An order webhook of `topic` as Shopify sends it: the body signed with the app's
/// secret, base64 in `X-Shopify-Hmac-Sha256`, and the shop in `X-Shopify-Shop-Domain`.
fn shopify_order(tag: &str, topic: &'static str, body: Value) -> Delivery {
    let body = body.to_string();
    let id = format!("shop-{tag}");
    Delivery {
        provider: "shop",
        headers: vec![
            header(
                "X-Shopify-Hmac-Sha256",
                base64(&hmac_sha256(SHOPIFY_SECRET.as_bytes(), &[body.as_bytes()])),
            ),
            header("X-Shopify-Webhook-Id", &id),
            header("X-Shopify-Topic", topic),
            header("X-Shopify-Shop-Domain", SHOP_DOMAIN),
            header("X-Shopify-API-Version", "2025-10"),
            header("X-Shopify-Triggered-At", "2026-12-05T15:05:00.000000Z"),
        ],
        body: body.into_bytes(),
        id,
        event_type: Some(topic),
    }
}

#[tokio::test]
async fn shopify_order_webhooks_store_the_order_by_updated_at_and_orders_delete_deletes_it() {
    let app = spawn_app().await;
    let served = serve_shop(&app).await;
    let applied = |tag: &str| {
        format!("SELECT status FROM webhook_deliveries WHERE delivery_id = 'shop-{tag}'")
    };
    let order = |financial_status: &str, updated_at: &str| {
        json!({"id": 450789469_u64, "name": "#1001", "financial_status": financial_status,
               "updated_at": updated_at, "line_items": [{"id": 466157049_u64, "quantity": 1}]})
    };
    let deliveries = [
        (
            "create",
            "orders/create",
            order("pending", "2026-12-05T10:00:00-05:00"),
        ),
        (
            "paid",
            "orders/paid",
            order("paid", "2026-12-05T10:05:00-05:00"),
        ),
        // Delayed: older than what is stored, so it changes nothing.
        (
            "updated",
            "orders/updated",
            order("pending", "2026-12-05T10:01:00-05:00"),
        ),
    ];
    for (tag, topic, body) in deliveries {
        let (status, _, answer) = send(&served, &shopify_order(tag, topic, body), None).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        until_text(&app, &applied(tag), "applied").await;
    }

    let records = app.records().await;
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(
        (
            records[0].external_id.as_str(),
            records[0].provider.as_str()
        ),
        ("450789469", "shop")
    );
    assert!(records[0].payload.contains(r#""financial_status":"paid""#));
    assert_eq!(feed_kinds(&app).await, ["inserted", "updated"]);

    let gone = shopify_order("delete", "orders/delete", json!({"id": 450789469_u64}));
    let (status, _, answer) = send(&served, &gone, None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    until_text(&app, &applied("delete"), "applied").await;

    let records = app.records().await;
    assert!(records[0].deleted_at.is_some(), "{records:?}");
    assert_eq!(feed_kinds(&app).await, ["inserted", "updated", "deleted"]);
    assert!(
        query(&app, "SELECT id FROM sync_jobs").await.is_empty(),
        "stored from the deliveries, with no run of the listing"
    );
}

/// The (kind, stream, status) of every job, and each delivery's (status, whether its
/// job is the first job, its connection's user).
async fn routed(app: &TestApp) -> (Vec<(String, String, String)>, Vec<(String, bool, String)>) {
    let jobs = query(
        app,
        "SELECT id, kind, stream, status FROM sync_jobs ORDER BY id",
    )
    .await;
    let first: Option<i64> = jobs.first().map(|row| row.try_get("", "id").expect("id"));
    let jobs = jobs
        .iter()
        .map(|row| {
            (
                row.try_get("", "kind").expect("kind"),
                row.try_get("", "stream").expect("stream"),
                row.try_get("", "status").expect("status"),
            )
        })
        .collect();
    let deliveries = query(
        app,
        "SELECT d.status, d.job_id, c.user_id FROM webhook_deliveries d \
         JOIN connections c ON c.id = d.connection_id ORDER BY d.id",
    )
    .await
    .iter()
    .map(|row| {
        let job: Option<i64> = row.try_get("", "job_id").expect("job_id");
        (
            row.try_get("", "status").expect("status"),
            job.is_some() && job == first,
            row.try_get("", "user_id").expect("user_id"),
        )
    })
    .collect();
    (jobs, deliveries)
}

fn text(row: (&str, &str, &str)) -> (String, String, String) {
    (row.0.to_string(), row.1.to_string(), row.2.to_string())
}

/// Waits for the one job to end, then asserts it was a webhook run of `stream` alone,
/// done, and that the one delivery was applied by it for alice's connection.
async fn one_webhook_run_applied_for_alice(app: &TestApp, stream: &str) {
    until_text(app, "SELECT status FROM sync_jobs", "done").await;
    let (jobs, deliveries) = routed(app).await;
    assert_eq!(jobs, [text(("webhook", stream, "done"))]);
    assert_eq!(
        deliveries,
        [("applied".to_string(), true, "alice".to_string())]
    );
}

#[tokio::test]
async fn a_gitlab_issue_hook_routed_by_its_project_id_queues_that_connections_webhook_run() {
    let app = spawn_app().await;
    mount_alices_issues(
        &app,
        json!({"data": [{"id": "issue-1", "title": "From the API"}]}),
    )
    .await;
    let providers = format!(
        "\n[providers.lab]\nkind = \"rest\"\nbase_url = \"{}\"\npath = \"/items\"\n\
         records_path = \"data\"\nid_field = \"id\"\nauth = \"bearer\"\nschedule = \"0 0 0 1 1 *\"\n\
         streams = [\"records\", \"issues\"]\n[providers.lab.resources.issues]\npath = \"/issues\"\n\
         records_path = \"data\"\nid_field = \"id\"\n[providers.lab.webhooks]\nscheme = \"gitlab\"\nsecret_env = \"HOOK_GITLAB\"\n{}",
        app.api.uri(),
        crate::helpers::connections("lab", &["alice", "bob"]),
    );
    let served = Served::start_with_env(&app, &providers, &ENV, |text| text).await;
    use sea_orm::ConnectionTrait;
    app.db
        .execute_unprepared("UPDATE connections SET account_id = '15' WHERE user_id = 'alice'")
        .await
        .expect("alice's project id");

    // GitLab's Issue Hook names the project (15) and the user who acted (4).
    let mut delivery = gitlab("routed", Signing::Good);
    delivery.body = json!({
        "object_kind": "issue", "event_type": "issue", "user": {"id": 4},
        "project": {"id": 15}, "object_attributes": {"id": 301, "title": "From the hook"}
    })
    .to_string()
    .into_bytes();
    let (status, _, answer) = send(&served, &delivery, None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    // "Issue Hook" names `issues`: the run is of that stream alone (`/items` is not
    // mocked).
    one_webhook_run_applied_for_alice(&app, "issues").await;
    let records = app.records().await;
    let stored: Vec<(&str, &str)> = records
        .iter()
        .map(|record| (record.provider.as_str(), record.external_id.as_str()))
        .collect();
    assert_eq!(
        stored,
        [("lab.issues", "issue-1")],
        "bob's connection ran nothing"
    );
    assert_eq!(records[0].user_id, "alice");
    assert!(records[0].payload.contains("From the API"));
    app.api.verify().await;
}

#[tokio::test]
async fn a_strava_event_routed_by_owner_id_queues_a_run_that_fetches_from_the_api() {
    let app = spawn_app().await;
    wiremock::Mock::given(wiremock::matchers::method("GET"))
        .and(wiremock::matchers::path("/api/v3/athlete/activities"))
        .and(wiremock::matchers::header(
            "authorization",
            "Bearer token-alice",
        ))
        .and(wiremock::matchers::query_param("page", "1"))
        .respond_with(wiremock::ResponseTemplate::new(200).set_body_json(json!([
            {"id": 1360128428, "name": "From the API", "start_date": "2018-01-16T18:00:00Z"}
        ])))
        .expect(1..)
        .mount(&app.api)
        .await;
    wiremock::Mock::given(wiremock::matchers::method("GET"))
        .and(wiremock::matchers::path("/api/v3/athlete/activities"))
        .and(wiremock::matchers::query_param("page", "2"))
        .respond_with(wiremock::ResponseTemplate::new(200).set_body_json(json!([])))
        .mount(&app.api)
        .await;
    let providers = format!(
        "\n[providers.strava]\nkind = \"strava\"\nbase_url = \"{uri}\"\noauth_url = \"{uri}\"\n\
         client_id = \"4242\"\nclient_secret_env = \"HOOK_STRAVA_CLIENT\"\nschedule = \"0 0 0 1 1 *\"\n\
         [providers.strava.webhooks]\nsecret_env = \"HOOK_STRAVA_VERIFY\"\nsubscription_id = 120475\n{}",
        crate::helpers::connections("strava", &["alice"]),
        uri = app.api.uri(),
    );
    let served = Served::start_with_env(&app, &providers, &STRAVA_ENV, |text| text).await;
    use sea_orm::ConnectionTrait;
    app.db
        .execute_unprepared("UPDATE connections SET account_id = '134815' WHERE user_id = 'alice'")
        .await
        .expect("alice's athlete id");

    let (status, _, answer) = served
        .call(
            Method::POST,
            "/webhooks/strava",
            None,
            Some(("application/json", strava_event(json!({})))),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    one_webhook_run_applied_for_alice(&app, "activities").await;
    let records = app.records().await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].external_id, "1360128428");
    // What the API answered, not the event's `updates`.
    assert!(
        records[0].payload.contains("From the API") && !records[0].payload.contains("Messy"),
        "{}",
        records[0].payload
    );
    app.api.verify().await;
}
