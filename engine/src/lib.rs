//! aisql engine: QUAIL-B Substrait plans with AI functions, consumed through
//! DataFusion and answered in batches by an inference backend.
//!
//! Flow: [`plan`] reads and validates the plan into a small query description;
//! [`logical`] consumes it into a DataFusion plan whose `ai_filter`, `ai_join`
//! and `ai_classify` are [`logical::AiNode`] extension nodes; [`physical`] lowers
//! them to operators that render prompts ([`prompt`]) and ask a
//! [`backend::InferenceBackend`] in batches; [`query`] runs it all and returns
//! rows plus per-operator answer tables ([`answers`]).

pub mod ai_functions;
pub mod answers;
pub mod backend;
pub mod cache_dir;
pub mod canonical;
mod error;
pub mod explain;
pub mod host_memory;
pub mod kv_cache;
pub mod labels;
pub mod logical;
pub mod memo;
pub mod output;
pub mod parquet_headers;
pub mod parquet_read;
pub mod physical;
pub mod plan;
pub mod prompt;
pub mod query;
pub mod query_gate;
pub mod scheduler;
pub mod sql;
pub mod tables;

pub use error::{EngineError, Result, from_datafusion};
