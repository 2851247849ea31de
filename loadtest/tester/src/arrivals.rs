//! When each request is sent: all at once (`inf`), Poisson or gamma arrivals at a rate
//! (`--burstiness` is the gamma shape, as in `vllm bench serve`: 1 is Poisson, lower is
//! burstier), optionally ramping the rate linearly from a start to an end value.

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Gamma};

/// How the request rate evolves over the run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rate {
    /// Everything at t = 0 (bounded by `--max-concurrency`).
    Unlimited,
    Constant(f64),
    /// Linear from `start` to `end` requests/s across the run's requests.
    Ramp {
        start: f64,
        end: f64,
    },
}

/// Send offsets in seconds from the start, one per request, non-decreasing.
pub fn schedule(n: usize, rate: Rate, burstiness: f64, seed: u64) -> Vec<f64> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xA5A5_5A5A);
    let shape = if burstiness.is_finite() && burstiness > 0.0 { burstiness } else { 1.0 };
    let mut t = 0.0;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let r = match rate {
            Rate::Unlimited => {
                out.push(0.0);
                continue;
            }
            Rate::Constant(r) => r,
            Rate::Ramp { start, end } => {
                let f = if n > 1 { i as f64 / (n - 1) as f64 } else { 0.0 };
                start + (end - start) * f
            }
        };
        out.push(t);
        // Gamma(shape, scale = 1 / (rate * shape)) has mean 1 / rate.
        let gap =
            Gamma::new(shape, 1.0 / (r.max(1e-9) * shape)).map_or(1.0 / r.max(1e-9), |g| g.sample(&mut rng));
        t += gap;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisson_rate_is_respected_and_seeded() {
        let s = schedule(5001, Rate::Constant(20.0), 1.0, 9);
        let achieved = 5000.0 / s[5000];
        assert!((achieved - 20.0).abs() < 1.0, "{achieved}");
        assert_eq!(s, schedule(5001, Rate::Constant(20.0), 1.0, 9));
        assert!(s.windows(2).all(|w| w[1] >= w[0]));
    }

    #[test]
    fn burstier_arrivals_have_more_variable_gaps() {
        let cv = |b: f64| {
            let s = schedule(4001, Rate::Constant(10.0), b, 1);
            let gaps: Vec<f64> = s.windows(2).map(|w| w[1] - w[0]).collect();
            let m = gaps.iter().sum::<f64>() / gaps.len() as f64;
            (gaps.iter().map(|g| (g - m).powi(2)).sum::<f64>() / gaps.len() as f64).sqrt() / m
        };
        assert!((cv(1.0) - 1.0).abs() < 0.1, "Poisson gaps have CV 1");
        assert!(cv(0.25) > 1.6, "gamma shape 0.25 has CV 2");
    }

    #[test]
    fn ramp_speeds_up_and_unlimited_is_all_at_once() {
        let s = schedule(2001, Rate::Ramp { start: 5.0, end: 50.0 }, 1.0, 2);
        let first = s[200] - s[0];
        let last = s[2000] - s[1800];
        assert!(first > 3.0 * last, "{first} vs {last}");
        assert!(schedule(10, Rate::Unlimited, 1.0, 0).iter().all(|t| *t == 0.0));
    }
}
