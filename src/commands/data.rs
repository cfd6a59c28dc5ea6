//! `aisql data generate|fetch`.

use aisql_bench::layout;
use aisql_engine::outln;
use anyhow::Context;

use crate::cli::DataCommand;

pub fn run(cmd: DataCommand) -> anyhow::Result<()> {
    match cmd {
        DataCommand::Generate { sf, root } => {
            let root = root.unwrap_or_else(layout::standin_root);
            let summary = aisql_standin::generate(&root, sf)
                .with_context(|| format!("generating the stand-in corpus at sf {sf}"))?;
            outln!(
                "corpus {} collection {} (sf {})",
                summary.corpus_id,
                summary.collection_id,
                summary.scale_factor
            )?;
            for (table, t) in &summary.tables {
                outln!(
                    "  {table:<18} {:>9} rows {:>12} bytes {:>7.2} s",
                    t.rows,
                    t.bytes,
                    t.seconds
                )?;
            }
            let labels: u64 = summary.label_rows.values().sum();
            outln!(
                "  labels: {} sets, {labels} rows, {} bytes, {:.2} s; total {:.2} s",
                summary.label_rows.len(),
                summary.label_bytes,
                summary.label_seconds,
                summary.seconds
            )?;
            outln!("stand-in corpus written to {}", root.display())?;
            Ok(())
        }
        DataCommand::Fetch { sf, dest } => {
            let dest = dest.unwrap_or_else(layout::published_cache_root);
            let source = layout::default_source()?;
            let rt = super::runtime()?;
            let summary = rt
                .block_on(layout::fetch(source, &dest, sf))
                .with_context(|| format!("fetching the published QUAIL-B data at sf {sf}"))?;
            outln!("{summary:?}")?;
            Ok(())
        }
    }
}
