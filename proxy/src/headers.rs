//! Which headers cross the proxy. Hop-by-hop headers (RFC 9110 §7.6.1) describe one
//! connection and never travel on; `Authorization` stays at the proxy unless the operator
//! asked to forward it, so client credentials do not leak to the engines.

use axum::http::header::{self, HeaderMap, HeaderName};

const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    HeaderName::from_static("keep-alive"),
];

/// Headers named in `Connection` are hop-by-hop too.
fn connection_listed(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect()
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for name in connection_listed(headers) {
        headers.remove(name);
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
}

/// The client's headers as they should reach an upstream.
pub fn upstream_request_headers(client: &HeaderMap, forward_authorization: bool) -> HeaderMap {
    let mut out = client.clone();
    strip_hop_by_hop(&mut out);
    // The HTTP client sets these for the upstream connection and body.
    out.remove(header::HOST);
    out.remove(header::CONTENT_LENGTH);
    // Compression would hide the stream from the phase tracker.
    out.remove(header::ACCEPT_ENCODING);
    if !forward_authorization {
        out.remove(header::AUTHORIZATION);
    }
    out
}

/// An upstream's response headers as they should reach the client.
pub fn client_response_headers(upstream: &HeaderMap) -> HeaderMap {
    let mut out = upstream.clone();
    strip_hop_by_hop(&mut out);
    out
}

/// vLLM's per-request priority header (lower runs first).
pub const VLLM_PRIORITY: &str = "x-vllm-priority";

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn drops_hop_by_hop_and_connection_listed_headers() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive, x-secret-hop"));
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer client"));
        h.insert("x-custom", HeaderValue::from_static("kept"));
        let out = upstream_request_headers(&h, false);
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out["x-custom"], "kept");
        let out = upstream_request_headers(&h, true);
        assert_eq!(out[header::AUTHORIZATION], "Bearer client");
    }
}
