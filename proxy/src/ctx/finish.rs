//! A generation request's end, recorded in one place whichever way it ended: the client
//! left before a response, the request failed before one could start, or its response
//! ended (relayed whole or streamed, completed or not). Each way is noticed where it
//! happens (the handler's guard, the handler's error, the relay's observer), and exactly
//! one of them calls [`Arrival::finish`]: it writes the outcome for the layer that counts
//! it (`crate::telemetry::outcomes`), marks the span, and writes the one log line.

use meridian_core::Outcome;

use super::Arrival;
use crate::error::ProxyError;
use crate::telemetry::RequestTimings;

/// How a request ended.
pub enum End<'a> {
    /// Its client left while it waited for admission or for the upstream's response head.
    LeftEarly,
    /// It failed before a response could start: answered with this error.
    Failed(&'a ProxyError),
    /// Its response ended.
    Answered {
        outcome: Outcome,
        /// The upstream that answered.
        upstream: &'a str,
        /// The model family's name.
        family: &'a str,
        timings: &'a RequestTimings,
    },
}

impl Arrival {
    /// Records the request's end (see the module's text). The span's phase events,
    /// token counts and timings are the relay's (`relay::observer`), which ends it.
    pub fn finish(&self, end: End<'_>) {
        let (span, route) = (&self.span, self.route.as_str());
        match end {
            End::LeftEarly => {
                let outcome = Outcome::ClientDisconnected;
                let waited_ms = self.started.elapsed().as_secs_f64() * 1e3;
                span.record("meridian.outcome", outcome.as_str());
                tracing::info!(parent: span, request_id = ?self.request_id, route,
                    outcome = outcome.as_str(), waited_ms, "client left before the response");
                // Counted by the outcome layer, when the response (or the handler) is gone.
                self.outcome.set_if_unset(outcome);
            }
            End::Failed(e) => {
                let outcome = e.outcome();
                crate::telemetry::spans::fail(span, outcome.as_str());
                span.record("meridian.outcome", outcome.as_str());
                span.record("http.response.status_code", i64::from(e.status().as_u16()));
                tracing::info!(request_id = ?self.request_id, route, outcome = outcome.as_str(),
                    side = e.side().as_str(), retry_safe = e.retry_safe(), error = %e, "request failed");
                self.outcome.set(outcome);
            }
            End::Answered { outcome, upstream, family, timings } => {
                // The last word: a stream's end over anything said at its headers.
                self.outcome.set(outcome);
                let ms = |d: Option<std::time::Duration>| d.map(|d| d.as_secs_f64() * 1e3);
                // Its parent is the request span, so a JSON log line carries the trace's ids.
                tracing::info!(
                    parent: span,
                    request_id = %self.request_id_text,
                    stream_id = %self.stream_id,
                    upstream = %upstream,
                    route,
                    family,
                    outcome = outcome.as_str(),
                    ttft_ms = ms(timings.time_to_first_token),
                    ttfo_ms = ms(timings.time_to_first_output),
                    ttot_ms = ms(timings.think_to_output_gap),
                    e2e_ms = timings.end_to_end.as_secs_f64() * 1e3,
                    think_tokens = timings.think_tokens,
                    output_tokens = timings.output_tokens,
                    "request finished"
                );
            }
        }
    }
}
