//! `meridian-loadtest`: a load tester for any OpenAI-compatible server (the Meridian
//! proxy, a vLLM, the engine twin) that measures what reasoning users feel — time to the
//! first *output* token, the think-to-output gap, output inter-token latency — next to
//! the usual TTFT/TPOT/throughput, with goodput under SLOs (the answer-only SLO, and the
//! whole-request SLO against each request's own unloaded times), sweeps, and A/B comparison.

pub mod args;
pub mod arrivals;
pub mod client;
pub mod conversation;
pub mod dataset;
pub mod record;
pub mod report;
pub mod run;
pub mod server_metrics;
pub mod stats;
pub mod whole_request;
