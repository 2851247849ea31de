//! The CPU path: slices in, slices out, always available. Rows (or, for small batches,
//! pieces of rows) are spread over a caller-sized set of scoped threads; each piece is
//! reduced in one pass by the AVX2 path where the CPU has AVX2, FMA and F16C, else by
//! the portable float64 path, and the pieces are merged with
//! `meridian_core::signals::EntropyState::merge`.

#[cfg(target_arch = "x86_64")]
mod avx2;
mod eat;
mod scalar;
mod threads;
mod topk;

use half::{bf16, f16};
use meridian_core::signals::{EntropyBound, EntropyState, entropy_from_top_logprobs};

use crate::dtype::{DType, elements};
use crate::error::{KernelError, Result};

pub(crate) use eat::check_config as check_eat_config;
pub use eat::eat_update;
use topk::TopK;

/// Row-major `[batch, vocab]` logits of one of the supported element types.
#[derive(Debug, Clone, Copy)]
pub enum Logits<'a> {
    F32(&'a [f32]),
    Bf16(&'a [bf16]),
    F16(&'a [f16]),
}

impl<'a> Logits<'a> {
    pub fn len(&self) -> usize {
        match self {
            Logits::F32(s) => s.len(),
            Logits::Bf16(s) => s.len(),
            Logits::F16(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn dtype(&self) -> DType {
        match self {
            Logits::F32(_) => DType::F32,
            Logits::Bf16(_) => DType::Bf16,
            Logits::F16(_) => DType::F16,
        }
    }

    /// Views `len` elements of `dtype` at `ptr`.
    ///
    /// # Safety
    /// `ptr` must be non-null, aligned for `dtype` and valid for reading `len` elements
    /// for `'a`, with no writer in that time.
    pub unsafe fn from_raw(ptr: *const u8, dtype: DType, len: usize) -> Logits<'a> {
        // SAFETY: forwarded to the caller.
        unsafe {
            match dtype {
                DType::F32 => Logits::F32(std::slice::from_raw_parts(ptr as *const f32, len)),
                DType::Bf16 => Logits::Bf16(std::slice::from_raw_parts(ptr as *const bf16, len)),
                DType::F16 => Logits::F16(std::slice::from_raw_parts(ptr as *const f16, len)),
            }
        }
    }

    fn slice(&self, r: std::ops::Range<usize>) -> Logits<'a> {
        match self {
            Logits::F32(s) => Logits::F32(&s[r]),
            Logits::Bf16(s) => Logits::Bf16(&s[r]),
            Logits::F16(s) => Logits::F16(&s[r]),
        }
    }
}

/// How the CPU path runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuOptions {
    /// Worker threads; 0 means one per available core. 1 runs on the calling thread.
    pub threads: usize,
    /// Use the SIMD path where the CPU supports it (false forces the portable path).
    pub simd: bool,
}

impl Default for CpuOptions {
    fn default() -> Self {
        CpuOptions { threads: 0, simd: true }
    }
}

impl CpuOptions {
    pub fn single_thread() -> Self {
        CpuOptions { threads: 1, simd: true }
    }
}

/// Whether this CPU takes the SIMD path (x86_64 with AVX2, FMA and F16C).
pub fn simd_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        avx2::detected()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The temperature as `meridian_core` applies it (floored at 1e-6).
pub(crate) fn effective_temperature(temperature: f32) -> f64 {
    f64::from(temperature).max(1e-6)
}

pub(crate) fn check_temperature(temperature: f32) -> Result<()> {
    if temperature.is_finite() && temperature > 0.0 {
        Ok(())
    } else {
        Err(KernelError::arg(format!("temperature must be finite and positive, got {temperature}")))
    }
}

fn check_logits(logits: &Logits<'_>, batch: usize, vocab: usize) -> Result<()> {
    let n = elements(batch, vocab)?;
    if logits.len() != n {
        return Err(KernelError::shape(format!(
            "{} logits for shape [{batch}, {vocab}] (expected {n})",
            logits.len()
        )));
    }
    Ok(())
}

/// Per-row entropy (nats) of `softmax(logits / temperature)` into `out[batch]`, agreeing
/// with `meridian_core::signals::entropy_from_logits` to 1e-5. `-inf` and NaN entries
/// are skipped; a row with a `+inf` entry, or with no finite entry, gives 0.
pub fn entropy(
    logits: Logits<'_>,
    batch: usize,
    vocab: usize,
    temperature: f32,
    out: &mut [f32],
    opts: &CpuOptions,
) -> Result<()> {
    check_logits(&logits, batch, vocab)?;
    check_temperature(temperature)?;
    if out.len() != batch {
        return Err(KernelError::shape(format!("output holds {} rows, batch is {batch}", out.len())));
    }
    let rows = reduce_rows(&logits, batch, vocab, temperature, 0, opts);
    for (o, (state, _)) in out.iter_mut().zip(rows) {
        *o = state.entropy() as f32;
    }
    Ok(())
}

/// Per-row top-k entropy bound into `out[batch]`: the top `k` logprobs of each row (from
/// the full softmax at `temperature`) through
/// `meridian_core::signals::entropy_from_top_logprobs`, i.e. what the proxy can say from
/// an API's top-k logprobs, with the residual-mass bound. `1 <= k <= MAX_TOP_K`.
pub fn topk_entropy(
    logits: Logits<'_>,
    batch: usize,
    vocab: usize,
    k: usize,
    temperature: f32,
    out: &mut [EntropyBound],
    opts: &CpuOptions,
) -> Result<()> {
    check_logits(&logits, batch, vocab)?;
    check_temperature(temperature)?;
    check_k(k, vocab)?;
    if out.len() != batch {
        return Err(KernelError::shape(format!("output holds {} rows, batch is {batch}", out.len())));
    }
    let t = effective_temperature(temperature);
    let rows = reduce_rows(&logits, batch, vocab, temperature, k, opts);
    for (o, (state, top)) in out.iter_mut().zip(rows) {
        // (x - max) - ln Z rather than x - (max + ln Z): for huge magnitudes (|x| ~ 1e30)
        // the latter cancels every digit of the logprob away.
        let ln_z = state.sum_exp.ln();
        let lps: Vec<f64> = top.values().iter().map(|&v| (f64::from(v) / t - state.max) - ln_z).collect();
        *o = entropy_from_top_logprobs(&lps, vocab);
    }
    Ok(())
}

pub(crate) fn check_k(k: usize, vocab: usize) -> Result<()> {
    if k == 0 || k > crate::MAX_TOP_K || k > vocab {
        return Err(KernelError::arg(format!(
            "k must be in 1..={} and at most vocab ({vocab}), got {k}",
            crate::MAX_TOP_K
        )));
    }
    Ok(())
}

/// One state (and top-k list) per row.
fn reduce_rows(
    logits: &Logits<'_>,
    batch: usize,
    vocab: usize,
    temperature: f32,
    k: usize,
    opts: &CpuOptions,
) -> Vec<(EntropyState, TopK)> {
    let simd = opts.simd && simd_available();
    let threads = threads::resolve(opts.threads);
    let pieces = threads::pieces_per_row(batch, vocab, threads);
    let piece_len = vocab.div_ceil(pieces);
    let parts = threads::map(batch * pieces, threads, |item| {
        let (row, piece) = (item / pieces, item % pieces);
        let start = row * vocab + (piece * piece_len).min(vocab);
        let end = row * vocab + ((piece + 1) * piece_len).min(vocab);
        let mut top = TopK::new(k);
        let state = reduce_segment(&logits.slice(start..end), temperature, &mut top, simd);
        (state, top)
    });
    let mut rows = Vec::with_capacity(batch);
    for chunk in parts.chunks(pieces) {
        let mut state = EntropyState::EMPTY;
        let mut top = TopK::new(k);
        for (s, t) in chunk {
            state = state.merge(*s);
            top.merge(t);
        }
        rows.push((state, top));
    }
    rows
}

fn reduce_segment(seg: &Logits<'_>, temperature: f32, top: &mut TopK, simd: bool) -> EntropyState {
    #[cfg(target_arch = "x86_64")]
    if simd && !seg.is_empty() {
        let topk = top.threshold() != f32::INFINITY;
        // SAFETY: simd implies avx2::detected(); each pointer comes from a live slice of
        // seg.len() elements of the matching type.
        unsafe {
            return match (seg, topk) {
                (Logits::F32(s), false) => {
                    avx2::reduce::<{ avx2::F32 }, false>(s.as_ptr().cast(), s.len(), temperature, top)
                }
                (Logits::F32(s), true) => {
                    avx2::reduce::<{ avx2::F32 }, true>(s.as_ptr().cast(), s.len(), temperature, top)
                }
                (Logits::Bf16(s), false) => {
                    avx2::reduce::<{ avx2::BF16 }, false>(s.as_ptr().cast(), s.len(), temperature, top)
                }
                (Logits::Bf16(s), true) => {
                    avx2::reduce::<{ avx2::BF16 }, true>(s.as_ptr().cast(), s.len(), temperature, top)
                }
                (Logits::F16(s), false) => {
                    avx2::reduce::<{ avx2::F16 }, false>(s.as_ptr().cast(), s.len(), temperature, top)
                }
                (Logits::F16(s), true) => {
                    avx2::reduce::<{ avx2::F16 }, true>(s.as_ptr().cast(), s.len(), temperature, top)
                }
            };
        }
    }
    let _ = simd;
    scalar::reduce(seg, temperature, top)
}
