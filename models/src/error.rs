//! The models crate's error type: every way loading or running a model can fail,
//! with enough context (paths, tensor names, shapes, ids) to act on the message.

use std::path::PathBuf;

/// Errors raised while loading or running a model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// A candle tensor operation failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),

    /// A compute kernel rejected its inputs.
    #[error(transparent)]
    Kernel(#[from] aisql_kernels::KernelError),

    /// A generation was stopped before its end by its caller (a cancelled
    /// or timed-out query).
    #[error("generation stopped before its end: the query was cancelled")]
    Stopped,

    // === Files and sources ===
    /// A file or directory the model needs does not exist.
    #[error("missing {what}: {path} does not exist")]
    MissingPath {
        /// What was looked for ("model directory", "config.json", ...).
        what: &'static str,
        /// The path that was looked up.
        path: PathBuf,
    },

    /// Reading or writing a file failed.
    #[error("I/O error on {path}: {cause}")]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The underlying error (not chained as a source: the message already
        /// shows it, and a chained one was printed twice).
        cause: std::io::Error,
    },

    /// A Hugging Face model id is not in the local cache, and this build cannot download.
    #[error(
        "model {model_id:?} has no {file} in the local Hugging Face cache at {cache_dir} \
         (offline: this build reads the cache only; download it with `huggingface-cli download {model_id}` \
         or pass a local model directory)"
    )]
    NotInHubCache {
        /// The requested model id.
        model_id: String,
        /// The file that was not found.
        file: String,
        /// The cache directory that was searched.
        cache_dir: PathBuf,
    },

    // === Config and weights ===
    /// `config.json` could not be parsed or lacks a key.
    #[error("invalid model config {path}: {message}")]
    Config {
        /// The config file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },

    /// The requested device cannot be used (no CUDA in this build, or no such GPU).
    #[error("{0}")]
    Device(String),

    /// A config describes an architecture this crate does not run.
    #[error("unsupported model config: {0}")]
    Unsupported(String),

    /// A safetensors file is unreadable or corrupt.
    #[error("invalid safetensors file {path}: {message}")]
    SafeTensors {
        /// The weights file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },

    /// A GGUF file is unreadable, truncated, of another architecture, or holds a
    /// tensor this crate cannot use; the message names the tensor or key.
    #[error("GGUF file {path}: {message}")]
    Gguf {
        /// The GGUF file.
        path: PathBuf,
        /// What is wrong, naming the tensor or metadata key.
        message: String,
    },

    /// A weight the architecture needs is absent from every weights file.
    #[error("missing tensor {name} in the model weights")]
    MissingTensor {
        /// The Hugging Face tensor name.
        name: String,
    },

    /// A weight has a shape other than the config implies.
    #[error("tensor {name} has shape {found:?}, expected {expected:?}")]
    ShapeMismatch {
        /// The Hugging Face tensor name.
        name: String,
        /// The shape the config implies.
        expected: Vec<usize>,
        /// The shape stored in the file.
        found: Vec<usize>,
    },

    /// A weight cannot be used: a dtype the model does not compute in, or a value
    /// that is not finite (NaN or ±Inf), which would poison every answer silently.
    #[error("tensor {name} in {}: {message}", path.display())]
    BadWeights {
        /// The Hugging Face tensor name.
        name: String,
        /// The safetensors file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },

    // === Tokens and inputs ===
    /// The tokenizer failed to load, encode or decode.
    #[error("tokenizer error: {0}")]
    Tokenizer(String),

    /// A token id is not below the model's vocabulary size.
    #[error("token id {id} is out of vocabulary (vocab_size {vocab_size})")]
    TokenOutOfVocab {
        /// The offending id.
        id: u32,
        /// The model's vocabulary size.
        vocab_size: usize,
    },

    /// A KV handle was used after [`crate::KvHandle::release`].
    #[error("KV prefix #{id} was released and cannot be used")]
    ReleasedKv {
        /// The handle's id.
        id: u64,
    },

    /// A KV handle was used while its segment is in host memory
    /// ([`crate::KvHandle::offload`]); [`crate::KvHandle::restore`] brings it back.
    #[error("KV prefix #{id} is offloaded to host memory and was used without a restore")]
    OffloadedKv {
        /// The handle's id.
        id: u64,
    },

    /// A request is malformed (empty sequence, mismatched lengths, foreign handle...).
    #[error("invalid input: {0}")]
    InvalidInput(String),
}

/// Models result.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;

impl ModelError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            cause: source,
        }
    }
}
