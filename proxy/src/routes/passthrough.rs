//! Every other `/v1/*` route (embeddings, tokenize, audio, …) goes to an upstream
//! unchanged, with the same header hygiene, retries and tenant limits, but no phase
//! tracking.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use meridian_core::Outcome;

use crate::body::read_body;
use crate::error::ProxyError;
use crate::headers::{client_response_headers, upstream_request_headers};
use crate::relay::{UpstreamRequest, send_with_retries};
use crate::request_id::{REQUEST_ID, request_id};
use crate::state::AppState;
use crate::telemetry::outcomes::OutcomeSlot;
use crate::upstream::Want;

pub async fn passthrough(State(state): State<Arc<AppState>>, req: Request) -> Response {
    let id = request_id(req.headers());
    let outcome = req.extensions().get::<OutcomeSlot>().cloned().unwrap_or_default();
    outcome.route("passthrough");
    let result = async {
        let path = req.uri().path().to_owned();
        if !path.starts_with("/v1/") {
            return Err(ProxyError::NotFound(path));
        }
        let (parts, body) = req.into_parts();
        // Its tenant's slot is held until the last byte, like the upstream's.
        let tenant = state.tenant_lease(&parts.headers)?;
        let body = read_body(body, &state.config.server).await?;
        let path_and_query = parts.uri.path_and_query().map_or(path.as_str(), |p| p.as_str());
        let sent = send_with_retries(
            &state,
            UpstreamRequest {
                method: parts.method.clone(),
                path_and_query,
                headers: upstream_request_headers(
                    &parts.headers,
                    state.config.upstream.forward_authorization,
                ),
                body,
                hook_body: None,
                request_id: &id,
                want: Want::model(None),
                first: None,
                admitted: None,
                // Untracked routes have no request span: the client's trace context
                // passes through as it came.
                span: tracing::Span::none(),
            },
        )
        .await?;
        let (in_flight, resp) = (sent.in_flight, sent.response);
        let status = resp.status();
        let mut headers = client_response_headers(resp.headers());
        headers.insert(REQUEST_ID, id.clone());
        if headers.contains_key(header::TRANSFER_ENCODING) {
            headers.remove(header::CONTENT_LENGTH);
        }
        // The guard rides along with the body so the request counts until its last byte.
        let stream = resp.bytes_stream().map(move |chunk| {
            let _ = (&in_flight, &tenant);
            chunk
        });
        let mut out = Response::new(Body::from_stream(stream));
        *out.status_mut() = status;
        *out.headers_mut() = headers;
        outcome.set(if status.is_success() { Outcome::Ok } else { Outcome::UpstreamStatus });
        Ok(out)
    }
    .await;
    result.unwrap_or_else(|e| {
        outcome.set(e.outcome());
        e.into_response()
    })
}
