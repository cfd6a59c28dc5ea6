//! Loading a model (tiny, a local directory or the Hugging Face cache) into a
//! scheduled backend, and the simulation backend.

use std::sync::Arc;

use aisql_models::Tokenizer;

use super::{
    ModelExecutor, ScheduledBackend, SchedulerConfig, SimExecutor, default_host_kv_budget_bytes,
    gpu_kv_budget_bytes,
};
use crate::error::{EngineError, Result};
use crate::inference::backend::Answerer;
use crate::inference::backend_meta::BackendMeta;
use crate::inference::lazy::BackendFacts;

/// Which model to load and how to schedule it.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    /// `tiny`, a local directory, or a Hugging Face id in the local cache.
    pub model: String,
    /// CUDA device, `None` for the CPU.
    pub gpu: Option<usize>,
    /// Weights format (default: f32 on CPU, bf16 on GPU); a GGUF model's own.
    pub dtype: Option<aisql_models::Precision>,
    /// Scheduling knobs.
    pub scheduler: SchedulerConfig,
    /// The KV budget was not chosen by the user: on a GPU, replace it by
    /// [`gpu_kv_budget_bytes`] of the memory left free once the weights are loaded.
    pub kv_budget_from_device: bool,
    /// The host KV tier was not chosen by the user: on a GPU it gets
    /// [`default_host_kv_budget_bytes`]; on the CPU, where the KV already lives
    /// in host memory, none.
    pub host_kv_from_memory: bool,
    /// The on-disk KV store (`--kv-store`), if any.
    pub kv_store: Option<KvStoreSpec>,
}

/// Where documents' KV is kept across queries and restarts, and how much of
/// it ([`crate::inference::kv_store`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvStoreSpec {
    /// The store's folder (`--kv-store`).
    pub dir: std::path::PathBuf,
    /// Its bound in bytes (`--kv-store-size`).
    pub size_bytes: u64,
}

/// The store's bound when none is given: 16 GiB.
pub const DEFAULT_KV_STORE_BYTES: u64 = 16 << 30;

/// The folder `--model tiny` is kept in (whether generated yet or not).
pub fn tiny_model_path() -> std::path::PathBuf {
    crate::data::cache_dir::cache_dir().join("models/tiny-qwen3-seed0")
}

/// The files and folders the model named `model` is read from, for the write
/// rule ([`crate::data::write_guard`]): the tiny model's folder, a local model
/// folder, or a Hugging Face id's files and snapshot folder in the local cache.
/// Nothing is generated or loaded; an id not in the cache reads nothing.
pub fn model_input_paths(model: &str) -> Vec<std::path::PathBuf> {
    if model == "tiny" {
        return vec![tiny_model_path()];
    }
    let local = std::path::Path::new(model);
    if local.exists() {
        return vec![local.to_path_buf()];
    }
    match aisql_models::ModelFiles::resolve(model) {
        Ok(files) => {
            let mut paths: Vec<std::path::PathBuf> = files.weights.clone();
            paths.extend(files.config.clone());
            paths.extend(files.tokenizer.clone());
            paths.extend(files.weights[0].parent().map(std::path::Path::to_path_buf));
            paths
        }
        Err(_) => Vec::new(),
    }
}

/// Where `--model tiny` lives: `models/tiny-qwen3-seed0` under aisql's cache folder
/// ([`crate::data::cache_dir::cache_dir`]), generated on first use, deterministic (seed 0),
/// and sealed: a copy whose files no longer match the seal is generated again.
pub fn tiny_model_dir() -> Result<std::path::PathBuf> {
    use crate::data::cache_dir::{SEAL_FILE, check_seal, files_of, seal};
    let base = crate::data::cache_dir::cache_dir();
    let dir = tiny_model_path();
    if dir.exists() {
        match check_seal(&dir, &dir.join(SEAL_FILE)) {
            Ok(()) => return Ok(dir),
            Err(why) => {
                let _ = crate::errln!(
                    "note: the cached tiny model at {} is damaged ({why}); generating it again",
                    dir.display()
                );
                std::fs::remove_dir_all(&dir).map_err(|e| EngineError::io(&dir, e))?;
            }
        }
    }
    let tmp = base.join(format!("models/.tiny-qwen3-seed0.{}", std::process::id()));
    aisql_models::tiny::write_tiny_model(&tmp, 0)?;
    seal(&tmp, &files_of(&tmp)?, &tmp.join(SEAL_FILE))?;
    std::fs::create_dir_all(dir.parent().expect("has parent"))
        .map_err(|e| EngineError::io(&dir, e))?;
    // Another process may have placed its copy first: then use that one.
    if std::fs::rename(&tmp, &dir).is_err() && check_seal(&dir, &dir.join(SEAL_FILE)).is_err() {
        return Err(EngineError::Inference(format!(
            "could not place the tiny model at {}",
            dir.display()
        )));
    }
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(dir)
}

/// Where the model named `model` is read from: the generated tiny model's folder
/// for `tiny`, else `model` itself (a directory or a Hugging Face id).
pub fn model_source(model: &str) -> Result<String> {
    Ok(if model == "tiny" {
        tiny_model_dir()?.display().to_string()
    } else {
        model.to_string()
    })
}

/// Loads the model of `spec` and wraps it in the scheduled backend. Also returns
/// what describes it (model, device, dtype, budgets).
pub fn load_model_backend(
    spec: &ModelSpec,
) -> Result<(Arc<ScheduledBackend<ModelExecutor>>, BackendMeta)> {
    let source = model_source(&spec.model)?;
    let device = aisql_models::device(spec.gpu)?;
    let (model, tokenizer) = aisql_models::load(&source, &device, spec.dtype)?;
    let mut meta = BackendMeta::default();
    let free = if spec.kv_budget_from_device {
        aisql_models::device_free_memory(&device)
    } else {
        None
    };
    meta.device_free_bytes_after_weights = free;
    let scheduler = scheduler_config(spec, free);
    meta.model = Some(spec.model.clone());
    meta.model_path = Some(source);
    meta.device = Some(match spec.gpu {
        Some(n) => format!("cuda:{n}"),
        None => "cpu".to_string(),
    });
    meta.dtype = Some(model.weights_name().to_string());
    meta.prefix_cache = Some(scheduler.prefix_cache);
    meta.kv_budget_bytes = Some(scheduler.kv_budget_bytes);
    meta.kv_host_budget_bytes = Some(scheduler.host_kv_budget_bytes);
    meta.batch_tokens = Some(scheduler.batch_tokens);
    let exec = ModelExecutor::new(Arc::new(model), &tokenizer, ModelExecutor::NAME)?;
    let mut backend = ScheduledBackend::new(exec, tokenizer, scheduler);
    if let Some(store) = &spec.kv_store {
        let (weights_sha256, tokenizer_sha256) = model_digests(&spec.model)?;
        let identity = crate::inference::kv_store::KvIdentity {
            weights_sha256,
            tokenizer_sha256,
            dtype: meta.dtype().to_string(),
            device: if spec.gpu.is_some() { "cuda" } else { "cpu" }.to_string(),
        };
        let key_path =
            crate::data::cache_dir::cache_dir().join(crate::inference::answer_cache::KEY_FILE);
        let key = crate::inference::answer_cache::RecordKey::load_or_create(&key_path)?;
        let opened = crate::inference::kv_store::KvStore::open(
            &store.dir,
            &identity,
            key,
            store.size_bytes,
        )?;
        meta.kv_store = Some(store.dir.display().to_string());
        backend = backend.with_kv_store(Arc::new(opened));
    }
    Ok((Arc::new(backend), meta))
}

/// `spec`'s scheduling, its budgets filled where the user chose none:
/// with `device_free_bytes` (the memory a GPU has left once the weights are
/// in) the device KV budget is a share of it; a GPU gets a host KV tier, the
/// CPU (whose KV is in host memory already) none.
fn scheduler_config(spec: &ModelSpec, device_free_bytes: Option<usize>) -> SchedulerConfig {
    let mut scheduler = spec.scheduler.clone();
    if let Some(free) = device_free_bytes {
        scheduler.kv_budget_bytes = gpu_kv_budget_bytes(free);
    }
    if spec.host_kv_from_memory {
        scheduler.host_kv_budget_bytes = match spec.gpu {
            Some(_) => default_host_kv_budget_bytes(),
            None => 0,
        };
    }
    scheduler
}

/// What the backend [`load_model_backend`] would make of `spec` says of
/// itself, read from the model's configuration without its weights, so that
/// sessions can size their tables and plan before the model is first needed
/// ([`crate::inference::lazy`]). `None` on a GPU, whose budgets depend on
/// the memory when its weights are in (the device KV budget a share of what
/// they leave, the host tier's of what the host has then).
pub fn describe_model_backend(spec: &ModelSpec) -> Result<Option<BackendFacts>> {
    if spec.gpu.is_some() {
        return Ok(None);
    }
    let source = model_source(&spec.model)?;
    let device = aisql_models::device(spec.gpu)?;
    let (config, dtype) = aisql_models::describe(&source, &device, spec.dtype)?;
    let scheduler = scheduler_config(spec, None);
    Ok(Some(BackendFacts {
        name: ModelExecutor::NAME.to_string(),
        reuses_work: scheduler.prefix_cache,
        kv_capacity_tokens: super::kv_capacity_tokens(&scheduler, config.kv_bytes_per_token(dtype)),
        context_positions: Some(config.max_position_embeddings),
        embedding_dims: u32::try_from(config.hidden_size).ok(),
        host_memory_allowance: super::host_memory_allowance(&scheduler),
    }))
}

/// What the answers of `model` (as [`ModelSpec::model`] names it) depend on besides their prompts
/// ([`crate::inference::answer_cache`]): the model as named, the SHA-256 of its weights and
/// tokenizer, `dtype` (as the loaded model reports it) and the prompt format.
/// Files in a Hugging Face cache are named by their SHA-256 already
/// (`blobs/<sha256>`), so a hub model is not read again; other weights are hashed.
pub fn answer_identity(
    model: &str,
    dtype: &str,
    prompt_format: crate::inference::prompt::PromptFormat,
) -> Result<crate::inference::answer_cache::AnswerIdentity> {
    let (weights_sha256, tokenizer_sha256) = model_digests(model)?;
    Ok(crate::inference::answer_cache::AnswerIdentity {
        model: model.to_string(),
        weights_sha256,
        tokenizer_sha256,
        dtype: dtype.to_string(),
        prompt_format: prompt_format.name().to_string(),
    })
}

/// SHA-256 over the SHA-256s of `model`'s weight files, in load order, and
/// the SHA-256 of its tokenizer (a GGUF's own file; the vendored tokenizer's
/// when the model has none): what its outputs depend on besides dtype and
/// prompt.
fn model_digests(model: &str) -> Result<(String, String)> {
    use crate::data::cache_dir::sha256_of;
    use sha2::{Digest, Sha256};
    let source = model_source(model)?;
    let files = aisql_models::ModelFiles::resolve(&source)?;
    let file_hash = |path: &std::path::Path| -> Result<String> {
        let real = std::fs::canonicalize(path).map_err(|e| EngineError::io(path, e))?;
        let name = real.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let in_blobs = real
            .parent()
            .and_then(|p| p.file_name())
            .is_some_and(|p| p == "blobs");
        if in_blobs && name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok(name.to_ascii_lowercase());
        }
        sha256_of(&real).map_err(|e| EngineError::io(&real, e))
    };
    let mut weights = Sha256::new();
    for path in &files.weights {
        weights.update(file_hash(path)?.as_bytes());
    }
    let tokenizer_sha256 = match (&files.tokenizer, files.gguf_file()) {
        // A GGUF carries its tokenizer: the file's hash covers it.
        (_, Some(gguf)) => file_hash(gguf)?,
        (Some(path), None) => file_hash(path)?,
        (None, None) => aisql_models::tokenizer::VENDORED_SHA256.to_string(),
    };
    Ok((hex::encode(weights.finalize()), tokenizer_sha256))
}

/// The simulation backend: the model backend's scheduler over a virtual KV cache
/// of `kv_bytes_per_token` per position, answering from `answers` (the
/// benchmark's oracle over reference labels, say).
pub fn simulation_backend(
    answers: Arc<dyn Answerer>,
    config: SchedulerConfig,
    kv_bytes_per_token: usize,
) -> Result<Arc<ScheduledBackend<SimExecutor>>> {
    Ok(Arc::new(ScheduledBackend::new(
        SimExecutor::new(answers, kv_bytes_per_token),
        Tokenizer::vendored()?,
        config,
    )))
}
