//! The QUAIL-B driver: runs the catalog's queries through the engine one at a
//! time, saves each query's outputs, scores them, and keeps `run.json` current
//! after every state change (SPEC §D.6). A run can be resumed, queries can time
//! out without ending the run, and Ctrl-C leaves a consistent run.json.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use aisql_engine::backend::InferenceBackend;
use aisql_engine::labels::LabelStore;
use aisql_engine::output::write_query_outputs;
use aisql_engine::plan::{Operator, QueryPlan, decode_plan};
use aisql_engine::prompt::PromptFormat;
use aisql_engine::query::{QueryOptions, QueryOutput, run_query};
use aisql_engine::tables::TablePaths;
use aisql_models::tokenizer::Tokenizer;
use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};

use crate::corpus::Corpus;
use crate::layout::Dataset;
use crate::run_file::{
    QUAIL_B_VERSION, QueryFiles, QueryMetrics, QueryRecord, QueryStatus, RunFile, RunStatus,
    SCHEMA_VERSION, Throughput, now_utc, write_atomic,
};
use crate::scoring::{Assessment, SavedQuery, score_accuracy};
use crate::tokens::{DocTokens, piece_counts, pieces_json, plan_pieces, token_metrics};

/// Environment variable naming the QUAIL-B plans folder.
pub const PLANS_ENV: &str = "AISQL_QUAILB_PLANS";

/// The plans folder: `$AISQL_QUAILB_PLANS`, else `../shared/quailb/plans` beside the
/// repository (where the project keeps the delivered plans), else `./shared/quailb/plans`.
pub fn default_plans_dir() -> PathBuf {
    if let Some(p) = std::env::var_os(PLANS_ENV) {
        return PathBuf::from(p);
    }
    let beside_repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/quailb/plans");
    if beside_repo.join("catalog.json").exists() {
        return beside_repo;
    }
    PathBuf::from("shared/quailb/plans")
}

/// One catalog entry.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct CatalogEntry {
    /// Query id.
    pub id: String,
    /// What the query does.
    pub description: String,
    /// PrivacyPolicies corpus (not among the 43).
    #[serde(default)]
    pub privacy: bool,
    /// Labels not published (not among the 43).
    #[serde(default)]
    pub labels_pending: bool,
}

/// Reads `catalog.json`.
pub fn read_catalog(plans_dir: &Path) -> anyhow::Result<Vec<CatalogEntry>> {
    let path = plans_dir.join("catalog.json");
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "reading the QUAIL-B catalog {} (set --plans or {PLANS_ENV})",
            path.display()
        )
    })?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// The queries to run, in catalog order: `wanted` ids (or `all`), default the published ones.
pub fn select_queries(
    plans_dir: &Path,
    wanted: Option<&[String]>,
) -> anyhow::Result<Vec<(String, QueryPlan)>> {
    let catalog = read_catalog(plans_dir)?;
    let published = |e: &CatalogEntry| !e.privacy && !e.labels_pending;
    let ids: Vec<String> = match wanted {
        None => catalog
            .iter()
            .filter(|e| published(e))
            .map(|e| e.id.clone())
            .collect(),
        Some(w) if w.iter().any(|x| x == "all") => catalog
            .iter()
            .filter(|e| published(e))
            .map(|e| e.id.clone())
            .collect(),
        Some(w) => {
            for x in w {
                if !catalog.iter().any(|e| &e.id == x) {
                    bail!(
                        "unknown query {x:?}; the catalog has {}",
                        catalog
                            .iter()
                            .map(|e| e.id.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                }
            }
            catalog
                .iter()
                .filter(|e| w.contains(&e.id))
                .map(|e| e.id.clone())
                .collect()
        }
    };
    ids.into_iter()
        .map(|id| {
            let plan = QueryPlan::from_file(&plans_dir.join(format!("{id}.json")))?;
            Ok((id, plan))
        })
        .collect()
}

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
    /// Run configuration recorded in run.json.
    pub metadata: serde_json::Map<String, serde_json::Value>,
    /// Prompt layout the engine sends.
    pub format: PromptFormat,
    /// Progress bars on stderr (drawn only on a terminal).
    pub progress: bool,
    /// Rows per batch streamed through the AI operators.
    pub batch_rows: usize,
}

/// What scoring needs, shared by every query of a run.
pub struct Scorer {
    labels: LabelStore,
    corpus: Corpus,
    docs: DocTokens,
    tokenizer: Tokenizer,
    table_rows: BTreeMap<String, u64>,
}

impl Scorer {
    /// Labels of `templates` and the tables of `dataset`.
    pub fn new(dataset: &Dataset, templates: &[String]) -> anyhow::Result<Self> {
        let labels = dataset
            .load_labels(Some(templates))
            .context("loading reference labels for scoring")?;
        let tokenizer = Tokenizer::vendored()?;
        Ok(Self {
            labels,
            corpus: Corpus::new(dataset.tables.clone()),
            docs: DocTokens::new(tokenizer.clone()),
            tokenizer,
            table_rows: dataset.table_rows.clone(),
        })
    }

    /// Writes `prompt_pieces.json` of a query; returns its path relative to the run.
    pub fn write_pieces(
        &self,
        run_dir: &Path,
        id: &str,
        plan: &QueryPlan,
    ) -> anyhow::Result<String> {
        let pieces = plan_pieces(plan, &self.tokenizer)?;
        let rel = format!("{id}/prompt_pieces.json");
        let text = serde_json::to_string(&pieces_json(&pieces))? + "\n";
        write_atomic(&run_dir.join(&rel), text.as_bytes())?;
        Ok(rel)
    }

    /// Scores a saved query.
    pub fn score(
        &self,
        run_dir: &Path,
        plan: &QueryPlan,
        rec: &QueryRecord,
        gpu_count: u32,
        rate: Option<f64>,
    ) -> anyhow::Result<(QueryMetrics, Assessment)> {
        let files = rec.files.as_ref().context("the query has no saved files")?;
        let runtime_s = rec.runtime_s.context("the query has no runtime")?;
        let t0 = std::time::Instant::now();
        let saved = SavedQuery::load(run_dir, files)?;
        let t1 = t0.elapsed();
        let (accuracy, assessment) =
            score_accuracy(plan, &self.labels, &self.corpus, &self.table_rows, &saved)?;
        let t2 = t0.elapsed();
        let pieces = plan_pieces(plan, &self.tokenizer)?;
        let counts = piece_counts(&pieces, &saved.answers, &self.corpus, &self.docs)?;
        if std::env::var_os("AISQL_BENCH_TIMING").is_some() {
            eprintln!(
                "{}: load {t1:?} accuracy {:?} tokens {:?}",
                rec.id,
                t2 - t1,
                t0.elapsed() - t2
            );
        }
        let empty = serde_json::Map::new();
        let tokens = token_metrics(Some(counts), rec.measurements.as_ref().unwrap_or(&empty))?;
        let input_rows: BTreeMap<String, u64> = plan
            .relations
            .iter()
            .map(|r| {
                (
                    r.alias.clone(),
                    self.table_rows.get(&r.table).copied().unwrap_or(0),
                )
            })
            .collect();
        let per_s = |v: f64| (runtime_s > 0.0).then(|| v / runtime_s);
        let has_join = plan
            .operators
            .iter()
            .any(|o| matches!(o, Operator::Join { .. }));
        let pairs = if has_join {
            let joins: Vec<u64> = plan
                .operators
                .iter()
                .filter(|o| matches!(o, Operator::Join { .. }))
                .map(|o| saved.answers_of(o.id()).map(|t| t.len() as u64))
                .collect::<Option<_>>()
                .unwrap_or_default();
            if joins.is_empty() {
                rec.measurements
                    .as_ref()
                    .and_then(|m| m.get("evaluated_document_pairs"))
                    .and_then(|v| v.as_u64())
            } else {
                Some(joins.iter().sum())
            }
        } else {
            None
        };
        let throughput = if has_join {
            Throughput::Pairs(pairs.and_then(|p| per_s(p as f64)))
        } else {
            Throughput::Documents(per_s(input_rows.values().sum::<u64>() as f64))
        };
        let cost_usd = rate.map(|r| runtime_s / 3600.0 * gpu_count as f64 * r);
        let cost_per_m = match (cost_usd, tokens.input_tokens) {
            (Some(c), Some(i)) if i > 0 => Some(c / i as f64 * 1e6),
            _ => None,
        };
        Ok((
            QueryMetrics {
                runtime_s,
                input_rows,
                accuracy,
                cost_usd,
                input_tokens: tokens.input_tokens,
                fresh_tokens: tokens.fresh_tokens,
                minimum_tokens: tokens.minimum_tokens,
                regret_tokens: tokens.regret_tokens,
                regret_approximate: tokens.regret_approximate,
                evaluated_document_pairs: pairs,
                input_tokens_per_second: tokens.input_tokens.and_then(|i| per_s(i as f64)),
                cost_usd_per_million_input_tokens: cost_per_m,
                kv_regret_percent: tokens.kv_regret_percent,
                throughput,
            },
            assessment,
        ))
    }
}

/// Scores `rec` in place: complete with metrics, or scoring_failed with the error.
fn score_into(
    scorer: &Scorer,
    run_dir: &Path,
    plan: &QueryPlan,
    rec: &mut QueryRecord,
    gpu_count: u32,
    rate: Option<f64>,
) {
    match scorer.score(run_dir, plan, rec, gpu_count, rate) {
        Ok((m, a)) => {
            rec.metrics = Some(m);
            rec.assessment = Some(a);
            rec.status = QueryStatus::Complete;
            rec.error = None;
        }
        Err(e) => {
            rec.metrics = None;
            rec.assessment = None;
            rec.status = QueryStatus::ScoringFailed;
            rec.error = Some(format!("ScoringError: {e:#}"));
        }
    }
}

fn is_empty_dir(dir: &Path) -> bool {
    std::fs::read_dir(dir).map_or(true, |mut d| d.next().is_none())
}

/// A new timestamped run folder under `benchmark_results/`.
pub fn default_output_dir() -> PathBuf {
    PathBuf::from("benchmark_results").join(chrono::Utc::now().format("%Y%m%dT%H%M%SZ").to_string())
}

enum Outcome {
    Done(Box<QueryOutput>),
    Failed(String),
    Timeout(String),
    Interrupted,
}

/// Runs `queries` and writes the run folder. Returns the final run.json; the run's
/// status is `complete` only when every query is complete.
pub async fn run_bench(
    opts: &BenchOptions,
    dataset: &Dataset,
    backend: Arc<dyn InferenceBackend>,
    queries: Vec<(String, QueryPlan)>,
) -> anyhow::Result<RunFile> {
    let dir = &opts.output_dir;
    let format_name = opts.format.name();
    let mut metadata = opts.metadata.clone();
    metadata.insert("backend".into(), backend.name().into());
    metadata.insert("prompt_format".into(), format_name.into());
    metadata
        .entry("aisql_version")
        .or_insert(env!("CARGO_PKG_VERSION").into());

    let (mut run, plans) = if opts.resume {
        let mut run =
            RunFile::read(dir).context("--resume needs the run folder of an earlier run")?;
        if run.corpus_id != dataset.corpus_id {
            bail!(
                "{}: the run used corpus {} (sf {}), this dataset is {} (sf {})",
                dir.display(),
                run.corpus_id,
                run.scale_factor,
                dataset.corpus_id,
                dataset.scale_factor
            );
        }
        let by_id: BTreeMap<String, QueryPlan> = queries.into_iter().collect();
        let mut plans = Vec::new();
        for rec in &mut run.queries {
            let plan = by_id.get(&rec.id).cloned().with_context(|| {
                format!(
                    "{} is in the run but was not loaded from the plans folder",
                    rec.id
                )
            })?;
            let hash = plan.definition_hash(format_name);
            if hash != rec.definition_hash {
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
            bail!(
                "output folder {} exists and is not empty; choose a new --output-dir or continue it with --resume {}",
                dir.display(),
                dir.display()
            );
        }
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
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

    let templates: Vec<String> = {
        let mut t: Vec<String> = plans.iter().flat_map(|(_, p)| p.templates()).collect();
        t.sort();
        t.dedup();
        t
    };
    let scorer = Scorer::new(dataset, &templates)?;
    let (gpu_count, rate) = (run.gpu_count, run.gpu_hourly_rate_usd);

    // Ctrl-C sets a flag the loop watches (the first signal; a second one kills as usual).
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let signal_task = tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            let _ = stop_tx.send(true);
        }
    });

    let bar = if opts.progress {
        ProgressBar::new(plans.len() as u64)
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
        progress: opts.progress && std::io::stderr().is_terminal(),
        batch_rows: opts.batch_rows,
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
                score_into(&scorer, dir, plan, rec, gpu_count, rate);
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
        run.write(dir)?;
        bar.set_message(id.clone());

        let handle = {
            let (plan, tables, backend, o) = (
                plan.clone(),
                tables.clone(),
                backend.clone(),
                query_options.clone(),
            );
            tokio::spawn(async move { run_query(&plan, &tables, backend, &o).await })
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
                Ok(Err(e)) => Outcome::Failed(format!("EngineError: {e}")),
                Err(e) => Outcome::Failed(format!("PanicError: {e}")),
            },
            _ = timeout => {
                backend.cancel();
                abort.abort();
                Outcome::Timeout(format!(
                    "TimeoutError: query execution exceeded the {} s timeout",
                    opts.timeout.map_or(0.0, |t| t.as_secs_f64())
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
            Outcome::Done(out) => {
                rec.runtime_s = Some(out.runtime_s);
                rec.measurements = Some(out.measurements.clone());
                let qdir = dir.join(id);
                let saved = write_query_outputs(&qdir, id, plan, &out)
                    .map_err(anyhow::Error::from)
                    .and_then(|files| Ok((files, scorer.write_pieces(dir, id, plan)?)));
                match saved {
                    Ok((files, pieces)) => {
                        rec.files = Some(QueryFiles {
                            plan: files.plan,
                            rows: files.rows,
                            filters: Some(files.filters),
                            joins: Some(files.joins),
                            classifications: Some(files.classifications),
                            prompt_pieces: Some(pieces),
                        });
                        rec.status = QueryStatus::Saved;
                        run.write(dir)?;
                        let rec = run.query_mut(id).expect("record");
                        score_into(&scorer, dir, plan, rec, gpu_count, rate);
                    }
                    Err(e) => {
                        rec.status = QueryStatus::Failed;
                        rec.error = Some(format!("SaveError: {e:#}"));
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
            Outcome::Interrupted => {
                rec.status = QueryStatus::Failed;
                rec.error = Some(
                    "Interrupted: the run was interrupted (Ctrl-C) while this query ran".into(),
                );
                interrupted = true;
            }
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
    run.status = if run
        .queries
        .iter()
        .all(|q| q.status == QueryStatus::Complete)
    {
        RunStatus::Complete
    } else {
        RunStatus::Failed
    };
    run.finished_at = Some(now_utc());
    run.write(dir)?;
    crate::report::write_reports(dir, &run)?;
    if interrupted {
        bail!(
            "interrupted; run.json is consistent, continue with --resume {}",
            dir.display()
        );
    }
    Ok(run)
}

/// Rescores the saved outputs of a run without running a model (`aisql bench report`),
/// rewriting run.json, measurements.parquet, report.md and the charts.
pub fn rescore(dir: &Path, dataset: &Dataset) -> anyhow::Result<RunFile> {
    let mut run = RunFile::read(dir)?;
    if run.corpus_id != dataset.corpus_id {
        bail!(
            "{}: the run used corpus {}, the data found is {} (pass the run's --root and --sf)",
            dir.display(),
            run.corpus_id,
            dataset.corpus_id
        );
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
        let path = dir.join(&files.plan);
        let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        let plan = QueryPlan::from_substrait(
            decode_plan(&bytes, false).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?,
        )?;
        let hash = plan.definition_hash(&format_name);
        if hash != rec.definition_hash {
            bail!(
                "{}: the saved plan's definition hash {hash} differs from run.json's {}",
                rec.id,
                rec.definition_hash
            );
        }
        plans.push((rec.id.clone(), plan));
    }
    let mut templates: Vec<String> = plans.iter().flat_map(|(_, p)| p.templates()).collect();
    templates.sort();
    templates.dedup();
    let scorer = Scorer::new(dataset, &templates)?;
    let (gpu_count, rate) = (run.gpu_count, run.gpu_hourly_rate_usd);
    for (id, plan) in &plans {
        let rec = run.query_mut(id).expect("record");
        if !matches!(
            rec.status,
            QueryStatus::Saved | QueryStatus::Complete | QueryStatus::ScoringFailed
        ) {
            continue;
        }
        if let Some(files) = rec.files.as_mut() {
            files.prompt_pieces = Some(scorer.write_pieces(dir, id, plan)?);
        }
        score_into(&scorer, dir, plan, rec, gpu_count, rate);
    }
    if run.status != RunStatus::Running {
        run.status = if run
            .queries
            .iter()
            .all(|q| q.status == QueryStatus::Complete)
        {
            RunStatus::Complete
        } else {
            RunStatus::Failed
        };
    }
    run.write(dir)?;
    crate::report::write_reports(dir, &run)?;
    Ok(run)
}
