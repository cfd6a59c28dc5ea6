//! aisql engine: SQL and Substrait plans with AI functions, planned and run by
//! DataFusion, the AI calls answered in batches by an inference backend.
//!
//! Flow: [`sql`] plans SQL (three spellings) and Substrait from any producer;
//! the AI rewrite ([`sql::rewrite`]) makes every `ai_filter`, `ai_join`,
//! `ai_classify`, … call a [`exec::logical::AiNode`]; [`exec::physical`]
//! lowers them to operators that render prompts ([`inference::prompt`]) and
//! ask an [`inference::backend::InferenceBackend`] in batches
//! ([`inference::scheduler`] for a model), their answers recorded per operator
//! ([`exec::answers`]).
//!
//! Folders, each importing only those listed after it: [`estimate`] (a query's
//! cost before it runs), [`sql`] (front end), [`exec`] (AI plan nodes and
//! operators), [`inference`] (backends and what serves them), [`limits`]
//! (memory, spend, cancellation) and [`data`] (files in and out); the error
//! type, panic messages and [`console`] (text on stdout and stderr written
//! without panicking) at the root under them all.
//!
//! The benchmark's rules (QUAIL-B plan files, their view, label sets, the
//! per-query output layout) live in the `aisql-bench` crate, which drives
//! this one like any other caller.

pub mod console;
pub mod data;
mod error;
pub mod estimate;
pub mod exec;
pub mod inference;
pub mod limits;
pub mod panic_hook;
pub mod sql;

pub use error::{EngineError, Result, from_datafusion};
