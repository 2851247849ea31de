//! Element types of the logits, by name (Python) and by code (C ABI).

use crate::error::{KernelError, Result};

/// The logits' element type. The discriminants are the C ABI dtype codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum DType {
    F32 = 0,
    Bf16 = 1,
    F16 = 2,
}

impl DType {
    pub const ALL: [DType; 3] = [DType::F32, DType::Bf16, DType::F16];

    /// From a C ABI code (0 float32, 1 bfloat16, 2 float16).
    pub fn from_code(code: i32) -> Result<DType> {
        match code {
            0 => Ok(DType::F32),
            1 => Ok(DType::Bf16),
            2 => Ok(DType::F16),
            other => Err(KernelError::DType(format!("code {other}"))),
        }
    }

    /// From a name as PyTorch, NumPy or people write it: `float32`/`fp32`/`f32`,
    /// `bfloat16`/`bf16`, `float16`/`fp16`/`f16`/`half`, with or without a `torch.` prefix.
    pub fn parse(name: &str) -> Result<DType> {
        let n = name.trim();
        let n = n.strip_prefix("torch.").unwrap_or(n);
        match n.to_ascii_lowercase().as_str() {
            "float32" | "fp32" | "f32" | "float" => Ok(DType::F32),
            "bfloat16" | "bf16" => Ok(DType::Bf16),
            "float16" | "fp16" | "f16" | "half" => Ok(DType::F16),
            _ => Err(KernelError::DType(name.to_owned())),
        }
    }

    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::Bf16 | DType::F16 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::Bf16 => "bfloat16",
            DType::F16 => "float16",
        }
    }
}

/// Checked `batch * vocab`, both non-zero.
pub(crate) fn elements(batch: usize, vocab: usize) -> Result<usize> {
    if batch == 0 || vocab == 0 {
        return Err(KernelError::shape(format!("batch and vocab must be positive, got [{batch}, {vocab}]")));
    }
    batch
        .checked_mul(vocab)
        .filter(|n| n.checked_mul(4).is_some())
        .ok_or_else(|| KernelError::shape(format!("[{batch}, {vocab}] overflows")))
}
