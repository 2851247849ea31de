//! Finding CUDA at run time: the driver library, a device, the primary context of the
//! device that owns a pointer, and that device's compiled module (built once per device
//! and cached for the life of the process).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{result, sys};

use super::module::{self, Module};
use crate::error::{KernelError, Result};

/// Loads libcuda and runs cuInit, once; the outcome (or the reason it failed) is kept.
pub(crate) fn driver() -> Result<()> {
    static READY: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    READY
        .get_or_init(|| {
            // SAFETY: only tries to dlopen the library.
            if !unsafe { sys::is_culib_present() } {
                return Err(
                    "the CUDA driver library (libcuda.so) was not found: no NVIDIA driver here".into()
                );
            }
            result::init().map_err(|e| format!("cuInit failed: {e}"))?;
            match result::device::get_count() {
                Ok(0) => Err("the CUDA driver reports no device".into()),
                Ok(_) => Ok(()),
                Err(e) => Err(format!("cuDeviceGetCount failed: {e}")),
            }
        })
        .clone()
        .map_err(KernelError::unavailable)
}

/// What a device is, for reports and benchmarks.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceInfo {
    pub ordinal: i32,
    pub name: String,
    pub compute_capability: (i32, i32),
    /// Peak DRAM bandwidth from the memory clock and bus width, in GB/s (an upper bound;
    /// spec sheets may quote a slightly different figure).
    pub peak_bandwidth_gbs: f64,
}

pub(crate) fn device_info(ordinal: i32) -> Result<DeviceInfo> {
    let dev = result::device::get(ordinal).map_err(|e| cuda_err("cuDeviceGet", e))?;
    let attr = |a| {
        // SAFETY: dev is a valid device handle.
        unsafe { result::device::get_attribute(dev, a) }.map_err(|e| cuda_err("cuDeviceGetAttribute", e))
    };
    use sys::CUdevice_attribute as A;
    let major = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let clock_khz = f64::from(attr(A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)?);
    let bus_bits = f64::from(attr(A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)?);
    let name = result::device::get_name(dev).map_err(|e| cuda_err("cuDeviceGetName", e))?;
    Ok(DeviceInfo {
        ordinal,
        name,
        compute_capability: (major, minor),
        peak_bandwidth_gbs: 2.0 * clock_khz * 1e3 * bus_bits / 8.0 / 1e9,
    })
}

pub(crate) fn cuda_err(op: &'static str, e: result::DriverError) -> KernelError {
    KernelError::Cuda { op, detail: e.to_string() }
}

/// The device that owns device pointer `ptr`.
pub(crate) fn device_of(ptr: u64, what: &'static str) -> Result<i32> {
    let mut ordinal: i32 = -1;
    // SAFETY: the attribute query writes one int and accepts any pointer value.
    let r = unsafe {
        sys::cuPointerGetAttribute(
            (&mut ordinal as *mut i32).cast::<c_void>(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ptr,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS || ordinal < 0 {
        return Err(KernelError::arg(format!(
            "{what} {ptr:#x} is not CUDA device memory ({})",
            result::DriverError(r)
        )));
    }
    Ok(ordinal)
}

struct Retained(sys::CUcontext);
// SAFETY: a CUcontext handle may be used from any thread (the driver API is thread-safe).
unsafe impl Send for Retained {}

/// The primary context of `ordinal` (retained once, kept for the process: it is the
/// context PyTorch and vLLM use, so their pointers and streams are valid in it).
fn primary_context(ordinal: i32) -> Result<sys::CUcontext> {
    static CTXS: OnceLock<Mutex<HashMap<i32, Retained>>> = OnceLock::new();
    let mut map = CTXS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    if let Some(c) = map.get(&ordinal) {
        return Ok(c.0);
    }
    let dev = result::device::get(ordinal).map_err(|e| cuda_err("cuDeviceGet", e))?;
    // SAFETY: dev is valid; the retain is never released on purpose.
    let ctx =
        unsafe { result::primary_ctx::retain(dev) }.map_err(|e| cuda_err("cuDevicePrimaryCtxRetain", e))?;
    map.insert(ordinal, Retained(ctx));
    Ok(ctx)
}

/// Puts the caller's current context back on drop.
struct CtxGuard {
    prev: Option<sys::CUcontext>,
    ctx: sys::CUcontext,
}

impl Drop for CtxGuard {
    fn drop(&mut self) {
        if let Some(prev) = self.prev
            && prev != self.ctx
        {
            // SAFETY: prev was current on this thread when we entered.
            let _ = unsafe { result::ctx::set_current(prev) };
        }
    }
}

/// The primary context of a pointer's device made current for the guard's lifetime (the
/// caller's current context is put back on drop), with that device's kernels.
pub(crate) struct Entered {
    _guard: CtxGuard,
    pub(crate) module: Arc<Module>,
}

impl Entered {
    pub(crate) fn for_pointer(ptr: u64, what: &'static str) -> Result<Entered> {
        driver()?;
        let ordinal = device_of(ptr, what)?;
        let ctx = primary_context(ordinal)?;
        let prev = result::ctx::get_current().map_err(|e| cuda_err("cuCtxGetCurrent", e))?;
        if prev != Some(ctx) {
            // SAFETY: ctx is a retained primary context.
            unsafe { result::ctx::set_current(ctx) }.map_err(|e| cuda_err("cuCtxSetCurrent", e))?;
        }
        let guard = CtxGuard { prev, ctx };
        Ok(Entered { module: module_for(ordinal)?, _guard: guard })
    }
}

/// The compiled kernels for device `ordinal`; the first call per device compiles them
/// with NVRTC (tens of milliseconds), later calls return the cached module.
fn module_for(ordinal: i32) -> Result<Arc<Module>> {
    static MODULES: OnceLock<Mutex<HashMap<i32, Arc<Module>>>> = OnceLock::new();
    let mut map = MODULES.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    if let Some(m) = map.get(&ordinal) {
        return Ok(Arc::clone(m));
    }
    let info = device_info(ordinal)?;
    let m = Arc::new(module::build(info.compute_capability)?);
    map.insert(ordinal, Arc::clone(&m));
    Ok(m)
}
