//! The QUAIL-B driver: runs the catalog's queries through the engine one at a
//! time, saves each query's outputs, scores them, and keeps `run.json` current
//! after every state change (SPEC §D.6). A run can be resumed, queries can time
//! out or spend their budget without ending the run, and Ctrl-C leaves a
//! consistent run.json. Writing
//! outputs, tokenizing and scoring run on blocking threads, never on the runtime
//! that drives the engine.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aisql_engine::backend::InferenceBackend;
use aisql_engine::coverage::OnRowError;
use aisql_engine::output::{
    OutputFiles, ROWS_FILE, ROWS_SUMMARY_FILE, is_temp_name, write_answer_outputs,
};
use aisql_engine::plan::QueryPlan;
use aisql_engine::prompt::PromptFormat;
use aisql_engine::query::{QueryOptions, QueryOutput, output_schema, run_query_into};
use aisql_engine::row_sink::{ParquetRows, SavedRows};
use aisql_engine::spend::Budget;
use aisql_engine::tables::TablePaths;
use indicatif::{ProgressBar, ProgressStyle};

use crate::error::{BenchError, Result};
use crate::layout::{Dataset, sha256_file};
use crate::run_file::{
    QUAIL_B_VERSION, QueryRecord, QueryStatus, RunFile, RunStatus, SCHEMA_VERSION, now_utc,
    read_saved_plan,
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
    pub progress: aisql_engine::progress::ProgressMode,
    /// Rows per batch streamed through the AI operators.
    pub batch_rows: usize,
    /// Bytes DataFusion's operators may hold per query.
    pub memory_limit: usize,
    /// What each query may spend on the model ([`aisql_engine::spend`]): a
    /// query over it under `--on-budget fail` is recorded `over_budget` and
    /// the run goes on.
    pub budget: Option<Budget>,
    /// What a row the model cannot answer does.
    pub on_row_error: OnRowError,
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
                    aisql_engine::spend::OnBudget::Fail => "fail",
                    aisql_engine::spend::OnBudget::Partial => "partial",
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

enum Outcome {
    Done(Box<(QueryOutput, SavedRows)>),
    Failed(String),
    Timeout(String),
    OverBudget(String),
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
pub async fn run_bench(
    opts: &BenchOptions,
    dataset: &Dataset,
    backend: Arc<dyn InferenceBackend>,
    queries: Vec<(String, QueryPlan)>,
) -> Result<RunFile> {
    let dir = &opts.output_dir;
    // A disk reserve that cannot be read fails the run now, not each query.
    aisql_engine::row_sink::disk_reserve()?;
    let format_name = opts.format.name();
    let mut metadata = run_metadata(opts, backend.as_ref());

    let (mut run, plans) = if opts.resume {
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
                eprintln!("{}: {why}; running the query again", rec.id);
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
        (run, plans)
    } else {
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
        (run, queries)
    };
    run.write(dir)?;

    let scorer = {
        let (dataset, templates) = (dataset.clone(), templates_of(plans.iter().map(|(_, p)| p)));
        Arc::new(blocking(move || Scorer::new(&dataset, &templates)).await?)
    };
    let (gpu_count, rate) = (run.gpu_count, run.gpu_hourly_rate_usd);

    // Ctrl-C or SIGTERM sets a flag the loop watches (the first signal; a second
    // one ends the process as usual).
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let signal_task = tokio::spawn(async move {
        stop_signal().await;
        let _ = stop_tx.send(true);
    });

    // The run bar, and each running query's AI operators under it.
    let lines = indicatif::MultiProgress::new();
    let bar = if opts.progress == aisql_engine::progress::ProgressMode::Terminal {
        lines.add(ProgressBar::new(plans.len() as u64))
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} queries {msg}")
            .expect("progress template")
            .progress_chars("=> "),
    );
    bar.set_prefix("bench");
    let tables: TablePaths = dataset.tables.clone();
    let query_options = QueryOptions {
        format: opts.format,
        progress: opts.progress,
        progress_parent: Some(lines.clone()),
        batch_rows: opts.batch_rows,
        memory_limit: opts.memory_limit,
        budget: opts.budget,
        on_row_error: opts.on_row_error,
        ..QueryOptions::default()
    };
    let mut interrupted = false;
    for (id, plan) in &plans {
        let rec = run.query_mut(id).expect("record of every planned query");
        // Complete: nothing to do. Saved (or scoring failed) with files: score again only.
        match rec.status {
            QueryStatus::Complete => {
                bar.inc(1);
                continue;
            }
            QueryStatus::Saved | QueryStatus::ScoringFailed if rec.files.is_some() => {
                bar.set_message(format!("{id} (scoring)"));
                let scored = score_blocking(&scorer, dir, plan, rec.clone(), gpu_count, rate);
                *run.query_mut(id).expect("record") = scored.await?;
                run.write(dir)?;
                bar.inc(1);
                continue;
            }
            _ => {}
        }
        *rec = QueryRecord {
            status: QueryStatus::Running,
            ..QueryRecord::pending(id, &rec.definition_hash)
        };
        if let Some(estimator) = &opts.estimator {
            bar.set_message(format!("{id} (estimate)"));
            let estimate = async {
                let estimating = estimator.backend(backend.clone())?;
                estimator
                    .estimate_query(estimating, plan, &tables, &query_options)
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
        run.write(dir)?;
        bar.set_message(id.clone());

        // The query's own peak (its run, saving and scoring), not the run's:
        // what earlier queries freed goes back to the host first.
        aisql_engine::host_memory::release_free_memory();
        let peak_known = aisql_engine::host_memory::reset_peak_rss();
        let handle = {
            let (plan, tables, backend, o) = (
                plan.clone(),
                tables.clone(),
                backend.clone(),
                QueryOptions {
                    expected_rows,
                    ..query_options.clone()
                },
            );
            // Rows stream into the query's folder as they arrive: a result larger
            // than memory is never held.
            let rows_path = dir.join(id).join(ROWS_FILE);
            tokio::spawn(async move {
                let mut rows = ParquetRows::create(&rows_path, output_schema(&plan))?;
                let out = run_query_into(&plan, &tables, backend, &o, &mut rows).await?;
                let saved = rows.finish()?;
                Ok::<_, aisql_engine::EngineError>((out, saved))
            })
        };
        let abort = handle.abort_handle();
        let timeout = async {
            match opts.timeout {
                Some(t) => tokio::time::sleep(t).await,
                None => std::future::pending().await,
            }
        };
        let outcome = tokio::select! {
            r = handle => match r {
                Ok(Ok(out)) => Outcome::Done(Box::new(out)),
                Ok(Err(e @ aisql_engine::EngineError::OverBudget(_))) => {
                    Outcome::OverBudget(format!("BudgetError: {e}"))
                }
                Ok(Err(e)) => Outcome::Failed(format!("EngineError: {e}")),
                Err(e) => Outcome::Failed(format!("PanicError: {e}")),
            },
            _ = timeout => {
                backend.cancel();
                abort.abort();
                // The forward batch in flight runs to its end on a blocking thread:
                // say how long after the deadline the model actually stopped.
                let deadline = Instant::now();
                let waiting = backend.clone();
                let _ = tokio::task::spawn_blocking(move || waiting.wait_stopped()).await;
                Outcome::Timeout(format!(
                    "TimeoutError: query execution exceeded the {} s timeout; its model work \
                     stopped {:.3} s after the deadline",
                    opts.timeout.map_or(0.0, |t| t.as_secs_f64()),
                    deadline.elapsed().as_secs_f64()
                ))
            }
            _ = stop_rx.wait_for(|s| *s) => {
                backend.cancel();
                abort.abort();
                Outcome::Interrupted
            }
        };
        let rec = run.query_mut(id).expect("record");
        match outcome {
            Outcome::Done(done) => {
                let (out, saved) = *done;
                rec.runtime_s = Some(out.runtime_s);
                rec.measurements = Some(out.measurements.clone());
                if let SavedRows::Summary(summary) = &saved {
                    bar.println(format!("{id}: {}", summary.note));
                }
                match save_blocking(&scorer, dir, id, plan, out, saved).await {
                    Ok(files) => {
                        rec.files = Some(files);
                        rec.status = QueryStatus::Saved;
                        let saved = rec.clone();
                        run.write(dir)?;
                        let scored = score_blocking(&scorer, dir, plan, saved, gpu_count, rate);
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
                interrupted = true;
            }
        }
        if peak_known
            && let Some(peak) = aisql_engine::host_memory::peak_rss_bytes()
            && let Some(m) = run.query_mut(id).expect("record").measurements.as_mut()
        {
            m.peak_rss_bytes = Some(aisql_engine::work::Max(peak));
        }
        let rec = run.query(id).expect("record");
        let done = rec.status == QueryStatus::Complete;
        if let Some(e) = &rec.error {
            bar.println(format!("{id}: {}: {e}", rec.status.as_str()));
        }
        run.write(dir)?;
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
    run.status = final_status(&run);
    run.finished_at = Some(now_utc());
    run.write(dir)?;
    let run = {
        let dir = dir.clone();
        blocking(move || {
            crate::report::write_reports(&dir, &run)?;
            Ok(run)
        })
        .await?
    };
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
