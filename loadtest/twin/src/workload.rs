//! Synthetic reasoning workloads: prompt, think and answer lengths from configurable
//! distributions, and per-token entropy trajectories that settle once the reasoning
//! "converges", so entropy-based exit signals have something real to detect. Seeded:
//! the same spec and seed give the same requests.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, LogNormal};
use serde::Deserialize;

/// A token-length distribution.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum LengthDist {
    Fixed {
        value: u32,
    },
    Uniform {
        min: u32,
        max: u32,
    },
    /// Log-normal with this median and log-space sigma, clamped to `[1, max]`.
    LogNormal {
        median: f64,
        sigma: f64,
        max: u32,
    },
}

impl LengthDist {
    pub fn sample(&self, rng: &mut StdRng) -> u32 {
        match *self {
            LengthDist::Fixed { value } => value,
            LengthDist::Uniform { min, max } => rng.random_range(min..=max.max(min)),
            LengthDist::LogNormal { median, sigma, max } => {
                // Only a negative or NaN sigma makes the distribution invalid: fall back
                // to the median itself then.
                let x = LogNormal::new(median.max(1e-9).ln(), sigma).map_or(median, |d| d.sample(rng));
                (x.round() as u32).clamp(1, max.max(1))
            }
        }
    }
}

/// Entropy (nats) over a generation: high and falling while the model explores, flat
/// around `floor` once it has converged (at `converge_frac` of the think length), and
/// around `output_level` while answering, each with bounded noise.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntropySpec {
    pub start: f64,
    pub floor: f64,
    pub converge_frac: f64,
    pub noise: f64,
    pub output_level: f64,
}

impl Default for EntropySpec {
    fn default() -> Self {
        EntropySpec { start: 2.5, floor: 0.4, converge_frac: 0.6, noise: 0.15, output_level: 0.8 }
    }
}

/// One request's entropy trajectory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EntropyTrajectory {
    spec: EntropySpec,
    think_len: u32,
    seed: u64,
}

impl EntropyTrajectory {
    /// The token index where reasoning has converged.
    pub fn converged_at(&self) -> u32 {
        (f64::from(self.think_len) * self.spec.converge_frac).round() as u32
    }

    /// Entropy of token `index` (think tokens first, then the answer).
    pub fn at(&self, index: u32) -> f64 {
        let s = &self.spec;
        let noise = s.noise * unit_noise(self.seed, index);
        if index >= self.think_len {
            return (s.output_level + noise).max(0.0);
        }
        let settle = f64::from(self.converged_at().max(1));
        // e^-4 at the convergence point: within 2% of the floor's distance by then.
        let decay = (-4.0 * f64::from(index) / settle).exp();
        (s.floor + (s.start - s.floor) * decay + noise).max(0.0)
    }
}

/// Deterministic noise in [-1, 1] for (seed, index): splitmix64.
fn unit_noise(seed: u64, index: u32) -> f64 {
    let mut z = seed ^ (u64::from(index).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
}

/// What a workload is made of.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSpec {
    pub prompt: LengthDist,
    pub think: LengthDist,
    pub answer: LengthDist,
    #[serde(default)]
    pub entropy: EntropySpec,
}

impl Default for WorkloadSpec {
    /// A chat-style reasoning mix: short prompts, thinking a few times longer than the
    /// answer, both heavy-tailed.
    fn default() -> Self {
        WorkloadSpec {
            prompt: LengthDist::LogNormal { median: 200.0, sigma: 0.8, max: 4000 },
            think: LengthDist::LogNormal { median: 600.0, sigma: 0.7, max: 8000 },
            answer: LengthDist::LogNormal { median: 200.0, sigma: 0.6, max: 2000 },
            entropy: EntropySpec::default(),
        }
    }
}

/// Why a workload file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path}: {source}")]
    Parse { path: String, source: toml::de::Error },
}

impl WorkloadSpec {
    /// Reads a workload file (see `loadtest/twin/workloads/default.toml`).
    pub fn from_file(path: &std::path::Path) -> Result<Self, WorkloadError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|source| WorkloadError::Read { path: shown.clone(), source })?;
        toml::from_str(&text).map_err(|source| WorkloadError::Parse { path: shown, source })
    }

    /// Every request the same: handy for experiments whose answers must be exact.
    pub fn fixed(prompt: u32, think: u32, answer: u32) -> Self {
        WorkloadSpec {
            prompt: LengthDist::Fixed { value: prompt },
            think: LengthDist::Fixed { value: think },
            answer: LengthDist::Fixed { value: answer },
            entropy: EntropySpec::default(),
        }
    }
}

/// One drawn request shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RequestShape {
    pub prompt: u32,
    pub think: u32,
    pub answer: u32,
    pub entropy: EntropyTrajectory,
}

/// A seeded stream of request shapes.
pub struct Workload {
    spec: WorkloadSpec,
    rng: StdRng,
}

impl Workload {
    pub fn new(spec: WorkloadSpec, seed: u64) -> Self {
        Workload { spec, rng: StdRng::seed_from_u64(seed) }
    }

    pub fn next_shape(&mut self) -> RequestShape {
        let prompt = self.spec.prompt.sample(&mut self.rng);
        let think = self.spec.think.sample(&mut self.rng);
        let answer = self.spec.answer.sample(&mut self.rng).max(1);
        let seed = self.rng.random();
        RequestShape {
            prompt,
            think,
            answer,
            entropy: EntropyTrajectory { spec: self.spec.entropy, think_len: think, seed },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_requests() {
        let a: Vec<_> = (0..20)
            .map({
                let mut w = Workload::new(WorkloadSpec::default(), 7);
                move |_| w.next_shape()
            })
            .collect();
        let mut w = Workload::new(WorkloadSpec::default(), 7);
        let b: Vec<_> = (0..20).map(|_| w.next_shape()).collect();
        assert_eq!(a, b);
        let mut w = Workload::new(WorkloadSpec::default(), 8);
        assert_ne!(a[0], w.next_shape());
    }

    #[test]
    fn the_shipped_default_file_is_the_default() {
        let path = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/workloads/default.toml"));
        assert_eq!(WorkloadSpec::from_file(path).unwrap(), WorkloadSpec::default());
        let bad = std::env::temp_dir().join(format!("wl-{}.toml", std::process::id()));
        std::fs::write(&bad, "prompt = { kind = \"fixed\", value = 1 }\nthink = 3\n").unwrap();
        assert!(matches!(WorkloadSpec::from_file(&bad), Err(WorkloadError::Parse { .. })));
        std::fs::remove_file(bad).unwrap();
    }

    #[test]
    fn lognormal_median_is_respected() {
        let mut rng = StdRng::seed_from_u64(1);
        let d = LengthDist::LogNormal { median: 600.0, sigma: 0.7, max: 100_000 };
        let mut v: Vec<u32> = (0..4001).map(|_| d.sample(&mut rng)).collect();
        v.sort();
        let median = f64::from(v[2000]);
        assert!((540.0..660.0).contains(&median), "{median}");
    }

    #[test]
    fn entropy_settles_after_convergence() {
        let t = EntropyTrajectory { spec: EntropySpec::default(), think_len: 1000, seed: 3 };
        assert_eq!(t.converged_at(), 600);
        let early: f64 = (0..50).map(|i| t.at(i)).sum::<f64>() / 50.0;
        let settled: Vec<f64> = (600..1000).map(|i| t.at(i)).collect();
        let mean = settled.iter().sum::<f64>() / settled.len() as f64;
        let var = settled.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / settled.len() as f64;
        assert!(early > 1.8, "{early}");
        assert!((mean - 0.4).abs() < 0.06, "{mean}");
        // Uniform noise of half-width 0.15 has variance 0.15^2 / 3.
        assert!(var < 0.0085, "{var}");
        assert!((t.at(1000) - 0.8).abs() <= 0.15 + 1e-9, "answer level");
    }
}
