//! Liveness, readiness and metrics.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::state::AppState;

/// Liveness: the process is up and serving HTTP.
pub async fn health() -> Response {
    axum::Json(json!({"status": "ok"})).into_response()
}

/// Readiness: at least one upstream is in rotation, and the server is not draining.
pub async fn ready(State(state): State<Arc<AppState>>) -> Response {
    if state.drain.draining() {
        let body = json!({"status": "draining"});
        return (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
    }
    let healthy = state.pool.all().iter().filter(|u| u.is_healthy()).count();
    let total = state.pool.all().len();
    let status = if healthy > 0 { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    let body = json!({"status": if healthy > 0 { "ready" } else { "not_ready" }, "healthy_upstreams": healthy, "upstreams": total});
    (status, axum::Json(body)).into_response()
}

pub async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], state.render_metrics())
        .into_response()
}
