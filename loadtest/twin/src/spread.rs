//! How much one engine step's time varies around the cost model's fit.
//!
//! A fitted cost model gives every step of one shape the same time; a real engine does
//! not. On the GPU-shaped rig the stock engine's steps sit a median 15% off the fit, and
//! the slowest few in a hundred take twice as long or more. An answer of a hundred
//! tokens waits once for each of a hundred steps, so its largest gap is the slowest of
//! them: a twin whose steps never vary puts that gap near one ordinary step (at the
//! median request, 16 to 25 ms in the stock replays of the policies page's set 8, rounds
//! 5 to 7, where the rig measured 31 to 47 ms), and every effect on it is read against
//! too small a denominator.
//!
//! A [`StepSpread`] is the measured distribution of a step's time over the fit's
//! (`measured / fitted`, the stock engine's step trace; `meridian-sim calibrate` writes
//! it into the profile as `step_spread`), kept as its quantiles at [`PROBABILITIES`].
//! The twin multiplies each step's fitted time by a draw from it, each step drawn alone
//! and whatever its shape, deterministically: step `n` of every replay draws the same
//! factor, so two policies replayed on the same requests meet the same slow steps for as
//! long as their schedules agree.
//!
//! On the rig, slow steps come in spells (the lag-one correlation of the ratios'
//! logarithms over set 8's stock steps is 0.93), partly because consecutive steps have like shapes
//! and the fit prices a shape wrong every time it comes. Draws that kept that correlation
//! (one normal score carried from step to step, read through the same quantiles) were
//! tried on set 8 and matched the rig worse than independent ones: stock's largest
//! answer gap (p50 and p90 over the 23 rounds' runs) a median 1.48x off the measured
//! one against 1.27x, and `output-first`'s TTOT p90 effect 0.39 against a measured 1.03
//! (independent draws 0.72; none 0.48).

use serde::Deserialize;

/// The probabilities the quantiles of a [`StepSpread`] are taken at: finer in the upper
/// tail, where an answer's slowest step is drawn from.
pub const PROBABILITIES: [f64; 21] = [
    0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.97, 0.98, 0.99, 0.995, 0.998,
    0.999, 0.9999, 1.0,
];

/// A step's time over the fit's, as quantiles at [`PROBABILITIES`].
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(try_from = "Vec<f64>")]
pub struct StepSpread {
    quantiles: [f64; PROBABILITIES.len()],
}

/// Why a spread was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SpreadError {
    #[error("step_spread needs {expected} quantiles (at {PROBABILITIES:?}), not {got}")]
    Count { expected: usize, got: usize },
    #[error("step_spread's quantiles must be positive, finite and ascending")]
    Order,
    #[error("no positive measured and fitted step times to take a spread from")]
    Empty,
}

impl TryFrom<Vec<f64>> for StepSpread {
    type Error = SpreadError;

    fn try_from(v: Vec<f64>) -> Result<Self, SpreadError> {
        let quantiles: [f64; PROBABILITIES.len()] = v
            .as_slice()
            .try_into()
            .map_err(|_| SpreadError::Count { expected: PROBABILITIES.len(), got: v.len() })?;
        let ordered = quantiles.windows(2).all(|w| w[0] <= w[1]);
        if !ordered || quantiles.iter().any(|q| !q.is_finite() || *q <= 0.0) {
            return Err(SpreadError::Order);
        }
        Ok(StepSpread { quantiles })
    }
}

impl StepSpread {
    /// The spread of `measured / fitted` over pairs of a step's measured and fitted time
    /// (pairs with either time not positive are left out).
    pub fn of(pairs: impl IntoIterator<Item = (f64, f64)>) -> Result<Self, SpreadError> {
        let mut ratios: Vec<f64> = pairs
            .into_iter()
            .filter(|(measured, fitted)| *measured > 0.0 && *fitted > 0.0 && measured.is_finite())
            .map(|(measured, fitted)| measured / fitted)
            .collect();
        if ratios.is_empty() {
            return Err(SpreadError::Empty);
        }
        ratios.sort_by(f64::total_cmp);
        let last = (ratios.len() - 1) as f64;
        let at = |p: f64| {
            // Linear between the order statistics around rank p x (n - 1).
            let rank = p * last;
            let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
            ratios[lo] + (ratios[hi] - ratios[lo]) * (rank - lo as f64)
        };
        Ok(StepSpread { quantiles: PROBABILITIES.map(at) })
    }

    /// The quantiles, as a profile writes them.
    pub fn quantiles(&self) -> &[f64] {
        &self.quantiles
    }

    /// The factor at probability `u` (0..=1): linear between the kept quantiles.
    pub fn factor_at(&self, u: f64) -> f64 {
        let u = u.clamp(0.0, 1.0);
        let i = PROBABILITIES.partition_point(|p| *p <= u).clamp(1, PROBABILITIES.len() - 1);
        let (p0, p1) = (PROBABILITIES[i - 1], PROBABILITIES[i]);
        let (q0, q1) = (self.quantiles[i - 1], self.quantiles[i]);
        if p1 <= p0 { q1 } else { q0 + (q1 - q0) * (u - p0) / (p1 - p0) }
    }

    /// The factor step `n` of a replay takes: a fixed draw for each `n`.
    pub fn factor(&self, step: u64) -> f64 {
        self.factor_at(unit(step))
    }

    /// The mean factor (over the piecewise-linear distribution): how much longer than the
    /// fit's the twin's steps take on average.
    pub fn mean(&self) -> f64 {
        PROBABILITIES
            .windows(2)
            .zip(self.quantiles.windows(2))
            .map(|(p, q)| (p[1] - p[0]) * (q[0] + q[1]) / 2.0)
            .sum()
    }
}

/// A uniform draw in [0, 1) for `n`: splitmix64, so every replay draws the same sequence.
fn unit(n: u64) -> f64 {
    let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uniform_spread() -> StepSpread {
        // measured / fitted spread evenly over 0.5..=1.5.
        StepSpread::of((0..=1000).map(|i| (0.5 + f64::from(i) / 1000.0, 1.0))).unwrap()
    }

    #[test]
    fn quantiles_follow_the_measured_ratios() {
        let s = uniform_spread();
        for (p, q) in PROBABILITIES.iter().zip(s.quantiles()) {
            assert!((q - (0.5 + p)).abs() < 1e-9, "p {p}: {q}");
        }
        assert!((s.factor_at(0.25) - 0.75).abs() < 1e-9);
        assert!((s.mean() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn draws_are_fixed_per_step_and_spread_like_the_measurement() {
        let s = uniform_spread();
        assert_eq!(s.factor(17), s.factor(17));
        let draws: Vec<f64> = (0..20_000).map(|n| s.factor(n)).collect();
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        assert!((mean - 1.0).abs() < 0.01, "mean {mean}");
        let above = draws.iter().filter(|d| **d > 1.4).count() as f64 / draws.len() as f64;
        assert!((above - 0.1).abs() < 0.01, "share above the 90th percentile: {above}");
        assert!(draws.iter().all(|d| (0.5..=1.5).contains(d)));
    }

    #[test]
    fn a_malformed_spread_is_refused() {
        assert_eq!(StepSpread::try_from(vec![1.0; 3]), Err(SpreadError::Count { expected: 21, got: 3 }));
        let mut down = vec![1.0; 21];
        down[20] = 0.9;
        assert_eq!(StepSpread::try_from(down), Err(SpreadError::Order));
        assert_eq!(StepSpread::try_from(vec![0.0; 21]), Err(SpreadError::Order));
        assert_eq!(StepSpread::of([(0.0, 1.0), (1.0, 0.0)]), Err(SpreadError::Empty));
    }
}
