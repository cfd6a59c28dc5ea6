//! Result rows on stdout (`--format table|csv|json`) and in a file (`--output`,
//! by extension), and the model work summed up on stderr after them, shared by
//! `aisql query` and `aisql sql`.

use std::path::Path;

use aisql_engine::output::{write_file_atomic, write_parquet};
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::util::pretty::pretty_format_batches;

use super::UsageError;
use crate::cli::{RowFormat, RowOutputArgs};

/// The format `--output FILE` names by its extension; checked before any work.
pub fn output_format(path: &Path) -> anyhow::Result<Option<RowFormat>> {
    match path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        Some("parquet") => Ok(None),
        Some("csv") => Ok(Some(RowFormat::Csv)),
        Some("json") => Ok(Some(RowFormat::Json)),
        _ => Err(UsageError(format!(
            "--output {}: name a .parquet, .csv or .json file",
            path.display()
        ))
        .into()),
    }
}

/// `batch` as CSV or JSON text.
fn render(batch: &RecordBatch, format: RowFormat) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    match format {
        RowFormat::Table => {
            out.extend(
                pretty_format_batches(std::slice::from_ref(batch))?
                    .to_string()
                    .bytes(),
            );
            out.push(b'\n');
        }
        RowFormat::Csv => {
            let mut w = datafusion::arrow::csv::WriterBuilder::new()
                .with_header(true)
                .build(&mut out);
            w.write(batch)?;
        }
        RowFormat::Json => {
            let mut w = datafusion::arrow::json::ArrayWriter::new(&mut out);
            w.write(batch)?;
            w.finish()?;
            drop(w);
            out.push(b'\n');
        }
    }
    Ok(out)
}

/// Prints up to `--limit` rows and saves all of them to `--output`.
pub fn emit(rows: &RecordBatch, args: &RowOutputArgs, runtime_s: f64) -> anyhow::Result<()> {
    if let Some(path) = &args.output {
        save(rows, path)?;
    }
    let shown = rows.slice(0, rows.num_rows().min(args.limit));
    show(&shown, rows.num_rows() as u64, args, runtime_s)
}

/// Prints `shown`, the first rows of a result of `total` rows (saved already).
pub fn show(
    shown: &RecordBatch,
    total: u64,
    args: &RowOutputArgs,
    runtime_s: f64,
) -> anyhow::Result<()> {
    use std::io::Write;
    std::io::stdout().write_all(&render(shown, args.format)?)?;
    eprintln!(
        "{total} row{} in {runtime_s:.3} s{}{}",
        if total == 1 { "" } else { "s" },
        if total > shown.num_rows() as u64 {
            format!(" ({} shown)", shown.num_rows())
        } else {
            String::new()
        },
        args.output
            .as_ref()
            .map(|p| format!("; saved to {}", p.display()))
            .unwrap_or_default()
    );
    Ok(())
}

/// Writes `rows` to `path` whole or not at all.
fn save(rows: &RecordBatch, path: &Path) -> anyhow::Result<()> {
    let written = match output_format(path)? {
        None => write_parquet(path, rows).map_err(anyhow::Error::from),
        Some(format) => render(rows, format).and_then(|bytes| Ok(write_file_atomic(path, &bytes)?)),
    };
    if written.is_err() {
        let _ = std::fs::remove_file(aisql_engine::output::temp_path(path));
    }
    written
}

/// The model work of a finished query on stderr: fresh tokens, and what the
/// answer cache answered and what it asked of the model.
pub fn report_work(measurements: &serde_json::Map<String, serde_json::Value>) {
    if let Some(fresh) = measurements.get("fresh_tokens") {
        eprintln!("fresh tokens: {fresh} (prompt positions computed by the model)");
    }
    if let (Some(reused), Some(asked)) = (
        measurements.get("answer_cache_reused"),
        measurements.get("answer_cache_asked"),
    ) {
        eprintln!("answer cache: {reused} answers reused, {asked} questions asked of the model");
    }
}
