//! `meridian-kernels`: the per-step entropy work of Meridian's engine hook, batched.
//!
//! Every decode step the hook wants, for each running request, the Shannon entropy of the
//! next-token distribution over the full vocabulary (for Qwen3 and a batch of 256, 155 MB
//! of fp32 logits), sometimes the top-k view of it with the residual-mass bound that the
//! proxy sees through the API, and an EAT (EMA / EMA-variance) update. This crate does
//! that work in one read of the logits, on the GPU where the logits already are (CUDA
//! loaded at run time, launched on the caller's stream, writing to the caller's buffer,
//! no copies) or on the CPU (AVX2 and threads, checked against a float64 reference). The
//! definitions are `meridian_core::signals`'; this crate only makes them fast.
//!
//! - [`cpu`]: slices in, slices out; always available.
//! - [`cuda`]: raw device pointers and a raw `CUstream`; [`KernelError::Unavailable`]
//!   where CUDA cannot be loaded or there is no device.
//! - [`raw`]: one pointer-level entry per operation that picks the device; the C ABI
//!   ([`ffi`], header `include/meridian_kernels.h`) and the pyo3 bindings (`python`,
//!   feature `python`) are thin wrappers over it.

pub mod cpu;
pub mod cuda;
pub mod dtype;
pub mod error;
pub mod ffi;
mod params;
#[cfg(feature = "python")]
pub mod python;
pub mod raw;

pub use dtype::DType;
pub use error::{KernelError, Result};
pub use meridian_core::signals::{EatConfig, EatReading, EatState, EntropyBound, EntropyState};

/// Largest k the top-k entropy accepts (vLLM's `--max-logprobs` defaults to 20).
pub const MAX_TOP_K: usize = 32;

/// Where a pointer-level call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda,
}

impl Device {
    /// `"cpu"` or `"cuda"` (also `"cuda:N"`: the device is the one owning the pointers).
    pub fn parse(name: &str) -> Result<Device> {
        let n = name.trim().to_ascii_lowercase();
        if n == "cpu" {
            Ok(Device::Cpu)
        } else if n == "cuda" || n.strip_prefix("cuda:").is_some_and(|i| i.parse::<u32>().is_ok()) {
            Ok(Device::Cuda)
        } else {
            Err(KernelError::Argument(format!("device {name:?} (expected \"cpu\" or \"cuda\")")))
        }
    }
}
