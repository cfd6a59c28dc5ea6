//! The engine's configuration as typed values, with no command line in it:
//! [`EngineConfig`] (tables, backend spec with its scheduler, query options)
//! is what every front end fills in — `aisql sql` and its shell, `aisql
//! serve` and the Python package — and [`crate::connect`] opens a session
//! from it. The clap structs of [`crate::cli`] convert into these types (the
//! flags are parsed only there), the Python package sets the fields from its
//! keyword arguments, and both go through the same field parsers below, so a
//! bad value gets one message whichever way it came.
//!
//! [`EngineConfig::validate`] holds the rules that join several fields (a
//! budget for `--on-budget`, `--workers` instead of local devices, ...) and
//! the value ranges a typed field can break; the command line runs it after
//! clap has read the flags, Python after the keyword arguments are set. Its
//! messages name each option the way the front end that asked spells it
//! ([`Names`]): `--max-fresh-tokens` on the command line, `max_fresh_tokens`
//! in Python.

use std::fmt::Display;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use aisql_engine::exec::progress::ProgressMode;
use aisql_engine::inference::scheduler::{
    DEFAULT_KV_STORE_BYTES, KvStoreSpec, SchedulerConfig, default_kv_budget_bytes,
};

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
    /// The on-disk KV store's folder (`--kv-store`).
    pub kv_store: Option<PathBuf>,
    /// Its bound in bytes (`--kv-store-size`).
    pub kv_store_size: Option<u64>,
}

impl Default for SchedulerSpec {
    fn default() -> Self {
        Self {
            prefix_cache: true,
            lookahead: true,
            kv_budget_mb: None,
            kv_host_mb: None,
            batch_tokens: 8192,
            kv_store: None,
            kv_store_size: None,
        }
    }
}

impl SchedulerSpec {
    /// The on-disk KV store, when one is named.
    pub fn kv_store_spec(&self) -> Option<KvStoreSpec> {
        self.kv_store.as_ref().map(|dir| KvStoreSpec {
            dir: dir.clone(),
            size_bytes: self.kv_store_size.unwrap_or(DEFAULT_KV_STORE_BYTES),
        })
    }

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
    /// Whether a statement uses the KV earlier statements left, computing
    /// only what it does not find (`None`: the command's default, on; a
    /// benchmark run starts each query from nothing unless told).
    pub keep_kv: Option<bool>,
}

impl Default for QueryConfig {
    fn default() -> Self {
        Self {
            batch_rows: 256,
            memory_limit: None,
            max_recursion: aisql_engine::sql::recursion::DEFAULT_MAX_RECURSION,
            timeout: None,
            cost: CostConfig::default(),
            keep_kv: None,
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

/// A whole number ≥ 1 (a count or a limit), with the command line's words
/// for one that is not (`0 is not in 1..18446744073709551615`).
pub fn at_least_one<T: TryFrom<u64>>(arg: &str) -> Result<T, String> {
    let v: u64 = arg
        .parse()
        .map_err(|e: std::num::ParseIntError| e.to_string())?;
    if v == 0 {
        return Err(format!("0 is not in 1..{}", u64::MAX));
    }
    T::try_from(v).map_err(|_| format!("{v} is too large"))
}

/// A number of CPU workers, 1 to 65535 (`--cpu-workers`).
pub fn worker_count(arg: &str) -> Result<u16, String> {
    let v: i64 = arg
        .parse()
        .map_err(|e: std::num::ParseIntError| e.to_string())?;
    u16::try_from(v)
        .ok()
        .filter(|&n| n >= 1)
        .ok_or_else(|| format!("{v} is not in 1..={}", u16::MAX))
}

/// A number as Rust reads it (`--sf`, `--kv-budget-mb`, ...).
pub fn number<T: FromStr>(arg: &str) -> Result<T, String>
where
    T::Err: Display,
{
    arg.parse().map_err(|e: T::Err| e.to_string())
}

/// One of `choices`, by name.
pub fn choice<T: Copy>(arg: &str, choices: &[(&str, T)]) -> Result<T, String> {
    choices
        .iter()
        .find(|(name, _)| *name == arg)
        .map(|&(_, value)| value)
        .ok_or_else(|| {
            let names: Vec<&str> = choices.iter().map(|(name, _)| *name).collect();
            format!("[possible values: {}]", names.join(", "))
        })
}

/// `--backend`'s values.
pub const BACKEND_KINDS: &[(&str, BackendKind)] = &[
    ("oracle", BackendKind::Oracle),
    ("model", BackendKind::Model),
];
/// `--on-budget`'s values.
pub const ON_BUDGET: &[(&str, OnBudget)] =
    &[("fail", OnBudget::Fail), ("partial", OnBudget::Partial)];
/// `--on-row-error`'s values.
pub const ON_ROW_ERROR: &[(&str, RowErrorChoice)] = &[
    ("fail", RowErrorChoice::Fail),
    ("null", RowErrorChoice::Null),
];
/// `--progress`'s values.
pub const PROGRESS: &[(&str, ProgressMode)] = &[
    ("auto", ProgressMode::Terminal),
    ("json", ProgressMode::Json),
    ("off", ProgressMode::Hidden),
];
/// `--cuda-kernels`' values.
pub const CUDA_KERNELS: &[(&str, aisql_kernels::CudaKernels)] = &[
    ("auto", aisql_kernels::CudaKernels::Auto),
    ("all", aisql_kernels::CudaKernels::All),
    ("off", aisql_kernels::CudaKernels::Off),
];
/// An on/off switch's values (`--prefix-cache`, `--lookahead`).
pub const SWITCH: &[(&str, bool)] = &[("on", true), ("off", false)];

// Validation: the rules of several fields, and the ranges a typed field can
// break. The command line's flags have had their values checked by the
// parsers above already; Python's keyword arguments too (`OPTIONS`); a Rust
// caller filling the fields itself is checked here alone.

/// How the front end that asks names its options in messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Names {
    /// The command line: `--max-fresh-tokens`.
    Flags,
    /// Python's keyword arguments: `max_fresh_tokens`.
    Keywords,
}

impl Names {
    /// `option` (a flag's name without its dashes, `max-fresh-tokens`) as
    /// this front end spells it. Python names devices with `device=`, not
    /// `--gpu`, and tables with `tables=`.
    pub fn of(self, option: &str) -> String {
        match (self, option) {
            (Names::Flags, _) => format!("--{option}"),
            (Names::Keywords, "gpu") => "device".into(),
            (Names::Keywords, "table") => "tables".into(),
            (Names::Keywords, _) => option.replace('-', "_"),
        }
    }

    /// `option` given `value`: `--backend oracle`, `backend="oracle"`.
    pub fn given(self, option: &str, value: &str) -> String {
        match self {
            Names::Flags => format!("--{option} {value}"),
            Names::Keywords if value.parse::<f64>().is_ok() => {
                format!("{}={value}", self.of(option))
            }
            Names::Keywords => format!("{}={value:?}", self.of(option)),
        }
    }

    /// A yes/no `option` turned on: `--simulate`, `simulate=True`.
    pub fn on(self, option: &str) -> String {
        match self {
            Names::Flags => self.of(option),
            Names::Keywords => format!("{}=True", self.of(option)),
        }
    }
}

/// A bad value of one option, in the words clap uses for a flag's bad value
/// (`invalid value 'soon' for '--timeout-s': ...`), with the option named as
/// `names` spells it.
pub fn invalid_value(names: Names, option: &str, value: &str, why: &str) -> UsageError {
    UsageError(format!(
        "invalid value '{value}' for '{}': {why}",
        names.of(option)
    ))
}

/// Parses `value` for `option` with `parse`, a bad one named as `names`
/// spells the option.
pub fn parse_option<T>(
    names: Names,
    option: &str,
    value: &str,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Result<T, UsageError> {
    parse(value).map_err(|why| invalid_value(names, option, value, &why))
}

/// Two options given together that exclude each other.
fn conflict(names: Names, given: &str, other: &str, why: &str) -> UsageError {
    UsageError(format!(
        "{} cannot be used with {}: {why}",
        names.of(given),
        names.of(other)
    ))
}

/// The parts of `--workers` given separately (`--worker-token-file`,
/// `--tls-ca`, `--worker-timeout-s`), joined once all are read: the others
/// mean nothing without the addresses.
#[derive(Debug, Clone, Default)]
pub struct RemoteWorkerParts {
    /// `--workers`.
    pub addrs: Option<Vec<String>>,
    /// `--worker-token-file`.
    pub token_file: Option<PathBuf>,
    /// `--tls-ca`.
    pub tls_ca: Option<PathBuf>,
    /// `--worker-timeout-s`; `None`: the engine's default.
    pub call_timeout: Option<Duration>,
}

impl RemoteWorkerParts {
    /// The remote workers these parts name, if any.
    pub fn join(self, names: Names) -> Result<Option<RemoteWorkers>, UsageError> {
        let Some(addrs) = self.addrs else {
            let given = [
                ("worker-token-file", self.token_file.is_some()),
                ("tls-ca", self.tls_ca.is_some()),
                ("worker-timeout-s", self.call_timeout.is_some()),
            ];
            if let Some((option, _)) = given.iter().find(|(_, given)| *given) {
                return Err(UsageError(format!(
                    "{} is for remote workers: give {} too",
                    names.of(option),
                    names.of("workers")
                )));
            }
            return Ok(None);
        };
        Ok(Some(RemoteWorkers {
            addrs,
            token_file: self.token_file,
            tls_ca: self.tls_ca,
            call_timeout: self
                .call_timeout
                .unwrap_or(aisql_engine::inference::distributed::DEFAULT_CALL_TIMEOUT),
        }))
    }
}

impl EngineConfig {
    /// Checks the configuration as a whole: every rule of
    /// [`BackendSpec::validate`], [`QueryConfig::validate`] and
    /// [`check_spend`], named as `names` spells the options.
    pub fn validate(&self, names: Names) -> Result<(), UsageError> {
        self.backend.validate(names)?;
        self.query.validate(names)?;
        check_spend(&self.query.cost, &self.backend, names)
    }
}

impl BackendSpec {
    /// Local devices or remote workers, not both; CPU workers or GPUs, not
    /// both.
    pub fn validate(&self, names: Names) -> Result<(), UsageError> {
        if let Some(n) = self.cpu_workers {
            if n == 0 {
                return Err(invalid_value(names, "cpu-workers", "0", "give 1 or more"));
            }
            if self.model.gpu.is_some() {
                return Err(conflict(
                    names,
                    "cpu-workers",
                    "gpu",
                    "the workers run on the CPU or one per GPU, not both",
                ));
            }
        }
        let store = &self.scheduler;
        if store.kv_store_size.is_some() && store.kv_store.is_none() {
            return Err(UsageError(format!(
                "{} bounds the KV store: give {} DIR too",
                names.of("kv-store-size"),
                names.of("kv-store")
            )));
        }
        if store.kv_store_size == Some(0) {
            return Err(invalid_value(
                names,
                "kv-store-size",
                "0",
                "give a size such as 4G",
            ));
        }
        if store.kv_store.is_some() {
            if self.kind != BackendKind::Model || self.simulate {
                return Err(UsageError(format!(
                    "{} keeps a model's KV: use it with the model backend, without simulation",
                    names.of("kv-store")
                )));
            }
            if self.workers.is_some() {
                return Err(conflict(
                    names,
                    "kv-store",
                    "workers",
                    "the remote workers compute the KV; a store is theirs to keep",
                ));
            }
            if !self.scheduler.prefix_cache {
                return Err(conflict(
                    names,
                    "kv-store",
                    "prefix-cache",
                    "without the prefix cache no KV is reused, so none is stored",
                ));
            }
        }
        if let Some(workers) = &self.workers {
            let local = [
                ("gpu", self.model.gpu.is_some()),
                ("cpu-workers", self.cpu_workers.is_some()),
                ("dtype", self.model.dtype.is_some()),
            ];
            if let Some((other, _)) = local.iter().find(|(_, given)| *given) {
                return Err(conflict(
                    names,
                    "workers",
                    other,
                    "the remote workers' model answers, on their devices, in their dtype",
                ));
            }
            if workers.addrs.iter().all(|a| a.trim().is_empty()) {
                return Err(invalid_value(
                    names,
                    "workers",
                    "",
                    "give HOST:PORT[,HOST:PORT...]",
                ));
            }
            if workers.call_timeout.is_zero() {
                return Err(invalid_value(
                    names,
                    "worker-timeout-s",
                    "0",
                    "give 1 or more",
                ));
            }
        }
        Ok(())
    }
}

impl QueryConfig {
    /// The limits' ranges and the cost options' rules.
    pub fn validate(&self, names: Names) -> Result<(), UsageError> {
        if self.max_recursion == 0 {
            return Err(invalid_value(names, "max-recursion", "0", "give 1 or more"));
        }
        if self.timeout.is_some_and(|t| t.is_zero()) {
            return Err(invalid_value(
                names,
                "timeout-s",
                "0",
                "must be a number of seconds > 0, got 0",
            ));
        }
        self.cost.validate(names)
    }
}

impl CostConfig {
    /// The ranges of the budget's numbers, a budget for `--on-budget`, and
    /// `--on-row-error` agreeing with `--max-error-ratio`.
    pub fn validate(&self, names: Names) -> Result<(), UsageError> {
        let check = |option: &str, value: Option<f64>, parse: fn(&str) -> Result<f64, String>| {
            value.map_or(Ok(()), |v| {
                parse_option(names, option, &v.to_string(), parse).map(drop)
            })
        };
        check(
            "gpu-hourly-rate-usd",
            self.gpu_hourly_rate_usd,
            non_negative,
        )?;
        check("max-model-seconds", self.max_model_seconds, positive)?;
        check("max-cost-usd", self.max_cost_usd, positive)?;
        check("max-error-ratio", self.max_error_ratio, fraction)?;
        if self.estimate_sample == 0 {
            return Err(invalid_value(
                names,
                "estimate-sample",
                "0",
                "give 1 or more",
            ));
        }
        if self.max_fresh_tokens == Some(0) {
            return Err(invalid_value(
                names,
                "max-fresh-tokens",
                "0",
                "give 1 or more",
            ));
        }
        let budgeted = self.max_fresh_tokens.is_some()
            || self.max_model_seconds.is_some()
            || self.max_cost_usd.is_some();
        if self.on_budget.is_some() && !budgeted {
            return Err(UsageError(format!(
                "{} needs a budget to act on: give {}, {} or {}",
                names.of("on-budget"),
                names.of("max-fresh-tokens"),
                names.of("max-model-seconds"),
                names.of("max-cost-usd"),
            )));
        }
        if let (Some(RowErrorChoice::Fail), Some(r)) = (self.on_row_error, self.max_error_ratio) {
            return Err(UsageError(format!(
                "{} and {} contradict each other: the ratio is how many of an operator's rows \
                 may be NULL under {}; give one of them",
                names.given("on-row-error", "fail"),
                names.given("max-error-ratio", &r.to_string()),
                names.given("on-row-error", "null"),
            )));
        }
        Ok(())
    }
}

/// A budget needs something to spend: the plain oracle runs no model, a
/// simulation no forward passes to time, and at $0 an hour a dollar cap
/// never stops anything.
pub fn check_spend(
    cost: &CostConfig,
    backend: &BackendSpec,
    names: Names,
) -> Result<(), UsageError> {
    let given: Vec<&str> = [
        (cost.max_fresh_tokens.is_some(), "max-fresh-tokens"),
        (cost.max_model_seconds.is_some(), "max-model-seconds"),
        (cost.max_cost_usd.is_some(), "max-cost-usd"),
    ]
    .into_iter()
    .filter_map(|(given, option)| given.then_some(option))
    .collect();
    let Some(&first) = given.first() else {
        return Ok(());
    };
    if backend.kind == BackendKind::Oracle && !backend.simulate {
        return Err(UsageError(format!(
            "{}: {} answers from reference labels and runs no model, so a query has nothing \
             to spend; give {}, or {} to count the fresh tokens the model would compute",
            names.of(first),
            names.given("backend", "oracle"),
            names.given("backend", "model"),
            names.on("simulate"),
        )));
    }
    if backend.simulate
        && let Some(timed) = given.iter().find(|o| **o != "max-fresh-tokens")
    {
        return Err(UsageError(format!(
            "{}: {} runs no forward passes, so it has no model time to spend; cap a simulation \
             with {}",
            names.of(timed),
            names.on("simulate"),
            names.of("max-fresh-tokens"),
        )));
    }
    if cost.max_cost_usd.is_some() && cost.gpu_hourly_rate_usd == Some(0.0) {
        return Err(UsageError(format!(
            "{} with {}: at $0 an hour the model's time costs nothing and the cap never stops \
             it; give a price above 0 or {}",
            names.of("max-cost-usd"),
            names.given("gpu-hourly-rate-usd", "0"),
            names.of("max-model-seconds"),
        )));
    }
    Ok(())
}

// Options by name: the Python package's keyword arguments set the fields
// through this one table, each value through the parser its flag uses.

/// A value given for an option by name.
#[derive(Debug, Clone, PartialEq)]
pub enum OptionValue {
    /// Text, read as the option's flag reads its value.
    Text(String),
    /// Several values (`workers=["a:1", "b:2"]`).
    List(Vec<String>),
    /// Yes or no, for a switch (`simulate=True`, `prefix_cache=False`).
    Bool(bool),
}

impl OptionValue {
    /// The value as the messages show it.
    fn shown(&self) -> String {
        match self {
            OptionValue::Text(t) => t.clone(),
            OptionValue::List(items) => items.join(","),
            OptionValue::Bool(b) => if *b { "True" } else { "False" }.into(),
        }
    }

    /// One value read by `parse`.
    fn parse<T>(&self, parse: impl FnOnce(&str) -> Result<T, String>) -> Result<T, String> {
        match self {
            OptionValue::Text(t) => parse(t),
            OptionValue::List(_) => Err("expected one value, not a list".into()),
            OptionValue::Bool(_) => Err("expected a value, not True or False".into()),
        }
    }

    /// Text as it was given.
    fn text(&self) -> Result<String, String> {
        self.parse(|t| Ok(t.to_string()))
    }

    /// A path.
    fn path(&self) -> Result<PathBuf, String> {
        self.parse(|t| Ok(PathBuf::from(t)))
    }

    /// A yes/no option.
    fn yes(&self) -> Result<bool, String> {
        match self {
            OptionValue::Bool(b) => Ok(*b),
            _ => Err("expected True or False".into()),
        }
    }

    /// An on/off switch: a yes/no, or `on` / `off` as its flag takes.
    fn switch(&self) -> Result<bool, String> {
        match self {
            OptionValue::Bool(b) => Ok(*b),
            other => other.parse(|t| choice(t, SWITCH)),
        }
    }

    /// A comma-separated list, or a list of values.
    fn list(&self) -> Result<Vec<String>, String> {
        match self {
            OptionValue::List(items) => Ok(items.clone()),
            other => other.parse(|t| Ok(t.split(',').map(str::to_string).collect())),
        }
    }
}

/// An [`EngineConfig`] filled option by option; [`ConfigBuilder::build`]
/// joins the parts that go together and validates the whole.
#[derive(Debug, Clone, Default)]
pub struct ConfigBuilder {
    /// The configuration so far.
    pub config: EngineConfig,
    /// `--workers` and its options, joined at the end.
    pub workers: RemoteWorkerParts,
}

/// Sets one option's field from its value, or says why the value is wrong.
type SetOption = fn(&mut ConfigBuilder, &OptionValue) -> Result<(), String>;

/// Stores a parsed value in its field.
fn put<T>(field: &mut T, value: Result<T, String>) -> Result<(), String> {
    *field = value?;
    Ok(())
}

/// Every option settable by name, in keyword spelling (the flag's name with
/// `_` for `-`); `device=` and `tables=` are the front end's own.
pub const OPTIONS: &[(&str, SetOption)] = &[
    // Tables.
    ("lenient_csv", |b, v| {
        put(&mut b.config.tables.lenient_csv, v.yes())
    }),
    ("root", |b, v| {
        put(&mut b.config.tables.root, v.path().map(Some))
    }),
    ("sf", |b, v| put(&mut b.config.tables.sf, v.parse(number))),
    ("collection", |b, v| {
        put(&mut b.config.tables.collection, v.text().map(Some))
    }),
    // The backend.
    ("backend", |b, v| {
        put(
            &mut b.config.backend.kind,
            v.parse(|t| choice(t, BACKEND_KINDS)),
        )
    }),
    ("simulate", |b, v| {
        put(&mut b.config.backend.simulate, v.yes())
    }),
    ("model", |b, v| {
        put(&mut b.config.backend.model.name, v.text())
    }),
    ("dtype", |b, v| {
        put(&mut b.config.backend.model.dtype, v.text().map(Some))
    }),
    ("cpu_workers", |b, v| {
        put(
            &mut b.config.backend.cpu_workers,
            v.parse(worker_count).map(Some),
        )
    }),
    ("workers", |b, v| {
        put(&mut b.workers.addrs, v.list().map(Some))
    }),
    ("worker_token_file", |b, v| {
        put(&mut b.workers.token_file, v.path().map(Some))
    }),
    ("tls_ca", |b, v| {
        put(&mut b.workers.tls_ca, v.path().map(Some))
    }),
    ("worker_timeout_s", |b, v| {
        let secs: u64 = v.parse(at_least_one)?;
        b.workers.call_timeout = Some(Duration::from_secs(secs));
        Ok(())
    }),
    ("answer_cache", |b, v| {
        put(&mut b.config.backend.answer_cache, v.path().map(Some))
    }),
    ("prompt_format", |b, v| {
        put(&mut b.config.backend.prompt_format, v.text())
    }),
    ("cuda_kernels", |b, v| {
        put(
            &mut b.config.backend.cuda_kernels,
            v.parse(|t| choice(t, CUDA_KERNELS)),
        )
    }),
    // The scheduler.
    ("prefix_cache", |b, v| {
        put(&mut b.config.backend.scheduler.prefix_cache, v.switch())
    }),
    ("lookahead", |b, v| {
        put(&mut b.config.backend.scheduler.lookahead, v.switch())
    }),
    ("kv_budget_mb", |b, v| {
        put(
            &mut b.config.backend.scheduler.kv_budget_mb,
            v.parse(number).map(Some),
        )
    }),
    ("kv_host_mb", |b, v| {
        put(
            &mut b.config.backend.scheduler.kv_host_mb,
            v.parse(number).map(Some),
        )
    }),
    ("kv_store", |b, v| {
        put(&mut b.config.backend.scheduler.kv_store, v.path().map(Some))
    }),
    ("kv_store_size", |b, v| {
        let size = v.parse(aisql_engine::limits::host_memory::parse_size)?;
        b.config.backend.scheduler.kv_store_size = Some(size as u64);
        Ok(())
    }),
    ("keep_kv", |b, v| {
        put(&mut b.config.query.keep_kv, v.switch().map(Some))
    }),
    ("batch_tokens", |b, v| {
        put(
            &mut b.config.backend.scheduler.batch_tokens,
            v.parse(number),
        )
    }),
    // Each statement.
    ("batch_rows", |b, v| {
        put(&mut b.config.query.batch_rows, v.parse(number))
    }),
    ("memory_limit", |b, v| {
        let size = v.parse(aisql_engine::limits::host_memory::parse_size)?;
        b.config.query.memory_limit = Some(size);
        Ok(())
    }),
    ("timeout_s", |b, v| {
        put(&mut b.config.query.timeout, v.parse(seconds).map(Some))
    }),
    ("max_recursion", |b, v| {
        put(&mut b.config.query.max_recursion, v.parse(at_least_one))
    }),
    // Cost, budget and row errors.
    ("gpu_hourly_rate_usd", |b, v| {
        put(
            &mut b.config.query.cost.gpu_hourly_rate_usd,
            v.parse(non_negative).map(Some),
        )
    }),
    // The flag's old name, kept as its alias is.
    ("gpu_hour_usd", |b, v| {
        put(
            &mut b.config.query.cost.gpu_hourly_rate_usd,
            v.parse(non_negative).map(Some),
        )
    }),
    ("estimate", |b, v| {
        put(&mut b.config.query.cost.estimate, v.yes())
    }),
    ("estimate_sample", |b, v| {
        put(
            &mut b.config.query.cost.estimate_sample,
            v.parse(at_least_one),
        )
    }),
    ("max_fresh_tokens", |b, v| {
        put(
            &mut b.config.query.cost.max_fresh_tokens,
            v.parse(at_least_one).map(Some),
        )
    }),
    ("max_model_seconds", |b, v| {
        put(
            &mut b.config.query.cost.max_model_seconds,
            v.parse(positive).map(Some),
        )
    }),
    ("max_cost_usd", |b, v| {
        put(
            &mut b.config.query.cost.max_cost_usd,
            v.parse(positive).map(Some),
        )
    }),
    ("on_budget", |b, v| {
        put(
            &mut b.config.query.cost.on_budget,
            v.parse(|t| choice(t, ON_BUDGET)).map(Some),
        )
    }),
    ("on_row_error", |b, v| {
        put(
            &mut b.config.query.cost.on_row_error,
            v.parse(|t| choice(t, ON_ROW_ERROR)).map(Some),
        )
    }),
    ("progress", |b, v| {
        put(
            &mut b.config.query.cost.progress,
            v.parse(|t| choice(t, PROGRESS)),
        )
    }),
    ("max_error_ratio", |b, v| {
        put(
            &mut b.config.query.cost.max_error_ratio,
            v.parse(fraction).map(Some),
        )
    }),
];

/// The options [`ConfigBuilder::set`] knows, in keyword spelling.
pub fn option_names() -> impl Iterator<Item = &'static str> {
    OPTIONS.iter().map(|(name, _)| *name)
}

impl ConfigBuilder {
    /// Sets `option` (keyword spelling) to `value`; a bad value is refused
    /// as its flag's would be, the option named as `names` spells it.
    pub fn set(
        &mut self,
        names: Names,
        option: &str,
        value: &OptionValue,
    ) -> Result<(), UsageError> {
        let Some((_, set)) = OPTIONS.iter().find(|(name, _)| *name == option) else {
            let known: Vec<&str> = option_names().collect();
            return Err(UsageError(format!(
                "unknown option {option:?}; the options are {}",
                known.join(", ")
            )));
        };
        set(self, value)
            .map_err(|why| invalid_value(names, &option.replace('_', "-"), &value.shown(), &why))
    }

    /// The configuration, its parts joined and the whole validated.
    pub fn build(mut self, names: Names) -> Result<EngineConfig, UsageError> {
        self.config.backend.workers = self.workers.join(names)?;
        self.config.validate(names)?;
        Ok(self.config)
    }
}
