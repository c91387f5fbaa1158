//! Response policies and form posts.

use std::sync::Mutex;

use wiremock::matchers::{body_string, header};

use super::*;

/// Retries 409, fails 500 at once with the body's `message`, asks for a long wait on 418,
/// and notes the status of every answer.
#[derive(Default)]
struct Recording {
    seen: Mutex<Vec<u16>>,
}

impl ResponsePolicy for Recording {
    fn observe(&self, status: reqwest::StatusCode, _headers: &HeaderMap) {
        self.seen.lock().unwrap().push(status.as_u16());
    }

    fn classify(&self, answer: &Answer<'_>, default: Verdict) -> Verdict {
        let message = answer
            .json()
            .and_then(|body| body["message"].as_str().map(str::to_string))
            .unwrap_or_else(|| answer.excerpt());
        match answer.status.as_u16() {
            409 => default.retry(None).with_message(message),
            418 => default.retry(Some(Duration::from_secs(3600))),
            _ => default.fail().with_message(message),
        }
    }
}

#[tokio::test]
async fn a_policy_can_retry_what_the_client_would_not_and_sees_every_answer() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(409).set_body_json(json!({"message": "busy"})))
        .up_to_n_times(1)
        .with_priority(1)
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("x-usage", "7")
                .set_body_json(json!([])),
        )
        .expect(1)
        .mount(&server)
        .await;
    let policy = Recording::default();
    let response = client(fast())
        .get_json_with(url(&server, "/items"), HeaderMap::new(), &policy)
        .await
        .unwrap();
    assert_eq!(response.headers["x-usage"], "7");
    assert_eq!(*policy.seen.lock().unwrap(), [409, 200]);
}

#[tokio::test]
async fn a_policy_can_stop_retries_and_surface_the_error_body() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(
            ResponseTemplate::new(500).set_body_json(json!({"message": "do not try again"})),
        )
        .expect(1)
        .mount(&server)
        .await;
    let error = client(fast())
        .get_json_with(
            url(&server, "/items"),
            HeaderMap::new(),
            &Recording::default(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&error, FetchError::Status { status: 500, attempts: 1, message, .. }
            if message == "do not try again"),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_policy_wait_beyond_max_rate_limit_wait_is_rate_limited_at_once() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(418))
        .expect(1)
        .mount(&server)
        .await;
    let started = Instant::now();
    let error = client(fast())
        .get_json_with(
            url(&server, "/items"),
            HeaderMap::new(),
            &Recording::default(),
        )
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(
        matches!(error, FetchError::RateLimited { retry_after, .. }
            if retry_after == Duration::from_secs(3600)),
        "{error:?}"
    );
}

#[tokio::test]
async fn forms_are_posted_url_encoded_and_4xx_is_not_retried() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/token"))
        .and(header("content-type", "application/x-www-form-urlencoded"))
        .and(body_string("a=1&b=x+y%26z"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"ok": true})))
        .expect(1)
        .mount(&server)
        .await;
    let client = client(fast());
    let form = [("a", "1"), ("b", "x y&z")];
    let response = client
        .post_form_with(
            url(&server, "/token"),
            HeaderMap::new(),
            &form,
            &DefaultPolicy,
        )
        .await
        .unwrap();
    assert_eq!(response.value(), json!({"ok": true}));

    Mock::given(method("POST"))
        .and(path("/bad"))
        .respond_with(ResponseTemplate::new(400).set_body_string("invalid grant"))
        .expect(1)
        .mount(&server)
        .await;
    let error = client
        .post_form_with(
            url(&server, "/bad"),
            HeaderMap::new(),
            &form,
            &DefaultPolicy,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            &error,
            FetchError::Status {
                status: 400,
                attempts: 1,
                ..
            }
        ),
        "{error:?}"
    );
}
