//! `aisql bench`: the QUAIL-B driver (run, `report` to rescore, `compare` two runs).

use std::path::Path;

use aisql_bench::compare::{compare_runs, comparison_markdown};
use aisql_bench::driver::{
    BenchOptions, Metadata, default_output_dir, rescore, run_bench, templates_of,
};
use aisql_bench::layout::Dataset;
use aisql_bench::metrics::QueryStatus;
use aisql_bench::plans::PlanSource;
use aisql_bench::resolve::resolve;
use aisql_bench::run_file::{RunFile, RunStatus};
use aisql_engine::data::write_guard::{OutputKind, WriteGuard};
use aisql_engine::{errln, outln};
use anyhow::{Context, bail};

use crate::cli::{BenchAction, BenchArgs, BenchRunArgs};

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.action {
        Some(BenchAction::Report { dir, root }) => report(&dir, root.as_deref()),
        Some(BenchAction::Compare { a, b, root, json }) => {
            compare(&a, &b, root.as_deref(), json.as_deref())
        }
        None => bench(args.run),
    }
}

/// The dataset a saved run was made on.
fn run_dataset(dir: &Path, root: Option<&Path>) -> anyhow::Result<Dataset> {
    let run = RunFile::read(dir)?;
    Ok(resolve(root, run.scale_factor, None)?)
}

fn report(dir: &Path, root: Option<&Path>) -> anyhow::Result<()> {
    let dataset = run_dataset(dir, root)?;
    let mut guard = WriteGuard::new();
    super::paths::add_dataset(&mut guard, &dataset);
    guard.check(dir, "the run folder", OutputKind::Folder)?;
    let run = rescore(dir, &dataset)?;
    summarize(dir, &run)?;
    Ok(())
}

fn compare(a: &Path, b: &Path, root: Option<&Path>, json: Option<&Path>) -> anyhow::Result<()> {
    // The runs are checked before they are read, the data root once it is known.
    let mut guard = WriteGuard::new();
    guard.add(a, "the compared run").add(b, "the compared run");
    if let Some(path) = json {
        guard.check(path, "--json", OutputKind::File)?;
        aisql_engine::data::files::check_output_folder(path, "--json")?;
    }
    let dataset = run_dataset(a, root)?;
    super::paths::add_dataset(&mut guard, &dataset);
    if let Some(path) = json {
        guard.check(path, "--json", OutputKind::File)?;
    }
    let c = compare_runs(a, b, &dataset)?;
    aisql_engine::console::out(comparison_markdown(&c).as_bytes())?;
    if let Some(path) = json {
        aisql_engine::data::files::write_file_atomic(
            path,
            (serde_json::to_string_pretty(&c)? + "\n").as_bytes(),
        )
        .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn summarize(dir: &Path, run: &RunFile) -> std::io::Result<()> {
    let n = run.queries.len();
    let complete = run
        .queries
        .iter()
        .filter(|q| q.status == QueryStatus::Complete)
        .count();
    let good = run
        .queries
        .iter()
        .filter(|q| {
            q.assessment
                .as_ref()
                .is_some_and(|a| a.verdict == aisql_bench::metrics::Verdict::Good)
        })
        .count();
    outln!(
        "{complete} of {n} queries complete, {good} good; results in {}",
        dir.join(aisql_bench::report::REPORT_MD).display()
    )
}

/// The user's `--metadata KEY=VALUE` pairs (VALUE parsed as JSON when it is JSON).
fn user_metadata(pairs: &[String]) -> anyhow::Result<Metadata> {
    let mut m = Metadata::new();
    for kv in pairs {
        let Some((k, v)) = kv.split_once('=') else {
            bail!("--metadata {kv:?}: expected KEY=VALUE");
        };
        let value = serde_json::from_str::<serde_json::Value>(v)
            .unwrap_or_else(|_| serde_json::Value::from(v));
        if value.as_f64().is_some_and(|f| !f.is_finite()) {
            bail!("--metadata {kv:?}: not a finite number");
        }
        m.insert(k.to_string(), value);
    }
    Ok(m)
}

fn bench(args: BenchRunArgs) -> anyhow::Result<()> {
    if args.data.tables.is_some() {
        bail!("aisql bench needs a QUAIL-B data root with reference labels (--root), not --tables");
    }
    let timeout = args.timeout_s;
    let spec = args.backend.spec()?;
    let qc = args.backend.query_config(None, &args.cost)?;
    let controls = super::budget::controls(&qc.cost, &spec)?;
    let plans = PlanSource::choose(args.plans.dir.as_deref());
    let (output_dir, resume) = match &args.resume {
        Some(dir) => (dir.clone(), true),
        None => (
            args.output_dir.clone().unwrap_or_else(default_output_dir),
            false,
        ),
    };
    // A resume runs the run's own queries at its scale factor.
    let earlier = resume.then(|| RunFile::read(&output_dir)).transpose()?;
    let (wanted, sf) = match &earlier {
        Some(run) => (
            Some(run.queries.iter().map(|q| q.id.clone()).collect::<Vec<_>>()),
            run.scale_factor,
        ),
        None => (args.queries.clone(), args.data.sf),
    };
    let format = args.backend.prompt_format.parse()?;
    let queries = plans.select(wanted.as_deref(), format)?;
    let root = args.data.root.clone();
    let dataset = resolve(root.as_deref(), sf, args.data.collection.as_deref())?;
    // Check the tables of the selected queries before running any (only those: a root
    // may hold just one dataset's tables).
    let mut needed: Vec<&str> = queries
        .iter()
        .flat_map(|(_, p)| p.relations.iter().map(|r| r.table.as_str()))
        .collect();
    needed.sort_unstable();
    needed.dedup();
    dataset.require_tables(&needed)?;
    let mut guard = WriteGuard::new();
    super::paths::add_dataset(&mut guard, &dataset);
    super::paths::add_plans(&mut guard, &args.plans);
    super::paths::add_backend_files(&mut guard, &args.backend.spec()?);
    guard.check(&output_dir, "the run folder", OutputKind::Folder)?;
    super::paths::check_stores(&guard, &args.backend.spec()?)?;
    let templates = templates_of(queries.iter().map(|(_, p)| p));
    let user_metadata = user_metadata(&args.metadata)?;
    let (backend, backend_metadata) =
        super::backend::build(&spec, Some(&dataset), Some(&templates))?;
    // Estimates where the backend computes tokens to compare them with (a
    // model, or the simulation); `--estimate` alone runs nothing else.
    let computes_tokens = spec.computes_tokens();
    let estimator = (computes_tokens || args.cost.estimate)
        .then(|| {
            super::estimate::estimator(
                &spec,
                &qc.cost,
                &backend,
                &backend_metadata,
                Default::default(),
            )
        })
        .transpose()?;
    if args.cost.estimate {
        let estimator = estimator.expect("made for --estimate");
        return estimate_only(&estimator, &args, &dataset, backend, queries);
    }
    let opts = BenchOptions {
        output_dir: output_dir.clone(),
        resume,
        timeout,
        fail_fast: args.fail_fast,
        gpu_count: args.gpu_count.unwrap_or_else(|| {
            args.backend
                .model
                .gpu
                .as_ref()
                .map_or(1, |g| g.len().max(1) as u32)
        }),
        gpu_hourly_rate_usd: args.cost.gpu_hourly_rate_usd,
        backend_metadata: backend_metadata.to_json(),
        plans: plans.describe(),
        user_metadata,
        format,
        progress: qc.cost.progress,
        batch_rows: qc.batch_rows,
        memory_limit: qc.memory_limit(),
        budget: controls.budget,
        on_row_error: controls.on_row_error,
        // Each query starts from nothing unless `--keep-kv on`: its fresh
        // tokens are its own work, the benchmark's rule.
        reuse_earlier_kv: qc.keep_kv.unwrap_or(false),
        estimator,
    };
    let rt = super::runtime()?;
    let run = rt.block_on(run_bench(&opts, &dataset, backend, queries))?;
    summarize(&output_dir, &run)?;
    if run.status != RunStatus::Complete {
        let bad = run
            .queries
            .iter()
            .filter(|q| q.status != QueryStatus::Complete)
            .count();
        bail!(
            "{bad} of {} queries did not complete (see {}); continue with --resume {}",
            run.queries.len(),
            output_dir.join("report.md").display(),
            output_dir.display()
        );
    }
    Ok(())
}

/// `aisql bench --estimate`: each query's estimate, one line each, and the
/// total; nothing is run and no run folder is written.
fn estimate_only(
    estimator: &aisql_engine::estimate::Estimator,
    args: &BenchRunArgs,
    dataset: &Dataset,
    backend: std::sync::Arc<dyn aisql_engine::inference::backend::InferenceBackend>,
    queries: Vec<(String, aisql_bench::quailb::plan::QueryPlan)>,
) -> anyhow::Result<()> {
    let options = aisql_engine::sql::options::QueryOptions {
        format: args.backend.prompt_format.parse()?,
        batch_rows: args.backend.batch_rows,
        memory_limit: args.backend.query_config(None, &args.cost)?.memory_limit(),
        ..Default::default()
    };
    let rt = super::runtime()?;
    let mut estimates = Vec::new();
    for (id, plan) in &queries {
        let estimating = estimator.backend(backend.clone())?;
        let estimate = rt
            .block_on(aisql_bench::quailb::query::estimate_query(
                estimator,
                estimating,
                plan,
                &dataset.tables,
                &options,
                &aisql_engine::sql::QueryCanceller::default(),
            ))
            .map_err(|e| anyhow::anyhow!("{id}: {e}"))?;
        errln!("{id}: {} fresh tokens", estimate.fresh_tokens)?;
        estimates.push((id.clone(), estimate));
    }
    outln!("{}", super::estimate::render_queries(&estimates)?)?;
    Ok(())
}
