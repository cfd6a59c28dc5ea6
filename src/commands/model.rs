//! `aisql model tiny|random|gguf|bench|generate|calibrate`.

use std::path::Path;

use aisql_engine::{errln, outln};
use anyhow::Context;

use super::UsageError;
use crate::cli::{
    CalibrateArgs, GenerateArgs, GenerateFormat, ModelBenchArgs, ModelCommand, RandomShape,
};

pub fn run(cmd: ModelCommand) -> anyhow::Result<()> {
    match cmd {
        ModelCommand::Tiny { out, seed, force } => {
            model_out(&out, force)?;
            aisql_models::tiny::write_tiny_model(&out, seed)
                .with_context(|| format!("writing the tiny model to {}", out.display()))?;
            outln!("tiny Qwen3 (seed {seed}) written to {}", out.display())?;
            Ok(())
        }
        ModelCommand::Random {
            shape,
            out,
            seed,
            force,
        } => random(shape, &out, seed, force),
        ModelCommand::Gguf {
            model,
            out,
            file_type,
        } => gguf(&model, &out, &file_type),
        ModelCommand::Bench(args) => bench(&args),
        ModelCommand::Generate(args) => generate(&args),
        ModelCommand::Calibrate(args) => calibrate(&args),
    }
}

/// The files `aisql model tiny` and `aisql model random` write.
const MODEL_FILES: [&str; 3] = ["config.json", "model.safetensors", "tokenizer.json"];

/// Checks the `--out` folder of a written model: new or empty; or, with
/// `force`, a model folder (config.json and safetensors weights) holding
/// nothing but [`MODEL_FILES`], whose files are then removed (a link among them
/// is removed, never written through).
fn model_out(out: &Path, force: bool) -> anyhow::Result<()> {
    let entries: Vec<std::path::PathBuf> = match std::fs::symlink_metadata(out) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(anyhow::Error::new(e).context(format!("--out {}", out.display()))),
        Ok(meta) if !meta.is_dir() => {
            return Err(UsageError(format!(
                "--out {}: exists and is not a folder; aisql does not write over files",
                out.display()
            ))
            .into());
        }
        Ok(_) => std::fs::read_dir(out)
            .and_then(|entries| entries.map(|e| e.map(|e| e.path())).collect())
            .with_context(|| format!("--out {}", out.display()))?,
    };
    if entries.is_empty() {
        return Ok(());
    }
    let only_model_files = entries.iter().all(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| MODEL_FILES.contains(&n))
    });
    let is_model = only_model_files && aisql_models::ModelFiles::from_dir(out).is_ok();
    match (force, is_model) {
        (false, true) => Err(UsageError(format!(
            "--out {}: holds a model already; aisql does not write over a model unless \
             --force names the replacement",
            out.display()
        ))
        .into()),
        (false, false) => Err(UsageError(format!(
            "--out {}: exists and is not an empty folder; aisql does not write over files",
            out.display()
        ))
        .into()),
        (true, false) => Err(UsageError(format!(
            "--out {}: --force replaces a model folder (config.json, model.safetensors, \
             tokenizer.json and nothing else), and this folder holds other files; choose a \
             new folder",
            out.display()
        ))
        .into()),
        (true, true) => {
            for path in entries {
                std::fs::remove_file(&path)
                    .with_context(|| format!("replacing {}", path.display()))?;
            }
            Ok(())
        }
    }
}

/// `aisql model random`: a random model of a released shape, into a new folder
/// (or over a model folder, with `force`).
fn random(shape: RandomShape, out: &Path, seed: u64, force: bool) -> anyhow::Result<()> {
    model_out(out, force)?;
    let (name, cfg) = match shape {
        RandomShape::Qwen3_0_6b => ("qwen3-0.6b", aisql_models::tiny::qwen3_0_6b_config()),
        RandomShape::Tiny => ("tiny", aisql_models::tiny::tiny_config()),
    };
    aisql_models::tiny::write_model(out, &cfg, seed)
        .with_context(|| format!("writing the random model to {}", out.display()))?;
    outln!(
        "random Qwen3 of shape {name} (seed {seed}) written to {}",
        out.display()
    )?;
    Ok(())
}

/// `aisql model gguf`: a safetensors model written as a GGUF file.
fn gguf(model: &str, out: &Path, file_type: &str) -> anyhow::Result<()> {
    let file_type: aisql_models::gguf::write::FileType = file_type.parse().map_err(|_| {
        UsageError(format!(
            "--type {file_type:?}: use {}",
            aisql_models::gguf::write::FileType::CHOICES
        ))
    })?;
    if !out
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        return Err(UsageError(format!(
            "--out {}: name the file *.gguf, so that --model finds it as a GGUF model",
            out.display()
        ))
        .into());
    }
    let source = aisql_engine::inference::scheduler::model_source(model)?;
    let files = aisql_models::ModelFiles::resolve(&source)
        .with_context(|| format!("finding model {model:?}"))?;
    // The one write rule: never into the model's own folder (or the Hugging
    // Face cache it lives in).
    let mut guard = aisql_engine::data::write_guard::WriteGuard::new();
    for path in aisql_engine::inference::scheduler::model_input_paths(model)
        .into_iter()
        .chain(files.config.clone())
        .chain(
            files
                .weights
                .iter()
                .filter_map(|w| w.parent().map(Path::to_path_buf)),
        )
    {
        guard.add(&path, format!("the model {model:?}"));
    }
    guard.check(
        out,
        "--out",
        aisql_engine::data::write_guard::OutputKind::File,
    )?;
    let written = aisql_models::gguf::write::write_gguf(&files, out, file_type)
        .with_context(|| format!("writing {}", out.display()))?;
    outln!(
        "{} tensors, {:.1} MB, written to {}",
        written.tensors,
        written.bytes as f64 / 1e6,
        out.display()
    )?;
    Ok(())
}

/// `aisql model bench`: the model's prefill speed over packed prompts of
/// distinct pseudo-random tokens or, with `--decode-tokens N`, its greedy
/// decoding speed: `N` tokens for each of the sequences, all continuing one
/// shared cached prompt.
fn bench(args: &ModelBenchArgs) -> anyhow::Result<()> {
    let (model, _) = super::backend::load_model(&args.model)?;
    let context = model.config().max_position_embeddings;
    if args.prompt_tokens.saturating_add(args.decode_tokens) > context {
        return Err(UsageError(format!(
            "--prompt-tokens {} + --decode-tokens {}: the model's context holds {context} positions",
            args.prompt_tokens, args.decode_tokens
        ))
        .into());
    }
    let vocab = model.config().vocab_size as u64;
    // Ids in [1000, 100000) where the vocabulary allows, distinct per prompt and
    // round so no prefix is shared and nothing is cached.
    let prompt = |round: u64, s: u64, len: usize| -> Vec<u32> {
        (0..len as u64)
            .map(|i| {
                let x =
                    (round * 1_000_003 + s * 7919 + i).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20;
                (1000.min(vocab - 1) + x % vocab.saturating_sub(1000).clamp(1, 99_000)) as u32
            })
            .collect()
    };
    let prompts = |round: u64| -> Vec<Vec<u32>> {
        (0..args.sequences as u64)
            .map(|s| prompt(round, s, args.prompt_tokens))
            .collect()
    };
    let forward = |tokens: &[Vec<u32>]| -> anyhow::Result<()> {
        let items: Vec<aisql_models::Continuation> = tokens
            .iter()
            .map(|t| aisql_models::Continuation::new(None, t))
            .collect();
        model.prefill_batch(&items)?;
        Ok(())
    };
    // Decoding: the prompt's first P - 1 tokens are one cached prefix (prefilled
    // before the clock starts, as a document is), each sequence adds one token of
    // its own, and the timed generation feeds that token and the N - 1 generated
    // after it: N forwards of one position per sequence, N tokens each.
    let decode = |round: u64| -> anyhow::Result<(f64, Option<Usage>)> {
        let prefix = if args.prompt_tokens > 1 {
            Some(model.prefill(None, &prompt(round, 0, args.prompt_tokens - 1))?)
        } else {
            None
        };
        let own: Vec<Vec<u32>> = (0..args.sequences as u64)
            .map(|s| prompt(round, s + 1, 1))
            .collect();
        let requests: Vec<aisql_models::GenerateRequest> = own
            .iter()
            .map(|t| aisql_models::GenerateRequest::new(prefix.as_ref(), t, args.decode_tokens))
            .collect();
        let (usage0, t0) = (Usage::now(), std::time::Instant::now());
        let generated = model.generate(&requests, &[], args.sequences)?;
        let wall = t0.elapsed().as_secs_f64();
        let usage = Usage::since(usage0);
        if let Some(h) = prefix {
            h.release();
        }
        let made: usize = generated.iter().map(|g| g.token_ids.len()).sum();
        anyhow::ensure!(
            made == args.sequences * args.decode_tokens,
            "decoding made {made} tokens, not {} × {}",
            args.sequences,
            args.decode_tokens
        );
        Ok((wall, usage))
    };
    let measure = |round: u64| -> anyhow::Result<(f64, Option<Usage>)> {
        if args.decode_tokens > 0 {
            return decode(round);
        }
        let input = prompts(round);
        let (usage0, t0) = (Usage::now(), std::time::Instant::now());
        forward(&input)?;
        let wall = t0.elapsed().as_secs_f64();
        Ok((wall, Usage::since(usage0)))
    };
    // An uncounted warm-up.
    measure(0)?;
    let threads = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let (tokens, what) = match args.decode_tokens {
        0 => (args.prompt_tokens * args.sequences, "prompt"),
        n => (n * args.sequences, "decoded"),
    };
    let mut rates = Vec::with_capacity(args.rounds);
    for round in 1..=args.rounds {
        let (wall, usage) = measure(round as u64)?;
        let cpu = usage.map(|u| u.cpu_s);
        let rate = tokens as f64 / wall;
        rates.push(rate);
        match args.format {
            GenerateFormat::Json => outln!(
                "{}",
                serde_json::json!({
                    "model": args.model.name,
                    "weights": model.weights_name(),
                    "device": if model.device().is_cpu() { "cpu" } else { "cuda" },
                    "threads": threads,
                    "prompt_tokens": args.prompt_tokens,
                    "sequences": args.sequences,
                    "decode_tokens": args.decode_tokens,
                    "tokens": tokens,
                    "wall_s": wall,
                    "cpu_s": cpu,
                    "tokens_per_s": rate,
                    "cpu_s_per_token": cpu.map(|c| c / tokens as f64),
                    "minor_faults": usage.map(|u| u.minor_faults),
                })
            )?,
            GenerateFormat::Text => outln!(
                "round {round}: {tokens} {what} tokens in {wall:.3} s, {rate:.1} tokens/s{}",
                usage.map_or(String::new(), |u| format!(
                    ", {:.3} CPU s ({:.2} cores busy), {} minor page faults",
                    u.cpu_s,
                    u.cpu_s / wall,
                    u.minor_faults
                ))
            )?,
        }
    }
    if args.format == GenerateFormat::Text {
        rates.sort_by(f64::total_cmp);
        let shape = match args.decode_tokens {
            0 => format!("{} × {} prompt tokens", args.sequences, args.prompt_tokens),
            n => format!(
                "{} × {n} tokens decoded after a shared {}-token prompt",
                args.sequences, args.prompt_tokens
            ),
        };
        outln!(
            "{} {} on {} threads, {shape}: median {:.1} tokens/s",
            args.model.name,
            model.weights_name(),
            threads,
            rates[rates.len() / 2]
        )?;
    }
    Ok(())
}

/// What this process has used, where the platform says: CPU seconds (user +
/// system) and minor page faults (pages the kernel mapped in, 4 KiB each unless
/// huge).
#[derive(Debug, Clone, Copy)]
struct Usage {
    cpu_s: f64,
    minor_faults: u64,
}

impl Usage {
    fn now() -> Option<Self> {
        #[cfg(unix)]
        {
            let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
            // SAFETY: getrusage fills the struct it is given; RUSAGE_SELF is always valid.
            let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
            if rc != 0 {
                return None;
            }
            // SAFETY: initialised by the successful call above.
            let u = unsafe { usage.assume_init() };
            let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
            Some(Self {
                cpu_s: secs(u.ru_utime) + secs(u.ru_stime),
                minor_faults: u.ru_minflt as u64,
            })
        }
        #[cfg(not(unix))]
        None
    }

    /// What was used since `start` (a [`Usage::now`]).
    fn since(start: Option<Self>) -> Option<Self> {
        let (now, start) = (Self::now()?, start?);
        Some(Self {
            cpu_s: now.cpu_s - start.cpu_s,
            minor_faults: now.minor_faults.saturating_sub(start.minor_faults),
        })
    }
}

/// `aisql model calibrate`: the model's throughput profile, measured through
/// the engine's scheduler and kept where estimates look for it.
fn calibrate(args: &CalibrateArgs) -> anyhow::Result<()> {
    let gpu = super::backend::one_gpu(&args.model, "a profile is of one model on one device")?;
    if args.model.name == "tiny" {
        errln!("{}", super::backend::TINY_MODEL_NOTE)?;
    }
    let spec = aisql_engine::inference::scheduler::ModelSpec {
        model: args.model.name.clone(),
        gpu,
        dtype: super::backend::dtype(&args.model.choice())?,
        scheduler: Default::default(),
        kv_budget_from_device: true,
        host_kv_from_memory: true,
        kv_store: None,
    };
    let (backend, meta) = aisql_engine::inference::scheduler::load_model_backend(&spec)
        .with_context(|| format!("loading model {:?}", args.model.name))?;
    let (dtype, device) = (meta.dtype().to_string(), meta.device().to_string());
    let bytes_per_token = {
        use aisql_engine::inference::scheduler::Executor as _;
        backend.executor().kv_bytes_per_token()
    };
    errln!("measuring {} {dtype} on {device} …", args.model.name)?;
    let backend: std::sync::Arc<dyn aisql_engine::inference::backend::InferenceBackend> = backend;
    let profile = aisql_engine::estimate::calibration::measure(
        &backend,
        bytes_per_token,
        (&args.model.name, &dtype, &device),
        aisql_bench::run_file::now_utc(),
    )?;
    let path = profile.save()?;
    match args.format {
        GenerateFormat::Json => outln!("{}", serde_json::to_string_pretty(&profile)?)?,
        GenerateFormat::Text => {
            for w in &profile.workloads {
                let tokens = w.fresh_tokens + w.decoded;
                outln!(
                    "{:<14} {:>8} fresh tokens, {:>8} decoded, {:>7.3} s ({:.0} tokens/s)",
                    w.name,
                    w.fresh_tokens,
                    w.decoded,
                    w.seconds,
                    tokens as f64 / w.seconds.max(1e-9)
                )?;
            }
            outln!(
                "per fresh token {:.3e} s, per attended position {:.3e} s, per decoded token {:.3e} s",
                profile.seconds_per_token,
                profile.seconds_per_attended,
                profile.seconds_per_decoded
            )?;
        }
    }
    errln!("profile kept in {}", path.display())?;
    Ok(())
}

/// `aisql model generate`: greedy decoding of one prompt, stopping at the
/// tokenizer's stop tokens.
fn generate(args: &GenerateArgs) -> anyhow::Result<()> {
    if args.prompt.is_empty() {
        return Err(UsageError("--prompt is empty: give the text to continue".into()).into());
    }
    let (model, tokenizer) = super::backend::load_model(&args.model)?;
    let prompt = tokenizer.encode(&args.prompt)?;
    // Checked here too (the model refuses it as well) to name the flag and say
    // what fits.
    let context = model.config().max_position_embeddings;
    if prompt.len() >= context {
        return Err(UsageError(format!(
            "--prompt is {} tokens: the model's context holds {context} positions",
            prompt.len()
        ))
        .into());
    }
    if prompt.len().saturating_add(args.max_tokens) > context {
        return Err(UsageError(format!(
            "--max-tokens {}: the {}-token prompt and the new tokens exceed the model's \
             context of {context} positions; at most {} new tokens fit",
            args.max_tokens,
            prompt.len(),
            context - prompt.len()
        ))
        .into());
    }
    let request = aisql_models::GenerateRequest::new(None, &prompt, args.max_tokens);
    let generation = model
        .generate(&[request], &tokenizer.stop_ids(), 1)?
        .remove(0);
    let text = tokenizer.decode(&generation.token_ids)?;
    match args.format {
        GenerateFormat::Text => outln!("{text}")?,
        GenerateFormat::Json => {
            let finish = match generation.finish {
                aisql_models::FinishReason::Stop => "stop",
                aisql_models::FinishReason::Length => "length",
            };
            let out = serde_json::json!({
                "prompt_token_ids": prompt,
                "token_ids": generation.token_ids,
                "text": text,
                "finish": finish,
            });
            outln!("{out}")?;
        }
    }
    Ok(())
}
