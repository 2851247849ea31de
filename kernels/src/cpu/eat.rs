//! The batched EAT update: one `meridian_core::signals::Eat` step per active row, with
//! the state kept in flat arrays (the layout the CUDA kernel and the C ABI use).

use meridian_core::signals::{Eat, EatConfig, EatState};

use crate::error::{KernelError, Result};

/// Checks EAT parameters the way the kernels need them: 0 < alpha <= 1, delta >= 0.
pub(crate) fn check_config(cfg: &EatConfig) -> Result<()> {
    let ok = cfg.alpha > 0.0 && cfg.alpha <= 1.0 && cfg.delta >= 0.0 && cfg.delta.is_finite();
    if !ok {
        return Err(KernelError::arg(format!(
            "EAT needs 0 < alpha <= 1 and a finite delta >= 0, got alpha {} delta {}",
            cfg.alpha, cfg.delta
        )));
    }
    Ok(())
}

/// For every row i with `active[i] != 0` (all rows when `active` is `None`): feeds the
/// sample `x[i]` to row i's EAT (state `ema[i]`, `variance[i]`, `steps[i]`), writes the
/// new state back and `stop[i]` (1 when the variance has settled below delta after the
/// warm-up). Inactive rows keep their state and their `stop` entry untouched.
pub fn eat_update(
    cfg: &EatConfig,
    x: &[f32],
    active: Option<&[u8]>,
    ema: &mut [f64],
    variance: &mut [f64],
    steps: &mut [u32],
    stop: &mut [u8],
) -> Result<()> {
    check_config(cfg)?;
    let n = x.len();
    let lens = [ema.len(), variance.len(), steps.len(), stop.len(), active.map_or(n, <[u8]>::len)];
    if n == 0 || lens.iter().any(|&l| l != n) {
        return Err(KernelError::shape(format!(
            "EAT arrays must all hold batch > 0 rows: x {n}, ema/variance/steps/stop/active {lens:?}"
        )));
    }
    for i in 0..n {
        if active.is_some_and(|a| a[i] == 0) {
            continue;
        }
        let mut eat = Eat::from_state(*cfg, EatState { ema: ema[i], variance: variance[i], steps: steps[i] });
        let reading = eat.update(f64::from(x[i]));
        let s = eat.state();
        (ema[i], variance[i], steps[i]) = (s.ema, s.variance, s.steps);
        stop[i] = u8::from(reading.stop);
    }
    Ok(())
}
