use pyo3::PyErr;
use pyo3::exceptions::{PyOSError, PyValueError};

/// Everything the hook's native side can fail with.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("{0}")]
    Config(String),
    #[error("invalid argument: {0}")]
    Argument(String),
    #[error("policy channel cannot listen on {addr}: {reason}")]
    Listen { addr: String, reason: String },
    #[error("policy channel secret: environment variable {0} is not set or empty")]
    MissingSecret(String),
}

impl From<HookError> for PyErr {
    fn from(e: HookError) -> PyErr {
        match e {
            HookError::Config(_) | HookError::Argument(_) | HookError::MissingSecret(_) => {
                PyValueError::new_err(e.to_string())
            }
            HookError::Listen { .. } => PyOSError::new_err(e.to_string()),
        }
    }
}
