//! Writing a query's outputs in the QUAIL-B per-query layout (SPEC §D.6):
//! `plan.substrait`, `rows.parquet`, `filters-<i>.parquet`, `joins-<i>.parquet`,
//! `classifications-<i>.parquet` (zstd), `i` = position among operators of that
//! kind in post-order.

use std::path::{Path, PathBuf};

use aisql_engine::data::files::{write_file_atomic, write_parquet};
use datafusion::arrow::array::RecordBatch;
use serde::Serialize;

use aisql_engine::exec::answers::AnswerTable;
use aisql_engine::inference::backend::AiKind;
use aisql_engine::sql::plan_file::encode_plan;
use aisql_engine::{EngineError, Result};

use crate::quailb::plan::QueryPlan;
use crate::quailb::query::QueryOutput;

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
    pub rows_summary: Option<aisql_engine::data::row_digest::RowsSummary>,
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
    /// Embedding answer tables (`ai_embed`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub embeddings: Vec<KeyedFile>,
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
            .chain(&self.embeddings)
        {
            out.push(f.path.as_str());
        }
        out.extend(self.prompt_pieces.as_deref());
        out
    }
}

/// The name of the result rows file in a query's folder, written while the
/// query runs (see [`aisql_engine::data::row_sink::ParquetRows`]).
pub const ROWS_FILE: &str = "rows.parquet";

/// What a query's folder holds instead of [`ROWS_FILE`] when the rows would
/// not fit the disk (see [`aisql_engine::data::row_digest::RowsSummary`]).
pub const ROWS_SUMMARY_FILE: &str = "rows.summary.json";

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
        AiKind::Embed => "embeddings",
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
            AiKind::Embed => &mut self.embeddings,
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
