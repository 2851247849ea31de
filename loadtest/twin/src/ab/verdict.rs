//! Verdicts computed from an A/B table: each policy's ratios to the stock policy at
//! every load, and whether the dispatch target holds, with the figures that decide it.
//! Generated rather than written, so a regenerated report cannot keep a claim its
//! numbers no longer support.

use std::fmt::Write;

use super::{Cell, figure};

/// The policy every other one is measured against: vLLM's default.
pub const BASELINE: &str = "fcfs";

/// A dispatch target against [`BASELINE`] at one load.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Target {
    pub load: f64,
    /// p99 think-to-output gap at least this many times lower.
    pub ttot_p99_times_lower: f64,
    /// p99 output ITL lower by at least this fraction.
    pub itl_p99_lower_by: f64,
    /// Token throughput within this fraction either way.
    pub throughput_within: f64,
}

impl Default for Target {
    /// Issue 12's target: at 90% load, p99 TTOT >= 3x lower, p99 output ITL >= 30% lower,
    /// throughput within 5%.
    fn default() -> Self {
        Target { load: 0.9, ttot_p99_times_lower: 3.0, itl_p99_lower_by: 0.30, throughput_within: 0.05 }
    }
}

/// `policy / base`, where both exist and the base is positive.
fn ratio(policy: Option<f64>, base: Option<f64>) -> Option<f64> {
    match (policy, base) {
        (Some(p), Some(b)) if b > 0.0 => Some(p / b),
        _ => None,
    }
}

fn times(r: Option<f64>) -> String {
    r.map_or_else(|| "n/a".to_owned(), |r| format!("{r:.2}x"))
}

/// A ratio `policy / base` as "N.Nx lower" or "N.Nx higher".
fn lower_or_higher(r: f64) -> String {
    if r <= 1.0 { format!("{:.1}x lower", 1.0 / r) } else { format!("{r:.1}x higher") }
}

fn same_load(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// One criterion of the target: its name, the figures it was judged on, and whether it
/// held (`None`: a figure is missing, so it cannot be judged).
struct Criterion {
    name: &'static str,
    figures: String,
    met: Option<bool>,
}

fn criteria(cell: &Cell, base: &Cell, target: &Target) -> [Criterion; 3] {
    let ttot = ratio(cell.ttot_p99_ms, base.ttot_p99_ms);
    let itl = ratio(cell.itl_p99_ms, base.itl_p99_ms);
    let tput = ratio(Some(cell.tokens_per_s), Some(base.tokens_per_s));
    [
        Criterion {
            name: "p99 TTOT",
            figures: format!(
                "p99 TTOT {} -> {} ms ({})",
                figure(base.ttot_p99_ms, 1),
                figure(cell.ttot_p99_ms, 1),
                ttot.filter(|r| *r > 0.0).map_or_else(|| "n/a".to_owned(), lower_or_higher)
            ),
            met: ttot.map(|r| r * target.ttot_p99_times_lower <= 1.0),
        },
        Criterion {
            name: "p99 output ITL",
            figures: format!(
                "p99 output ITL {} -> {} ms ({})",
                figure(base.itl_p99_ms, 1),
                figure(cell.itl_p99_ms, 1),
                itl.map_or_else(|| "n/a".to_owned(), |r| format!("{:+.0}%", (r - 1.0) * 100.0))
            ),
            met: itl.map(|r| r <= 1.0 - target.itl_p99_lower_by),
        },
        Criterion {
            name: "throughput",
            figures: format!(
                "throughput {:.0} -> {:.0} tokens/s ({})",
                base.tokens_per_s,
                cell.tokens_per_s,
                tput.map_or_else(|| "n/a".to_owned(), |r| format!("{:+.1}%", (r - 1.0) * 100.0))
            ),
            met: tput.map(|r| (r - 1.0).abs() <= target.throughput_within),
        },
    ]
}

/// The verdict on one policy at the target load, as a sentence.
fn target_sentence(cell: &Cell, base: &Cell, target: &Target) -> String {
    let checks = criteria(cell, base, target);
    let figures: Vec<&str> = checks.iter().map(|c| c.figures.as_str()).collect();
    let unjudged: Vec<&str> = checks.iter().filter(|c| c.met.is_none()).map(|c| c.name).collect();
    let missed: Vec<&str> = checks.iter().filter(|c| c.met == Some(false)).map(|c| c.name).collect();
    let verdict = if !unjudged.is_empty() {
        format!("**not judged** (no figure for {})", unjudged.join(", "))
    } else if missed.is_empty() {
        "**met**".to_owned()
    } else {
        format!("**missed** ({})", missed.join(", "))
    };
    format!("`{}` {verdict}: {}.", cell.policy, figures.join(", "))
}

/// Markdown verdicts on `cells` (as [`super::compare`] returns them): per load, each
/// policy's ratios to [`BASELINE`]; at the target's load, whether each policy meets it.
pub fn verdicts(cells: &[Cell], target: &Target) -> String {
    let mut md = String::new();
    let mut loads: Vec<f64> = Vec::new();
    for c in cells {
        if !loads.iter().any(|l| same_load(*l, c.load)) {
            loads.push(c.load);
        }
    }
    let base_at = |load: f64| cells.iter().find(|c| c.policy == BASELINE && same_load(c.load, load));
    if loads.iter().all(|l| base_at(*l).is_none()) {
        let _ = writeln!(md, "No `{BASELINE}` rows in this run: no ratios or verdicts.\n");
        return md;
    }
    let _ = writeln!(
        md,
        "Computed from the table above: ratios to `{BASELINE}` at the same load (p99 TTOT / p99 output ITL / p99 answer gap / throughput; below 1x is lower).\n"
    );
    for &load in &loads {
        let Some(base) = base_at(load) else { continue };
        let others: Vec<String> = cells
            .iter()
            .filter(|c| same_load(c.load, load) && c.policy != BASELINE)
            .map(|c| {
                format!(
                    "`{}` {} / {} / {} / {}",
                    c.policy,
                    times(ratio(c.ttot_p99_ms, base.ttot_p99_ms)),
                    times(ratio(c.itl_p99_ms, base.itl_p99_ms)),
                    times(ratio(c.answer_gap_p99_ms, base.answer_gap_p99_ms)),
                    times(ratio(Some(c.tokens_per_s), Some(base.tokens_per_s)))
                )
            })
            .collect();
        if !others.is_empty() {
            let _ = writeln!(md, "- {:.0}% load: {}.", load * 100.0, others.join("; "));
        }
    }
    let _ = write!(
        md,
        "\nTarget at {:.0}% load (p99 TTOT at least {}x lower, p99 output ITL at least {:.0}% lower, throughput within {:.0}% of `{BASELINE}`):",
        target.load * 100.0,
        target.ttot_p99_times_lower,
        target.itl_p99_lower_by * 100.0,
        target.throughput_within * 100.0
    );
    match base_at(target.load) {
        None => md.push_str(" not in this run.\n"),
        Some(base) => {
            md.push('\n');
            for c in cells.iter().filter(|c| same_load(c.load, target.load) && c.policy != BASELINE) {
                let _ = writeln!(md, "- {}", target_sentence(c, base, target));
            }
        }
    }
    md.push('\n');
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(policy: &str, load: f64, ttot_p99: f64, itl_p99: f64, tokens_per_s: f64) -> Cell {
        Cell {
            policy: policy.into(),
            load,
            rate: 1.0,
            ttfo_p50_ms: Some(1000.0),
            ttfo_p99_ms: Some(5000.0),
            ttot_p50_ms: Some(ttot_p99 / 2.0),
            ttot_p99_ms: Some(ttot_p99),
            itl_p50_ms: Some(itl_p99 / 2.0),
            itl_p99_ms: Some(itl_p99),
            answer_gap_p50_ms: Some(itl_p99),
            answer_gap_p99_ms: Some(2.0 * itl_p99),
            stalled_answers: Some(0.0),
            tokens_per_s,
            goodput: 1.0,
            preemptions: 0,
            output_critical_preemptions: 0,
        }
    }

    #[test]
    fn a_policy_meeting_every_criterion_is_met_with_its_figures() {
        let cells = [
            cell("fcfs", 0.5, 20.0, 20.0, 5000.0),
            cell("output-first", 0.5, 8.0, 15.0, 5000.0),
            cell("fcfs", 0.9, 39.7, 36.5, 8265.0),
            cell("output-first", 0.9, 9.5, 22.3, 8190.0),
        ];
        let md = verdicts(&cells, &Target::default());
        assert!(md.contains("- 50% load: `output-first` 0.40x / 0.75x / 0.75x / 1.00x."), "{md}");
        assert!(
            md.contains(
                "- `output-first` **met**: p99 TTOT 39.7 -> 9.5 ms (4.2x lower), p99 output ITL 36.5 -> 22.3 ms (-39%), throughput 8265 -> 8190 tokens/s (-0.9%)."
            ),
            "{md}"
        );
        assert!(md.contains("Target at 90% load (p99 TTOT at least 3x lower, p99 output ITL at least 30% lower, throughput within 5% of `fcfs`)"));
    }

    #[test]
    fn each_missed_criterion_is_named() {
        let cells = [
            cell("fcfs", 0.9, 39.7, 36.5, 8265.0),
            // 2.9x lower TTOT, ITL 20% lower, throughput -6%: all three miss.
            cell("reasoning-first", 0.9, 13.7, 29.2, 7769.0),
            // Only the throughput misses.
            cell("greedy", 0.9, 9.0, 20.0, 9000.0),
        ];
        let md = verdicts(&cells, &Target::default());
        assert!(
            md.contains("- `reasoning-first` **missed** (p99 TTOT, p99 output ITL, throughput): p99 TTOT 39.7 -> 13.7 ms (2.9x lower)"),
            "{md}"
        );
        assert!(md.contains("- `greedy` **missed** (throughput): "), "{md}");
        let slower = [cell("fcfs", 0.9, 20.0, 20.0, 100.0), cell("slow", 0.9, 50.0, 20.0, 100.0)];
        assert!(verdicts(&slower, &Target::default()).contains("p99 TTOT 20.0 -> 50.0 ms (2.5x higher)"));
        assert!(!md.contains("**met**"));
    }

    #[test]
    fn missing_figures_are_not_judged_and_missing_rows_are_said() {
        let mut silent = cell("output-first", 0.9, 1.0, 1.0, 8265.0);
        silent.ttot_p99_ms = None;
        let cells = [cell("fcfs", 0.9, 39.7, 36.5, 8265.0), silent];
        let md = verdicts(&cells, &Target::default());
        assert!(md.contains("`output-first` n/a / 0.03x"), "{md}");
        assert!(
            md.contains("**not judged** (no figure for p99 TTOT): p99 TTOT 39.7 -> n/a ms (n/a)"),
            "{md}"
        );
        let md = verdicts(&cells, &Target { load: 1.0, ..Target::default() });
        assert!(md.contains("Target at 100% load") && md.contains("not in this run."), "{md}");
        let md = verdicts(&cells[1..], &Target::default());
        assert!(md.starts_with("No `fcfs` rows in this run"), "{md}");
    }
}
