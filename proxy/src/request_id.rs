//! `X-Request-Id`: kept when the client sent a sane one, minted otherwise, and always sent
//! upstream so vLLM's request id (`chatcmpl-<id>…`) matches the proxy's logs and metrics.

use axum::http::{HeaderMap, HeaderName, HeaderValue};

pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

const MAX_LEN: usize = 128;

/// The client's id if it is short printable ASCII, else a fresh UUID.
pub fn request_id(headers: &HeaderMap) -> HeaderValue {
    headers
        .get(&REQUEST_ID)
        .filter(|v| {
            let b = v.as_bytes();
            !b.is_empty() && b.len() <= MAX_LEN && b.iter().all(|c| c.is_ascii_graphic())
        })
        .cloned()
        .unwrap_or_else(|| {
            let id = uuid::Uuid::new_v4().simple().to_string();
            HeaderValue::from_str(&id).unwrap_or_else(|_| HeaderValue::from_static("invalid"))
        })
}
