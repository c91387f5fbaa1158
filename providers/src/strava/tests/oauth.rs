//! OAuth2: refreshing before expiry and after a 401, through the credential store.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::json;
use wiremock::matchers::header;
use wiremock::{Match, MockServer, Request, ResponseTemplate};

use super::*;
use crate::test_support::ids;
use crate::{build_provider, Provider, ProviderConfig};

/// Matches a url-encoded form body holding exactly these fields.
struct FormIs(BTreeMap<String, String>);

impl Match for FormIs {
    fn matches(&self, request: &Request) -> bool {
        let got: BTreeMap<String, String> = url::form_urlencoded::parse(&request.body)
            .into_owned()
            .collect();
        got == self.0
    }
}

/// The token endpoint, expecting the documented refresh form for `refresh_token`.
fn token_endpoint(refresh_token: &str) -> wiremock::MockBuilder {
    let form = [
        ("client_id", CLIENT_ID),
        ("client_secret", CLIENT_SECRET),
        ("grant_type", "refresh_token"),
        ("refresh_token", refresh_token),
    ]
    .iter()
    .map(|(name, value)| (name.to_string(), value.to_string()))
    .collect();
    Mock::given(method("POST"))
        .and(path("/oauth/token"))
        .and(header("content-type", "application/x-www-form-urlencoded"))
        .and(FormIs(form))
}

fn fresh_tokens(expires_at: i64) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({
        "token_type": "Bearer",
        "access_token": NEW_TOKEN,
        "expires_at": expires_at,
        "expires_in": 21600,
        "refresh_token": NEW_REFRESH,
    }))
}

fn authorization_error() -> ResponseTemplate {
    ResponseTemplate::new(401).set_body_json(json!({
        "message": "Authorization Error",
        "errors": [{"resource": "Athlete", "field": "access_token", "code": "invalid"}]
    }))
}

fn with_token(token: &str) -> wiremock::MockBuilder {
    activities().and(header("authorization", format!("Bearer {token}").as_str()))
}

#[tokio::test]
async fn an_expiring_token_is_refreshed_through_the_store_before_the_request() {
    let server = MockServer::start().await;
    let expires_at = now() + 21600;
    token_endpoint(OLD_REFRESH)
        .respond_with(fresh_tokens(expires_at))
        .expect(1)
        .mount(&server)
        .await;
    with_token(NEW_TOKEN)
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!([activity(7, "2024-01-01T00:00:00Z")])),
        )
        .expect(1)
        .mount(&server)
        .await;
    with_token(OLD_TOKEN)
        .respond_with(authorization_error())
        .expect(0)
        .mount(&server)
        .await;
    let store = FakeStore::default();
    // Expires in 30 s: within the minute's margin.
    let stale = credentials(OLD_TOKEN, Some(OLD_REFRESH), Some(now() + 30));
    let page = provider(&server)
        .fetch_page(&context(&stale, &store), None)
        .await
        .unwrap();
    assert_eq!(ids(&page.items), ["7"]);
    let asked = store.asked.lock().unwrap();
    assert_eq!(asked.len(), 1);
    assert!(asked[0].same_as(&stale));
    let gave = store.gave.lock().unwrap();
    let expected = credentials(NEW_TOKEN, Some(NEW_REFRESH), Some(expires_at));
    assert!(gave[0].same_as(&expected), "{:?}", gave[0]);
}

#[tokio::test]
async fn an_unknown_expiry_is_refreshed_first_and_expires_in_is_used_when_expires_at_is_missing() {
    let server = MockServer::start().await;
    token_endpoint(OLD_REFRESH)
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "token_type": "Bearer", "access_token": NEW_TOKEN, "expires_in": 600,
            "refresh_token": NEW_REFRESH,
        })))
        .expect(1)
        .mount(&server)
        .await;
    with_token(NEW_TOKEN)
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([])))
        .expect(1)
        .mount(&server)
        .await;
    let store = FakeStore::default();
    let stale = credentials(OLD_TOKEN, Some(OLD_REFRESH), None);
    provider(&server)
        .fetch_page(&context(&stale, &store), None)
        .await
        .unwrap();
    let expires_at = store.gave.lock().unwrap()[0].expires_at.unwrap();
    assert!((expires_at - (now() + 600)).abs() <= 2, "{expires_at}");
}

#[tokio::test]
async fn an_answer_without_an_expiry_keeps_its_rotated_refresh_token() {
    let server = MockServer::start().await;
    token_endpoint(OLD_REFRESH)
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "token_type": "Bearer", "access_token": NEW_TOKEN, "refresh_token": NEW_REFRESH,
        })))
        .expect(1)
        .mount(&server)
        .await;
    with_token(NEW_TOKEN)
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([])))
        .expect(1)
        .mount(&server)
        .await;
    let store = FakeStore::default();
    let stale = credentials(OLD_TOKEN, Some(OLD_REFRESH), None);
    provider(&server)
        .fetch_page(&context(&stale, &store), None)
        .await
        .unwrap();
    let gave = store.gave.lock().unwrap();
    let expires_at = gave[0].expires_at.unwrap();
    assert!((expires_at - (now() + 3600)).abs() <= 2, "{expires_at}");
    let expected = credentials(NEW_TOKEN, Some(NEW_REFRESH), Some(expires_at));
    assert!(gave[0].same_as(&expected), "{:?}", gave[0]);
}

#[tokio::test]
async fn a_401_refreshes_once_and_retries_with_the_new_token() {
    let server = MockServer::start().await;
    with_token(OLD_TOKEN)
        .respond_with(authorization_error())
        .expect(1)
        .mount(&server)
        .await;
    token_endpoint(OLD_REFRESH)
        .respond_with(fresh_tokens(now() + 21600))
        .expect(1)
        .mount(&server)
        .await;
    with_token(NEW_TOKEN)
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!([activity(8, "2024-01-01T00:00:00Z")])),
        )
        .expect(1)
        .mount(&server)
        .await;
    let store = FakeStore::default();
    let stale = valid_credentials();
    let page = provider(&server)
        .fetch_page(&context(&stale, &store), None)
        .await
        .unwrap();
    assert_eq!(ids(&page.items), ["8"]);
    let asked = store.asked.lock().unwrap();
    assert_eq!(asked.len(), 1);
    assert!(asked[0].same_as(&stale));
}

#[tokio::test]
async fn a_second_401_is_unauthorized_with_stravas_message_and_no_secret() {
    let server = MockServer::start().await;
    activities()
        .respond_with(authorization_error())
        .expect(2)
        .mount(&server)
        .await;
    token_endpoint(OLD_REFRESH)
        .respond_with(fresh_tokens(now() + 21600))
        .expect(1)
        .mount(&server)
        .await;
    let store = FakeStore::default();
    let provider = provider(&server);
    let error = provider
        .fetch_page(&context(&valid_credentials(), &store), None)
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "credentials were rejected (HTTP 401): Authorization Error (Athlete access_token invalid)"
    );
    assert_no_secret(&format!("{error} {error:?} {provider:?}"));
}

#[tokio::test]
async fn without_a_refresh_token_a_401_is_unauthorized_at_once() {
    let server = MockServer::start().await;
    activities()
        .respond_with(authorization_error())
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(path("/oauth/token"))
        .respond_with(fresh_tokens(now() + 21600))
        .expect(0)
        .mount(&server)
        .await;
    let store = FakeStore::default();
    let only_token = credentials(OLD_TOKEN, None, Some(now() - 10));
    let error = provider(&server)
        .fetch_page(&context(&only_token, &store), None)
        .await
        .unwrap_err();
    assert!(
        matches!(error, FetchError::Unauthorized { status: 401, .. }),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_refused_refresh_is_unauthorized_not_retried_and_never_shows_a_secret() {
    let server = MockServer::start().await;
    token_endpoint(OLD_REFRESH)
        .respond_with(ResponseTemplate::new(400).set_body_json(json!({
            "message": format!("Bad Request: {OLD_REFRESH} for client {CLIENT_SECRET}"),
            "errors": [{"resource": "RefreshToken", "field": "refresh_token", "code": "invalid"}]
        })))
        .expect(1)
        .mount(&server)
        .await;
    activities()
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([])))
        .expect(0)
        .mount(&server)
        .await;
    let store = FakeStore::default();
    let stale = credentials(OLD_TOKEN, Some(OLD_REFRESH), Some(now() - 10));
    let provider = provider(&server);
    let error = provider
        .fetch_page(&context(&stale, &store), None)
        .await
        .unwrap_err();
    assert!(
        matches!(error, FetchError::Unauthorized { status: 400, .. }),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "credentials were rejected (HTTP 400): the Strava token endpoint refused the refresh: \
         Bad Request: [redacted] for client [redacted] (RefreshToken refresh_token invalid)"
    );
    assert_no_secret(&format!("{error} {error:?} {provider:?} {stale:?}"));
}

#[tokio::test]
async fn a_token_answer_without_an_access_token_is_a_shape_error_without_the_tokens() {
    let server = MockServer::start().await;
    token_endpoint(OLD_REFRESH)
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "refresh_token": NEW_REFRESH, "expires_at": now() + 600,
        })))
        .expect(1)
        .mount(&server)
        .await;
    let store = FakeStore::default();
    let stale = credentials(OLD_TOKEN, Some(OLD_REFRESH), Some(now() - 10));
    let error = provider(&server)
        .fetch_page(&context(&stale, &store), None)
        .await
        .unwrap_err();
    assert_no_secret(&format!("{error} {error:?} {:?}", error.body()));
    // The answer rotated the refresh token: the store is handed it to keep.
    let FetchError::RefusedWithRotation { error, kept } = error else {
        panic!("the rotated refresh token is not handed on: {error:?}");
    };
    assert_eq!(
        kept.refresh_token
            .as_ref()
            .map(secrecy::ExposeSecret::expose_secret),
        Some(NEW_REFRESH)
    );
    assert!(matches!(*error, FetchError::Shape { .. }), "{error:?}");
    assert!(error.to_string().contains("has no access_token"), "{error}");
}

#[test]
fn build_provider_reads_the_client_secret_from_the_named_variable() {
    let parse = |text: &str| {
        let table: toml::Table = toml::from_str(text).unwrap();
        ProviderConfig::deserialize(table).unwrap()
    };
    let unset = "TRIBUTARY_TEST_UNSET_STRAVA_SECRET_7F3A";
    let config = parse(&format!(
        "kind = \"strava\"\nclient_id = \"4242\"\nclient_secret_env = \"{unset}\""
    ));
    config.validate().unwrap();
    assert_eq!(
        config.required_env_vars(),
        [("client_secret_env".to_string(), unset.to_string())]
    );
    let error = build_provider(&config, &HttpSettings::default())
        .err()
        .unwrap();
    assert!(
        matches!(&error, FetchError::Client { message } if message.contains(unset)
            && message.contains("client_secret_env")),
        "{error:?}"
    );
    // Cargo sets CARGO_PKG_NAME for the tests it runs.
    let config =
        parse("kind = \"strava\"\nclient_id = \"4242\"\nclient_secret_env = \"CARGO_PKG_NAME\"");
    assert!(build_provider(&config, &HttpSettings::default()).is_ok());
}

#[test]
fn config_defaults_and_what_validation_refuses() {
    let table: toml::Table =
        toml::from_str("kind = \"strava\"\nclient_id = \"4242\"\nclient_secret_env = \"S\"")
            .unwrap();
    let config = ProviderConfig::deserialize(table).unwrap();
    config.validate().unwrap();
    assert_eq!(config.kind(), "strava");
    assert!(config.needs_token());
    let ProviderConfig::Strava(strava) = config else {
        panic!("expected a strava config, got {config:?}");
    };
    assert_eq!(strava, StravaConfig::new("4242", "S"));
    assert_eq!(strava.base_url.as_str(), "https://www.strava.com/");
    assert_eq!(strava.oauth_url.as_str(), "https://www.strava.com/");
    assert_eq!((strava.per_page, strava.rate_limit_reserve), (200, 5));

    // The two required keys, with `key` set to `value`.
    let with = |key: &str, value: toml::Value| {
        let mut table = toml::Table::new();
        table.insert("client_id".into(), "4242".into());
        table.insert("client_secret_env".into(), "S".into());
        table.insert(key.into(), value);
        ProviderConfig::deserialize_kind("strava", table)
    };
    let hex_secret = "0123456789abcdef0123456789abcdef01234567";
    let cases: [(&str, toml::Value, &str); 6] = [
        ("per_page", 0.into(), "per_page must be between 1 and 200"),
        ("per_page", 201.into(), "per_page must be between 1 and 200"),
        (
            "oauth_url",
            "ftp://x".into(),
            "oauth_url must be an http or https URL",
        ),
        ("client_id", " ".into(), "client_id must not be empty"),
        (
            "client_secret_env",
            "".into(),
            "client_secret_env must be the name",
        ),
        (
            "client_secret_env",
            hex_secret.into(),
            "looks like a client secret itself",
        ),
    ];
    for (key, value, expected) in cases {
        let error = with(key, value).unwrap().validate().unwrap_err();
        assert!(error.contains(expected), "{key}: {error}");
        assert!(!error.contains(hex_secret), "{error}");
    }
    let error = with("per_pge", 10.into()).unwrap_err().to_string();
    assert!(error.contains("unknown field `per_pge`"), "{error}");
    let table: toml::Table = toml::from_str("client_id = \"4242\"").unwrap();
    let error = ProviderConfig::deserialize_kind("strava", table)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("missing field `client_secret_env`"),
        "{error}"
    );
}

proptest::proptest! {
    #![proptest_config(crate::test_support::proptest_config(1024, 0x6578_7069))]

    /// `expires_at` and `expires_in` of any value give an expiry between now and ten years
    /// from now, at any time chrono can hold.
    #[test]
    fn any_expiry_from_the_token_endpoint_is_kept_within_ten_years(
        expires_at in proptest::option::of(proptest::prelude::any::<i64>()),
        expires_in in proptest::option::of(proptest::prelude::any::<i64>()),
        now in DateTime::<Utc>::MIN_UTC.timestamp()..=DateTime::<Utc>::MAX_UTC.timestamp(),
    ) {
        let now = DateTime::from_timestamp(now, 0).unwrap_or(DateTime::<Utc>::MAX_UTC);
        let expiry = crate::strava::oauth::expiry(expires_at, expires_in, now);
        match expiry {
            None => proptest::prop_assert!(expires_at.is_none() && expires_in.is_none()),
            Some(at) => proptest::prop_assert!(
                now.timestamp() <= at
                    && at <= now.timestamp().saturating_add(10 * 365 * 24 * 60 * 60),
                "{expires_at:?} {expires_in:?} at {now}: {at}"
            ),
        }
    }
}

#[test]
fn expiry_seconds_are_read_in_any_numeric_form() {
    use crate::strava::oauth::seconds;
    assert_eq!(seconds(&json!(21600)), Some(21600));
    assert_eq!(seconds(&json!(21600.9)), Some(21600));
    assert_eq!(seconds(&json!(u64::MAX)), Some(i64::MAX));
    assert_eq!(seconds(&json!(-1e300)), Some(i64::MIN));
    assert_eq!(seconds(&json!(" 1767225600 ")), Some(1_767_225_600));
    assert_eq!(seconds(&json!("soon")), None);
    assert_eq!(seconds(&json!(null)), None);
}

#[tokio::test]
async fn the_athlete_stream_refreshes_once_after_a_401_through_the_same_store() {
    let server = MockServer::start().await;
    athlete()
        .and(header(
            "authorization",
            format!("Bearer {OLD_TOKEN}").as_str(),
        ))
        .respond_with(authorization_error())
        .expect(1)
        .mount(&server)
        .await;
    token_endpoint(OLD_REFRESH)
        .respond_with(fresh_tokens(now() + 21600))
        .expect(1)
        .mount(&server)
        .await;
    athlete()
        .and(header(
            "authorization",
            format!("Bearer {NEW_TOKEN}").as_str(),
        ))
        .respond_with(ResponseTemplate::new(200).set_body_json(athlete_body(8)))
        .expect(1)
        .mount(&server)
        .await;
    let store = FakeStore::default();
    let credentials = valid_credentials();
    let page = provider(&server)
        .fetch_page(&athlete_context(&credentials, &store), None)
        .await
        .unwrap();
    assert_eq!(ids(&page.items), ["8"]);
    let asked = store.asked.lock().unwrap();
    assert_eq!(asked.len(), 1);
    assert!(asked[0].same_as(&credentials));
}
