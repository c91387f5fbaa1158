//! The HTTP API the daemon serves on `[api] listen`: versioned routes under `/v1`, each a
//! thin function that reads its input, calls an operation in `ops` and returns its data
//! as JSON; errors as RFC 9457 problems; bearer keys checked on every request; the OpenAPI
//! document generated from the handlers at `/v1/openapi.json`.
//!
//! Layers, outermost first: problems (any error answer becomes `application/problem+json`),
//! the audit of write requests, the request timeout (503), the body limit (413), the
//! routes. Nothing another instance needs is held in memory: every request reads its key's
//! row, so instances behind one load balancer answer alike.

mod auth;
mod changes;
mod connect;
mod connections;
mod errors;
mod health;
mod inbox;
mod input;
mod jobs;
mod notifications;
mod operator;
mod problem;
mod records;
mod runs;
mod state;
mod syncs;
mod tls;
mod webhooks;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::MethodRouter;
use axum::Router;
use tokio_util::sync::CancellationToken;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::TimeoutLayer;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::OpenApi;

use crate::config::{ApiSettings, ConfigError, Settings};
use crate::db::DatabasePools;
use problem::Problem;
use state::ApiState;

/// Why the API could not start.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("listening on {listen} ([api] listen) failed: {source}")]
    Listen {
        listen: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("listening on {listen} ([operator] listen) failed: {source}")]
    OperatorListen {
        listen: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// A webhook secret's variable is unset or unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "tributary",
        description = "The API of a tributary daemon: its connections, their runs and errors, the change feed and the webhook deliveries. Errors are RFC 9457 problems (`application/problem+json`); lists are paged with an opaque `cursor` (a page's `next`).",
    ),
    modifiers(&BearerScheme),
    components(schemas(
        Problem,
        connections::Connection,
        connections::StreamState,
        connect::NewSessionBody,
        connect::ConnectSession,
        connections::ConnectionPage,
        connections::ConnectionChange,
        connections::NewConnectionBody,
        connections::StreamChange,
        connections::StreamUpdate,
        connections::Deleted,
        runs::Run,
        runs::RunPage,
        syncs::SyncRequest,
        syncs::SyncJob,
        syncs::SyncStatus,
        syncs::StreamSyncs,
        syncs::RunBrief,
        jobs::Job,
        jobs::JobPage,
        changes::ChangePage,
        changes::Change,
        changes::FeedStart,
        changes::FeedHead,
        changes::FeedReaders,
        crate::ops::changes::ReaderView,
        errors::RunError,
        errors::RunErrorPage,
        errors::Replay,
        errors::StillFailing,
        notifications::Delivery,
        notifications::DeliveryPage,
        health::Health,
        records::Record,
        records::RecordPage,
        webhooks::WebhookReceipt,
        webhooks::HandshakeAnswer,
        inbox::InboundDelivery,
        inbox::InboundPage,
    )),
    tags(
        (name = "connections", description = "Users' accounts at providers and their streams"),
        (name = "connect", description = "Links where users connect their own accounts"),
        (name = "runs", description = "The run history"),
        (name = "syncs", description = "Where a connection's syncs stand; runs asked for now, queued as jobs"),
        (name = "jobs", description = "Sync jobs: listing them, their status, and cancelling them"),
        (name = "errors", description = "What runs could not store, and replaying it"),
        (name = "changes", description = "The change feed of the records"),
        (name = "notifications", description = "The webhook deliveries"),
        (name = "records", description = "The synced records, read-only"),
        (name = "webhooks", description = "Providers' webhooks, authenticated by their signatures, and their inbox"),
        (name = "meta", description = "This document, and the instance's health"),
    )
)]
struct ApiDoc;

/// The `bearer` security scheme every route but the document names.
struct BearerScheme;

impl utoipa::Modify for BearerScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("trb_<prefix>_<secret>")
                    .description(Some(
                        "An API key from `tributary api-keys create`, as `Authorization: Bearer <key>`",
                    ))
                    .build(),
            ),
        );
    }
}

/// The routes and the document that describes them, from the same list: each route is
/// registered at the path its `#[utoipa::path]` names, and that operation added to the
/// document.
fn routes() -> (Router<ApiState>, utoipa::openapi::OpenApi) {
    use axum::routing::{delete, get, patch, post};
    let mut doc = ApiDoc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_string();
    let router = Routes {
        router: Router::new(),
        doc,
    }
    .add::<connections::__path_list_connections>("connections", get(connections::list_connections))
    .add::<connections::__path_create_connection>(
        "connections",
        post(connections::create_connection),
    )
    .add::<connections::__path_get_connection>("connections", get(connections::get_connection))
    .add::<connections::__path_change_connection>(
        "connections",
        patch(connections::change_connection),
    )
    .add::<connections::__path_delete_connection>(
        "connections",
        delete(connections::delete_connection),
    )
    .add::<connect::__path_create_session>("connect", post(connect::create_session))
    .add::<syncs::__path_trigger_sync>("syncs", post(syncs::trigger_sync))
    .add::<syncs::__path_sync_status>("syncs", get(syncs::sync_status))
    .add::<jobs::__path_list_jobs>("jobs", get(jobs::list_jobs))
    .add::<jobs::__path_get_job>("jobs", get(jobs::get_job))
    .add::<jobs::__path_cancel_job>("jobs", post(jobs::cancel_job))
    .add::<runs::__path_list_runs>("runs", get(runs::list_runs))
    .add::<runs::__path_get_run>("runs", get(runs::get_run))
    .add::<errors::__path_run_errors>("errors", get(errors::run_errors))
    .add::<errors::__path_open_errors>("errors", get(errors::open_errors))
    .add::<errors::__path_replay_run>("errors", post(errors::replay_run))
    .add::<changes::__path_read_changes>("changes", get(changes::read_changes))
    .add::<changes::__path_feed_head>("changes", get(changes::feed_head))
    .add::<changes::__path_feed_readers>("changes", get(changes::feed_readers))
    .add::<notifications::__path_list_deliveries>(
        "notifications",
        get(notifications::list_deliveries),
    )
    .add::<notifications::__path_redeliver>("notifications", post(notifications::redeliver))
    .add::<inbox::__path_list_inbox>("webhooks", get(inbox::list_inbox))
    .add::<health::__path_health>("meta", get(health::health))
    .add::<records::__path_list_records>("records", get(records::list_records))
    .add::<__path_openapi_json>("meta", get(openapi_json));
    let mut doc = router.doc;
    // Served by `webhooks::router`, outside `/v1` and its layers, but described here.
    add_webhook_operation::<webhooks::__path_receive>(&mut doc);
    add_webhook_operation::<webhooks::__path_handshake>(&mut doc);
    (router.router, doc)
}

/// Describes a webhook route, tagged `webhooks`.
fn add_webhook_operation<P: utoipa::Path>(doc: &mut utoipa::openapi::OpenApi) {
    let mut operation = P::operation();
    operation.tags = Some(vec!["webhooks".to_string()]);
    doc.paths
        .add_path_operation(P::path(), P::methods(), operation);
}

/// A router and its document, built together.
struct Routes {
    router: Router<ApiState>,
    doc: utoipa::openapi::OpenApi,
}

impl Routes {
    /// Serves `handler` at `P`'s path and documents `P`'s operation there, under `tag`;
    /// an operation that takes a key also answers 429 past the key's rate limit.
    fn add<P: utoipa::Path>(mut self, tag: &str, handler: MethodRouter<ApiState>) -> Routes {
        let path = P::path();
        let mut operation = P::operation();
        operation.tags = Some(vec![tag.to_string()]);
        if operation.security.is_some() {
            operation
                .responses
                .responses
                .insert("429".to_string(), utoipa::openapi::RefOr::T(rate_limited()));
        }
        self.doc
            .paths
            .add_path_operation(&path, P::methods(), operation);
        Routes {
            router: self.router.route(&path, handler),
            doc: self.doc,
        }
    }
}

/// The 429 answer of every route that takes a key.
fn rate_limited() -> utoipa::openapi::Response {
    use utoipa::openapi::header::HeaderBuilder;
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
    ResponseBuilder::new()
        .description("The key made its `[api] rate_limit` requests of this window")
        .header(
            "Retry-After",
            HeaderBuilder::new()
                .schema(
                    ObjectBuilder::new()
                        .schema_type(Type::Integer)
                        .minimum(Some(1)),
                )
                .description(Some("Seconds until the key's window reopens"))
                .build(),
        )
        .content(
            problem::PROBLEM_JSON,
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("Problem")))
                .build(),
        )
        .build()
}

/// The OpenAPI document, as `/v1/openapi.json` serves it.
pub(crate) fn openapi_document() -> String {
    let json = routes().1.to_pretty_json().unwrap_or_default();
    // utoipa 5 writes a link's fields in snake case, which OpenAPI does not know, so
    // clients would not follow the links. Every other key it writes is camel case, and a
    // quote inside a description is escaped, so these are the links' keys only.
    json.replace("\"operation_id\":", "\"operationId\":")
        .replace("\"operation_ref\":", "\"operationRef\":")
        .replace("\"request_body\":", "\"requestBody\":")
}

/// This document: the API's routes, parameters, answers and security scheme (OpenAPI 3.1).
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    responses((status = 200, description = "The OpenAPI document", content_type = "application/json"))
)]
async fn openapi_json(State(state): State<ApiState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        state.openapi.as_str().to_string(),
    )
}

/// The whole service: routes and layers.
fn app(api: &ApiSettings, state: ApiState) -> Router {
    let webhooks = webhooks::router(api.request_timeout, state.clone());
    layered(routes().0.merge(connect::pages()), api, state).merge(webhooks)
}

/// `router` with the layers every route has.
fn layered(router: Router<ApiState>, api: &ApiSettings, state: ApiState) -> Router {
    router
        .layer(RequestBodyLimitLayer::new(api.max_body_bytes))
        // The body limit above is the one that counts; axum's own (2 MiB) would refuse
        // first when `max_body_bytes` is larger.
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(TimeoutLayer::with_status_code(
            StatusCode::SERVICE_UNAVAILABLE,
            api.request_timeout,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::audit_writes,
        ))
        .layer(axum::middleware::from_fn(problem::problems_everywhere))
        .layer(axum::middleware::from_fn(traced))
        .with_state(state)
}

/// Serves `request` in a span of its own, the child of the trace its `traceparent` names,
/// so an app's trace goes on into tributary's. The span names the route, never the path:
/// the Connect page's paths hold tokens.
async fn traced(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let method = request.method().clone();
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or("unmatched", axum::extract::MatchedPath::as_str)
        .to_string();
    let span = tracing::debug_span!(
        "http.server.request",
        "otel.name" = format!("{method} {route}"),
        "otel.kind" = "server",
        "http.request.method" = method.as_str(),
        "http.route" = route.as_str(),
        "http.response.status_code" = tracing::field::Empty,
        "otel.status_code" = tracing::field::Empty,
    );
    if let Some(traceparent) = request
        .headers()
        .get(crate::telemetry::TRACEPARENT)
        .and_then(|value| value.to_str().ok())
    {
        crate::telemetry::continue_trace(&span, traceparent);
    }
    let response = tracing::Instrument::instrument(next.run(request), span.clone()).await;
    span.record(
        "http.response.status_code",
        i64::from(response.status().as_u16()),
    );
    if response.status().is_server_error() {
        span.record("otel.status_code", "ERROR");
    }
    response
}

/// Binds `[api] listen` and serves until `shutdown` is cancelled; requests in flight are
/// answered first (each within `request_timeout`). With `tls` (from
/// [`Settings::api_tls`]) it serves HTTPS only, with the same layers and shutdown.
pub(crate) async fn serve(
    api: &ApiSettings,
    tls: Option<Arc<rustls::ServerConfig>>,
    db: DatabasePools,
    settings: Arc<Settings>,
    shutdown: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, ApiError> {
    let listen = api.listen;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| ApiError::Listen { listen, source })?;
    let mut state = ApiState::new(db, settings.clone(), Arc::new(openapi_document()));
    state.webhook_secrets = Arc::new(crate::ops::webhooks::secrets(
        &settings,
        state.db.secrets(),
    )?);
    let scheme = if tls.is_some() { "https" } else { "http" };
    // Bound before the API serves, so that a taken port fails the start as a whole.
    let operator = match &settings.operator {
        Some(operator) => {
            let listen = operator.listen;
            let listener = tokio::net::TcpListener::bind(listen)
                .await
                .map_err(|source| ApiError::OperatorListen { listen, source })?;
            let pages = layered(operator::pages(), api, state.clone());
            tracing::info!(%listen, url = %format!("{scheme}://{listen}"), "Serving the operator page.");
            Some(spawn_server(
                listener,
                tls.clone(),
                pages,
                api.request_timeout,
                shutdown.clone(),
                Served::Operator,
            ))
        }
        None => None,
    };
    let app = app(api, state);
    tracing::info!(%listen, url = %format!("{scheme}://{listen}"), "Serving the API.");
    let served = spawn_server(
        listener,
        tls,
        app,
        api.request_timeout,
        shutdown,
        Served::Api,
    );
    Ok(tokio::spawn(async move {
        let _ = served.await;
        if let Some(operator) = operator {
            let _ = operator.await;
        }
    }))
}

/// Which server a listener serves, for its log lines.
#[derive(Clone, Copy)]
enum Served {
    Api,
    Operator,
}

/// Serves `app` on `listener` (over TLS with `tls`) until `shutdown` is cancelled.
fn spawn_server(
    listener: tokio::net::TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    app: Router,
    request_timeout: std::time::Duration,
    shutdown: CancellationToken,
    what: Served,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let stopped = async move { shutdown.cancelled().await };
        let served = match tls {
            Some(config) => {
                let listener = tls::TlsListener::new(listener, config, request_timeout);
                axum::serve(listener, app)
                    .with_graceful_shutdown(stopped)
                    .await
            }
            None => {
                axum::serve(listener, app)
                    .with_graceful_shutdown(stopped)
                    .await
            }
        };
        match (served, what) {
            (Err(error), Served::Api) => tracing::error!(%error, "The API stopped."),
            (Err(error), Served::Operator) => {
                tracing::error!(%error, "The operator page stopped.")
            }
            (Ok(()), _) => {}
        }
        match what {
            Served::Api => tracing::info!("The API stopped serving."),
            Served::Operator => tracing::info!("The operator page stopped serving."),
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use axum::routing::{get, post};
    use axum::Router;

    use super::state::ApiState;

    /// Every `$ref` of the document names a schema it holds.
    #[test]
    fn every_reference_of_the_document_resolves() {
        let doc: serde_json::Value =
            serde_json::from_str(&super::openapi_document()).expect("JSON");
        let mut refs = Vec::new();
        collect_refs(&doc, &mut refs);
        assert!(!refs.is_empty());
        for reference in refs {
            let name = reference
                .strip_prefix("#/components/schemas/")
                .unwrap_or_else(|| panic!("unexpected reference {reference}"));
            assert!(
                doc["components"]["schemas"][name].is_object(),
                "{reference} does not resolve"
            );
        }
    }

    /// Every link of a response names an operation of the document by its `operationId`
    /// and passes only parameters that operation takes.
    #[test]
    fn every_link_of_the_document_names_an_operation_and_its_parameters() {
        let doc: serde_json::Value =
            serde_json::from_str(&super::openapi_document()).expect("JSON");
        let mut operations = std::collections::HashMap::new();
        for item in doc["paths"].as_object().expect("paths").values() {
            for operation in item.as_object().expect("operations").values() {
                let id = operation["operationId"].as_str().expect("operationId");
                let parameters: Vec<String> = operation["parameters"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|p| p["name"].as_str().map(str::to_string))
                    .collect();
                operations.insert(id.to_string(), parameters);
            }
        }
        let mut links = 0;
        for item in doc["paths"].as_object().expect("paths").values() {
            for operation in item.as_object().expect("operations").values() {
                let responses = operation["responses"].as_object().expect("responses");
                for (name, link) in responses
                    .values()
                    .filter_map(|response| response["links"].as_object())
                    .flatten()
                {
                    links += 1;
                    let target = link["operationId"]
                        .as_str()
                        .unwrap_or_else(|| panic!("link {name} names no operationId: {link}"));
                    let taken = operations
                        .get(target)
                        .unwrap_or_else(|| panic!("link {name}: no operation {target}"));
                    for parameter in link["parameters"].as_object().expect("parameters").keys() {
                        assert!(taken.contains(parameter), "link {name}: {parameter}");
                    }
                }
            }
        }
        assert!(links >= 5, "{links} links");
    }

    fn collect_refs(value: &serde_json::Value, refs: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, value) in map {
                    match (key.as_str(), value.as_str()) {
                        ("$ref", Some(reference)) => refs.push(reference.to_string()),
                        _ => collect_refs(value, refs),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| collect_refs(v, refs)),
            _ => {}
        }
    }

    /// A slow request is answered 503 at `request_timeout`, a large body 413, both as
    /// problems.
    #[tokio::test]
    async fn a_slow_request_and_a_large_body_are_answered_as_problems() {
        let test = crate::testing::TestDb::new().await;
        let settings = test.settings(
            "[api]\nlisten = \"127.0.0.1:0\"\nmax_body_bytes = 1024\nrequest_timeout = \"200ms\"\n",
        );
        let api = settings.api.clone().expect("[api]");
        let state = ApiState::new(test.db.clone(), settings, Arc::default());
        let router = Router::new()
            .route(
                "/slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    "late"
                }),
            )
            .route("/echo", post(|body: String| async move { body }));
        let app = super::layered(router, &api, state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bound");
        let base = format!("http://{}", listener.local_addr().expect("address"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        let client = reqwest::Client::new();

        let started = std::time::Instant::now();
        let slow = client
            .get(format!("{base}/slow"))
            .send()
            .await
            .expect("answer");
        assert_eq!(slow.status(), 503);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(slow.headers()["content-type"], super::problem::PROBLEM_JSON);
        let problem: serde_json::Value = slow.json().await.expect("JSON");
        assert_eq!(problem["status"], 503);
        assert!(problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("request_timeout")));

        let large = client
            .post(format!("{base}/echo"))
            .body(vec![b'x'; 2048])
            .send()
            .await
            .expect("answer");
        assert_eq!(large.status(), 413);
        let problem: serde_json::Value = large.json().await.expect("JSON");
        assert_eq!(problem["type"], "urn:tributary:problem:body-too-large");
        let small = client
            .post(format!("{base}/echo"))
            .body(vec![b'x'; 512])
            .send()
            .await
            .expect("answer");
        assert_eq!(small.status(), 200);
    }

    /// The committed document is the one the code generates, so that a change to the
    /// API shows in review. `TRIBUTARY_BLESS=1` rewrites it.
    #[test]
    fn the_committed_openapi_document_is_the_generated_one() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/openapi.json");
        let generated = format!("{}\n", super::openapi_document());
        if std::env::var_os("TRIBUTARY_BLESS").is_some() {
            std::fs::write(&path, &generated).expect("docs/openapi.json written");
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == generated,
            "docs/openapi.json differs from the generated document; rerun with TRIBUTARY_BLESS=1"
        );
    }
}
