//! Errors of the stand-in generator. The messages are those `aisql-bench` printed
//! when the generator was part of it: it maps each variant to its own of the same
//! text (`aisql_bench::error::BenchError`'s `From<StandinError>`).

use std::path::{Path, PathBuf};

/// Result with [`StandinError`].
pub type Result<T, E = StandinError> = std::result::Result<T, E>;

/// What can go wrong generating a stand-in corpus.
#[derive(Debug, thiserror::Error)]
pub enum StandinError {
    /// A file could not be read or written.
    #[error("{}: {message}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// What failed.
        message: String,
    },
    /// A scale factor the generator does not support.
    #[error("scale factor: {0}")]
    ScaleFactor(String),
    /// The generator failed (its tokenizer could not be loaded).
    #[error("stand-in generation: {0}")]
    Generate(String),
    /// Sealing the generated files failed.
    #[error(transparent)]
    Engine(#[from] aisql_engine::EngineError),
}

impl StandinError {
    /// An [`StandinError::Io`] naming `path`.
    pub fn io(path: &Path, e: impl std::fmt::Display) -> StandinError {
        StandinError::Io {
            path: path.to_path_buf(),
            message: e.to_string(),
        }
    }
}
