//! Where commands may write: each command lists what it reads in the engine's
//! [`WriteGuard`] (the one write rule, [`aisql_engine::data::write_guard`]), and
//! every output it is told to write is checked against it before anything is
//! written.

use aisql_bench::layout::Dataset;
use aisql_engine::data::write_guard::{OutputKind, WriteGuard};

use crate::cli::PlansArg;
use crate::config::{BackendKind, BackendSpec};

/// Adds the model files `args` loads (none with the oracle or `--workers`),
/// and the worker token and CA files it reads.
pub fn add_backend_files(guard: &mut WriteGuard, args: &BackendSpec) {
    if let Some(file) = args.workers.as_ref().and_then(|w| w.token_file.as_ref()) {
        guard.add(file, "the --worker-token-file");
    }
    if let Some(file) = args.workers.as_ref().and_then(|w| w.tls_ca.as_ref()) {
        guard.add(file, "the --tls-ca file");
    }
    if args.kind != BackendKind::Model || args.workers.is_some() {
        return;
    }
    for path in aisql_engine::inference::scheduler::model_input_paths(&args.model.name) {
        guard.add(&path, format!("the model {:?}", args.model.name));
    }
}

/// Adds a QUAIL-B dataset's root folder.
pub fn add_dataset(guard: &mut WriteGuard, dataset: &Dataset) {
    guard.add(dataset.source.root(), "the data root");
}

/// Adds a `--plans` folder.
pub fn add_plans(guard: &mut WriteGuard, plans: &PlansArg) {
    if let Some(dir) = &plans.dir {
        guard.add(dir, "the --plans folder");
    }
}

/// Checks the folders aisql keeps its stores in (`--answer-cache`,
/// `--kv-store`) against the inputs.
pub fn check_stores(guard: &WriteGuard, args: &BackendSpec) -> anyhow::Result<()> {
    if let Some(dir) = &args.answer_cache {
        guard.check(dir, "--answer-cache", OutputKind::Folder)?;
    }
    if let Some(dir) = &args.scheduler.kv_store {
        guard.check(dir, "--kv-store", OutputKind::Folder)?;
    }
    Ok(())
}
