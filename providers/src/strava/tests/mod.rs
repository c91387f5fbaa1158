//! The strava adapter against wiremock emulations of Strava's activities, athlete and
//! token endpoints as Strava documents them.

mod fetch;
mod limits;
mod oauth;

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use secrecy::SecretString;
use serde_json::{json, Value};
use wiremock::matchers::{method, path, query_param};
use wiremock::{Mock, MockServer};

use super::limits::Clock;
use super::{StravaConfig, StravaProvider};
use crate::http::{HttpClient, HttpSettings};
use crate::test_support::fast_settings;
use crate::{CredentialStore, Credentials, FetchContext, FetchError, TokenRefresher};

const CLIENT_ID: &str = "4242";
const CLIENT_SECRET: &str = "cs-f00dfeed0123456789";
const OLD_TOKEN: &str = "at-old-0123456789";
const OLD_REFRESH: &str = "rt-old-0123456789";
const NEW_TOKEN: &str = "at-new-9876543210";
const NEW_REFRESH: &str = "rt-new-9876543210";

fn config(server: &MockServer) -> StravaConfig {
    let config = StravaConfig {
        base_url: server.uri().parse().unwrap(),
        oauth_url: server.uri().parse().unwrap(),
        ..StravaConfig::new(CLIENT_ID, "STRAVA_CLIENT_SECRET")
    };
    config.validate().unwrap();
    config
}

fn provider_with(server: &MockServer, settings: HttpSettings) -> StravaProvider {
    StravaProvider::new(
        config(server),
        HttpClient::new(settings).unwrap(),
        SecretString::from(CLIENT_SECRET),
    )
    .unwrap()
}

fn provider(server: &MockServer) -> StravaProvider {
    provider_with(server, fast_settings())
}

/// A clock that reads `start` now and runs on in real time from there.
fn clock_from(start: DateTime<Utc>) -> Clock {
    let offset = start - Utc::now();
    Arc::new(move || Utc::now() + offset)
}

fn at(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text).unwrap().into()
}

fn now() -> i64 {
    Utc::now().timestamp()
}

fn credentials(token: &str, refresh_token: Option<&str>, expires_at: Option<i64>) -> Credentials {
    Credentials {
        token: Some(SecretString::from(token)),
        refresh_token: refresh_token.map(SecretString::from),
        expires_at,
    }
}

/// The old pair, valid for another hour.
fn valid_credentials() -> Credentials {
    credentials(OLD_TOKEN, Some(OLD_REFRESH), Some(now() + 3600))
}

fn context<'a>(credentials: &'a Credentials, store: &'a FakeStore) -> FetchContext<'a> {
    FetchContext {
        stream: "activities",
        parent: None,
        credentials,
        since: None,
        credential_store: store,
        base_url: None,
    }
}

/// A page of the athlete stream.
fn athlete_context<'a>(credentials: &'a Credentials, store: &'a FakeStore) -> FetchContext<'a> {
    FetchContext {
        stream: "athlete",
        ..context(credentials, store)
    }
}

/// The authenticated athlete as `GET /api/v3/athlete` answers it.
fn athlete_body(id: u64) -> Value {
    json!({"id": id, "username": "marianne_t", "resource_state": 3, "firstname": "Marianne",
        "lastname": "Teutenberg", "city": "San Francisco", "country": "US", "sex": "F",
        "premium": true, "summit": true, "created_at": "2017-11-14T02:30:05Z",
        "updated_at": "2018-02-06T19:32:20Z", "follower_count": 5, "friend_count": 5,
        "measurement_preference": "feet", "ftp": null, "weight": 0,
        "clubs": [], "bikes": [], "shoes": []})
}

/// A `GET /api/v3/athlete` mock: the endpoint takes no parameter.
fn athlete() -> wiremock::MockBuilder {
    Mock::given(method("GET"))
        .and(path("/api/v3/athlete"))
        .and(NoQuery)
}

/// Matches a request whose URL has no query string.
struct NoQuery;

impl wiremock::Match for NoQuery {
    fn matches(&self, request: &wiremock::Request) -> bool {
        request.url.query().is_none()
    }
}

fn activity(id: u64, start_date: &str) -> Value {
    json!({"id": id, "name": format!("Run {id}"), "type": "Run", "start_date": start_date})
}

/// A `GET /api/v3/athlete/activities` mock with the documented parameters.
fn activities() -> wiremock::MockBuilder {
    Mock::given(method("GET"))
        .and(path("/api/v3/athlete/activities"))
        .and(query_param("per_page", "200"))
}

/// A `CredentialStore` that refreshes with the given refresher and notes what it was asked
/// and what it handed back.
#[derive(Default)]
struct FakeStore {
    asked: Mutex<Vec<Credentials>>,
    gave: Mutex<Vec<Credentials>>,
}

#[async_trait::async_trait]
impl CredentialStore for FakeStore {
    async fn refresh(
        &self,
        stale: &Credentials,
        refresher: std::sync::Arc<dyn TokenRefresher>,
    ) -> Result<Credentials, FetchError> {
        self.asked.lock().unwrap().push(stale.clone());
        let fresh = refresher.refresh(stale).await?;
        self.gave.lock().unwrap().push(fresh.clone());
        Ok(fresh)
    }
}

/// Asserts that no secret of the test shows in `text`.
fn assert_no_secret(text: &str) {
    for secret in [
        CLIENT_SECRET,
        OLD_TOKEN,
        OLD_REFRESH,
        NEW_TOKEN,
        NEW_REFRESH,
    ] {
        assert!(!text.contains(secret), "{secret} shows in {text}");
    }
}
