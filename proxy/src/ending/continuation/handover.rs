//! Phase-boundary migration by re-prefill: a stream on a `think` upstream
//! (`upstream.endpoints[].role`) has its answer continued on an answer upstream when its
//! thought ends, by itself, by a budget or by an exit signal. The continuation's second
//! leg goes there instead of back to the first leg's upstream: the answer upstream
//! prefills the prompt and the thought again (its own prefix cache may hold the prompt),
//! and the think upstream's place is free the moment the first leg is dropped.
//!
//! An answer moves only to an upstream with room (admission's limits, when on): with
//! none, it stays where it is, which is always possible, since the think upstream holds
//! its KV.

use std::sync::Arc;

use super::ContinuationUpstream;
use crate::admission::Admission;
use crate::ctx::RequestCtx;
use crate::telemetry::Metrics;
use crate::upstream::{InFlight, Upstream, UpstreamPool};

/// Where a stream's answer may move to, and how it gets there.
pub struct HandOver {
    pub pool: Arc<UpstreamPool>,
    pub admission: Arc<Admission>,
    pub metrics: Arc<Metrics>,
    /// The `think` upstream the first leg runs on.
    pub from: Arc<Upstream>,
    /// The route's path (and query), for the answer upstream's URL.
    pub path: String,
}

impl HandOver {
    /// The answer upstream for `ctx`'s answer, counted in flight there; `None` when no
    /// answer upstream serving its model has room (the answer stays). Counted either way.
    pub fn pick(&self, ctx: &RequestCtx) -> Option<InFlight> {
        let room = |u: &Upstream| self.admission.has_room(u);
        let affinity = ctx.affinity_key.as_deref();
        let picked = self.pool.hand_over(&ctx.model, affinity, &self.from, &self.metrics, room);
        self.metrics.count_handover(picked.is_some());
        picked
    }

    /// The continuation's target on `to`: the first leg's headers and client, `to`'s URL.
    pub fn target(&self, first: &ContinuationUpstream, to: &Upstream) -> ContinuationUpstream {
        ContinuationUpstream {
            url: format!("{}{}", to.base_url, self.path),
            name: to.name.clone(),
            ..first.clone()
        }
    }
}
