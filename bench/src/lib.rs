//! QUAIL-B for aisql.

pub mod charts;
pub mod compare;
pub mod corpus;
pub mod driver;
pub mod error;
pub mod layout;
#[cfg(test)]
mod layout_tests;
pub mod metrics;
pub mod plans;
pub mod quailb;
pub mod reference;
pub mod report;
pub mod resolve;
pub mod run_file;
pub mod scoring;
#[cfg(test)]
mod standin_measure;
pub mod tokens;
