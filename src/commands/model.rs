//! `aisql model tiny` and `aisql model generate`.

use anyhow::Context;

use super::UsageError;
use crate::cli::{GenerateArgs, GenerateFormat, ModelCommand};

pub fn run(cmd: ModelCommand) -> anyhow::Result<()> {
    match cmd {
        ModelCommand::Tiny { out, seed } => {
            aisql_models::tiny::write_tiny_model(&out, seed)
                .with_context(|| format!("writing the tiny model to {}", out.display()))?;
            println!("tiny Qwen3 (seed {seed}) written to {}", out.display());
            Ok(())
        }
        ModelCommand::Generate(args) => generate(&args),
    }
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
