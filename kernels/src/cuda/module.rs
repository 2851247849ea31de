//! The CUDA C source (`kernels.cu`, embedded), compiled by NVRTC for one device's
//! architecture into a cubin and loaded as a module.

use std::collections::HashMap;
use std::ffi::{CString, c_char, c_void};

use cudarc::driver::{result, sys};
use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};

use super::context::cuda_err;
use crate::error::{KernelError, Result};

pub(crate) const SOURCE: &str = include_str!("kernels.cu");
/// Threads per block; must equal `BLOCK` in kernels.cu.
pub(crate) const BLOCK: u32 = 512;
/// Every kernel the source defines.
pub const KERNELS: [&str; 7] = [
    "mk_entropy_f32",
    "mk_entropy_bf16",
    "mk_entropy_f16",
    "mk_topk_f32",
    "mk_topk_bf16",
    "mk_topk_f16",
    "mk_eat_update",
];

/// A loaded module and its kernels, by name.
pub(crate) struct Module {
    _module: sys::CUmodule,
    functions: HashMap<&'static str, sys::CUfunction>,
}

// SAFETY: module and function handles are plain driver handles, valid from any thread
// whose current context is the one they were loaded in (launch.rs enters it first); the
// module is never unloaded.
unsafe impl Send for Module {}
unsafe impl Sync for Module {}

impl Module {
    pub(crate) fn function(&self, name: &'static str) -> Result<sys::CUfunction> {
        self.functions
            .get(name)
            .copied()
            .ok_or_else(|| KernelError::Internal(format!("kernel {name} missing from the module")))
    }
}

/// Compiles `SOURCE` for `sm_{major}{minor}` and loads it into the current context.
pub(crate) fn build((major, minor): (i32, i32)) -> Result<Module> {
    let cubin = compile(major, minor)?;
    // SAFETY: cubin is a complete image produced by NVRTC for this device.
    let module = unsafe { result::module::load_data(cubin.as_ptr().cast::<c_void>()) }
        .map_err(|e| cuda_err("cuModuleLoadData", e))?;
    let mut functions = HashMap::new();
    for name in KERNELS {
        let cname = CString::new(name).map_err(|e| KernelError::Internal(e.to_string()))?;
        // SAFETY: module was just loaded.
        let f = unsafe { result::module::get_function(module, cname) }
            .map_err(|e| cuda_err("cuModuleGetFunction", e))?;
        functions.insert(name, f);
    }
    Ok(Module { _module: module, functions })
}

/// Compiles the kernels for `sm_{major}{minor}` without loading them (needs NVRTC only,
/// no driver or device): the cubin, for checks and for tests on machines without a GPU.
pub fn compile_only(major: i32, minor: i32) -> Result<Vec<u8>> {
    super::guard(|| compile(major, minor).map(|c| c.into_iter().map(|b| b as u8).collect()))
}

fn nvrtc_err(op: &'static str, e: nvrtc::NvrtcError) -> KernelError {
    KernelError::Cuda { op, detail: e.to_string() }
}

fn compile(major: i32, minor: i32) -> Result<Vec<c_char>> {
    // SAFETY: only tries to dlopen the library.
    if !unsafe { nvrtc_sys::is_culib_present() } {
        return Err(KernelError::unavailable(
            "NVRTC (libnvrtc.so, .so.13, .so.12 or .so.11) was not found; put the directory holding it on \
             LD_LIBRARY_PATH (for a pip-installed PyTorch: site-packages/nvidia/cuda_nvrtc/lib with CUDA 12, \
             site-packages/nvidia/cu13/lib with CUDA 13)",
        ));
    }
    let src = CString::new(SOURCE).map_err(|e| KernelError::Internal(e.to_string()))?;
    let prog = nvrtc::create_program(&src, Some(c"meridian_kernels.cu"))
        .map_err(|e| nvrtc_err("nvrtcCreateProgram", e))?;
    let opts = [format!("--gpu-architecture=sm_{major}{minor}"), "--std=c++17".to_owned()];
    // SAFETY: prog is a live program, destroyed exactly once below.
    unsafe {
        let compiled = nvrtc::compile_program(prog, &opts);
        let out = match compiled {
            Ok(()) => cubin(prog),
            Err(e) => {
                let log = nvrtc::get_program_log(prog).map(|l| log_text(&l)).unwrap_or_default();
                Err(KernelError::Cuda { op: "nvrtcCompileProgram", detail: format!("{e}: {log}") })
            }
        };
        let _ = nvrtc::destroy_program(prog);
        out
    }
}

/// # Safety
/// `prog` must be a successfully compiled, live program.
unsafe fn cubin(prog: nvrtc_sys::nvrtcProgram) -> Result<Vec<c_char>> {
    let mut size = 0usize;
    // SAFETY: forwarded; size is a valid out-pointer and buf holds `size` bytes.
    unsafe {
        nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size)
            .result()
            .map_err(|e| nvrtc_err("nvrtcGetCUBINSize", e))?;
        let mut buf: Vec<c_char> = vec![0; size];
        nvrtc_sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr())
            .result()
            .map_err(|e| nvrtc_err("nvrtcGetCUBIN", e))?;
        Ok(buf)
    }
}

fn log_text(log: &[c_char]) -> String {
    let bytes: Vec<u8> = log.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}
