//! Shared test helpers: an independent two-pass float64 reference and logits generators.
#![allow(dead_code)]

use proptest::prelude::*;

/// Two-pass float64 entropy of softmax(logits / t) (t floored at 1e-6 as in
/// meridian-core): -inf and NaN skipped, +inf rows 0.
pub fn reference(logits: &[f32], t: f32) -> f64 {
    let t = f64::from(t).max(1e-6);
    if logits.contains(&f32::INFINITY) {
        return 0.0;
    }
    let xs: Vec<f64> = logits.iter().map(|l| f64::from(*l) / t).filter(|x| x.is_finite()).collect();
    if xs.is_empty() {
        return 0.0;
    }
    let m = xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let z: f64 = xs.iter().map(|x| (x - m).exp()).sum();
    xs.iter().map(|x| (x - m).exp() / z).filter(|p| *p > 0.0).map(|p| -p * p.ln()).sum()
}

/// Top-k logprobs of softmax(logits / t), by sorting, in float64.
pub fn top_logprobs(logits: &[f32], k: usize, t: f32) -> Vec<f64> {
    let t = f64::from(t).max(1e-6);
    let mut xs: Vec<f64> = logits.iter().map(|l| f64::from(*l) / t).filter(|x| x.is_finite()).collect();
    xs.sort_by(|a, b| b.total_cmp(a));
    let m = xs.first().copied().unwrap_or(f64::NEG_INFINITY);
    let ln_z = xs.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
    // (x - m) - ln Z: x - (m + ln Z) would cancel every digit away for |x| ~ 1e30.
    xs.iter().take(k).map(|x| (x - m) - ln_z).collect()
}

/// Rows of every shape the kernels must handle.
pub fn logits_row(max_len: usize) -> impl Strategy<Value = Vec<f32>> {
    let uniform = (1..max_len).prop_flat_map(|n| (Just(n), -5.0f32..5.0)).prop_map(|(n, v)| vec![v; n]);
    let normal = proptest::collection::vec(-12.0f32..12.0, 1..max_len);
    let peaked =
        (proptest::collection::vec(-3.0f32..3.0, 1..max_len), any::<prop::sample::Index>(), 10.0f32..60.0)
            .prop_map(|(mut v, i, h)| {
                let j = i.index(v.len());
                v[j] += h;
                v
            });
    let with_neg_inf =
        proptest::collection::vec(prop_oneof![4 => -8.0f32..8.0, 1 => Just(f32::NEG_INFINITY)], 1..max_len);
    let magnitudes = proptest::collection::vec(
        prop_oneof![-3e4f32..3e4, -1e-30f32..1e-30, Just(-1e30f32), Just(3e4f32), 1e3f32..1.1e3],
        1..max_len,
    );
    prop_oneof![uniform, normal, peaked, with_neg_inf, magnitudes]
}

/// Rows of a realistic vocabulary size: a smooth background plus a few spikes.
pub fn big_row(n: usize, seed: u64, spread: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let u = ((s >> 40) as f32) / ((1u64 << 24) as f32);
            let spike = if (s >> 20) % 5000 == 0 { 15.0 } else { 0.0 };
            (u - 0.5) * spread + spike
        })
        .collect()
}
