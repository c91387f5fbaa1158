//! Listing activities (pages, `after`, watermarks and Strava's error bodies) and reading
//! the athlete.

use serde_json::json;
use wiremock::matchers::{header, query_param, query_param_is_missing};
use wiremock::{MockServer, ResponseTemplate};

use super::*;
use crate::test_support::ids;
use crate::{PagePosition, Provider, ProviderKind, Watermark};

#[tokio::test]
async fn lists_activities_page_by_page_until_an_empty_page() {
    let server = MockServer::start().await;
    let pages = [
        vec![
            activity(1, "2024-01-01T07:00:00Z"),
            activity(2, "2024-01-03T07:00:00Z"),
        ],
        vec![activity(3, "2024-01-02T07:00:00Z")],
        vec![],
    ];
    for (number, body) in pages.iter().enumerate() {
        activities()
            .and(query_param("page", (number + 1).to_string().as_str()))
            .and(query_param_is_missing("after"))
            .and(header(
                "authorization",
                format!("Bearer {OLD_TOKEN}").as_str(),
            ))
            .respond_with(ResponseTemplate::new(200).set_body_json(body))
            .expect(1)
            .mount(&server)
            .await;
    }
    let provider = provider(&server);
    let store = FakeStore::default();
    let credentials = valid_credentials();
    let context = context(&credentials, &store);

    let first = provider.fetch_page(&context, None).await.unwrap();
    assert_eq!(ids(&first.items), ["1", "2"]);
    assert_eq!(first.next, Some(PagePosition::Page { page: 2 }));
    assert_eq!(
        first.watermark,
        Some(Watermark::Time(at("2024-01-03T07:00:00Z")))
    );
    let second = provider
        .fetch_page(&context, first.next.as_ref())
        .await
        .unwrap();
    assert_eq!(ids(&second.items), ["3"]);
    let third = provider
        .fetch_page(&context, second.next.as_ref())
        .await
        .unwrap();
    assert!(third.items.is_empty());
    assert_eq!((third.next, third.watermark), (None, None));
    assert!(store.asked.lock().unwrap().is_empty());
}

#[tokio::test]
async fn after_is_the_watermark_minus_one_second() {
    let server = MockServer::start().await;
    let since = at("2024-01-02T03:04:05Z");
    activities()
        .and(query_param("page", "1"))
        .and(query_param(
            "after",
            (since.timestamp() - 1).to_string().as_str(),
        ))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([])))
        .expect(1)
        .mount(&server)
        .await;
    let store = FakeStore::default();
    let credentials = valid_credentials();
    let watermark = Watermark::Time(since);
    let context = FetchContext {
        since: Some(&watermark),
        ..context(&credentials, &store)
    };
    let page = provider(&server).fetch_page(&context, None).await.unwrap();
    assert_eq!(page.next, None);
}

#[tokio::test]
async fn api_errors_surface_stravas_message_and_wrong_positions_are_refused() {
    let server = MockServer::start().await;
    activities()
        .respond_with(ResponseTemplate::new(400).set_body_json(json!({
            "message": "Bad Request",
            "errors": [{"resource": "Application", "field": "per_page", "code": "invalid"}]
        })))
        .expect(1)
        .mount(&server)
        .await;
    let provider = provider(&server);
    let store = FakeStore::default();
    let credentials = valid_credentials();
    let error = provider
        .fetch_page(&context(&credentials, &store), None)
        .await
        .unwrap_err();
    assert!(
        matches!(&error, FetchError::Status { status: 400, message, .. }
            if message == "Bad Request (Application per_page invalid)"),
        "{error:?}"
    );
    let cursor = PagePosition::Cursor { cursor: "x".into() };
    let error = provider
        .fetch_page(&context(&credentials, &store), Some(&cursor))
        .await
        .unwrap_err();
    assert!(
        matches!(error, FetchError::PositionMismatch { .. }),
        "{error:?}"
    );
}

#[tokio::test]
async fn the_athlete_is_one_record_keyed_by_its_id() {
    let server = MockServer::start().await;
    athlete()
        .and(header(
            "authorization",
            format!("Bearer {OLD_TOKEN}").as_str(),
        ))
        .respond_with(ResponseTemplate::new(200).set_body_json(athlete_body(227615)))
        .expect(1)
        .mount(&server)
        .await;
    let store = FakeStore::default();
    let credentials = valid_credentials();
    let page = provider(&server)
        .fetch_page(&athlete_context(&credentials, &store), None)
        .await
        .unwrap();
    assert_eq!(ids(&page.items), ["227615"]);
    assert_eq!((page.next, page.watermark), (None, None));
    assert!(store.asked.lock().unwrap().is_empty());
}

#[tokio::test]
async fn an_athlete_body_that_is_not_an_object_is_a_shape_error() {
    let server = MockServer::start().await;
    athlete()
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([athlete_body(1)])))
        .expect(1)
        .mount(&server)
        .await;
    let store = FakeStore::default();
    let credentials = valid_credentials();
    let error = provider(&server)
        .fetch_page(&athlete_context(&credentials, &store), None)
        .await
        .unwrap_err();
    assert!(
        matches!(&error, FetchError::Shape { message, .. }
            if message == "the body is an array, expected the athlete as an object"),
        "{error:?}"
    );
}

#[tokio::test]
async fn unknown_streams_and_a_second_athlete_page_are_refused_without_a_request() {
    let server = MockServer::start().await;
    let provider = provider(&server);
    let store = FakeStore::default();
    let credentials = valid_credentials();
    let error = provider
        .fetch_page(
            &FetchContext {
                stream: "segments",
                ..context(&credentials, &store)
            },
            None,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&error, FetchError::Client { message } if message == "strava has no stream \"segments\""),
        "{error:?}"
    );
    let second = PagePosition::Page { page: 2 };
    let error = provider
        .fetch_page(&athlete_context(&credentials, &store), Some(&second))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, FetchError::PositionMismatch { message }
            if message == "cannot fetch the page at page 2: Strava's athlete stream is a single page"),
        "{error:?}"
    );
    assert!(server.received_requests().await.unwrap().is_empty());
}

#[test]
fn streams_are_activities_first_then_the_athlete() {
    let config = StravaConfig::new(CLIENT_ID, "STRAVA_CLIENT_SECRET");
    let streams: Vec<(String, Option<String>)> = config
        .streams()
        .into_iter()
        .map(|stream| (stream.name, stream.parent))
        .collect();
    assert_eq!(
        streams,
        [
            ("activities".to_string(), None),
            ("athlete".to_string(), None)
        ]
    );
}
