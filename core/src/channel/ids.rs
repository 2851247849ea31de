//! vLLM derives its internal request id from the `X-Request-Id` the proxy sends:
//! `chatcmpl-<id>` or `cmpl-<id>` at the API server, then `-<8 hex>` appended by the
//! engine so retries never collide. Requests sent by the proxy carry its stream id
//! (`vllm_xargs.meridian_request_id`), which directives name; this is for the rest.

/// The proxy's request id inside a vLLM engine request id. Ids that do not have vLLM's
/// shape come back unchanged, so a directive keyed by the engine's own id also works.
pub fn base_request_id(engine_id: &str) -> &str {
    let id =
        engine_id.strip_prefix("chatcmpl-").or_else(|| engine_id.strip_prefix("cmpl-")).unwrap_or(engine_id);
    match id.rsplit_once('-') {
        Some((base, suffix))
            if !base.is_empty() && suffix.len() == 8 && suffix.bytes().all(|b| b.is_ascii_hexdigit()) =>
        {
            base
        }
        _ => id,
    }
}

#[cfg(test)]
mod tests {
    use super::base_request_id;

    #[test]
    fn strips_vllm_prefix_and_suffix() {
        assert_eq!(base_request_id("chatcmpl-abc-123-0a1b2c3d"), "abc-123");
        assert_eq!(base_request_id("cmpl-req7-deadbeef"), "req7");
        assert_eq!(base_request_id("chatcmpl-plain"), "plain");
        assert_eq!(base_request_id("own-id"), "own-id");
        assert_eq!(base_request_id("x-0a1b2c3g"), "x-0a1b2c3g", "not hex: kept");
        assert_eq!(base_request_id("-0a1b2c3d"), "-0a1b2c3d", "no base: kept");
    }
}
