//! The paired effect of a flood on the victim: percentiles where a failed request is
//! slower than any, the ratio over rounds, its bootstrap interval, and the verdict.

use meridian_loadtest::record::RequestRecord;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The victim's flooded tails over its unflooded ones, at most.
pub const TARGET_RATIO: f64 = 1.10;
pub(crate) const BOOTSTRAP: usize = 1000;

/// Nearest-rank percentile of values where a failure is `INFINITY`.
pub(crate) fn pct(values: &mut [f64], p: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * values.len() as f64).ceil().max(1.0) as usize;
    values[rank.min(values.len()) - 1]
}

pub(crate) type Metric = fn(&RequestRecord) -> Option<f64>;

pub(crate) const METRICS: [(&str, Metric); 6] = [
    ("TTFT", |r| r.ttft),
    ("TTFO", |r| r.ttfo),
    ("TTOT", |r| r.think_to_output),
    ("answer's largest gap", |r| r.max_output_gap),
    ("time per output token", |r| r.tpot),
    ("end to end", |r| r.e2e),
];

pub(crate) fn value(r: &RequestRecord, m: Metric) -> f64 {
    if r.ok { m(r).unwrap_or(f64::INFINITY) } else { f64::INFINITY }
}

/// The victim's percentile `p` of metric `m` over the requests `idx` of a run.
pub(crate) fn stat(run: &[RequestRecord], idx: &[usize], m: Metric, p: f64) -> f64 {
    let mut v: Vec<f64> = idx.iter().map(|&i| value(&run[i], m)).collect();
    pct(&mut v, p)
}

/// Paired ratio (cond over alone) across rounds, with its 90% bootstrap interval.
#[derive(Clone, Copy)]
pub(crate) struct Effect {
    pub(crate) point: f64,
    pub(crate) lo: f64,
    pub(crate) hi: f64,
}

pub(crate) fn effect(pairs: &[(&[RequestRecord], &[RequestRecord])], m: Metric, p: f64) -> Effect {
    effect_of(pairs, |run, idx| stat(run, idx, m, p))
}

/// Paired ratio (cond over alone) of any statistic of a run's requests `idx`, across
/// rounds, with its 90% bootstrap interval over the rounds and their requests.
pub(crate) fn effect_of(
    pairs: &[(&[RequestRecord], &[RequestRecord])],
    stat: impl Fn(&[RequestRecord], &[usize]) -> f64,
) -> Effect {
    let ratio = |rounds: &[(usize, Vec<usize>)]| {
        let mut num = 0.0;
        let mut den = 0.0;
        for (r, idx) in rounds {
            let (base, cond) = pairs[*r];
            num += stat(cond, idx).ln();
            den += stat(base, idx).ln();
        }
        ((num - den) / rounds.len() as f64).exp()
    };
    let all: Vec<(usize, Vec<usize>)> =
        (0..pairs.len()).map(|r| (r, (0..pairs[r].0.len()).collect())).collect();
    let point = ratio(&all);
    let sizes: Vec<usize> = pairs.iter().map(|(base, _)| base.len()).collect();
    let mut rng = StdRng::seed_from_u64(7);
    let mut draws: Vec<f64> = (0..BOOTSTRAP).map(|_| ratio(&resample(&mut rng, &sizes))).collect();
    interval(&mut draws, point)
}

/// One bootstrap draw over rounds of `sizes` requests each: as many rounds as there are,
/// drawn with replacement, and within each as many of its requests, drawn the same way
/// (the same indices serve both runs of a paired round).
pub(crate) fn resample(rng: &mut StdRng, sizes: &[usize]) -> Vec<(usize, Vec<usize>)> {
    (0..sizes.len())
        .map(|_| {
            let r = rng.random_range(0..sizes.len());
            let n = sizes[r];
            (r, (0..n).map(|_| rng.random_range(0..n)).collect())
        })
        .collect()
}

/// The 90% interval of bootstrap draws around `point`.
pub(crate) fn interval(draws: &mut [f64], point: f64) -> Effect {
    draws.sort_by(f64::total_cmp);
    let at = |q: f64| draws[((q * draws.len() as f64) as usize).min(draws.len() - 1)];
    Effect { point, lo: at(0.05), hi: at(0.95) }
}

pub(crate) fn verdict(e: &Effect) -> &'static str {
    if e.hi <= TARGET_RATIO {
        "met"
    } else if e.lo > TARGET_RATIO {
        "missed"
    } else {
        "unresolved"
    }
}
