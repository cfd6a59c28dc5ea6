//! `aisql query PLAN`: run one plan, print its rows, optionally save outputs.

use std::path::Path;

use aisql_bench::layout::Dataset;
use aisql_bench::plans::{PlanSource, open_plan};
use aisql_bench::quailb::output::ROWS_FILE;
use aisql_bench::quailb::query::{estimate_query, output_schema, run_query_into, run_query_with};
use aisql_bench::resolve::resolve;
use aisql_engine::data::row_sink::{HeadRows, ParquetRows, RowSink, SavedRows};
use aisql_engine::data::tables::{TablePaths, tables_in_dir};
use aisql_engine::data::write_guard::{OutputKind, WriteGuard};
use aisql_engine::errln;
use aisql_engine::sql::QueryCanceller;
use aisql_engine::sql::options::QueryOptions;
use datafusion::arrow::compute::concat_batches;

use std::collections::HashMap;

use super::deadline::{self, Shared, timed_out};
use super::estimate::estimator;
use super::rows::PrintedRows;
use crate::cli::{DataArgs, QueryArgs};

/// Tables (and the dataset, when the data is a QUAIL-B root) for a query that reads
/// the tables `needed`. Of a QUAIL-B dataset only those are checked and returned (a
/// root may hold just one dataset's tables).
pub fn resolve_tables(
    data: &DataArgs,
    needed: &[&str],
) -> anyhow::Result<(TablePaths, Option<Dataset>)> {
    if let Some(dir) = &data.tables {
        return Ok((tables_in_dir(dir)?, None));
    }
    let dataset = resolve(data.root.as_deref(), data.sf, data.collection.as_deref())?;
    let tables = dataset.require_tables(needed)?;
    Ok((tables, Some(dataset)))
}

pub fn run(args: QueryArgs) -> anyhow::Result<()> {
    // Usage errors before any plan, table or model is opened.
    let spec = args.backend.spec()?;
    let qc = args.backend.query_config(Some(&args.limits), &args.cost)?;
    let controls = super::budget::controls(&qc.cost, &spec)?;
    let source = PlanSource::choose(args.plans.dir.as_deref());
    let query = match open_plan(&args.plan, &source, args.backend.prompt_format.parse()?) {
        Ok(q) => q,
        // Not one of QUAIL-B's shapes: any plan DataFusion's consumer accepts.
        Err(e @ aisql_bench::error::BenchError::NotQuailb(_)) => {
            return run_general(&args, &e.to_string(), controls);
        }
        Err(e) => return Err(e.into()),
    };
    let options = super::connect::query_options(&spec, &qc, controls)?;
    let needed: Vec<&str> = query.relations.iter().map(|r| r.table.as_str()).collect();
    let (tables, dataset) = resolve_tables(&args.data, &needed)?;
    check_outputs(&args, dataset.as_ref())?;
    clear_output_dir(&args)?;
    let (backend, meta) = super::backend::build(&spec, dataset.as_ref(), Some(&query.templates()))?;
    let rt = super::runtime()?;
    let limit = args.limits.timeout_s;
    if args.cost.estimate {
        let estimator = estimator(&spec, &qc.cost, &backend, &meta, HashMap::new())?;
        let estimating = estimator.backend(backend)?;
        let canceller = QueryCanceller::default();
        let stops = canceller.clone();
        let estimate = deadline::run(rt, limit, &canceller, async move {
            Ok(estimate_query(&estimator, estimating, &query, &tables, &options, &stops).await?)
        })?;
        return super::estimate::print(&estimate, args.rows.format);
    }
    // Progress lines count up to an estimate's rows, made first for a model
    // (not under --timeout-s, which bounds the query alone).
    let mut options = options;
    if super::estimate::progress_wants_estimate(&spec, &qc.cost) && limit.is_none() {
        let estimator = estimator(&spec, &qc.cost, &backend, &meta, HashMap::new())?;
        let estimate = rt.block_on(async {
            let estimating = estimator.backend(backend.clone())?;
            let quiet = QueryOptions {
                progress: Default::default(),
                ..options.clone()
            };
            Ok::<_, anyhow::Error>(
                estimate_query(
                    &estimator,
                    estimating,
                    &query,
                    &tables,
                    &quiet,
                    &QueryCanceller::default(),
                )
                .await?,
            )
        });
        match estimate {
            Ok(e) => options.expected_rows = super::estimate::progress_expected_rows(&e)?,
            Err(e) => errln!("no estimate for the progress lines: {e:#}")?,
        }
    }
    let canceller = QueryCanceller::default();
    let (Some(dir), None) = (&args.output_dir, &args.rows.output) else {
        // The rows are printed, and saved whole to --output: kept in memory.
        let (rows, out) = {
            let (query, tables, stops) = (query.clone(), tables.clone(), canceller.clone());
            deadline::run(rt, limit, &canceller, async move {
                Ok(run_query_with(&query, &tables, backend, &options, &stops).await?)
            })?
        };
        super::rows::emit(&rows, &args.rows, out.runtime_s)?;
        super::rows::report_work(&out.measurements)?;
        if let Some(dir) = &args.output_dir {
            aisql_bench::quailb::output::write_query_outputs(dir, "", &query, &rows, &out)?;
            errln!("outputs written to {}", dir.display())?;
        }
        return Ok(());
    };
    // rows.parquet is written as the rows arrive; only the printed head is held,
    // or every row is printed as it arrives (csv and json without --limit).
    let schema = output_schema(&query);
    let parquet = ParquetRows::create(&dir.join(ROWS_FILE), schema.clone())?;
    // The query's task pushes rows into a sink this thread takes back at its
    // end, or at the deadline with the rows that arrived before it.
    let run = |mut sink: Box<dyn RowSink>| {
        let (query, tables, stops) = (query.clone(), tables.clone(), canceller.clone());
        deadline::run(rt, limit, &canceller, async move {
            Ok(run_query_into(&query, &tables, backend, &options, &stops, &mut *sink).await?)
        })
    };
    let (parquet, out) = match args.rows.print_limit() {
        Some(print) => {
            let sink = Shared::new(HeadRows::new(print, parquet));
            let out = run(Box::new(sink.handle()));
            let (head, total, parquet) = sink.take()?.finish();
            let out = match out {
                Err(e) if timed_out(&e) => return Err(keep_rows(e, parquet, total, dir)),
                out => out?,
            };
            let shown = concat_batches(&schema, &head)?;
            super::rows::show(&shown, total, &args.rows, out.runtime_s)?;
            (parquet, out)
        }
        None => {
            let sink = Shared::new(PrintedRows::new(args.rows.format, &schema, parquet)?);
            let out = run(Box::new(sink.handle()));
            // The printed text is ended either way: what was printed stays
            // whole csv or json.
            let (total, parquet) = sink.take()?.finish()?;
            let out = match out {
                Err(e) if timed_out(&e) => return Err(keep_rows(e, parquet, total, dir)),
                out => out?,
            };
            super::rows::summarise(total, total, &args.rows, out.runtime_s)?;
            (parquet, out)
        }
    };
    if let SavedRows::Summary(summary) = parquet.finish()? {
        errln!("{}", summary.note)?;
    }
    super::rows::report_work(&out.measurements)?;
    aisql_bench::quailb::output::write_answer_outputs(dir, "", &query, &out)?;
    errln!("outputs written to {}", dir.display())?;
    Ok(())
}

/// A query stopped by `--timeout-s`: the rows that arrived before the deadline
/// become a whole rows.parquet, and the error says so.
fn keep_rows(err: anyhow::Error, parquet: ParquetRows, total: u64, dir: &Path) -> anyhow::Error {
    let saved = match parquet.finish() {
        Ok(SavedRows::File(_)) => format!(
            "{} holds the {total} row{} that arrived before the deadline",
            dir.join(ROWS_FILE).display(),
            if total == 1 { "" } else { "s" }
        ),
        Ok(SavedRows::Summary(summary)) => summary.note,
        Err(e) => format!("the rows that arrived before the deadline were not saved: {e}"),
    };
    anyhow::anyhow!("{err}; {saved}")
}

/// Refuses `--output-dir`, `--output` and `--answer-cache` over or inside what
/// the query reads: the plan file, the `--plans` folder, the `--tables` folder or
/// the dataset's root, and the model.
fn check_outputs(args: &QueryArgs, dataset: Option<&Dataset>) -> anyhow::Result<()> {
    let mut guard = WriteGuard::new();
    let plan = std::path::Path::new(&args.plan);
    if plan.exists() {
        guard.add(plan, "the plan file");
    }
    super::paths::add_plans(&mut guard, &args.plans);
    if let Some(dir) = &args.data.tables {
        guard.add(dir, "the --tables folder");
    }
    if let Some(dataset) = dataset {
        super::paths::add_dataset(&mut guard, dataset);
    }
    super::paths::add_backend_files(&mut guard, &args.backend.spec()?);
    if let Some(dir) = &args.output_dir {
        guard.check(dir, "--output-dir", OutputKind::Folder)?;
    }
    if let Some(file) = &args.rows.output {
        guard.check(file, "--output", OutputKind::File)?;
        aisql_engine::data::files::check_output_folder(file, "--output")?;
    }
    super::paths::check_stores(&guard, &args.backend.spec()?)?;
    Ok(())
}

/// Removes what an earlier query left in `--output-dir` (its answer tables
/// would pass for this query's), saying so.
fn clear_output_dir(args: &QueryArgs) -> anyhow::Result<()> {
    if let Some(dir) = &args.output_dir {
        let removed = aisql_bench::quailb::output::clear_query_outputs(dir)?;
        if !removed.is_empty() {
            errln!(
                "removed an earlier query's outputs from {}: {}",
                dir.display(),
                removed.join(", ")
            )?;
        }
    }
    Ok(())
}

/// A Substrait plan from any producer, through the general path: DataFusion's
/// consumer, the AI rewrite, every table of the data source registered.
fn run_general(
    args: &QueryArgs,
    not_quailb: &str,
    controls: super::budget::Controls,
) -> anyhow::Result<()> {
    use aisql_engine::sql::{Evaluation, SqlSession};
    use anyhow::Context;
    let plan = aisql_engine::sql::plan_file::read_plan_file(std::path::Path::new(&args.plan))?;
    let (tables, dataset) = match &args.data.tables {
        Some(dir) => (tables_in_dir(dir)?, None),
        None => {
            let d = resolve(
                args.data.root.as_deref(),
                args.data.sf,
                args.data.collection.as_deref(),
            )?;
            (d.require_all_tables()?, Some(d))
        }
    };
    check_outputs(args, dataset.as_ref())?;
    clear_output_dir(args)?;
    let spec = args.backend.spec()?;
    let qc = args.backend.query_config(Some(&args.limits), &args.cost)?;
    let options = super::connect::query_options(&spec, &qc, controls)?;
    let rt = super::runtime()?;
    let (session, planned, estimating) = rt.block_on(async {
        // Plan with a backend that asks nothing to learn the prompts (an oracle
        // loads only their labels), then run that plan with the backend they need.
        let planning = SqlSession::new(
            std::sync::Arc::new(aisql_bench::quailb::oracle::OracleBackend::new(
                Default::default(),
            )),
            options.clone(),
            Evaluation::Operators,
        )?;
        match &dataset {
            Some(_) => planning.register_dataset(&tables).await?,
            None => {
                for (name, path) in &tables {
                    planning.register(name, path).await?;
                }
            }
        }
        // Only the oracle reads the templates. A plan the oracle cannot plan
        // (an `ai_embed` without dims: no model to size it) learns none here,
        // and is planned again below with the backend, which says what is
        // wrong if it still cannot be.
        let first = planning.plan_substrait(&plan).await;
        let templates: Vec<String> = match &first {
            Ok(planned) => aisql_engine::exec::logical::ai_nodes(planned)
                .into_iter()
                .map(|n| n.spec.call.template)
                .collect(),
            Err(_) => Vec::new(),
        };
        let (backend, meta) = match super::backend::build(&spec, dataset.as_ref(), Some(&templates))
        {
            Ok(built) => built,
            Err(e) => {
                // The plan's own error first, as when it was planned alone.
                first.with_context(|| format!("{not_quailb}; as a general query"))?;
                return Err(e);
            }
        };
        // An estimate runs the plan on the estimating backend over that one.
        let estimating = if args.cost.estimate {
            let estimator = estimator(&spec, &qc.cost, &backend, &meta, HashMap::new())?;
            let estimating = estimator.backend(backend.clone())?;
            Some((estimator, estimating))
        } else {
            None
        };
        let backend: std::sync::Arc<dyn aisql_engine::inference::backend::InferenceBackend> =
            match &estimating {
                Some((_, e)) => e.clone(),
                None => backend,
            };
        let session = SqlSession::new(backend.clone(), options, Evaluation::Operators)?;
        session.share_tables_from(&planning).await?;
        let planned = match first {
            Ok(planned) => planned,
            // Planned with the backend that runs it: an embedding's default
            // dims are its model's.
            Err(_) => session
                .plan_substrait(&plan)
                .await
                .with_context(|| format!("{not_quailb}; as a general query"))?,
        };
        Ok::<_, anyhow::Error>((session, planned, estimating))
    })?;
    let canceller = session.canceller();
    let out = deadline::run(rt, args.limits.timeout_s, &canceller, async move {
        Ok(session.run_plan(planned, std::time::Instant::now()).await?)
    })?;
    if let Some((estimator, estimating)) = estimating {
        return super::estimate::print(&estimator.estimate(&estimating), args.rows.format);
    }
    let rows = out.rows()?;
    super::rows::emit(&rows, &args.rows, out.runtime_s)?;
    super::rows::report_work(&out.measurements)?;
    if let Some(dir) = &args.output_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        aisql_engine::data::files::write_parquet(&dir.join(ROWS_FILE), &rows)?;
        let plan_bytes = aisql_engine::sql::plan_file::encode_plan(&plan);
        aisql_bench::quailb::output::write_layout(dir, "", &plan_bytes, &out.answers)?;
        errln!("outputs written to {}", dir.display())?;
    }
    Ok(())
}
