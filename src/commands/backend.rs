//! Building the inference backend a command asked for.

use std::sync::Arc;

use anyhow::{Context, bail};
use aisql_bench::layout::Dataset;
use aisql_engine::backend::{InferenceBackend, OracleBackend};

use crate::cli::{BackendArgs, BackendKind};

/// The backend for `args`. `templates` are the prompt templates the queries use
/// (the oracle loads only their label sets).
pub fn build(args: &BackendArgs, dataset: Option<&Dataset>, templates: &[String]) -> anyhow::Result<Arc<dyn InferenceBackend>> {
    match args.backend {
        BackendKind::Oracle => {
            let Some(dataset) = dataset else {
                bail!("--backend oracle needs reference labels: use a QUAIL-B data root (--root), not --tables");
            };
            let labels = dataset
                .load_labels(Some(templates))
                .context("loading reference labels")?;
            Ok(Arc::new(OracleBackend::new(Arc::new(labels))))
        }
        BackendKind::Model => bail!("the model backend is not available in this build yet; use --backend oracle"),
    }
}
