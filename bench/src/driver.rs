//! The QUAIL-B driver: runs the catalog's queries through the engine one at a
//! time, saves each query's outputs, scores them, and keeps `run.json` current
//! after every state change (SPEC §D.6). A run can be resumed, queries can time
//! out or spend their budget without ending the run, and Ctrl-C leaves a
//! consistent run.json. Writing
//! outputs, tokenizing and scoring run on blocking threads, never on the runtime
//! that drives the engine.
//!
//! [`run_bench`] is a loop over three parts: [`open_run`] starts a run folder or
//! resumes the run in it (checks that it is the same data and settings, re-verifies
//! kept outputs); [`QueryRunner`] runs one query to an [`Outcome`] (estimate, engine,
//! timeout, Ctrl-C); [`Recorder`] records it (outputs saved and hashed, scoring,
//! run.json after every change, peak RSS, and the reports at the end).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::quailb::output::{OutputFiles, ROWS_FILE, ROWS_SUMMARY_FILE, write_answer_outputs};
use crate::quailb::plan::QueryPlan;
use crate::quailb::query::{QueryOutput, output_schema, run_query_into};
use aisql_engine::data::files::is_temp_name;
use aisql_engine::data::row_sink::{ParquetRows, SavedRows};
use aisql_engine::data::tables::TablePaths;
use aisql_engine::exec::coverage::OnRowError;
use aisql_engine::inference::backend::InferenceBackend;
use aisql_engine::inference::prompt::PromptFormat;
use aisql_engine::limits::spend::Budget;
use aisql_engine::sql::options::QueryOptions;
use indicatif::{ProgressBar, ProgressStyle};

use crate::error::{BenchError, Result};
use crate::layout::{Dataset, sha256_file};
use crate::metrics::QueryStatus;
use crate::run_file::{
    QUAIL_B_VERSION, QueryRecord, RunFile, RunStatus, SCHEMA_VERSION, now_utc, read_saved_plan,
};
use crate::scoring::Scorer;

/// How a benchmark run is done.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Run folder.
    pub output_dir: PathBuf,
    /// Continue the run in `output_dir`.
    pub resume: bool,
    /// Per-query limit on engine time.
    pub timeout: Option<Duration>,
    /// Stop at the first query that does not complete.
    pub fail_fast: bool,
    /// GPUs billed.
    pub gpu_count: u32,
    /// Price of one GPU-hour.
    pub gpu_hourly_rate_usd: Option<f64>,
    /// The backend's description of itself, from whatever built it (model, device,
    /// dtype, budgets; an oracle records no model), recorded in run.json's metadata.
    pub backend_metadata: Metadata,
    /// Where the plans came from (`PlanSource::describe`).
    pub plans: String,
    /// The user's own pairs (`--metadata KEY=VALUE`), recorded last, so they win.
    pub user_metadata: Metadata,
    /// Prompt layout the engine sends.
    pub format: PromptFormat,
    /// Progress on stderr: the run bar with each query's AI operators under it
    /// (drawn only on a terminal), JSON lines of the operators, or nothing.
    pub progress: aisql_engine::exec::progress::ProgressMode,
    /// Rows per batch streamed through the AI operators.
    pub batch_rows: usize,
    /// Bytes DataFusion's operators may hold per query.
    pub memory_limit: usize,
    /// What each query may spend on the model ([`aisql_engine::limits::spend`]): a
    /// query over it under `--on-budget fail` is recorded `over_budget` and
    /// the run goes on.
    pub budget: Option<Budget>,
    /// What a row the model cannot answer does.
    pub on_row_error: OnRowError,
    /// Whether each query uses the KV the queries before it left (`--keep-kv
    /// on`); off, each starts from nothing and its fresh tokens are its own.
    pub reuse_earlier_kv: bool,
    /// Estimates each query before it runs and records the estimate beside
    /// the actual figures (a backend that computes tokens: a model, or the
    /// simulation).
    pub estimator: Option<aisql_engine::estimate::Estimator>,
}

/// Metadata a resume must share with the run it continues.
pub const RESUME_MUST_MATCH: [&str; 5] =
    ["backend", "model", "dtype", "prompt_format", "simulation"];

/// run.json's `metadata` object.
pub type Metadata = serde_json::Map<String, serde_json::Value>;

/// `git rev-parse HEAD` of the working directory, if it is a git checkout.
fn git_commit() -> Option<String> {
    let out = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

/// run.json's `metadata`, assembled here and nowhere else: the build and machine,
/// the run's options, the backend's own description, then the user's pairs.
pub fn run_metadata(opts: &BenchOptions, backend: &dyn InferenceBackend) -> Metadata {
    use serde_json::Value;
    let mut m = Metadata::new();
    m.insert("aisql_version".into(), env!("CARGO_PKG_VERSION").into());
    m.insert(
        "git_commit".into(),
        git_commit().map_or(Value::Null, Value::from),
    );
    m.insert(
        "os".into(),
        format!("{}-{}", std::env::consts::OS, std::env::consts::ARCH).into(),
    );
    m.insert(
        "threads".into(),
        std::thread::available_parallelism().map_or(Value::Null, |n| n.get().into()),
    );
    if let Ok(t) = std::env::var("RAYON_NUM_THREADS") {
        m.insert("rayon_num_threads".into(), t.into());
    }
    m.insert("backend".into(), backend.name().into());
    m.insert("prompt_format".into(), opts.format.name().into());
    m.insert("plans".into(), opts.plans.clone().into());
    m.insert("batch_rows".into(), opts.batch_rows.into());
    m.insert("memory_limit_bytes".into(), opts.memory_limit.into());
    m.insert(
        "timeout_s".into(),
        opts.timeout.map_or(Value::Null, |t| t.as_secs_f64().into()),
    );
    if let Some(b) = &opts.budget {
        let l = &b.limits;
        m.insert(
            "budget".into(),
            serde_json::json!({
                "max_fresh_tokens": l.fresh_tokens,
                "max_model_seconds": l.model_seconds,
                "max_cost_usd": l.cost_usd,
                "gpu_hourly_rate_usd": l.gpu_hourly_rate_usd,
                "on_budget": match b.on_spent {
                    aisql_engine::limits::spend::OnBudget::Fail => "fail",
                    aisql_engine::limits::spend::OnBudget::Partial => "partial",
                },
            }),
        );
    }
    if let OnRowError::Null { max_ratio } = opts.on_row_error {
        m.insert(
            "on_row_error".into(),
            serde_json::json!({"on_row_error": "null", "max_error_ratio": max_ratio}),
        );
    }
    m.extend(opts.backend_metadata.clone());
    m.extend(opts.user_metadata.clone());
    m
}

/// True when `dir` holds nothing but the temporary files of an interrupted atomic
/// write (`.<name>.tmp`): a run killed while writing its first run.json can be
/// started again in the same folder.
fn is_empty_dir(dir: &Path) -> bool {
    std::fs::read_dir(dir).map_or(true, |entries| {
        entries
            .flatten()
            .all(|e| is_temp_name(&e.file_name().to_string_lossy()))
    })
}

/// A new timestamped run folder under `benchmark_results/`.
pub fn default_output_dir() -> PathBuf {
    PathBuf::from("benchmark_results").join(chrono::Utc::now().format("%Y%m%dT%H%M%SZ").to_string())
}

/// What running one query came to ([`QueryRunner::run`]), for [`Recorder::record`].
enum Outcome {
    /// The engine finished: its output and the rows it saved.
    Done(Box<(QueryOutput, SavedRows)>),
    /// The engine failed (`EngineError: …`, `PanicError: …`).
    Failed(String),
    /// `--timeout-s` passed first.
    Timeout(String),
    /// The query spent its budget under `--on-budget fail`.
    OverBudget(String),
    /// Ctrl-C or SIGTERM came first.
    Interrupted,
}

/// Resolves on the first Ctrl-C (SIGINT) or, on Unix, SIGTERM: a service manager's
/// or a scheduler's stop is handled like Ctrl-C, leaving a run that `--resume` continues.
async fn stop_signal() {
    // A handler that cannot be installed never fires, rather than stopping the run.
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    if let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    {
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
        return;
    }
    ctrl_c.await
}

/// Runs `f` on a blocking thread: Parquet writing, tokenization and scoring are
/// CPU and disk work that must not stall the runtime driving the engine.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| BenchError::Task(e.to_string()))?
}

/// Scores `rec` on a blocking thread and returns it scored.
async fn score_blocking(
    scorer: &Arc<Scorer>,
    dir: &Path,
    plan: &QueryPlan,
    mut rec: QueryRecord,
    gpu_count: u32,
    rate: Option<f64>,
) -> Result<QueryRecord> {
    let (scorer, dir, plan) = (scorer.clone(), dir.to_path_buf(), plan.clone());
    blocking(move || {
        scorer.score_into(&dir, &plan, &mut rec, gpu_count, rate);
        Ok(rec)
    })
    .await
}

/// Writes a finished query's outputs and prompt pieces on a blocking thread.
async fn save_blocking(
    scorer: &Arc<Scorer>,
    dir: &Path,
    id: &str,
    plan: &QueryPlan,
    out: QueryOutput,
    saved: SavedRows,
) -> Result<OutputFiles> {
    let (scorer, dir, id, plan) = (
        scorer.clone(),
        dir.to_path_buf(),
        id.to_string(),
        plan.clone(),
    );
    blocking(move || {
        let mut files = write_answer_outputs(&dir.join(&id), &id, &plan, &out)?;
        if let SavedRows::Summary(summary) = saved {
            files.rows = format!("{id}/{ROWS_SUMMARY_FILE}");
            files.rows_summary = Some(summary);
        }
        files.prompt_pieces = scorer.save_pieces(&dir, &id, &plan, &out.measurements)?;
        files.sha256 = hash_files(&dir, &files)?;
        Ok(files)
    })
    .await
}

/// SHA-256 of each file of a query's outputs.
fn hash_files(dir: &Path, files: &OutputFiles) -> Result<BTreeMap<String, String>> {
    files
        .paths()
        .into_iter()
        .map(|p| Ok((p.to_string(), sha256_file(&dir.join(p))?)))
        .collect()
}

/// Why a kept query's saved files cannot be trusted (missing, without a
/// recorded SHA-256, or not what was written), or `None` when they are intact.
fn damaged(dir: &Path, files: &OutputFiles) -> Option<String> {
    for p in files.paths() {
        let path = dir.join(p);
        if !path.is_file() {
            return Some(format!("{p} is missing"));
        }
        let Some(want) = files.sha256.get(p) else {
            return Some(format!("run.json records no SHA-256 for {p}"));
        };
        match sha256_file(&path) {
            Ok(got) if &got == want => {}
            Ok(got) => return Some(format!("{p} has sha256 {got}, run.json recorded {want}")),
            Err(e) => return Some(e.to_string()),
        }
    }
    None
}

/// Checks every output file of the run in `dir` against the SHA-256 its
/// run.json recorded, before `bench report` or `bench compare` reads them: a
/// changed, missing or unrecorded file is an error naming it (and both hashes),
/// never a score of something the run did not write.
pub fn verify_run_files(dir: &Path, run: &RunFile) -> Result<()> {
    for rec in &run.queries {
        if let Some(files) = &rec.files
            && let Some(why) = damaged(dir, files)
        {
            return Err(run_error(
                dir,
                format!(
                    "{}: {why}: the run's outputs changed after it wrote them; \
                     `aisql bench --resume {}` runs that query again",
                    rec.id,
                    dir.display()
                ),
            ));
        }
    }
    Ok(())
}

/// The distinct prompt templates of `plans`, sorted (what the labels are loaded for).
pub fn templates_of<'a>(plans: impl IntoIterator<Item = &'a QueryPlan>) -> Vec<String> {
    let mut t: Vec<String> = plans.into_iter().flat_map(|p| p.templates()).collect();
    t.sort();
    t.dedup();
    t
}

fn run_error(dir: &Path, message: String) -> BenchError {
    BenchError::Run {
        dir: dir.to_path_buf(),
        message,
    }
}

/// `complete` when every query is complete, else `failed`.
fn final_status(run: &RunFile) -> RunStatus {
    if run
        .queries
        .iter()
        .all(|q| q.status == QueryStatus::Complete)
    {
        RunStatus::Complete
    } else {
        RunStatus::Failed
    }
}

/// Runs `queries` and writes the run folder. Returns the final run.json; the run's
/// status is `complete` only when every query is complete. `opts.metadata` is
/// recorded as given (the caller describes the run); a resumed run adds `resumed`.
///
/// The loop over three parts: [`open_run`] (a new run folder, or the run it
/// resumes), [`QueryRunner`] (one query to an [`Outcome`]: estimate, engine,
/// timeout, Ctrl-C) and [`Recorder`] (saving, scoring, run.json, peak RSS, reports).
pub async fn run_bench(
    opts: &BenchOptions,
    dataset: &Dataset,
    backend: Arc<dyn InferenceBackend>,
    queries: Vec<(String, QueryPlan)>,
) -> Result<RunFile> {
    let dir = &opts.output_dir;
    // A disk reserve that cannot be read fails the run now, not each query.
    aisql_engine::data::row_sink::disk_reserve()?;
    let metadata = run_metadata(opts, backend.as_ref());
    let (mut run, plans) = open_run(opts, dataset, metadata, queries)?;
    let recorder = Recorder::new(dir, dataset, &run, &plans).await?;

    // Ctrl-C or SIGTERM sets a flag the loop watches (the first signal; a second
    // one ends the process as usual).
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let signal_task = tokio::spawn(async move {
        stop_signal().await;
        let _ = stop_tx.send(true);
    });

    // The run bar, and each running query's AI operators under it.
    let lines = indicatif::MultiProgress::new();
    let bar = run_bar(opts, &lines, plans.len());
    let runner = QueryRunner::new(opts, dataset, backend, &lines);
    let mut interrupted = false;
    for (id, plan) in &plans {
        if recorder.keep(&mut run, id, plan, &bar).await? {
            bar.inc(1);
            continue;
        }
        let rec = run.query_mut(id).expect("record of every planned query");
        let query_options = runner.start(rec, id, plan, &bar).await;
        run.write(dir)?;
        bar.set_message(id.clone());
        let peak = PeakRss::reset();
        let outcome = runner.run(id, plan, query_options, &mut stop_rx).await;
        interrupted = matches!(outcome, Outcome::Interrupted);
        let done = recorder
            .record(&mut run, id, plan, outcome, peak, &bar)
            .await?;
        bar.inc(1);
        if interrupted || *stop_rx.borrow() {
            interrupted = true;
            break;
        }
        if !done && opts.fail_fast {
            break;
        }
    }
    bar.finish_and_clear();
    signal_task.abort();
    let run = recorder.finish(run).await?;
    if interrupted {
        return Err(run_error(
            dir,
            format!(
                "interrupted; run.json is consistent, continue with --resume {}",
                dir.display()
            ),
        ));
    }
    Ok(run)
}

/// The run bar (drawn only on a terminal): one step per query.
fn run_bar(opts: &BenchOptions, lines: &indicatif::MultiProgress, queries: usize) -> ProgressBar {
    let bar = if opts.progress == aisql_engine::exec::progress::ProgressMode::Terminal {
        lines.add(ProgressBar::new(queries as u64))
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} queries {msg}")
            .expect("progress template")
            .progress_chars("=> "),
    );
    bar.set_prefix("bench");
    bar
}

// ---------------------------------------------------------------- opening a run

/// Opens the run of `opts`: a new run folder with every query pending, or (with
/// `opts.resume`) the run in it, checked to be of the same data and settings, its
/// queries whose plan changed or whose saved files are damaged set back to pending.
/// Writes run.json (status `running`) and returns it with the plans in run order.
/// `metadata` is this invocation's ([`run_metadata`]).
fn open_run(
    opts: &BenchOptions,
    dataset: &Dataset,
    metadata: Metadata,
    queries: Vec<(String, QueryPlan)>,
) -> Result<(RunFile, Vec<(String, QueryPlan)>)> {
    let dir = &opts.output_dir;
    let (run, plans) = if opts.resume {
        resume_run(dir, dataset, metadata, queries, opts.format.name())?
    } else {
        new_run(opts, dataset, metadata, queries)?
    };
    run.write(dir)?;
    Ok((run, plans))
}

/// The run in `dir`, to be continued with `queries` under `metadata`.
fn resume_run(
    dir: &Path,
    dataset: &Dataset,
    mut metadata: Metadata,
    queries: Vec<(String, QueryPlan)>,
    format_name: &str,
) -> Result<(RunFile, Vec<(String, QueryPlan)>)> {
    let mut run = RunFile::read(dir)?;
    if run.corpus_id != dataset.corpus_id || run.collection_id != dataset.collection_id {
        return Err(run_error(
            dir,
            format!(
                "the run used corpus {} (sf {}, collection {}), this dataset is {} (sf {}, collection {}); resume with the run's data",
                run.corpus_id,
                run.scale_factor,
                run.collection_id.as_deref().unwrap_or("none"),
                dataset.corpus_id,
                dataset.scale_factor,
                dataset.collection_id.as_deref().unwrap_or("none")
            ),
        ));
    }
    // A run whose queries were answered by another backend, model, dtype or
    // prompt layout would mix results that are not comparable.
    for key in RESUME_MUST_MATCH {
        let (was, now) = (run.metadata.get(key), metadata.get(key));
        if was != now {
            let show =
                |v: Option<&serde_json::Value>| v.map_or("none".to_string(), |v| v.to_string());
            return Err(run_error(
                dir,
                format!(
                    "the run used {key} {}, this resume has {key} {}; resume with the run's settings or start a new run",
                    show(was),
                    show(now)
                ),
            ));
        }
    }
    let by_id: BTreeMap<String, QueryPlan> = queries.into_iter().collect();
    let mut plans = Vec::new();
    for rec in &mut run.queries {
        let plan = by_id.get(&rec.id).cloned().ok_or_else(|| {
            run_error(
                dir,
                format!(
                    "{} is in the run but was not among the plans loaded",
                    rec.id
                ),
            )
        })?;
        let hash = plan.definition_hash(format_name);
        if hash != rec.definition_hash {
            *rec = QueryRecord::pending(&rec.id, &hash);
        }
        // Kept outputs are re-verified; a damaged one means running the query again.
        if let Some(files) = &rec.files
            && let Some(why) = damaged(dir, files)
        {
            let _ = aisql_engine::errln!("{}: {why}; running the query again", rec.id);
            *rec = QueryRecord::pending(&rec.id, &hash);
        }
        plans.push((rec.id.clone(), plan));
    }
    let resumed = run
        .metadata
        .get("resumed")
        .and_then(|v| v.as_u64())
        .unwrap_or(0)
        + 1;
    metadata.insert("resumed".into(), resumed.into());
    run.metadata = metadata;
    run.status = RunStatus::Running;
    run.finished_at = None;
    Ok((run, plans))
}

/// A new run of `queries` in `opts.output_dir`, which must not hold another.
fn new_run(
    opts: &BenchOptions,
    dataset: &Dataset,
    metadata: Metadata,
    queries: Vec<(String, QueryPlan)>,
) -> Result<(RunFile, Vec<(String, QueryPlan)>)> {
    let dir = &opts.output_dir;
    let format_name = opts.format.name();
    if dir.exists() && !is_empty_dir(dir) {
        return Err(run_error(
            dir,
            format!(
                "the output folder exists and is not empty; choose a new --output-dir or continue it with --resume {}",
                dir.display()
            ),
        ));
    }
    std::fs::create_dir_all(dir).map_err(|e| BenchError::Io {
        path: dir.clone(),
        message: e.to_string(),
    })?;
    let run = RunFile {
        schema_version: SCHEMA_VERSION,
        quail_b_version: QUAIL_B_VERSION.into(),
        scale_factor: dataset.scale_factor,
        corpus_id: dataset.corpus_id.clone(),
        collection_id: dataset.collection_id.clone(),
        reference_model: dataset.reference_model.clone(),
        metadata,
        gpu_count: opts.gpu_count,
        gpu_hourly_rate_usd: opts.gpu_hourly_rate_usd,
        started_at: now_utc(),
        finished_at: None,
        status: RunStatus::Running,
        queries: queries
            .iter()
            .map(|(id, p)| QueryRecord::pending(id, &p.definition_hash(format_name)))
            .collect(),
    };
    Ok((run, queries))
}

// ---------------------------------------------------------------- running a query

/// Runs one query of a run through the engine to an [`Outcome`]: its estimate
/// first (with `opts.estimator`), then the engine on a task of its own, its rows
/// streamed into the query's folder, raced against `--timeout-s` and Ctrl-C.
struct QueryRunner<'a> {
    opts: &'a BenchOptions,
    backend: Arc<dyn InferenceBackend>,
    tables: TablePaths,
    /// The options every query runs with (its expected rows come from its estimate).
    query_options: QueryOptions,
}

impl<'a> QueryRunner<'a> {
    fn new(
        opts: &'a BenchOptions,
        dataset: &Dataset,
        backend: Arc<dyn InferenceBackend>,
        lines: &indicatif::MultiProgress,
    ) -> Self {
        let query_options = QueryOptions {
            format: opts.format,
            progress: opts.progress,
            progress_parent: Some(lines.clone()),
            batch_rows: opts.batch_rows,
            memory_limit: opts.memory_limit,
            budget: opts.budget,
            on_row_error: opts.on_row_error,
            reuse_earlier_kv: opts.reuse_earlier_kv,
            ..QueryOptions::default()
        };
        QueryRunner {
            opts,
            backend,
            tables: dataset.tables.clone(),
            query_options,
        }
    }

    /// Sets `rec` running (a fresh record) with its estimate, and returns the
    /// options the query runs with.
    async fn start(
        &self,
        rec: &mut QueryRecord,
        id: &str,
        plan: &QueryPlan,
        bar: &ProgressBar,
    ) -> QueryOptions {
        *rec = QueryRecord {
            status: QueryStatus::Running,
            ..QueryRecord::pending(id, &rec.definition_hash)
        };
        if let Some(estimator) = &self.opts.estimator {
            bar.set_message(format!("{id} (estimate)"));
            let estimate = async {
                let estimating = estimator.backend(self.backend.clone())?;
                crate::quailb::query::estimate_query(
                    estimator,
                    estimating,
                    plan,
                    &self.tables,
                    &self.query_options,
                    &aisql_engine::sql::QueryCanceller::default(),
                )
                .await
            };
            match estimate.await {
                Ok(e) => rec.estimate = Some(e),
                Err(e) => bar.println(format!("{id}: no estimate: {e}")),
            }
        }
        // The operators' progress lines count up to the estimate's questions.
        let expected_rows = rec
            .estimate
            .as_ref()
            .map(|e| e.operators.iter().map(|o| (o.id.clone(), o.rows)).collect())
            .unwrap_or_default();
        QueryOptions {
            expected_rows,
            ..self.query_options.clone()
        }
    }

    /// Runs query `id` with options `o` until it ends, times out, or `stop` is set.
    async fn run(
        &self,
        id: &str,
        plan: &QueryPlan,
        o: QueryOptions,
        stop: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Outcome {
        let opts = self.opts;
        let canceller = aisql_engine::sql::QueryCanceller::default();
        let handle = {
            let (plan, tables, backend) = (plan.clone(), self.tables.clone(), self.backend.clone());
            let canceller = canceller.clone();
            // Rows stream into the query's folder as they arrive: a result larger
            // than memory is never held.
            let rows_path = opts.output_dir.join(id).join(ROWS_FILE);
            tokio::spawn(async move {
                let mut rows = ParquetRows::create(&rows_path, output_schema(&plan))?;
                let out =
                    run_query_into(&plan, &tables, backend, &o, &canceller, &mut rows).await?;
                let saved = rows.finish()?;
                Ok::<_, BenchError>((out, saved))
            })
        };
        let abort = handle.abort_handle();
        let timeout = async {
            match opts.timeout {
                Some(t) => tokio::time::sleep(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = handle => match r {
                Ok(Ok(out)) => Outcome::Done(Box::new(out)),
                Ok(Err(e @ BenchError::Engine(aisql_engine::EngineError::OverBudget(_)))) => {
                    Outcome::OverBudget(format!("BudgetError: {e}"))
                }
                Ok(Err(e)) => Outcome::Failed(format!("EngineError: {e}")),
                Err(e) => Outcome::Failed(format!("PanicError: {e}")),
            },
            _ = timeout => {
                canceller.cancel();
                abort.abort();
                // The forward batch in flight runs to its end on a blocking thread:
                // say how long after the deadline the model actually stopped.
                let deadline = Instant::now();
                let waiting = canceller.clone();
                let _ = tokio::task::spawn_blocking(move || waiting.wait_stopped()).await;
                Outcome::Timeout(format!(
                    "TimeoutError: query execution exceeded the {} s timeout; its model work \
                     stopped {:.3} s after the deadline",
                    opts.timeout.map_or(0.0, |t| t.as_secs_f64()),
                    deadline.elapsed().as_secs_f64()
                ))
            }
            _ = stop.wait_for(|s| *s) => {
                canceller.cancel();
                abort.abort();
                Outcome::Interrupted
            }
        }
    }
}

// ---------------------------------------------------------------- recording it

/// The peak RSS of one query (its run, saving and scoring), not the run's: reset
/// before the query starts, read when its outcome is recorded.
struct PeakRss {
    known: bool,
}

impl PeakRss {
    /// Starts a query's peak: what earlier queries freed goes back to the host first.
    fn reset() -> Self {
        aisql_engine::limits::host_memory::release_free_memory();
        PeakRss {
            known: aisql_engine::limits::host_memory::reset_peak_rss(),
        }
    }

    /// The peak since [`PeakRss::reset`], when the platform tracks it.
    fn bytes(&self) -> Option<u64> {
        if self.known {
            aisql_engine::limits::host_memory::peak_rss_bytes()
        } else {
            None
        }
    }
}

/// Records what became of each query in the run folder: its outputs saved and
/// hashed, scored, its peak RSS, run.json rewritten after every change; at the
/// end the run's status and the reports.
struct Recorder<'a> {
    dir: &'a Path,
    scorer: Arc<Scorer>,
    gpu_count: u32,
    rate: Option<f64>,
}

impl<'a> Recorder<'a> {
    /// A recorder for `run` in `dir`: the scorer loads the labels of `plans`.
    async fn new(
        dir: &'a Path,
        dataset: &Dataset,
        run: &RunFile,
        plans: &[(String, QueryPlan)],
    ) -> Result<Self> {
        let scorer = {
            let (dataset, templates) =
                (dataset.clone(), templates_of(plans.iter().map(|(_, p)| p)));
            Arc::new(blocking(move || Scorer::new(&dataset, &templates)).await?)
        };
        Ok(Recorder {
            dir,
            scorer,
            gpu_count: run.gpu_count,
            rate: run.gpu_hourly_rate_usd,
        })
    }

    /// A query an earlier run got far enough: true when it needs no run, that is
    /// complete, or saved (or scoring failed) with files, scored again here.
    async fn keep(
        &self,
        run: &mut RunFile,
        id: &str,
        plan: &QueryPlan,
        bar: &ProgressBar,
    ) -> Result<bool> {
        let rec = run.query_mut(id).expect("record of every planned query");
        match rec.status {
            QueryStatus::Complete => Ok(true),
            QueryStatus::Saved | QueryStatus::ScoringFailed if rec.files.is_some() => {
                bar.set_message(format!("{id} (scoring)"));
                *rec = self.score(plan, rec.clone()).await?;
                run.write(self.dir)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Records `outcome` of query `id`: a finished query's outputs are saved (run.json
    /// says `saved`) and scored; any other outcome is its status and error. Then its
    /// `peak` RSS; run.json is written. True when the query is complete.
    async fn record(
        &self,
        run: &mut RunFile,
        id: &str,
        plan: &QueryPlan,
        outcome: Outcome,
        peak: PeakRss,
        bar: &ProgressBar,
    ) -> Result<bool> {
        let dir = self.dir;
        let rec = run.query_mut(id).expect("record");
        match outcome {
            Outcome::Done(done) => {
                let (out, saved) = *done;
                rec.runtime_s = Some(out.runtime_s);
                rec.measurements = Some(out.measurements.clone());
                if let SavedRows::Summary(summary) = &saved {
                    bar.println(format!("{id}: {}", summary.note));
                }
                match save_blocking(&self.scorer, dir, id, plan, out, saved).await {
                    Ok(files) => {
                        rec.files = Some(files);
                        rec.status = QueryStatus::Saved;
                        let saved = rec.clone();
                        run.write(dir)?;
                        let scored = self.score(plan, saved);
                        *run.query_mut(id).expect("record") = scored.await?;
                    }
                    Err(e) => {
                        rec.status = QueryStatus::Failed;
                        rec.error = Some(format!("SaveError: {e}"));
                    }
                }
            }
            Outcome::Failed(e) => {
                rec.status = QueryStatus::Failed;
                rec.error = Some(e);
            }
            Outcome::Timeout(e) => {
                rec.status = QueryStatus::Timeout;
                rec.error = Some(e);
            }
            Outcome::OverBudget(e) => {
                rec.status = QueryStatus::OverBudget;
                rec.error = Some(e);
            }
            Outcome::Interrupted => {
                rec.status = QueryStatus::Failed;
                rec.error = Some(
                    "Interrupted: the run was interrupted (Ctrl-C or SIGTERM) while this query ran"
                        .into(),
                );
            }
        }
        if let Some(peak) = peak.bytes()
            && let Some(m) = run.query_mut(id).expect("record").measurements.as_mut()
        {
            m.peak_rss_bytes = Some(aisql_engine::inference::work::Max(peak));
        }
        let rec = run.query(id).expect("record");
        let done = rec.status == QueryStatus::Complete;
        if let Some(e) = &rec.error {
            bar.println(format!("{id}: {}: {e}", rec.status.as_str()));
        }
        run.write(dir)?;
        Ok(done)
    }

    /// Scores `rec` on a blocking thread and returns it scored.
    async fn score(&self, plan: &QueryPlan, rec: QueryRecord) -> Result<QueryRecord> {
        score_blocking(&self.scorer, self.dir, plan, rec, self.gpu_count, self.rate).await
    }

    /// Ends the run: its final status, `finished_at`, run.json and the reports.
    async fn finish(self, mut run: RunFile) -> Result<RunFile> {
        run.status = final_status(&run);
        run.finished_at = Some(now_utc());
        run.write(self.dir)?;
        let dir = self.dir.to_path_buf();
        blocking(move || {
            crate::report::write_reports(&dir, &run)?;
            Ok(run)
        })
        .await
    }
}

/// Rescores the saved outputs of a run without running a model (`aisql bench report`),
/// rewriting run.json, measurements.parquet, report.md and the charts.
pub fn rescore(dir: &Path, dataset: &Dataset) -> Result<RunFile> {
    let mut run = RunFile::read(dir)?;
    verify_run_files(dir, &run)?;
    if run.corpus_id != dataset.corpus_id {
        return Err(run_error(
            dir,
            format!(
                "the run used corpus {}, the data found is {} (pass the run's --root and --sf)",
                run.corpus_id, dataset.corpus_id
            ),
        ));
    }
    let format_name = run
        .metadata
        .get("prompt_format")
        .and_then(|v| v.as_str())
        .unwrap_or("raw-v1")
        .to_string();
    let mut plans = Vec::new();
    for rec in &run.queries {
        let Some(files) = &rec.files else { continue };
        let plan = read_saved_plan(dir, files)?;
        let hash = plan.definition_hash(&format_name);
        if hash != rec.definition_hash {
            return Err(run_error(
                dir,
                format!(
                    "{}: the saved plan's definition hash {hash} differs from run.json's {}",
                    rec.id, rec.definition_hash
                ),
            ));
        }
        plans.push((rec.id.clone(), plan));
    }
    let scorer = Scorer::new(dataset, &templates_of(plans.iter().map(|(_, p)| p)))?;
    let (gpu_count, rate) = (run.gpu_count, run.gpu_hourly_rate_usd);
    for (id, plan) in &plans {
        let rec = run.query_mut(id).expect("record");
        if !matches!(
            rec.status,
            QueryStatus::Saved | QueryStatus::Complete | QueryStatus::ScoringFailed
        ) {
            continue;
        }
        let measurements = rec.measurements.clone().unwrap_or_default();
        if let Some(files) = rec.files.as_mut() {
            let old = files.prompt_pieces.take();
            files.prompt_pieces = scorer.save_pieces(dir, id, plan, &measurements)?;
            if let Some(old) = old {
                files.sha256.remove(&old);
            }
            if let Some(p) = &files.prompt_pieces {
                files.sha256.insert(p.clone(), sha256_file(&dir.join(p))?);
            }
        }
        scorer.score_into(dir, plan, rec, gpu_count, rate);
    }
    if run.status != RunStatus::Running {
        run.status = final_status(&run);
    }
    run.write(dir)?;
    crate::report::write_reports(dir, &run)?;
    Ok(run)
}

#[cfg(test)]
mod tests {
    use crate::quailb::oracle::OracleBackend;

    use super::*;
    use crate::plans::PlanSource;

    const SF: f64 = 0.001;

    /// A stand-in dataset under `root` (the oracle answers from its labels, fast).
    fn dataset(root: &Path) -> Dataset {
        aisql_standin::generate(root, SF).unwrap();
        Dataset::open(root, SF, None).unwrap()
    }

    fn options(dir: &Path, resume: bool) -> BenchOptions {
        BenchOptions {
            output_dir: dir.to_path_buf(),
            resume,
            timeout: None,
            fail_fast: false,
            gpu_count: 1,
            gpu_hourly_rate_usd: None,
            backend_metadata: Metadata::new(),
            plans: PlanSource::Embedded.describe(),
            user_metadata: Metadata::new(),
            format: Default::default(),
            progress: aisql_engine::exec::progress::ProgressMode::Hidden,
            batch_rows: 256,
            memory_limit: aisql_engine::limits::host_memory::default_memory_limit(),
            budget: None,
            on_row_error: Default::default(),
            reuse_earlier_kv: false,
            estimator: None,
        }
    }

    fn queries(ids: &[&str]) -> Vec<(String, QueryPlan)> {
        let ids: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
        PlanSource::Embedded
            .select(Some(&ids), Default::default())
            .unwrap()
    }

    fn metadata(backend: &str) -> Metadata {
        Metadata::from_iter([("backend".to_string(), backend.into())])
    }

    fn statuses(run: &RunFile) -> Vec<QueryStatus> {
        run.queries.iter().map(|q| q.status).collect()
    }

    #[test]
    fn a_new_run_has_every_query_pending_and_needs_an_unused_folder() {
        let tmp = tempfile::tempdir().unwrap();
        let ds = dataset(&tmp.path().join("quailb"));
        let dir = tmp.path().join("run");
        let ids = ["IMDB-1", "FEV-10"];
        let (run, plans) = open_run(
            &options(&dir, false),
            &ds,
            metadata("oracle"),
            queries(&ids),
        )
        .unwrap();
        assert_eq!(run.status, RunStatus::Running);
        assert_eq!(run.corpus_id, ds.corpus_id);
        assert_eq!(statuses(&run), [QueryStatus::Pending; 2]);
        let planned: Vec<&str> = plans.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(planned, ids);
        // run.json is written before any query runs.
        assert_eq!(RunFile::read(&dir).unwrap(), run);

        let e = open_run(
            &options(&dir, false),
            &ds,
            metadata("oracle"),
            queries(&ids),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("not empty") && e.contains("--resume"), "{e}");
    }

    #[test]
    fn resume_is_refused_for_other_settings_or_data_and_redoes_changed_plans() {
        let tmp = tempfile::tempdir().unwrap();
        let ds = dataset(&tmp.path().join("quailb"));
        let dir = tmp.path().join("run");
        let ids = ["IMDB-1", "FEV-10"];
        open_run(
            &options(&dir, false),
            &ds,
            metadata("oracle"),
            queries(&ids),
        )
        .unwrap();
        let resume = options(&dir, true);

        // Another backend: results that are not comparable.
        let e = open_run(&resume, &ds, metadata("model"), queries(&ids))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(r#"the run used backend "oracle", this resume has backend "model""#),
            "{e}"
        );
        // Another corpus.
        let mut other = ds.clone();
        other.corpus_id = "c_0123456789abcdef0123456789abcdef".into();
        let e = open_run(&resume, &other, metadata("oracle"), queries(&ids))
            .unwrap_err()
            .to_string();
        assert!(e.contains("resume with the run's data"), "{e}");
        // A query of the run whose plan was not loaded.
        let e = open_run(&resume, &ds, metadata("oracle"), queries(&["IMDB-1"]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("FEV-10 is in the run but was not among the plans"),
            "{e}"
        );
        // Refusals leave the run as it was.
        assert!(
            !RunFile::read(&dir)
                .unwrap()
                .metadata
                .contains_key("resumed")
        );

        // A record whose plan changed since is run again.
        let mut run = RunFile::read(&dir).unwrap();
        let rec = run.query_mut("FEV-10").unwrap();
        rec.definition_hash = "an older plan".into();
        rec.status = QueryStatus::Failed;
        rec.error = Some("EngineError: earlier".into());
        run.status = RunStatus::Failed;
        run.write(&dir).unwrap();
        let (run, plans) = open_run(&resume, &ds, metadata("oracle"), queries(&ids)).unwrap();
        assert_eq!(run.status, RunStatus::Running);
        assert_eq!(run.metadata["resumed"], 1);
        let fev = run.query("FEV-10").unwrap();
        assert_eq!(fev.status, QueryStatus::Pending);
        assert_eq!(fev.error, None);
        assert_eq!(
            fev.definition_hash,
            plans[1].1.definition_hash(resume.format.name())
        );
        assert_eq!(RunFile::read(&dir).unwrap(), run);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_outcome_is_recorded_in_run_json() {
        let tmp = tempfile::tempdir().unwrap();
        let ds = dataset(&tmp.path().join("quailb"));
        let dir = tmp.path().join("run");
        let ids = ["IMDB-1", "IMDB-2", "FEV-10", "BIO-3"];
        let opts = options(&dir, false);
        let (mut run, plans) = open_run(&opts, &ds, metadata("oracle"), queries(&ids)).unwrap();
        let recorder = Recorder::new(&dir, &ds, &run, &plans).await.unwrap();
        let bar = ProgressBar::hidden();
        let outcomes = [
            Outcome::Failed("EngineError: no".into()),
            Outcome::Timeout("TimeoutError: late".into()),
            Outcome::OverBudget("BudgetError: spent".into()),
            Outcome::Interrupted,
        ];
        for ((id, plan), outcome) in plans.iter().zip(outcomes) {
            let peak = PeakRss { known: false };
            let done = recorder
                .record(&mut run, id, plan, outcome, peak, &bar)
                .await
                .unwrap();
            assert!(!done, "{id}");
            // Written at once: a crash after this keeps the outcome.
            assert_eq!(RunFile::read(&dir).unwrap(), run);
        }
        use QueryStatus::*;
        assert_eq!(statuses(&run), [Failed, Timeout, OverBudget, Failed]);
        let errors: Vec<&str> = run
            .queries
            .iter()
            .flat_map(|q| q.error.as_deref())
            .collect();
        assert_eq!(
            errors[..3],
            [
                "EngineError: no",
                "TimeoutError: late",
                "BudgetError: spent"
            ]
        );
        assert!(errors[3].starts_with("Interrupted:"), "{}", errors[3]);

        let run = recorder.finish(run).await.unwrap();
        assert_eq!(run.status, RunStatus::Failed);
        assert!(run.finished_at.is_some());
        assert_eq!(RunFile::read(&dir).unwrap(), run);
        assert!(dir.join(crate::report::REPORT_MD).is_file());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_query_the_oracle_answers_is_saved_scored_and_kept_on_resume() {
        let tmp = tempfile::tempdir().unwrap();
        let ds = dataset(&tmp.path().join("quailb"));
        let dir = tmp.path().join("run");
        let labels = Arc::new(ds.load_labels(None).unwrap());
        let oracle: Arc<dyn InferenceBackend> = Arc::new(OracleBackend::new(labels));
        let ids = ["IMDB-1"];
        let run = run_bench(&options(&dir, false), &ds, oracle.clone(), queries(&ids))
            .await
            .unwrap();
        assert_eq!(run.status, RunStatus::Complete);
        let rec = run.query("IMDB-1").unwrap();
        assert_eq!(rec.status, QueryStatus::Complete);
        assert!(rec.metrics.is_some() && rec.runtime_s.is_some());
        let files = rec.files.as_ref().unwrap();
        assert_eq!(damaged(&dir, files), None);

        // Resumed, the complete query is kept as it is, not run again.
        let (mut resumed, plans) = open_run(
            &options(&dir, true),
            &ds,
            run.metadata.clone(),
            queries(&ids),
        )
        .unwrap();
        let recorder = Recorder::new(&dir, &ds, &resumed, &plans).await.unwrap();
        let (id, plan) = &plans[0];
        let kept = recorder
            .keep(&mut resumed, id, plan, &ProgressBar::hidden())
            .await
            .unwrap();
        assert!(kept);
        assert_eq!(resumed.query(id), run.query(id));
    }
}
