//! `/healthz` and `/metrics`, served when `[daemon] listen` is set.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use sea_orm::DatabaseConnection;
use tokio_util::sync::CancellationToken;

/// What the endpoints read.
#[derive(Clone)]
pub struct EndpointState {
    pub db: DatabaseConnection,
    pub metrics: PrometheusHandle,
    /// True while the scheduler runs.
    pub scheduling: Arc<AtomicBool>,
}

/// Binds `listen` and serves until `shutdown` is cancelled.
pub async fn serve(
    listen: SocketAddr,
    state: EndpointState,
    shutdown: CancellationToken,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    tracing::info!(%listen, "Serving /healthz and /metrics.");
    let app = Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .with_state(state);
    Ok(tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
        if let Err(error) = served {
            tracing::error!(%error, "The metrics endpoint stopped.");
        }
    }))
}

/// 200 when the database answers and the scheduler runs, else 503 with the reason.
async fn healthz(State(state): State<EndpointState>) -> impl IntoResponse {
    if !state.scheduling.load(Ordering::SeqCst) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "scheduler not running\n".to_string(),
        );
    }
    match state.db.ping().await {
        Ok(()) => (StatusCode::OK, "ok\n".to_string()),
        Err(error) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("database unreachable: {error}\n"),
        ),
    }
}

async fn metrics(State(state): State<EndpointState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
}
