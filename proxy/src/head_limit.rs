//! A limit on the size of a request's head (`server.max_header_bytes`), answered in
//! OpenAI's error shape.
//!
//! hyper's own limit is its read buffer (about 400 KB), past which it answers a bare 431
//! before any handler runs; below it a request with, say, 300 KB of cookies would be
//! parsed, copied upstream on every attempt and logged. This layer refuses it first, with
//! a body an OpenAI client can show.

use axum::extract::Request;
use axum::response::IntoResponse;

use crate::error::ProxyError;
use crate::layers::{Concern, Next, Responding};
use crate::request_id::request_id;

/// Bytes a header takes on the wire: name, value, `": "` and CRLF.
fn wire_size(name: &str, value: &[u8]) -> usize {
    name.len() + value.len() + 4
}

/// The layer ([`crate::layers`]): a head over `limit` bytes is refused before anything
/// else reads it.
#[derive(Clone, Copy, Debug)]
pub struct LimitHead {
    limit: usize,
}

impl LimitHead {
    pub fn new(max_header_bytes: u64) -> Self {
        LimitHead { limit: usize::try_from(max_header_bytes).unwrap_or(usize::MAX) }
    }
}

impl Concern for LimitHead {
    fn around<S: Next>(&self, req: Request, mut next: S) -> Responding {
        // The request target as sent (path and query; an absolute-form target's scheme
        // and authority too), measured without rendering the URI.
        let uri = req.uri();
        let target = uri.path_and_query().map_or(0, |p| p.as_str().len())
            + uri.authority().map_or(0, |a| a.as_str().len())
            + uri.scheme_str().map_or(0, |s| s.len() + 3);
        let size: usize =
            req.headers().iter().map(|(n, v)| wire_size(n.as_str(), v.as_bytes())).sum::<usize>() + target;
        let limit = self.limit;
        if size > limit {
            let id = request_id(req.headers());
            tracing::info!(request_id = ?id, size, limit, "request head too large");
            return Box::pin(std::future::ready(Ok(ProxyError::HeadersTooLarge { limit }.into_response())));
        }
        Box::pin(next.call(req))
    }
}
