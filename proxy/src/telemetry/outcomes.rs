//! Each request's outcome, counted once in `meridian_requests_total{route,outcome}` by one
//! layer, when its response has ended (or the client left before it came). Whoever knows
//! the outcome writes it in the request's [`OutcomeSlot`] (the handler for an error or a
//! whole answer, the relay's record when a stream ends); the layer counts what was
//! written once nothing can change it. A request whose route never named itself (health,
//! readiness, metrics) is not counted.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::Request;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};

use meridian_core::Outcome;

use super::Metrics;
use crate::layers::{Concern, Next, Responding};

/// Where a request's route and outcome are written, shared by everything that handles it.
#[derive(Clone, Debug, Default)]
pub struct OutcomeSlot(Arc<Mutex<Slot>>);

#[derive(Debug, Default)]
struct Slot {
    route: Option<&'static str>,
    outcome: Option<Outcome>,
    counted: bool,
}

impl OutcomeSlot {
    /// The request is one the proxy counts, under this route.
    pub fn route(&self, route: &'static str) {
        self.with(|s| s.route = Some(route));
    }

    /// How the request ended (the last word wins: a stream's end over its headers').
    pub fn set(&self, outcome: Outcome) {
        self.with(|s| s.outcome = Some(outcome));
    }

    /// How the request ended, unless something already said.
    pub fn set_if_unset(&self, outcome: Outcome) {
        self.with(|s| {
            s.outcome.get_or_insert(outcome);
        });
    }

    fn with<T>(&self, f: impl FnOnce(&mut Slot) -> T) -> T {
        // A poisoned lock only means a panic elsewhere mid-write: the slot is still usable.
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Counts the request once: its outcome, else `unset`.
    fn count(&self, metrics: &Metrics, unset: Outcome) {
        let (route, outcome) = self.with(|s| {
            if std::mem::replace(&mut s.counted, true) {
                return (None, None);
            }
            (s.route, s.outcome)
        });
        if let Some(route) = route {
            metrics.count_request(route, outcome.unwrap_or(unset));
        }
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
