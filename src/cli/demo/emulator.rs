//! A small emulated REST API for `tributary demo`: three users, cursor pagination, and
//! the faults a real API throws: one 429 with `Retry-After`, one 503 and one malformed
//! record.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

/// The users the emulator knows, by bearer token `demo-token-<user>`.
pub const USERS: [&str; 3] = ["ada", "grace", "linus"];
/// Records per user; with `PAGE_SIZE` this gives three pages each.
pub const RECORDS_PER_USER: usize = 12;
pub const PAGE_SIZE: usize = 5;
/// Ada's record at this index has no `id`: the poison record of the demo.
const MALFORMED_INDEX: usize = 7;

#[derive(Default)]
struct Faults {
    rate_limited: AtomicBool,
    unavailable: AtomicBool,
}

#[derive(Deserialize)]
struct ListQuery {
    cursor: Option<String>,
    limit: Option<usize>,
}

/// Binds the emulator to an ephemeral loopback port and serves it in the background.
pub async fn start() -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let address = listener.local_addr()?;
    let app = Router::new()
        .route("/v1/items", get(list_items))
        .with_state(Arc::new(Faults::default()));
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::error!(%error, "The demo API stopped.");
        }
    });
    Ok(address)
}

async fn list_items(
    State(faults): State<Arc<Faults>>,
    headers: HeaderMap,
    Query(query): Query<ListQuery>,
) -> Response {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "));
    let Some(user) = token.and_then(|t| t.strip_prefix("demo-token-")) else {
        return error(StatusCode::UNAUTHORIZED, "missing or unknown bearer token");
    };
    if !USERS.contains(&user) {
        return error(StatusCode::UNAUTHORIZED, "unknown bearer token");
    }
    let start: usize = match query.cursor.as_deref().map(str::parse).transpose() {
        Ok(start) => start.unwrap_or(0),
        Err(_) => return error(StatusCode::BAD_REQUEST, "cursor is not a number"),
    };
    let limit = query.limit.unwrap_or(PAGE_SIZE).clamp(1, 100);

    // Grace's second page is rate limited once; Linus's first page fails once.
    if user == "grace" && start > 0 && !faults.rate_limited.swap(true, Ordering::SeqCst) {
        let mut response = error(StatusCode::TOO_MANY_REQUESTS, "rate limited, slow down");
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        return response;
    }
    if user == "linus" && start == 0 && !faults.unavailable.swap(true, Ordering::SeqCst) {
        return error(StatusCode::SERVICE_UNAVAILABLE, "upstream unavailable");
    }

    let end = (start + limit).min(RECORDS_PER_USER);
    let data: Vec<serde_json::Value> = (start..end).map(|index| item(user, index)).collect();
    let next_cursor = (end < RECORDS_PER_USER).then(|| end.to_string());
    Json(json!({ "data": data, "next_cursor": next_cursor })).into_response()
}

/// One record. Ids repeat across users on purpose: the key keeps them apart.
fn item(user: &str, index: usize) -> serde_json::Value {
    let mut record = json!({
        "id": format!("item_{:03}", index + 1),
        "object": "charge",
        "amount": 1000 + index * 250,
        "currency": "eur",
        "description": format!("Order {} for {user}", index + 1),
        "created": 1_780_000_000 + index as i64 * 3600,
        "status": "succeeded",
    });
    if user == "ada" && index == MALFORMED_INDEX {
        if let Some(object) = record.as_object_mut() {
            object.remove("id");
        }
    }
    record
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({ "error": { "message": message } }))).into_response()
}
