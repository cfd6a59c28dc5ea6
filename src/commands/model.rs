//! `aisql model tiny`.

use anyhow::Context;

use crate::cli::ModelCommand;

pub fn run(cmd: ModelCommand) -> anyhow::Result<()> {
    match cmd {
        ModelCommand::Tiny { out, seed } => {
            aisql_models::tiny::write_tiny_model(&out, seed)
                .with_context(|| format!("writing the tiny model to {}", out.display()))?;
            println!("tiny Qwen3 (seed {seed}) written to {}", out.display());
            Ok(())
        }
    }
}
