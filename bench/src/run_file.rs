//! `run.json` (SPEC §D.6, schema version 2): the state of a benchmark run,
//! rewritten atomically (temp file, then rename) after every state change so a
//! crash or Ctrl-C always leaves a readable file that `--resume` can continue.

use std::path::Path;

use crate::quailb::output::OutputFiles;
use crate::quailb::plan::QueryPlan;
use aisql_engine::sql::plan_file::decode_plan;
use serde::{Deserialize, Serialize};

use crate::error::{BenchError, Result};
use crate::metrics::{Assessment, QueryMetrics, QueryStatus};

/// The run.json schema version written.
pub const SCHEMA_VERSION: u32 = 2;
/// The QUAIL-B line this driver implements.
pub const QUAIL_B_VERSION: &str = "43-query (7c76513)";
/// File name of the run state.
pub const RUN_JSON: &str = "run.json";

/// State of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Queries are being run.
    Running,
    /// Every query finished and was scored.
    Complete,
    /// The run ended with at least one query not complete, or was interrupted.
    Failed,
}

/// One query of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueryRecord {
    /// Catalog id (`IMDB-1`).
    pub id: String,
    /// SHA-256 of the query definition (SPEC §D.6).
    pub definition_hash: String,
    /// Lifecycle state.
    pub status: QueryStatus,
    /// Saved outputs.
    pub files: Option<OutputFiles>,
    /// Query execution seconds.
    pub runtime_s: Option<f64>,
    /// Engine measurements.
    pub measurements: Option<aisql_engine::inference::work::Work>,
    /// Scores and token metrics.
    pub metrics: Option<QueryMetrics>,
    /// `good` / `bad` with reasons.
    #[serde(default)]
    pub assessment: Option<Assessment>,
    /// `"<Type>: <message>"`.
    pub error: Option<String>,
    /// What the query was estimated to cost before it ran (`--estimate`'s
    /// figures), beside the actual ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate: Option<aisql_engine::estimate::Estimate>,
}

impl QueryRecord {
    /// A query not yet run.
    pub fn pending(id: &str, definition_hash: &str) -> Self {
        Self {
            id: id.to_string(),
            definition_hash: definition_hash.to_string(),
            status: QueryStatus::Pending,
            files: None,
            runtime_s: None,
            measurements: None,
            metrics: None,
            assessment: None,
            error: None,
            estimate: None,
        }
    }
}

/// The whole run.json.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunFile {
    /// Always [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// QUAIL-B line.
    pub quail_b_version: String,
    /// Scale factor of the corpus.
    pub scale_factor: f64,
    /// Corpus id.
    pub corpus_id: String,
    /// Reference collection.
    pub collection_id: Option<String>,
    /// Model of the reference labels.
    pub reference_model: String,
    /// Everything that affects performance.
    pub metadata: serde_json::Map<String, serde_json::Value>,
    /// GPUs billed.
    pub gpu_count: u32,
    /// Price of one GPU-hour.
    pub gpu_hourly_rate_usd: Option<f64>,
    /// ISO-8601 UTC.
    pub started_at: String,
    /// ISO-8601 UTC, once the run ends.
    pub finished_at: Option<String>,
    /// Run state.
    pub status: RunStatus,
    /// Queries in run order.
    pub queries: Vec<QueryRecord>,
}

impl RunFile {
    /// Reads `<dir>/run.json`.
    pub fn read(dir: &Path) -> Result<Self> {
        let path = dir.join(RUN_JSON);
        let bad = |message: String| BenchError::Run {
            dir: dir.to_path_buf(),
            message,
        };
        let text = std::fs::read_to_string(&path)
            .map_err(|e| bad(format!("cannot read {}: {e}", path.display())))?;
        let run: RunFile = serde_json::from_str(&text)
            .map_err(|e| bad(format!("{} is not a QUAIL-B run.json: {e}", path.display())))?;
        if run.schema_version != SCHEMA_VERSION {
            return Err(bad(format!(
                "{} has schema_version {} (this aisql reads {SCHEMA_VERSION})",
                path.display(),
                run.schema_version
            )));
        }
        Ok(run)
    }

    /// Writes `<dir>/run.json` atomically.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).map_err(|e| BenchError::Run {
            dir: dir.to_path_buf(),
            message: format!("cannot serialize run.json: {e}"),
        })? + "\n";
        write_atomic(&dir.join(RUN_JSON), text.as_bytes())
    }

    /// The record of a query.
    pub fn query(&self, id: &str) -> Option<&QueryRecord> {
        self.queries.iter().find(|q| q.id == id)
    }

    /// The record of a query, mutable.
    pub fn query_mut(&mut self, id: &str) -> Option<&mut QueryRecord> {
        self.queries.iter_mut().find(|q| q.id == id)
    }
}

/// Writes `bytes` to `path` atomically ([`aisql_engine::data::files::write_file_atomic`]).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    Ok(aisql_engine::data::files::write_file_atomic(path, bytes)?)
}

/// The plan a query of a run was run with (its saved `plan.substrait`).
pub fn read_saved_plan(run_dir: &Path, files: &OutputFiles) -> Result<QueryPlan> {
    let path = run_dir.join(&files.plan);
    let bad = |message: String| BenchError::Run {
        dir: run_dir.to_path_buf(),
        message: format!("{}: {message}", path.display()),
    };
    let bytes = std::fs::read(&path).map_err(|e| bad(e.to_string()))?;
    let plan = decode_plan(&bytes, false).map_err(bad)?;
    QueryPlan::from_substrait(plan).map_err(|e| bad(e.to_string()))
}

/// Now as ISO-8601 UTC with seconds (`2026-01-02T03:04:05Z`).
pub fn now_utc() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}
