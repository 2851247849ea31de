//! A limit on the size of a request's body (`server.max_body_bytes`), for every route,
//! as one layer: a body declared larger (`Content-Length`) is refused before any handler
//! runs; one that grows past the limit while it is read (a chunked upload) fails the
//! read, which the handler answers with the same error (`body::read_body`).

use axum::body::Body;
use axum::extract::Request;
use axum::http::header;
use http_body_util::Limited;

use crate::error::ProxyError;
use crate::layers::{Concern, Next, Responding};
use crate::telemetry::outcomes::OutcomeSlot;

/// The layer ([`crate::layers`]), inside the outcome count (a refusal is counted under
/// its route).
#[derive(Clone, Copy, Debug)]
pub struct LimitBody {
    limit: u64,
}

impl LimitBody {
    pub fn new(max_body_bytes: u64) -> Self {
        LimitBody { limit: max_body_bytes }
    }
}

impl Concern for LimitBody {
    fn around<S: Next>(&self, req: Request, mut next: S) -> Responding {
        let limit = self.limit;
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
            return Box::pin(std::future::ready(Ok(
                err.into_response_in(crate::routes::dialect_of_path(path))
            )));
        }
        let max = usize::try_from(limit).unwrap_or(usize::MAX);
        Box::pin(next.call(req.map(|body| Body::new(Limited::new(body, max)))))
    }
}
