//! Heartbeats: an SSE comment (`: keep-alive`) on a streamed response silent for
//! `server.sse_heartbeat_s`, so that load balancers and other intermediaries with idle
//! timeouts (60 s is common) do not cut a reasoning model's stream while it waits for
//! admission, prefills a long prompt, thinks without streaming it, or sits between two
//! continuation legs.
//!
//! A streamed request that has no response after one interval (still queued, or its
//! upstream has not sent headers) gets `200` and `text/event-stream` at once, then
//! heartbeats. From then on a failure can no longer change the status, so it arrives as
//! an error event in the stream's API (see [`crate::error::error_event`]), the same way
//! a stream that breaks later ends; the event carries the body the client would otherwise have had
//! (the proxy's error, or the upstream's). Answers that start within one interval keep
//! their real status codes.
//!
//! A comment goes out only at a line boundary (the relay forwards whole lines). Between
//! events it is followed by a blank line; inside an open event it is one line, which SSE
//! parsers skip without ending the event.
//!
//! The relay's last stage is the [`Heartbeat`]; before there is a response to relay, the
//! same stage wraps the early response's stream ([`Heartbeats`]).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use meridian_core::stream::Dialect;
use tokio::time::Instant;

use super::silence::Silence;
use super::stage::{Flow, RelayStage, Relayed};
use super::tail::Tail;

const BETWEEN_EVENTS: &[u8] = b": keep-alive\n\n";
const INSIDE_AN_EVENT: &[u8] = b": keep-alive\n";

/// Longest error body from a response that resolved after early headers that is read
/// into the error event; bodies here are the proxy's or an upstream's error JSON.
const ERROR_BODY_LIMIT: usize = 64 * 1024;

/// The heartbeat stage: the relay's last, so it sees every byte the client gets.
pub struct Heartbeat {
    quiet: Silence,
    tail: Tail,
}

impl Heartbeat {
    pub fn new(every: Duration) -> Self {
        Heartbeat { quiet: Silence::new(every), tail: Tail::default() }
    }

    /// These bytes went to the client at `at`: the silence starts again.
    fn sent(&mut self, bytes: &[u8], at: Instant) {
        self.tail.push(bytes);
        self.quiet.heard(at);
    }

    /// A comment, once the client has heard nothing for the interval.
    fn poll_beat(&mut self, cx: &mut Context<'_>) -> Poll<Bytes> {
        if self.quiet.poll_over(cx).is_pending() {
            return Poll::Pending;
        }
        let beat = if self.tail.mid_event() { INSIDE_AN_EVENT } else { BETWEEN_EVENTS };
        self.sent(beat, Instant::now());
        Poll::Ready(Bytes::from_static(beat))
    }
}

impl RelayStage for Heartbeat {
    fn on_bytes(&mut self, bytes: Bytes, at: std::time::Instant, _relayed: &mut Relayed<'_>) -> Flow {
        // The read's own time: no clock read per chunk.
        self.sent(&bytes, Instant::from_std(at));
        Flow::pass(bytes)
    }

    fn poll_turn(&mut self, cx: &mut Context<'_>, _relayed: &mut Relayed<'_>) -> Poll<Flow> {
        self.poll_beat(cx).map(Flow::pass)
    }
}

pin_project_lite::pin_project! {
    /// `inner`, with a heartbeat after every `every` of silence: the heartbeat stage on
    /// a stream the relay does not read (an answer still on its way, see
    /// [`early_response`]).
    pub struct Heartbeats<S> {
        #[pin]
        inner: S,
        beat: Heartbeat,
    }
}

impl<S> Heartbeats<S> {
    pub fn new(inner: S, every: Duration) -> Self {
        Heartbeats { inner, beat: Heartbeat::new(every) }
    }
}

impl<S: Stream<Item = Result<Bytes, Infallible>>> Stream for Heartbeats<S> {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.project();
        match this.inner.poll_next(cx) {
            Poll::Ready(Some(Ok(bytes))) => {
                this.beat.sent(&bytes, Instant::now());
                Poll::Ready(Some(Ok(bytes)))
            }
            Poll::Ready(other) => Poll::Ready(other),
            Poll::Pending => this.beat.poll_beat(cx).map(|beat| Some(Ok(beat))),
        }
    }
}

/// Answers now, with SSE headers and heartbeats, for a streamed request whose
/// `response` is not ready yet; `headers` go with the early head (the ids a client can
/// quote). The response, once it comes, continues the stream: its events if it is a
/// successful SSE stream, else an error event made from its body.
pub fn early_response(
    response: Pin<Box<dyn Future<Output = Response> + Send>>,
    every: Duration,
    mut headers: HeaderMap,
    dialect: Dialect,
) -> Response {
    let rest = async move {
        let resp = response.await;
        if resp.status().is_success() && is_sse(resp.headers()) {
            return resp
                .into_body()
                .into_data_stream()
                .filter_map(|r| std::future::ready(r.ok()))
                .left_stream();
        }
        let status = resp.status();
        let body = axum::body::to_bytes(resp.into_body(), ERROR_BODY_LIMIT).await.unwrap_or_default();
        futures::stream::once(std::future::ready(error_event_from_body(status, &body, dialect)))
            .right_stream()
    };
    let stream = futures::stream::once(rest).flatten().map(Ok::<_, Infallible>);
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    let mut resp = Response::new(Body::from_stream(Heartbeats::new(stream, every)));
    *resp.headers_mut() = headers;
    resp
}

fn is_sse(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// The error event for a response that could not be sent as one: its own OpenAI-style
/// error object when it has one (the proxy's errors, vLLM's `{"error": ...}`), vLLM's
/// older flat `{"message", "type", "code"}` wrapped as one, else the status and body text;
/// in the stream's own API (see [`crate::error::error_event`]).
fn error_event_from_body(status: StatusCode, body: &[u8], dialect: Dialect) -> Bytes {
    let parsed: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let error = match parsed {
        Some(mut v) if v.get("error").is_some_and(|e| e.is_object()) => v["error"].take(),
        Some(v) if v.get("message").is_some_and(|m| m.is_string()) => serde_json::json!({
            "message": v["message"],
            "type": v.get("type").cloned().unwrap_or_else(|| "server_error".into()),
            "param": v.get("param").cloned().unwrap_or_default(),
            "code": v.get("code").cloned().unwrap_or_else(|| status.as_u16().into()),
        }),
        _ => {
            let text = String::from_utf8_lossy(&body[..body.len().min(512)]);
            serde_json::json!({
                "message": format!("the upstream answered {status} instead of a stream: {text}"),
                "type": "server_error",
                "param": null,
                "code": "upstream_status",
            })
        }
    };
    // Only heartbeats went before (comments, not events): this is the stream's first event.
    crate::error::error_event(dialect, error, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event_error(b: &Bytes) -> serde_json::Value {
        let text = std::str::from_utf8(b).unwrap();
        assert!(text.ends_with("\n\ndata: [DONE]\n\n"), "{text}");
        let first = text.strip_prefix("data: ").unwrap().split("\n\n").next().unwrap();
        serde_json::from_str::<serde_json::Value>(first).unwrap()["error"].clone()
    }

    #[test]
    fn error_events_keep_what_the_body_said() {
        let ours = br#"{"error": {"message": "queue full", "type": "server_error", "param": null, "code": "admission_queue_full"}}"#;
        assert_eq!(
            event_error(&error_event_from_body(StatusCode::SERVICE_UNAVAILABLE, ours, Dialect::Chat))["code"],
            "admission_queue_full"
        );
        let flat = br#"{"object": "error", "message": "too long", "type": "BadRequestError", "code": 400}"#;
        let e = event_error(&error_event_from_body(StatusCode::BAD_REQUEST, flat, Dialect::Chat));
        assert_eq!((e["message"].as_str(), e["code"].as_i64()), (Some("too long"), Some(400)));
        let html = b"<html>502 Bad Gateway</html>";
        let e = event_error(&error_event_from_body(StatusCode::BAD_GATEWAY, html, Dialect::Chat));
        assert!(e["message"].as_str().unwrap().contains("502 Bad Gateway"), "{e}");
    }

    #[tokio::test]
    async fn silence_gets_comments_that_never_split_an_event() {
        let every = Duration::from_millis(50);
        let (tx, rx) = futures::channel::mpsc::unbounded::<Result<Bytes, Infallible>>();
        let mut s = Box::pin(Heartbeats::new(rx, every));
        tx.unbounded_send(Ok(Bytes::from_static(b"data: {}\n\n"))).unwrap();
        assert_eq!(s.next().await.unwrap().unwrap(), "data: {}\n\n");
        let before = Instant::now();
        assert_eq!(s.next().await.unwrap().unwrap(), BETWEEN_EVENTS);
        assert!(before.elapsed() >= every, "not before the interval: {:?}", before.elapsed());
        tx.unbounded_send(Ok(Bytes::from_static(b"event: x\n"))).unwrap();
        assert_eq!(s.next().await.unwrap().unwrap(), "event: x\n");
        assert_eq!(
            s.next().await.unwrap().unwrap(),
            INSIDE_AN_EVENT,
            "a blank line would end the open event"
        );
        drop(tx);
        assert!(s.next().await.is_none());
    }
}
