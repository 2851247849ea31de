//! Each request's outcome, counted once in `meridian_requests_total{route,outcome}` by one
//! layer, when its response has ended (or the client left before it came). Whoever knows
//! the outcome writes it in the request's [`OutcomeSlot`] (the handler for an error or a
//! whole answer, the relay's record when a stream ends); the layer counts what was
//! written once nothing can change it. A request whose route never named itself (health,
//! readiness, metrics) is not counted.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::Request;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};

use meridian_core::Outcome;

use super::Metrics;
use crate::layers::{Concern, Next, Responding};

/// Where a request's route and outcome are written, shared by everything that handles it.
/// Written and read without a lock: a route set once, an outcome in one atomic byte, and
/// whether it was counted.
#[derive(Clone, Debug, Default)]
pub struct OutcomeSlot(Arc<Slot>);

#[derive(Debug)]
struct Slot {
    route: OnceLock<&'static str>,
    /// The outcome's place in [`Outcome::ALL`], or [`UNSET`].
    outcome: AtomicU8,
    counted: AtomicBool,
}

const UNSET: u8 = u8::MAX;

impl Default for Slot {
    fn default() -> Self {
        Slot { route: OnceLock::new(), outcome: AtomicU8::new(UNSET), counted: AtomicBool::new(false) }
    }
}

fn code(outcome: Outcome) -> u8 {
    Outcome::ALL.iter().position(|o| *o == outcome).map_or(UNSET, |i| i as u8)
}

impl OutcomeSlot {
    /// The request is one the proxy counts, under this route (the first route named).
    pub fn route(&self, route: &'static str) {
        let _ = self.0.route.set(route);
    }

    /// How the request ended (the last word wins: a stream's end over its headers').
    pub fn set(&self, outcome: Outcome) {
        self.0.outcome.store(code(outcome), Ordering::Release);
    }

    /// How the request ended, unless something already said.
    pub fn set_if_unset(&self, outcome: Outcome) {
        let _ = self.0.outcome.compare_exchange(UNSET, code(outcome), Ordering::AcqRel, Ordering::Acquire);
    }

    /// Counts the request once: its outcome, else `unset`.
    fn count(&self, metrics: &Metrics, unset: Outcome) {
        if self.0.counted.swap(true, Ordering::AcqRel) {
            return;
        }
        let Some(route) = self.0.route.get() else { return };
        let said = Outcome::ALL.get(usize::from(self.0.outcome.load(Ordering::Acquire)));
        metrics.count_request(route, said.copied().unwrap_or(unset));
    }
}

/// The layer ([`crate::layers`]): gives the request its [`OutcomeSlot`], and counts it
/// when the response body ends or is dropped; a handler dropped before it answered (the
/// client left) counts as `client_disconnected`.
#[derive(Clone, Debug)]
pub struct CountOutcomes {
    metrics: Arc<Metrics>,
}

impl CountOutcomes {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        CountOutcomes { metrics }
    }
}

impl Concern for CountOutcomes {
    fn around<S: Next>(&self, mut req: Request, mut next: S) -> Responding {
        let outcome = OutcomeSlot::default();
        req.extensions_mut().insert(outcome.clone());
        let metrics = self.metrics.clone();
        let left_early = CountOnDrop { outcome: outcome.clone(), metrics: metrics.clone(), armed: true };
        Box::pin(async move {
            let resp = next.call(req).await?;
            left_early.disarm();
            Ok(resp.map(|body| Body::new(Counted { inner: Some(body), outcome, metrics })))
        })
    }
}

struct CountOnDrop {
    outcome: OutcomeSlot,
    metrics: Arc<Metrics>,
    armed: bool,
}

impl CountOnDrop {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for CountOnDrop {
    fn drop(&mut self) {
        if self.armed {
            self.outcome.count(&self.metrics, Outcome::ClientDisconnected);
        }
    }
}

/// A response body that counts its request when it ends or is dropped: after its inner
/// body is gone, so the relay's record (dropped with the inner body) has had its say.
struct Counted {
    inner: Option<Body>,
    outcome: OutcomeSlot,
    metrics: Arc<Metrics>,
}

impl HttpBody for Counted {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let Some(inner) = self.inner.as_mut() else { return Poll::Ready(None) };
        let polled = Pin::new(inner).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            self.finish();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(HttpBody::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.as_ref().map_or_else(|| SizeHint::with_exact(0), HttpBody::size_hint)
    }
}

impl Counted {
    fn finish(&mut self) {
        drop(self.inner.take());
        // A response that went out whole without a word from anyone was not a failure.
        self.outcome.count(&self.metrics, Outcome::Ok);
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        drop(self.inner.take());
        // Dropped before its end: the client went away (unless something said otherwise).
        self.outcome.count(&self.metrics, Outcome::ClientDisconnected);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counted(metrics: &Metrics, route: &str, outcome: Outcome) -> usize {
        let series =
            format!("meridian_requests_total{{route=\"{route}\",outcome=\"{}\"}} 1", outcome.as_str());
        metrics.render().lines().filter(|l| *l == series).count()
    }

    #[test]
    fn a_request_is_counted_once_under_the_last_word_on_its_outcome() {
        let metrics = Metrics::new();
        let slot = OutcomeSlot::default();
        slot.route("chat_completions");
        slot.set_if_unset(Outcome::ClientDisconnected);
        slot.set_if_unset(Outcome::Ok);
        slot.set(Outcome::UpstreamTruncated);
        slot.clone().count(&metrics, Outcome::Ok);
        slot.count(&metrics, Outcome::ClientDisconnected);
        assert_eq!(counted(&metrics, "chat_completions", Outcome::UpstreamTruncated), 1);
        assert_eq!(counted(&metrics, "chat_completions", Outcome::ClientDisconnected), 0);
    }

    #[test]
    fn an_unsaid_outcome_is_the_counters_and_an_unnamed_route_is_not_counted() {
        let metrics = Metrics::new();
        let slot = OutcomeSlot::default();
        slot.route("models");
        slot.count(&metrics, Outcome::ClientDisconnected);
        assert_eq!(counted(&metrics, "models", Outcome::ClientDisconnected), 1);
        let unrouted = OutcomeSlot::default();
        unrouted.set(Outcome::BadRequest);
        unrouted.count(&metrics, Outcome::Ok);
        assert!(!metrics.render().contains("outcome=\"bad_request\"} 1"));
    }
}
