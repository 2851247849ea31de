//! The proxy's one error type. Every failure a client can see is an OpenAI-style JSON
//! body (`{"error": {"message", "type", "param", "code"}}`) with the matching status, so
//! OpenAI SDKs raise their usual exceptions. Each error also says which side failed
//! ([`Side`]) and whether sending the request again is safe ([`ProxyError::retry_safe`]):
//! the proxy's own retries follow it, and clients and operators see both in the
//! response headers and the log line.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use meridian_core::Outcome;
use meridian_core::stream::Dialect;
use serde_json::{Value, json};

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("{message}")]
    BadRequest { message: String, param: Option<&'static str>, code: &'static str },
    #[error("request body is larger than the limit of {limit} bytes")]
    PayloadTooLarge { limit: u64 },
    #[error("the request's headers and URL are larger than the limit of {limit} bytes")]
    HeadersTooLarge { limit: usize },
    #[error("the request body did not arrive within {after_s}s")]
    RequestTimeout { after_s: f64 },
    #[error("no route {0}")]
    NotFound(String),
    #[error("The model `{0}` does not exist or is not served here.")]
    ModelNotFound(String),
    #[error("no healthy upstream is available")]
    NoHealthyUpstream,
    #[error("every upstream for this model stayed busy for {after_s}s while the request waited; retry later")]
    AdmissionTimeout { after_s: f64 },
    #[error("the proxy's admission queue is full; retry later")]
    AdmissionQueueFull,
    #[error("upstream {upstream} did not answer within {after_s}s")]
    UpstreamTimeout { upstream: String, after_s: f64 },
    /// The upstream never answered the request: the connection failed, or closed before a
    /// response head (vLLM aborts a request whose connection closes, so no copy of it is
    /// left running), or it answered 502/503 before doing any work.
    #[error("upstream {upstream} could not take the request: {reason}")]
    UpstreamUnreachable {
        upstream: String,
        reason: String,
        #[source]
        source: Option<reqwest::Error>,
    },
    /// The upstream took the request on and its answer broke.
    #[error("upstream {upstream} failed: {reason}")]
    UpstreamFailed { upstream: String, reason: String },
    #[error(
        "upstream {upstream} ended the stream before finishing it (no end marker: [DONE] or a finish_reason, response.completed, message_stop): the answer is incomplete"
    )]
    UpstreamTruncated { upstream: String },
    #[error("the proxy is shutting down and its grace period for open requests is over; retry the request")]
    ShuttingDown,
    /// The request named no tenant the proxy knows, and there is no default tenant.
    #[error("{reason}")]
    Unauthorized { reason: &'static str },
    /// Its tenant was at one of its limits; nothing went upstream.
    #[error("tenant {tenant} is at its {} limit; retry in {retry_after_s}s", limit.as_str())]
    RateLimited { tenant: String, limit: TenantLimit, retry_after_s: u64 },
}

/// Which of a tenant's limits refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TenantLimit {
    /// `max_streams`: requests open at once.
    MaxStreams = 0,
    /// `tokens_per_minute`: generated tokens a minute.
    TokensPerMinute = 1,
}

impl TenantLimit {
    pub fn as_str(self) -> &'static str {
        match self {
            TenantLimit::MaxStreams => "max_streams",
            TenantLimit::TokensPerMinute => "tokens_per_minute",
        }
    }
}

/// Which side of the proxy a failure is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The request itself, or how the client sent it.
    Client,
    /// An upstream engine: unreachable, slow, or a broken answer.
    Upstream,
    /// The proxy's own limits and lifecycle: admission, shutdown.
    Proxy,
}

impl Side {
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Client => "client",
            Side::Upstream => "upstream",
            Side::Proxy => "proxy",
        }
    }
}

/// Response headers that carry an error's side and retry-safety.
pub const ERROR_SIDE: &str = "x-meridian-error-side";
pub const RETRY_SAFE: &str = "x-meridian-retry-safe";

impl ProxyError {
    /// 404 for a model no upstream serves; the name is the client's own, shortened.
    pub fn model_not_found(model: &str) -> Self {
        let mut name: String = model.chars().take(200).collect();
        if name.len() < model.len() {
            name.push('…');
        }
        ProxyError::ModelNotFound(name)
    }

    pub fn bad_request(message: impl Into<String>, param: Option<&'static str>, code: &'static str) -> Self {
        ProxyError::BadRequest { message: message.into(), param, code }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ProxyError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::RequestTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ProxyError::HeadersTooLarge { .. } => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ProxyError::NotFound(_) | ProxyError::ModelNotFound(_) => StatusCode::NOT_FOUND,
            ProxyError::Unauthorized { .. } => StatusCode::UNAUTHORIZED,
            ProxyError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ProxyError::NoHealthyUpstream
            | ProxyError::AdmissionTimeout { .. }
            | ProxyError::AdmissionQueueFull
            | ProxyError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            ProxyError::UpstreamUnreachable { .. }
            | ProxyError::UpstreamFailed { .. }
            | ProxyError::UpstreamTruncated { .. } => StatusCode::BAD_GATEWAY,
        }
    }

    /// Which side failed.
    pub fn side(&self) -> Side {
        match self {
            ProxyError::BadRequest { .. }
            | ProxyError::PayloadTooLarge { .. }
            | ProxyError::HeadersTooLarge { .. }
            | ProxyError::RequestTimeout { .. }
            | ProxyError::NotFound(_)
            | ProxyError::ModelNotFound(_)
            | ProxyError::Unauthorized { .. }
            | ProxyError::RateLimited { .. } => Side::Client,
            ProxyError::NoHealthyUpstream
            | ProxyError::UpstreamTimeout { .. }
            | ProxyError::UpstreamUnreachable { .. }
            | ProxyError::UpstreamFailed { .. }
            | ProxyError::UpstreamTruncated { .. } => Side::Upstream,
            ProxyError::AdmissionTimeout { .. }
            | ProxyError::AdmissionQueueFull
            | ProxyError::ShuttingDown => Side::Proxy,
        }
    }

    /// Whether sending the same request again is safe and may succeed: no engine is
    /// known to be working on it (a copy would not double its load) and nothing in the
    /// request itself is wrong. A request that failed after the upstream took it on (a
    /// timeout waiting for its answer, an answer that broke) is not: the engine may still
    /// be generating it, and a streamed answer the client has partly seen cannot be
    /// resumed by sending it again.
    pub fn retry_safe(&self) -> bool {
        match self {
            // The body never arrived whole; nothing went upstream.
            ProxyError::RequestTimeout { .. } => true,
            ProxyError::NoHealthyUpstream
            | ProxyError::UpstreamUnreachable { .. }
            | ProxyError::AdmissionTimeout { .. }
            | ProxyError::AdmissionQueueFull
            | ProxyError::ShuttingDown => true,
            // Later, as its Retry-After says.
            ProxyError::RateLimited { .. } => true,
            ProxyError::Unauthorized { .. } => false,
            ProxyError::BadRequest { .. }
            | ProxyError::PayloadTooLarge { .. }
            | ProxyError::HeadersTooLarge { .. }
            | ProxyError::NotFound(_)
            | ProxyError::ModelNotFound(_)
            | ProxyError::UpstreamTimeout { .. }
            | ProxyError::UpstreamFailed { .. }
            | ProxyError::UpstreamTruncated { .. } => false,
        }
    }

    fn kind(&self) -> (&'static str, Option<&'static str>, &'static str) {
        match self {
            ProxyError::BadRequest { param, code, .. } => ("invalid_request_error", *param, code),
            ProxyError::PayloadTooLarge { .. } => ("invalid_request_error", None, "request_too_large"),
            ProxyError::RequestTimeout { .. } => ("invalid_request_error", None, "request_timeout"),
            ProxyError::HeadersTooLarge { .. } => {
                ("invalid_request_error", None, "request_headers_too_large")
            }
            ProxyError::NotFound(_) => ("invalid_request_error", None, "not_found"),
            ProxyError::ModelNotFound(_) => ("invalid_request_error", Some("model"), "model_not_found"),
            ProxyError::NoHealthyUpstream => ("server_error", None, "no_healthy_upstream"),
            ProxyError::AdmissionTimeout { .. } => ("server_error", None, "admission_timeout"),
            ProxyError::AdmissionQueueFull => ("server_error", None, "admission_queue_full"),
            ProxyError::UpstreamTimeout { .. } => ("server_error", None, "upstream_timeout"),
            ProxyError::UpstreamUnreachable { .. } | ProxyError::UpstreamFailed { .. } => {
                ("server_error", None, "upstream_error")
            }
            ProxyError::UpstreamTruncated { .. } => ("server_error", None, "upstream_truncated"),
            ProxyError::ShuttingDown => ("server_error", None, "server_shutting_down"),
            ProxyError::Unauthorized { .. } => ("invalid_request_error", None, "invalid_api_key"),
            ProxyError::RateLimited { limit: TenantLimit::MaxStreams, .. } => {
                ("requests", None, "rate_limit_exceeded")
            }
            ProxyError::RateLimited { limit: TenantLimit::TokensPerMinute, .. } => {
                ("tokens", None, "rate_limit_exceeded")
            }
        }
    }

    /// The error as a JSON body.
    pub fn body(&self) -> serde_json::Value {
        let (kind, param, code) = self.kind();
        json!({"error": {"message": self.to_string(), "type": kind, "param": param, "code": code}})
    }

    /// The error as an SSE event in the stream's own API, for streams that already
    /// started.
    /// `next_sequence` numbers the event on the Responses API (see [`error_event`]).
    pub fn sse_event(&self, dialect: Dialect, next_sequence: u64) -> bytes::Bytes {
        let mut body = self.body();
        error_event(dialect, body["error"].take(), next_sequence)
    }

    /// The outcome this error is counted under.
    pub fn outcome(&self) -> Outcome {
        match self {
            ProxyError::BadRequest { .. }
            | ProxyError::PayloadTooLarge { .. }
            | ProxyError::RequestTimeout { .. }
            | ProxyError::HeadersTooLarge { .. }
            | ProxyError::NotFound(_) => Outcome::BadRequest,
            ProxyError::ModelNotFound(_) => Outcome::ModelNotFound,
            ProxyError::NoHealthyUpstream => Outcome::NoUpstream,
            ProxyError::AdmissionTimeout { .. } => Outcome::AdmissionTimeout,
            ProxyError::AdmissionQueueFull => Outcome::AdmissionQueueFull,
            ProxyError::UpstreamTimeout { .. } => Outcome::UpstreamTimeout,
            ProxyError::UpstreamUnreachable { .. } | ProxyError::UpstreamFailed { .. } => {
                Outcome::UpstreamError
            }
            ProxyError::UpstreamTruncated { .. } => Outcome::UpstreamTruncated,
            ProxyError::ShuttingDown => Outcome::ShuttingDown,
            ProxyError::Unauthorized { .. } => Outcome::Unauthorized,
            ProxyError::RateLimited { .. } => Outcome::RateLimited,
        }
    }
}

impl IntoResponse for ProxyError {
    fn into_response(self) -> Response {
        self.into_response_in(Dialect::Chat)
    }
}

impl ProxyError {
    /// The error answered in the shape of the API the request spoke: OpenAI's
    /// `{"error": {...}}`, or on the Messages API Anthropic's `{"type": "error",
    /// "error": {"type", "message"}}`, as vLLM answers there too.
    pub fn into_response_in(self, dialect: Dialect) -> Response {
        let headers = [
            (ERROR_SIDE, HeaderValue::from_static(self.side().as_str())),
            (RETRY_SAFE, HeaderValue::from_static(if self.retry_safe() { "true" } else { "false" })),
        ];
        let mut body = self.body();
        if dialect == Dialect::Messages {
            body = anthropic_error(&body["error"]);
        }
        let mut resp = (self.status(), headers, axum::Json(body)).into_response();
        if let ProxyError::RateLimited { retry_after_s, .. } = self {
            resp.headers_mut().insert(axum::http::header::RETRY_AFTER, HeaderValue::from(retry_after_s));
        }
        resp
    }
}

/// The event that ends a broken stream, in its API's own shape, so that API's client
/// library raises (or reports an error event) instead of waiting: `error` is an
/// OpenAI-style error object (`message`, `type`, `param`, `code`).
///
/// - chat and completions: a `data:` line with `{"error": ...}`, then `[DONE]`;
/// - Responses: an `error` event (`type`, `code`, `message`, `param`), as OpenAI sends,
///   numbered `next_sequence`, the number after the upstream's last event;
/// - Messages: an `error` event with Anthropic's `{"type": "error", "error": {...}}`.
pub fn error_event(dialect: Dialect, error: Value, next_sequence: u64) -> bytes::Bytes {
    let text = match dialect {
        Dialect::Chat => format!("data: {}\n\ndata: [DONE]\n\n", json!({ "error": error })),
        Dialect::Responses => {
            let event = json!({
                "type": "error",
                "code": error["code"],
                "message": error["message"],
                "param": error["param"],
                "sequence_number": next_sequence,
            });
            format!("event: error\ndata: {event}\n\n")
        }
        Dialect::Messages => format!("event: error\ndata: {}\n\n", anthropic_error(&error)),
    };
    bytes::Bytes::from(text)
}

/// An OpenAI-style error object in Anthropic's shape: `{"type": "error", "error": {"type",
/// "message"}}`.
fn anthropic_error(error: &Value) -> Value {
    json!({"type": "error", "error": {"type": anthropic_error_type(error), "message": error["message"]}})
}

/// Anthropic's error type for an OpenAI-style error object: an overloaded proxy or
/// engine is `overloaded_error` (the type Anthropic's API answers with HTTP 529, which
/// its client retries when it comes as a status), other server failures `api_error`.
fn anthropic_error_type(error: &Value) -> &'static str {
    let code = error["code"].as_str().unwrap_or_default();
    match error["type"].as_str().unwrap_or_default() {
        // Already Anthropic's (an error a Messages answer carried).
        "overloaded_error" => "overloaded_error",
        "not_found_error" => "not_found_error",
        "timeout_error" => "timeout_error",
        "rate_limit_error" => "rate_limit_error",
        "authentication_error" => "authentication_error",
        "permission_error" => "permission_error",
        _ if matches!(code, "admission_queue_full" | "admission_timeout" | "no_healthy_upstream") => {
            "overloaded_error"
        }
        _ if code == "rate_limit_exceeded" => "rate_limit_error",
        _ if code == "invalid_api_key" => "authentication_error",
        "invalid_request_error" if code.ends_with("not_found") => "not_found_error",
        "invalid_request_error" => "invalid_request_error",
        _ if code == "upstream_timeout" => "timeout_error",
        _ => "api_error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header<'a>(resp: &'a Response, name: &str) -> &'a str {
        resp.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("absent")
    }

    #[test]
    fn a_response_says_which_side_failed_and_whether_to_retry() {
        let cases = [
            (ProxyError::bad_request("no", None, "invalid_json"), "client", "false"),
            (ProxyError::RequestTimeout { after_s: 30.0 }, "client", "true"),
            (ProxyError::AdmissionQueueFull, "proxy", "true"),
            (
                ProxyError::UpstreamUnreachable {
                    upstream: "a".into(),
                    reason: "answered 503".into(),
                    source: None,
                },
                "upstream",
                "true",
            ),
            (ProxyError::UpstreamTimeout { upstream: "a".into(), after_s: 1.0 }, "upstream", "false"),
            (
                ProxyError::UpstreamFailed { upstream: "a".into(), reason: "broke".into() },
                "upstream",
                "false",
            ),
        ];
        for (err, side, retry) in cases {
            let what = err.to_string();
            let resp = err.into_response();
            assert_eq!((header(&resp, ERROR_SIDE), header(&resp, RETRY_SAFE)), (side, retry), "{what}");
        }
    }

    #[test]
    fn an_unreachable_upstream_keeps_its_cause() {
        let err = ProxyError::UpstreamUnreachable { upstream: "a".into(), reason: "x".into(), source: None };
        assert!(std::error::Error::source(&err).is_none());
        // The client sees the same code either way: the split is for retries and logs.
        let failed = ProxyError::UpstreamFailed { upstream: "a".into(), reason: "x".into() };
        assert_eq!(err.body()["error"]["code"], failed.body()["error"]["code"]);
        assert_eq!((err.status(), err.outcome()), (failed.status(), failed.outcome()));
    }

    #[test]
    fn a_broken_stream_ends_in_its_apis_own_error_event() {
        let err = ProxyError::AdmissionQueueFull;
        let chat = String::from_utf8(err.sse_event(Dialect::Chat, 0).to_vec()).unwrap();
        assert!(chat.starts_with("data: {\"error\":") && chat.ends_with("data: [DONE]\n\n"), "{chat}");
        let data = |text: &str| -> Value {
            let (event, data) = text.trim_end().split_once('\n').unwrap();
            assert_eq!(event, "event: error");
            serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap()
        };
        let responses = data(std::str::from_utf8(&err.sse_event(Dialect::Responses, 7)).unwrap());
        assert_eq!(
            (&responses["type"], &responses["code"], &responses["sequence_number"]),
            (&json!("error"), &json!("admission_queue_full"), &json!(7))
        );
        let messages = data(std::str::from_utf8(&err.sse_event(Dialect::Messages, 0)).unwrap());
        assert_eq!(messages["error"]["type"], "overloaded_error", "a full queue is an overload");
        let truncated = ProxyError::UpstreamTruncated { upstream: "u".into() };
        let messages = data(std::str::from_utf8(&truncated.sse_event(Dialect::Messages, 0)).unwrap());
        assert_eq!(messages["error"]["type"], "api_error");
    }
}
