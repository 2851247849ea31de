//! Fits the cost model to what a real engine measured.
//!
//! Two inputs. Best: the engine's own step trace (`meridian_hook.steptrace`, JSON lines,
//! one per step, timed inside vLLM's scheduler): each step is an exact sample of the
//! step cost for its shape. Else: a `meridian-loadtest --save-result` report (each
//! request's send time, prompt length and token arrival times), from which samples are
//! inferred: each gap between two tokens of a request is one or more engine steps, and at
//! its midpoint the engine was decoding every request that had started and not finished;
//! each TTFT of a request that arrived to an idle engine is a sample of its prefill.
//!
//! The fit is least absolute deviations (by iteratively reweighted least squares):
//! measured steps have a long tail from OS scheduling, which a squared loss would fold
//! into the coefficients. Coefficients are kept non-negative by dropping a term that
//! comes out negative and fitting again. The error is reported as the median absolute
//! percentage error per step and R².

use serde::Deserialize;

use crate::cost::{CostModel, StepShape};

#[derive(Deserialize)]
struct Report {
    runs: Vec<Run>,
}

#[derive(Deserialize)]
struct Run {
    requests: Vec<Req>,
}

#[derive(Deserialize)]
struct Req {
    sent_at: f64,
    ok: bool,
    prompt_tokens: Option<u32>,
    #[serde(default)]
    token_times: Vec<f64>,
}

/// One observation: a step's shape and how long it took.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub shape: StepShape,
    pub seconds: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Fit {
    pub cost: CostModel,
    pub samples: usize,
    /// Median of |predicted - measured| / measured, in percent.
    pub median_abs_pct_error: f64,
    pub r_squared: f64,
}

#[derive(Debug, thiserror::Error)]
pub enum CalibrateError {
    #[error("not a meridian-loadtest JSON report: {0}")]
    Parse(#[from] serde_json::Error),
    #[error("step trace line {line}: {source}")]
    Trace { line: usize, source: serde_json::Error },
    #[error("too few usable samples ({0}); run longer, at several concurrency levels")]
    TooFew(usize),
    #[error("the samples do not pin down the model (batch and context never varied)")]
    Singular,
}

/// One line of `meridian_hook.steptrace`.
#[derive(Debug, Clone, Deserialize)]
pub struct TracedStep {
    /// Monotonic seconds when the step was scheduled.
    pub t: f64,
    pub step_s: f64,
    pub tokens: u64,
    pub prefill_tokens: u64,
    pub decode_reqs: u64,
    pub decode_context: u64,
    pub prefill_context: u64,
    #[serde(default)]
    pub preempted: u64,
}

impl TracedStep {
    /// The step's shape. The trace sums the context before all prefill chunks of a step;
    /// the shape's prefill attention is computed as if they were one chunk, exact for
    /// the common case of one prompt chunk per step.
    pub fn shape(&self) -> StepShape {
        let mut shape = StepShape::decode(self.decode_reqs, self.decode_context);
        if self.prefill_tokens > 0 {
            shape.add_prefill(self.prefill_tokens, self.prefill_context);
        }
        shape.tokens = self.tokens as f64;
        shape
    }
}

/// Reads a step trace (JSON lines); blank lines are skipped.
pub fn read_step_trace(text: &str) -> Result<Vec<TracedStep>, CalibrateError> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).map_err(|source| CalibrateError::Trace { line: i + 1, source }))
        .collect()
}

/// Samples from traced steps.
pub fn samples_from_steps(steps: &[TracedStep]) -> Vec<Sample> {
    steps.iter().filter(|s| s.step_s > 0.0).map(|s| Sample { shape: s.shape(), seconds: s.step_s }).collect()
}

/// The step-time curve of a trace: steps that only prefilled, binned by the tokens in
/// them (nearest power of two), and steps that only decoded, by how many requests
/// decoded. Each bin keeps its median time and mean shape (to set the fit beside it).
#[derive(Debug, Clone, PartialEq)]
pub struct StepCurve {
    pub prefill: Vec<CurvePoint>,
    pub decode: Vec<CurvePoint>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CurvePoint {
    /// Median tokens per step in the bin.
    pub tokens: f64,
    pub median_s: f64,
    pub steps: usize,
    pub mean_shape: StepShape,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn points(bins: std::collections::BTreeMap<u64, Vec<&TracedStep>>, min_steps: usize) -> Vec<CurvePoint> {
    bins.into_values()
        .filter(|steps| steps.len() >= min_steps)
        .map(|steps| {
            let n = steps.len() as f64;
            let mut mean = StepShape::default();
            for s in &steps {
                let sh = s.shape();
                mean.tokens += sh.tokens / n;
                mean.decode_reqs += sh.decode_reqs / n;
                mean.decode_context += sh.decode_context / n;
                mean.prefill_attention += sh.prefill_attention / n;
            }
            CurvePoint {
                tokens: median(&mut steps.iter().map(|s| s.tokens as f64).collect::<Vec<_>>()),
                median_s: median(&mut steps.iter().map(|s| s.step_s).collect::<Vec<_>>()),
                steps: steps.len(),
                mean_shape: mean,
            }
        })
        .collect()
}

impl StepCurve {
    pub fn of(steps: &[TracedStep]) -> Self {
        let mut prefill = std::collections::BTreeMap::new();
        let mut decode = std::collections::BTreeMap::new();
        for s in steps {
            if s.decode_reqs == 0 && s.prefill_tokens > 0 {
                prefill.entry(s.tokens.next_power_of_two()).or_insert_with(Vec::new).push(s);
            } else if s.prefill_tokens == 0 && s.decode_reqs > 0 {
                decode.entry(s.decode_reqs).or_insert_with(Vec::new).push(s);
            }
        }
        StepCurve { prefill: points(prefill, 2), decode: points(decode, 5) }
    }

    /// `{"prefill": [[tokens, measured ms, steps, fitted ms], ...], "decode": [...]}`.
    pub fn to_json(&self, cost: &CostModel) -> serde_json::Value {
        let rows = |v: &[CurvePoint]| -> Vec<serde_json::Value> {
            v.iter()
                .map(|p| {
                    serde_json::json!([
                        p.tokens,
                        p.median_s * 1e3,
                        p.steps,
                        cost.step_seconds(&p.mean_shape) * 1e3
                    ])
                })
                .collect()
        };
        serde_json::json!({ "prefill": rows(&self.prefill), "decode": rows(&self.decode) })
    }

    /// Measured medians and the fitted model, step time against tokens in the step.
    pub fn plot(&self, cost: &CostModel) -> String {
        let line = |name: &str, v: &[CurvePoint], fitted: bool| meridian_plot::Series {
            name: name.to_owned(),
            points: v
                .iter()
                .map(|p| (p.tokens, 1e3 * if fitted { cost.step_seconds(&p.mean_shape) } else { p.median_s }))
                .collect(),
        };
        meridian_plot::plot(
            "engine step time by tokens in the step",
            "tokens in the step",
            "ms",
            &[
                line("prefill-only steps, measured", &self.prefill, false),
                line("prefill-only steps, fitted", &self.prefill, true),
                line("decode-only steps, measured", &self.decode, false),
                line("decode-only steps, fitted", &self.decode, true),
            ],
        )
    }
}

struct Span {
    start: f64,
    end: f64,
    prompt: f64,
    /// Absolute token times.
    times: Vec<f64>,
}

impl Span {
    /// Context (prompt + tokens so far) at time t, if the request was decoding then.
    fn context_at(&self, t: f64) -> Option<f64> {
        let first = *self.times.first()?;
        if t < first || t > self.end {
            return None;
        }
        let done = self.times.partition_point(|x| *x <= t);
        Some(self.prompt + done as f64)
    }
}

/// One measured request: when it was sent, its prompt length, and when each token
/// arrived (seconds from sending).
#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    pub sent_at: f64,
    pub prompt_tokens: u32,
    pub token_times: Vec<f64>,
}

/// Extracts samples from a `meridian-loadtest` JSON report (every run in it).
pub fn samples_from_report(json: &str) -> Result<Vec<Sample>, CalibrateError> {
    let report: Report = serde_json::from_str(json)?;
    let mut out = Vec::new();
    for run in report.runs {
        let observed: Vec<Observed> = run
            .requests
            .into_iter()
            .filter(|r| r.ok && !r.token_times.is_empty())
            .map(|r| Observed {
                sent_at: r.sent_at,
                prompt_tokens: r.prompt_tokens.unwrap_or(0),
                token_times: r.token_times,
            })
            .collect();
        out.extend(samples_from_requests(&observed));
    }
    Ok(out)
}

/// Extracts samples from requests measured together (one run).
pub fn samples_from_requests(requests: &[Observed]) -> Vec<Sample> {
    let spans: Vec<Span> = requests
        .iter()
        .filter(|r| !r.token_times.is_empty())
        .map(|r| Span {
            start: r.sent_at,
            end: r.sent_at + r.token_times.last().copied().unwrap_or(0.0),
            prompt: f64::from(r.prompt_tokens),
            times: r.token_times.iter().map(|t| r.sent_at + t).collect(),
        })
        .collect();
    let mut out = Vec::new();
    for (i, s) in spans.iter().enumerate() {
        // TTFT on an idle engine: prefill alone.
        let alone = spans.iter().enumerate().all(|(j, o)| j == i || o.end < s.start || o.start > s.times[0]);
        if alone {
            let mut shape = StepShape::default();
            shape.add_prefill(s.prompt as u64, 0);
            out.push(Sample { shape, seconds: s.times[0] - s.start });
        }
        for w in s.times.windows(2) {
            let mid = (w[0] + w[1]) / 2.0;
            // Skip gaps in which any request was prefilling at any moment: those steps
            // mixed prompt chunks in, which the decode sample does not count.
            let prefilling =
                spans.iter().any(|o| o.start < w[1] && o.times.first().is_some_and(|f| *f > w[0]));
            if prefilling {
                continue;
            }
            let (mut batch, mut context) = (0u64, 0.0f64);
            for o in &spans {
                if let Some(c) = o.context_at(mid) {
                    batch += 1;
                    context += c;
                }
            }
            out.push(Sample { shape: StepShape::decode(batch.max(1), context as u64), seconds: w[1] - w[0] });
        }
    }
    out
}

/// The model's terms, in `CostModel` order.
const TERMS: usize = 5;

/// A sample's features with a weight-read floor of `floor` tokens under the token count.
fn features(s: &StepShape, floor: f64) -> [f64; TERMS] {
    [1.0, s.tokens.max(floor), s.decode_reqs, s.decode_context, s.prefill_attention]
}

fn cost_of(c: &[f64; TERMS], floor: f64) -> CostModel {
    CostModel {
        fixed_s: c[0],
        per_token_s: c[1],
        per_decode_request_s: c[2],
        per_context_token_s: c[3],
        per_prefill_attention_s: c[4],
        weight_read_tokens: floor,
    }
}

/// Least-absolute-deviations fit of the terms in `active` (others held at zero).
fn lad(samples: &[Sample], active: &[bool; TERMS], floor: f64) -> Option<[f64; TERMS]> {
    let idx: Vec<usize> = (0..TERMS).filter(|i| active[*i]).collect();
    let k = idx.len();
    // Columns are scaled to unit mean magnitude so that the normal equations of terms
    // a million times apart in size stay well conditioned.
    let scale: Vec<f64> = idx
        .iter()
        .map(|&i| {
            let m = samples.iter().map(|s| features(&s.shape, floor)[i].abs()).sum::<f64>()
                / samples.len() as f64;
            if m > 0.0 { m } else { 1.0 }
        })
        .collect();
    let mut weights = vec![1.0f64; samples.len()];
    let mut coef = vec![0.0f64; k];
    for _ in 0..40 {
        let mut m = vec![vec![0.0f64; k + 1]; k];
        for (s, w) in samples.iter().zip(&weights) {
            let f = features(&s.shape, floor);
            let x: Vec<f64> = idx.iter().zip(&scale).map(|(&i, sc)| f[i] / sc).collect();
            for r in 0..k {
                for c in 0..k {
                    m[r][c] += w * x[r] * x[c];
                }
                m[r][k] += w * x[r] * s.seconds;
            }
        }
        coef = solve(m)?;
        for (s, w) in samples.iter().zip(weights.iter_mut()) {
            let f = features(&s.shape, floor);
            let predicted: f64 = idx.iter().zip(&scale).zip(&coef).map(|((&i, sc), c)| c * f[i] / sc).sum();
            *w = 1.0 / (s.seconds - predicted).abs().max(1e-7);
        }
    }
    let mut out = [0.0f64; TERMS];
    for ((&i, sc), c) in idx.iter().zip(&scale).zip(&coef) {
        out[i] = c / sc;
    }
    Some(out)
}

/// Fits the cost model to samples; terms the samples never vary (say, prefill attention
/// in a decode-only trace) are left at zero. The weight-read floor is searched over
/// [`FLOORS`] (those below most samples' token counts), each candidate fitted in full;
/// the one with the smallest total deviation wins, so a trace with no floor in it (a
/// CPU engine's) keeps none.
pub fn fit(samples: &[Sample]) -> Result<Fit, CalibrateError> {
    best_fit(samples, &FLOORS)
}

/// The fit with no weight-read floor: the form of the datasheet profiles.
pub fn fit_without_floor(samples: &[Sample]) -> Result<Fit, CalibrateError> {
    best_fit(samples, &[0.0])
}

/// The best of the fits at each of `floors` (0.0 first: its failure is the fit's).
fn best_fit(samples: &[Sample], floors: &[f64]) -> Result<Fit, CalibrateError> {
    if samples.len() < 10 {
        return Err(CalibrateError::TooFew(samples.len()));
    }
    let mut tokens: Vec<f64> = samples.iter().map(|s| s.shape.tokens).collect();
    tokens.sort_by(|a, b| a.total_cmp(b));
    // A floor above nearly every step would leave the per-token term nothing to fit.
    let highest = tokens[tokens.len() * 9 / 10];
    let mut best: Option<(f64, CostModel)> = None;
    for floor in floors.iter().copied().filter(|f| *f == 0.0 || *f < highest) {
        let cost = match fit_with_floor(samples, floor) {
            Ok(cost) => cost,
            Err(e) if floor == 0.0 => return Err(e),
            Err(_) => continue, // this floor leaves a term nothing to fit
        };
        let deviation: f64 = samples.iter().map(|s| (cost.step_seconds(&s.shape) - s.seconds).abs()).sum();
        if best.as_ref().is_none_or(|(d, _)| deviation < *d) {
            best = Some((deviation, cost));
        }
    }
    let Some((_, cost)) = best else { return Err(CalibrateError::Singular) };
    Ok(summarize(samples, cost))
}

/// A fitted model with its errors over the samples.
fn summarize(samples: &[Sample], cost: CostModel) -> Fit {
    let mean = samples.iter().map(|s| s.seconds).sum::<f64>() / samples.len() as f64;
    let ss_tot: f64 = samples.iter().map(|s| (s.seconds - mean).powi(2)).sum();
    let ss_res: f64 = samples.iter().map(|s| (s.seconds - cost.step_seconds(&s.shape)).powi(2)).sum();
    let mut pct: Vec<f64> = samples
        .iter()
        .filter(|s| s.seconds > 0.0)
        .map(|s| ((cost.step_seconds(&s.shape) - s.seconds) / s.seconds).abs())
        .collect();
    pct.sort_by(|a, b| a.total_cmp(b));
    Fit {
        cost,
        samples: samples.len(),
        median_abs_pct_error: pct.get(pct.len() / 2).copied().unwrap_or(0.0) * 100.0,
        r_squared: if ss_tot > 0.0 { 1.0 - ss_res / ss_tot } else { 0.0 },
    }
}

/// The weight-read floors [`fit`] tries, in tokens: none, then a grid fine where GPU
/// floors sit (an 8B model on an H100 reads its weights in the time of ~100-300 tokens).
const FLOORS: [f64; 17] = [
    0.0, 8.0, 16.0, 32.0, 48.0, 64.0, 96.0, 128.0, 160.0, 192.0, 224.0, 256.0, 320.0, 384.0, 512.0, 768.0,
    1024.0,
];

/// The fit at one weight-read floor.
fn fit_with_floor(samples: &[Sample], floor: f64) -> Result<CostModel, CalibrateError> {
    let mut active = [true; TERMS];
    // A term whose feature is the same in every sample cannot be told from the fixed part.
    for (i, on) in active.iter_mut().enumerate().skip(1) {
        let first = features(&samples[0].shape, floor)[i];
        *on = samples.iter().any(|s| features(&s.shape, floor)[i] != first);
    }
    if active.iter().skip(1).all(|on| !on) {
        return Err(CalibrateError::Singular);
    }
    let coef = loop {
        let c = lad(samples, &active, floor).ok_or(CalibrateError::Singular)?;
        // Drop the most negative term and refit: a cost cannot be negative.
        match (1..TERMS).filter(|i| active[*i] && c[*i] < 0.0).min_by(|a, b| c[*a].total_cmp(&c[*b])) {
            Some(i) => active[i] = false,
            None => break c,
        }
    };
    // A floor the per-token term was dropped under means nothing.
    let floor = if coef[1] > 0.0 { floor } else { 0.0 };
    Ok(cost_of(&[coef[0].max(0.0), coef[1], coef[2], coef[3], coef[4]], floor))
}

/// Gaussian elimination with partial pivoting on a k x (k+1) augmented matrix.
fn solve(mut m: Vec<Vec<f64>>) -> Option<Vec<f64>> {
    let k = m.len();
    for col in 0..k {
        let pivot = (col..k).max_by(|a, b| m[*a][col].abs().total_cmp(&m[*b][col].abs()))?;
        if m[pivot][col].abs() < 1e-12 {
            return None;
        }
        m.swap(col, pivot);
        for row in 0..k {
            if row != col {
                let f = m[row][col] / m[col][col];
                let pivot_row = m[col].clone();
                for (cell, p) in m[row].iter_mut().zip(pivot_row).skip(col) {
                    *cell -= f * p;
                }
            }
        }
    }
    let x: Vec<f64> = (0..k).map(|i| m[i][k] / m[i][i]).collect();
    x.iter().all(|v| v.is_finite()).then_some(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovers_known_coefficients_from_exact_samples() {
        let truth = CostModel {
            per_decode_request_s: 0.0004,
            per_prefill_attention_s: 2e-10,
            ..CostModel::linear(0.006, 0.00003, 4.4e-8)
        };
        let samples: Vec<Sample> = (1..300u64)
            .map(|i| {
                let mut shape = StepShape::decode(i % 37 + 1, i * 523 % 90_000);
                if i % 3 == 0 {
                    shape.add_prefill(i * 7 % 2048 + 1, i * 11 % 3000);
                }
                Sample { shape, seconds: truth.step_seconds(&shape) }
            })
            .collect();
        let f = fit(&samples).unwrap();
        let rel = |got: f64, want: f64| (got - want).abs() / want;
        assert!(rel(f.cost.fixed_s, truth.fixed_s) < 1e-6, "{f:?}");
        assert!(rel(f.cost.per_token_s, truth.per_token_s) < 1e-6, "{f:?}");
        assert!(rel(f.cost.per_decode_request_s, truth.per_decode_request_s) < 1e-6, "{f:?}");
        assert!(rel(f.cost.per_context_token_s, truth.per_context_token_s) < 1e-6, "{f:?}");
        assert!(rel(f.cost.per_prefill_attention_s, truth.per_prefill_attention_s) < 1e-6, "{f:?}");
        assert!(f.r_squared > 0.999999 && f.median_abs_pct_error < 1e-6);
    }

    #[test]
    fn finds_the_weight_read_floor_of_a_gpu_and_none_where_there_is_none() {
        // A GPU-like engine: a step of fewer than 160 tokens costs as much as one of 160.
        let gpu = CostModel {
            per_decode_request_s: 6e-6,
            weight_read_tokens: 160.0,
            ..CostModel::linear(0.003, 0.00003, 6e-8)
        };
        let shapes: Vec<StepShape> = (1..400u64)
            .map(|i| {
                let mut shape = StepShape::decode(i % 97 + 1, (i % 97 + 1) * (i * 37 % 4000));
                if i % 4 == 0 {
                    shape = StepShape::default();
                    shape.add_prefill(i * 13 % 8192 + 1, i * 11 % 16_000);
                }
                shape
            })
            .collect();
        let exact = |c: &CostModel| -> Vec<Sample> {
            shapes.iter().map(|shape| Sample { shape: *shape, seconds: c.step_seconds(shape) }).collect()
        };
        let f = fit(&exact(&gpu)).unwrap();
        assert_eq!(f.cost.weight_read_tokens, 160.0, "{f:?}");
        assert!((f.cost.fixed_s - gpu.fixed_s).abs() / gpu.fixed_s < 1e-6, "{f:?}");
        assert!(f.median_abs_pct_error < 1e-6, "{f:?}");
        // The same engine without the floor (a CPU's): none is found.
        let cpu = CostModel { weight_read_tokens: 0.0, ..gpu };
        let f = fit(&exact(&cpu)).unwrap();
        assert_eq!(f.cost.weight_read_tokens, 0.0, "{f:?}");
    }

    #[test]
    fn degenerate_input_is_refused() {
        assert!(matches!(fit(&[]), Err(CalibrateError::TooFew(0))));
        let same = vec![Sample { shape: StepShape::decode(1, 10), seconds: 0.01 }; 20];
        assert!(matches!(fit(&same), Err(CalibrateError::Singular)));
    }
}

#[cfg(test)]
mod from_the_engine {
    use super::*;
    use crate::engine::EngineConfig;
    use crate::experiment::run_poisson;
    use crate::workload::{LengthDist, WorkloadSpec};
    use meridian_core::sched::Fcfs;

    /// Token timings from the engine itself (virtual time, so exact) must give back the
    /// profile that produced them.
    #[test]
    fn recovers_the_profile_behind_a_simulated_run() {
        let profile = crate::profile("h100-qwen3-8b").unwrap();
        let spec = WorkloadSpec {
            prompt: LengthDist::Uniform { min: 50, max: 400 },
            think: LengthDist::Uniform { min: 50, max: 600 },
            answer: LengthDist::Uniform { min: 20, max: 200 },
            entropy: Default::default(),
        };
        let mut samples = Vec::new();
        for rate in [0.5, 4.0, 16.0] {
            let res = run_poisson(EngineConfig::from(&profile), Box::new(Fcfs), spec, rate, 150, 11);
            let observed: Vec<Observed> = res
                .records
                .iter()
                .map(|r| Observed {
                    sent_at: r.arrival_s,
                    prompt_tokens: r.prompt_tokens,
                    token_times: r.token_times.clone(),
                })
                .collect();
            samples.extend(samples_from_requests(&observed));
        }
        let f = fit(&samples).unwrap();
        let rel = |got: f64, want: f64| (got - want).abs() / want;
        assert!(rel(f.cost.fixed_s, profile.fixed_s) < 0.02, "{f:?}");
        assert!(rel(f.cost.per_token_s, profile.per_token_s) < 0.05, "{f:?}");
        assert!(rel(f.cost.per_context_token_s, profile.per_context_token_s) < 0.05, "{f:?}");
        assert!(f.median_abs_pct_error < 1.0, "{f:?}");
    }
}
