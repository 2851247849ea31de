//! Policy A/B on the twin: the same seeded workload, at loads given as fractions of the
//! stock engine's capacity, under each policy; p50/p99 of what reasoning users feel
//! (including each answer's longest stall), throughput, and goodput under a joint SLO.
//! Produces a markdown report, and verdicts computed from its figures ([`verdicts`]).

mod verdict;

use std::fmt::Write;

use meridian_core::sched::policy_by_name;

pub use verdict::{BASELINE, Target, verdicts};

use crate::engine::EngineConfig;
use crate::experiment::{ExperimentResult, SimRecord, run_poisson};
use crate::workload::WorkloadSpec;

/// An answer whose largest gap between visible tokens exceeds this stalled, as a reader
/// sees it (a quarter second reads as a hiccup, not as typing).
pub const STALL_MS: f64 = 250.0;

/// A joint per-request SLO on what a reader sees: the think-to-output gap and the
/// largest gap inside the answer, optionally also the mean output ITL.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JointSlo {
    pub ttot_ms: f64,
    /// Bound on each request's largest gap between consecutive visible tokens.
    pub answer_gap_ms: f64,
    pub mean_output_itl_ms: Option<f64>,
}

impl JointSlo {
    pub fn met_by(&self, r: &SimRecord) -> bool {
        let ttot_ok = r.think_to_output.is_none_or(|t| t * 1000.0 <= self.ttot_ms);
        let gap_ok = r.largest_answer_gap().is_none_or(|g| g * 1000.0 <= self.answer_gap_ms);
        let itl_ok = match self.mean_output_itl_ms {
            Some(bound) if !r.output_itl.is_empty() => {
                r.output_itl.iter().sum::<f64>() / r.output_itl.len() as f64 * 1000.0 <= bound
            }
            _ => true,
        };
        r.e2e.is_some() && ttot_ok && gap_ok && itl_ok
    }

    /// The SLO in words, for report headers.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "think-to-output gap <= {} ms and largest answer gap <= {} ms",
            self.ttot_ms, self.answer_gap_ms
        );
        if let Some(itl) = self.mean_output_itl_ms {
            let _ = write!(s, " and mean output ITL <= {itl} ms");
        }
        s
    }
}

/// One cell of the comparison. Latency figures are `None` where no request produced
/// what they measure (no answer at all, or no answer of two tokens): absent, not 0.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Cell {
    pub policy: String,
    pub load: f64,
    pub rate: f64,
    pub ttfo_p50_ms: Option<f64>,
    pub ttfo_p99_ms: Option<f64>,
    pub ttot_p50_ms: Option<f64>,
    pub ttot_p99_ms: Option<f64>,
    /// Over the pooled gaps between visible tokens of every request.
    pub itl_p50_ms: Option<f64>,
    pub itl_p99_ms: Option<f64>,
    /// Over requests: each one's largest gap between consecutive visible tokens.
    pub answer_gap_p50_ms: Option<f64>,
    pub answer_gap_p99_ms: Option<f64>,
    /// Share (0..1) of those answers whose largest gap exceeds [`STALL_MS`].
    pub stalled_answers: Option<f64>,
    pub tokens_per_s: f64,
    pub goodput: f64,
    pub preemptions: u64,
    pub output_critical_preemptions: u64,
}

/// The `p`th percentile in milliseconds of seconds `v`; `None` for no values.
fn pct_ms(v: &[f64], p: f64) -> Option<f64> {
    percentile(v, p).map(|s| s * 1000.0)
}

/// The `p`th percentile of `v` by nearest rank; `None` for no values.
pub(crate) fn percentile(v: &[f64], p: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    Some(v[((p / 100.0 * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1])
}

fn cell(policy: &str, load: f64, rate: f64, res: &ExperimentResult, slo: JointSlo) -> Cell {
    let ttfo: Vec<f64> = res.records.iter().filter_map(|r| r.ttfo).collect();
    let ttot: Vec<f64> = res.records.iter().filter_map(|r| r.think_to_output).collect();
    let itl: Vec<f64> = res.records.iter().flat_map(|r| r.output_itl.iter().copied()).collect();
    let gaps: Vec<f64> = res.records.iter().filter_map(SimRecord::largest_answer_gap).collect();
    let stalled = gaps.iter().filter(|g| **g * 1000.0 > STALL_MS).count();
    let good = res.records.iter().filter(|r| slo.met_by(r)).count();
    Cell {
        policy: policy.to_owned(),
        load,
        rate,
        ttfo_p50_ms: pct_ms(&ttfo, 50.0),
        ttfo_p99_ms: pct_ms(&ttfo, 99.0),
        ttot_p50_ms: pct_ms(&ttot, 50.0),
        ttot_p99_ms: pct_ms(&ttot, 99.0),
        itl_p50_ms: pct_ms(&itl, 50.0),
        itl_p99_ms: pct_ms(&itl, 99.0),
        answer_gap_p50_ms: pct_ms(&gaps, 50.0),
        answer_gap_p99_ms: pct_ms(&gaps, 99.0),
        stalled_answers: (!gaps.is_empty()).then(|| stalled as f64 / gaps.len() as f64),
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

/// A figure with `decimals` decimals, or "n/a" where there is none.
pub(crate) fn figure(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.decimals$}"))
}

/// The comparison as a markdown table.
pub fn markdown(cap: f64, cells: &[Cell], slo: JointSlo) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "Stock (FCFS) capacity: {cap:.2} req/s. Joint SLO for goodput: {}. Answer gap: each request's largest gap between consecutive visible tokens; stalled: share of answers (of two tokens or more) with a gap over {STALL_MS} ms. n/a: no request produced that figure.\n",
        slo.describe()
    );
    md.push_str("| load | policy | req/s | TTFO p50 / p99 (ms) | TTOT p50 / p99 (ms) | output ITL p50 / p99 (ms) | answer gap p50 / p99 (ms) | stalled answers | tokens/s | goodput (req/s) | preemptions (of answering requests) |\n");
    md.push_str("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for c in cells {
        let _ = writeln!(
            md,
            "| {:.0}% | {} | {:.2} | {} / {} | {} / {} | {} / {} | {} / {} | {} | {:.0} | {:.2} | {} ({}) |",
            c.load * 100.0,
            c.policy,
            c.rate,
            figure(c.ttfo_p50_ms, 0),
            figure(c.ttfo_p99_ms, 0),
            figure(c.ttot_p50_ms, 1),
            figure(c.ttot_p99_ms, 1),
            figure(c.itl_p50_ms, 1),
            figure(c.itl_p99_ms, 1),
            figure(c.answer_gap_p50_ms, 1),
            figure(c.answer_gap_p99_ms, 1),
            c.stalled_answers.map_or_else(|| "n/a".to_owned(), |s| format!("{:.1}%", s * 100.0)),
            c.tokens_per_s,
            c.goodput,
            c.preemptions,
            c.output_critical_preemptions
        );
    }
    md
}

/// Load-vs-metric plots of a comparison, one line per policy: `(file suffix, svg)` for
/// p99 think-to-output gap, p99 output ITL, p99 largest answer gap and token
/// throughput. Loads where a policy has no figure are left out of its line.
pub fn plots(cells: &[Cell]) -> Vec<(&'static str, String)> {
    let mut policies: Vec<&str> = Vec::new();
    for c in cells {
        if !policies.contains(&c.policy.as_str()) {
            policies.push(&c.policy);
        }
    }
    let series = |f: fn(&Cell) -> Option<f64>| -> Vec<meridian_plot::Series> {
        policies
            .iter()
            .map(|p| meridian_plot::Series {
                name: (*p).to_owned(),
                points: cells
                    .iter()
                    .filter(|c| c.policy == *p)
                    .filter_map(|c| f(c).map(|v| (c.load * 100.0, v)))
                    .collect(),
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
            "answer-gap-p99",
            meridian_plot::plot(
                "p99 over requests of the largest answer gap",
                load,
                "ms",
                &series(|c| c.answer_gap_p99_ms),
            ),
        ),
        (
            "throughput",
            meridian_plot::plot("token throughput", load, "tokens/s", &series(|c| Some(c.tokens_per_s))),
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
        let slo = JointSlo { ttot_ms: 100.0, answer_gap_ms: 250.0, mean_output_itl_ms: Some(100.0) };
        let policies = vec!["fcfs".to_owned(), "output-first".to_owned()];
        let (cap, cells) = compare(cfg, spec, &policies, &[0.5, 0.9], 60, 1, slo, None).unwrap();
        assert!(cap > 0.0);
        assert_eq!(cells.len(), 4);
        assert!(cells.iter().all(|c| c.tokens_per_s > 0.0 && c.ttfo_p99_ms >= c.ttfo_p50_ms));
        assert!(
            cells.iter().all(|c| c.answer_gap_p99_ms >= c.answer_gap_p50_ms && c.answer_gap_p50_ms.is_some())
        );
        assert!(compare(cfg, spec, &["nope".to_owned()], &[0.5], 10, 1, slo, None).is_err());
        let (fixed, at_fixed) = compare(cfg, spec, &policies, &[0.5], 60, 1, slo, Some(2.0)).unwrap();
        assert_eq!(fixed, 2.0);
        assert!(at_fixed.iter().all(|c| c.rate == 1.0), "loads are fractions of the given capacity");
        let md = markdown(cap, &cells, slo);
        assert!(md.contains("| 90% | output-first |"));
        assert!(md.contains("largest answer gap <= 250 ms and mean output ITL <= 100 ms"), "{md}");
        assert_eq!(plots(&cells).len(), 4);
    }

    /// A finished request whose visible tokens come at `gaps_ms` after its first one.
    fn answered(ttot_ms: f64, gaps_ms: &[f64]) -> SimRecord {
        SimRecord {
            think_to_output: Some(ttot_ms / 1000.0),
            ttfo: Some(1.0),
            output_itl: gaps_ms.iter().map(|g| g / 1000.0).collect(),
            e2e: Some(2.0),
            output_tokens: gaps_ms.len() as u32 + 1,
            ..SimRecord::default()
        }
    }

    fn result(records: Vec<SimRecord>) -> ExperimentResult {
        ExperimentResult {
            records,
            makespan_s: 10.0,
            steps: 1,
            preemptions: 0,
            output_critical_preemptions: 0,
            prefill_capped_steps: 0,
            request_steps: Default::default(),
            wall_s: 0.0,
        }
    }

    const SLO: JointSlo = JointSlo { ttot_ms: 200.0, answer_gap_ms: 250.0, mean_output_itl_ms: None };

    #[test]
    fn one_long_stall_shows_in_the_answer_gap_but_not_in_pooled_itl() {
        // 20 requests streaming every 10 ms; one of them stalls once for 600 ms.
        let smooth = vec![10.0; 99];
        let mut stalled = smooth.clone();
        stalled[40] = 600.0;
        let mut records = vec![answered(20.0, &stalled)];
        records.extend((0..19).map(|_| answered(20.0, &smooth)));
        let c = cell("p", 0.9, 1.0, &result(records), SLO);
        assert_eq!(c.itl_p99_ms, Some(10.0), "1 gap in 1980: the pooled p99 does not see it");
        assert_eq!(c.answer_gap_p99_ms, Some(600.0), "the reader of that answer does");
        assert_eq!(c.answer_gap_p50_ms, Some(10.0));
        assert_eq!(c.stalled_answers, Some(0.05));
        // Mean ITL of the stalled answer is ~16 ms: only the answer-gap term fails it.
        assert!((c.goodput - 1.9).abs() < 1e-9, "19 of 20 meet the SLO in 10 s: {}", c.goodput);
    }

    #[test]
    fn figures_are_absent_where_no_request_reached_its_answer() {
        let thinking_only = SimRecord { ttft: Some(0.5), think_tokens: 40, ..SimRecord::default() };
        let c = cell("p", 0.5, 1.0, &result(vec![thinking_only]), SLO);
        assert_eq!((c.ttfo_p99_ms, c.ttot_p99_ms, c.itl_p99_ms), (None, None, None));
        assert_eq!((c.answer_gap_p99_ms, c.stalled_answers), (None, None));
        let row = markdown(1.0, &[c], SLO);
        assert!(row.contains("| n/a / n/a | n/a / n/a | n/a / n/a | n/a / n/a | n/a |"), "{row}");
        // One-token answers: a TTOT, but no gap inside the answer.
        let c = cell("p", 0.5, 1.0, &result(vec![answered(30.0, &[])]), SLO);
        assert_eq!((c.ttot_p99_ms, c.answer_gap_p99_ms), (Some(30.0), None));
    }

    #[test]
    fn the_slo_binds_on_ttot_and_the_largest_gap_and_mean_itl_only_if_set() {
        assert!(SLO.met_by(&answered(150.0, &[30.0, 240.0])));
        assert!(!SLO.met_by(&answered(250.0, &[30.0])), "TTOT over");
        assert!(!SLO.met_by(&answered(150.0, &[30.0, 260.0])), "one gap over");
        let with_itl = JointSlo { mean_output_itl_ms: Some(50.0), ..SLO };
        assert!(!with_itl.met_by(&answered(150.0, &[60.0, 60.0])));
        assert!(SLO.met_by(&answered(150.0, &[60.0, 60.0])));
        assert!(!SLO.met_by(&SimRecord::default()), "unfinished");
        assert_eq!(
            with_itl.describe(),
            "think-to-output gap <= 200 ms and largest answer gap <= 250 ms and mean output ITL <= 50 ms"
        );
    }
}
