//! `meridian-proxy` is the `meridian` binary: an OpenAI-compatible reverse proxy in front
//! of one or more vLLM servers. It relays every streamed chunk the moment it arrives,
//! unchanged, while a per-stream phase tracker (from `meridian-core`) follows each
//! generation from thinking to answering and records what reasoning users feel: time to
//! first token, time to first visible token, and the think-to-output gap.
//!
//! The layout follows the data path: [`routes`] accept requests and decide each one's
//! context once ([`ctx`], shared by every stage after), [`relay`] sends them
//! upstream and streams the answer back, [`upstream`] keeps the pool healthy and balanced,
//! and [`telemetry`] exports what was measured; [`ending`] holds everything that ends a
//! request's thinking early (budgets, entropy exits, the continuation), [`hook`] the
//! policy channel to the engines' hooks, and [`streams`] lists every request open right
//! now, for operators. What wraps a whole request (its ids, its outcome's count, the
//! limits on its size) is a stack of tower layers, [`layers`].

pub mod admission;
pub mod body;
pub mod body_limit;
pub mod cli;
pub mod config;
pub mod ctx;
pub mod drain;
pub mod ending;
pub mod error;
pub mod head_limit;
pub mod headers;
pub mod hook;
pub mod layers;
pub mod members;
pub mod relay;
pub mod request_id;
pub mod routes;
pub mod server;
pub mod share;
pub mod state;
pub mod streams;
pub mod telemetry;
pub mod tenants;
pub mod top;
pub mod upstream;

/// Parsers the fuzz targets (`fuzz/`) drive directly; not an API.
#[doc(hidden)]
pub mod internals {
    pub use crate::body::{GenerationRequest, hook_body, upstream_body};
    pub use crate::ending::continuation::{ClientAsked, Emit, Splicer};
}

pub use error::ProxyError;
pub use server::{Server, router};
pub use state::AppState;
pub use telemetry::Metrics;
