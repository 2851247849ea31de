//! A limit on the size of a request's head (`server.max_header_bytes`), answered in
//! OpenAI's error shape.
//!
//! hyper's own limit is its read buffer (about 400 KB), past which it answers a bare 431
//! before any handler runs; below it a request with, say, 300 KB of cookies would be
//! parsed, copied upstream on every attempt and logged. This layer refuses it first, with
//! a body an OpenAI client can show.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ProxyError;
use crate::request_id::request_id;

/// Bytes a header takes on the wire: name, value, `": "` and CRLF.
fn wire_size(name: &str, value: &[u8]) -> usize {
    name.len() + value.len() + 4
}

pub async fn limit_head(State(limit): State<usize>, req: Request, next: Next) -> Response {
    // The request target as sent (path and query; an absolute-form target's scheme and
    // authority too), measured without rendering the URI.
    let uri = req.uri();
    let target = uri.path_and_query().map_or(0, |p| p.as_str().len())
        + uri.authority().map_or(0, |a| a.as_str().len())
        + uri.scheme_str().map_or(0, |s| s.len() + 3);
    let size: usize =
        req.headers().iter().map(|(n, v)| wire_size(n.as_str(), v.as_bytes())).sum::<usize>() + target;
    if size > limit {
        let id = request_id(req.headers());
        tracing::info!(request_id = ?id, size, limit, "request head too large");
        return ProxyError::HeadersTooLarge { limit }.into_response();
    }
    next.run(req).await
}
