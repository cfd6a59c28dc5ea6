//! Writing a query's outputs in the QUAIL-B per-query layout (SPEC §D.6):
//! `plan.substrait`, `rows.parquet`, `filters-<i>.parquet`, `joins-<i>.parquet`,
//! `classifications-<i>.parquet` (zstd), `i` = position among operators of that
//! kind in post-order.

use std::fs::File;
use std::path::{Path, PathBuf};

use datafusion::arrow::array::RecordBatch;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::basic::{Compression, ZstdLevel};
use datafusion::parquet::file::properties::WriterProperties;
use serde::Serialize;

use crate::answers::AnswerTable;
use crate::backend::AiKind;
use crate::error::{EngineError, Result};
use crate::plan::{QueryPlan, encode_plan};
use crate::query::QueryOutput;

/// One answer-table file: operator id and path relative to the run folder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct KeyedFile {
    /// Operator id.
    pub key: String,
    /// File path.
    pub path: String,
}

/// The files of one query, relative to the run folder (run.json `files`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct OutputFiles {
    /// `plan.substrait`.
    pub plan: String,
    /// `rows.parquet`, or `rows.summary.json` when the rows did not fit the disk.
    pub rows: String,
    /// What that summary says, when the rows were kept as one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows_summary: Option<crate::row_digest::RowsSummary>,
    /// Filter answer tables (`[]` when the query has no filter).
    #[serde(default)]
    pub filters: Vec<KeyedFile>,
    /// Join answer tables (`[]` when the query has no join).
    #[serde(default)]
    pub joins: Vec<KeyedFile>,
    /// Classification answer tables (omitted when the query has none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub classifications: Vec<KeyedFile>,
    /// Score answer tables (`ai_score`; omitted when the query has none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scores: Vec<KeyedFile>,
    /// Label-probability answer tables (`ai_classify_scores`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub classification_scores: Vec<KeyedFile>,
    /// Generated-text answer tables (`ai_complete`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub completions: Vec<KeyedFile>,
    /// Extracted-field answer tables (`ai_extract`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extractions: Vec<KeyedFile>,
    /// `prompt_pieces.json` (SPEC §D.3), written by the benchmark when the token
    /// metrics can be computed (the engine reported fresh tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_pieces: Option<String>,
    /// SHA-256 of each file above as written (path → hex), so that a resumed run can
    /// tell a damaged file from a good one.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub sha256: std::collections::BTreeMap<String, String>,
}

impl OutputFiles {
    /// Every file listed, relative to the run folder.
    pub fn paths(&self) -> Vec<&str> {
        let mut out = vec![self.plan.as_str(), self.rows.as_str()];
        for f in self
            .filters
            .iter()
            .chain(&self.joins)
            .chain(&self.classifications)
            .chain(&self.scores)
            .chain(&self.classification_scores)
            .chain(&self.completions)
            .chain(&self.extractions)
        {
            out.push(f.path.as_str());
        }
        out.extend(self.prompt_pieces.as_deref());
        out
    }
}

/// The temporary name an output file is written under before its rename:
/// `.<name>.tmp` in the same folder (so the rename never crosses file systems).
pub fn temp_path(path: &Path) -> PathBuf {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    path.with_file_name(format!(".{name}.tmp"))
}

/// True for a name [`temp_path`] gives: what an interrupted atomic write leaves.
pub fn is_temp_name(name: &str) -> bool {
    name.starts_with('.') && name.ends_with(".tmp")
}

/// Refuses the output file `path` (`flag` names it: `--output`) when the folder
/// it would go in does not exist or is not a folder. Checked before any work:
/// the write itself would fail only at the end.
pub fn check_output_folder(path: &Path, flag: &str) -> Result<()> {
    match folder_problem(path) {
        Some(message) => Err(EngineError::Output {
            what: format!("{flag} {}", path.display()),
            message,
        }),
        None => Ok(()),
    }
}

/// Why the folder of the output file `path` cannot take it, if it cannot.
fn folder_problem(path: &Path) -> Option<String> {
    let folder = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    match std::fs::metadata(folder) {
        Ok(meta) if meta.is_dir() => None,
        Ok(_) => Some(format!("{} is not a folder", folder.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Some(format!("folder {} does not exist", folder.display()))
        }
        Err(e) => Some(format!("folder {}: {e}", folder.display())),
    }
}

/// The error of creating `tmp`, the temporary file of output `path`: the
/// missing folder when that is why, naming the user's path, not the temporary
/// name; else the error on `tmp`.
pub fn temp_error(path: &Path, tmp: &Path, e: std::io::Error) -> EngineError {
    match folder_problem(path) {
        Some(message) => EngineError::Output {
            what: path.display().to_string(),
            message,
        },
        None => EngineError::io(tmp, e),
    }
}

/// Writes `bytes` to `path` through [`temp_path`] and a rename, so a reader, or a
/// crash mid-write, never sees a half-written file.
pub fn write_file_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = temp_path(path);
    std::fs::write(&tmp, bytes).map_err(|e| temp_error(path, &tmp, e))?;
    publish(&tmp, path)
}

/// Fault injection for crash tests: milliseconds to wait between writing a
/// temporary file and renaming it into place, so that a test can kill aisql while
/// an output file is half-done. Unset in normal use.
pub const SLOW_PUBLISH_ENV: &str = "AISQL_FAULT_SLOW_PUBLISH_MS";

/// Renames the finished temporary file `tmp` to `path`: the one step that makes
/// an output file appear, whole.
pub fn publish(tmp: &Path, path: &Path) -> Result<()> {
    if let Some(ms) = std::env::var(SLOW_PUBLISH_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
    {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    std::fs::rename(tmp, path).map_err(|e| EngineError::io(path, e))
}

/// How every output Parquet file is written: zstd level 3.
pub fn parquet_properties() -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::ZSTD(
            ZstdLevel::try_new(3).expect("valid zstd level"),
        ))
        .build()
}

/// Writes `batch` as a zstd Parquet file, atomically (temp file then rename).
pub fn write_parquet(path: &Path, batch: &RecordBatch) -> Result<()> {
    let tmp = temp_path(path);
    let file = File::create(&tmp).map_err(|e| temp_error(path, &tmp, e))?;
    let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(parquet_properties()))
        .map_err(|e| EngineError::Data(format!("{}: {e}", path.display())))?;
    writer
        .write(batch)
        .and_then(|_| writer.close().map(|_| ()))
        .map_err(|e| EngineError::Data(format!("{}: {e}", path.display())))?;
    publish(&tmp, path)
}

/// The name of the result rows file in a query's folder, written while the
/// query runs (see [`crate::row_sink::ParquetRows`]).
pub const ROWS_FILE: &str = "rows.parquet";

/// What a query's folder holds instead of [`ROWS_FILE`] when the rows would
/// not fit the disk (see [`crate::row_digest::RowsSummary`]).
pub const ROWS_SUMMARY_FILE: &str = "rows.summary.json";

/// Where the summary of a result file goes when the file would not fit the
/// disk: `rows.parquet` -> `rows.summary.json`.
pub fn summary_path(rows_path: &Path) -> PathBuf {
    rows_path.with_extension("summary.json")
}

/// True for a file name of the per-query layout: what an earlier query may
/// have left in a folder this one writes into.
fn is_layout_name(name: &str) -> bool {
    if name == ROWS_FILE || name == ROWS_SUMMARY_FILE || name == "plan.substrait" {
        return true;
    }
    AiKind::ALL.iter().any(|&kind| {
        name.strip_prefix(layout_stem(kind))
            .and_then(|rest| rest.strip_prefix('-'))
            .and_then(|rest| rest.strip_suffix(".parquet"))
            .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
    })
}

/// The file stem of `kind`'s answer tables (`<stem>-<i>.parquet`).
pub fn layout_stem(kind: AiKind) -> &'static str {
    match kind {
        AiKind::Filter => "filters",
        AiKind::Join => "joins",
        AiKind::Classify => "classifications",
        AiKind::Score => "scores",
        AiKind::ClassifyScores => "classification_scores",
        AiKind::Complete => "completions",
        AiKind::Extract => "extractions",
    }
}

impl OutputFiles {
    /// The list of `kind`'s answer tables.
    fn tables_mut(&mut self, kind: AiKind) -> &mut Vec<KeyedFile> {
        match kind {
            AiKind::Filter => &mut self.filters,
            AiKind::Join => &mut self.joins,
            AiKind::Classify => &mut self.classifications,
            AiKind::Score => &mut self.scores,
            AiKind::ClassifyScores => &mut self.classification_scores,
            AiKind::Complete => &mut self.completions,
            AiKind::Extract => &mut self.extractions,
        }
    }
}

/// Removes from `dir` (if it exists) every file of the per-query layout and
/// every temporary file an interrupted write left: a query's output folder
/// then holds its own outputs only, never an answer table of an earlier query
/// that a scorer would take for this one's. Other files are left alone.
/// Returns the names removed.
pub fn clear_query_outputs(dir: &Path) -> Result<Vec<String>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(EngineError::io(dir, e)),
    };
    let mut removed = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| EngineError::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let earlier = is_layout_name(&name)
            || name
                .strip_prefix('.')
                .and_then(|n| n.strip_suffix(".tmp"))
                .is_some_and(is_layout_name);
        if earlier && entry.file_type().is_ok_and(|t| t.is_file()) {
            std::fs::remove_file(entry.path()).map_err(|e| EngineError::io(entry.path(), e))?;
            removed.push(name);
        }
    }
    removed.sort();
    Ok(removed)
}

/// Writes `rows` into `dir` as [`ROWS_FILE`] (created if missing) and then the
/// other outputs of `out`: what a caller that kept the rows in memory saves.
pub fn write_query_outputs(
    dir: &Path,
    prefix: &str,
    query: &QueryPlan,
    rows: &RecordBatch,
    out: &QueryOutput,
) -> Result<OutputFiles> {
    std::fs::create_dir_all(dir).map_err(|e| EngineError::io(dir, e))?;
    write_parquet(&dir.join(ROWS_FILE), rows)?;
    write_answer_outputs(dir, prefix, query, out)
}

/// Writes `plan.substrait` and the answer tables of `out` into `dir`, whose
/// [`ROWS_FILE`] is already written. Paths in the returned list are prefixed
/// with `prefix` (e.g. the query id folder).
pub fn write_answer_outputs(
    dir: &Path,
    prefix: &str,
    query: &QueryPlan,
    out: &QueryOutput,
) -> Result<OutputFiles> {
    write_layout(dir, prefix, &encode_plan(&query.substrait), &out.answers)
}

/// Writes `plan` as `plan.substrait` and each answer table as
/// `<kind>-<i>.parquet` into `dir`, `i` counting the tables of one kind in the
/// order given: the per-query layout of any plan's outputs.
pub fn write_layout(
    dir: &Path,
    prefix: &str,
    plan: &[u8],
    answers: &[AnswerTable],
) -> Result<OutputFiles> {
    std::fs::create_dir_all(dir).map_err(|e| EngineError::io(dir, e))?;
    let rel = |name: &str| -> String {
        if prefix.is_empty() {
            name.to_string()
        } else {
            format!("{prefix}/{name}")
        }
    };
    write_file_atomic(&dir.join("plan.substrait"), plan)?;
    let mut files = OutputFiles {
        plan: rel("plan.substrait"),
        rows: rel(ROWS_FILE),
        ..Default::default()
    };
    for kind in AiKind::ALL {
        let stem = layout_stem(kind);
        for (i, table) in answers.iter().filter(|t| t.kind == kind).enumerate() {
            let name = format!("{stem}-{i}.parquet");
            write_parquet(&dir.join(&name), &table.to_record_batch()?)?;
            let entry = KeyedFile {
                key: table.op_id.clone(),
                path: rel(&name),
            };
            files.tables_mut(kind).push(entry);
        }
    }
    Ok(files)
}

/// Reads a Parquet file written by [`write_parquet`] (or the harness) back.
pub fn read_parquet(path: &Path) -> Result<RecordBatch> {
    use crate::parquet_read::{ParquetReadError, read_batches};
    let (schema, batches) = read_batches(path, 8192).map_err(|e| match e {
        ParquetReadError::Io(e) => EngineError::io(path, e),
        ParquetReadError::Corrupt(e) => EngineError::Data(format!("{}: {e}", path.display())),
    })?;
    Ok(datafusion::arrow::compute::concat_batches(
        &schema, &batches,
    )?)
}

/// The output folder of a query inside a run folder.
pub fn query_dir(run_dir: &Path, query_id: &str) -> PathBuf {
    run_dir.join(query_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_earlier_querys_outputs_are_cleared_and_other_files_kept() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "rows.parquet",
            "plan.substrait",
            "joins-0.parquet",
            "classifications-12.parquet",
            ".filters-1.parquet.tmp",
            "notes.txt",
            "joins-x.parquet",
            "filters-.parquet",
        ] {
            std::fs::write(dir.path().join(name), b"x").unwrap();
        }
        std::fs::create_dir(dir.path().join("filters-2.parquet")).unwrap();
        let removed = clear_query_outputs(dir.path()).unwrap();
        assert_eq!(
            removed,
            [
                ".filters-1.parquet.tmp",
                "classifications-12.parquet",
                "joins-0.parquet",
                "plan.substrait",
                "rows.parquet"
            ]
        );
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "filters-.parquet",
                "filters-2.parquet",
                "joins-x.parquet",
                "notes.txt"
            ]
        );
        assert!(
            clear_query_outputs(&dir.path().join("missing"))
                .unwrap()
                .is_empty()
        );
    }
}
