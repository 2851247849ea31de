//! The one error type every call returns, and its stable C status codes.

/// What went wrong. Every entry point validates its arguments and returns one of these
/// rather than panicking.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KernelError {
    /// The CUDA path cannot run here (no driver, no NVRTC, no device, or a pointer that
    /// is not device memory). Callers fall back to the CPU path.
    #[error("CUDA unavailable: {reason}")]
    Unavailable { reason: String },
    /// A required pointer was null.
    #[error("null pointer: {what}")]
    NullPointer { what: &'static str },
    /// Dimensions that are zero, overflow, or disagree with a buffer's length.
    #[error("bad shape: {0}")]
    Shape(String),
    /// A dtype name or code this crate does not handle.
    #[error("unknown dtype {0:?} (expected float32, bfloat16 or float16)")]
    DType(String),
    /// Any other argument out of range (temperature, k, EAT parameters, device name).
    #[error("invalid argument: {0}")]
    Argument(String),
    /// A CUDA driver or NVRTC call failed after CUDA was found.
    #[error("CUDA error in {op}: {detail}")]
    Cuda { op: &'static str, detail: String },
    /// A bug caught at the boundary (a panic inside the crate); never expected.
    #[error("internal error: {0}")]
    Internal(String),
}

impl KernelError {
    /// The C ABI status code: 0 is success, each variant has its own negative code.
    pub fn code(&self) -> i32 {
        match self {
            KernelError::Unavailable { .. } => -1,
            KernelError::NullPointer { .. } => -2,
            KernelError::Shape(_) => -3,
            KernelError::DType(_) => -4,
            KernelError::Argument(_) => -5,
            KernelError::Cuda { .. } => -6,
            KernelError::Internal(_) => -7,
        }
    }

    pub(crate) fn unavailable(reason: impl Into<String>) -> Self {
        KernelError::Unavailable { reason: reason.into() }
    }

    pub(crate) fn shape(msg: impl Into<String>) -> Self {
        KernelError::Shape(msg.into())
    }

    pub(crate) fn arg(msg: impl Into<String>) -> Self {
        KernelError::Argument(msg.into())
    }
}

pub type Result<T, E = KernelError> = std::result::Result<T, E>;
