//! `/v1/health`: whether this instance can reach its database, and its version. No key:
//! a load balancer asks it; it says nothing of the configuration or the data.

use axum::extract::State;
use axum::http::StatusCode;
use serde::Serialize;
use utoipa::ToSchema;

use super::problem::Problem;
use super::state::ApiState;

/// A healthy instance.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Health {
    /// Always `ok`.
    pub status: &'static str,
    /// The release of tributary serving.
    pub version: &'static str,
}

/// Whether the instance is up and reaches its database.
#[utoipa::path(
    get,
    path = "/v1/health",
    responses(
        (status = 200, description = "Up, and the database answers", body = Health),
        (status = 503, description = "The database does not answer", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn health(State(state): State<ApiState>) -> Result<axum::Json<Health>, Problem> {
    if let Err(error) = crate::ops::ping(state.db.main()).await {
        tracing::warn!(%error, "The health check found the database unreachable.");
        return Err(Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the database does not answer",
        ));
    }
    Ok(axum::Json(Health {
        status: "ok",
        version: env!("CARGO_PKG_VERSION"),
    }))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use axum::extract::State;
    use axum::http::StatusCode;
    use axum::response::IntoResponse;

    use super::super::state::ApiState;

    /// A database that does not answer makes the instance unhealthy: 503, as a problem.
    #[tokio::test]
    async fn an_unreachable_database_is_503() {
        let test = crate::testing::TestDb::new().await;
        let db = test.db.clone();
        let state = ApiState::new(db.clone(), test.settings(""), Arc::default());
        let healthy = super::health(State(state.clone())).await.expect("healthy");
        assert_eq!(healthy.status, "ok");

        db.close().await.expect("closed");
        let problem = super::health(State(state))
            .await
            .expect_err("the database is closed");
        assert_eq!(problem.status, 503);
        let response = problem.into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            response.headers()["content-type"],
            super::super::problem::PROBLEM_JSON
        );
    }
}
