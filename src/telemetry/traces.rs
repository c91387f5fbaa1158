//! Traces: the `tracing` spans of tributary's own code, exported over OTLP HTTP/protobuf
//! when `[telemetry]` is configured. Without it no layer is installed, so the spans cost
//! what they did before, and the `traceparent` helpers below do nothing.

use std::collections::HashMap;
use std::time::Duration;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{Bytes, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchSpanProcessor, Sampler, SdkTracerProvider, Span, SpanData, SpanProcessor,
};
use opentelemetry_sdk::Resource;
use secrecy::{ExposeSecret, SecretString};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::FilterFn;
use tracing_subscriber::Layer;

/// The span field that names the app's user: it may be personal data, so it is exported
/// only when `[telemetry] include_user_id` allows.
const USER_ID_FIELD: &str = "user_id";

/// The W3C Trace Context header.
pub(crate) const TRACEPARENT: &str = "traceparent";

/// How long one export may take before it is dropped.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where and how traces are exported, resolved from `[telemetry]`.
pub(crate) struct TraceExport {
    /// The collector's OTLP traces URL (`.../v1/traces`).
    pub traces_url: String,
    /// Headers sent with every export (e.g. a vendor's API key).
    pub headers: Vec<(String, SecretString)>,
    pub service_name: String,
    /// The share of new traces kept; a trace whose parent was sampled is always kept.
    pub sampling_ratio: f64,
    /// Export the `user_id` field of spans.
    pub include_user_id: bool,
}

/// The exporting pipeline; [`Traces::shutdown`] sends what is still queued.
pub(crate) struct Traces {
    provider: SdkTracerProvider,
}

impl Traces {
    /// Exports the spans still queued and stops. Runs off the async runtime's threads:
    /// it blocks until the export ends or times out.
    pub(crate) fn shutdown(self) {
        if let Err(error) = self.provider.shutdown() {
            tracing::warn!(%error, "Exporting the last traces failed.");
        }
    }
}

/// The layer that exports spans as `export` says, and the handle that flushes them. The
/// exports are sent on `runtime`, through the reqwest client tributary already builds.
pub(crate) fn layer<S>(
    export: TraceExport,
    runtime: tokio::runtime::Handle,
) -> Result<(impl Layer<S>, Traces), String>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let headers: HashMap<String, String> = export
        .headers
        .iter()
        .map(|(name, value)| (name.clone(), value.expose_secret().to_string()))
        .collect();
    let client = reqwest::Client::builder()
        .timeout(EXPORT_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|error| format!("building the trace exporter's HTTP client: {error}"))?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(export.traces_url)
        .with_timeout(EXPORT_TIMEOUT)
        .with_headers(headers)
        .with_http_client(OnRuntime { client, runtime })
        .build()
        .map_err(|error| format!("building the trace exporter: {error}"))?;
    let processor = WithoutUserId {
        inner: BatchSpanProcessor::builder(exporter).build(),
        include_user_id: export.include_user_id,
    };
    let ratio = Sampler::TraceIdRatioBased(export.sampling_ratio);
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(Sampler::ParentBased(Box::new(ratio)))
        .with_resource(
            Resource::builder()
                .with_service_name(export.service_name)
                .build(),
        )
        .build();
    let tracer = provider.tracer("tributary");
    // Our spans at any level, and our log lines from `debug` up as their events; other
    // crates' spans (hyper's, sqlx's) would only bury ours.
    let ours = FilterFn::new(|metadata: &tracing::Metadata<'_>| {
        metadata.target().starts_with("tributary")
            && (metadata.is_span() || *metadata.level() <= tracing::Level::DEBUG)
    });
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_level(true)
        .with_filter(ours);
    Ok((layer, Traces { provider }))
}

/// Makes `span` a child of the trace a `traceparent` header names; a header that does not
/// parse is ignored, as is any header when no traces are exported.
pub(crate) fn continue_trace(span: &tracing::Span, traceparent: &str) {
    let carrier = HashMap::from([(TRACEPARENT.to_string(), traceparent.to_string())]);
    let context = TraceContextPropagator::new().extract(&carrier);
    let _ = span.set_parent(context);
}

/// The `traceparent` header naming `span`, for a request it makes; `None` when no traces
/// are exported (the span is not recorded).
pub(crate) fn traceparent_of(span: &tracing::Span) -> Option<String> {
    let mut carrier: HashMap<String, String> = HashMap::new();
    TraceContextPropagator::new().inject_context(&span.context(), &mut carrier);
    carrier.remove(TRACEPARENT)
}

/// The batch processor, with the `user_id` attribute taken off spans and their events
/// unless the config allows it.
#[derive(Debug)]
struct WithoutUserId {
    inner: BatchSpanProcessor,
    include_user_id: bool,
}

impl SpanProcessor for WithoutUserId {
    fn on_start(&self, span: &mut Span, cx: &opentelemetry::Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, mut span: SpanData) {
        if !self.include_user_id {
            span.attributes
                .retain(|attribute| attribute.key.as_str() != USER_ID_FIELD);
            for event in span.events.events.iter_mut() {
                event
                    .attributes
                    .retain(|attribute| attribute.key.as_str() != USER_ID_FIELD);
            }
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> opentelemetry_sdk::error::OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// Sends the exporter's requests with reqwest on the tokio runtime: the batch processor
/// exports from a thread of its own, where reqwest finds no runtime.
#[derive(Debug)]
struct OnRuntime {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for OnRuntime {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let request = reqwest::Request::try_from(request)?;
        let client = self.client.clone();
        let answer = self
            .runtime
            .spawn(async move {
                let response = client.execute(request).await?;
                let status = response.status();
                let headers = response.headers().clone();
                let body = response.bytes().await?;
                Ok::<_, reqwest::Error>((status, headers, body))
            })
            .await??;
        let (status, headers, body) = answer;
        let mut response = Response::new(body);
        *response.status_mut() = status;
        *response.headers_mut() = headers;
        Ok(response)
    }
}
