//! Fits the cost model to what a load test measured against a real engine.
//!
//! Input: `meridian-loadtest --save-result` JSON (each request's send time, prompt length
//! and token arrival times). Each gap between two tokens of a request is one or more
//! engine steps; at the gap's midpoint the engine was decoding every request that had
//! started and not finished, with a known total context. So each gap is a sample of
//! `fixed + per_token x batch + per_context_token x context`, and each TTFT of a request
//! that arrived to an idle engine is a sample of `fixed + per_token x prompt`. The fit is
//! least absolute deviations (by iteratively reweighted least squares): measured gaps
//! have a long tail from OS scheduling and network, which a squared loss would fold into
//! the coefficients. The fit error is reported as the median absolute percentage error
//! and R².

use serde::Deserialize;

use crate::cost::CostModel;

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

/// One observation: (tokens scheduled, decode context, seconds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub tokens: f64,
    pub context: f64,
    pub seconds: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Fit {
    pub cost: CostModel,
    pub samples: usize,
    /// Median of |predicted - measured| / measured.
    pub median_abs_pct_error: f64,
    pub r_squared: f64,
}

#[derive(Debug, thiserror::Error)]
pub enum CalibrateError {
    #[error("not a meridian-loadtest JSON report: {0}")]
    Parse(#[from] serde_json::Error),
    #[error("too few usable samples ({0}); run longer, at several concurrency levels")]
    TooFew(usize),
    #[error("the samples do not pin down the model (batch and context never varied)")]
    Singular,
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
            out.push(Sample { tokens: s.prompt, context: 0.0, seconds: s.times[0] - s.start });
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
            let (mut batch, mut context) = (0.0f64, 0.0f64);
            for o in &spans {
                if let Some(c) = o.context_at(mid) {
                    batch += 1.0;
                    context += c;
                }
            }
            out.push(Sample { tokens: batch.max(1.0), context, seconds: w[1] - w[0] });
        }
    }
    out
}

/// Least-squares fit of the cost model.
pub fn fit(samples: &[Sample]) -> Result<Fit, CalibrateError> {
    if samples.len() < 10 {
        return Err(CalibrateError::TooFew(samples.len()));
    }
    // Least absolute deviations by IRLS: weighted normal equations for y = a + b x1 + c x2,
    // with weights 1 / |residual| from the previous round.
    let mut weights = vec![1.0f64; samples.len()];
    let mut coef = [0.0f64; 3];
    for _ in 0..30 {
        let mut m = [[0.0f64; 4]; 3];
        for (s, w) in samples.iter().zip(&weights) {
            let x = [1.0, s.tokens, s.context];
            for r in 0..3 {
                for c in 0..3 {
                    m[r][c] += w * x[r] * x[c];
                }
                m[r][3] += w * x[r] * s.seconds;
            }
        }
        coef = solve3(m).ok_or(CalibrateError::Singular)?;
        for (s, w) in samples.iter().zip(weights.iter_mut()) {
            let residual = s.seconds - (coef[0] + coef[1] * s.tokens + coef[2] * s.context);
            *w = 1.0 / residual.abs().max(1e-6);
        }
    }
    let cost = CostModel {
        fixed_s: coef[0].max(0.0),
        per_token_s: coef[1].max(0.0),
        per_context_token_s: coef[2].max(0.0),
    };
    let predict =
        |s: &Sample| cost.fixed_s + cost.per_token_s * s.tokens + cost.per_context_token_s * s.context;
    let mean = samples.iter().map(|s| s.seconds).sum::<f64>() / samples.len() as f64;
    let ss_tot: f64 = samples.iter().map(|s| (s.seconds - mean).powi(2)).sum();
    let ss_res: f64 = samples.iter().map(|s| (s.seconds - predict(s)).powi(2)).sum();
    let mut pct: Vec<f64> = samples
        .iter()
        .filter(|s| s.seconds > 0.0)
        .map(|s| ((predict(s) - s.seconds) / s.seconds).abs())
        .collect();
    pct.sort_by(|a, b| a.total_cmp(b));
    Ok(Fit {
        cost,
        samples: samples.len(),
        median_abs_pct_error: pct.get(pct.len() / 2).copied().unwrap_or(0.0) * 100.0,
        r_squared: if ss_tot > 0.0 { 1.0 - ss_res / ss_tot } else { 0.0 },
    })
}

/// Gaussian elimination with partial pivoting on a 3x4 augmented matrix.
fn solve3(mut m: [[f64; 4]; 3]) -> Option<[f64; 3]> {
    for col in 0..3 {
        let pivot = (col..3).max_by(|a, b| m[*a][col].abs().total_cmp(&m[*b][col].abs()))?;
        if m[pivot][col].abs() < 1e-300 {
            return None;
        }
        m.swap(col, pivot);
        for row in 0..3 {
            if row != col {
                let f = m[row][col] / m[col][col];
                let pivot_row = m[col];
                for (cell, p) in m[row].iter_mut().zip(pivot_row).skip(col) {
                    *cell -= f * p;
                }
            }
        }
    }
    let x = [m[0][3] / m[0][0], m[1][3] / m[1][1], m[2][3] / m[2][2]];
    x.iter().all(|v| v.is_finite()).then_some(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovers_known_coefficients_from_exact_samples() {
        let truth = CostModel { fixed_s: 0.006, per_token_s: 0.00003, per_context_token_s: 4.4e-8 };
        let samples: Vec<Sample> = (1..200)
            .map(|i| {
                let tokens = f64::from(i % 37 + 1);
                let context = f64::from(i * 523 % 90_000);
                Sample { tokens, context, seconds: truth.step_seconds(tokens as u64, context as u64) }
            })
            .collect();
        let f = fit(&samples).unwrap();
        assert!((f.cost.fixed_s - truth.fixed_s).abs() < 1e-9);
        assert!((f.cost.per_token_s - truth.per_token_s).abs() < 1e-11);
        assert!((f.cost.per_context_token_s - truth.per_context_token_s).abs() < 1e-13);
        assert!(f.r_squared > 0.999999 && f.median_abs_pct_error < 1e-6);
    }

    #[test]
    fn degenerate_input_is_refused() {
        assert!(matches!(fit(&[]), Err(CalibrateError::TooFew(0))));
        let same = vec![Sample { tokens: 1.0, context: 10.0, seconds: 0.01 }; 20];
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
