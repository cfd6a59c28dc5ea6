//! Qwen3 in candle with a KV cache owned outside the model, so that one document's
//! KV can be shared by many scored continuations.
//!
//! * [`Qwen3`]: the model ([`qwen3`]); load with [`Qwen3::load`] or [`Qwen3::from_files`].
//! * [`KvHandle`]: a cached prefix ([`kv`]), made by [`Qwen3::prefill`].
//! * Scoring ([`score`]): [`Qwen3::decide`], [`Qwen3::label_logprobs`], [`Qwen3::classify`].
//! * Greedy decoding ([`generate`]): [`Qwen3::generate`], batched over shared prefixes.
//! * [`tokenizer::Tokenizer`]: Qwen3's tokenizer (vendored copy included).
//! * [`tiny`]: a deterministic random tiny Qwen3 for tests and benchmarks.

#![warn(missing_docs)]

pub mod constrain;
mod error;
pub mod generate;
pub mod gguf;
pub mod kv;
pub mod kv_bytes;
pub mod precision;
pub mod qwen3;
pub mod regular_file;
pub mod score;
pub mod source;
#[cfg(test)]
mod testutil;
pub mod tiny;
pub mod tokenizer;

pub use constrain::{TokenConstraint, allowed_ids};
pub use error::{ModelError, Result};
pub use generate::{FinishReason, GenerateRequest, Generation};
pub use kv::KvHandle;
pub use precision::Precision;
pub use qwen3::{Config, Qwen3};
pub use score::{ClassifyRequest, Continuation, Decision};
pub use source::{ModelFiles, default_dtype, default_precision, device, device_free_memory};
pub use tokenizer::{AnswerIds, Tokenizer};

pub use candle_core::{DType, Device};

/// What [`load`] would give, without reading weights: the model's
/// configuration and the dtype of its activations and KV cache on `device`
/// (a backend sizes its work by them before the model is first needed).
/// The same errors as [`load`] for a source that is not there, a
/// configuration that is not Qwen3's, or a `precision` the file refuses.
pub fn describe(
    source: &str,
    device: &Device,
    precision: Option<Precision>,
) -> Result<(Config, DType)> {
    let files = ModelFiles::resolve(source)?;
    if let Some(path) = files.gguf_file() {
        let file = gguf::GgufFile::open(path)?;
        let precision = Qwen3::gguf_precision(&file, precision)?;
        return Ok((file.config()?, precision.compute_dtype(device)));
    }
    let config = files
        .config
        .as_ref()
        .expect("safetensors models have a config");
    let precision = precision.unwrap_or_else(|| default_precision(device));
    Ok((Config::from_file(config)?, precision.compute_dtype(device)))
}

/// Loads a model and its tokenizer from `source`: a local directory or GGUF file,
/// or a Hugging Face model id (`org/name`, or `org/name:QUANT` for a GGUF) read
/// from the local HF cache. The tokenizer is a GGUF's own (from its metadata), the
/// model's `tokenizer.json` when shipped, otherwise the vendored Qwen3 one.
pub fn load(
    source: &str,
    device: &Device,
    precision: Option<Precision>,
) -> Result<(Qwen3, Tokenizer)> {
    let files = ModelFiles::resolve(source)?;
    if let Some(path) = files.gguf_file() {
        // One parse of the header serves the model and the tokenizer.
        let file = gguf::GgufFile::open(path)?;
        let model = Qwen3::from_gguf(&file, device, precision)?;
        return Ok((model, gguf::tokenizer::from_gguf(&file)?));
    }
    let model = Qwen3::from_files(&files, device, precision)?;
    let tokenizer = match &files.tokenizer {
        Some(path) => Tokenizer::from_file(path)?,
        None => Tokenizer::vendored()?,
    };
    Ok((model, tokenizer))
}
