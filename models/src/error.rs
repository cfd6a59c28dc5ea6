//! The models crate's error type.

/// Errors raised while loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A candle tensor operation failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// Models result.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;
