//! Redirects and the client settings.

use super::*;

#[tokio::test]
async fn redirects_are_followed_only_within_the_origin() {
    let other = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([])))
        .expect(0)
        .mount(&other)
        .await;
    let server = MockServer::start().await;
    Mock::given(path("/old"))
        .respond_with(ResponseTemplate::new(301).insert_header("Location", "/items"))
        .mount(&server)
        .await;
    Mock::given(path("/items"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([1])))
        .mount(&server)
        .await;
    Mock::given(path("/away"))
        .respond_with(
            ResponseTemplate::new(302).insert_header("Location", format!("{}/x", other.uri())),
        )
        .expect(1)
        .mount(&server)
        .await;
    let client = client(fast());
    let response = get(&client, url(&server, "/old")).await.unwrap();
    assert_eq!(response.url, url(&server, "/items"));
    let error = get(&client, url(&server, "/away")).await.unwrap_err();
    assert!(
        matches!(error, FetchError::Status { status: 302, .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains("was not followed"), "{error}");

    Mock::given(path("/loop"))
        .respond_with(ResponseTemplate::new(302).insert_header("Location", "/loop"))
        .mount(&server)
        .await;
    let error = get(&client, url(&server, "/loop")).await.unwrap_err();
    assert!(
        matches!(&error, FetchError::Transport { attempts: 1, message, .. } if message.contains("redirects")),
        "{error:?}"
    );
}

#[test]
fn settings_parse_humantime_with_defaults_and_reject_unknown_keys() {
    let settings: HttpSettings = serde_json::from_value(
        json!({"timeout": "5s", "max_retries": 2, "max_rate_limit_wait": "1m"}),
    )
    .unwrap();
    assert_eq!(settings.timeout, Duration::from_secs(5));
    assert_eq!(settings.max_retries, 2);
    assert_eq!(settings.max_rate_limit_wait, Duration::from_secs(60));
    assert_eq!(
        settings.connect_timeout,
        HttpSettings::default().connect_timeout
    );
    assert!(HttpSettings::default().user_agent.starts_with("tributary/"));
    let error = serde_json::from_value::<HttpSettings>(json!({"timeot": "5s"})).unwrap_err();
    assert!(error.to_string().contains("timeot"), "{error}");
}

#[test]
fn invalid_settings_are_rejected_naming_the_key() {
    let cases = [
        (
            HttpSettings {
                timeout: Duration::ZERO,
                ..HttpSettings::default()
            },
            "http.timeout",
        ),
        (
            HttpSettings {
                retry_initial_delay: Duration::from_secs(60),
                ..HttpSettings::default()
            },
            "http.retry_initial_delay",
        ),
        (
            HttpSettings {
                max_body_bytes: 0,
                ..HttpSettings::default()
            },
            "http.max_body_bytes",
        ),
        (
            HttpSettings {
                user_agent: "a\nb".into(),
                ..HttpSettings::default()
            },
            "http.user_agent",
        ),
    ];
    for (settings, key) in cases {
        match HttpClient::new(settings) {
            Err(FetchError::Client { message }) => assert!(message.contains(key), "{message}"),
            other => panic!("expected a Client error naming {key}, got {other:?}"),
        }
    }
}
