//! Which failures are retried, how long the client waits, and what it reports.

use super::*;

#[tokio::test]
async fn retries_503_twice_then_succeeds() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/items"))
        .respond_with(ResponseTemplate::new(503).insert_header("Retry-After", "0"))
        .up_to_n_times(2)
        .with_priority(1)
        .expect(2)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/items"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": [1, 2]})))
        .expect(1)
        .mount(&server)
        .await;
    let response = get(&client(fast()), url(&server, "/items")).await.unwrap();
    assert_eq!(response.status, 200);
    assert_eq!(response.value(), json!({"data": [1, 2]}));
    assert_eq!(response.url, url(&server, "/items"));
}

#[tokio::test]
async fn gives_up_on_500_after_max_retries_plus_one_attempts() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(500).set_body_string("database on fire"))
        .expect(4)
        .mount(&server)
        .await;
    let error = get(&client(fast()), url(&server, "/items"))
        .await
        .unwrap_err();
    match &error {
        FetchError::Status {
            status,
            attempts,
            message,
            ..
        } => {
            assert_eq!((*status, *attempts), (500, 4));
            assert_eq!(message, "database on fire");
        }
        other => panic!("expected Status, got {other:?}"),
    }
    assert!(error
        .to_string()
        .contains("answered HTTP 500 after 4 attempts: database on fire"));
}

#[tokio::test]
async fn unauthorized_is_not_retried() {
    for status in [401u16, 403] {
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .respond_with(ResponseTemplate::new(status).set_body_string("x".repeat(1000)))
            .expect(1)
            .mount(&server)
            .await;
        let error = get(&client(fast()), url(&server, "/items"))
            .await
            .unwrap_err();
        match &error {
            FetchError::Unauthorized {
                status: got,
                message,
            } => {
                assert_eq!(*got, status);
                assert_eq!(message.chars().count(), MAX_MESSAGE_EXCERPT_CHARS + 1);
            }
            other => panic!("expected Unauthorized, got {other:?}"),
        }
        assert!(error
            .to_string()
            .starts_with(&format!("credentials were rejected (HTTP {status}): xxx")));
    }
}

#[tokio::test]
async fn other_4xx_fail_at_once() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(404).set_body_string("no such list"))
        .expect(1)
        .mount(&server)
        .await;
    let error = get(&client(fast()), url(&server, "/items"))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, FetchError::Status { status: 404, attempts: 1, message, .. } if message == "no such list"),
        "{error:?}"
    );
}

#[tokio::test]
async fn waits_retry_after_seconds_on_429() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(429).insert_header("Retry-After", "1"))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([])))
        .mount(&server)
        .await;
    let started = Instant::now();
    let response = get(&client(fast()), url(&server, "/items")).await.unwrap();
    assert_eq!(response.value(), json!([]));
    assert!(
        started.elapsed() >= Duration::from_millis(950),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn waits_retry_after_http_date() {
    let server = MockServer::start().await;
    let at = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(2));
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(429).insert_header("Retry-After", at.as_str()))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"ok": true})))
        .mount(&server)
        .await;
    let started = Instant::now();
    let response = get(&client(fast()), url(&server, "/items")).await.unwrap();
    assert_eq!(response.value(), json!({"ok": true}));
    // The date has whole seconds, so the wait is between 1 and 2 seconds.
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(900), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(4), "{elapsed:?}");
}

#[tokio::test]
async fn retry_after_beyond_max_rate_limit_wait_fails_at_once() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(429).insert_header("Retry-After", "600"))
        .expect(1)
        .mount(&server)
        .await;
    let started = Instant::now();
    let error = get(&client(fast()), url(&server, "/items"))
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(
        matches!(error, FetchError::RateLimited { retry_after, limit }
            if retry_after == Duration::from_secs(600) && limit == Duration::from_secs(300)),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "rate limited: the API asked to wait 600s, longer than max_rate_limit_wait (300s)"
    );
}

#[tokio::test]
async fn rate_limit_without_retry_after_uses_the_backoff() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(429))
        .expect(4)
        .mount(&server)
        .await;
    let started = Instant::now();
    let error = get(&client(fast()), url(&server, "/items"))
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(
        matches!(
            error,
            FetchError::Status {
                status: 429,
                attempts: 4,
                ..
            }
        ),
        "{error:?}"
    );
}

#[tokio::test]
async fn invalid_json_is_retried_then_kept_for_the_report() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(200).set_body_string("<html>oops</html>"))
        .expect(4)
        .mount(&server)
        .await;
    let error = get(&client(fast()), url(&server, "/items"))
        .await
        .unwrap_err();
    assert!(
        matches!(error, FetchError::InvalidJson { attempts: 4, .. }),
        "{error:?}"
    );
    assert_eq!(error.body(), Some("<html>oops</html>"));
    assert_eq!(error.stage(), crate::RecordStage::Parse);
    assert!(error
        .to_string()
        .contains("is not valid JSON after 4 attempts"));
}

#[tokio::test]
async fn timeouts_are_retried_then_reported() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(200).set_delay(Duration::from_secs(2)))
        .expect(2)
        .mount(&server)
        .await;
    let settings = HttpSettings {
        timeout: Duration::from_millis(150),
        max_retries: 1,
        ..fast()
    };
    let error = get(&client(settings), url(&server, "/items"))
        .await
        .unwrap_err();
    match &error {
        FetchError::Transport {
            attempts, message, ..
        } => {
            assert_eq!(*attempts, 2);
            assert!(message.contains("timed out"), "{message}");
        }
        other => panic!("expected Transport, got {other:?}"),
    }
}

#[tokio::test]
async fn connection_refused_is_a_transport_error_with_its_cause() {
    let address = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let url = Url::parse(&format!("http://user:hunter22@{address}/items")).unwrap();
    let error = get(&client(fast()), url).await.unwrap_err();
    match &error {
        FetchError::Transport {
            attempts,
            url,
            message,
        } => {
            assert_eq!(*attempts, 4);
            assert_eq!(url, &format!("http://{address}/items"));
            assert!(message.to_lowercase().contains("connect"), "{message}");
        }
        other => panic!("expected Transport, got {other:?}"),
    }
    assert!(!format!("{error} {error:?}").contains("hunter22"));
}

#[test]
fn retry_after_reads_seconds_and_http_dates() {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let header = |value: &str| {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, HeaderValue::from_str(value).unwrap());
        headers
    };
    assert_eq!(
        retry_after(&header("120"), now),
        Some(Duration::from_secs(120))
    );
    assert_eq!(
        retry_after(&header(" 7 "), now),
        Some(Duration::from_secs(7))
    );
    let later = httpdate::fmt_http_date(now + Duration::from_secs(90));
    assert_eq!(
        retry_after(&header(&later), now),
        Some(Duration::from_secs(90))
    );
    let earlier = httpdate::fmt_http_date(now - Duration::from_secs(90));
    assert_eq!(retry_after(&header(&earlier), now), Some(Duration::ZERO));
    assert_eq!(retry_after(&header("soon"), now), None);
    assert_eq!(retry_after(&HeaderMap::new(), now), None);
}

async fn post(client: &HttpClient, url: Url) -> Result<JsonResponse, FetchError> {
    client
        .post_form_with(
            url,
            HeaderMap::new(),
            &[("grant_type", "refresh_token")],
            &DefaultPolicy,
        )
        .await
}

#[tokio::test]
async fn a_post_is_retried_only_when_it_never_reached_the_server() {
    // Refused: nothing was sent, so it is tried again like any request.
    let address = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let refused = Url::parse(&format!("http://{address}/token")).unwrap();
    match post(&client(fast()), refused).await.unwrap_err() {
        FetchError::Transport { attempts, .. } => assert_eq!(attempts, 4),
        other => panic!("expected Transport, got {other:?}"),
    }
    // Answered 503, or cut short after the request was written: the server may have acted
    // on it, so it is not sent again.
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(503).insert_header("Retry-After", "0"))
        .expect(1)
        .mount(&server)
        .await;
    match post(&client(fast()), url(&server, "/token"))
        .await
        .unwrap_err()
    {
        FetchError::Status { attempts, .. } => assert_eq!(attempts, 1),
        other => panic!("expected Status, got {other:?}"),
    }
    let (cut, served) = raw_server(vec![
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"
            .to_vec();
        4
    ]);
    assert!(post(&client(fast()), cut).await.is_err());
    assert_eq!(served.load(Ordering::SeqCst), 1);
}
