//! The kernels crate's error type.

/// Errors raised by a kernel whose inputs are inconsistent.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    /// A candle tensor operation failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),

    /// Inputs disagree on a dimension, or a row id is out of range.
    #[error("{kernel}: {message}")]
    BadInput {
        /// The kernel that rejected the input.
        kernel: &'static str,
        /// What is inconsistent.
        message: String,
    },

    /// A CUDA kernel disagreed with the candle-ops composition in its first-use check.
    #[error("CUDA kernel {kernel} failed its self-check: {message}")]
    SelfCheck {
        /// The kernel that failed.
        kernel: &'static str,
        /// What differed.
        message: String,
    },
}

/// Kernels result.
pub type Result<T, E = KernelError> = std::result::Result<T, E>;
