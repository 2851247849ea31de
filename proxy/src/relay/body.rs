//! The streaming response body: each upstream chunk goes to the client the moment it
//! arrives, and the same bytes feed the phase tracker. Upstream failure or silence ends
//! the client's stream with an OpenAI-style error event instead of a hang; a client that
//! goes away drops this body, which drops the upstream response and so cancels the
//! request in the engine.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::Stream;
use futures::stream::BoxStream;
use tokio::time::Sleep;

use super::observer::RequestObserver;
use super::sse::SseDecoder;
use crate::error::ProxyError;
use crate::telemetry::Metrics;
use crate::upstream::InFlight;

#[derive(PartialEq)]
enum State {
    Open,
    Done,
}

pin_project_lite::pin_project! {
    pub struct RelayBody {
        upstream: BoxStream<'static, reqwest::Result<Bytes>>,
        #[pin]
        idle: Sleep,
        idle_timeout: Duration,
        decoder: SseDecoder,
        observer: RequestObserver,
        metrics: std::sync::Arc<Metrics>,
        in_flight: InFlight,
        state: State,
    }
}

impl RelayBody {
    pub fn new(
        upstream: BoxStream<'static, reqwest::Result<Bytes>>,
        idle_timeout: Duration,
        observer: RequestObserver,
        metrics: std::sync::Arc<Metrics>,
        in_flight: InFlight,
    ) -> Self {
        RelayBody {
            upstream,
            idle: tokio::time::sleep(idle_timeout),
            idle_timeout,
            decoder: SseDecoder::new(),
            observer,
            metrics,
            in_flight,
            state: State::Open,
        }
    }
}

impl Stream for RelayBody {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut this = self.project();
        if *this.state == State::Done {
            return Poll::Ready(None);
        }
        match this.upstream.as_mut().poll_next(cx) {
            Poll::Ready(Some(Ok(chunk))) => {
                let at = Instant::now();
                let observer = &mut *this.observer;
                this.decoder.feed(&chunk, |payload| observer.on_payload(payload, at));
                this.metrics.count_chunk();
                let deadline = tokio::time::Instant::from_std(at) + *this.idle_timeout;
                this.idle.as_mut().reset(deadline);
                Poll::Ready(Some(Ok(chunk)))
            }
            Poll::Ready(Some(Err(e))) => {
                let upstream = this.in_flight.upstream().name.clone();
                tracing::warn!(%upstream, error = %e, "upstream stream failed");
                let err = ProxyError::UpstreamFailed { upstream, reason: "the stream broke off".into() };
                Poll::Ready(Some(Ok(close_with(this.decoder, this.observer, this.state, err))))
            }
            Poll::Ready(None) => {
                if this.decoder.mid_line() {
                    let upstream = this.in_flight.upstream().name.clone();
                    let err = ProxyError::UpstreamFailed { upstream, reason: "the stream ended mid-event".into() };
                    return Poll::Ready(Some(Ok(close_with(this.decoder, this.observer, this.state, err))));
                }
                this.observer.complete();
                *this.state = State::Done;
                Poll::Ready(None)
            }
            Poll::Pending => {
                if this.idle.as_mut().poll(cx).is_ready() {
                    let upstream = this.in_flight.upstream().name.clone();
                    tracing::warn!(%upstream, "upstream stream went silent");
                    let err = ProxyError::UpstreamTimeout { upstream, after_s: this.idle_timeout.as_secs_f64() };
                    return Poll::Ready(Some(Ok(close_with(this.decoder, this.observer, this.state, err))));
                }
                Poll::Pending
            }
        }
    }
}

/// The bytes that end a broken stream: a blank line to terminate any half-sent event,
/// then the error event and `[DONE]`, so SSE clients raise instead of waiting.
fn close_with(decoder: &SseDecoder, observer: &mut RequestObserver, state: &mut State, err: ProxyError) -> Bytes {
    observer.fail(err.outcome());
    let event = err.sse_event();
    let bytes = if decoder.mid_line() {
        let mut b = Vec::with_capacity(event.len() + 2);
        b.extend_from_slice(b"\n\n");
        b.extend_from_slice(&event);
        Bytes::from(b)
    } else {
        event
    };
    *state = State::Done;
    bytes
}
