//! Shannon entropy (nats) of a next-token distribution.

/// Entropy of `softmax(logits / temperature)`, computed in one pass with a running
/// log-sum-exp in f64 (so huge and tiny magnitudes and `-inf` entries are safe).
///
/// H = log Z - (1/Z) * sum_i e^{z_i - m} * (z_i - m), with m the running maximum and
/// Z = sum_i e^{z_i - m}; both sums are rescaled whenever the maximum grows. `-inf` and
/// NaN entries are skipped; a `+inf` entry makes the result 0.
pub fn entropy_from_logits(logits: &[f32], temperature: f32) -> f64 {
    let t = f64::from(temperature).max(1e-6);
    let mut state = EntropyState::EMPTY;
    for &l in logits {
        state.push(f64::from(l) / t);
    }
    state.entropy()
}

/// The running state of [`entropy_from_logits`]'s one pass, over values x = logit /
/// temperature: m, Z = sum e^{x-m} and sum e^{x-m} (x-m). Mergeable, so a row can be
/// split across threads or SIMD lanes and the parts combined exactly (the batched
/// kernels in `meridian-kernels` do).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EntropyState {
    /// The running maximum m (`-inf` while empty).
    pub max: f64,
    /// Z = sum e^{x-m}.
    pub sum_exp: f64,
    /// sum e^{x-m} (x-m) (never positive).
    pub sum_exp_dev: f64,
}

impl EntropyState {
    pub const EMPTY: EntropyState = EntropyState { max: f64::NEG_INFINITY, sum_exp: 0.0, sum_exp_dev: 0.0 };

    /// Adds one value x (already divided by the temperature); `-inf` and NaN are skipped.
    pub fn push(&mut self, x: f64) {
        if x == f64::NEG_INFINITY || x.is_nan() {
            return;
        }
        if x > self.max {
            self.rebase(x);
        }
        let d = x - self.max;
        let e = d.exp();
        self.sum_exp += e;
        self.sum_exp_dev += e * d;
    }

    /// Moves the reference to `m2` >= m: e^{x_i - m2} = e^{x_i - m} e^{m - m2}, and
    /// (x_i - m2) = (x_i - m) + (m - m2).
    fn rebase(&mut self, m2: f64) {
        let shift = if self.max == f64::NEG_INFINITY { 0.0 } else { self.max - m2 };
        let scale = shift.exp();
        self.sum_exp_dev = scale * (self.sum_exp_dev + shift * self.sum_exp);
        self.sum_exp *= scale;
        self.max = m2;
    }

    /// The state over both parts' values.
    pub fn merge(mut self, mut other: EntropyState) -> EntropyState {
        if other.max == f64::NEG_INFINITY {
            return self;
        }
        if self.max == f64::NEG_INFINITY {
            return other;
        }
        if self.max < other.max {
            self.rebase(other.max);
        } else if other.max < self.max {
            other.rebase(self.max);
        }
        EntropyState {
            max: self.max,
            sum_exp: self.sum_exp + other.sum_exp,
            sum_exp_dev: self.sum_exp_dev + other.sum_exp_dev,
        }
    }

    /// log sum_i e^{x_i}: the log-normaliser, so log p_i = x_i - log_sum_exp().
    pub fn log_sum_exp(&self) -> f64 {
        self.max + self.sum_exp.ln()
    }

    /// The entropy in nats (0 for an empty state).
    pub fn entropy(&self) -> f64 {
        let z = self.sum_exp;
        if z == 0.0 {
            return 0.0;
        }
        (z.ln() - self.sum_exp_dev / z).max(0.0)
    }
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
    fn merged_states_equal_one_pass() {
        let logits = [-1e30f32, 3.0, 2.5, f32::NEG_INFINITY, -5.0, 7.0, f32::NAN, 6.5];
        let whole = entropy_from_logits(&logits, 0.7);
        for cut in 0..=logits.len() {
            let part = |xs: &[f32]| {
                let mut st = EntropyState::EMPTY;
                xs.iter().for_each(|l| st.push(f64::from(*l) / f64::from(0.7f32)));
                st
            };
            let merged = part(&logits[..cut]).merge(part(&logits[cut..]));
            assert!((merged.entropy() - whole).abs() < 1e-12, "cut {cut}");
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
