//! AI calls in a plan: the registry of AI functions, the logical node and the
//! physical operators that ask a backend in batches, AI aggregates, answers as
//! Arrow, row coverage and live progress.

pub mod ai_aggregate;
pub mod ai_functions;
pub mod answers;
pub mod coverage;
pub mod logical;
pub mod physical;
pub mod progress;
