//! `meridian-core` is the part of Meridian that knows about reasoning models and nothing
//! about networks: the per-request think/output phase state machine ([`phase`]), the
//! per-family boundary definitions it runs on ([`models`]), the scheduling-policy
//! interface engines call every step ([`sched`]), which engine a new request goes to
//! ([`route`]), the KV cache with its prefix cache and
//! the tiers that say which blocks go first ([`kv`]), the reading of OpenAI-style streams
//! ([`stream`]), how a request ended ([`outcome`]), the user-felt times of a stream,
//! defined once ([`timings`]), the sections of `meridian.toml` the hook shares with the
//! proxy and how the file is read ([`config`]) and the policy channel between the proxy
//! and the engine hook ([`channel`]). It is pure Rust with no async runtime and no HTTP,
//! so the proxy, the engine twin and the in-engine vLLM hook all share exactly the same
//! logic.

pub mod channel;
pub mod config;
pub mod kv;
pub mod models;
pub mod outcome;
pub mod phase;
pub mod route;
pub mod sched;
pub mod signals;
pub mod stream;
pub mod timings;

pub use config::load_config;
pub use models::{ModelFamily, ModelRegistry};
pub use outcome::Outcome;
pub use phase::{Delta, Phase, PhaseEvent, PhaseRouter};
