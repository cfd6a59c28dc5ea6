//! Fuzzing aisql's front ends on stable Rust: every input a user or another
//! program hands aisql (Substrait plans, Parquet and CSV tables, QUAIL-B
//! manifests and label sets, a run folder to resume, document text in prompts,
//! what reaches an `aisql worker` over the network)
//! has a target here that feeds it to the product's own code.
//!
//! The fuzzer is structure-aware generation over real seeds ([`mutate`]): byte
//! edits, JSON-tree edits and a dictionary of hostile text, steered by the kinds
//! of outcome an input produces (an input whose error is of a kind not seen
//! before joins the corpus). [`driver`] runs a target for a while, catching
//! panics, watching for hangs and for allocations over the limit
//! ([`alloc::FUZZ_ALLOC`]), and saves every input that breaks a promise.

pub mod alloc;
pub mod driver;
pub mod mutate;
pub mod targets;

pub use driver::{Finding, Report, fuzz};
pub use targets::{Fixture, Target};
