//! `/healthz` and `/metrics`, served when `[daemon] listen` is set.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use chrono::{DateTime, Utc};
use metrics_exporter_prometheus::PrometheusHandle;
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QuerySelect};
use tokio_util::sync::CancellationToken;

use crate::entities::connection;
use crate::entities::webhook_delivery::{self, InboxStatus};
use crate::pipeline::RunOutcome;

/// What the endpoints read.
#[derive(Clone)]
pub struct EndpointState {
    pub db: DatabaseConnection,
    pub metrics: PrometheusHandle,
    /// True while the scheduler runs.
    pub scheduling: Arc<AtomicBool>,
    /// The runs of this daemon that ended by a panic.
    pub panics: Arc<RunPanics>,
    /// The providers that receive webhooks, whose lag `/metrics` reports.
    pub webhook_providers: Arc<Vec<String>>,
    /// Every configured provider, whose connections needing a reconnect `/metrics` counts.
    pub providers: Arc<Vec<String>>,
}

/// The runs of this daemon that ended by a panic: how many, and the last one.
#[derive(Debug, Default)]
pub struct RunPanics {
    count: AtomicU64,
    last: Mutex<Option<String>>,
}

impl RunPanics {
    /// Notes `outcome` if it ended by a panic.
    pub fn note(&self, outcome: &RunOutcome) {
        if !outcome.panicked {
            return;
        }
        self.count.fetch_add(1, Ordering::SeqCst);
        let last = format!(
            "run {} ({}@{}): {}",
            outcome.run_id,
            outcome.user_id,
            outcome.provider,
            outcome.error.as_deref().unwrap_or("")
        );
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = Some(last);
    }

    /// A line for `/healthz`, when a run has panicked.
    fn report(&self) -> Option<String> {
        let count = self.count.load(Ordering::SeqCst);
        let last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        (count > 0).then(|| {
            format!(
                "runs ended by a panic: {count}; the last: {}\n",
                last.as_deref().unwrap_or("")
            )
        })
    }
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

/// 200 when the database answers and the scheduler runs, else 503 with the reason; either
/// way with a line on runs that ended by a panic, if any did.
async fn healthz(State(state): State<EndpointState>) -> impl IntoResponse {
    if !state.scheduling.load(Ordering::SeqCst) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "scheduler not running\n".to_string(),
        );
    }
    // A panicked run is reported but does not make the daemon unhealthy: it ended
    // `failed`, and the daemon goes on firing.
    let panics = state.panics.report().unwrap_or_default();
    match state.db.ping().await {
        Ok(()) => (StatusCode::OK, format!("ok\n{panics}")),
        Err(error) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("database unreachable: {error}\n{panics}"),
        ),
    }
}

async fn metrics(State(state): State<EndpointState>) -> impl IntoResponse {
    if let Err(error) = record_webhook_lag(&state).await {
        // The rest of the metrics are still worth serving.
        tracing::warn!(%error, "Reading the webhook inbox's lag failed.");
    }
    if let Err(error) = record_needs_reconnect(&state).await {
        tracing::warn!(%error, "Counting the connections that need a reconnect failed.");
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
}

/// Sets each provider's count of connections needing a reconnect; zero for a provider
/// with none, so that a count that fell to nothing does not linger.
async fn record_needs_reconnect(state: &EndpointState) -> Result<(), sea_orm::DbErr> {
    let counts: Vec<(String, i64)> = connection::Entity::find()
        .select_only()
        .column(connection::Column::Provider)
        .column_as(connection::Column::Id.count(), "count")
        .filter(connection::Column::NeedsReconnectSince.is_not_null())
        .group_by(connection::Column::Provider)
        .into_tuple()
        .all(&state.db)
        .await?;
    for provider in state.providers.iter() {
        let count = counts
            .iter()
            .find(|(name, _)| name == provider)
            .map_or(0, |(_, count)| *count);
        crate::telemetry::record_needs_reconnect(provider, count);
    }
    Ok(())
}

/// Sets each webhook provider's lag from the inbox: the age, by the database's clock, of
/// its oldest delivery still `received`; zero for a provider with none, so that a lag
/// that ended does not linger.
async fn record_webhook_lag(state: &EndpointState) -> Result<(), sea_orm::DbErr> {
    if state.webhook_providers.is_empty() {
        return Ok(());
    }
    let oldest: Vec<(String, Option<DateTime<Utc>>)> = webhook_delivery::Entity::find()
        .select_only()
        .column(webhook_delivery::Column::Provider)
        .column_as(webhook_delivery::Column::ReceivedAt.min(), "oldest")
        .filter(webhook_delivery::Column::Status.eq(InboxStatus::Received))
        .group_by(webhook_delivery::Column::Provider)
        .into_tuple()
        .all(&state.db)
        .await?;
    let now = crate::db::now();
    for provider in state.webhook_providers.iter() {
        let age = oldest
            .iter()
            .find(|(name, _)| name == provider)
            .and_then(|(_, oldest)| *oldest)
            .and_then(|oldest| now.signed_duration_since(oldest).to_std().ok())
            .unwrap_or_default();
        crate::telemetry::record_webhook_lag(provider, age);
    }
    Ok(())
}
