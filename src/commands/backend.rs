//! Building the inference backend a [`BackendSpec`] names — oracle,
//! simulation, a model on one or several devices or CPU workers, remote
//! workers, sharded, behind the answer cache — and its [`BackendMeta`],
//! filled here as the stack is built.

use std::sync::Arc;

use aisql_bench::layout::Dataset;
use aisql_bench::quailb::oracle::OracleBackend;
use aisql_engine::EngineError;
use aisql_engine::data::write_guard::{OutputKind, WriteGuard};
use aisql_engine::errln;
use aisql_engine::inference::answer_cache::{
    AnswerCache, AnswerIdentity, CachedBackend, KEY_FILE, RecordKey,
};
use aisql_engine::inference::backend::InferenceBackend;
use aisql_engine::inference::backend_meta::BackendMeta;
use aisql_engine::inference::distributed::{ConnectOptions, connect_workers_with};
use aisql_engine::inference::lazy::{LazyBackend, Load};
use aisql_engine::inference::prompt::PromptFormat;
use aisql_engine::inference::scheduler::{
    ModelSpec, QWEN3_4B_KV_BYTES_PER_TOKEN, answer_identity, describe_model_backend,
    load_model_backend, simulation_backend,
};
use aisql_engine::inference::shard::ShardedBackend;
use anyhow::{Context, bail};

use super::UsageError;
use crate::cli::ModelArgs;
use crate::config::{BackendKind, BackendSpec, ModelChoice, RemoteWorkers};

/// Said whenever the generated tiny model answers: its answers look confident
/// and mean nothing.
pub const TINY_MODEL_NOTE: &str = "note: --model tiny is a generated test model with random weights: its answers are random. Name a real Qwen3 with --model DIR (config.json, *.safetensors) or a Hugging Face id in the local cache (--model Qwen/Qwen3-4B).";

/// `--dtype`: the weights format asked for, `None` for the device's default.
pub fn dtype(args: &ModelChoice) -> anyhow::Result<Option<aisql_models::Precision>> {
    args.dtype
        .as_deref()
        .map(|d| {
            d.parse().map_err(|_| {
                anyhow::anyhow!(
                    "unknown --dtype {d:?} ({})",
                    aisql_models::Precision::CHOICES
                )
            })
        })
        .transpose()
}

/// The model and tokenizer `args` name, loaded on the one device they name: the
/// model on its own, for commands that run it directly rather than through the
/// engine's scheduler.
pub fn load_model(
    args: &ModelArgs,
) -> anyhow::Result<(aisql_models::Qwen3, aisql_models::Tokenizer)> {
    let gpu = one_gpu(args, "this command runs one model on one device")?;
    let dtype = dtype(&args.choice())?;
    if args.name == "tiny" {
        errln!("{TINY_MODEL_NOTE}")?;
    }
    let source = aisql_engine::inference::scheduler::model_source(&args.name)?;
    let device = aisql_models::device(gpu)?;
    aisql_models::load(&source, &device, dtype)
        .with_context(|| format!("loading model {:?}", args.name))
}

/// The one GPU `args` name (`None`: the CPU); several are a usage error
/// saying `why` one.
pub fn one_gpu(args: &ModelArgs, why: &str) -> anyhow::Result<Option<usize>> {
    match args.gpu.as_deref() {
        None => Ok(None),
        Some([n]) => Ok(Some(*n)),
        Some(_) => Err(UsageError(format!("--gpu: {why}; name one GPU")).into()),
    }
}

/// The devices of `args`' workers: one per `--gpu` device, `--cpu-workers` CPU
/// workers, else the CPU alone.
fn worker_devices(args: &BackendSpec) -> anyhow::Result<Vec<Option<usize>>> {
    if let Some(gpus) = &args.model.gpu {
        let mut seen = std::collections::HashSet::new();
        if let Some(dup) = gpus.iter().find(|g| !seen.insert(**g)) {
            bail!("--gpu {dup} is listed twice: one worker per device");
        }
        return Ok(gpus.iter().map(|&g| Some(g)).collect());
    }
    let workers = usize::from(args.cpu_workers.unwrap_or(1));
    let simulated = args.kind == BackendKind::Oracle && args.simulate;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if !simulated && workers > cores * CPU_WORKERS_PER_CORE {
        return Err(UsageError(format!(
            "--cpu-workers {workers}: this machine runs {cores} threads at once, and each CPU \
             worker is a copy of the model computing on them; more than {} workers only divide \
             the same cores and multiply the memory",
            cores * CPU_WORKERS_PER_CORE
        ))
        .into());
    }
    Ok(vec![None; workers])
}

/// CPU workers per core beyond which `--cpu-workers` is refused (simulated
/// devices have no such bound: they compute nothing).
const CPU_WORKERS_PER_CORE: usize = 4;

/// One backend over several workers (or the one worker itself).
fn over_workers(
    workers: Vec<Arc<dyn InferenceBackend>>,
    meta: &mut BackendMeta,
) -> anyhow::Result<Arc<dyn InferenceBackend>> {
    meta.workers = Some(workers.len());
    if workers.len() == 1 {
        return Ok(workers.into_iter().next().expect("one worker"));
    }
    Ok(Arc::new(ShardedBackend::try_new(workers)?))
}

/// The backend `args` names and its description. `templates` are the prompt
/// templates the queries use (the oracle loads only their label sets; `None`:
/// any query may come, every label set is loaded).
pub fn build(
    args: &BackendSpec,
    dataset: Option<&Dataset>,
    templates: Option<&[String]>,
) -> anyhow::Result<(Arc<dyn InferenceBackend>, BackendMeta)> {
    if args.kind == BackendKind::Model && args.workers.is_none() && args.model.name == "tiny" {
        errln!("{TINY_MODEL_NOTE}")?;
    }
    build_stack(args, dataset, templates, None)
}

/// [`build`], without its note; a model's scheduling is `scheduler` where
/// given (the one a [`LazyBackend`]'s facts were read under: the default KV
/// budget is a share of the memory available when it is computed).
fn build_stack(
    args: &BackendSpec,
    dataset: Option<&Dataset>,
    templates: Option<&[String]>,
    scheduler: Option<aisql_engine::inference::scheduler::SchedulerConfig>,
) -> anyhow::Result<(Arc<dyn InferenceBackend>, BackendMeta)> {
    // The backend's description for run records: only what this backend uses (an
    // oracle run has no model, device or dtype).
    if let Some(remote) = &args.workers {
        return remote_workers(args, remote);
    }
    let mut meta = BackendMeta::default();
    let devices = worker_devices(args)?;
    match args.kind {
        BackendKind::Oracle if args.answer_cache.is_some() => bail!(
            "--answer-cache keeps a model's answers: use it with --backend model (the oracle answers from labels)"
        ),
        BackendKind::Oracle => {
            let Some(dataset) = dataset else {
                bail!(
                    "--backend oracle needs reference labels: use a QUAIL-B data root (--root), not --tables"
                );
            };
            let labels = match templates {
                Some(templates) => dataset.shared_labels(templates),
                None => dataset.load_labels(None).map(Arc::new),
            }
            .context("loading reference labels")?;
            if !args.simulate {
                if devices.len() > 1 {
                    bail!(
                        "several workers (--gpu N,N or --cpu-workers) need --backend model, or --simulate with the oracle"
                    );
                }
                return Ok((Arc::new(OracleBackend::new(labels)), meta));
            }
            let config = args.scheduler.simulated_config();
            meta.simulation = Some(true);
            meta.prefix_cache = Some(config.prefix_cache);
            meta.lookahead = Some(config.lookahead);
            meta.kv_budget_bytes = Some(config.kv_budget_bytes);
            meta.kv_host_budget_bytes = Some(config.host_kv_budget_bytes);
            meta.batch_tokens = Some(config.batch_tokens);
            meta.simulated_kv_bytes_per_token = Some(QWEN3_4B_KV_BYTES_PER_TOKEN);
            // Each simulated device has the whole budget of one.
            let workers = devices
                .iter()
                .map(|_| {
                    simulation_backend(
                        Arc::new(OracleBackend::new(labels.clone())),
                        config.clone(),
                        QWEN3_4B_KV_BYTES_PER_TOKEN,
                    )
                    .map(|b| b as Arc<dyn InferenceBackend>)
                })
                .collect::<Result<Vec<_>, _>>()?;
            let backend = over_workers(workers, &mut meta)?;
            Ok((backend, meta))
        }
        BackendKind::Model => {
            if args.simulate {
                bail!(
                    "--simulate runs the scheduler over reference labels: use it with --backend oracle"
                );
            }
            let dtype = dtype(&args.model)?;
            let kernels = args.cuda_kernels;
            aisql_kernels::set_cuda_kernels(kernels);
            if args.model.gpu.is_some() {
                meta.cuda_kernels = Some(format!("{kernels:?}").to_lowercase());
            }
            let mut scheduler = scheduler.unwrap_or_else(|| args.scheduler.config());
            if args.scheduler.kv_budget_mb.is_none() && devices[0].is_none() {
                // CPU workers share the host's memory.
                scheduler.kv_budget_bytes /= devices.len();
            }
            let mut workers: Vec<Arc<dyn InferenceBackend>> = Vec::new();
            let mut device_names = Vec::new();
            let mut described = false;
            for &gpu in &devices {
                let worker_spec = model_spec(args, gpu, dtype, scheduler.clone());
                let (backend, model_meta) = load_model_backend(&worker_spec)
                    .with_context(|| format!("loading model {:?}", args.model.name))?;
                device_names.push(model_meta.device().to_string());
                if !described {
                    // The first worker's model facts; the flags' own
                    // (cuda_kernels) stay.
                    meta = BackendMeta {
                        cuda_kernels: meta.cuda_kernels.take(),
                        ..model_meta
                    };
                    described = true;
                }
                workers.push(backend);
            }
            if workers.len() > 1 {
                meta.devices = Some(device_names);
            }
            let backend = over_workers(workers, &mut meta)?;
            let Some(dir) = &args.answer_cache else {
                return Ok((backend, meta));
            };
            let identity =
                answer_identity(&args.model.name, meta.dtype(), args.prompt_format.parse()?)
                    .with_context(|| {
                        format!("hashing model {:?} for --answer-cache", args.model.name)
                    })?;
            with_answer_cache(backend, dir, &identity, meta)
        }
    }
}

/// The model one worker of `args` loads on `gpu` (`None`: the CPU).
fn model_spec(
    args: &BackendSpec,
    gpu: Option<usize>,
    dtype: Option<aisql_models::Precision>,
    scheduler: aisql_engine::inference::scheduler::SchedulerConfig,
) -> ModelSpec {
    ModelSpec {
        model: args.model.name.clone(),
        gpu,
        dtype,
        scheduler,
        kv_budget_from_device: args.scheduler.kv_budget_mb.is_none(),
        host_kv_from_memory: args.scheduler.kv_host_mb.is_none(),
        kv_store: args.scheduler.kv_store_spec(),
    }
}

/// The backend `args` names for sessions (`aisql sql`, the shell, `aisql
/// serve`, Python), which may run many statements and none with AI calls:
/// one local model on the CPU is loaded when a statement first needs it
/// ([`LazyBackend`]); its configuration is read now, so a model that is not
/// there is still an error at once. Any other backend is built now (the
/// oracle with the label sets of `templates`, all of them for `None`).
pub fn build_for_sessions(
    args: &BackendSpec,
    dataset: Option<&Dataset>,
    templates: Option<&[String]>,
) -> anyhow::Result<Arc<dyn InferenceBackend>> {
    let devices = worker_devices(args)?;
    // On a GPU the KV budgets depend on the memory the loaded weights leave:
    // loaded now.
    let one_local_model = args.kind == BackendKind::Model
        && !args.simulate
        && args.workers.is_none()
        && devices == [None];
    if !one_local_model {
        return Ok(build(args, dataset, templates)?.0);
    }
    let scheduler = args.scheduler.config();
    let spec = model_spec(args, devices[0], dtype(&args.model)?, scheduler.clone());
    let Some(facts) = describe_model_backend(&spec)
        .with_context(|| format!("reading model {:?}", args.model.name))?
    else {
        return Ok(build(args, dataset, templates)?.0);
    };
    if args.model.name == "tiny" {
        errln!("{TINY_MODEL_NOTE}")?;
    }
    let args = args.clone();
    let load: Load = Box::new(move || {
        build_stack(&args, None, None, Some(scheduler))
            .map(|(backend, _meta)| backend)
            .map_err(|e| EngineError::Inference(format!("{e:#}")))
    });
    Ok(Arc::new(LazyBackend::new(facts, load)))
}

/// Whether the worker at `addr` (`HOST:PORT` or a URL) is on this machine's
/// loopback.
fn is_loopback_worker(addr: &str) -> bool {
    let rest = addr.split_once("://").map_or(addr, |(_, rest)| rest);
    let host = rest.split('/').next().unwrap_or(rest);
    let host = match host.rsplit_once(':') {
        Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) => host,
        _ => host,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// `--workers`: one backend over the `aisql worker`s `remote` names, which must
/// serve one model; the run metadata describes the model and device of the first.
fn remote_workers(
    args: &BackendSpec,
    remote: &RemoteWorkers,
) -> anyhow::Result<(Arc<dyn InferenceBackend>, BackendMeta)> {
    let addrs = &remote.addrs;
    if args.kind != BackendKind::Model || args.simulate {
        bail!(
            "--workers sends questions to the models of `aisql worker`s: use it with --backend model (the default), without --simulate"
        );
    }
    let mut token = super::worker::worker_token(
        remote.token_file.as_deref(),
        "--worker-token-file",
        std::env::var(super::worker::TOKEN_ENV).ok(),
    )?;
    // Workers on this machine without a token of their own take the owner's
    // generated one.
    if token.is_none() && addrs.iter().all(|a| is_loopback_worker(a)) {
        token =
            super::owner_secret::read(&super::owner_secret::path(super::worker::GENERATED_TOKEN))?;
    }
    let options = ConnectOptions {
        token,
        tls_ca: remote
            .tls_ca
            .as_deref()
            .map(|f| super::worker::read_pem(f, "--tls-ca"))
            .transpose()?,
        call_timeout: remote.call_timeout,
        ..Default::default()
    };
    let workers = connect_workers_with(addrs, &options)?;
    let mut meta = workers[0].hello().meta.clone();
    meta.worker_addresses = Some(workers.iter().map(|w| w.url().to_string()).collect());
    meta.devices = Some(
        workers
            .iter()
            .map(|w| w.hello().meta.device().to_string())
            .collect(),
    );
    let mut identity = workers[0].hello().identity.clone();
    identity.prompt_format = args
        .prompt_format
        .parse::<PromptFormat>()?
        .name()
        .to_string();
    for w in &workers {
        errln!(
            "worker {}: {} ({}, {})",
            w.url(),
            w.hello().identity.model,
            w.hello().identity.dtype,
            w.hello().meta.device()
        )?;
    }
    let workers = workers
        .into_iter()
        .map(|w| Arc::new(w) as Arc<dyn InferenceBackend>)
        .collect();
    let backend = over_workers(workers, &mut meta)?;
    match &args.answer_cache {
        None => Ok((backend, meta)),
        Some(dir) => with_answer_cache(backend, dir, &identity, meta),
    }
}

/// `backend` behind the answer cache in `dir` for the model of `identity`.
fn with_answer_cache(
    backend: Arc<dyn InferenceBackend>,
    dir: &std::path::Path,
    identity: &AnswerIdentity,
    mut meta: BackendMeta,
) -> anyhow::Result<(Arc<dyn InferenceBackend>, BackendMeta)> {
    // The key that signs the answers lives outside every answer folder.
    let key_path = aisql_engine::data::cache_dir::cache_dir().join(KEY_FILE);
    let mut key_guard = WriteGuard::new();
    key_guard.add(&key_path, "the answer cache's key");
    key_guard.check(dir, "--answer-cache", OutputKind::Folder)?;
    let cache = AnswerCache::open(dir, identity, RecordKey::load_or_create(&key_path)?)?;
    errln!(
        "answer cache {}: {} answers of this model{}",
        cache.log_path().display(),
        cache.len(),
        match cache.damaged() {
            0 => String::new(),
            n => format!(
                " ({n} records skipped: damaged, cut short, written for another model \
                 identity, or not signed with {})",
                key_path.display()
            ),
        }
    )?;
    meta.answer_cache = Some(cache.log_path().display().to_string());
    Ok((Arc::new(CachedBackend::new(backend, cache)), meta))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_workers_are_told_by_their_host() {
        for addr in [
            "127.0.0.1:7878",
            "localhost:7878",
            "http://127.0.0.1:7878",
            "https://[::1]:7878/",
        ] {
            assert!(is_loopback_worker(addr), "{addr}");
        }
        for addr in ["10.0.0.2:7878", "https://gpu-1:7878", "0.0.0.0:7878"] {
            assert!(!is_loopback_worker(addr), "{addr}");
        }
    }
}
