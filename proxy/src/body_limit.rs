//! A limit on the size of a request's body (`server.max_body_bytes`), for every route,
//! as one layer: a body declared larger (`Content-Length`) is refused before any handler
//! runs; one that grows past the limit while it is read (a chunked upload) fails the
//! read, which the handler answers with the same error (`body::read_body`).

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;
use http_body_util::Limited;

use crate::error::ProxyError;
use crate::telemetry::outcomes::OutcomeSlot;

pub async fn limit_body(State(limit): State<u64>, req: Request, next: Next) -> Response {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        let path = req.uri().path();
        let err = ProxyError::PayloadTooLarge { limit };
        if let (Some(outcome), Some(route)) =
            (req.extensions().get::<OutcomeSlot>(), crate::routes::label_of_path(path))
        {
            outcome.route(route);
            outcome.set(err.outcome());
        }
        return err.into_response_in(crate::routes::dialect_of_path(path));
    }
    let max = usize::try_from(limit).unwrap_or(usize::MAX);
    next.run(req.map(|body| Body::new(Limited::new(body, max)))).await
}
