//! The application's rate-limit budget: usage headers, 429 and the waits they cause.

use std::time::{Duration, Instant};

use chrono::TimeDelta;
use serde_json::json;
use wiremock::matchers::query_param;
use wiremock::{MockServer, ResponseTemplate};

use super::*;
use crate::{PagePosition, Provider};

/// An answer with the given overall (and read, when given) limit and usage headers.
fn with_usage(status: u16, overall: (&str, &str), read: Option<(&str, &str)>) -> ResponseTemplate {
    let mut template = ResponseTemplate::new(status)
        .insert_header("x-ratelimit-limit", overall.0)
        .insert_header("x-ratelimit-usage", overall.1);
    if let Some((limit, usage)) = read {
        template = template
            .insert_header("x-readratelimit-limit", limit)
            .insert_header("x-readratelimit-usage", usage);
    }
    if status == 200 {
        template.set_body_json(json!([activity(1, "2024-01-01T00:00:00Z")]))
    } else {
        template.set_body_json(json!({"message": "Rate Limit Exceeded", "errors": [
            {"resource": "Application", "field": "rate limit", "code": "exceeded"}]}))
    }
}

/// A provider whose clock starts at `start` and which waits at most 60 s.
fn provider_at(server: &MockServer, start: &str) -> StravaProvider {
    let settings = HttpSettings {
        max_rate_limit_wait: Duration::from_secs(60),
        ..fast_settings()
    };
    provider_with(server, settings).with_clock(clock_from(at(start)))
}

async fn fetch(provider: &StravaProvider, page: u64) -> Result<crate::Page, FetchError> {
    let store = FakeStore::default();
    let credentials = valid_credentials();
    let position = PagePosition::Page { page };
    let position = (page > 1).then_some(&position);
    provider
        .fetch_page(&context(&credentials, &store), position)
        .await
}

#[tokio::test]
async fn usage_within_the_reserve_waits_for_the_next_window() {
    let server = MockServer::start().await;
    activities()
        .and(query_param("page", "1"))
        .respond_with(with_usage(200, ("600,30000", "596,1200"), None))
        .expect(1)
        .mount(&server)
        .await;
    activities()
        .and(query_param("page", "2"))
        .respond_with(with_usage(200, ("600,30000", "1,1201"), None))
        .expect(1)
        .mount(&server)
        .await;
    // 1.2 s before the 12:15 window starts.
    let provider = provider_at(&server, "2024-03-01T12:14:58.800Z");
    fetch(&provider, 1).await.unwrap();
    let started = Instant::now();
    fetch(&provider, 2).await.unwrap();
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(800), "{waited:?}");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
}

#[tokio::test]
async fn a_window_wait_beyond_max_rate_limit_wait_is_rate_limited_without_a_request() {
    let server = MockServer::start().await;
    // The read budget is the stricter one here: 96 of 100, against 10 of 600 overall.
    activities()
        .and(query_param("page", "1"))
        .respond_with(with_usage(
            200,
            ("600,30000", "10,100"),
            Some(("100,1000", "96,100")),
        ))
        .expect(1)
        .mount(&server)
        .await;
    activities()
        .and(query_param("page", "2"))
        .respond_with(with_usage(200, ("600,30000", "11,101"), None))
        .expect(0)
        .mount(&server)
        .await;
    // Just after 12:15: the next window is almost 15 minutes away.
    let provider = provider_at(&server, "2024-03-01T12:15:01Z");
    fetch(&provider, 1).await.unwrap();
    let started = Instant::now();
    let error = fetch(&provider, 2).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(
        matches!(error, FetchError::RateLimited { retry_after, limit }
            if retry_after > Duration::from_secs(890) && retry_after <= Duration::from_secs(899)
                && limit == Duration::from_secs(60)),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_spent_daily_budget_is_rate_limited_until_midnight_utc() {
    let server = MockServer::start().await;
    activities()
        .and(query_param("page", "1"))
        .respond_with(with_usage(200, ("600,30000", "3,30000"), None))
        .expect(1)
        .mount(&server)
        .await;
    let provider = provider_at(&server, "2024-03-01T22:00:00Z");
    fetch(&provider, 1).await.unwrap();
    let error = fetch(&provider, 2).await.unwrap_err();
    let two_hours = TimeDelta::hours(2).to_std().unwrap();
    assert!(
        matches!(error, FetchError::RateLimited { retry_after, .. }
            if retry_after <= two_hours && retry_after > two_hours - Duration::from_secs(10)),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_429_waits_for_the_next_window_then_retries() {
    let server = MockServer::start().await;
    activities()
        .respond_with(with_usage(429, ("600,30000", "600,1300"), None))
        .up_to_n_times(1)
        .with_priority(1)
        .expect(1)
        .mount(&server)
        .await;
    activities()
        .respond_with(with_usage(200, ("600,30000", "1,1301"), None))
        .expect(1)
        .mount(&server)
        .await;
    let provider = provider_at(&server, "2024-03-01T12:44:58.800Z");
    let started = Instant::now();
    fetch(&provider, 1).await.unwrap();
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(800), "{waited:?}");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
}

#[tokio::test]
async fn a_429_beyond_max_rate_limit_wait_is_rate_limited_at_once() {
    for (usage, start, least) in [
        // The window: just after 12:45, the next starts in almost 15 minutes.
        ("600,1300", "2024-03-01T12:45:01Z", 890),
        // The day: the daily budget is spent, two hours before midnight.
        ("3,30000", "2024-03-01T22:00:00Z", 7190),
    ] {
        let server = MockServer::start().await;
        activities()
            .respond_with(with_usage(429, ("600,30000", usage), None))
            .expect(1)
            .mount(&server)
            .await;
        let provider = provider_at(&server, start);
        let started = Instant::now();
        let error = fetch(&provider, 1).await.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(1));
        assert!(
            matches!(error, FetchError::RateLimited { retry_after, .. }
                if retry_after >= Duration::from_secs(least)),
            "{usage}: {error:?}"
        );
    }
}

#[tokio::test]
async fn the_athlete_request_spends_one_request_of_the_shared_budget() {
    let server = MockServer::start().await;
    // One request short of the reserve (600 less 5): the athlete may go, and then no more.
    activities()
        .and(query_param("page", "1"))
        .respond_with(with_usage(200, ("600,30000", "594,1200"), None))
        .expect(1)
        .mount(&server)
        .await;
    athlete()
        .respond_with(ResponseTemplate::new(200).set_body_json(athlete_body(5)))
        .expect(1)
        .mount(&server)
        .await;
    activities()
        .and(query_param("page", "2"))
        .respond_with(with_usage(200, ("600,30000", "596,1202"), None))
        .expect(0)
        .mount(&server)
        .await;
    // Just after 12:15: the next window is almost 15 minutes away.
    let provider = provider_at(&server, "2024-03-01T12:15:01Z");
    fetch(&provider, 1).await.unwrap();
    let store = FakeStore::default();
    let credentials = valid_credentials();
    let page = provider
        .fetch_page(&athlete_context(&credentials, &store), None)
        .await
        .unwrap();
    assert_eq!(crate::test_support::ids(&page.items), ["5"]);
    let error = fetch(&provider, 2).await.unwrap_err();
    assert!(matches!(error, FetchError::RateLimited { .. }), "{error:?}");
}

#[tokio::test]
async fn the_athletes_usage_headers_hold_back_the_next_request() {
    let server = MockServer::start().await;
    athlete()
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("x-ratelimit-limit", "600,30000")
                .insert_header("x-ratelimit-usage", "10,100")
                .insert_header("x-readratelimit-limit", "100,1000")
                .insert_header("x-readratelimit-usage", "95,100")
                .set_body_json(athlete_body(5)),
        )
        .expect(1)
        .mount(&server)
        .await;
    activities()
        .respond_with(with_usage(200, ("600,30000", "11,101"), None))
        .expect(0)
        .mount(&server)
        .await;
    let provider = provider_at(&server, "2024-03-01T12:15:01Z");
    let store = FakeStore::default();
    let credentials = valid_credentials();
    let athlete = athlete_context(&credentials, &store);
    provider.fetch_page(&athlete, None).await.unwrap();
    for error in [
        provider.fetch_page(&athlete, None).await.unwrap_err(),
        fetch(&provider, 1).await.unwrap_err(),
    ] {
        assert!(matches!(error, FetchError::RateLimited { .. }), "{error:?}");
    }
}

proptest::proptest! {
    #![proptest_config(crate::test_support::proptest_config(512, 0x7573_6167))]

    /// Whatever the usage headers and `Retry-After` say, at whatever time, the wait before a
    /// request or after a 429 is at most a day.
    #[test]
    fn usage_headers_of_any_value_give_a_wait_of_at_most_a_day(
        values in proptest::collection::vec(crate::test_support::header_text(), 5),
        reserve in proptest::prelude::any::<u32>(),
        start in DateTime::<Utc>::MIN_UTC.timestamp()..=DateTime::<Utc>::MAX_UTC.timestamp(),
    ) {
        use crate::http::{Answer, ResponsePolicy, Verdict, MAX_ASKED_WAIT};
        use crate::strava::limits::RateLimits;
        let day = Duration::from_secs(24 * 60 * 60);
        let start = DateTime::from_timestamp(start, 0).unwrap_or(DateTime::<Utc>::MAX_UTC);
        let limits = RateLimits::new(reserve, clock_from(start));
        let headers = crate::test_support::header_map(&[
            ("x-ratelimit-limit", &values[0]),
            ("x-ratelimit-usage", &values[1]),
            ("x-readratelimit-limit", &values[2]),
            ("x-readratelimit-usage", &values[3]),
            ("retry-after", &values[4]),
        ]);
        limits.record(&headers);
        let before = limits.reserve_request().map(|wait| wait.duration());
        proptest::prop_assert!(before.is_none_or(|wait| wait <= day), "{headers:?}: {before:?}");
        let answer = Answer {
            url: "https://www.strava.com/api/v3/athlete/activities",
            status: reqwest::StatusCode::TOO_MANY_REQUESTS,
            headers: &headers,
            body: b"{}",
            attempt: 1,
        };
        let default = Verdict::Fail(FetchError::Status {
            url: answer.url.to_string(),
            status: 429,
            attempts: 1,
            message: String::new(),
        });
        match limits.classify(&answer, default) {
            Verdict::Retry { wait: Some(wait), .. } => {
                proptest::prop_assert!(wait <= day.max(MAX_ASKED_WAIT), "{headers:?}: {wait:?}");
            }
            other => proptest::prop_assert!(false, "a 429 is retried after a wait: {other:?}"),
        }
    }
}
