//! Pointer-level entry points that pick the device: the one place the C ABI ([`crate::ffi`])
//! and the pyo3 bindings (`crate::python`) call. Pointers are addresses (`u64`): host
//! memory for [`Device::Cpu`], device memory for [`Device::Cuda`]; `stream` is a raw
//! `CUstream` (ignored on the CPU) and `threads` sizes the CPU path (ignored on CUDA).

use meridian_core::signals::{EatConfig, EntropyBound};

use crate::Device;
use crate::cpu::{self, CpuOptions, Logits};
use crate::cuda::{self, EatBuffers};
use crate::dtype::{DType, elements};
use crate::error::{KernelError, Result};

/// Row-major `[batch, vocab]` logits at an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawLogits {
    pub ptr: u64,
    pub dtype: DType,
    pub batch: usize,
    pub vocab: usize,
}

fn host_ptr<T>(addr: u64, what: &'static str) -> Result<*mut T> {
    if addr == 0 {
        return Err(KernelError::NullPointer { what });
    }
    if addr % std::mem::align_of::<T>() as u64 != 0 {
        return Err(KernelError::arg(format!("{what} {addr:#x} is not aligned for its element type")));
    }
    usize::try_from(addr)
        .map(|a| a as *mut T)
        .map_err(|_| KernelError::arg(format!("{what} {addr:#x} is not a host address")))
}

/// # Safety
/// For the CPU: `l.ptr` must point to `batch * vocab` readable elements of `l.dtype`.
unsafe fn host_logits<'a>(l: &RawLogits) -> Result<Logits<'a>> {
    let n = elements(l.batch, l.vocab)?;
    let p: *const u8 = match l.dtype {
        DType::F32 => host_ptr::<f32>(l.ptr, "logits")?.cast_const().cast(),
        DType::Bf16 | DType::F16 => host_ptr::<u16>(l.ptr, "logits")?.cast_const().cast(),
    };
    // SAFETY: non-null and aligned (checked); extent forwarded to the caller.
    Ok(unsafe { Logits::from_raw(p, l.dtype, n) })
}

/// Per-row entropy into `out` (`batch` f32).
///
/// # Safety
/// The pointers must be valid for the sizes the shape implies, on `device`; for CUDA see
/// [`cuda::entropy`].
pub unsafe fn entropy(
    device: Device,
    logits: RawLogits,
    temperature: f32,
    out: u64,
    stream: u64,
    threads: usize,
) -> Result<()> {
    match device {
        // SAFETY: forwarded.
        Device::Cuda => unsafe {
            cuda::entropy(logits.ptr, logits.dtype, logits.batch, logits.vocab, temperature, out, stream)
        },
        Device::Cpu => {
            // SAFETY: forwarded.
            let x = unsafe { host_logits(&logits)? };
            let o = host_ptr::<f32>(out, "out")?;
            // SAFETY: the caller provides `batch` writable f32 at out.
            let o = unsafe { std::slice::from_raw_parts_mut(o, logits.batch) };
            cpu::entropy(x, logits.batch, logits.vocab, temperature, o, &CpuOptions { threads, simd: true })
        }
    }
}

/// Per-row top-k entropy bound into `out` (`[batch, 4]` f32: top_k, lower, upper,
/// residual).
///
/// # Safety
/// As [`entropy`], with `out` holding `4 * batch` f32.
pub unsafe fn topk_entropy(
    device: Device,
    logits: RawLogits,
    k: usize,
    temperature: f32,
    out: u64,
    stream: u64,
    threads: usize,
) -> Result<()> {
    match device {
        // SAFETY: forwarded.
        Device::Cuda => unsafe {
            cuda::topk_entropy(
                logits.ptr,
                logits.dtype,
                logits.batch,
                logits.vocab,
                k,
                temperature,
                out,
                stream,
            )
        },
        Device::Cpu => {
            // SAFETY: forwarded.
            let x = unsafe { host_logits(&logits)? };
            let o = host_ptr::<f32>(out, "out")?;
            let n4 = logits.batch.checked_mul(4).ok_or_else(|| KernelError::shape("batch overflows"))?;
            let mut bounds =
                vec![EntropyBound { top_k: 0.0, lower: 0.0, upper: 0.0, residual: 0.0 }; logits.batch];
            cpu::topk_entropy(
                x,
                logits.batch,
                logits.vocab,
                k,
                temperature,
                &mut bounds,
                &CpuOptions { threads, simd: true },
            )?;
            // SAFETY: the caller provides 4 * batch writable f32 at out.
            let o = unsafe { std::slice::from_raw_parts_mut(o, n4) };
            for (row, b) in o.chunks_exact_mut(4).zip(&bounds) {
                row.copy_from_slice(&[b.top_k as f32, b.lower as f32, b.upper as f32, b.residual as f32]);
            }
            Ok(())
        }
    }
}

/// One batched EAT step (see [`cpu::eat_update`]); `b.active` may be 0 (all rows).
///
/// # Safety
/// Every non-zero pointer in `b` must hold `batch` elements of its type on `device`.
pub unsafe fn eat_update(
    device: Device,
    cfg: &EatConfig,
    b: &EatBuffers,
    batch: usize,
    stream: u64,
) -> Result<()> {
    match device {
        // SAFETY: forwarded.
        Device::Cuda => unsafe { cuda::eat_update(cfg, b, batch, stream) },
        Device::Cpu => {
            if batch == 0 {
                return Err(KernelError::shape("EAT batch must be positive"));
            }
            let x = host_ptr::<f32>(b.x, "x")?;
            let ema = host_ptr::<f64>(b.ema, "ema")?;
            let var = host_ptr::<f64>(b.variance, "variance")?;
            let steps = host_ptr::<u32>(b.steps, "steps")?;
            let stop = host_ptr::<u8>(b.stop, "stop")?;
            // SAFETY: non-null, aligned (checked), `batch` elements each (the caller).
            unsafe {
                let active = if b.active == 0 {
                    None
                } else {
                    Some(std::slice::from_raw_parts(host_ptr::<u8>(b.active, "active")?.cast_const(), batch))
                };
                cpu::eat_update(
                    cfg,
                    std::slice::from_raw_parts(x.cast_const(), batch),
                    active,
                    std::slice::from_raw_parts_mut(ema, batch),
                    std::slice::from_raw_parts_mut(var, batch),
                    std::slice::from_raw_parts_mut(steps, batch),
                    std::slice::from_raw_parts_mut(stop, batch),
                )
            }
        }
    }
}

/// Validates the Python-facing description of a logits tensor: `dtype` by name,
/// `shape` `(batch, vocab)`, `device` `"cpu"`/`"cuda"`. Kept here (not in the
/// feature-gated bindings) so it is unit-tested without a Python interpreter.
pub fn describe(ptr: u64, dtype: &str, shape: (usize, usize), device: &str) -> Result<(RawLogits, Device)> {
    let dtype = DType::parse(dtype)?;
    let device = Device::parse(device)?;
    let (batch, vocab) = shape;
    elements(batch, vocab)?;
    if ptr == 0 {
        return Err(KernelError::NullPointer { what: "data_ptr" });
    }
    Ok((RawLogits { ptr, dtype, batch, vocab }, device))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describe_checks_every_field() {
        let (l, d) = describe(64, "torch.bfloat16", (2, 8), "cuda:0").expect("valid");
        assert_eq!((l.dtype, l.batch, l.vocab, d), (DType::Bf16, 2, 8, Device::Cuda));
        assert_eq!(describe(64, "float32", (1, 1), "cpu").map(|x| x.1), Ok(Device::Cpu));
        assert!(matches!(describe(64, "int8", (2, 8), "cpu"), Err(KernelError::DType(_))));
        assert!(matches!(describe(64, "fp16", (0, 8), "cpu"), Err(KernelError::Shape(_))));
        assert!(matches!(describe(64, "fp16", (2, 8), "tpu"), Err(KernelError::Argument(_))));
        assert!(matches!(describe(0, "fp16", (2, 8), "cpu"), Err(KernelError::NullPointer { .. })));
    }
}
