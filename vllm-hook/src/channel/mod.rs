//! The hook's side of the policy channel: what this process has been told (shared by
//! the scheduler and the logits processor living in it), and either the listener the
//! proxy talks to or a follower of it.

mod affinity;
mod follower;
mod server;

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use meridian_core::channel::{DirectiveTable, Hello, Places, RequestDirectives, base_request_id};

pub use follower::Follower;
pub use server::ChannelServer;

use crate::metrics::Counters;

/// State every part of the hook in one process reads.
#[derive(Default)]
pub struct Shared {
    pub counters: Counters,
    pub directives: Mutex<DirectiveTable>,
    /// Whether this engine can act on `end_thinking` (its scheduler says so once it
    /// knows the delimiters, that the logits processor is configured, and that one rank
    /// samples); the hello reply reports it.
    pub can_end_thinking: AtomicBool,
    /// Whether the hook runs disabled on a vLLM it does not support
    /// (`hook.on_unsupported_vllm = "disable"`): the hello reply reports policy
    /// `disabled`, and `meridian_hook_disabled` reads 1.
    pub disabled: AtomicBool,
    /// The places of this engine's limit granted to proxy replicas
    /// (`meridian_core::channel::places`), and the clock their leases run on.
    pub places: Mutex<Places>,
    pub started: Clock,
}

/// The start of this process's channel clock (a monotonic instant, from creation).
pub struct Clock(std::time::Instant);

impl Default for Clock {
    fn default() -> Self {
        Clock(std::time::Instant::now())
    }
}

impl Clock {
    /// Seconds since the clock started.
    pub fn now_s(&self) -> f64 {
        self.0.elapsed().as_secs_f64()
    }
}

impl Shared {
    /// Directives for a request, by vLLM's request id or the proxy's.
    pub fn directives_for(&self, request_id: &str) -> Option<RequestDirectives> {
        let table = self.directives.lock().ok()?;
        directives_in(&table, request_id).cloned()
    }
}

/// A request's directives in `table`, by vLLM's request id or the proxy's.
pub fn directives_in<'a>(table: &'a DirectiveTable, request_id: &str) -> Option<&'a RequestDirectives> {
    table.get(request_id).or_else(|| table.get(base_request_id(request_id)))
}

/// Where a follower connects for a listener bound to `listen` (a wildcard address means
/// this host).
pub fn connect_address(listen: &str) -> String {
    match listen.rsplit_once(':') {
        Some(("0.0.0.0", port)) => format!("127.0.0.1:{port}"),
        Some(("[::]", port)) => format!("[::1]:{port}"),
        _ => listen.to_owned(),
    }
}

/// What the listener says about this hook.
pub fn hello(policy: &str, entropy: bool, can_end_thinking: bool) -> Hello {
    Hello {
        protocol: meridian_core::channel::PROTOCOL_VERSION,
        min_protocol: meridian_core::channel::PROTOCOL_VERSION,
        hook_version: env!("CARGO_PKG_VERSION").to_owned(),
        policy: policy.to_owned(),
        entropy,
        can_end_thinking,
        engine: None,
    }
}

/// The process's channel role, started at most once.
pub enum Role {
    Listener(ChannelServer),
    Follower(Follower),
}

pub type SharedRef = Arc<Shared>;
