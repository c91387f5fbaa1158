//! The body size cap and bodies cut short.

use super::*;

#[tokio::test]
async fn content_length_over_the_cap_is_too_large() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": "x".repeat(500)})))
        .expect(1)
        .mount(&server)
        .await;
    let settings = HttpSettings {
        max_body_bytes: 100,
        ..fast()
    };
    let error = get(&client(settings), url(&server, "/items"))
        .await
        .unwrap_err();
    assert!(
        matches!(error, FetchError::BodyTooLarge { limit: 100, .. }),
        "{error:?}"
    );
}

#[tokio::test]
async fn streamed_body_over_the_cap_is_too_large() {
    let mut response =
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".to_vec();
    for _ in 0..10 {
        response.extend_from_slice(format!("40\r\n{}\r\n", "x".repeat(64)).as_bytes());
    }
    response.extend_from_slice(b"0\r\n\r\n");
    let (url, served) = raw_server(vec![response.clone(), response]);
    let settings = HttpSettings {
        max_body_bytes: 100,
        ..fast()
    };
    let error = get(&client(settings), url).await.unwrap_err();
    assert!(
        matches!(error, FetchError::BodyTooLarge { limit: 100, .. }),
        "{error:?}"
    );
    assert_eq!(served.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn truncated_body_is_retried() {
    let truncated =
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nConnection: close\r\n\r\n{\"data\":".to_vec();
    let (url, served) = raw_server(vec![truncated, ok_json(r#"{"data":[]}"#)]);
    let response = get(&client(fast()), url).await.unwrap();
    assert_eq!(response.value(), json!({"data": []}));
    assert_eq!(served.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn numbers_are_read_exactly_as_sent() {
    // Without serde_json's exact float parsing, the first of these comes back one unit in
    // the last place off, and the stored payload would differ from what the API sent.
    let text = r#"{"a":5.2090790811725105e+197,"b":0.1,"c":-1.7976931348623157e+308,"d":5e-324}"#;
    let (url, _) = raw_server(vec![ok_json(text)]);
    let response = get(&client(fast()), url).await.unwrap();
    assert_eq!(response.body.to_string(), text);
}
