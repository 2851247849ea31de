//! EAT, "Entropy After </think>" (arXiv 2509.26522): at each reasoning step boundary,
//! the entropy of the next token after appending the end-of-thinking delimiter is a
//! sample x_t; an EMA m_t = a x_t + (1 - a) m_{t-1} and EMA variance
//! v_t = a (x_t - m_t)^2 + (1 - a) v_{t-1} (v_0 = 0) track it, and reasoning may stop at
//! the first step after the warm-up where v_t < delta. The first sample initialises m.

/// EAT parameters. The paper sweeps `alpha` in 0.05..0.3 and `delta` = 2^-i; one public
/// online version uses alpha 0.2, delta 1e-4, warm-up 4 steps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EatConfig {
    pub alpha: f64,
    pub delta: f64,
    pub warmup_steps: u32,
}

impl Default for EatConfig {
    fn default() -> Self {
        EatConfig { alpha: 0.2, delta: 1e-4, warmup_steps: 4 }
    }
}

/// One update's outcome.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EatReading {
    pub ema: f64,
    pub variance: f64,
    /// The variance has settled below `delta` after the warm-up.
    pub stop: bool,
}

/// An [`Eat`]'s running state as plain numbers, for callers that keep many of them in
/// flat arrays (the batched kernels in `meridian-kernels`) and step them with
/// [`Eat::from_state`] and [`Eat::state`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct EatState {
    pub ema: f64,
    pub variance: f64,
    /// Samples taken so far (0: the next sample initialises the EMA).
    pub steps: u32,
}

#[derive(Debug, Clone)]
pub struct Eat {
    cfg: EatConfig,
    ema: f64,
    variance: f64,
    steps: u32,
}

impl Eat {
    pub fn new(cfg: EatConfig) -> Self {
        Eat { cfg, ema: 0.0, variance: 0.0, steps: 0 }
    }

    /// Resumes from a saved state; `Eat::from_state(cfg, EatState::default())` equals
    /// `Eat::new(cfg)`.
    pub fn from_state(cfg: EatConfig, state: EatState) -> Self {
        Eat { cfg, ema: state.ema, variance: state.variance, steps: state.steps }
    }

    pub fn state(&self) -> EatState {
        EatState { ema: self.ema, variance: self.variance, steps: self.steps }
    }

    pub fn update(&mut self, x: f64) -> EatReading {
        let a = self.cfg.alpha;
        if self.steps == 0 {
            self.ema = x;
        } else {
            self.ema = a * x + (1.0 - a) * self.ema;
            self.variance = a * (x - self.ema).powi(2) + (1.0 - a) * self.variance;
        }
        self.steps = self.steps.saturating_add(1);
        EatReading {
            ema: self.ema,
            variance: self.variance,
            stop: self.steps > self.cfg.warmup_steps && self.variance < self.cfg.delta,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_worked_updates() {
        let mut e = Eat::new(EatConfig { alpha: 0.5, delta: 0.01, warmup_steps: 2 });
        let r = e.update(2.0);
        assert_eq!((r.ema, r.variance, r.stop), (2.0, 0.0, false));
        // m = .5*1 + .5*2 = 1.5; v = .5 * (1 - 1.5)^2 + 0 = 0.125
        let r = e.update(1.0);
        assert_eq!((r.ema, r.variance), (1.5, 0.125));
        // m = .5*1.5 + .5*1.5 = 1.5; v = .5 * 0 + .5 * .125 = .0625; still warming up? step 3 > 2, .0625 >= .01
        let r = e.update(1.5);
        assert_eq!((r.ema, r.variance, r.stop), (1.5, 0.0625, false));
        // Constant input halves v each step: .03125, .015625, .0078125 -> stop.
        let stops: Vec<bool> = (0..3).map(|_| e.update(1.5).stop).collect();
        assert_eq!(stops, vec![false, false, true]);
    }

    #[test]
    fn never_stops_during_warm_up() {
        let mut e = Eat::new(EatConfig { alpha: 0.2, delta: 1.0, warmup_steps: 4 });
        let stops: Vec<bool> = (0..6).map(|_| e.update(0.3).stop).collect();
        assert_eq!(stops, vec![false, false, false, false, true, true]);
    }
}
