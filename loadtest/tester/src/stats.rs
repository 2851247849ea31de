//! Aggregates: mean and percentiles of each metric, throughputs, goodput under SLOs.

use std::collections::BTreeMap;

use meridian_core::Outcome;
use serde::{Serialize, Serializer};

use crate::record::RequestRecord;
use crate::server_metrics::PrefixCacheReading;
use crate::whole_request::{Reference, SloShare, WholeRequestSlo, answer_only};

/// Mean and percentiles of one metric, in milliseconds. A metric no request reached
/// (`count` 0: say, TTFO when no answer began) is written as JSON `null`, never as
/// zeros that read like a measurement.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    pub count: usize,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    /// Where too few requests set a p99 (fewer than 500 give it from under 5), p95 is the
    /// tail to quote.
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

/// The figures of a measured summary, as JSON writes them.
#[derive(Serialize)]
struct Figures {
    count: usize,
    mean_ms: f64,
    p50_ms: f64,
    p90_ms: f64,
    p95_ms: f64,
    p99_ms: f64,
    max_ms: f64,
}

impl Serialize for Summary {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if !self.measured() {
            return serializer.serialize_none();
        }
        Figures {
            count: self.count,
            mean_ms: self.mean_ms,
            p50_ms: self.p50_ms,
            p90_ms: self.p90_ms,
            p95_ms: self.p95_ms,
            p99_ms: self.p99_ms,
            max_ms: self.max_ms,
        }
        .serialize(serializer)
    }
}

impl Summary {
    /// Whether any value went into it.
    pub fn measured(&self) -> bool {
        self.count > 0
    }

    pub fn of(values_s: impl IntoIterator<Item = f64>) -> Self {
        let mut v: Vec<f64> = values_s.into_iter().map(|s| s * 1000.0).filter(|x| x.is_finite()).collect();
        v.sort_by(|a, b| a.total_cmp(b));
        if v.is_empty() {
            return Summary::default();
        }
        Summary {
            count: v.len(),
            mean_ms: v.iter().sum::<f64>() / v.len() as f64,
            p50_ms: percentile(&v, 50.0),
            p90_ms: percentile(&v, 90.0),
            p95_ms: percentile(&v, 95.0),
            p99_ms: percentile(&v, 99.0),
            max_ms: *v.last().unwrap_or(&0.0),
        }
    }
}

/// A per-request latency limit for goodput (`--goodput ttft:500 ttfo:2000 ...`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Slo {
    pub metric: SloMetric,
    pub max_ms: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SloMetric {
    Ttft,
    Ttfo,
    Ttot,
    Tpot,
    E2el,
    /// The largest gap between visible tokens of the answer.
    Gap,
}

impl Slo {
    pub fn parse(spec: &str) -> Result<Self, String> {
        let (name, ms) =
            spec.split_once(':').ok_or_else(|| format!("SLO {spec:?} is not METRIC:MILLISECONDS"))?;
        let metric = match name {
            "ttft" => SloMetric::Ttft,
            "ttfo" => SloMetric::Ttfo,
            "ttot" => SloMetric::Ttot,
            "tpot" => SloMetric::Tpot,
            "e2el" => SloMetric::E2el,
            "gap" => SloMetric::Gap,
            other => {
                return Err(format!("unknown SLO metric {other:?} (ttft, ttfo, ttot, tpot, e2el, gap)"));
            }
        };
        let max_ms: f64 = ms.parse().map_err(|_| format!("SLO {spec:?}: {ms:?} is not a number"))?;
        if !(max_ms.is_finite() && max_ms > 0.0) {
            return Err(format!("SLO {spec:?}: the limit must be positive"));
        }
        Ok(Slo { metric, max_ms })
    }

    /// Whether a request met this SLO. A metric the request never reached (no output,
    /// or no thinking for TTOT) passes only when it does not apply: TTOT for a request that
    /// did not think.
    pub fn met_by(&self, r: &RequestRecord) -> bool {
        let value = match self.metric {
            SloMetric::Ttft => r.ttft,
            SloMetric::Ttfo => r.ttfo,
            SloMetric::Ttot => match r.think_to_output {
                None if r.think_tokens() == 0 && r.ttfo.is_some() => return true,
                v => v,
            },
            SloMetric::Tpot => r.tpot,
            SloMetric::E2el => r.e2e,
            // An answer of one visible token has no gap; an answer never begun fails.
            SloMetric::Gap => match r.max_output_gap {
                None if r.ttfo.is_some() => return true,
                v => v,
            },
        };
        value.is_some_and(|v| v * 1000.0 <= self.max_ms)
    }
}

/// Everything a run measured, as the JSON report carries it.
#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    pub label: String,
    pub offered_rate: Option<f64>,
    pub requests: usize,
    pub completed: usize,
    pub failed: usize,
    pub duration_s: f64,
    pub request_throughput: f64,
    pub output_token_throughput: f64,
    pub total_token_throughput: f64,
    pub think_tokens: u64,
    pub output_tokens: u64,
    pub ttft: Summary,
    pub ttfo: Summary,
    pub think_to_output: Summary,
    pub itl: Summary,
    pub output_itl: Summary,
    pub tpot: Summary,
    pub e2el: Summary,
    /// Each answer's largest gap between visible tokens, over requests.
    pub answer_gap: Summary,
    pub stall_threshold_ms: f64,
    /// Share of answers (requests with two or more visible tokens) whose largest gap
    /// exceeded `stall_threshold_ms`; `null` when no answer had two visible tokens.
    pub stalled_answers: Option<f64>,
    pub slos: Vec<Slo>,
    /// Requests per second that met every SLO (all completed ones when no SLO was given).
    pub goodput: f64,
    pub good_fraction: f64,
    /// The answer-only SLO: TTOT and the largest answer gap within `stall_threshold_ms`.
    pub answer_only_slo: SloShare,
    /// The whole-request SLO (start against each request's unloaded times, and the
    /// answer), when the run was given a reference (`--slo-reference`).
    pub whole_request_slo: Option<WholeRequestShare>,
    /// Failed requests by outcome, in the proxy's vocabulary: comparable with its
    /// `meridian_requests_total{outcome}`.
    pub failed_by_outcome: BTreeMap<Outcome, usize>,
    pub first_errors: Vec<String>,
    /// A multi-turn run's figures by turn (empty otherwise): turn 0 first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub turns: Vec<TurnSummary>,
    /// Every turn after the first pooled: the turns with a history to find in the cache.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub later_turns: Option<TurnSummary>,
    /// The server's own prefix-cache counters over the run (vLLM's
    /// `prefix_cache_queries`/`_hits`, in tokens), when its `/metrics` has them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix_cache: Option<PrefixCacheReading>,
}

/// One turn position of a multi-turn run (or several pooled), over its conversations.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TurnSummary {
    /// The turn (0 first); `None` for the later turns pooled.
    pub turn: Option<u32>,
    pub requests: usize,
    pub completed: usize,
    pub ttft: Summary,
    pub e2el: Summary,
    /// The server's prompt tokens over the completed requests.
    pub prompt_tokens: u64,
    /// Of those, the tokens its prefix cache held, and their share: `None` unless the
    /// server reported cached tokens for every one of them.
    pub cached_tokens: Option<u64>,
    pub hit_rate: Option<f64>,
}

impl TurnSummary {
    fn of(turn: Option<u32>, records: &[&RequestRecord]) -> Self {
        let ok: Vec<&&RequestRecord> = records.iter().filter(|r| r.ok).collect();
        let prompt_tokens: u64 = ok.iter().map(|r| u64::from(r.prompt_tokens.unwrap_or(0))).sum();
        let cached: Option<u64> = ok.iter().map(|r| r.cached_tokens.map(u64::from)).sum();
        let cached = cached.filter(|_| !ok.is_empty());
        TurnSummary {
            turn,
            requests: records.len(),
            completed: ok.len(),
            ttft: Summary::of(ok.iter().filter_map(|r| r.ttft)),
            e2el: Summary::of(ok.iter().filter_map(|r| r.e2e)),
            prompt_tokens,
            cached_tokens: cached,
            hit_rate: cached.filter(|_| prompt_tokens > 0).map(|c| c as f64 / prompt_tokens as f64),
        }
    }

    /// By turn, and the later turns pooled; nothing for a run that was not multi-turn.
    pub fn of_run(records: &[RequestRecord]) -> (Vec<TurnSummary>, Option<TurnSummary>) {
        let Some(last) = records.iter().filter_map(|r| r.turn).max() else { return (Vec::new(), None) };
        let turns = (0..=last)
            .map(|k| {
                TurnSummary::of(Some(k), &records.iter().filter(|r| r.turn == Some(k)).collect::<Vec<_>>())
            })
            .collect();
        let later: Vec<&RequestRecord> = records.iter().filter(|r| r.turn.is_some_and(|k| k > 0)).collect();
        (turns, (!later.is_empty()).then(|| TurnSummary::of(None, &later)))
    }
}

impl RunSummary {
    pub fn of(
        label: &str,
        offered_rate: Option<f64>,
        records: &[RequestRecord],
        duration_s: f64,
        slos: &[Slo],
        stall_threshold_ms: f64,
    ) -> Self {
        let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.ok).collect();
        let dur = duration_s.max(1e-9);
        let think: u64 = ok.iter().map(|r| u64::from(r.think_tokens())).sum();
        let output: u64 = ok.iter().map(|r| u64::from(r.output_tokens())).sum();
        let input: u64 = ok.iter().map(|r| u64::from(r.prompt_tokens.unwrap_or(0))).sum();
        let good = ok.iter().filter(|r| slos.iter().all(|s| s.met_by(r))).count();
        let gaps: Vec<f64> = ok.iter().filter_map(|r| r.max_output_gap).collect();
        let stalled = gaps.iter().filter(|g| **g * 1000.0 > stall_threshold_ms).count();
        let (turns, later_turns) = TurnSummary::of_run(records);
        RunSummary {
            label: label.to_owned(),
            offered_rate,
            requests: records.len(),
            completed: ok.len(),
            failed: records.len() - ok.len(),
            duration_s,
            request_throughput: ok.len() as f64 / dur,
            output_token_throughput: (think + output) as f64 / dur,
            total_token_throughput: (input + think + output) as f64 / dur,
            think_tokens: think,
            output_tokens: output,
            ttft: Summary::of(ok.iter().filter_map(|r| r.ttft)),
            ttfo: Summary::of(ok.iter().filter_map(|r| r.ttfo)),
            think_to_output: Summary::of(ok.iter().filter_map(|r| r.think_to_output)),
            itl: Summary::of(ok.iter().flat_map(|r| r.itl.iter().copied())),
            output_itl: Summary::of(ok.iter().flat_map(|r| r.output_itl.iter().copied())),
            tpot: Summary::of(ok.iter().filter_map(|r| r.tpot)),
            e2el: Summary::of(ok.iter().filter_map(|r| r.e2e)),
            stalled_answers: (!gaps.is_empty()).then(|| stalled as f64 / gaps.len() as f64),
            answer_gap: Summary::of(gaps),
            stall_threshold_ms,
            slos: slos.to_vec(),
            goodput: good as f64 / dur,
            good_fraction: if records.is_empty() { 0.0 } else { good as f64 / records.len() as f64 },
            answer_only_slo: answer_only(records, stall_threshold_ms, dur),
            whole_request_slo: None,
            failed_by_outcome: records.iter().filter(|r| !r.ok).fold(BTreeMap::new(), |mut by, r| {
                *by.entry(r.outcome).or_default() += 1;
                by
            }),
            first_errors: records.iter().filter_map(|r| r.error.clone()).take(5).collect(),
            turns,
            later_turns,
            prefix_cache: None,
        }
    }
}

impl RunSummary {
    /// Judges the run's requests under the whole-request SLO against `reference`.
    pub fn judge_whole_request(
        &mut self,
        records: &[RequestRecord],
        slo: WholeRequestSlo,
        reference: &Reference,
    ) {
        let share = slo.judge(records, reference, self.duration_s);
        self.whole_request_slo = Some(WholeRequestShare { slo, share });
    }
}

/// The whole-request SLO's limits and what the run met of it.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct WholeRequestShare {
    #[serde(flatten)]
    pub slo: WholeRequestSlo,
    #[serde(flatten)]
    pub share: SloShare,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let s = Summary::of((1..=100).map(|i| f64::from(i) / 1000.0));
        assert_eq!((s.p50_ms, s.p90_ms, s.p99_ms, s.max_ms), (50.0, 90.0, 99.0, 100.0));
        assert!((s.mean_ms - 50.5).abs() < 1e-9);
        assert_eq!(Summary::of(std::iter::empty()).count, 0);
    }

    #[test]
    fn a_metric_nobody_reached_is_null_not_zero() {
        // Thinking the whole max_tokens: no request reached its answer.
        let thinker = RequestRecord {
            ok: true,
            ttft: Some(0.1),
            e2e: Some(1.0),
            client_think_tokens: 9,
            ..Default::default()
        };
        let s = RunSummary::of("x", None, &[thinker], 1.0, &[], 250.0);
        let json = serde_json::to_value(&s).unwrap();
        for key in ["ttfo", "think_to_output", "output_itl", "answer_gap", "stalled_answers"] {
            assert!(json[key].is_null(), "{key}: {}", json[key]);
        }
        assert_eq!(json["ttft"]["p50_ms"], 100.0, "a measured metric keeps its figures");
    }

    /// One stall of 400 ms in each of 5 answers of 200 tokens: 0.5% of the gaps, so
    /// pooled output ITL p99 stays at the step time, but every answer stalled once.
    #[test]
    fn the_answer_gap_shows_the_stall_pooled_itl_hides() {
        let answer = |i: usize| {
            let mut gaps = vec![0.02; 199];
            gaps[i * 10] = 0.4;
            RequestRecord {
                ok: true,
                ttft: Some(0.1),
                ttfo: Some(0.5),
                e2e: Some(3.0),
                max_output_gap: Some(0.4),
                output_itl: gaps,
                client_output_tokens: 200,
                ..Default::default()
            }
        };
        let recs: Vec<RequestRecord> = (0..5).map(answer).collect();
        let s = RunSummary::of("x", None, &recs, 3.0, &[Slo::parse("gap:250").unwrap()], 250.0);
        assert!((s.output_itl.p99_ms - 20.0).abs() < 1e-9, "pooled p99 hides it: {}", s.output_itl.p99_ms);
        assert_eq!(s.answer_gap.p50_ms, 400.0);
        assert_eq!(s.stalled_answers, Some(1.0));
        assert_eq!(s.goodput, 0.0, "no answer meets a 250 ms gap SLO");
    }

    #[test]
    fn a_multi_turn_run_is_summed_by_turn() {
        let turn =
            |conversation: u32, turn: u32, prompt: u32, cached: Option<u32>, ttft: f64| RequestRecord {
                ok: true,
                ttft: Some(ttft),
                e2e: Some(1.0),
                prompt_tokens: Some(prompt),
                cached_tokens: cached,
                conversation: Some(conversation),
                turn: Some(turn),
                ..Default::default()
            };
        let recs = vec![
            turn(0, 0, 100, Some(0), 0.1),
            turn(0, 1, 200, Some(96), 0.2),
            turn(1, 0, 100, Some(0), 0.3),
            turn(1, 1, 200, Some(160), 0.4),
            turn(1, 2, 300, Some(288), 0.5),
        ];
        let s = RunSummary::of("x", None, &recs, 1.0, &[], 250.0);
        assert_eq!(s.turns.len(), 3);
        assert_eq!((s.turns[0].requests, s.turns[0].hit_rate), (2, Some(0.0)));
        assert_eq!((s.turns[1].prompt_tokens, s.turns[1].cached_tokens), (400, Some(256)));
        assert_eq!(s.turns[1].ttft.p50_ms, 200.0);
        let later = s.later_turns.as_ref().unwrap();
        assert_eq!((later.turn, later.requests), (None, 3));
        assert!((later.hit_rate.unwrap() - 544.0 / 700.0).abs() < 1e-12);
        assert_eq!(later.ttft.p95_ms, 500.0);
        // A server that did not say what it cached: no rate, rather than a zero.
        let mut blind = recs.clone();
        blind[3].cached_tokens = None;
        let s = RunSummary::of("x", None, &blind, 1.0, &[], 250.0);
        assert_eq!((s.turns[1].cached_tokens, s.turns[1].hit_rate), (None, None));
        assert_eq!(s.turns[0].hit_rate, Some(0.0));
        let single =
            RunSummary::of("x", None, &[RequestRecord { ok: true, ..Default::default() }], 1.0, &[], 250.0);
        let json = serde_json::to_value(&single).unwrap();
        assert!(json.get("turns").is_none() && json.get("later_turns").is_none(), "{json}");
    }

    #[test]
    fn goodput_counts_requests_meeting_every_slo() {
        let mk = |ttft: f64, ttfo: f64, think: u32| RequestRecord {
            ok: true,
            ttft: Some(ttft),
            ttfo: Some(ttfo),
            think_to_output: (think > 0).then_some(0.01),
            e2e: Some(1.0),
            client_think_tokens: think,
            client_output_tokens: 5,
            ..Default::default()
        };
        let recs = vec![mk(0.1, 0.5, 3), mk(0.1, 3.0, 3), mk(0.9, 0.5, 0)];
        let slos = vec![
            Slo::parse("ttft:500").unwrap(),
            Slo::parse("ttfo:2000").unwrap(),
            Slo::parse("ttot:100").unwrap(),
        ];
        let s = RunSummary::of("x", None, &recs, 2.0, &slos, 250.0);
        assert_eq!(s.goodput, 0.5, "one of three meets all, over 2 s");
        assert!((s.good_fraction - 1.0 / 3.0).abs() < 1e-9);
        assert!(
            Slo::parse("ttft").is_err() && Slo::parse("foo:1").is_err() && Slo::parse("ttft:-1").is_err()
        );
    }
}
