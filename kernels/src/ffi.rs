//! The C ABI: `meridian_kernels_*` functions declared in `include/meridian_kernels.h`.
//! Every call returns a status (0 ok, else a negative `KernelError::code`); the message
//! of the calling thread's last failure is `meridian_kernels_last_error()`. Panics never
//! cross the boundary.

use std::cell::RefCell;
use std::ffi::{CString, c_char};

use meridian_core::signals::EatConfig;

use crate::cuda::EatBuffers;
use crate::error::{KernelError, Result};
use crate::raw::{self, RawLogits};
use crate::{DType, Device};

/// Bumped on any incompatible change to these signatures.
pub const ABI_VERSION: u32 = 1;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn status(f: impl FnOnce() -> Result<()>) -> i32 {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|_| Err(KernelError::Internal("panic inside meridian-kernels".into())));
    match r {
        Ok(()) => {
            LAST_ERROR.with(|e| *e.borrow_mut() = CString::default());
            0
        }
        Err(e) => {
            let msg = CString::new(e.to_string().replace('\0', " ")).unwrap_or_default();
            LAST_ERROR.with(|slot| *slot.borrow_mut() = msg);
            e.code()
        }
    }
}

fn device(code: i32) -> Result<Device> {
    match code {
        0 => Ok(Device::Cpu),
        1 => Ok(Device::Cuda),
        other => Err(KernelError::arg(format!("device code {other} (0 cpu, 1 cuda)"))),
    }
}

/// The ABI version this library implements (`MERIDIAN_KERNELS_ABI_VERSION`).
#[unsafe(no_mangle)]
pub extern "C" fn meridian_kernels_abi_version() -> u32 {
    ABI_VERSION
}

/// The calling thread's last error message ("" after a success). Valid until the next
/// call on this thread; never null.
#[unsafe(no_mangle)]
pub extern "C" fn meridian_kernels_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// 1 if the CUDA path can run here, else 0 (and the reason in last_error).
#[unsafe(no_mangle)]
pub extern "C" fn meridian_kernels_cuda_available() -> i32 {
    i32::from(status(|| crate::cuda::probe().map(|_| ())) == 0)
}

/// Per-row entropy of softmax(logits / temperature): `logits` [batch, vocab] of `dtype`
/// (0 f32, 1 bf16, 2 f16), `out` batch f32, on `device` (0 cpu, 1 cuda); `stream` is a
/// CUstream (cuda), `threads` the CPU worker count (0: all cores).
///
/// # Safety
/// The pointers must be valid for those sizes on that device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn meridian_kernels_entropy(
    logits: *const std::ffi::c_void,
    dtype: i32,
    batch: usize,
    vocab: usize,
    temperature: f32,
    out: *mut f32,
    device_code: i32,
    stream: u64,
    threads: u32,
) -> i32 {
    status(|| {
        let l = RawLogits { ptr: logits as u64, dtype: DType::from_code(dtype)?, batch, vocab };
        // SAFETY: forwarded to the caller.
        unsafe { raw::entropy(device(device_code)?, l, temperature, out as u64, stream, threads as usize) }
    })
}

/// Per-row top-k entropy bound: `out` [batch, 4] f32 (top_k, lower, upper, residual);
/// 1 <= k <= 32. Other arguments as meridian_kernels_entropy.
///
/// # Safety
/// As meridian_kernels_entropy, with `out` holding 4 * batch f32.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn meridian_kernels_topk_entropy(
    logits: *const std::ffi::c_void,
    dtype: i32,
    batch: usize,
    vocab: usize,
    k: u32,
    temperature: f32,
    out: *mut f32,
    device_code: i32,
    stream: u64,
    threads: u32,
) -> i32 {
    status(|| {
        let l = RawLogits { ptr: logits as u64, dtype: DType::from_code(dtype)?, batch, vocab };
        // SAFETY: forwarded to the caller.
        unsafe {
            raw::topk_entropy(
                device(device_code)?,
                l,
                k as usize,
                temperature,
                out as u64,
                stream,
                threads as usize,
            )
        }
    })
}

/// One EAT step per active row (`active` may be null: all rows): samples `x` (f32),
/// state `ema`, `variance` (f64) and `steps` (u32) updated in place, `stop` (u8) set to
/// 1 when the EMA variance has settled below `delta` after `warmup_steps` samples.
///
/// # Safety
/// Every non-null pointer must hold `batch` elements of its type on that device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn meridian_kernels_eat_update(
    x: *const f32,
    active: *const u8,
    ema: *mut f64,
    variance: *mut f64,
    steps: *mut u32,
    stop: *mut u8,
    batch: usize,
    alpha: f64,
    delta: f64,
    warmup_steps: u32,
    device_code: i32,
    stream: u64,
) -> i32 {
    status(|| {
        let cfg = EatConfig { alpha, delta, warmup_steps };
        let b = EatBuffers {
            x: x as u64,
            active: active as u64,
            ema: ema as u64,
            variance: variance as u64,
            steps: steps as u64,
            stop: stop as u64,
        };
        // SAFETY: forwarded to the caller.
        unsafe { raw::eat_update(device(device_code)?, &cfg, &b, batch, stream) }
    })
}
