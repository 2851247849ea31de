//! Reports: a terminal table, JSON (schema in docs/src/loadtest.md), per-request CSV, and
//! an HTML page with latency CDFs and load-vs-latency plots.

mod html;
mod table;

pub use html::html_report;
pub use table::table;

use serde::Serialize;

use crate::record::RequestRecord;
use crate::stats::RunSummary;

/// The JSON report.
#[derive(Serialize)]
pub struct JsonReport<'a> {
    pub schema: &'static str,
    pub command: String,
    pub runs: Vec<JsonRun<'a>>,
}

#[derive(Serialize)]
pub struct JsonRun<'a> {
    pub summary: &'a RunSummary,
    pub client_cpu_s: f64,
    pub requests: &'a [RequestRecord],
}

/// Version 2: a metric no request reached is `null` (was zeros); per-request
/// `max_output_gap`; summary `answer_gap`, `stalled_answers`, `stall_threshold_ms`;
/// `prompt_tokens` is the server's count when it sent `usage`.
pub const JSON_SCHEMA: &str = "meridian-loadtest/2";

/// Per-request rows.
pub fn csv(runs: &[(&RunSummary, &[RequestRecord])]) -> String {
    let mut out = String::from(
        "run,index,sent_at_s,ok,ttft_ms,ttfo_ms,think_to_output_ms,max_output_gap_ms,tpot_ms,e2e_ms,think_tokens,output_tokens,usage_reported,error\n",
    );
    let ms = |v: Option<f64>| v.map(|s| format!("{:.3}", s * 1000.0)).unwrap_or_default();
    for (summary, records) in runs {
        for r in records.iter() {
            let error = r.error.as_deref().unwrap_or("").replace(['"', '\n'], " ");
            out.push_str(&format!(
                "{},{},{:.6},{},{},{},{},{},{},{},{},{},{},\"{}\"\n",
                summary.label,
                r.index,
                r.sent_at,
                r.ok,
                ms(r.ttft),
                ms(r.ttfo),
                ms(r.think_to_output),
                ms(r.max_output_gap),
                ms(r.tpot),
                ms(r.e2e),
                r.think_tokens(),
                r.output_tokens(),
                r.usage_think_tokens.is_some(),
                error
            ));
        }
    }
    out
}
