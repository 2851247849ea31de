//! Routing: which engine a new request goes to, as a plain trait apart from HTTP and from
//! how the proxy learns each engine's load. The proxy's upstream pool filters the engines
//! that may take a request (healthy, serving its model, not yet tried, not saturated) and
//! hands their views to the configured [`RoutingPolicy`]; the policy only picks.
//!
//! Four policies, chosen by [`RoutingKind`] (`upstream.routing` in `meridian.toml`):
//!
//! - [`PhaseAwareLeastLoad`] (the default): fewest answering streams first, since a new
//!   request's prefill and thinking slow the answers already streaming on that engine;
//!   then the least KV pressure; then the fewest requests in flight.
//! - [`PrefixAffinity`]: requests with the same affinity key (a session or conversation
//!   id) go to the same engine, whose prefix cache holds their history, unless that engine
//!   carries more than its bounded share of the load; requests without a key go by least
//!   load.
//! - [`PowerOfTwoChoices`]: two engines drawn at random, the less loaded one taken. With
//!   several proxy replicas each reading slightly stale loads, least load sends every
//!   replica's next request to the same engine at once; two random choices do not herd.
//! - [`RoundRobin`]: each engine in turn, load unread.
//!
//! Before a policy picks, an engine's [`Role`] says which work it takes: `think`
//! engines take requests that will think, and hand each answer to an `answer` engine when
//! the thought ends (phase-boundary migration); `both`, the default, take anything.

mod affinity;
mod least_load;

pub use affinity::{PrefixAffinity, affinity_hash};
pub use least_load::{PhaseAwareLeastLoad, PowerOfTwoChoices, RoundRobin, phase_aware_load};

use std::fmt::Debug;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What a routing policy may know about one engine that could take the request.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineView<'a> {
    /// The engine's stable name (the upstream's `name`): the same in every proxy replica,
    /// so that affinity hashing sends a key to the same engine from each of them.
    pub name: &'a str,
    /// Streams there in the answer phase: the latency-sensitive ones.
    pub answering: u32,
    /// Requests in flight there, any phase.
    pub in_flight: u32,
    /// The engine's KV cache usage in `[0, 1]` from its own metrics (`None`: not read yet).
    pub kv_usage: Option<f64>,
}

/// What a routing policy may know about the request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RouteRequest<'a> {
    /// The request's affinity key (a session or conversation id), if it has one.
    pub affinity_key: Option<&'a str>,
}

/// Picks the engine for a request.
pub trait RoutingPolicy: Send + Sync + Debug {
    /// The policy's name, as `upstream.routing` spells it.
    fn name(&self) -> &'static str;

    /// The index in `engines` of the engine to send `request` to; `None` only when
    /// `engines` is empty.
    fn choose(&self, request: &RouteRequest<'_>, engines: &[EngineView<'_>]) -> Option<usize>;
}

/// The routing policies by name (`upstream.routing`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum RoutingKind {
    /// Fewest answering streams, then least KV pressure, then fewest in flight.
    #[default]
    PhaseAware,
    /// One engine per affinity key (within a bounded share of the load); least load
    /// without a key.
    PrefixAffinity,
    /// The less loaded of two engines drawn at random.
    PowerOfTwo,
    /// Each engine in turn.
    RoundRobin,
}

impl RoutingKind {
    pub const ALL: [RoutingKind; 4] = [
        RoutingKind::PhaseAware,
        RoutingKind::PrefixAffinity,
        RoutingKind::PowerOfTwo,
        RoutingKind::RoundRobin,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RoutingKind::PhaseAware => "phase-aware",
            RoutingKind::PrefixAffinity => "prefix-affinity",
            RoutingKind::PowerOfTwo => "power-of-two",
            RoutingKind::RoundRobin => "round-robin",
        }
    }

    /// The policy weighs the engines' KV usage (so the proxy should read their
    /// `/metrics`): every policy but round robin, prefix affinity for requests without a
    /// key.
    pub fn reads_kv_usage(self) -> bool {
        self != RoutingKind::RoundRobin
    }

    /// The policy itself; `load_bound` is prefix affinity's (see [`PrefixAffinity::new`]).
    pub fn policy(self, load_bound: f64) -> Box<dyn RoutingPolicy> {
        match self {
            RoutingKind::PhaseAware => Box::new(PhaseAwareLeastLoad::default()),
            RoutingKind::PrefixAffinity => Box::new(PrefixAffinity::new(load_bound)),
            RoutingKind::PowerOfTwo => Box::new(PowerOfTwoChoices::default()),
            RoutingKind::RoundRobin => Box::new(RoundRobin::default()),
        }
    }
}

/// Which work an engine takes (`upstream.endpoints[].role`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Anything: requests that think and answer in place, and handed-over answers.
    #[default]
    Both,
    /// Requests that will think; their answers move to an `answer` engine at the end of
    /// the thought.
    Think,
    /// Answers: requests that will not think, and answers handed over by `think` engines.
    Answer,
}

/// What a request goes to an engine for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// A request that will think first (its model family names think delimiters and its
    /// thinking is on).
    Think,
    /// An answer: a request that will not think, or one handed over after its thought.
    Answer,
    /// A request whose phases the proxy cannot tell (an unknown model family).
    Unknown,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Both => "both",
            Role::Think => "think",
            Role::Answer => "answer",
        }
    }

    /// Whether an engine in this role is meant for `work`. A request that finds no engine
    /// meant for it in rotation goes to any engine that serves its model (a pool whose
    /// answer engines are all down still answers, in place).
    pub fn takes(self, work: Work) -> bool {
        match (self, work) {
            (Role::Both, _) => true,
            (Role::Think, Work::Think) | (Role::Answer, Work::Answer) => true,
            // An engine that cannot hand its answer over is the wrong place for a request
            // whose phases nobody tracks; a think engine still takes it before nothing.
            (Role::Think, Work::Answer | Work::Unknown) | (Role::Answer, Work::Think | Work::Unknown) => {
                false
            }
        }
    }
}

#[cfg(test)]
mod tests;
