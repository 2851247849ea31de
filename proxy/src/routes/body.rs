//! Reading and checking request bodies.

use std::borrow::Cow;

use axum::body::Body;
use axum::http::{HeaderMap, header};
use bytes::Bytes;
use meridian_core::Phase;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::error::ProxyError;

/// Reads the whole body, refusing more than `limit` bytes (early, from Content-Length,
/// when the client declared it).
pub async fn read_body(body: Body, headers: &HeaderMap, limit: u64) -> Result<Bytes, ProxyError> {
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(ProxyError::PayloadTooLarge { limit });
    }
    let max = usize::try_from(limit).unwrap_or(usize::MAX);
    axum::body::to_bytes(body, max).await.map_err(|e| {
        if caused_by_length_limit(&e) {
            ProxyError::PayloadTooLarge { limit }
        } else {
            ProxyError::bad_request(format!("could not read the request body: {e}"), None, "invalid_body")
        }
    })
}

fn caused_by_length_limit(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        cur = err.source();
    }
    false
}

#[derive(Deserialize)]
struct RequestView<'a> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    /// Checked for type only; the response's content type decides how it is relayed.
    #[serde(default, rename = "stream")]
    _stream: Option<bool>,
    #[serde(default)]
    chat_template_kwargs: Option<TemplateKwargs>,
}

#[derive(Deserialize)]
struct TemplateKwargs {
    #[serde(default)]
    enable_thinking: Option<bool>,
}

/// What the proxy needs to know about a generation request.
#[derive(Debug)]
pub struct GenerationRequest<'a> {
    pub model: Cow<'a, str>,
    /// Set when the request turned thinking off (`chat_template_kwargs.enable_thinking`).
    pub initial_phase: Option<Phase>,
}

impl<'a> GenerationRequest<'a> {
    pub fn parse(body: &'a [u8]) -> Result<Self, ProxyError> {
        // serde would also read a struct from a JSON array, positionally.
        if body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
            return Err(ProxyError::bad_request("request body must be a JSON object", None, "invalid_json"));
        }
        let view: RequestView<'a> = serde_json::from_slice(body).map_err(|e| {
            let message = if e.is_syntax() || e.is_eof() {
                format!("request body is not valid JSON: {e}")
            } else {
                format!("request body must be a JSON object with the OpenAI request fields: {e}")
            };
            ProxyError::bad_request(message, None, "invalid_json")
        })?;
        let raw = view.model.ok_or_else(|| {
            ProxyError::bad_request("you must provide a model parameter", Some("model"), "missing_model")
        })?;
        let model: Cow<'a, str> = serde_json::from_str(raw.get())
            .map_err(|_| ProxyError::bad_request("model must be a string", Some("model"), "invalid_model"))?;
        if model.is_empty() {
            return Err(ProxyError::bad_request("model must not be empty", Some("model"), "invalid_model"));
        }
        let thinking_off = view.chat_template_kwargs.and_then(|k| k.enable_thinking) == Some(false);
        Ok(GenerationRequest { model, initial_phase: thinking_off.then_some(Phase::Output) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(body: &str) -> String {
        match GenerationRequest::parse(body.as_bytes()) {
            Err(ProxyError::BadRequest { code, .. }) => code.to_owned(),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn rejects_bad_input_with_specific_codes() {
        assert_eq!(code("{"), "invalid_json");
        assert_eq!(code("[]"), "invalid_json");
        assert_eq!(code(r#"{"messages":[]}"#), "missing_model");
        assert_eq!(code(r#"{"model":7}"#), "invalid_model");
        assert_eq!(code(r#"{"model":""}"#), "invalid_model");
        assert_eq!(code(r#"{"model":"m","stream":"yes"}"#), "invalid_json");
    }

    #[test]
    fn reads_model_stream_and_thinking_switch() {
        let r = GenerationRequest::parse(
            br#"{"model":"a\"b","stream":true,"x":{"y":1},"chat_template_kwargs":{"enable_thinking":false}}"#,
        )
        .unwrap();
        assert_eq!(r.model, "a\"b");
        assert_eq!(r.initial_phase, Some(Phase::Output));
    }
}
