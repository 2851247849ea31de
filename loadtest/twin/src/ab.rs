//! Policy A/B on the twin: the same seeded workload, at loads given as fractions of the
//! stock engine's capacity, under each policy; p50/p99 of what reasoning users feel,
//! throughput, and goodput under a joint SLO. Produces a markdown report.

use std::fmt::Write;

use meridian_core::sched::policy_by_name;

use crate::engine::EngineConfig;
use crate::experiment::{ExperimentResult, SimRecord, run_poisson};
use crate::workload::WorkloadSpec;

/// A joint per-request SLO: think-to-output gap and mean output ITL.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JointSlo {
    pub ttot_ms: f64,
    pub mean_output_itl_ms: f64,
}

impl JointSlo {
    pub fn met_by(&self, r: &SimRecord) -> bool {
        let ttot_ok = r.think_to_output.is_none_or(|t| t * 1000.0 <= self.ttot_ms);
        let itl_ok = r.output_itl.is_empty()
            || r.output_itl.iter().sum::<f64>() / r.output_itl.len() as f64 * 1000.0
                <= self.mean_output_itl_ms;
        r.e2e.is_some() && ttot_ok && itl_ok
    }
}

/// One cell of the comparison.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Cell {
    pub policy: String,
    pub load: f64,
    pub rate: f64,
    pub ttfo_p50_ms: f64,
    pub ttfo_p99_ms: f64,
    pub ttot_p50_ms: f64,
    pub ttot_p99_ms: f64,
    pub itl_p50_ms: f64,
    pub itl_p99_ms: f64,
    pub tokens_per_s: f64,
    pub goodput: f64,
    pub preemptions: u64,
    pub output_critical_preemptions: u64,
}

fn pct(mut v: Vec<f64>, p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((p / 100.0 * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1] * 1000.0
}

fn cell(policy: &str, load: f64, rate: f64, res: &ExperimentResult, slo: JointSlo) -> Cell {
    let ttfo: Vec<f64> = res.records.iter().filter_map(|r| r.ttfo).collect();
    let ttot: Vec<f64> = res.records.iter().filter_map(|r| r.think_to_output).collect();
    let itl: Vec<f64> = res.records.iter().flat_map(|r| r.output_itl.iter().copied()).collect();
    let good = res.records.iter().filter(|r| slo.met_by(r)).count();
    Cell {
        policy: policy.to_owned(),
        load,
        rate,
        ttfo_p50_ms: pct(ttfo.clone(), 50.0),
        ttfo_p99_ms: pct(ttfo, 99.0),
        ttot_p50_ms: pct(ttot.clone(), 50.0),
        ttot_p99_ms: pct(ttot, 99.0),
        itl_p50_ms: pct(itl.clone(), 50.0),
        itl_p99_ms: pct(itl, 99.0),
        tokens_per_s: res.total_token_throughput(),
        goodput: good as f64 / res.makespan_s.max(1e-9),
        preemptions: res.preemptions,
        output_critical_preemptions: res.output_critical_preemptions,
    }
}

/// Requests per second the stock engine completes when it is never idle.
pub fn capacity(config: EngineConfig, spec: WorkloadSpec, n: usize, seed: u64) -> f64 {
    let res = run_poisson(config, Box::new(meridian_core::sched::Fcfs), spec, 1e6, n, seed);
    res.records.iter().filter(|r| r.e2e.is_some()).count() as f64 / res.makespan_s.max(1e-9)
}

/// Every policy at every load. Unknown policy names are an error. Loads are fractions of
/// `base_capacity` when given (say, another engine's: the same absolute rates for an A/B
/// whose sides run on different cost models), else of this engine's stock capacity.
#[allow(clippy::too_many_arguments)]
pub fn compare(
    config: EngineConfig,
    spec: WorkloadSpec,
    policies: &[String],
    loads: &[f64],
    n: usize,
    seed: u64,
    slo: JointSlo,
    base_capacity: Option<f64>,
) -> Result<(f64, Vec<Cell>), String> {
    let cap = base_capacity.unwrap_or_else(|| capacity(config, spec, n, seed));
    let mut cells = Vec::new();
    for &load in loads {
        for name in policies {
            let policy = policy_by_name(name).ok_or_else(|| format!("unknown policy {name:?}"))?;
            let res = run_poisson(config, policy, spec, cap * load, n, seed);
            cells.push(cell(name, load, cap * load, &res, slo));
        }
    }
    Ok((cap, cells))
}

/// The comparison as a markdown table, with each policy's ratio to the first one.
pub fn markdown(cap: f64, cells: &[Cell], slo: JointSlo) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "Stock (FCFS) capacity: {cap:.2} req/s. Joint SLO for goodput: think-to-output gap <= {} ms and mean output ITL <= {} ms.\n",
        slo.ttot_ms, slo.mean_output_itl_ms
    );
    md.push_str("| load | policy | req/s | TTFO p50 / p99 (ms) | TTOT p50 / p99 (ms) | output ITL p50 / p99 (ms) | tokens/s | goodput (req/s) | preemptions (of answering requests) |\n");
    md.push_str("|---:|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for c in cells {
        let _ = writeln!(
            md,
            "| {:.0}% | {} | {:.2} | {:.0} / {:.0} | {:.1} / {:.1} | {:.1} / {:.1} | {:.0} | {:.2} | {} ({}) |",
            c.load * 100.0,
            c.policy,
            c.rate,
            c.ttfo_p50_ms,
            c.ttfo_p99_ms,
            c.ttot_p50_ms,
            c.ttot_p99_ms,
            c.itl_p50_ms,
            c.itl_p99_ms,
            c.tokens_per_s,
            c.goodput,
            c.preemptions,
            c.output_critical_preemptions
        );
    }
    md
}

/// Load-vs-metric plots of a comparison, one line per policy: `(file suffix, svg)` for
/// p99 think-to-output gap, p99 output ITL and token throughput.
pub fn plots(cells: &[Cell]) -> Vec<(&'static str, String)> {
    let mut policies: Vec<&str> = Vec::new();
    for c in cells {
        if !policies.contains(&c.policy.as_str()) {
            policies.push(&c.policy);
        }
    }
    let series = |f: fn(&Cell) -> f64| -> Vec<meridian_plot::Series> {
        policies
            .iter()
            .map(|p| meridian_plot::Series {
                name: (*p).to_owned(),
                points: cells.iter().filter(|c| c.policy == *p).map(|c| (c.load * 100.0, f(c))).collect(),
            })
            .collect()
    };
    let load = "load (% of stock capacity)";
    vec![
        ("ttot-p99", meridian_plot::plot("p99 think-to-output gap", load, "ms", &series(|c| c.ttot_p99_ms))),
        (
            "itl-p99",
            meridian_plot::plot("p99 output inter-token latency", load, "ms", &series(|c| c.itl_p99_ms)),
        ),
        (
            "throughput",
            meridian_plot::plot("token throughput", load, "tokens/s", &series(|c| c.tokens_per_s)),
        ),
    ]
}

/// Splits a comma-separated policy list in which a policy's own `key=value` parameters
/// are also comma-separated: a segment with `=` but no `:` belongs to the policy before it.
pub fn split_policies(list: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for seg in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match out.last_mut() {
            Some(prev) if seg.contains('=') && !seg.contains(':') => {
                prev.push(',');
                prev.push_str(seg);
            }
            _ => out.push(seg.to_owned()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn policy_lists_keep_parameters_with_their_policy() {
        assert_eq!(
            super::split_policies("fcfs, output-first:express=1,output_prefill_cap=128,reasoning-first"),
            vec!["fcfs", "output-first:express=1,output_prefill_cap=128", "reasoning-first"]
        );
    }

    use super::*;
    use crate::workload::LengthDist;

    #[test]
    fn compare_runs_every_policy_at_every_load_on_the_same_workload() {
        let cfg = EngineConfig::from(&crate::profile("tiny-test").unwrap());
        let spec = WorkloadSpec {
            prompt: LengthDist::Uniform { min: 4, max: 20 },
            think: LengthDist::Uniform { min: 5, max: 40 },
            answer: LengthDist::Uniform { min: 2, max: 10 },
            entropy: Default::default(),
        };
        let slo = JointSlo { ttot_ms: 100.0, mean_output_itl_ms: 100.0 };
        let policies = vec!["fcfs".to_owned(), "output-first".to_owned()];
        let (cap, cells) = compare(cfg, spec, &policies, &[0.5, 0.9], 60, 1, slo, None).unwrap();
        assert!(cap > 0.0);
        assert_eq!(cells.len(), 4);
        assert!(cells.iter().all(|c| c.tokens_per_s > 0.0 && c.ttfo_p99_ms >= c.ttfo_p50_ms));
        assert!(compare(cfg, spec, &["nope".to_owned()], &[0.5], 10, 1, slo, None).is_err());
        let (fixed, cells) = compare(cfg, spec, &policies, &[0.5], 60, 1, slo, Some(2.0)).unwrap();
        assert_eq!(fixed, 2.0);
        assert!(cells.iter().all(|c| c.rate == 1.0), "loads are fractions of the given capacity");
        assert!(markdown(cap, &cells, slo).contains("| 90% | output-first |"));
    }
}
