//! `meridian-sim`, the engine twin: a discrete-time model of a vLLM server under load —
//! continuous batching under a per-step token budget, chunked prefill, a finite KV cache
//! in blocks, and preemption with recompute when blocks run out — with step times from a
//! documented cost model ([`cost`]), varied step by step as the engine it was fitted to
//! varied ([`spread`]). The scheduling decisions come from
//! `meridian_core::sched`, so the stock vLLM behaviour and Meridian's phase-aware
//! policies are the same code here as in the engine hook.
//!
//! The engine is pure and deterministic: time is a number it advances, so experiments can
//! run far faster than real time, and a server drives it in real time.

pub mod ab;
pub mod calibrate;
pub mod conversation;
pub mod cost;
pub mod engine;
pub mod experiment;
pub mod migration;
pub mod replay;
pub mod server;
pub mod spread;
pub mod workload;

pub use cost::{CostModel, Profile, StepShape, profile};
pub use engine::{Engine, EngineConfig, NewRequest, StepReport, Token};
