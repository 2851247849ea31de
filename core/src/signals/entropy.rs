//! Shannon entropy (nats) of a next-token distribution.

/// Entropy of `softmax(logits / temperature)`, computed in one pass with a running
/// log-sum-exp in f64 (so huge and tiny magnitudes and `-inf` entries are safe).
///
/// H = log Z - (1/Z) * sum_i e^{z_i - m} * (z_i - m), with m the running maximum and
/// Z = sum_i e^{z_i - m}; both sums are rescaled whenever the maximum grows.
pub fn entropy_from_logits(logits: &[f32], temperature: f32) -> f64 {
    let t = f64::from(temperature).max(1e-6);
    let mut m = f64::NEG_INFINITY;
    let (mut z, mut s) = (0.0f64, 0.0f64); // Z and sum e^{x-m} (x-m)
    for &l in logits {
        let x = f64::from(l) / t;
        if x == f64::NEG_INFINITY || x.is_nan() {
            continue;
        }
        if x > m {
            // Rescale to the new maximum: e^{x_i - m'} = e^{x_i - m} e^{m - m'}, and
            // (x_i - m') = (x_i - m) + (m - m').
            let shift = if m == f64::NEG_INFINITY { 0.0 } else { m - x };
            let scale = shift.exp();
            s = scale * (s + shift * z);
            z *= scale;
            m = x;
        }
        let d = x - m;
        let e = d.exp();
        z += e;
        s += e * d;
    }
    if z == 0.0 {
        return 0.0;
    }
    (z.ln() - s / z).max(0.0)
}

/// What top-k logprobs say about the full entropy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EntropyBound {
    /// -sum p log p over the k reported tokens alone.
    pub top_k: f64,
    /// The true entropy is at least this (the residual mass spread as thinly as the k-th
    /// token allows).
    pub lower: f64,
    /// ... and at most this (the residual spread evenly over the rest of the vocabulary).
    pub upper: f64,
    /// Probability mass outside the top k.
    pub residual: f64,
}

/// Bounds on the entropy from the top-k logprobs (natural log) of a vocabulary of
/// `vocab` tokens: with S the top-k sum, r the residual mass and p_k the smallest
/// reported probability, H lies in [S + r log(1/p_k), S + r log((V - k) / r)]
/// (see docs: signals-and-metrics notes).
pub fn entropy_from_top_logprobs(logprobs: &[f64], vocab: usize) -> EntropyBound {
    let probs = logprobs.iter().filter(|l| l.is_finite()).map(|l| l.exp());
    let (mut s, mut total, mut p_min, mut k) = (0.0f64, 0.0f64, 1.0f64, 0usize);
    for p in probs {
        if p > 0.0 {
            s -= p * p.ln();
        }
        total += p;
        p_min = p_min.min(p);
        k += 1;
    }
    let r = (1.0 - total).max(0.0);
    if r <= 1e-12 || k == 0 || vocab <= k {
        return EntropyBound { top_k: s, lower: s, upper: s, residual: r };
    }
    let lower = s + r * (1.0 / p_min.max(1e-300)).ln();
    let upper = s + r * ((vocab - k) as f64 / r).ln();
    EntropyBound { top_k: s, lower, upper: upper.max(lower), residual: r }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(logits: &[f32], t: f64) -> f64 {
        let xs: Vec<f64> = logits.iter().map(|l| f64::from(*l) / t).filter(|x| x.is_finite()).collect();
        let m = xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = xs.iter().map(|x| (x - m).exp()).sum();
        xs.iter().map(|x| (x - m).exp() / z).filter(|p| *p > 0.0).map(|p| -p * p.ln()).sum()
    }

    #[test]
    fn hand_worked_values() {
        // Uniform over 4: ln 4.
        assert!((entropy_from_logits(&[1.0, 1.0, 1.0, 1.0], 1.0) - 4f64.ln()).abs() < 1e-12);
        // Two tokens with p = e/(1+e), 1/(1+e): H = ln(1+e) - e/(1+e).
        let e = std::f64::consts::E;
        let h = (1.0 + e).ln() - e / (1.0 + e);
        assert!((entropy_from_logits(&[1.0, 0.0], 1.0) - h).abs() < 1e-12);
        // A certain token: 0. -inf entries are ignored.
        assert!(entropy_from_logits(&[0.0, f32::NEG_INFINITY, f32::NEG_INFINITY], 1.0).abs() < 1e-12);
        // Temperature 2 on [2, 0] equals temperature 1 on [1, 0].
        assert!((entropy_from_logits(&[2.0, 0.0], 2.0) - h).abs() < 1e-12);
    }

    #[test]
    fn huge_and_tiny_magnitudes_and_rising_maxima() {
        let logits = [-1e30f32, 3e4, 3e4 - 1.0, -5.0, 1e-30, 2.9e4];
        assert!((entropy_from_logits(&logits, 1.0) - reference(&logits, 1.0)).abs() < 1e-9);
        let increasing: Vec<f32> = (0..1000).map(|i| i as f32 * 0.01).collect();
        let t = 0.6f32;
        assert!((entropy_from_logits(&increasing, t) - reference(&increasing, f64::from(t))).abs() < 1e-9);
    }

    proptest::proptest! {
        #[test]
        fn one_pass_matches_the_two_pass_reference(
            logits in proptest::collection::vec(
                proptest::prop_oneof![-1e4f32..1e4, proptest::strategy::Just(f32::NEG_INFINITY), -1e-6f32..1e-6],
                1..400,
            ),
            t in 0.1f32..4.0,
        ) {
            let got = entropy_from_logits(&logits, t);
            let want = reference(&logits, f64::from(t));
            proptest::prop_assert!((got - want).abs() < 1e-9 * want.max(1.0), "{} vs {}", got, want);
        }
    }

    #[test]
    fn top_k_bounds_bracket_the_truth() {
        // Full distribution over V = 10: top 3 reported.
        let probs = [0.5, 0.2, 0.1, 0.05, 0.05, 0.04, 0.03, 0.01, 0.01, 0.01];
        let truth: f64 = probs.iter().map(|p: &f64| -p * p.ln()).sum();
        let top: Vec<f64> = probs[..3].iter().map(|p: &f64| p.ln()).collect();
        let b = entropy_from_top_logprobs(&top, 10);
        assert!((b.residual - 0.2).abs() < 1e-12);
        assert!(b.lower <= truth && truth <= b.upper, "{b:?} vs {truth}");
        // Hand-worked: S = -(.5 ln .5 + .2 ln .2 + .1 ln .1); lower = S + .2 ln 10; upper = S + .2 ln 35.
        let s = -(0.5f64 * 0.5f64.ln() + 0.2 * 0.2f64.ln() + 0.1 * 0.1f64.ln());
        assert!((b.lower - (s + 0.2 * 10f64.ln())).abs() < 1e-12);
        assert!((b.upper - (s + 0.2 * 35f64.ln())).abs() < 1e-12);
        // All mass reported: exact.
        let full: Vec<f64> = [0.5f64, 0.5].iter().map(|p| p.ln()).collect();
        let b = entropy_from_top_logprobs(&full, 100);
        assert!((b.lower - 2f64.ln()).abs() < 1e-12 && (b.upper - b.lower).abs() < 1e-12);
    }
}
