//! The two ids of a request.
//!
//! `X-Request-Id` is the client's: kept when the client sent a sane one, minted
//! otherwise, returned to the client, logged, and sent upstream so vLLM's request id
//! (`chatcmpl-<id>…`) matches the client's logs. Clients choose it, so two of them may
//! send the same one at once.
//!
//! The stream id is the proxy's own, minted for each generation and unique in this
//! process: everything that acts on one stream inside the engine (the hook's directives,
//! its think budget, EAT's forced exits) names it, never the client's id, so one client
//! cannot end or reprioritise another's thinking by reusing its id. The client sees it
//! in `X-Meridian-Stream-Id`, and both ids are in every log line of the request.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::Request;
use axum::http::{HeaderMap, HeaderName, HeaderValue};

use crate::layers::{Concern, Next, Responding};

pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The response header naming the stream id.
pub const STREAM_ID: HeaderName = HeaderName::from_static("x-meridian-stream-id");

const MAX_LEN: usize = 128;

/// The client's id if it is short printable ASCII, else a fresh UUID. Behind [`assign`]
/// a request's header already holds the id decided for it, which this returns as is.
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

/// The layer ([`crate::layers`]) that gives every request its `X-Request-Id`, once,
/// before any handler: the client's when sane, else a fresh one, written back into the
/// request's headers (so handlers, logs and the upstream all see the same id) and onto
/// every response that does not carry one, errors included.
#[derive(Clone, Copy, Debug)]
pub struct AssignIds;

impl Concern for AssignIds {
    fn around<S: Next>(&self, mut req: Request, mut next: S) -> Responding {
        let id = request_id(req.headers());
        req.headers_mut().insert(REQUEST_ID, id.clone());
        Box::pin(async move {
            let mut resp = next.call(req).await?;
            resp.headers_mut().entry(REQUEST_ID).or_insert(id);
            Ok(resp)
        })
    }
}

/// A fresh stream id: `mrd_<process nonce>_<sequence>`. The random nonce keeps ids of
/// different proxy processes (replicas, restarts) apart at a shared engine; the
/// sequence keeps this process's apart. No `-` in it: the hook reads a `-<8 hex>` tail
/// as the suffix vLLM appends to request ids and would cut it off.
pub fn mint_stream_id() -> String {
    static NONCE: OnceLock<String> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let nonce = NONCE.get_or_init(|| uuid::Uuid::new_v4().simple().to_string()[..12].to_owned());
    format!("mrd_{nonce}_{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn stream_ids_are_unique_and_survive_the_hooks_id_parsing() {
        let ids: Vec<String> = (0..10_000).map(|_| mint_stream_id()).collect();
        assert_eq!(ids.iter().collect::<HashSet<_>>().len(), ids.len());
        for id in &ids[..3] {
            assert_eq!(meridian_core::channel::base_request_id(id), id, "{id}");
            assert!(HeaderValue::from_str(id).is_ok());
        }
    }
}
