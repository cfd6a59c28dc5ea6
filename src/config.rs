//! The engine's configuration as typed values, with no command line in it:
//! [`EngineConfig`] (tables, backend spec with its scheduler, query options)
//! is what every front end fills in — `aisql sql` and its shell, `aisql
//! serve` and the Python package — and [`crate::connect`] opens a session
//! from it. The clap structs of [`crate::cli`] convert into these types (the
//! flags are parsed only there), the Python package sets the fields from its
//! keyword arguments, and both go through the same field parsers below, so a
//! bad value gets one message whichever way it came.
//!
//! Checks that need several fields together (a budget with the plain oracle,
//! `--on-row-error fail` with a ratio) stay where the value is used
//! (`commands::budget`, `commands::backend`); their messages name the flags,
//! as they always have.

use std::path::PathBuf;
use std::time::Duration;

use aisql_engine::exec::progress::ProgressMode;
use aisql_engine::inference::scheduler::{SchedulerConfig, default_kv_budget_bytes};

/// A mistake in how aisql was called (exit code 2 on the command line, a
/// `ValueError` in Python), found after the flags were read.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// KV budget the simulation assumes without `--kv-budget-mb`.
const SIMULATED_KV_BUDGET_BYTES: usize = 100 << 30;

/// Host KV tier the simulation assumes without `--kv-host-mb`: an H200's share of
/// the host memory of an 8-GPU node (2 TiB).
const SIMULATED_HOST_KV_BYTES: usize = 256 << 30;

/// Everything a long-lived SQL session opens with: its tables, the backend
/// that answers its AI calls, and the options each statement runs with.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Where the tables come from.
    pub tables: TablesConfig,
    /// What answers AI calls, and its scheduler.
    pub backend: BackendSpec,
    /// How each statement runs: batching, memory, limits, budget.
    pub query: QueryConfig,
    /// Whether statements may write (under the one write rule).
    pub allow_writes: bool,
}

impl Default for EngineConfig {
    /// The command line's defaults: the tiny model on the CPU, the dataset
    /// aisql finds, read-only statements.
    fn default() -> Self {
        Self {
            tables: TablesConfig::default(),
            backend: BackendSpec::default(),
            query: QueryConfig::default(),
            allow_writes: false,
        }
    }
}

/// Where a session's tables come from (`--table`, `--root`, ...).
#[derive(Debug, Clone)]
pub struct TablesConfig {
    /// `NAME=PATH` tables, in order ([`table_arg`] reads one).
    pub tables: Vec<(String, PathBuf)>,
    /// Read malformed CSV as DataFusion does (`--lenient-csv`).
    pub lenient_csv: bool,
    /// QUAIL-B data root whose tables are registered too.
    pub root: Option<PathBuf>,
    /// Scale factor of the QUAIL-B corpus.
    pub sf: f64,
    /// Reference collection id.
    pub collection: Option<String>,
    /// Whether no table and no root means the dataset aisql finds (the
    /// command line) or no dataset (the Python package).
    pub default_dataset: bool,
}

impl Default for TablesConfig {
    fn default() -> Self {
        Self {
            tables: Vec::new(),
            lenient_csv: false,
            root: None,
            sf: 0.1,
            collection: None,
            default_dataset: true,
        }
    }
}

/// Which backend answers AI questions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendKind {
    /// Reference labels of the QUAIL-B collection.
    Oracle,
    /// A Qwen3 model.
    #[default]
    Model,
}

/// The model that runs, on which devices, in which dtype.
#[derive(Debug, Clone)]
pub struct ModelChoice {
    /// `tiny`, a folder, a GGUF file or a Hugging Face id.
    pub name: String,
    /// CUDA devices, one worker each (`None`: the CPU).
    pub gpu: Option<Vec<usize>>,
    /// The weights format asked for, parsed where the model loads
    /// ([`crate::commands`]' `dtype`), `None` for the device's default.
    pub dtype: Option<String>,
}

impl Default for ModelChoice {
    fn default() -> Self {
        Self {
            name: "tiny".into(),
            gpu: None,
            dtype: None,
        }
    }
}

/// The `aisql worker`s questions are sent to (`--workers`).
#[derive(Debug, Clone)]
pub struct RemoteWorkers {
    /// `HOST:PORT` or URLs.
    pub addrs: Vec<String>,
    /// File holding their shared token.
    pub token_file: Option<PathBuf>,
    /// PEM of the CA that signed their TLS certificates.
    pub tls_ca: Option<PathBuf>,
    /// The longest one call may wait for its answer.
    pub call_timeout: Duration,
}

/// What answers AI calls: backend kind, model and devices, remote workers,
/// answer cache, prompt layout, and the scheduler they run under.
#[derive(Debug, Clone)]
pub struct BackendSpec {
    /// Model or oracle.
    pub kind: BackendKind,
    /// With the oracle: run the scheduler over a virtual KV cache.
    pub simulate: bool,
    /// The model and its devices.
    pub model: ModelChoice,
    /// CPU workers, each with its own copy of the model.
    pub cpu_workers: Option<u16>,
    /// Remote workers instead of a model of our own.
    pub workers: Option<RemoteWorkers>,
    /// Where the model's answers are kept (`--answer-cache`).
    pub answer_cache: Option<PathBuf>,
    /// Prompt layout, by name; read when the session opens, where a bad one
    /// has always been reported.
    pub prompt_format: String,
    /// Which of aisql's CUDA kernels a GPU model runs.
    pub cuda_kernels: aisql_kernels::CudaKernels,
    /// The scheduler's knobs.
    pub scheduler: SchedulerSpec,
}

impl Default for BackendSpec {
    fn default() -> Self {
        Self {
            kind: BackendKind::Model,
            simulate: false,
            model: ModelChoice::default(),
            cpu_workers: None,
            workers: None,
            answer_cache: None,
            prompt_format: "raw-v1".into(),
            cuda_kernels: aisql_kernels::CudaKernels::Auto,
            scheduler: SchedulerSpec::default(),
        }
    }
}

impl BackendSpec {
    /// The model answering, as the user named it: `None` for the oracle,
    /// which is no model (its simulation stands for one).
    pub fn model_name(&self) -> Option<String> {
        (self.kind == BackendKind::Model).then(|| self.model.name.clone())
    }

    /// Whether the backend computes tokens (a model, or the simulation).
    pub fn computes_tokens(&self) -> bool {
        self.kind == BackendKind::Model || self.simulate
    }
}

/// The scheduler's knobs as given (budgets in MiB, `None`: sized from the
/// device or the simulated deployment).
#[derive(Debug, Clone)]
pub struct SchedulerSpec {
    /// Reuse document KV across questions.
    pub prefix_cache: bool,
    /// Ask later operators' questions before a document's KV is dropped.
    pub lookahead: bool,
    /// Device KV budget, MiB.
    pub kv_budget_mb: Option<usize>,
    /// Host KV tier, MiB.
    pub kv_host_mb: Option<usize>,
    /// Tokens per forward batch.
    pub batch_tokens: usize,
}

impl Default for SchedulerSpec {
    fn default() -> Self {
        Self {
            prefix_cache: true,
            lookahead: true,
            kv_budget_mb: None,
            kv_host_mb: None,
            batch_tokens: 8192,
        }
    }
}

impl SchedulerSpec {
    /// The engine's scheduler configuration for a model of our own.
    pub fn config(&self) -> SchedulerConfig {
        SchedulerConfig {
            prefix_cache: self.prefix_cache,
            lookahead: self.lookahead,
            kv_budget_bytes: self
                .kv_budget_mb
                .map_or_else(default_kv_budget_bytes, |mb| mb << 20),
            host_kv_budget_bytes: self.kv_host_mb.map_or(0, |mb| mb << 20),
            batch_tokens: self.batch_tokens.max(1),
        }
    }

    /// The configuration for the simulated deployment the oracle stands for
    /// (`--simulate`, estimates): Qwen3-4B on an H200, unless the budgets
    /// are given.
    pub fn simulated_config(&self) -> SchedulerConfig {
        let mut config = self.config();
        if self.kv_budget_mb.is_none() {
            // Qwen3-4B on an H200 leaves about 100 GiB of its 141 GB for KV.
            config.kv_budget_bytes = SIMULATED_KV_BUDGET_BYTES;
        }
        if self.kv_host_mb.is_none() {
            config.host_kv_budget_bytes = SIMULATED_HOST_KV_BYTES;
        }
        config
    }
}

/// What a spent budget does (`--on-budget`).
pub use aisql_engine::limits::spend::OnBudget;

/// What a row the model cannot answer does (`--on-row-error`), before
/// `--max-error-ratio` is joined to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowErrorChoice {
    /// Fail the query, naming the row.
    Fail,
    /// NULL for that row's AI value.
    Null,
}

/// What a query may cost and what one bad row does (`aisql query`, `aisql
/// sql`, `aisql bench`, a session).
#[derive(Debug, Clone)]
pub struct CostConfig {
    /// Price of one GPU-hour in USD.
    pub gpu_hourly_rate_usd: Option<f64>,
    /// Estimate instead of running.
    pub estimate: bool,
    /// Rows per AI operator an estimate asks about.
    pub estimate_sample: usize,
    /// Fresh-token budget.
    pub max_fresh_tokens: Option<u64>,
    /// Model-seconds budget.
    pub max_model_seconds: Option<f64>,
    /// Dollar budget.
    pub max_cost_usd: Option<f64>,
    /// What a spent budget does.
    pub on_budget: Option<OnBudget>,
    /// What a failed row does.
    pub on_row_error: Option<RowErrorChoice>,
    /// How progress shows on stderr.
    pub progress: ProgressMode,
    /// The largest fraction of an operator's rows that may fail.
    pub max_error_ratio: Option<f64>,
}

impl Default for CostConfig {
    fn default() -> Self {
        Self {
            gpu_hourly_rate_usd: None,
            estimate: false,
            estimate_sample: 48,
            max_fresh_tokens: None,
            max_model_seconds: None,
            max_cost_usd: None,
            on_budget: None,
            on_row_error: None,
            progress: ProgressMode::Terminal,
            max_error_ratio: None,
        }
    }
}

impl CostConfig {
    /// Whether progress will be seen: JSON lines, or lines on a terminal.
    pub fn progress_shown(&self) -> bool {
        use std::io::IsTerminal as _;
        match self.progress {
            ProgressMode::Terminal => std::io::stderr().is_terminal(),
            ProgressMode::Json => true,
            ProgressMode::Hidden => false,
        }
    }
}

/// How each statement runs.
#[derive(Debug, Clone)]
pub struct QueryConfig {
    /// Rows streamed through the AI operators at a time.
    pub batch_rows: usize,
    /// Bytes DataFusion's operators may hold (`None`: half the host's memory).
    pub memory_limit: Option<usize>,
    /// Iterations a recursive CTE may run.
    pub max_recursion: usize,
    /// Stop a statement past this.
    pub timeout: Option<Duration>,
    /// Budget, row errors, progress and estimates.
    pub cost: CostConfig,
}

impl Default for QueryConfig {
    fn default() -> Self {
        Self {
            batch_rows: 256,
            memory_limit: None,
            max_recursion: aisql_engine::sql::recursion::DEFAULT_MAX_RECURSION,
            timeout: None,
            cost: CostConfig::default(),
        }
    }
}

impl QueryConfig {
    /// `memory_limit`, else [`aisql_engine::limits::host_memory::default_memory_limit`].
    pub fn memory_limit(&self) -> usize {
        self.memory_limit
            .unwrap_or_else(aisql_engine::limits::host_memory::default_memory_limit)
    }
}

// The field parsers: the command line's value parsers and the Python
// package's keyword arguments both call these, so their messages agree.

/// `NAME=PATH`.
pub fn table_arg(arg: &str) -> Result<(String, PathBuf), UsageError> {
    match arg.split_once('=') {
        Some((name, path)) if !name.trim().is_empty() && !path.is_empty() => {
            Ok((name.trim().to_string(), PathBuf::from(path)))
        }
        _ => Err(UsageError(format!("--table {arg}: expected NAME=PATH"))),
    }
}

/// A number of seconds > 0 (`--timeout-s`).
pub fn seconds(arg: &str) -> Result<Duration, String> {
    let s: f64 = arg
        .trim()
        .parse()
        .map_err(|_| format!("{arg:?} is not a number of seconds"))?;
    if !(s.is_finite() && s > 0.0) {
        return Err(format!("must be a number of seconds > 0, got {arg}"));
    }
    Duration::try_from_secs_f64(s).map_err(|e| format!("{arg} seconds: {e}"))
}

/// A finite number ≥ 0.
pub fn non_negative(arg: &str) -> Result<f64, String> {
    let v: f64 = arg
        .trim()
        .parse()
        .map_err(|_| format!("{arg:?} is not a number"))?;
    if !(v.is_finite() && v >= 0.0) {
        return Err(format!("must be a finite number ≥ 0, got {arg}"));
    }
    Ok(v)
}

/// A finite number > 0.
pub fn positive(arg: &str) -> Result<f64, String> {
    match non_negative(arg) {
        Ok(v) if v > 0.0 => Ok(v),
        Err(e) if arg.trim().parse::<f64>().is_err() => Err(e),
        _ => Err(format!("must be a finite number > 0, got {arg}")),
    }
}

/// A fraction from 0 to 1.
pub fn fraction(arg: &str) -> Result<f64, String> {
    let v = non_negative(arg)?;
    if v > 1.0 {
        return Err(format!("must be a fraction from 0 to 1, got {arg}"));
    }
    Ok(v)
}
