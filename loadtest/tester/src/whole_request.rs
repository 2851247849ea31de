//! SLOs a reader of the answer feels, judged per request: the answer-only SLO (the
//! think-to-output gap and the largest answer gap within the stall threshold) and the
//! whole-request SLO, which adds the start: TTFT and TTFO each within a factor of the
//! same request's own times unloaded, plus an allowance.
//!
//! Why relative starts: prompts and thoughts differ in length, so no single TTFT or TTFO
//! limit is fair to all of them. Against its own time alone a request may take
//! `start_factor` times as long (2: as long again in queues and shared steps as it needs
//! alone), and the allowance keeps a request that is quick alone from failing over delays
//! no reader notices. With the answer limits beside them, a scheduler cannot pass by
//! moving delay from the answer into the start, nor the other way round. The reference
//! is a run of the same workload and seed one request at a time (`--max-concurrency 1
//! --save-result`), read back with `--slo-reference`. `scripts/realab/shares.py`
//! (`WholeRequestSlo`) judges the real-engine A/B by the same rule.

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::record::RequestRecord;
use crate::stats::{Slo, SloMetric};

/// How many requests an SLO judged and how many met it.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct SloShare {
    /// Requests the SLO could judge (for the whole-request SLO: those the reference run
    /// completed, so their unloaded times are known).
    pub judged: usize,
    pub met: usize,
    /// `met / judged`; `null` when nothing could be judged.
    pub fraction: Option<f64>,
    /// Requests per second that met it, over the run's duration.
    pub per_s: f64,
}

impl SloShare {
    fn of(flags: impl Iterator<Item = Option<bool>>, duration_s: f64) -> Self {
        let (mut judged, mut met) = (0, 0);
        for flag in flags.flatten() {
            judged += 1;
            met += usize::from(flag);
        }
        SloShare {
            judged,
            met,
            fraction: (judged > 0).then(|| met as f64 / judged as f64),
            per_s: met as f64 / duration_s.max(1e-9),
        }
    }
}

/// The answer-only SLO: TTOT and the largest answer gap within `limit_ms` (a request that
/// did not think passes TTOT, an answer of one visible token passes the gap, an answer
/// never begun fails). Every request is judged, failed ones as not met.
pub fn answer_only(records: &[RequestRecord], limit_ms: f64, duration_s: f64) -> SloShare {
    SloShare::of(records.iter().map(|r| Some(answer_met(r, limit_ms))), duration_s)
}

/// The answer-only rule for one request, which the whole-request SLO also applies.
fn answer_met(r: &RequestRecord, limit_ms: f64) -> bool {
    r.ok && Slo { metric: SloMetric::Ttot, max_ms: limit_ms }.met_by(r)
        && Slo { metric: SloMetric::Gap, max_ms: limit_ms }.met_by(r)
}

/// The whole-request SLO's limits.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct WholeRequestSlo {
    pub start_factor: f64,
    pub start_allowance_ms: f64,
    /// TTOT and largest answer gap (the answer-only SLO's limit).
    pub answer_ms: f64,
}

/// One request's times unloaded, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Alone {
    pub ttft: f64,
    pub ttfo: f64,
}

impl WholeRequestSlo {
    /// Whether `r` met the SLO; `None` when the reference cannot judge it (the request
    /// failed or never answered when run alone).
    pub fn met_by(&self, r: &RequestRecord, alone: Option<Alone>) -> Option<bool> {
        let alone = alone?;
        let start = |loaded: Option<f64>, unloaded: f64| {
            loaded.is_some_and(|t| {
                t * 1000.0 <= self.start_factor * unloaded * 1000.0 + self.start_allowance_ms
            })
        };
        Some(answer_met(r, self.answer_ms) && start(r.ttft, alone.ttft) && start(r.ttfo, alone.ttfo))
    }

    /// The share of `records` that met it against `reference`.
    pub fn judge(&self, records: &[RequestRecord], reference: &Reference, duration_s: f64) -> SloShare {
        SloShare::of(records.iter().map(|r| self.met_by(r, reference.alone(r.index))), duration_s)
    }
}

/// Each request's unloaded times, by its index in the workload.
#[derive(Debug, Clone, Default)]
pub struct Reference {
    by_index: HashMap<usize, Alone>,
    requests: usize,
}

#[derive(Deserialize)]
struct SavedReport {
    runs: Vec<SavedRun>,
}

#[derive(Deserialize)]
struct SavedRun {
    requests: Vec<SavedRequest>,
}

#[derive(Deserialize)]
struct SavedRequest {
    index: usize,
    ok: bool,
    ttft: Option<f64>,
    ttfo: Option<f64>,
}

impl Reference {
    /// Reads the first run of a JSON report this tester saved.
    pub fn read(path: &Path) -> Result<Self, String> {
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("--slo-reference {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("--slo-reference {}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let report: SavedReport =
            serde_json::from_str(text).map_err(|e| format!("not a report this tester saved: {e}"))?;
        let run = report.runs.into_iter().next().ok_or("the report has no run")?;
        let requests = run.requests.len();
        let by_index = run
            .requests
            .into_iter()
            .filter(|r| r.ok)
            .filter_map(|r| Some((r.index, Alone { ttft: r.ttft?, ttfo: r.ttfo? })))
            .collect();
        Ok(Reference { by_index, requests })
    }

    pub fn alone(&self, index: usize) -> Option<Alone> {
        self.by_index.get(&index).copied()
    }

    /// A reference must come from the same workload: refuse one of another size.
    pub fn check_size(&self, requests: usize) -> Result<(), String> {
        if self.requests == requests {
            Ok(())
        } else {
            Err(format!(
                "--slo-reference holds {} requests and this run sends {requests}: run the reference with the \
                 same workload flags and --seed, one at a time (--max-concurrency 1 --save-result)",
                self.requests
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(index: usize, ttft: f64, ttfo: f64, ttot: f64, gap: f64) -> RequestRecord {
        RequestRecord {
            index,
            ok: true,
            ttft: Some(ttft),
            ttfo: Some(ttfo),
            think_to_output: Some(ttot),
            max_output_gap: Some(gap),
            client_think_tokens: 10,
            client_output_tokens: 5,
            ..Default::default()
        }
    }

    const SLO: WholeRequestSlo =
        WholeRequestSlo { start_factor: 2.0, start_allowance_ms: 250.0, answer_ms: 250.0 };

    #[test]
    fn a_start_within_twice_its_time_alone_plus_the_allowance_passes() {
        let alone = Some(Alone { ttft: 0.5, ttfo: 2.0 });
        assert_eq!(SLO.met_by(&answered(0, 1.25, 4.25, 0.1, 0.1), alone), Some(true));
        assert_eq!(SLO.met_by(&answered(0, 1.26, 4.0, 0.1, 0.1), alone), Some(false), "TTFT late");
        assert_eq!(SLO.met_by(&answered(0, 1.0, 4.3, 0.1, 0.1), alone), Some(false), "TTFO late");
    }

    #[test]
    fn a_quick_start_does_not_excuse_a_stalled_answer() {
        let alone = Some(Alone { ttft: 0.5, ttfo: 2.0 });
        assert_eq!(SLO.met_by(&answered(0, 0.5, 2.0, 0.3, 0.1), alone), Some(false), "TTOT");
        assert_eq!(SLO.met_by(&answered(0, 0.5, 2.0, 0.1, 0.3), alone), Some(false), "gap");
    }

    #[test]
    fn a_request_the_reference_cannot_judge_is_left_out_not_failed() {
        let r = answered(3, 9.0, 9.0, 0.1, 0.1);
        assert_eq!(SLO.met_by(&r, None), None);
        let reference = Reference::parse(
            r#"{"runs":[{"requests":[{"index":0,"ok":true,"ttft":0.5,"ttfo":1.0},
                                     {"index":3,"ok":false,"ttft":null,"ttfo":null}]}]}"#,
        )
        .unwrap();
        let share = SLO.judge(&[answered(0, 0.6, 1.1, 0.1, 0.1), r], &reference, 2.0);
        assert_eq!(share, SloShare { judged: 1, met: 1, fraction: Some(1.0), per_s: 0.5 });
    }

    #[test]
    fn a_failed_request_counts_against_both_slos() {
        let failed = RequestRecord { index: 0, ok: false, ..Default::default() };
        let share = answer_only(&[failed.clone(), answered(1, 0.1, 0.2, 0.1, 0.1)], 250.0, 1.0);
        assert_eq!((share.judged, share.met), (2, 1));
        assert_eq!(SLO.met_by(&failed, Some(Alone { ttft: 1.0, ttfo: 1.0 })), Some(false));
    }

    #[test]
    fn a_reference_of_another_workload_is_refused() {
        let reference =
            Reference::parse(r#"{"runs":[{"requests":[{"index":0,"ok":true,"ttft":0.5,"ttfo":1.0}]}]}"#)
                .unwrap();
        assert!(reference.check_size(1).is_ok());
        assert!(reference.check_size(2).unwrap_err().contains("--max-concurrency 1"));
        assert!(Reference::parse("{}").is_err() && Reference::parse(r#"{"runs":[]}"#).is_err());
    }
}
