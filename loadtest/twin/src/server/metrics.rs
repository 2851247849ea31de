//! The twin's `/metrics`, under vLLM's own metric names so whatever scrapes a vLLM (the
//! proxy's admission control, dashboards) reads the twin the same way.

use std::fmt::Write;

/// A cumulative histogram with fixed bounds, rendered in Prometheus text format.
#[derive(Debug, Clone)]
pub struct Hist {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

pub const LATENCY_BOUNDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0,
];

impl Hist {
    pub fn new(bounds: &'static [f64]) -> Self {
        Hist { bounds, counts: vec![0; bounds.len()], sum: 0.0, count: 0 }
    }

    pub fn observe(&mut self, v: f64) {
        for (b, c) in self.bounds.iter().zip(self.counts.iter_mut()) {
            if v <= *b {
                *c += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let _ = writeln!(out, "# TYPE {name} histogram");
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{b}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
    }
}

#[derive(Debug, Clone)]
pub struct TwinMetrics {
    pub ttft: Hist,
    pub itl: Hist,
    pub e2e: Hist,
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub finished: u64,
    pub aborted: u64,
    /// The most requests held at once (running and waiting), as of each arrival: what an
    /// admission limit in front of the engine should bound.
    pub requests_peak: usize,
    /// Waits for a place (`admission.places = "engine"`) answered because a place is
    /// there for the waiting replica (`Places::wakes`), as the hook's
    /// `meridian_hook_place_waits_total{outcome="woken"}`.
    pub place_waits_woken: u64,
}

impl Default for TwinMetrics {
    fn default() -> Self {
        TwinMetrics {
            ttft: Hist::new(LATENCY_BOUNDS),
            itl: Hist::new(LATENCY_BOUNDS),
            e2e: Hist::new(LATENCY_BOUNDS),
            prompt_tokens: 0,
            generation_tokens: 0,
            finished: 0,
            aborted: 0,
            requests_peak: 0,
            place_waits_woken: 0,
        }
    }
}

/// Live engine figures at scrape time.
pub struct EngineGauges {
    pub running: usize,
    pub waiting: usize,
    pub kv_usage: f64,
    pub preemptions: u64,
    pub output_critical_preemptions: u64,
    pub steps: u64,
    pub virtual_s: f64,
    /// The prefix cache's queries and hits, in prompt tokens (`None`: the cache is off).
    pub prefix: Option<meridian_core::kv::PrefixCounters>,
}

pub fn render(m: &TwinMetrics, g: &EngineGauges, model: &str, policy: &str) -> String {
    let labels = format!("engine=\"0\",model_name=\"{}\"", model.replace('"', "'"));
    let mut out = String::new();
    let mut gauge = |name: &str, kind: &str, v: String| {
        let _ = writeln!(out, "# TYPE {name} {kind}");
        let _ = writeln!(out, "{name}{{{labels}}} {v}");
    };
    gauge("vllm:num_requests_running", "gauge", g.running.to_string());
    gauge("vllm:num_requests_waiting", "gauge", g.waiting.to_string());
    gauge("vllm:kv_cache_usage_perc", "gauge", g.kv_usage.to_string());
    gauge("vllm:num_preemptions_total", "counter", g.preemptions.to_string());
    gauge("vllm:prompt_tokens_total", "counter", m.prompt_tokens.to_string());
    gauge("vllm:generation_tokens_total", "counter", m.generation_tokens.to_string());
    gauge("meridian_sim_steps_total", "counter", g.steps.to_string());
    gauge(
        "meridian_sim_output_critical_preemptions_total",
        "counter",
        g.output_critical_preemptions.to_string(),
    );
    gauge("meridian_sim_virtual_seconds", "gauge", g.virtual_s.to_string());
    gauge("meridian_sim_requests_peak", "gauge", m.requests_peak.to_string());
    gauge("meridian_sim_place_waits_woken_total", "counter", m.place_waits_woken.to_string());
    if let Some(p) = &g.prefix {
        gauge("vllm:prefix_cache_queries_total", "counter", p.queried_tokens.to_string());
        gauge("vllm:prefix_cache_hits_total", "counter", p.hit_tokens.to_string());
    }
    let _ = writeln!(out, "# TYPE vllm:request_success_total counter");
    let _ = writeln!(out, "vllm:request_success_total{{{labels},finished_reason=\"stop\"}} {}", m.finished);
    let _ = writeln!(out, "vllm:request_success_total{{{labels},finished_reason=\"abort\"}} {}", m.aborted);
    let _ = writeln!(out, "# TYPE meridian_sim_policy_info gauge");
    let _ = writeln!(out, "meridian_sim_policy_info{{{labels},policy=\"{policy}\"}} 1");
    m.ttft.render(&mut out, "vllm:time_to_first_token_seconds", &labels);
    m.itl.render(&mut out, "vllm:inter_token_latency_seconds", &labels);
    m.e2e.render(&mut out, "vllm:e2e_request_latency_seconds", &labels);
    out
}
