//! How a request ended, in one vocabulary: the proxy's `meridian_requests_total{outcome}`
//! label, its log lines and spans, the error `code` its failures answer with, and the
//! load tester's per-request record all use [`Outcome`], so a count in one place can be
//! matched with a count in another.

use std::fmt;

/// How a request ended: answered, left by its client, or failed (by the client's
/// request, the proxy's capacity, or an upstream).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Outcome {
    /// Answered in full (the default: nothing has failed).
    #[default]
    Ok,
    /// The client went away before the answer ended (a user who closed the tab).
    ClientDisconnected,
    /// The request was malformed, too large, too slow to arrive, or for an unknown path.
    BadRequest,
    /// No upstream serves the model it named.
    ModelNotFound,
    /// No upstream was healthy when it came.
    NoUpstream,
    /// It waited for admission longer than `admission.queue_timeout_s`.
    AdmissionTimeout,
    /// The admission queue was full.
    AdmissionQueueFull,
    /// The upstream sent no response head in time.
    UpstreamTimeout,
    /// The upstream could not be reached, or its stream broke off or carried an error.
    UpstreamError,
    /// The upstream's stream ended without its final event.
    UpstreamTruncated,
    /// The upstream answered with an error status, relayed as it was.
    UpstreamStatus,
    /// The proxy was shutting down.
    ShuttingDown,
    /// It named no tenant the proxy knows (`[tenants]`: no API key, an unknown one, no
    /// tenant header) and there is no default tenant.
    Unauthorized,
    /// Its tenant was at its concurrency or token-rate limit (`[[tenants.tenant]]`).
    RateLimited,
}

impl Outcome {
    /// Every outcome, in declaration order.
    pub const ALL: [Outcome; 14] = [
        Outcome::Ok,
        Outcome::ClientDisconnected,
        Outcome::BadRequest,
        Outcome::ModelNotFound,
        Outcome::NoUpstream,
        Outcome::AdmissionTimeout,
        Outcome::AdmissionQueueFull,
        Outcome::UpstreamTimeout,
        Outcome::UpstreamError,
        Outcome::UpstreamTruncated,
        Outcome::UpstreamStatus,
        Outcome::ShuttingDown,
        Outcome::Unauthorized,
        Outcome::RateLimited,
    ];

    /// Its label in metrics, logs and spans.
    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::ClientDisconnected => "client_disconnected",
            Outcome::BadRequest => "bad_request",
            Outcome::ModelNotFound => "model_not_found",
            Outcome::NoUpstream => "no_upstream",
            Outcome::AdmissionTimeout => "admission_timeout",
            Outcome::AdmissionQueueFull => "admission_queue_full",
            Outcome::UpstreamTimeout => "upstream_timeout",
            Outcome::UpstreamError => "upstream_error",
            Outcome::UpstreamTruncated => "upstream_truncated",
            Outcome::UpstreamStatus => "upstream_status",
            Outcome::ShuttingDown => "shutting_down",
            Outcome::Unauthorized => "unauthorized",
            Outcome::RateLimited => "rate_limited",
        }
    }

    /// The outcome a label names (the inverse of [`Outcome::as_str`]).
    pub fn from_label(label: &str) -> Option<Outcome> {
        Outcome::ALL.into_iter().find(|o| o.as_str() == label)
    }

    /// The outcome of a stream its server ended with an error event carrying this code
    /// (if any): named by the code when the proxy knows it, else the upstream's error.
    pub fn of_error_event(error_code: Option<&str>) -> Outcome {
        error_code.and_then(Outcome::of_code).unwrap_or(Outcome::UpstreamError)
    }

    /// The outcome an error `code` the proxy answers with names.
    fn of_code(code: &str) -> Option<Outcome> {
        match code {
            // The codes the proxy answers with that are not outcome labels themselves.
            "no_healthy_upstream" => Some(Outcome::NoUpstream),
            "server_shutting_down" => Some(Outcome::ShuttingDown),
            "invalid_api_key" => Some(Outcome::Unauthorized),
            "rate_limit_exceeded" => Some(Outcome::RateLimited),
            // An unknown path; a model it does not serve has its own code.
            "not_found" => Some(Outcome::BadRequest),
            code => Outcome::from_label(code),
        }
    }

    /// A failure: what a span marks as an error. A client that left is not the
    /// proxy's failure.
    pub const fn is_failure(self) -> bool {
        !matches!(self, Outcome::Ok | Outcome::ClientDisconnected)
    }

    /// The outcome of a failed request as a client sees it: from the `code` of the
    /// error object the proxy answered with (or put in the error event that ended a
    /// stream), else from the HTTP status alone. `None` for a success status without an
    /// error object.
    pub fn of_answer(status: u16, error_code: Option<&str>) -> Option<Outcome> {
        if let Some(outcome) = error_code.and_then(Outcome::of_code) {
            return Some(outcome);
        }
        match status {
            200..=299 if error_code.is_none() => None,
            200..=299 => Some(Outcome::UpstreamError),
            401 => Some(Outcome::Unauthorized),
            404 => Some(Outcome::ModelNotFound),
            429 => Some(Outcome::RateLimited),
            400..=499 => Some(Outcome::BadRequest),
            502 => Some(Outcome::UpstreamError),
            504 => Some(Outcome::UpstreamTimeout),
            _ => Some(Outcome::UpstreamStatus),
        }
    }
}

/// A label in JSON, as in the proxy's metrics.
impl serde::Serialize for Outcome {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// The error code of an error answer or event in OpenAI's shape (`{"error": {"code"}}`)
/// or the Responses API's (`{"type": "error", "code"}`), when it is text. Anthropic's
/// shape carries no code (only a coarse type), nor do vLLM's own errors (a number).
pub fn error_code(error: &serde_json::Value) -> Option<&str> {
    let inner = error.get("error").unwrap_or(error);
    inner.get("code").and_then(serde_json::Value::as_str)
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_label_reads_back_as_its_outcome() {
        for o in Outcome::ALL {
            assert_eq!(Outcome::from_label(o.as_str()), Some(o));
        }
        assert_eq!(Outcome::from_label("nope"), None);
    }

    #[test]
    fn an_answer_is_read_by_its_code_before_its_status() {
        assert_eq!(Outcome::of_answer(429, Some("admission_queue_full")), Some(Outcome::AdmissionQueueFull));
        assert_eq!(Outcome::of_answer(503, Some("no_healthy_upstream")), Some(Outcome::NoUpstream));
        assert_eq!(Outcome::of_answer(400, Some("invalid_json")), Some(Outcome::BadRequest));
        assert_eq!(Outcome::of_answer(404, Some("not_found")), Some(Outcome::BadRequest));
        assert_eq!(Outcome::of_answer(200, Some("upstream_truncated")), Some(Outcome::UpstreamTruncated));
        assert_eq!(Outcome::of_answer(500, Some("something_else")), Some(Outcome::UpstreamStatus));
        assert_eq!(Outcome::of_answer(404, None), Some(Outcome::ModelNotFound));
        assert_eq!(Outcome::of_answer(200, None), None);
        assert_eq!(Outcome::of_answer(429, Some("rate_limit_exceeded")), Some(Outcome::RateLimited));
        assert_eq!(Outcome::of_answer(429, None), Some(Outcome::RateLimited));
        assert_eq!(Outcome::of_answer(401, Some("invalid_api_key")), Some(Outcome::Unauthorized));
    }

    #[test]
    fn error_codes_are_read_in_every_apis_shape() {
        let chat = serde_json::json!({"error": {"message": "m", "type": "server_error", "code": "upstream_truncated"}});
        assert_eq!(error_code(&chat), Some("upstream_truncated"));
        let responses = serde_json::json!({"type": "error", "code": "upstream_error", "message": "m"});
        assert_eq!(error_code(&responses), Some("upstream_error"));
        let messages =
            serde_json::json!({"type": "error", "error": {"type": "overloaded_error", "message": "m"}});
        assert_eq!(error_code(&messages), None);
        let vllm = serde_json::json!({"error": {"message": "m", "type": "BadRequestError", "code": 400}});
        assert_eq!(error_code(&vllm), None);
    }

    #[test]
    fn a_client_that_left_is_not_a_failure() {
        assert!(!Outcome::Ok.is_failure());
        assert!(!Outcome::ClientDisconnected.is_failure());
        assert!(Outcome::BadRequest.is_failure());
        assert!(Outcome::UpstreamError.is_failure());
        assert!(Outcome::AdmissionQueueFull.is_failure());
    }
}
