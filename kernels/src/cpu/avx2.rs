//! The x86_64 SIMD path (AVX2 + FMA, F16C for float16): the one-pass online reduction in
//! 8 f32 lanes, with a vectorised exp.
//!
//! Each lane keeps its own reference m (a running maximum with slack: it moves only when
//! a value exceeds it by more than 8 nats, so rising rows rarely rescale) and sums
//! e = exp((x - m)/T) and e * (x - m). Accuracy, against the float64 definition in
//! `meridian_core::signals::entropy_from_logits`:
//!
//! - exp: 2^t with t = (x - m) * log2(e)/T, the constant split into an f32 head and tail
//!   so no temperature rounding creeps in; n = round(t), r = t - n via FMA, 2^r by its
//!   degree-7 Taylor polynomial (relative error < 6e-9 on |r| <= 1/2), scaled by 2^n.
//!   Values more than 125 binary orders below the lane's reference count as 2^-125 (so
//!   `-inf` and NaN entries add nothing measurable).
//! - sums: f32 lane partials over at most 8 terms each, then flushed into float64
//!   accumulators, so the relative error of each sum stays below 8 f32 ulps however long
//!   the row; lanes are combined with `EntropyState::merge` in float64.
//!
//! The entropy H = log Z - S/Z is a sum of two non-negative terms, so these relative
//! errors become absolute errors of the same order (times at most H + 8): well inside
//! 1e-5, which the property tests check.

use std::arch::x86_64::*;

use meridian_core::signals::EntropyState;

use super::topk::TopK;
use crate::params::ExpParams;

pub(crate) const F32: u8 = 0;
pub(crate) const BF16: u8 = 1;
pub(crate) const F16: u8 = 2;

const GROUPS: usize = 2;
const FLUSH_EVERY: usize = 8;
/// (ln 2)^k / k!, k = 0..=7.
const POLY: [f32; 8] = [
    1.0,
    std::f32::consts::LN_2,
    0.240_226_5,
    0.055_504_11,
    0.009_618_129,
    0.001_333_355_8,
    0.000_154_035_3,
    0.000_015_252_734,
];

pub(crate) fn detected() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
}

#[derive(Clone, Copy)]
struct Consts {
    c_hi: __m256,
    c_lo: __m256,
    dmin: __m256,
    slack: __m256,
    inv_t: f64,
}

#[derive(Clone, Copy)]
struct Lanes {
    m: __m256,
    mth: __m256,
    z: __m256,
    s: __m256,
    z_lo: __m256d,
    z_hi: __m256d,
    s_lo: __m256d,
    s_hi: __m256d,
}

#[target_feature(enable = "avx2,fma,f16c")]
fn lanes_new() -> Lanes {
    let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
    let (zs, zd) = (_mm256_setzero_ps(), _mm256_setzero_pd());
    Lanes { m: ninf, mth: ninf, z: zs, s: zs, z_lo: zd, z_hi: zd, s_lo: zd, s_hi: zd }
}

/// Reduces `n` elements of type `DT` at `ptr` into a float64 entropy state (over
/// x = logit / T), offering every value to `top` when `TOPK`.
///
/// # Safety
/// `detected()` must be true, and `ptr` must be valid for reading `n` elements of `DT`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn reduce<const DT: u8, const TOPK: bool>(
    ptr: *const u8,
    n: usize,
    temperature: f32,
    top: &mut TopK,
) -> EntropyState {
    let t = super::effective_temperature(temperature);
    let p = ExpParams::new(temperature);
    let k = Consts {
        c_hi: _mm256_set1_ps(p.c_hi),
        c_lo: _mm256_set1_ps(p.c_lo),
        dmin: _mm256_set1_ps(p.dmin),
        slack: _mm256_set1_ps(p.slack),
        inv_t: p.inv_t,
    };
    let esz = if DT == F32 { 4 } else { 2 };
    let mut lanes = [lanes_new(); GROUPS];
    let mut thr = _mm256_set1_ps(top.threshold());
    let per_iter = GROUPS * 8;
    let iters = n / per_iter;
    let mut i = 0;
    while i < iters {
        let end = (i + FLUSH_EVERY).min(iters);
        for it in i..end {
            for (g, l) in lanes.iter_mut().enumerate() {
                // SAFETY: it * per_iter + g * 8 + 8 <= iters * per_iter <= n.
                let x = unsafe { load8::<DT>(ptr.add((it * per_iter + g * 8) * esz)) };
                step::<TOPK>(l, x, &k, top, &mut thr);
            }
        }
        lanes.iter_mut().for_each(|l| flush(l));
        i = end;
    }
    let mut j = iters * per_iter;
    while j < n {
        let cnt = (n - j).min(8);
        let mut buf = [f32::NEG_INFINITY; 8];
        for (q, b) in buf.iter_mut().take(cnt).enumerate() {
            // SAFETY: j + q < n.
            *b = unsafe { load1::<DT>(ptr, j + q) };
        }
        // SAFETY: buf holds 8 f32.
        let x = unsafe { _mm256_loadu_ps(buf.as_ptr()) };
        step::<TOPK>(&mut lanes[0], x, &k, top, &mut thr);
        j += cnt;
    }
    flush(&mut lanes[0]);
    finish(&lanes, t)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load8<const DT: u8>(p: *const u8) -> __m256 {
    // SAFETY (all arms): the caller guarantees 8 readable elements at p.
    unsafe {
        match DT {
            F32 => _mm256_loadu_ps(p as *const f32),
            BF16 => {
                let h = _mm_loadu_si128(p as *const __m128i);
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
            }
            _ => _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
        }
    }
}

unsafe fn load1<const DT: u8>(p: *const u8, i: usize) -> f32 {
    // SAFETY: the caller guarantees element i is readable.
    unsafe {
        match DT {
            F32 => (p as *const f32).add(i).read_unaligned(),
            BF16 => half::bf16::from_bits((p as *const u16).add(i).read_unaligned()).to_f32(),
            _ => half::f16::from_bits((p as *const u16).add(i).read_unaligned()).to_f32(),
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn step<const TOPK: bool>(l: &mut Lanes, x: __m256, k: &Consts, top: &mut TopK, thr: &mut __m256) {
    // Ordered compares are false for NaN, so NaN never moves a reference or enters top-k.
    let grow = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GT_OQ>(x, l.mth));
    if grow != 0 {
        rescale(l, x, grow, k);
    }
    if TOPK {
        let enter = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GT_OQ>(x, *thr));
        if enter != 0 {
            offer_lanes(top, x, enter);
            *thr = _mm256_set1_ps(top.threshold());
        }
    }
    // max_ps returns its second operand when the first is NaN: NaN and -inf become dmin.
    let d = _mm256_max_ps(_mm256_sub_ps(x, l.m), k.dmin);
    let e = exp_scaled(d, k);
    l.z = _mm256_add_ps(l.z, e);
    l.s = _mm256_fmadd_ps(e, d, l.s);
}

/// exp(d / T) for d in [dmin, slack]: 2^(d * c), c = log2(e)/T = c_hi + c_lo.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn exp_scaled(d: __m256, k: &Consts) -> __m256 {
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(d, k.c_hi));
    let r = _mm256_fmadd_ps(d, k.c_lo, _mm256_fmsub_ps(d, k.c_hi, n));
    let mut p = _mm256_set1_ps(POLY[7]);
    for &c in POLY[..7].iter().rev() {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)));
    _mm256_mul_ps(p, _mm256_castsi256_ps(bits))
}

/// Adds the f32 partials into the float64 accumulators and clears them.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn flush(l: &mut Lanes) {
    l.z_lo = _mm256_add_pd(l.z_lo, _mm256_cvtps_pd(_mm256_castps256_ps128(l.z)));
    l.z_hi = _mm256_add_pd(l.z_hi, _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(l.z)));
    l.s_lo = _mm256_add_pd(l.s_lo, _mm256_cvtps_pd(_mm256_castps256_ps128(l.s)));
    l.s_hi = _mm256_add_pd(l.s_hi, _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(l.s)));
    l.z = _mm256_setzero_ps();
    l.s = _mm256_setzero_ps();
}

struct LaneArrays {
    m: [f32; 8],
    z: [f64; 8],
    s: [f64; 8],
}

#[target_feature(enable = "avx2,fma,f16c")]
fn to_arrays(l: &Lanes) -> LaneArrays {
    let mut a = LaneArrays { m: [0.0; 8], z: [0.0; 8], s: [0.0; 8] };
    // SAFETY: each store writes 8 (or 4) elements into arrays of that many.
    unsafe {
        _mm256_storeu_ps(a.m.as_mut_ptr(), l.m);
        _mm256_storeu_pd(a.z.as_mut_ptr(), l.z_lo);
        _mm256_storeu_pd(a.z.as_mut_ptr().add(4), l.z_hi);
        _mm256_storeu_pd(a.s.as_mut_ptr(), l.s_lo);
        _mm256_storeu_pd(a.s.as_mut_ptr().add(4), l.s_hi);
    }
    a
}

/// Moves the references of the lanes in `mask` up to their new values `x`, rescaling
/// their float64 sums exactly (float64 exp): rare after a row's first few vectors.
#[cold]
#[inline(never)]
#[target_feature(enable = "avx2,fma,f16c")]
fn rescale(l: &mut Lanes, x: __m256, mask: i32, k: &Consts) {
    flush(l);
    let mut a = to_arrays(l);
    let mut xs = [0f32; 8];
    // SAFETY: 8 f32 into an array of 8.
    unsafe { _mm256_storeu_ps(xs.as_mut_ptr(), x) };
    for i in (0..8).filter(|i| mask & (1 << i) != 0) {
        if a.m[i] == f32::NEG_INFINITY {
            // Only dmin stand-ins were summed under a -inf reference.
            (a.z[i], a.s[i]) = (0.0, 0.0);
        } else {
            let shift = f64::from(a.m[i]) - f64::from(xs[i]);
            let scale = (shift * k.inv_t).exp();
            a.s[i] = scale * (a.s[i] + shift * a.z[i]);
            a.z[i] *= scale;
        }
        a.m[i] = xs[i];
    }
    // SAFETY: loads of 8 (or 4) elements from arrays of that many.
    unsafe {
        l.m = _mm256_loadu_ps(a.m.as_ptr());
        l.z_lo = _mm256_loadu_pd(a.z.as_ptr());
        l.z_hi = _mm256_loadu_pd(a.z.as_ptr().add(4));
        l.s_lo = _mm256_loadu_pd(a.s.as_ptr());
        l.s_hi = _mm256_loadu_pd(a.s.as_ptr().add(4));
    }
    l.mth = _mm256_add_ps(l.m, k.slack);
}

#[cold]
#[inline(never)]
#[target_feature(enable = "avx2,fma,f16c")]
fn offer_lanes(top: &mut TopK, x: __m256, mask: i32) {
    let mut xs = [0f32; 8];
    // SAFETY: 8 f32 into an array of 8.
    unsafe { _mm256_storeu_ps(xs.as_mut_ptr(), x) };
    (0..8).filter(|i| mask & (1 << i) != 0).for_each(|i| top.offer(xs[i]));
}

/// Combines every lane into one float64 state over x = logit / t.
#[target_feature(enable = "avx2,fma,f16c")]
fn finish(lanes: &[Lanes; GROUPS], t: f64) -> EntropyState {
    let mut state = EntropyState::EMPTY;
    for l in lanes {
        let a = to_arrays(l);
        for i in 0..8 {
            if a.m[i] == f32::INFINITY {
                // A +inf logit: degenerate, as in meridian-core (entropy 0).
                return EntropyState { max: f64::INFINITY, sum_exp: f64::NAN, sum_exp_dev: f64::NAN };
            }
            if a.m[i] == f32::NEG_INFINITY {
                continue;
            }
            let lane = EntropyState { max: f64::from(a.m[i]) / t, sum_exp: a.z[i], sum_exp_dev: a.s[i] / t };
            state = state.merge(lane);
        }
    }
    state
}
