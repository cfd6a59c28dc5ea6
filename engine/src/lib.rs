//! aisql engine: SQL and Substrait plans with AI functions, planned and run by
//! DataFusion, the AI calls answered in batches by an inference backend.
//!
//! Flow: [`sql`] plans SQL (three spellings) and Substrait from any producer;
//! the AI rewrite ([`sql::rewrite`]) makes every `ai_filter`, `ai_join`,
//! `ai_classify`, … call a [`logical::AiNode`]; [`physical`] lowers them to
//! operators that render prompts ([`prompt`]) and ask a
//! [`backend::InferenceBackend`] in batches ([`scheduler`] for a model), their
//! answers recorded per operator ([`answers`]). The benchmark's rules (QUAIL-B
//! plan files, their view, label sets, the per-query output layout) live in
//! the `aisql-bench` crate, which drives this one like any other caller.

pub mod ai_aggregate;
pub mod ai_functions;
pub mod alloc_meter;
pub mod answer_cache;
pub mod answers;
pub mod backend;
pub mod cache_dir;
pub mod canonical;
pub mod coverage;
pub mod distributed;
mod error;
pub mod estimate;
pub mod files;
pub mod host_memory;
pub mod input_file;
pub mod kv_cache;
pub mod logical;
pub mod memo;
pub mod memory_guard;
pub mod options;
pub mod panic_hook;
pub mod parquet_headers;
pub mod parquet_read;
pub mod physical;
pub mod progress;
pub mod prompt;
pub mod query_gate;
pub mod row_digest;
pub mod row_sink;
pub mod scheduler;
pub mod shard;
pub mod spend;
pub mod sql;
pub mod tables;
pub mod work;
pub mod write_guard;

pub use error::{EngineError, Result, from_datafusion};
