//! Argument checks and launches of the three kernels.

use std::ffi::c_void;

use cudarc::driver::{result, sys};
use meridian_core::signals::EatConfig;

use super::context::{Entered, cuda_err};
use super::guard;
use super::module::BLOCK;
use crate::dtype::{DType, elements};
use crate::error::{KernelError, Result};
use crate::params::ExpParams;

fn nonnull(ptr: u64, what: &'static str) -> Result<()> {
    if ptr == 0 { Err(KernelError::NullPointer { what }) } else { Ok(()) }
}

fn aligned(ptr: u64, align: u64, what: &'static str) -> Result<()> {
    if ptr % align != 0 {
        return Err(KernelError::arg(format!("{what} {ptr:#x} is not aligned to {align} bytes")));
    }
    Ok(())
}

/// The checks every per-row launch makes before touching the device: pointers set and
/// aligned, a sane shape and temperature; returns the grid (one block per row).
fn check_rows(
    logits: u64,
    dtype: DType,
    batch: usize,
    vocab: usize,
    temperature: f32,
    out: u64,
) -> Result<u32> {
    nonnull(logits, "logits")?;
    nonnull(out, "out")?;
    elements(batch, vocab)?;
    crate::cpu::check_temperature(temperature)?;
    aligned(logits, dtype.size_bytes() as u64, "logits")?;
    aligned(out, 4, "out")?;
    grid_rows(batch)
}

fn grid_rows(batch: usize) -> Result<u32> {
    u32::try_from(batch)
        .ok()
        .filter(|&b| b <= i32::MAX as u32)
        .ok_or_else(|| KernelError::shape(format!("batch {batch} is more rows than one launch takes")))
}

fn kernel_name(op: &str, dtype: DType) -> &'static str {
    match (op, dtype) {
        ("entropy", DType::F32) => "mk_entropy_f32",
        ("entropy", DType::Bf16) => "mk_entropy_bf16",
        ("entropy", DType::F16) => "mk_entropy_f16",
        (_, DType::F32) => "mk_topk_f32",
        (_, DType::Bf16) => "mk_topk_bf16",
        (_, DType::F16) => "mk_topk_f16",
    }
}

/// # Safety
/// `params` must match the kernel's parameter list in kernels.cu, and every pointer
/// argument must be valid for the accesses the kernel makes.
unsafe fn launch(
    entered: &Entered,
    name: &'static str,
    grid: u32,
    block: u32,
    stream: u64,
    params: &mut [*mut c_void],
) -> Result<()> {
    let f = entered.module.function(name)?;
    // SAFETY: forwarded to the caller; stream is the caller's CUstream in this context.
    unsafe { result::launch_kernel(f, (grid, 1, 1), (block, 1, 1), 0, stream as sys::CUstream, params) }
        .map_err(|e| cuda_err("cuLaunchKernel", e))
}

/// Per-row entropy of `softmax(logits / temperature)`: `logits` a device pointer to
/// row-major `[batch, vocab]` elements of `dtype`, `out` a device pointer to `batch`
/// f32, both on the same device; enqueued on `stream` (0: the legacy default stream).
///
/// # Safety
/// `logits` and `out` must be live device allocations of at least those sizes, and
/// `stream` a valid stream of that device's primary context (or 0), for as long as the
/// stream takes to run the kernel.
pub unsafe fn entropy(
    logits: u64,
    dtype: DType,
    batch: usize,
    vocab: usize,
    temperature: f32,
    out: u64,
    stream: u64,
) -> Result<()> {
    let grid = check_rows(logits, dtype, batch, vocab, temperature, out)?;
    guard(|| {
        let entered = Entered::for_pointer(logits, "logits")?;
        let (mut x, mut v, mut p, mut o) = (logits, vocab as i64, ExpParams::new(temperature), out);
        let mut params = [
            (&mut x as *mut u64).cast::<c_void>(),
            (&mut v as *mut i64).cast(),
            (&mut p as *mut ExpParams).cast(),
            (&mut o as *mut u64).cast(),
        ];
        // SAFETY: (const uchar*, long long, Params, float*) as mk_entropy_* declares.
        unsafe { launch(&entered, kernel_name("entropy", dtype), grid, BLOCK, stream, &mut params) }
    })
}

/// Per-row top-k entropy bound: as [`entropy`], with `out` a device pointer to
/// `[batch, 4]` f32 rows of (top_k, lower, upper, residual), the fields of
/// `meridian_core::signals::EntropyBound`. `1 <= k <= MAX_TOP_K`.
///
/// # Safety
/// As [`entropy`], with `out` holding `4 * batch` f32.
#[allow(clippy::too_many_arguments)]
pub unsafe fn topk_entropy(
    logits: u64,
    dtype: DType,
    batch: usize,
    vocab: usize,
    k: usize,
    temperature: f32,
    out: u64,
    stream: u64,
) -> Result<()> {
    let grid = check_rows(logits, dtype, batch, vocab, temperature, out)?;
    crate::cpu::check_k(k, vocab)?;
    guard(|| {
        let entered = Entered::for_pointer(logits, "logits")?;
        let (mut x, mut v, mut p, mut o, mut kk) =
            (logits, vocab as i64, ExpParams::new(temperature), out, k as i32);
        let mut params = [
            (&mut x as *mut u64).cast::<c_void>(),
            (&mut v as *mut i64).cast(),
            (&mut p as *mut ExpParams).cast(),
            (&mut o as *mut u64).cast(),
            (&mut kk as *mut i32).cast(),
        ];
        // SAFETY: (const uchar*, long long, Params, float*, int) as mk_topk_* declares.
        unsafe { launch(&entered, kernel_name("topk", dtype), grid, BLOCK, stream, &mut params) }
    })
}

/// Device pointers for one batched EAT step: samples `x` (f32), optional `active` mask
/// (u8, 0 for "all rows"), state `ema`/`variance` (f64) and `steps` (u32), output `stop`
/// (u8), each `batch` long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EatBuffers {
    pub x: u64,
    pub active: u64,
    pub ema: u64,
    pub variance: u64,
    pub steps: u64,
    pub stop: u64,
}

/// One EAT step for every active row (`meridian_core::signals::Eat::update`, bit for
/// bit), on `stream`.
///
/// # Safety
/// Every non-zero pointer in `b` must be a live device allocation of `batch` elements of
/// its type on one device, and `stream` valid there (or 0).
pub unsafe fn eat_update(cfg: &EatConfig, b: &EatBuffers, batch: usize, stream: u64) -> Result<()> {
    crate::cpu::check_eat_config(cfg)?;
    for (p, what, align) in [
        (b.x, "x", 4),
        (b.ema, "ema", 8),
        (b.variance, "variance", 8),
        (b.steps, "steps", 4),
        (b.stop, "stop", 1),
    ] {
        nonnull(p, what)?;
        aligned(p, align, what)?;
    }
    let n = i32::try_from(batch)
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| KernelError::shape(format!("EAT batch must be in 1..=2^31-1, got {batch}")))?;
    guard(|| {
        let entered = Entered::for_pointer(b.x, "x")?;
        let (mut x, mut a, mut e, mut v, mut s, mut st) = (b.x, b.active, b.ema, b.variance, b.steps, b.stop);
        let (mut nn, mut alpha, mut delta, mut warm) = (n, cfg.alpha, cfg.delta, cfg.warmup_steps);
        let mut params = [
            (&mut x as *mut u64).cast::<c_void>(),
            (&mut a as *mut u64).cast(),
            (&mut e as *mut u64).cast(),
            (&mut v as *mut u64).cast(),
            (&mut s as *mut u64).cast(),
            (&mut st as *mut u64).cast(),
            (&mut nn as *mut i32).cast(),
            (&mut alpha as *mut f64).cast(),
            (&mut delta as *mut f64).cast(),
            (&mut warm as *mut u32).cast(),
        ];
        let grid = (n as u32).div_ceil(256);
        // SAFETY: the parameter list of mk_eat_update.
        unsafe { launch(&entered, "mk_eat_update", grid, 256, stream, &mut params) }
    })
}
