//! The admin listener (`[admin]`): the open-stream registry as JSON for operators and
//! `meridian top`. It is a listener of its own, off unless `admin.listen` is set, so it
//! can stay off the network clients reach, and it answers only requests that bear the
//! token from `admin.token_env` (compared in constant time).

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{OpenStreams, StreamView};

/// The path that lists open streams.
pub const STREAMS_PATH: &str = "/admin/streams";

/// Why the admin listener cannot start.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error(
        "admin.listen is set but the environment variable {0} (admin.token_env) is unset or empty: \
         the admin listener needs a bearer token"
    )]
    NoToken(String),
    #[error("cannot listen on {addr} (admin.listen): {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

/// The body of `GET /admin/streams`.
#[derive(Debug, Serialize, Deserialize)]
pub struct StreamList {
    /// Open requests, whatever their stage.
    pub open: usize,
    /// Streamed responses being relayed, by phase (as `meridian_open_streams`).
    pub streams_by_phase: PhaseCounts,
    /// Oldest first.
    pub streams: Vec<StreamView>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PhaseCounts {
    pub pending: u64,
    pub think: u64,
    pub output: u64,
}

#[derive(Clone)]
struct Admin {
    streams: Arc<OpenStreams>,
    token: Arc<str>,
}

/// The admin routes over `streams`, for requests bearing `token`.
pub fn admin_router(streams: Arc<OpenStreams>, token: String) -> Router {
    Router::new()
        .route(STREAMS_PATH, get(list))
        .route("/admin/streams/{id}", get(one))
        .with_state(Admin { streams, token: token.into() })
}

/// Reads the token from `token_env` and binds `listen`; the caller serves the router.
pub async fn serve_admin(
    listen: &str,
    token_env: &str,
    streams: Arc<OpenStreams>,
) -> Result<(tokio::net::TcpListener, Router), AdminError> {
    let token = match std::env::var(token_env) {
        Ok(t) if !t.trim().is_empty() => t.trim().to_owned(),
        _ => return Err(AdminError::NoToken(token_env.to_owned())),
    };
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| AdminError::Bind { addr: listen.to_owned(), source })?;
    Ok((listener, admin_router(streams, token)))
}

/// The 401 for a request without the admin token, if this one is such.
fn denied(headers: &HeaderMap, token: &str) -> Option<Response> {
    let presented = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    meridian_core::channel::check_bearer(presented, token).err().map(|_| {
        let body = json!({"error": {"message": "the admin listener needs Authorization: Bearer <admin token>",
                                    "type": "unauthorized", "code": "unauthorized"}});
        (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Bearer")], axum::Json(body)).into_response()
    })
}

async fn list(State(admin): State<Admin>, headers: HeaderMap) -> Response {
    if let Some(denied) = denied(&headers, &admin.token) {
        return denied;
    }
    let [pending, think, output] = admin.streams.streams_by_phase();
    let streams = admin.streams.snapshot();
    let body =
        StreamList { open: streams.len(), streams_by_phase: PhaseCounts { pending, think, output }, streams };
    axum::Json(body).into_response()
}

async fn one(State(admin): State<Admin>, Path(id): Path<String>, headers: HeaderMap) -> Response {
    if let Some(denied) = denied(&headers, &admin.token) {
        return denied;
    }
    match admin.streams.get(&id) {
        Some(ctx) => axum::Json(super::view(&ctx, std::time::Instant::now())).into_response(),
        None => {
            let body = json!({"error": {"message": format!("no open stream {id:?}"), "type": "not_found",
                                        "code": "not_found"}});
            (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
        }
    }
}
