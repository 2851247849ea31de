//! When does migration pay: every split of the engines against the same engines as one
//! pool, at loads relative to the one pool's capacity, the same arrivals on both sides
//! for each seed. Each figure is the paired ratio (split over shared), its median over
//! the seeds with the seeds' range; a verdict only where every seed agrees.

use std::fmt::Write;

use meridian_core::sched::SchedulingPolicy;

use super::{MigrationResult, Move, Pools, run};
use crate::ab::percentile;
use crate::engine::EngineConfig;
use crate::experiment::{SimRecord, poisson_arrivals};
use crate::workload::WorkloadSpec;

/// What a user feels, per run: lower is better for all but throughput.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Metric {
    TtftP50,
    TtftP99,
    TtfoP99,
    TtotP99,
    ItlP99,
    GapP99,
    E2eP50,
    E2eP99,
    Throughput,
}

impl Metric {
    pub const ALL: [Metric; 9] = [
        Metric::TtftP50,
        Metric::TtftP99,
        Metric::TtfoP99,
        Metric::TtotP99,
        Metric::ItlP99,
        Metric::GapP99,
        Metric::E2eP50,
        Metric::E2eP99,
        Metric::Throughput,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Metric::TtftP50 => "TTFT p50",
            Metric::TtftP99 => "TTFT p99",
            Metric::TtfoP99 => "TTFO p99",
            Metric::TtotP99 => "TTOT p99",
            Metric::ItlP99 => "answer ITL p99",
            Metric::GapP99 => "largest answer gap p99",
            Metric::E2eP50 => "end to end p50",
            Metric::E2eP99 => "end to end p99",
            Metric::Throughput => "throughput",
        }
    }

    fn higher_is_better(self) -> bool {
        self == Metric::Throughput
    }

    /// The metric of one run.
    pub fn of(self, r: &MigrationResult) -> Option<f64> {
        let all = |f: fn(&SimRecord) -> Option<f64>| r.records.iter().filter_map(f).collect::<Vec<f64>>();
        let itl: Vec<f64> = r.records.iter().flat_map(|x| x.output_itl.iter().copied()).collect();
        match self {
            Metric::TtftP50 => percentile(&all(|x| x.ttft), 50.0),
            Metric::TtftP99 => percentile(&all(|x| x.ttft), 99.0),
            Metric::TtfoP99 => percentile(&all(|x| x.ttfo), 99.0),
            Metric::TtotP99 => percentile(&all(|x| x.think_to_output), 99.0),
            Metric::ItlP99 => percentile(&itl, 99.0),
            Metric::GapP99 => percentile(&all(SimRecord::largest_answer_gap), 99.0),
            Metric::E2eP50 => percentile(&all(|x| x.e2e), 50.0),
            Metric::E2eP99 => percentile(&all(|x| x.e2e), 99.0),
            Metric::Throughput => Some(r.throughput()),
        }
    }
}

/// One split at one load: the paired ratios over the seeds, per metric.
#[derive(Debug, Clone)]
pub struct Cell {
    pub load: f64,
    pub pools: Pools,
    /// Per metric (in [`Metric::ALL`] order), each seed's split / shared ratio.
    pub ratios: Vec<Vec<f64>>,
    /// Per metric, the shared pool's own figure, median over the seeds.
    pub shared: Vec<Option<f64>>,
    /// Share of requests whose answer moved, median over the seeds.
    pub handed_over: f64,
}

/// The median and the range of `v` (`None` when empty).
fn median_range(v: &[f64]) -> Option<(f64, f64, f64)> {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    s.sort_by(f64::total_cmp);
    let (lo, hi) = (*s.first()?, *s.last()?);
    let mid = if s.len() % 2 == 1 { s[s.len() / 2] } else { (s[s.len() / 2 - 1] + s[s.len() / 2]) / 2.0 };
    Some((mid, lo, hi))
}

impl Cell {
    /// The metric's ratio as a table cell: median [range], marked where every seed says
    /// the split is better (`✓`) or worse (`✗`) by more than 5%.
    fn figure(&self, i: usize) -> String {
        let Some((mid, lo, hi)) = median_range(&self.ratios[i]) else { return "n/a".into() };
        let better_lower = !Metric::ALL[i].higher_is_better();
        let (better, worse) = if better_lower { (hi < 0.95, lo > 1.05) } else { (lo > 1.05, hi < 0.95) };
        let mark = if better {
            " ✓"
        } else if worse {
            " ✗"
        } else {
            ""
        };
        format!("{mid:.2} [{lo:.2}–{hi:.2}]{mark}")
    }
}

/// The one pool's capacity: requests a second when all `n` arrive at once.
pub fn capacity(
    config: EngineConfig,
    policy: &dyn Fn() -> Box<dyn SchedulingPolicy>,
    spec: WorkloadSpec,
    engines: usize,
    n: usize,
    seed: u64,
) -> f64 {
    let arrivals = poisson_arrivals(spec, 1e9, n, seed);
    run(config, policy, &arrivals, Pools::Shared { engines }).throughput()
}

/// Every split at every load (fractions of `cap`, the shared pool's capacity), `n`
/// requests a run, each seed on both sides.
#[allow(clippy::too_many_arguments)]
pub fn cells(
    config: EngineConfig,
    policy: &dyn Fn() -> Box<dyn SchedulingPolicy>,
    spec: WorkloadSpec,
    engines: usize,
    splits: &[Pools],
    cap: f64,
    loads: &[f64],
    n: usize,
    seeds: &[u64],
) -> Vec<Cell> {
    let mut out = Vec::new();
    for &load in loads {
        let runs: Vec<_> = seeds.iter().map(|&seed| poisson_arrivals(spec, cap * load, n, seed)).collect();
        let shared: Vec<MigrationResult> =
            runs.iter().map(|a| run(config, policy, a, Pools::Shared { engines })).collect();
        let shared_figures: Vec<Vec<Option<f64>>> =
            shared.iter().map(|r| Metric::ALL.iter().map(|m| m.of(r)).collect()).collect();
        for &pools in splits {
            let split: Vec<MigrationResult> = runs.iter().map(|a| run(config, policy, a, pools)).collect();
            let ratios = (0..Metric::ALL.len())
                .map(|i| {
                    split
                        .iter()
                        .zip(&shared_figures)
                        .filter_map(|(s, base)| Some(Metric::ALL[i].of(s)? / base[i].filter(|b| *b > 0.0)?))
                        .collect()
                })
                .collect();
            let moved: Vec<f64> =
                split.iter().map(|r| r.handed_over as f64 / r.records.len().max(1) as f64).collect();
            out.push(Cell {
                load,
                pools,
                ratios,
                shared: (0..Metric::ALL.len())
                    .map(|i| {
                        let v: Vec<f64> = shared_figures.iter().filter_map(|f| f[i]).collect();
                        median_range(&v).map(|(m, _, _)| m)
                    })
                    .collect(),
                handed_over: median_range(&moved).map_or(0.0, |(m, _, _)| m),
            });
        }
    }
    out
}

/// A split's name in the table.
pub fn split_name(p: Pools) -> String {
    match p {
        Pools::Shared { engines } => format!("{engines} shared"),
        Pools::Split { think, answer, moved } => {
            let how = match moved {
                Move::Reprefill => "re-prefill".to_owned(),
                Move::Connector { fixed_s, per_token_s } => {
                    format!("connector ({:.0} ms + {:.1} µs/token)", fixed_s * 1e3, per_token_s * 1e6)
                }
            };
            format!("{think} think + {answer} answer, {how}")
        }
    }
}

/// The cells as markdown: per load, the shared pool's own figures, then each split's
/// paired ratios.
pub fn markdown(cap: f64, cells: &[Cell], seeds: usize) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "The shared pool's capacity: {cap:.2} requests/s. Each split's figure is split / shared \
         on the same arrivals, the median over {seeds} seeds [their range]; ✓ where every seed has \
         the split better by more than 5%, ✗ where every seed has it worse by more than 5% \
         (throughput: higher is better; every other metric: lower).\n"
    );
    let mut loads: Vec<f64> = cells.iter().map(|c| c.load).collect();
    loads.dedup();
    for load in loads {
        let here: Vec<&Cell> = cells.iter().filter(|c| c.load == load).collect();
        let _ = writeln!(
            md,
            "**Load {:.0}% of the shared pool's capacity** ({:.2} requests/s)\n",
            load * 100.0,
            cap * load
        );
        let _ = write!(md, "| metric | shared (ms, or req/s) |");
        for c in &here {
            let _ = write!(md, " {} |", split_name(c.pools));
        }
        let _ = write!(md, "\n|---|---:|");
        for _ in &here {
            let _ = write!(md, "---:|");
        }
        md.push('\n');
        for (i, m) in Metric::ALL.iter().enumerate() {
            let base = here.first().and_then(|c| c.shared[i]).map_or_else(
                || "n/a".to_owned(),
                |v| if m.higher_is_better() { format!("{v:.2}") } else { format!("{:.0}", v * 1e3) },
            );
            let _ = write!(md, "| {} | {base} |", m.label());
            for c in &here {
                let _ = write!(md, " {} |", c.figure(i));
            }
            md.push('\n');
        }
        let _ = write!(md, "| answers handed over | |");
        for c in &here {
            let _ = write!(md, " {:.0}% |", c.handed_over * 100.0);
        }
        md.push_str("\n\n");
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_core::sched::Fcfs;

    #[test]
    fn a_cell_says_better_or_worse_only_where_every_seed_agrees() {
        let cell = |ratios: Vec<f64>| Cell {
            load: 0.5,
            pools: Pools::Shared { engines: 2 },
            ratios: vec![ratios; Metric::ALL.len()],
            shared: vec![None; Metric::ALL.len()],
            handed_over: 0.0,
        };
        assert_eq!(cell(vec![0.5, 0.6, 0.9]).figure(0), "0.60 [0.50–0.90] ✓");
        assert_eq!(cell(vec![0.5, 0.6, 0.99]).figure(0), "0.60 [0.50–0.99]", "one seed within 5%");
        assert_eq!(cell(vec![1.2, 1.1, 1.3]).figure(0), "1.20 [1.10–1.30] ✗");
        let throughput = Metric::ALL.iter().position(|m| *m == Metric::Throughput).unwrap();
        assert_eq!(cell(vec![1.2, 1.1, 1.3]).figure(throughput), "1.20 [1.10–1.30] ✓", "higher is better");
    }

    #[test]
    fn the_shared_pool_against_itself_is_one_everywhere() {
        let cfg = EngineConfig::from(&crate::profile("tiny-test").unwrap());
        let fcfs = || -> Box<dyn SchedulingPolicy> { Box::new(Fcfs) };
        let spec = WorkloadSpec::fixed(20, 10, 5);
        let cap = capacity(cfg, &fcfs, spec, 2, 40, 1);
        assert!(cap > 0.0);
        let same = cells(cfg, &fcfs, spec, 2, &[Pools::Shared { engines: 2 }], cap, &[0.5], 40, &[1, 2]);
        for ratios in &same[0].ratios {
            assert!(ratios.iter().all(|r| (r - 1.0).abs() < 1e-12), "{ratios:?}");
        }
        let split = Pools::Split { think: 1, answer: 1, moved: Move::Reprefill };
        let md = markdown(cap, &cells(cfg, &fcfs, spec, 2, &[split], cap, &[0.5], 40, &[1, 2]), 2);
        assert!(
            md.contains("1 think + 1 answer, re-prefill") && md.contains("| answers handed over | | 100% |"),
            "{md}"
        );
    }
}
