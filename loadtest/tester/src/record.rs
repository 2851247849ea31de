//! One request's measurements, computed from the bytes as they arrived.
//!
//! The timings (TTFT, TTFO, TTOT, ITL, output ITL, the largest answer gap, TPOT) are
//! `meridian_core::timings`', the definitions the proxy's metrics and the twin use too;
//! every time is taken when a network chunk arrives, before it is parsed.

use std::sync::Arc;

use meridian_core::models::ModelFamily;
use meridian_core::stream::{Dialect, SseDecoder, Usage};
use meridian_core::timings::{self, Arrived, Timeline};
use meridian_core::{Delta, Outcome, PhaseRouter};
use serde::Serialize;

/// What one request measured. Times are seconds from when the request was sent.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct RequestRecord {
    pub index: usize,
    /// Seconds from the start of the run to when this request was sent.
    pub sent_at: f64,
    pub ok: bool,
    /// How it ended, in the proxy's vocabulary (`meridian_requests_total{outcome}`): read
    /// from the error's `code` when the server gave one, else from its status.
    pub outcome: Outcome,
    pub error: Option<String>,
    pub ttft: Option<f64>,
    pub ttfo: Option<f64>,
    pub think_to_output: Option<f64>,
    pub e2e: Option<f64>,
    pub tpot: Option<f64>,
    /// Gaps between token-carrying chunks, in arrival order.
    pub itl: Vec<f64>,
    /// The gaps among them that were between output-phase chunks.
    pub output_itl: Vec<f64>,
    /// The largest of `output_itl`: the longest the reader waited mid-answer.
    pub max_output_gap: Option<f64>,
    /// Arrival time of every token-carrying chunk, from when the request was sent (the
    /// raw data behind TTFT and ITL, used by `meridian-sim calibrate`).
    pub token_times: Vec<f64>,
    /// The server's count from `usage` when it sent one, else the tester's estimate.
    pub prompt_tokens: Option<u32>,
    /// From the server's `usage`, when it sent one.
    pub usage_think_tokens: Option<u32>,
    pub usage_output_tokens: Option<u32>,
    /// Counted by the client, one per token-carrying chunk (or per token id).
    pub client_think_tokens: u32,
    pub client_output_tokens: u32,
    /// Prompt tokens the server's prefix cache held when it took the request up (vLLM's
    /// `usage.prompt_tokens_details.cached_tokens`, sent with
    /// `--enable-prompt-tokens-details`); `None` when the server did not say.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u32>,
    /// In a multi-turn run: which conversation, and which of its turns (0 first).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conversation: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turn: Option<u32>,
}

impl RequestRecord {
    /// Completion tokens: the server's count when it gave one, else the client's.
    pub fn completion_tokens(&self) -> u32 {
        match (self.usage_think_tokens, self.usage_output_tokens) {
            (Some(t), Some(o)) => t + o,
            _ => self.client_think_tokens + self.client_output_tokens,
        }
    }

    pub fn think_tokens(&self) -> u32 {
        self.usage_think_tokens.unwrap_or(self.client_think_tokens)
    }

    pub fn output_tokens(&self) -> u32 {
        self.usage_output_tokens.unwrap_or(self.client_output_tokens)
    }
}

/// Builds a record from timestamped network chunks.
pub struct RecordBuilder {
    /// The API the answer speaks, which decides how its events are read.
    dialect: Dialect,
    record: RequestRecord,
    decoder: SseDecoder,
    router: PhaseRouter,
    /// Seconds from the send, so the request's times are read off its timeline as they
    /// are recorded.
    timeline: Timeline<f64>,
    usage: Option<Usage>,
    /// The server (or a proxy) ended the stream with an error event: a failed request,
    /// whatever tokens came before it.
    stream_error: Option<String>,
    /// How the request failed, when the server said (an error status or event).
    failure: Option<Outcome>,
    /// The answer's text as the server sent it in `content`, kept only for a
    /// conversation's next turn (`keep_answer`): nothing is copied otherwise.
    answer: Option<String>,
}

impl RecordBuilder {
    pub fn new(index: usize, sent_at: f64, family: Option<Arc<ModelFamily>>, dialect: Dialect) -> Self {
        RecordBuilder {
            dialect,
            record: RequestRecord { index, sent_at, ..Default::default() },
            decoder: SseDecoder::new(),
            router: PhaseRouter::new(family),
            timeline: Timeline::new(0.0),
            usage: None,
            stream_error: None,
            failure: None,
            answer: None,
        }
    }

    /// Keeps the answer's text (the `content` deltas, which a reasoning parser keeps
    /// apart from the thinking, as a chat client builds its history from
    /// `message.content`), for `finish_with_answer`.
    pub fn keep_answer(mut self) -> Self {
        self.answer = Some(String::new());
        self
    }

    /// The server answered with an error `status`, `body` its error object (if JSON).
    pub fn answered_error(&mut self, status: u16, body: &[u8]) {
        let error = serde_json::from_slice::<serde_json::Value>(body).ok();
        let code = error.as_ref().and_then(meridian_core::outcome::error_code);
        self.failure = Outcome::of_answer(status, code);
    }

    /// A network chunk arrived `at` seconds after the request was sent.
    pub fn on_chunk(&mut self, at: f64, bytes: &[u8]) {
        // The decoder hands out payloads borrowed from `bytes`; take it out of `self` so
        // each payload can be measured in place, without copies.
        let mut decoder = std::mem::take(&mut self.decoder);
        decoder.feed(bytes, |p| self.on_payload(at, p));
        self.decoder = decoder;
    }

    fn on_payload(&mut self, at: f64, payload: &[u8]) {
        let read = self.dialect.parse(payload, |c| {
            if c.upstream_error && self.stream_error.is_none() {
                self.stream_error = Some("the stream ended with an error event".to_owned());
                // Read again, once, for its code: error events are rare.
                let error = serde_json::from_slice::<serde_json::Value>(payload).ok();
                let code = error.as_ref().and_then(meridian_core::outcome::error_code);
                self.failure = Some(Outcome::of_error_event(code));
            }
            if c.index == 0 {
                self.on_delta(at, c.reasoning.as_deref(), c.content.as_deref(), c.token_ids.as_deref());
            }
        });
        if let Some(u) = read.and_then(|r| r.usage) {
            self.usage = Some(u);
        }
    }

    fn on_delta(&mut self, at: f64, reasoning: Option<&str>, content: Option<&str>, ids: Option<&[u32]>) {
        let has_token = reasoning.is_some_and(|s| !s.is_empty())
            || content.is_some_and(|s| !s.is_empty())
            || ids.is_some_and(|t| !t.is_empty());
        if !has_token {
            return;
        }
        if let (Some(answer), Some(text)) = (self.answer.as_mut(), content) {
            answer.push_str(text);
        }
        let before = (self.router.think_tokens(), self.router.output_tokens());
        let events = self.router.observe(Delta { reasoning, content, token_ids: ids });
        let gaps = self.timeline.tokens(at, Arrived::read(&self.router, before, &events));
        self.record.itl.extend(gaps.itl);
        self.record.output_itl.extend(gaps.output_itl);
        self.record.token_times.push(at);
    }

    /// A whole non-streaming body arrived at `at`.
    pub fn on_body(&mut self, at: f64, body: &[u8]) {
        self.on_payload(at, body);
    }

    /// As `finish`, with the answer's text (empty unless `keep_answer` was asked).
    pub fn finish_with_answer(mut self, at: f64, error: Option<String>) -> (RequestRecord, String) {
        let answer = self.answer.take().unwrap_or_default();
        (self.finish(at, error), answer)
    }

    /// The response ended at `at` (ok) or failed.
    pub fn finish(mut self, at: f64, error: Option<String>) -> RequestRecord {
        let error = error.or(self.stream_error.take());
        let events = self.router.finish();
        self.timeline.marks(at, Arrived::released(&events));
        let r = &mut self.record;
        r.client_think_tokens = self.router.think_tokens();
        r.client_output_tokens = self.router.output_tokens();
        if let Some(u) = self.usage {
            let think = u.reasoning_tokens.unwrap_or(r.client_think_tokens.min(u.completion_tokens));
            r.usage_think_tokens = Some(think);
            r.usage_output_tokens = Some(u.completion_tokens.saturating_sub(think));
            r.prompt_tokens = u.prompt_tokens;
            r.cached_tokens = u.cached_tokens;
        }
        let t = &self.timeline;
        (r.ttft, r.ttfo, r.think_to_output) = (t.ttft(), t.ttfo(), t.ttot());
        r.max_output_gap = t.largest_answer_gap();
        r.ok = error.is_none() && r.ttft.is_some();
        // A failure the server did not name (a broken connection, no token at all) is
        // counted as the upstream's, as the proxy counts it.
        r.outcome = if r.ok { Outcome::Ok } else { self.failure.unwrap_or(Outcome::UpstreamError) };
        r.error = error.or_else(|| r.ttft.is_none().then(|| "no token received".to_owned()));
        r.e2e = Some(at);
        r.tpot = r.ttft.and_then(|ttft| timings::tpot(ttft, at, r.completion_tokens()));
        self.record
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_core::ModelRegistry;

    fn chunk(field: &str, text: &str) -> String {
        format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"{field}\":{}}}}}]}}\n\n",
            serde_json::json!(text)
        )
    }

    /// A stream with known timing: role chunk at 0.1 s, reasoning at 0.2, 0.3, 0.4, a
    /// whitespace answer chunk at 0.5, visible answer at 0.7 and 0.8, usage and end at 0.9.
    #[test]
    fn metric_definitions_on_a_stream_with_known_answers() {
        let family = ModelRegistry::builtin().unwrap().get("qwen3").cloned();
        let mut b = RecordBuilder::new(0, 0.0, family, Dialect::Chat);
        b.on_chunk(0.1, chunk("content", "").as_bytes());
        b.on_chunk(0.2, chunk("reasoning", "a").as_bytes());
        b.on_chunk(0.3, chunk("reasoning", "b").as_bytes());
        b.on_chunk(0.4, chunk("reasoning", "c").as_bytes());
        b.on_chunk(0.5, chunk("content", "\n\n").as_bytes());
        b.on_chunk(0.7, chunk("content", "Hi").as_bytes());
        let last = chunk("content", "!")
            + "data: {\"choices\":[],\"usage\":{\"completion_tokens\":6,\"completion_tokens_details\":{\"reasoning_tokens\":3}}}\n\ndata: [DONE]\n\n";
        b.on_chunk(0.8, last.as_bytes());
        let r = b.finish(0.9, None);
        let close = |a: Option<f64>, b: f64| (a.unwrap() - b).abs() < 1e-12;
        assert!(r.ok);
        assert_eq!(r.outcome, Outcome::Ok);
        assert!(close(r.ttft, 0.2), "first token of any kind");
        assert!(close(r.ttfo, 0.7), "first visible output, not the whitespace");
        assert!(close(r.think_to_output, 0.3), "from the last reasoning chunk at 0.4");
        assert!(close(r.e2e, 0.9));
        assert!(close(r.tpot, (0.9 - 0.2) / 5.0), "vLLM's TPOT");
        let itl: Vec<f64> = r.itl.iter().map(|x| (x * 10.0).round() / 10.0).collect();
        assert_eq!(itl, vec![0.1, 0.1, 0.1, 0.2, 0.1]);
        let out: Vec<f64> = r.output_itl.iter().map(|x| (x * 10.0).round() / 10.0).collect();
        assert_eq!(out, vec![0.2, 0.1], "gaps between output chunks only");
        assert!(close(r.max_output_gap, 0.2), "the longest wait mid-answer");
        assert_eq!((r.usage_think_tokens, r.usage_output_tokens), (Some(3), Some(3)));
        assert_eq!((r.client_think_tokens, r.client_output_tokens), (3, 3));
    }

    #[test]
    fn a_stream_that_breaks_is_an_error_with_what_was_measured() {
        let mut b = RecordBuilder::new(3, 1.5, None, Dialect::Chat);
        b.on_chunk(0.25, chunk("content", "x").as_bytes());
        let r = b.finish(0.3, Some("connection reset".into()));
        assert!(!r.ok);
        assert_eq!(r.ttft, Some(0.25));
        assert_eq!(r.error.as_deref(), Some("connection reset"));
        assert_eq!(r.outcome, Outcome::UpstreamError, "a failure nobody named is the upstream's");
        let r = RecordBuilder::new(4, 0.0, None, Dialect::Chat).finish(1.0, None);
        assert!(!r.ok, "an empty answer is not a success");
        assert_eq!(r.outcome, Outcome::UpstreamError);
    }

    #[test]
    fn a_stream_that_ends_in_an_error_event_failed() {
        // A proxy's or vLLM's error event after some tokens, then the end marker: the
        // connection closed cleanly, but the answer is not whole.
        let mut b = RecordBuilder::new(0, 0.0, None, Dialect::Chat);
        b.on_chunk(0.1, chunk("content", "x").as_bytes());
        b.on_chunk(
            0.2,
            b"data: {\"error\":{\"message\":\"upstream went silent\",\"code\":\"upstream_timeout\"}}\n\n",
        );
        b.on_chunk(0.2, b"data: [DONE]\n\n");
        let r = b.finish(0.3, None);
        assert!(!r.ok);
        assert_eq!(r.error.as_deref(), Some("the stream ended with an error event"));
        assert_eq!(r.outcome, Outcome::UpstreamTimeout, "named by the event's code");
        let mut b = RecordBuilder::new(1, 0.0, None, Dialect::Responses);
        b.on_chunk(0.1, b"event: error\ndata: {\"type\":\"error\",\"code\":\"upstream_truncated\",\"message\":\"cut\",\"sequence_number\":3}\n\n");
        let r = b.finish(0.2, None);
        assert!(!r.ok);
        assert_eq!(r.outcome, Outcome::UpstreamTruncated);
    }

    #[test]
    fn an_error_answer_is_counted_under_the_proxys_outcome() {
        let mut b = RecordBuilder::new(0, 0.0, None, Dialect::Chat);
        let body = br#"{"error":{"message":"full","type":"server_error","param":null,"code":"admission_queue_full"}}"#;
        b.answered_error(503, body);
        let r = b.finish(0.01, Some("HTTP 503".into()));
        assert_eq!((r.ok, r.outcome), (false, Outcome::AdmissionQueueFull));
        // vLLM's own errors carry a number for a code: read by the status.
        let mut b = RecordBuilder::new(1, 0.0, None, Dialect::Chat);
        b.answered_error(400, br#"{"error":{"message":"bad","type":"BadRequestError","code":400}}"#);
        assert_eq!(b.finish(0.01, Some("HTTP 400".into())).outcome, Outcome::BadRequest);
        let mut b = RecordBuilder::new(2, 0.0, None, Dialect::Messages);
        b.answered_error(504, b"not json");
        assert_eq!(b.finish(0.01, Some("HTTP 504".into())).outcome, Outcome::UpstreamTimeout);
    }

    #[test]
    fn events_split_across_network_chunks_are_timed_at_completion() {
        let mut b = RecordBuilder::new(0, 0.0, None, Dialect::Chat);
        let c = chunk("content", "hello");
        let (a, z) = c.as_bytes().split_at(20);
        b.on_chunk(0.1, a);
        b.on_chunk(0.4, z);
        let r = b.finish(0.5, None);
        assert_eq!(r.ttft, Some(0.4));
    }
}
