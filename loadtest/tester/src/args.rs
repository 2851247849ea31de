//! Command-line flags. Where a flag means what it means in `vllm bench serve`, it has the
//! same name.

use std::path::PathBuf;

use clap::{Parser, ValueEnum};

#[derive(Parser, Debug, Clone)]
#[command(
    name = "meridian-loadtest",
    version,
    about = "Load-test an OpenAI-compatible server the way reasoning users feel it"
)]
pub struct Args {
    /// Server base URL (no /v1), e.g. http://127.0.0.1:8080; several, comma-separated, for
    /// the replicas of a fleet: requests take them in turn (the models are listed, and
    /// `/metrics` read, from the first).
    #[arg(long, default_value = "http://127.0.0.1:8080", value_delimiter = ',', num_args = 1..)]
    pub base_url: Vec<String>,
    /// API path, which also picks the API spoken: `/v1/chat/completions`,
    /// `/v1/completions`, `/v1/responses` (OpenAI Responses, reasoning and output-text
    /// events) or `/v1/messages` (Anthropic Messages, thinking blocks).
    #[arg(long, default_value = "/v1/chat/completions")]
    pub endpoint: String,
    /// Model name; default: the first one the server lists.
    #[arg(long)]
    pub model: Option<String>,
    /// Model family for client-side phase detection (see models/); default: from the name.
    #[arg(long)]
    pub model_family: Option<String>,
    /// Requests to send; with `--dataset-name conversations` or `agent`, conversations
    /// (each `--turns` requests).
    #[arg(long, default_value_t = 100)]
    pub num_prompts: usize,
    /// Requests per second ("inf" sends everything at once).
    #[arg(long, default_value = "inf")]
    pub request_rate: String,
    /// Gamma shape of inter-arrival times: 1 is Poisson, lower is burstier.
    #[arg(long, default_value_t = 1.0)]
    pub burstiness: f64,
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    /// Stop sending after this many seconds (requests in flight finish).
    #[arg(long)]
    pub duration: Option<f64>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long, value_enum, default_value = "random")]
    pub dataset_name: DatasetName,
    #[arg(long)]
    pub dataset_path: Option<PathBuf>,
    #[arg(long, default_value_t = 1024)]
    pub random_input_len: u32,
    #[arg(long, default_value_t = 128)]
    pub random_output_len: u32,
    #[arg(long, default_value_t = 0.0)]
    pub random_range_ratio: f64,
    /// Thinking tokens per request (same range ratio), sent as vLLM's
    /// `thinking_token_budget`; max_tokens becomes think + output length. For reasoning
    /// workloads whose thought must end at a known length (random-weight test models).
    #[arg(long)]
    pub random_think_len: Option<u32>,
    /// A request whose answer stalls longer than this between two visible tokens counts
    /// as stalled (the share is reported beside the answer-gap percentiles).
    #[arg(long, default_value_t = 250.0)]
    pub stall_threshold_ms: f64,
    #[arg(long)]
    pub sharegpt_output_len: Option<u32>,
    /// Turns per conversation (`--dataset-name conversations` or `agent`); each turn's
    /// new message and answer take the `--random-*` lengths.
    #[arg(long, default_value_t = 4)]
    pub turns: u32,
    /// Tokens of the system prompt every conversation opens with (0: none).
    #[arg(long, default_value_t = 512)]
    pub system_prompt_len: u32,
    /// Mean seconds (exponential) between an answer's end and the next message; an
    /// agent's tool output comes back in a tenth of it.
    #[arg(long, default_value_t = 5.0)]
    pub think_time: f64,
    /// Send each turn of a conversation a sampling `seed` (from --seed), so two servers
    /// given the same plan generate the same answers and receive the same histories.
    /// Off by default: vLLM's CPU build (0.32) fails a request with a seed ("CPU
    /// Generator does not use offset"); `--extra-body '{"temperature": 0}'` pairs the
    /// answers there instead.
    #[arg(long)]
    pub sample_seeds: bool,
    /// The header each turn of a conversation carries its key in (`conv-<seed>-<n>`), for
    /// a router that keeps a session on one engine (Meridian's `upstream.affinity_header`);
    /// empty: none.
    #[arg(long, default_value = crate::client::SESSION_HEADER)]
    pub session_header: String,
    /// Where the server's Prometheus page is, read before and after each run for vLLM's
    /// prefix-cache counters (default: the base URL's /metrics; point it at vLLM itself
    /// when a proxy stands in front).
    #[arg(long)]
    pub metrics_url: Option<String>,
    /// Ramp the rate linearly from --ramp-up-start-rps to --ramp-up-end-rps.
    #[arg(long, value_enum)]
    pub ramp_up_strategy: Option<RampStrategy>,
    #[arg(long)]
    pub ramp_up_start_rps: Option<f64>,
    #[arg(long)]
    pub ramp_up_end_rps: Option<f64>,
    /// Run once per rate in this comma-separated list.
    #[arg(long, value_delimiter = ',')]
    pub sweep_rates: Vec<f64>,
    /// Double the rate from --request-rate until the server saturates.
    #[arg(long)]
    pub sweep_to_saturation: bool,
    /// SLOs for goodput, e.g. --goodput ttft:500 ttfo:2000 ttot:200 tpot:50 (ms).
    #[arg(long, num_args = 1..)]
    pub goodput: Vec<String>,
    /// Exit with status 3 when the fraction of requests meeting every SLO is below this.
    #[arg(long)]
    pub slo_min_fraction: Option<f64>,
    /// The whole-request SLO's reference: a JSON report saved (--save-result) by a run of
    /// the same workload and --seed one request at a time (--max-concurrency 1). Each
    /// request then meets the SLO when its TTFT and TTFO are within --slo-start-factor x
    /// its own times there plus --slo-start-allowance-ms, and its think-to-output gap and
    /// largest answer gap within --stall-threshold-ms.
    #[arg(long)]
    pub slo_reference: Option<PathBuf>,
    #[arg(long, default_value_t = 2.0)]
    pub slo_start_factor: f64,
    #[arg(long, default_value_t = 250.0)]
    pub slo_start_allowance_ms: f64,
    /// A/B: run the same workload against this base URL too and compare.
    #[arg(long)]
    pub compare_base_url: Option<String>,
    #[arg(long, default_value = "A")]
    pub label: String,
    #[arg(long, default_value = "B")]
    pub compare_label: String,
    /// JSON merged into every request body, e.g. '{"thinking_token_budget": 256}'.
    #[arg(long)]
    pub extra_body: Option<String>,
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    #[arg(long)]
    pub ignore_eos: bool,
    /// Non-streaming requests.
    #[arg(long)]
    pub no_stream: bool,
    /// Write the JSON report.
    #[arg(long)]
    pub save_result: bool,
    #[arg(long, default_value = ".")]
    pub result_dir: PathBuf,
    #[arg(long)]
    pub result_filename: Option<String>,
    /// Write per-request rows as CSV here.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Write an HTML report with plots here.
    #[arg(long)]
    pub html: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub disable_tqdm: bool,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatasetName {
    Random,
    Sharegpt,
    /// Multi-turn chats: each turn sends the history (answers without their thinking)
    /// and a new message, `--think-time` after the last answer.
    Conversations,
    /// The same loop shaped like a tool-calling agent: tool outputs sent back within a
    /// tenth of `--think-time`.
    Agent,
}

impl DatasetName {
    pub fn multi_turn(self) -> bool {
        matches!(self, DatasetName::Conversations | DatasetName::Agent)
    }
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum RampStrategy {
    Linear,
}
