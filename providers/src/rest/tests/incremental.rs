//! `incremental`: the cursor sent in each format, the page's watermark, newest-first
//! listings that end at the first older record, and the settings validation refuses.

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{json, Value};
use wiremock::matchers::{method, path, query_param};
use wiremock::{Mock, MockServer, ResponseTemplate};

use super::{credentials, ids, invalid_rest, provider, queries, RestProvider};
use crate::{
    FetchContext, NoCredentialStore, Page, PagePosition, Provider, ProviderConfig, Watermark,
};

/// The stream's cursor the incremental runs of these tests start from.
const CURSOR: &str = "2024-05-06T07:08:09Z";

fn time(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text)
        .unwrap()
        .with_timezone(&Utc)
}

/// One page fetched from `position` with the stream's cursor `since` (`None`: a full pass).
async fn fetch(
    provider: &RestProvider,
    since: Option<&Watermark>,
    position: Option<&PagePosition>,
) -> Page {
    let credentials = credentials();
    let context = FetchContext {
        stream: "records",
        parent: None,
        credentials: &credentials,
        since,
        credential_store: &NoCredentialStore,
        base_url: None,
    };
    provider.fetch_page(&context, position).await.unwrap()
}

/// Serves `body` at `/v1/items` whatever the query.
async fn serve(server: &MockServer, body: Value) {
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .respond_with(ResponseTemplate::new(200).set_body_json(body))
        .mount(server)
        .await;
}

#[tokio::test]
async fn the_first_run_sends_start_and_the_next_the_cursor_in_each_format() {
    let server = MockServer::start().await;
    serve(&server, json!({"data": [{"id": 1}]})).await;
    let cases = [
        (
            "rfc3339",
            "since=2024-01-01T00%3A00%3A00Z",
            "since=2024-05-06T07%3A08%3A09Z",
        ),
        ("epoch", "since=1704067200", "since=1714979289"),
        ("epoch_ms", "since=1704067200000", "since=1714979289000"),
        ("date", "since=2024-01-01", "since=2024-05-06"),
        (
            "%Y%m%dT%H%M%S",
            "since=20240101T000000",
            "since=20240506T070809",
        ),
    ];
    let cursor = Watermark::Time(time(CURSOR));
    for (format, first, second) in cases {
        server.reset().await;
        serve(&server, json!({"data": [{"id": 1}]})).await;
        let provider = provider(
            &server,
            json!({"incremental": {"cursor_field": "updated_at", "param": "since",
                                   "format": format, "start": "2024-01-01T00:00:00Z"}}),
        );
        fetch(&provider, None, None).await;
        fetch(&provider, Some(&cursor), None).await;
        assert_eq!(queries(&server).await, [first, second], "{format}");
    }
}

#[tokio::test]
async fn a_full_pass_without_start_sends_no_param_and_an_epoch_cursor_is_read_as_a_time() {
    let server = MockServer::start().await;
    serve(&server, json!({"data": []})).await;
    let provider = provider(
        &server,
        json!({"query": {"team": "core"},
               "incremental": {"cursor_field": "updated_at", "param": "since"}}),
    );
    fetch(&provider, None, None).await;
    fetch(&provider, Some(&Watermark::Epoch(1714979289)), None).await;
    assert_eq!(
        queries(&server).await,
        ["team=core", "team=core&since=2024-05-06T07%3A08%3A09Z"]
    );
}

#[tokio::test]
async fn exclusive_cursors_add_the_formats_unit_and_lookback_is_subtracted() {
    let server = MockServer::start().await;
    let cursor = Watermark::Time(time("2024-05-06T07:08:09.250Z"));
    let cases = [
        (
            json!({"format": "rfc3339", "inclusive": true}),
            "2024-05-06T07%3A08%3A09Z",
        ),
        (
            json!({"format": "rfc3339", "inclusive": false}),
            "2024-05-06T07%3A08%3A10Z",
        ),
        (json!({"format": "epoch", "inclusive": false}), "1714979290"),
        (
            json!({"format": "epoch_ms", "inclusive": false}),
            "1714979289251",
        ),
        (json!({"format": "date", "inclusive": false}), "2024-05-07"),
        (
            json!({"format": "%Y-%m-%d %H:%M", "inclusive": false}),
            "2024-05-06+07%3A09",
        ),
        (
            json!({"format": "rfc3339", "lookback": "5m"}),
            "2024-05-06T07%3A03%3A09Z",
        ),
        (
            json!({"format": "epoch", "lookback": "1h", "inclusive": false}),
            "1714975690",
        ),
    ];
    for (settings, expected) in cases {
        server.reset().await;
        serve(&server, json!({"data": []})).await;
        let mut incremental = json!({"cursor_field": "updated_at", "param": "since"});
        if let (Some(base), Value::Object(settings)) = (incremental.as_object_mut(), &settings) {
            base.extend(settings.clone());
        }
        let provider = provider(&server, json!({"incremental": incremental}));
        fetch(&provider, Some(&cursor), None).await;
        assert_eq!(
            queries(&server).await,
            [format!("since={expected}")],
            "{settings}"
        );
    }
}

#[tokio::test]
async fn the_watermark_is_the_newest_cursor_field_and_far_future_values_count_as_ahead() {
    let server = MockServer::start().await;
    serve(
        &server,
        json!({"data": [
            {"id": "a", "meta": {"updated": "2024-05-01T00:00:00Z"}},
            {"id": "b", "meta": {"updated": "2024-05-03T10:00:00+02:00"}},
            {"id": "c", "meta": {"updated": null}},
            {"id": "d"},
            {"id": "e", "meta": {"updated": "2024-05-02T00:00:00Z"}},
        ]}),
    )
    .await;
    let nested = provider(
        &server,
        json!({"incremental": {"cursor_field": "meta.updated", "param": "since"}}),
    );
    let page = fetch(&nested, None, None).await;
    assert_eq!(ids(&page.items), ["a", "b", "c", "d", "e"]);
    assert_eq!(
        page.watermark,
        Some(Watermark::Time(time("2024-05-03T08:00:00Z")))
    );
    assert_eq!(page.watermarks_ahead, 0);

    server.reset().await;
    serve(
        &server,
        json!({"data": [
            {"id": 1, "ts": 1714979289},
            {"id": 2, "ts": "253402300799"},
            {"id": 3, "ts": 9223372036854775807_i64},
            {"id": 4, "ts": "yesterday"},
        ]}),
    )
    .await;
    let epoch = provider(
        &server,
        json!({"incremental": {"cursor_field": "ts", "param": "since", "format": "epoch"}}),
    );
    let page = fetch(&epoch, None, None).await;
    assert_eq!(
        ids(&page.items),
        [
            "1",
            "2",
            "3",
            "!incremental.cursor_field `ts` holds \"\\\"yesterday\\\"\", which is not an epoch \
             time in seconds: the string is not an integer: invalid digit found in string"
        ]
    );
    assert_eq!(page.watermark, Some(Watermark::Epoch(i64::MAX)));
    assert_eq!(page.watermarks_ahead, 2);
}

#[tokio::test]
async fn stop_when_older_ends_the_listing_at_exactly_the_first_older_record() {
    let server = MockServer::start().await;
    let page_one = json!({"data": [
        {"id": "n1", "updated_at": "2024-05-06T09:00:00Z"},
        {"id": "n2", "updated_at": "2024-05-06T07:08:09Z"},
        {"id": "n3"},
        {"id": "o1", "updated_at": "2024-05-06T07:08:08Z"},
        {"id": "n4", "updated_at": "2024-05-06T09:30:00Z"},
    ], "next": "c2"});
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .respond_with(ResponseTemplate::new(200).set_body_json(page_one))
        .mount(&server)
        .await;
    Mock::given(query_param("cursor", "c2"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": []})))
        .expect(0)
        .named("the page after the first older record")
        .mount(&server)
        .await;
    let newest_first = provider(
        &server,
        json!({"pagination": {"type": "cursor", "cursor_path": "next", "cursor_param": "cursor"},
               "incremental": {"cursor_field": "updated_at", "stop_when_older": true}}),
    );
    let page = fetch(&newest_first, Some(&Watermark::Time(time(CURSOR))), None).await;
    assert_eq!(ids(&page.items), ["n1", "n2", "n3"]);
    assert_eq!((page.next, page.stop_after), (None, None));
    assert_eq!(
        page.watermark,
        Some(Watermark::Time(time("2024-05-06T09:00:00Z")))
    );
    // Without `param`, nothing is sent; a lookback moves the bound back.
    assert_eq!(queries(&server).await, [""]);

    let with_lookback = provider(
        &server,
        json!({"pagination": {"type": "cursor", "cursor_path": "next", "cursor_param": "cursor"},
               "incremental": {"cursor_field": "updated_at", "stop_when_older": true,
                               "lookback": "1s"}}),
    );
    let page = fetch(&with_lookback, Some(&Watermark::Time(time(CURSOR))), None).await;
    assert_eq!(ids(&page.items), ["n1", "n2", "n3", "o1", "n4"]);
    assert_eq!(
        page.next,
        Some(PagePosition::Cursor {
            cursor: "c2".into()
        })
    );

    // A full pass reads every record and goes on.
    let page = fetch(&newest_first, None, None).await;
    assert_eq!(ids(&page.items).len(), 5);
    assert_eq!(
        page.next,
        Some(PagePosition::Cursor {
            cursor: "c2".into()
        })
    );
}

#[test]
fn the_documented_incremental_table_works_as_written() {
    let text = r#"
        [providers.acme]
        kind = "rest"
        base_url = "https://api.acme.example"
        path = "/v1/items"
        incremental = { cursor_field = "updated_at", param = "updated_since", format = "rfc3339", inclusive = true, lookback = "5m", start = "2024-01-01T00:00:00Z", stop_when_older = false }
        [providers.acme.pagination]
        type = "next_url"
        next_url_path = '"@odata.nextLink"'
    "#;
    let document: toml::Table = toml::from_str(text).unwrap();
    let config = ProviderConfig::deserialize(document["providers"]["acme"].clone()).unwrap();
    config.validate().unwrap();
    let ProviderConfig::Rest(rest) = config else {
        panic!("expected a rest config, got {config:?}");
    };
    let incremental = rest.incremental.unwrap();
    assert_eq!(incremental.lookback.as_deref(), Some("5m"));
    assert_eq!(
        rest.pagination.next_url_path.as_deref(),
        Some("\"@odata.nextLink\"")
    );
    let filter = incremental.plan().unwrap().for_run(None).unwrap();
    assert_eq!(
        filter.param,
        Some(("updated_since".into(), "2024-01-01T00:00:00Z".into()))
    );
}

#[test]
fn bad_incremental_settings_are_refused_naming_the_key() {
    let cases = [
        (
            json!({"cursor_field": "t", "param": "since", "format": "%Y-%m-%Q"}),
            "incremental.format \"%Y-%m-%Q\" is not a valid strftime pattern",
        ),
        (
            json!({"cursor_field": "t", "param": "since", "format": "iso"}),
            "incremental.format \"iso\" is not \"rfc3339\"",
        ),
        (
            json!({"cursor_field": "t", "param": "since", "format": "%H:%M"}),
            "incremental.format \"%H:%M\" cannot be used as a cursor",
        ),
        (
            json!({"cursor_field": "t", "param": "since", "lookback": "five minutes"}),
            "incremental.lookback \"five minutes\" is not a duration",
        ),
        (
            json!({"cursor_field": "t", "param": "since", "lookback": "31days"}),
            "incremental.lookback must be between 0s and 30days, got 1month",
        ),
        (
            json!({"cursor_field": "t", "param": "since", "start": "2024-01-01"}),
            "incremental.start \"2024-01-01\" is not an RFC 3339 time",
        ),
        (
            json!({"cursor_field": "t", "stop_when_older": true, "start": "2024-01-01T00:00:00Z"}),
            "incremental.start is sent as incremental.param, which is not set",
        ),
        (json!({"cursor_field": "t"}), "incremental needs param"),
        (
            json!({"cursor_field": "a..b", "param": "since"}),
            "incremental.cursor_field `a..b` has an empty segment",
        ),
        (
            json!({"cursor_field": "t", "param": " "}),
            "incremental.param must not be empty",
        ),
    ];
    for (incremental, expected) in cases {
        let message = invalid_rest(json!({"incremental": incremental.clone()}));
        assert!(message.contains(expected), "{incremental}: {message}");
    }
    let message = invalid_rest(json!({
        "query": {"since": "x"},
        "incremental": {"cursor_field": "t", "param": "since"},
    }));
    assert_eq!(
        message,
        "incremental.param \"since\" is also query.since; a request cannot carry both"
    );
    let message = invalid_rest(json!({
        "auth": {"query": "since"},
        "incremental": {"cursor_field": "t", "param": "since"},
    }));
    assert!(message.contains("is also auth.query"), "{message}");
    let error = super::provider_config(json!({
        "kind": "rest", "base_url": "http://h",
        "incremental": {"cursor_field": "t", "param": "since", "lookbak": "5m"},
    }))
    .unwrap_err();
    assert!(
        error.to_string().contains("unknown field `lookbak`"),
        "{error}"
    );
}
