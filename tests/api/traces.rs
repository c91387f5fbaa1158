//! `[telemetry]`: traces exported over OTLP HTTP/protobuf to a collector in the test, which
//! decodes them with the OpenTelemetry proto definitions.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::HeaderMap;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::{
    status::StatusCode as SpanStatus, ResourceSpans, Span,
};
use prost::Message;
use reqwest::{Method, StatusCode};
use serde_json::json;
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::daemon::eventually;
use crate::helpers::{cursor_provider, items, run, spawn_app, tributary, TestApp};
use crate::http::{query, Served};

/// The collector's header secret: sent with every export, never part of a span.
const COLLECTOR_KEY: &str = "collector-key-5f1e9a";
const COLLECTOR_KEY_ENV: &str = "TRIBUTARY_TEST_OTLP_KEY";

/// A collector: every POST to /v1/traces, body and headers.
#[derive(Clone, Default)]
struct Collector {
    exports: Arc<Mutex<Vec<(HeaderMap, Bytes)>>>,
}

impl Collector {
    /// Serves on a free port; returns the collector and its base URL.
    async fn start() -> (Collector, String) {
        let collector = Collector::default();
        let exports = collector.exports.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |headers: HeaderMap, body: Bytes| {
                let exports = exports.clone();
                async move {
                    exports.lock().unwrap().push((headers, body));
                    StatusCode::OK
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (collector, base)
    }

    /// Every export received so far, decoded: its resources with their spans.
    fn resource_spans(&self) -> Vec<ResourceSpans> {
        let exports = self.exports.lock().unwrap();
        exports
            .iter()
            .flat_map(|(_, body)| {
                ExportTraceServiceRequest::decode(body.clone())
                    .expect("an OTLP protobuf body")
                    .resource_spans
            })
            .collect()
    }

    /// Every span received so far, decoded.
    fn spans(&self) -> Vec<Span> {
        self.resource_spans()
            .into_iter()
            .flat_map(|resource| resource.scope_spans)
            .flat_map(|scope| scope.spans)
            .collect()
    }

    /// All bytes received, as lossy text, to search for secrets.
    fn raw(&self) -> String {
        let exports = self.exports.lock().unwrap();
        exports
            .iter()
            .map(|(_, body)| String::from_utf8_lossy(body).into_owned())
            .collect()
    }

    /// The `service.name` of every exported resource.
    fn service_names(&self) -> Vec<String> {
        self.resource_spans()
            .into_iter()
            .filter_map(|spans| spans.resource)
            .filter_map(|resource| {
                resource
                    .attributes
                    .into_iter()
                    .find(|kv| kv.key == "service.name")
                    .and_then(|kv| kv.value)
                    .and_then(|value| value.value)
            })
            .map(|value| match value {
                Value::StringValue(name) => name,
                other => format!("{other:?}"),
            })
            .collect()
    }

    fn headers(&self) -> Vec<HeaderMap> {
        let exports = self.exports.lock().unwrap();
        exports.iter().map(|(headers, _)| headers.clone()).collect()
    }
}

/// `[telemetry]` for `collector`, its key read from [`COLLECTOR_KEY_ENV`].
fn telemetry_table(collector: &str) -> String {
    format!(
        "\n[telemetry]\nendpoint = \"{collector}\"\nservice_name = \"tributary-test\"\nheaders = {{ \"x-collector-key\" = \"{COLLECTOR_KEY_ENV}\" }}\n"
    )
}

fn attribute<'s>(span: &'s Span, key: &str) -> Option<&'s Value> {
    span.attributes
        .iter()
        .find(|KeyValue { key: k, .. }| k == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|value| value.value.as_ref())
}

fn int(span: &Span, key: &str) -> Option<i64> {
    match attribute(span, key) {
        Some(Value::IntValue(value)) => Some(*value),
        _ => None,
    }
}

fn text(span: &Span, key: &str) -> Option<String> {
    match attribute(span, key) {
        Some(Value::StringValue(value)) => Some(value.clone()),
        _ => None,
    }
}

fn named<'s>(spans: &'s [Span], name: &str) -> Vec<&'s Span> {
    spans.iter().filter(|span| span.name == name).collect()
}

fn children<'s>(spans: &'s [Span], parent: &Span) -> Vec<&'s Span> {
    spans
        .iter()
        .filter(|span| span.parent_span_id == parent.span_id && span.trace_id == parent.trace_id)
        .collect()
}

fn is_error(span: &Span) -> bool {
    span.status
        .as_ref()
        .is_some_and(|status| status.code == SpanStatus::Error as i32)
}

/// The listing: a 429 first, then one page with two good records and one without an id.
async fn mount_listing(app: &TestApp) {
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .respond_with(ResponseTemplate::new(429).insert_header("retry-after", "1"))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&app.api)
        .await;
    let mut data = items("c", "alice", 0..2);
    data.push(json!({"no_id": "poison"}));
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .and(header("authorization", "Bearer token-alice"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({"data": data, "next_cursor": null})),
        )
        .with_priority(2)
        .mount(&app.api)
        .await;
}

/// `tributary sync` of alice's listing with `table` and `env`, off the test's thread (the
/// collector answers on it meanwhile); the process's exit code and stdout.
async fn sync_alice(app: &TestApp, table: &str, env: &[(&str, &str)]) -> (i32, String) {
    let providers = cursor_provider("acme", &app.api.uri(), &["alice"]);
    let config = app.write_config(&format!("{table}\n{providers}"));
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect();
    let sync = tokio::task::spawn_blocking(move || {
        let mut command = tributary(&config);
        command.args(["sync", "--quiet"]).envs(env);
        run(&mut command)
    })
    .await
    .unwrap();
    (sync.code, format!("{}\n{}", sync.stdout, sync.stderr))
}

/// `tributary sync` of alice's listing ([`mount_listing`]) with `[telemetry]` and `extra`
/// keys in it; the collector, once the process has exited.
async fn sync_traced(app: &TestApp, extra: &str) -> Collector {
    mount_listing(app).await;
    let (collector, base) = Collector::start().await;
    let table = format!("{}{extra}", telemetry_table(&base));
    let (code, output) = sync_alice(app, &table, &[(COLLECTOR_KEY_ENV, COLLECTOR_KEY)]).await;
    assert_eq!(code, 0, "{output}");
    assert!(output.contains("alice@acme partial"), "{output}");
    collector
}

#[tokio::test]
async fn the_user_id_is_exported_only_when_the_config_allows() {
    let app = spawn_app().await;
    let collector = sync_traced(&app, "include_user_id = true").await;
    let spans = collector.spans();
    let runs = named(&spans, "run");
    assert_eq!(runs.len(), 1, "{spans:#?}");
    assert_eq!(text(runs[0], "user_id").as_deref(), Some("alice"));
}

#[tokio::test]
async fn a_runs_trace_reaches_the_collector_with_its_span_tree_its_retry_and_its_failed_record() {
    let app = spawn_app().await;
    let collector = sync_traced(&app, "").await;
    let spans = collector.spans();
    let runs = named(&spans, "run");
    assert_eq!(runs.len(), 1, "{spans:#?}");
    let run_span = runs[0];
    assert_eq!(text(run_span, "provider").as_deref(), Some("acme"));
    assert_eq!(text(run_span, "stream").as_deref(), Some("records"));
    assert_eq!(text(run_span, "trigger").as_deref(), Some("manual"));
    assert_eq!(text(run_span, "outcome").as_deref(), Some("partial"));
    assert_eq!(int(run_span, "inserted"), Some(2));
    assert_eq!(int(run_span, "failed"), Some(1));
    assert!(int(run_span, "connection_id").is_some(), "{run_span:#?}");
    assert!(
        attribute(run_span, "user_id").is_none(),
        "the user id is exported only when include_user_id allows"
    );

    let pages = children(&spans, run_span);
    let pages: Vec<&Span> = pages
        .into_iter()
        .filter(|span| span.name == "page")
        .collect();
    assert_eq!(pages.len(), 1, "{spans:#?}");
    let page = pages[0];
    assert_eq!(int(page, "records"), Some(3));
    assert!(
        int(page, "bytes").is_some_and(|bytes| bytes > 0),
        "{page:#?}"
    );
    assert_eq!(int(page, "failed"), Some(1));
    assert_eq!(text(page, "outcome").as_deref(), Some("stored"));

    let page_children = children(&spans, page);
    let requests: Vec<&&Span> = page_children
        .iter()
        .filter(|span| span.name == "GET")
        .collect();
    assert_eq!(requests.len(), 1, "{page_children:#?}");
    let request = requests[0];
    assert_eq!(text(request, "http.request.method").as_deref(), Some("GET"));
    assert_eq!(int(request, "http.response.status_code"), Some(200));
    assert_eq!(int(request, "http.request.resend_count"), Some(1));
    assert!(
        int(request, "tributary.rate_limit_wait_ms").is_some_and(|ms| ms >= 1000),
        "{request:#?}"
    );
    let url = text(request, "url.full").expect("url.full");
    assert!(
        url.starts_with(&app.api.uri()) && url.contains("/v1/items"),
        "{url}"
    );
    assert!(
        request
            .events
            .iter()
            .any(|event| event.name == "Request failed, retrying."),
        "the retry is an event of the request's span: {request:#?}"
    );

    // The record without an id: its error on the page's transaction span.
    let transactions: Vec<&&Span> = page_children
        .iter()
        .filter(|span| span.name == "store.transaction")
        .collect();
    assert!(!transactions.is_empty(), "{page_children:#?}");
    let set_aside = transactions
        .iter()
        .flat_map(|span| span.events.iter())
        .find(|event| event.name == "Record set aside.")
        .expect("the failed record's event");
    let error = set_aside
        .attributes
        .iter()
        .find(|kv| kv.key == "error")
        .and_then(|kv| kv.value.as_ref())
        .and_then(|value| value.value.as_ref());
    assert!(
        matches!(error, Some(Value::StringValue(message)) if !message.is_empty()),
        "{set_aside:#?}"
    );

    assert!(
        collector.headers().iter().all(|headers| headers
            .get("x-collector-key")
            .is_some_and(|v| v == COLLECTOR_KEY)),
        "every export carries the configured header"
    );
    let services = collector.service_names();
    assert!(
        !services.is_empty() && services.iter().all(|name| name == "tributary-test"),
        "the configured service_name is the resource's service.name: {services:?}"
    );
    let raw = collector.raw();
    for secret in ["token-alice", COLLECTOR_KEY, "alice"] {
        assert!(!raw.contains(secret), "{secret:?} was exported");
    }
}

// Two threads: the collector answers while the test waits for the daemon to exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traceparent_on_an_api_request_parents_its_span_and_deliveries_carry_one() {
    let app = spawn_app().await;
    mount_listing(&app).await;
    let (collector, base) = Collector::start().await;
    let receiver = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/hooks"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&receiver)
        .await;
    let notify = format!(
        "\n[notify]\nurl = \"{}/hooks\"\nsecret_env = \"TRIBUTARY_TEST_HOOK_SECRET\"\nretry_initial_delay = \"1ms\"\nretry_max_delay = \"5ms\"\npoll_interval = \"50ms\"\n",
        receiver.uri()
    );
    // Synced once a year: only the job the test asks for runs.
    let providers = cursor_provider("acme", &app.api.uri(), &["alice"]).replace(
        "schedule = \"0 */15 * * * *\"",
        "schedule = \"0 0 0 1 1 *\"",
    );
    let served = Served::start_with_env(
        &app,
        &format!("{}{notify}{providers}", telemetry_table(&base)),
        &[
            (COLLECTOR_KEY_ENV, COLLECTOR_KEY),
            ("TRIBUTARY_TEST_HOOK_SECRET", "whsec_test_0123456789abcdef"),
        ],
        |text| text,
    )
    .await;
    let key = served.create_key("syncer", &["syncs:write"]);
    let alice: i64 = query(&app, "SELECT id FROM connections WHERE user_id = 'alice'").await[0]
        .try_get_by_index(0)
        .expect("alice's connection");

    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let traceparent = format!("00-{trace_id}-00f067aa0ba902b7-01");
    let (status, _, body) = served
        .call_with(
            Method::POST,
            &format!("/v1/connections/{alice}/syncs"),
            Some(&key),
            Some(("application/json", b"{}".to_vec())),
            &[("traceparent".to_string(), traceparent.clone())],
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");

    eventually(
        Duration::from_secs(30),
        "the run's notification",
        || async {
            !receiver
                .received_requests()
                .await
                .unwrap_or_default()
                .is_empty()
        },
    )
    .await;
    let delivered = receiver.received_requests().await.unwrap_or_default();
    let sent = delivered[0]
        .headers
        .get("traceparent")
        .and_then(|value| value.to_str().ok())
        .expect("the delivery carries a traceparent")
        .to_string();
    let parts: Vec<&str> = sent.split('-').collect();
    assert!(
        parts.len() == 4 && parts[0] == "00" && parts[1].len() == 32 && parts[2].len() == 16,
        "{sent}"
    );

    // SIGTERM: the daemon exports what is still queued before it exits.
    let mut served = served;
    served.daemon.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(
        served.daemon.wait(Duration::from_secs(30)),
        0,
        "{}",
        served.daemon.log()
    );

    let spans = collector.spans();
    let hex = |id: &[u8]| {
        id.iter()
            .map(|byte| format!("{byte:02x}"))
            .collect::<String>()
    };
    let request = spans
        .iter()
        .find(|span| text(span, "http.route").is_some_and(|route| route.contains("/syncs")))
        .unwrap_or_else(|| {
            let names: Vec<(&str, Option<String>)> = spans
                .iter()
                .map(|span| (span.name.as_str(), text(span, "http.route")))
                .collect();
            panic!(
                "no span of the API request among {names:?}\n{}",
                served.daemon.log()
            )
        });
    assert_eq!(hex(&request.trace_id), trace_id, "{request:#?}");
    assert_eq!(hex(&request.parent_span_id), "00f067aa0ba902b7");
    assert_eq!(int(request, "http.response.status_code"), Some(202));
    assert!(!is_error(request));

    // The delivery's span is the parent the receiver was told.
    let delivery = spans
        .iter()
        .find(|span| text(span, "delivery_id").is_some())
        .expect("the delivery's span");
    assert_eq!(hex(&delivery.trace_id), parts[1]);
    assert_eq!(hex(&delivery.span_id), parts[2]);

    // The job ran its run under its own span.
    let job = named(&spans, "job");
    assert_eq!(job.len(), 1, "{spans:#?}");
    let job = job[0];
    assert!(children(&spans, job).iter().any(|span| span.name == "run"));
    let job_id: i64 = query(&app, "SELECT id FROM sync_jobs WHERE kind = 'manual'").await[0]
        .try_get_by_index(0)
        .expect("the job's row");
    assert_eq!(int(job, "job_id"), Some(job_id), "{job:#?}");
    assert_eq!(int(job, "connection_id"), Some(alice));
    assert_eq!(text(job, "provider").as_deref(), Some("acme"));
    // Asked for without a stream: the job is the connection's every stream.
    assert_eq!(text(job, "stream").as_deref(), Some(""));
    assert_eq!(text(job, "kind").as_deref(), Some("Manual"));
    assert_eq!(int(job, "attempt"), Some(0));
    assert_eq!(int(job, "runs"), Some(1));
    // The listing's record without an id makes the run, and so the job, partial: no error.
    assert_eq!(text(job, "outcome").as_deref(), Some("partial"));
    assert!(!is_error(job), "{job:#?}");
}

#[tokio::test]
async fn a_failed_runs_span_has_the_error_status_and_its_message() {
    let app = spawn_app().await;
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .respond_with(ResponseTemplate::new(500))
        .mount(&app.api)
        .await;
    let (collector, base) = Collector::start().await;
    let (code, output) = sync_alice(
        &app,
        &telemetry_table(&base),
        &[(COLLECTOR_KEY_ENV, COLLECTOR_KEY)],
    )
    .await;
    assert_ne!(code, 0, "{output}");
    assert!(output.contains("alice@acme failed"), "{output}");

    let spans = collector.spans();
    let runs = named(&spans, "run");
    assert_eq!(runs.len(), 1, "{spans:#?}");
    let run_span = runs[0];
    assert_eq!(text(run_span, "outcome").as_deref(), Some("failed"));
    assert!(is_error(run_span), "{run_span:#?}");
    let message = run_span
        .status
        .as_ref()
        .map(|status| status.message.clone())
        .unwrap_or_default();
    assert!(!message.is_empty(), "the run's error is the status message");
}

#[tokio::test]
async fn a_sampling_ratio_of_zero_exports_no_span_of_a_run() {
    let app = spawn_app().await;
    let collector = sync_traced(&app, "sampling_ratio = 0.0").await;
    let spans = collector.spans();
    assert!(spans.is_empty(), "{spans:#?}");
}

#[tokio::test]
async fn without_a_telemetry_table_nothing_reaches_a_listening_collector() {
    let app = spawn_app().await;
    mount_listing(&app).await;
    let (collector, base) = Collector::start().await;
    // The standard OpenTelemetry variables point at the collector: only `[telemetry]` turns
    // exporting on, whatever the environment says.
    let (code, output) = sync_alice(
        &app,
        "",
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", base.as_str()),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                &format!("{base}/v1/traces"),
            ),
            ("OTEL_TRACES_EXPORTER", "otlp"),
        ],
    )
    .await;
    assert_eq!(code, 0, "{output}");
    assert!(output.contains("alice@acme partial"), "{output}");
    assert_eq!(
        collector.exports.lock().unwrap().len(),
        0,
        "an export arrived"
    );
}
