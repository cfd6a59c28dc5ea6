//! `aisql model tiny`, `aisql model generate` and `aisql model calibrate`.

use anyhow::Context;

use super::UsageError;
use crate::cli::{CalibrateArgs, GenerateArgs, GenerateFormat, ModelCommand};

pub fn run(cmd: ModelCommand) -> anyhow::Result<()> {
    match cmd {
        ModelCommand::Tiny { out, seed } => {
            aisql_models::tiny::write_tiny_model(&out, seed)
                .with_context(|| format!("writing the tiny model to {}", out.display()))?;
            println!("tiny Qwen3 (seed {seed}) written to {}", out.display());
            Ok(())
        }
        ModelCommand::Generate(args) => generate(&args),
        ModelCommand::Calibrate(args) => calibrate(&args),
    }
}

/// `aisql model calibrate`: the model's throughput profile, measured through
/// the engine's scheduler and kept where estimates look for it.
fn calibrate(args: &CalibrateArgs) -> anyhow::Result<()> {
    let gpu = super::backend::one_gpu(&args.model, "a profile is of one model on one device")?;
    if args.model.name == "tiny" {
        eprintln!("{}", super::backend::TINY_MODEL_NOTE);
    }
    let spec = aisql_engine::scheduler::ModelSpec {
        model: args.model.name.clone(),
        gpu,
        dtype: super::backend::dtype(&args.model)?,
        scheduler: Default::default(),
        kv_budget_from_device: true,
        host_kv_from_memory: true,
    };
    let (backend, meta) = aisql_engine::scheduler::load_model_backend(&spec)
        .with_context(|| format!("loading model {:?}", args.model.name))?;
    let text = |k: &str| super::backend::meta_text(&meta, k).to_string();
    let (dtype, device) = (text("dtype"), text("device"));
    let bytes_per_token = {
        use aisql_engine::scheduler::Executor as _;
        backend.executor().kv_bytes_per_token()
    };
    eprintln!("measuring {} {dtype} on {device} …", args.model.name);
    let profile = aisql_engine::estimate::calibration::measure(
        backend.as_ref(),
        bytes_per_token,
        (&args.model.name, &dtype, &device),
        aisql_bench::run_file::now_utc(),
    )?;
    let path = profile.save()?;
    match args.format {
        GenerateFormat::Json => println!("{}", serde_json::to_string_pretty(&profile)?),
        GenerateFormat::Text => {
            for w in &profile.workloads {
                let tokens = w.fresh_tokens + w.decoded;
                println!(
                    "{:<14} {:>8} fresh tokens, {:>8} decoded, {:>7.3} s ({:.0} tokens/s)",
                    w.name,
                    w.fresh_tokens,
                    w.decoded,
                    w.seconds,
                    tokens as f64 / w.seconds.max(1e-9)
                );
            }
            println!(
                "per fresh token {:.3e} s, per attended position {:.3e} s, per decoded token {:.3e} s",
                profile.seconds_per_token,
                profile.seconds_per_attended,
                profile.seconds_per_decoded
            );
        }
    }
    eprintln!("profile kept in {}", path.display());
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
        GenerateFormat::Text => println!("{text}"),
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
            println!("{out}");
        }
    }
    Ok(())
}
