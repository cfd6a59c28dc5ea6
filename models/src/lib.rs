//! Qwen3 in candle with a KV cache owned outside the model, so that one document's
//! KV can be shared by many scored continuations.

mod error;
pub use error::{ModelError, Result};
