//! Building the inference backend a command asked for.

use std::sync::Arc;

use aisql_bench::layout::Dataset;
use aisql_engine::backend::{InferenceBackend, OracleBackend};
use aisql_engine::scheduler::{
    ModelSpec, QWEN3_4B_KV_BYTES_PER_TOKEN, SchedulerConfig, default_kv_budget_bytes,
    load_model_backend, simulation_backend,
};
use anyhow::{Context, bail};

use crate::cli::{BackendArgs, BackendKind, CudaKernelsArg, Switch};

/// KV budget the simulation assumes without `--kv-budget-mb`.
const SIMULATED_KV_BUDGET_BYTES: usize = 100 << 30;

/// Host KV tier the simulation assumes without `--kv-host-mb`: an H200's share of
/// the host memory of an 8-GPU node (2 TiB).
const SIMULATED_HOST_KV_BYTES: usize = 256 << 30;

/// The scheduling knobs of `args`.
pub fn scheduler_config(args: &BackendArgs) -> SchedulerConfig {
    SchedulerConfig {
        prefix_cache: args.prefix_cache == Switch::On,
        lookahead: args.lookahead == Switch::On,
        kv_budget_bytes: args
            .kv_budget_mb
            .map_or_else(default_kv_budget_bytes, |mb| mb << 20),
        host_kv_budget_bytes: args.kv_host_mb.map_or(0, |mb| mb << 20),
        batch_tokens: args.batch_tokens.max(1),
    }
}

/// The backend for `args` and metadata describing it. `templates` are the prompt
/// templates the queries use (the oracle loads only their label sets).
pub fn build(
    args: &BackendArgs,
    dataset: Option<&Dataset>,
    templates: &[String],
) -> anyhow::Result<(
    Arc<dyn InferenceBackend>,
    serde_json::Map<String, serde_json::Value>,
)> {
    // The backend's description for run records: only what this backend uses (an
    // oracle run has no model, device or dtype).
    let mut meta = serde_json::Map::new();
    match args.backend {
        BackendKind::Oracle => {
            let Some(dataset) = dataset else {
                bail!(
                    "--backend oracle needs reference labels: use a QUAIL-B data root (--root), not --tables"
                );
            };
            let labels = Arc::new(
                dataset
                    .load_labels(Some(templates))
                    .context("loading reference labels")?,
            );
            if args.simulate {
                let mut config = scheduler_config(args);
                if args.kv_budget_mb.is_none() {
                    // The simulation stands for a GPU deployment: Qwen3-4B on an
                    // H200 leaves about 100 GiB of its 141 GB for KV.
                    config.kv_budget_bytes = SIMULATED_KV_BUDGET_BYTES;
                }
                if args.kv_host_mb.is_none() {
                    config.host_kv_budget_bytes = SIMULATED_HOST_KV_BYTES;
                }
                meta.insert("simulation".into(), true.into());
                meta.insert("prefix_cache".into(), config.prefix_cache.into());
                meta.insert("lookahead".into(), config.lookahead.into());
                meta.insert("kv_budget_bytes".into(), config.kv_budget_bytes.into());
                meta.insert(
                    "kv_host_budget_bytes".into(),
                    config.host_kv_budget_bytes.into(),
                );
                meta.insert("batch_tokens".into(), config.batch_tokens.into());
                meta.insert(
                    "simulated_kv_bytes_per_token".into(),
                    QWEN3_4B_KV_BYTES_PER_TOKEN.into(),
                );
                return Ok((
                    simulation_backend(labels, config, QWEN3_4B_KV_BYTES_PER_TOKEN)?,
                    meta,
                ));
            }
            Ok((Arc::new(OracleBackend::new(labels)), meta))
        }
        BackendKind::Model => {
            if args.simulate {
                bail!(
                    "--simulate runs the scheduler over reference labels: use it with --backend oracle"
                );
            }
            let dtype = match args.dtype.as_deref() {
                None => None,
                Some("f32") => Some(aisql_models::DType::F32),
                Some("bf16") => Some(aisql_models::DType::BF16),
                Some("f16") => Some(aisql_models::DType::F16),
                Some(other) => bail!("unknown --dtype {other:?} (f32, bf16 or f16)"),
            };
            let kernels = match args.cuda_kernels {
                CudaKernelsArg::Auto => aisql_kernels::CudaKernels::Auto,
                CudaKernelsArg::All => aisql_kernels::CudaKernels::All,
                CudaKernelsArg::Off => aisql_kernels::CudaKernels::Off,
            };
            aisql_kernels::set_cuda_kernels(kernels);
            if args.gpu.is_some() {
                meta.insert(
                    "cuda_kernels".into(),
                    format!("{kernels:?}").to_lowercase().into(),
                );
            }
            let spec = ModelSpec {
                model: args.model.clone(),
                gpu: args.gpu,
                dtype,
                scheduler: scheduler_config(args),
                kv_budget_from_device: args.kv_budget_mb.is_none(),
                host_kv_from_memory: args.kv_host_mb.is_none(),
            };
            let (backend, model_meta) = load_model_backend(&spec)
                .with_context(|| format!("loading model {:?}", args.model))?;
            meta.extend(model_meta);
            Ok((backend, meta))
        }
    }
}
