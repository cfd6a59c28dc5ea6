//! Result rows on stdout (`--format table|csv|json`) and in a file (`--output`,
//! by extension), shared by `aisql query` and `aisql sql`.

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
    use std::io::Write;
    std::io::stdout().write_all(&render(&shown, args.format)?)?;
    let n = rows.num_rows();
    eprintln!(
        "{n} row{} in {runtime_s:.3} s{}{}",
        if n == 1 { "" } else { "s" },
        if n > args.limit {
            format!(" ({} shown)", args.limit)
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
