//! QUAIL-B's rules, kept out of the engine: plan files validated and their
//! view derived ([`plan`]) through the benchmark's Substrait consumer
//! ([`consumer`]), one query run to its per-operator answer tables ([`query`])
//! and written in the per-query layout ([`output`]), reference labels
//! ([`labels`]) and the oracle that answers from them ([`oracle`]), and the
//! operator tree `aisql explain` prints ([`explain`]).

pub mod consumer;
pub mod explain;
pub mod labels;
pub mod oracle;
pub mod output;
pub mod plan;
pub mod query;
