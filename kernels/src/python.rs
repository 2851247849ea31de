//! pyo3 bindings (feature `python`) for the vLLM hook's extension module, which calls
//! [`register`]. Every function takes addresses (`tensor.data_ptr()`), a dtype name, the
//! shape and a raw stream handle (`torch.cuda.current_stream().cuda_stream`), writes into
//! the caller's output tensor and returns None; nothing is copied. The GIL is released
//! while the CPU path runs. Signatures are listed in kernels/README.md.

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use meridian_core::signals::EatConfig;

use crate::cuda::{self, EatBuffers};
use crate::error::KernelError;
use crate::{Device, raw};

pyo3::create_exception!(
    meridian_kernels,
    KernelUnavailableError,
    PyRuntimeError,
    "CUDA cannot run here (no driver, device or NVRTC): use device=\"cpu\"."
);

fn to_py(e: KernelError) -> PyErr {
    match e {
        KernelError::Unavailable { .. } => KernelUnavailableError::new_err(e.to_string()),
        KernelError::Cuda { .. } | KernelError::Internal(_) => PyRuntimeError::new_err(e.to_string()),
        _ => PyValueError::new_err(e.to_string()),
    }
}

/// entropy(data_ptr, dtype, shape, stream, out_ptr, temperature=1.0, device="cuda", threads=0)
#[pyfunction]
#[pyo3(signature = (data_ptr, dtype, shape, stream, out_ptr, temperature = 1.0, device = "cuda", threads = 0))]
#[allow(clippy::too_many_arguments)]
fn entropy(
    py: Python<'_>,
    data_ptr: u64,
    dtype: &str,
    shape: (usize, usize),
    stream: u64,
    out_ptr: u64,
    temperature: f32,
    device: &str,
    threads: usize,
) -> PyResult<()> {
    let (logits, device) = raw::describe(data_ptr, dtype, shape, device).map_err(to_py)?;
    // SAFETY: the caller vouches for the tensors behind these addresses (as with any
    // data_ptr API); shapes and alignment are checked inside.
    py.detach(|| unsafe { raw::entropy(device, logits, temperature, out_ptr, stream, threads) })
        .map_err(to_py)
}

/// topk_entropy(data_ptr, dtype, shape, k, stream, out_ptr, temperature=1.0, device="cuda", threads=0)
#[pyfunction]
#[pyo3(signature = (data_ptr, dtype, shape, k, stream, out_ptr, temperature = 1.0, device = "cuda", threads = 0))]
#[allow(clippy::too_many_arguments)]
fn topk_entropy(
    py: Python<'_>,
    data_ptr: u64,
    dtype: &str,
    shape: (usize, usize),
    k: usize,
    stream: u64,
    out_ptr: u64,
    temperature: f32,
    device: &str,
    threads: usize,
) -> PyResult<()> {
    let (logits, device) = raw::describe(data_ptr, dtype, shape, device).map_err(to_py)?;
    // SAFETY: as in `entropy`.
    py.detach(|| unsafe { raw::topk_entropy(device, logits, k, temperature, out_ptr, stream, threads) })
        .map_err(to_py)
}

/// eat_update(x_ptr, active_ptr, ema_ptr, variance_ptr, steps_ptr, stop_ptr, batch, alpha, delta, warmup_steps, stream, device="cuda")
#[pyfunction]
#[pyo3(signature = (x_ptr, active_ptr, ema_ptr, variance_ptr, steps_ptr, stop_ptr, batch, alpha, delta, warmup_steps, stream, device = "cuda"))]
#[allow(clippy::too_many_arguments)]
fn eat_update(
    py: Python<'_>,
    x_ptr: u64,
    active_ptr: u64,
    ema_ptr: u64,
    variance_ptr: u64,
    steps_ptr: u64,
    stop_ptr: u64,
    batch: usize,
    alpha: f64,
    delta: f64,
    warmup_steps: u32,
    stream: u64,
    device: &str,
) -> PyResult<()> {
    let device = Device::parse(device).map_err(to_py)?;
    let cfg = EatConfig { alpha, delta, warmup_steps };
    let b = EatBuffers {
        x: x_ptr,
        active: active_ptr,
        ema: ema_ptr,
        variance: variance_ptr,
        steps: steps_ptr,
        stop: stop_ptr,
    };
    // SAFETY: as in `entropy`.
    py.detach(|| unsafe { raw::eat_update(device, &cfg, &b, batch, stream) }).map_err(to_py)
}

/// cuda_unavailable_reason() -> str | None: None when the CUDA path can run.
#[pyfunction]
fn cuda_unavailable_reason() -> Option<String> {
    cuda::probe().err().map(|e| e.to_string())
}

/// abi_version() -> int: the C ABI version this build implements.
#[pyfunction]
fn abi_version() -> u32 {
    crate::ffi::ABI_VERSION
}

/// Adds the kernels' functions and `KernelUnavailableError` to `m`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(entropy, m)?)?;
    m.add_function(wrap_pyfunction!(topk_entropy, m)?)?;
    m.add_function(wrap_pyfunction!(eat_update, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_unavailable_reason, m)?)?;
    m.add_function(wrap_pyfunction!(abi_version, m)?)?;
    m.add("KernelUnavailableError", m.py().get_type::<KernelUnavailableError>())?;
    m.add("MAX_TOP_K", crate::MAX_TOP_K)?;
    Ok(())
}
