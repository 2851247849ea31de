//! The constants of the vectorised exp that the AVX2 path and the CUDA kernels share, so
//! both make the same approximations.

/// A lane's (or thread's) reference moves only when a value exceeds it by more than this
/// many nats, so slowly rising rows rarely rescale; exp((x - m)/T) stays below e^8.
pub(crate) const SLACK_NATS: f64 = 8.0;
/// Below 2^T_MIN relative to the reference, a term counts as 2^T_MIN (so `-inf` and NaN
/// entries add about 1e-38 each, far below anything a sum holding the row's maximum can
/// resolve).
pub(crate) const T_MIN: f64 = -125.0;

/// exp(d / T) = 2^(d * c) with c = log2(e) / T = c_hi + c_lo (f32 head and tail), d
/// clamped below at `dmin`; `slack` is SLACK_NATS in logit units; `inv_t` = 1 / T.
/// `#[repr(C)]`: passed by value to the CUDA kernels (`struct Params` in kernels.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ExpParams {
    pub c_hi: f32,
    pub c_lo: f32,
    pub dmin: f32,
    pub slack: f32,
    pub inv_t: f64,
}

impl ExpParams {
    /// For a validated temperature (floored at 1e-6 like `meridian_core`).
    pub(crate) fn new(temperature: f32) -> ExpParams {
        let t = crate::cpu::effective_temperature(temperature);
        let c = std::f64::consts::LOG2_E / t;
        let c_hi = c as f32;
        ExpParams {
            c_hi,
            c_lo: (c - f64::from(c_hi)) as f32,
            dmin: (T_MIN / c) as f32,
            slack: (SLACK_NATS * t) as f32,
            inv_t: 1.0 / t,
        }
    }
}
