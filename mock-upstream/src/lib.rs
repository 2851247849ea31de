//! `meridian-mock-upstream`: an OpenAI-compatible server that replays recorded vLLM
//! streams byte for byte, for the proxy's tests and benchmarks.
//!
//! Fixtures are raw SSE bodies captured from real servers (see `fixtures/README.md`). Each
//! request picks a fixture and a delivery plan through `x-mock-*` headers, which a proxy
//! forwards like any other end-to-end header:
//!
//! | header | effect |
//! |---|---|
//! | `x-mock-fixture: NAME` | replay `fixtures/NAME.sse` (default: `qwen3-reasoning`; on `/v1/responses`, `responses-reasoning`; on `/v1/messages`, `messages-thinking`) |
//! | `x-mock-split: event` / `N` / `a,b,c` | one write per SSE event (default), N-byte writes, or cuts at these byte offsets |
//! | `x-mock-interval-ms: N` | pause between writes |
//! | `x-mock-first-byte-ms: N` | pause before the response head (a long prefill) |
//! | `x-mock-die-after-bytes: N` | abort the connection after N body bytes |
//! | `x-mock-hang-after-bytes: N` | stop sending after N bytes but keep the connection open |
//! | `x-mock-status: CODE` | answer with this status and an OpenAI-style error |
//!
//! A request that is not streamed gets the fixture's unstreamed recording
//! (`fixtures/NAME.json`) where there is one, else the stream folded into one answer.
//!
//! `/metrics` reports vLLM's `vllm:num_requests_waiting` and `vllm:kv_cache_usage_perc`
//! gauges, 0 unless set with [`MockUpstream::set_engine_load`], and
//! `vllm:num_requests_running` once set with [`MockUpstream::set_engine_running`].
//!
//! Every request is recorded (headers, body, and whether its client went away before the
//! end), so tests can check what the proxy sent upstream and that it cancelled.

mod fixtures;
mod plan;
mod record;
mod server;

pub use fixtures::{Fixture, builtin_fixtures};
pub use plan::DeliveryPlan;
pub use record::RecordedRequest;
pub use server::{MockOptions, MockUpstream};
