//! Result rows on stdout (`--format table|csv|json`) and in a file (`--output`,
//! by extension), and the model work summed up on stderr after them, shared by
//! `aisql query` and `aisql sql`.
//!
//! The terminal table shows the first rows (`--limit`, default
//! [`crate::cli::TABLE_ROWS`]) with long cells cut; csv and json are for
//! programs and carry every row and every value unless `--limit` says otherwise.

use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Arc;

use aisql_engine::console::Stdout;
use aisql_engine::data::files::{write_file_atomic, write_parquet};
use aisql_engine::data::row_sink::{CountedRows, RowSink};
use aisql_engine::errln;
use aisql_engine::inference::work::{Sum, Work};
use datafusion::arrow::array::{Array, ArrayRef, RecordBatch, StringArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
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
pub fn render(batch: &RecordBatch, format: RowFormat) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    match format {
        RowFormat::Table => {
            out.extend(
                pretty_format_batches(&[cut_long_cells(batch)?])?
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

/// Longest text cell the terminal table prints, in characters: a table is for
/// eyes, and laying out one 20 MB cell takes a minute.
const TABLE_CELL_CHARS: usize = 200;

/// `batch` with every text value longer than [`TABLE_CELL_CHARS`] cut there
/// and marked with `…`, for the terminal table only.
fn cut_long_cells(batch: &RecordBatch) -> anyhow::Result<RecordBatch> {
    let is_text =
        |t: &DataType| matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View);
    let mut fields = Vec::with_capacity(batch.num_columns());
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(batch.num_columns());
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        if !is_text(field.data_type()) {
            fields.push(field.as_ref().clone());
            columns.push(column.clone());
            continue;
        }
        let text = cast(column, &DataType::Utf8)?;
        let text = text
            .as_any()
            .downcast_ref::<StringArray>()
            .expect("cast to Utf8 gives a StringArray");
        let cut: StringArray = text
            .iter()
            .map(|v| {
                v.map(|v| match v.char_indices().nth(TABLE_CELL_CHARS) {
                    Some((end, _)) => format!("{}…", &v[..end]),
                    None => v.to_string(),
                })
            })
            .collect();
        fields.push(Field::new(
            field.name(),
            DataType::Utf8,
            field.is_nullable(),
        ));
        columns.push(Arc::new(cut));
    }
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns,
    )?)
}

/// Prints the rows `--limit` and the format allow and saves all of them to
/// `--output`.
pub fn emit(rows: &RecordBatch, args: &RowOutputArgs, runtime_s: f64) -> anyhow::Result<()> {
    if let Some(path) = &args.output {
        save(rows, path)?;
    }
    let shown = match args.print_limit() {
        Some(limit) => rows.slice(0, rows.num_rows().min(limit)),
        None => rows.clone(),
    };
    show(&shown, rows.num_rows() as u64, args, runtime_s)
}

/// Every row printed on stdout as csv or json as it arrives, and handed on to
/// `next`: a result of any size reaches a pipe whole without being held.
pub struct PrintedRows<S> {
    printer: Printer,
    total: u64,
    next: S,
}

/// The writer of the printed text (the CSV writer, with its formats, is
/// boxed: it is many times the JSON writer's size).
enum Printer {
    Csv(Box<datafusion::arrow::csv::Writer<BufWriter<Stdout>>>),
    Json(datafusion::arrow::json::ArrayWriter<BufWriter<Stdout>>),
}

impl<S: RowSink> PrintedRows<S> {
    /// Prints rows of `schema` in `format` (csv or json) and hands them to `next`.
    pub fn new(format: RowFormat, schema: &SchemaRef, next: S) -> anyhow::Result<Self> {
        let out = BufWriter::new(Stdout);
        let printer = match format {
            RowFormat::Csv => {
                let mut w = datafusion::arrow::csv::WriterBuilder::new()
                    .with_header(true)
                    .build(out);
                // The header, even for a result without rows.
                w.write(&RecordBatch::new_empty(schema.clone()))?;
                Printer::Csv(Box::new(w))
            }
            RowFormat::Json => Printer::Json(datafusion::arrow::json::ArrayWriter::new(out)),
            RowFormat::Table => anyhow::bail!("the table format is printed from the rows' head"),
        };
        Ok(Self {
            printer,
            total: 0,
            next,
        })
    }

    /// Ends the printed text; how many rows came, and the sink they went to.
    pub fn finish(self) -> anyhow::Result<(u64, S)> {
        let mut out = match self.printer {
            Printer::Csv(w) => (*w).into_inner(),
            Printer::Json(mut w) => {
                w.finish()?;
                let mut out = w.into_inner();
                out.write_all(b"\n")?;
                out
            }
        };
        out.flush()?;
        Ok((self.total, self.next))
    }
}

impl<S: RowSink> RowSink for PrintedRows<S> {
    fn push(&mut self, batch: RecordBatch) -> aisql_engine::Result<()> {
        match &mut self.printer {
            Printer::Csv(w) => w.write(&batch)?,
            Printer::Json(w) => w.write(&batch)?,
        }
        self.total += batch.num_rows() as u64;
        self.next.push(batch)
    }
}

/// Every row of a statement printed on stdout as csv or json as it arrives
/// (`aisql sql` without `--output` or `--limit`), begun once the statement
/// is planned and its columns are known: a result larger than
/// `--memory-limit` reaches a pipe whole.
pub struct StdoutRows {
    format: RowFormat,
    printed: Option<PrintedRows<CountedRows>>,
}

impl StdoutRows {
    /// Rows to print in `format` (csv or json).
    pub fn new(format: RowFormat) -> Self {
        Self {
            format,
            printed: None,
        }
    }

    /// Begins the printed text of rows of `schema` (a CSV header).
    pub fn begin(&mut self, schema: &SchemaRef) -> anyhow::Result<()> {
        self.printed = Some(PrintedRows::new(
            self.format,
            schema,
            CountedRows::default(),
        )?);
        Ok(())
    }

    /// Ends the printed text, whole csv or json whatever stopped the rows;
    /// how many were printed (none when the statement was never planned).
    pub fn finish(self) -> anyhow::Result<Option<u64>> {
        self.printed
            .map(|p| p.finish().map(|(total, _)| total))
            .transpose()
    }
}

impl RowSink for StdoutRows {
    fn push(&mut self, batch: RecordBatch) -> aisql_engine::Result<()> {
        match &mut self.printed {
            Some(printed) => printed.push(batch),
            None => Err(aisql_engine::EngineError::Data(
                "rows came before their statement was planned (a bug in aisql)".into(),
            )),
        }
    }
}

/// Prints `shown`, the first rows of a result of `total` rows (saved already).
pub fn show(
    shown: &RecordBatch,
    total: u64,
    args: &RowOutputArgs,
    runtime_s: f64,
) -> anyhow::Result<()> {
    aisql_engine::console::out(&render(shown, args.format)?)?;
    Ok(summarise(shown.num_rows() as u64, total, args, runtime_s)?)
}

/// The line on stderr after the rows: how many there were, how many were
/// printed and where they were saved.
pub fn summarise(
    printed: u64,
    total: u64,
    args: &RowOutputArgs,
    runtime_s: f64,
) -> std::io::Result<()> {
    errln!(
        "{total} row{} in {runtime_s:.3} s{}{}",
        if total == 1 { "" } else { "s" },
        if total > printed {
            format!(" ({printed} shown)")
        } else {
            String::new()
        },
        args.output
            .as_ref()
            .map(|p| format!("; saved to {}", p.display()))
            .unwrap_or_default()
    )
}

/// Writes `rows` to `path` whole or not at all.
fn save(rows: &RecordBatch, path: &Path) -> anyhow::Result<()> {
    let written = match output_format(path)? {
        None => write_parquet(path, rows).map_err(anyhow::Error::from),
        Some(format) => render(rows, format).and_then(|bytes| Ok(write_file_atomic(path, &bytes)?)),
    };
    if written.is_err() {
        let _ = std::fs::remove_file(aisql_engine::data::files::temp_path(path));
    }
    written
}

/// The model work of a finished query on stderr: fresh tokens, what the
/// answer cache answered and what it asked of the model, the budget and each
/// AI operator's coverage, and the rows the model could not answer.
pub fn report_work(work: &Work) -> std::io::Result<()> {
    report_budget(work.budget.as_ref().map(|b| &b.0))?;
    report_row_errors(work.row_errors.as_ref().map(|r| &r.0))?;
    if let Some(Sum(fresh)) = work.fresh_tokens {
        errln!("fresh tokens: {fresh} (positions computed by the model)")?;
    }
    if let Some(Sum(held)) = work.kv_held_at_start_tokens.filter(|h| h.0 > 0) {
        errln!("kept KV: earlier statements left {held} positions when this one began")?;
    }
    if let Some(decoded) = work.decode_tokens.map(|d| d.0).filter(|&d| d > 0) {
        let per_s = work
            .decode_seconds
            .map(|s| s.0)
            .filter(|&s| s > 0.0)
            .map(|s| format!(", {:.0} tokens/s", decoded as f64 / s))
            .unwrap_or_default();
        errln!("decode tokens: {decoded} (generated positions, part of the fresh tokens{per_s})")?;
    }
    if let (Some(Sum(masks)), Some(Sum(seconds))) = (work.typed_masks, work.typed_mask_seconds) {
        errln!(
            "typed answers: {masks} grammar token masks, {:.0} µs each",
            seconds / masks.max(1) as f64 * 1e6
        )?;
    }
    if let (Some(Sum(reused)), Some(Sum(asked))) =
        (work.answer_cache_reused, work.answer_cache_asked)
    {
        errln!("answer cache: {reused} answers reused, {asked} questions asked of the model")?;
    }
    if let Some(Sum(read)) = work.kv_store_read_tokens {
        let written = work.kv_store_written_bytes.map_or(0, |w| w.0);
        let rejected = work.kv_store_rejected.map_or(0, |r| r.0);
        let rejected = if rejected > 0 {
            format!(", {rejected} damaged or foreign block(s) computed again")
        } else {
            String::new()
        };
        errln!(
            "KV store: {read} positions read instead of computed, {written} bytes written{rejected}"
        )?;
    }
    Ok(())
}

/// The budget line (what was spent of what limit) and, once it was spent,
/// each AI operator's rows answered and not reached: the result is partial.
fn report_budget(budget: Option<&serde_json::Value>) -> std::io::Result<()> {
    let Some(b) = budget else {
        return Ok(());
    };
    let spent = &b["spent"];
    let limits: Vec<String> = b["limit"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k} {}", figure(v)))
        .collect();
    errln!(
        "budget: spent {} fresh tokens, {:.3} s of model time, ${:.6} (limit: {})",
        spent["fresh_tokens"],
        spent["model_seconds"].as_f64().unwrap_or(0.0),
        spent["cost_usd"].as_f64().unwrap_or(0.0),
        limits.join(", ")
    )?;
    if b["exhausted"] != true {
        return Ok(());
    }
    let over: Vec<String> = b["overshoot"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, v)| v.as_f64().is_some_and(|v| v > 0.0))
        .map(|(k, v)| format!("{k} {}", figure(v)))
        .collect();
    errln!(
        "budget spent ({}{}): the result holds only the rows answered before it ran out",
        b["reached"].as_str().unwrap_or("a limit"),
        if over.is_empty() {
            String::new()
        } else {
            format!(", over by {}", over.join(", "))
        }
    )?;
    for op in b["operators"].as_array().into_iter().flatten() {
        errln!(
            "  {}: {} rows answered, {} not reached",
            op["id"].as_str().unwrap_or("?"),
            op["answered_rows"],
            op["unreached_rows"]
        )?;
    }
    Ok(())
}

/// Per AI operator with failed rows: how many (their values are NULL) and
/// the first of them with their reasons.
fn report_row_errors(row_errors: Option<&serde_json::Value>) -> std::io::Result<()> {
    for op in row_errors
        .and_then(|r| r["operators"].as_array())
        .into_iter()
        .flatten()
        .filter(|op| op["rows_failed"].as_u64().is_some_and(|n| n > 0))
    {
        errln!(
            "{}: {} of {} rows failed, their values are NULL (--on-row-error null)",
            op["id"].as_str().unwrap_or("?"),
            op["rows_failed"],
            op["rows"]
        )?;
        for f in op["failures"].as_array().into_iter().flatten() {
            errln!("  {}", f["reason"].as_str().unwrap_or("?"))?;
        }
    }
    Ok(())
}

/// A budget figure as printed: whole numbers as they are, others to six
/// decimals without trailing zeros (dollars of a few seconds are tiny).
fn figure(v: &serde_json::Value) -> String {
    match (v.as_u64(), v.as_f64()) {
        (Some(n), _) => n.to_string(),
        (None, Some(f)) => {
            let s = format!("{f:.6}");
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        }
        _ => v.to_string(),
    }
}
