//! The CUDA path: kernels compiled at run time with NVRTC and launched on the caller's
//! device pointers and `CUstream`, writing to the caller's output buffer; nothing is
//! copied or allocated and nothing synchronises (results are ready when the stream
//! reaches them).
//!
//! CUDA is loaded with `dlopen` (cudarc's dynamic loading): the crate builds and runs on
//! machines without it, where every call returns [`KernelError::Unavailable`] with the
//! reason, and the caller takes the CPU path. Launches use the primary context of the
//! device that owns the logits (the context PyTorch and vLLM use).
//!
//! [`KernelError::Unavailable`]: crate::KernelError::Unavailable

mod context;
mod launch;
mod module;

pub use context::DeviceInfo;
pub use launch::{EatBuffers, eat_update, entropy, topk_entropy};
pub use module::{KERNELS, compile_only};

use crate::error::{KernelError, Result};

/// Device 0's description if CUDA can run here, else `Unavailable` with the reason
/// (no driver library, cuInit failure, no device). Does not compile the kernels.
pub fn probe() -> Result<DeviceInfo> {
    guard(|| {
        context::driver()?;
        context::device_info(0)
    })
}

/// Whether CUDA can run here (see [`probe`]).
pub fn available() -> bool {
    probe().is_ok()
}

/// Runs `f`, turning a panic inside cudarc (it panics when a driver symbol is missing)
/// into an error instead of unwinding into the caller (or across the C ABI).
pub(crate) fn guard<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "unknown panic".to_owned());
        Err(KernelError::unavailable(format!("the CUDA libraries failed to load: {msg}")))
    })
}
