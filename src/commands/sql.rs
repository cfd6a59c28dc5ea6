//! `aisql sql`: SQL with AI functions over `--table` files and/or a QUAIL-B
//! dataset, printed and saved like `aisql query`'s rows.

use std::sync::Arc;

use aisql_bench::quailb::oracle::OracleBackend;
use aisql_bench::resolve::resolve;
use aisql_engine::data::files::check_output_folder;
use aisql_engine::data::write_guard::{OutputKind, WriteGuard};
use aisql_engine::estimate::estimate_options;
use aisql_engine::inference::backend::InferenceBackend;
use aisql_engine::sql::options::QueryOptions;
use aisql_engine::sql::{Evaluation, SqlOutput, SqlSession, WritePolicy, templates};
use aisql_engine::{errln, outln};
use anyhow::Context;
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::logical_expr::LogicalPlan;

use super::connect::Sources;
use super::deadline::Shared;
use super::estimate::estimator;
use super::rows::StdoutRows;
use super::{UsageError, deadline};
use crate::cli::{RowOutputArgs, SqlArgs};
use crate::config::BackendSpec;

/// `TEXT=FRACTION`: the one prompt template of `templates` containing TEXT.
fn selectivity_arg<'t>(arg: &str, templates: &'t [String]) -> anyhow::Result<(&'t str, f64)> {
    let usage = |m: String| anyhow::Error::from(UsageError(format!("--selectivity {arg}: {m}")));
    let (text, fraction) = arg
        .rsplit_once('=')
        .filter(|(t, _)| !t.is_empty())
        .ok_or_else(|| usage("expected TEXT=FRACTION".into()))?;
    let fraction: f64 = fraction
        .trim()
        .parse()
        .ok()
        .filter(|f| (0.0..=1.0).contains(f))
        .ok_or_else(|| usage(format!("{fraction:?} is not a fraction between 0 and 1")))?;
    let matching: Vec<&String> = templates.iter().filter(|t| t.contains(text)).collect();
    match matching.as_slice() {
        [one] => Ok((one.as_str(), fraction)),
        [] => Err(usage(format!("no AI call's prompt contains {text:?}"))),
        many => Err(usage(format!(
            "{} prompts contain {text:?}; give more of one: {}",
            many.len(),
            many.iter()
                .map(|t| format!("{:?}", aisql_engine::inference::prompt::shorten(t, 60)))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

pub fn run(args: SqlArgs) -> anyhow::Result<()> {
    // Usage errors before any table or model is opened.
    let spec = args.backend.spec()?;
    let qc = args.backend.query_config(Some(&args.limits), &args.cost)?;
    let controls = super::budget::controls(&qc.cost, &spec)?;
    let sql = match (&args.query, &args.file) {
        (Some(q), _) => q.clone(),
        (None, Some(f)) => aisql_engine::data::input_file::read_to_string(f)
            .with_context(|| format!("reading the SQL file {}", f.display()))?,
        (None, None) if super::shell::on_terminal() => return super::shell::run(args),
        (None, None) => return Err(UsageError("give a SQL statement or -f FILE".into()).into()),
    };
    let sources = Sources::from_config(&args.data.config()?)?;
    let guard = inputs(&args, &spec, &sources);
    if let Some(out) = &args.rows.output {
        guard.check(out, "--output", OutputKind::File)?;
        check_output_folder(out, "--output")?;
        super::rows::output_format(out)?;
    }
    if let Some(out) = &args.to_substrait {
        guard.check(out, "--to-substrait", OutputKind::File)?;
        check_output_folder(out, "--to-substrait")?;
    }
    super::paths::check_stores(&guard, &spec)?;
    let options = super::connect::query_options(&spec, &qc, controls)?;
    let wanted = templates(&sql)?;
    // Writing the plan asks nothing: no model to load (that took seconds, or
    // failed for a model not at hand), an oracle without labels in its place.
    let hints = args
        .selectivity
        .iter()
        .map(|hint| selectivity_arg(hint, &wanted).map(|(t, f)| (t.to_string(), f)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let explain = plain_explain(&sql);
    let explicit_estimate = args.cost.estimate;
    let estimate = explicit_estimate || explain;
    if estimate && args.to_substrait.is_some() {
        return Err(UsageError(
            "--to-substrait writes the plan without running it: it takes no --estimate or EXPLAIN"
                .into(),
        )
        .into());
    }
    let mut progress_estimate = None;
    let (backend, estimating): (Arc<dyn InferenceBackend>, _) = if args.to_substrait.is_some() {
        (Arc::new(OracleBackend::new(Default::default())), None)
    } else {
        let (real, meta) = if wanted.is_empty() && !estimate {
            // No AI call in sight (SELECT 1, a catalog query): the model is
            // loaded only if the statement turns out to need it.
            let lazy =
                super::backend::build_for_sessions(&spec, sources.dataset.as_ref(), Some(&wanted))?;
            (lazy, Default::default())
        } else {
            super::backend::build(&spec, sources.dataset.as_ref(), Some(&wanted))?
        };
        if !wanted.is_empty() && super::estimate::progress_wants_estimate(&spec, &qc.cost) {
            let hints = hints.iter().cloned().collect();
            let estimator = estimator(&spec, &qc.cost, &real, &meta, hints)?;
            progress_estimate = Some((estimator, real.clone()));
        }
        if estimate {
            // The query runs on the estimating backend, which asks the real one
            // only about its sample.
            let estimator = estimator(
                &spec,
                &qc.cost,
                &real,
                &meta,
                hints.iter().cloned().collect(),
            )?;
            let estimating = estimator.backend(real)?;
            (
                estimating.clone() as Arc<dyn InferenceBackend>,
                Some((estimator, estimating)),
            )
        } else {
            (real, None)
        }
    };
    // An estimate (and the one made for the progress lines) runs without the
    // query's budget.
    let quiet_options = QueryOptions {
        progress: Default::default(),
        ..estimate_options(&options)
    };
    let options = if estimate {
        estimate_options(&options)
    } else {
        options
    };
    let session = SqlSession::new(backend.clone(), options, Evaluation::Operators)?;
    session.set_write_policy(WritePolicy {
        allow_writes: args.allow_writes,
        guard,
        how_to_allow: Some(super::connect::HOW_TO_ALLOW_WRITES.into()),
    });
    for (template, fraction) in &hints {
        session.set_selectivity(template, *fraction)?;
    }
    // csv or json with nothing to keep: every row is printed as it comes.
    let streamed = (args.rows.output.is_none() && args.rows.print_limit().is_none())
        .then(|| Shared::new(StdoutRows::new(args.rows.format)));
    let streamed_rows = streamed.as_ref().map(Shared::handle);
    // Reading the tables, planning and running, within --timeout-s.
    let to_substrait = args.to_substrait.clone();
    let canceller = session.canceller();
    let out = deadline::run(
        super::runtime()?,
        args.limits.timeout_s,
        &canceller,
        async move {
            sources.register(&session).await?;
            if let Some(path) = &to_substrait {
                let plan = session.to_substrait(&sql).await?;
                let bytes = if path.extension().is_some_and(|e| e == "json") {
                    aisql_engine::sql::export::encode_json(&plan)?
                } else {
                    aisql_engine::sql::export::encode(&plan)
                };
                aisql_engine::data::files::write_file_atomic(path, &bytes)?;
                errln!("Substrait plan written to {}", path.display())?;
                return Ok(None);
            }
            if estimate {
                // An estimate runs the query (EXPLAIN's statement) on the
                // estimating backend; EXPLAIN's plan is printed first.
                let estimated = run_estimate(&session, &sql, true).await?;
                if !estimated && explicit_estimate {
                    return Err(UsageError(
                        "--estimate: the statement changes data or the session; an estimate \
                         runs only queries (SELECT, WITH, VALUES)"
                            .into(),
                    )
                    .into());
                }
                if !estimated {
                    errln!("no estimate: the statement changes data or the session")?;
                }
                return Ok(None);
            }
            if let Some((estimator, real)) = progress_estimate {
                // The progress lines count up to an estimate's rows.
                let estimating = estimator.backend(real)?;
                let quiet =
                    SqlSession::new(estimating.clone(), quiet_options, Evaluation::Operators)?;
                quiet.share_tables_from(&session).await?;
                for (template, fraction) in &hints {
                    quiet.set_selectivity(template, *fraction)?;
                }
                match run_estimate(&quiet, &sql, false).await {
                    Ok(true) => session.set_expected_rows(super::estimate::progress_expected_rows(
                        &estimator.estimate(&estimating),
                    )?),
                    Ok(false) => {}
                    Err(e) => errln!("no estimate for the progress lines: {e:#}")?,
                }
            }
            if let Some(mut rows) = streamed_rows {
                let started = std::time::Instant::now();
                let plan = session.plan(&sql).await?;
                let schema = Arc::new(plan.schema().as_arrow().clone());
                rows.with(|r| r.begin(&schema))??;
                let out = session.run_plan_into(plan, started, &mut rows).await?;
                return Ok(Some(out));
            }
            Ok(Some(session.run(&sql).await?))
        },
    );
    if let Some(streamed) = streamed {
        // The printed text is ended either way (an error, the deadline):
        // what was printed stays whole csv or json.
        let printed = streamed.take()?.finish()?;
        if let (Some(total), Ok(Some(out))) = (printed, &out) {
            super::rows::summarise(total, total, &args.rows, out.runtime_s)?;
            return report_output(out);
        }
    }
    let Some(out) = out? else {
        if let Some((estimator, estimating)) = &estimating {
            super::estimate::print(&estimator.estimate(estimating), args.rows.format)?;
        }
        return Ok(());
    };
    print_output(&out, &args.rows)
}

/// Prints a statement's rows as `rows` says and, on stderr, the model work it
/// took (the shell prints each of its statements the same way).
pub(super) fn print_output(out: &SqlOutput, rows: &RowOutputArgs) -> anyhow::Result<()> {
    super::rows::emit(&out.rows()?, rows, out.runtime_s)?;
    report_output(out)
}

/// The model work a statement took, on stderr.
fn report_output(out: &SqlOutput) -> anyhow::Result<()> {
    super::rows::report_work(&out.measurements)?;
    let asked: usize = out.answers.iter().map(|a| a.len()).sum();
    if !out.calls.is_empty() {
        errln!(
            "AI operators: {} ({} prompts)",
            out.calls
                .iter()
                .map(|c| c.op_id.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            asked
        )?;
    }
    Ok(())
}

/// What `aisql sql` reads: the SQL file, each `--table` path, the dataset's
/// root and the model.
fn inputs(args: &SqlArgs, spec: &BackendSpec, sources: &Sources) -> WriteGuard {
    let mut guard = WriteGuard::new();
    if let Some(file) = &args.file {
        guard.add(file, "the SQL file");
    }
    sources.add_inputs(&mut guard);
    super::paths::add_backend_files(&mut guard, spec);
    guard
}

/// Runs the query `sql` on `session` (an estimating backend's), its rows
/// counted and dropped; for an `EXPLAIN`, prints its plan first when
/// `print_explain` and runs its statement. `false`, running nothing, for a
/// statement that changes data or the session.
async fn run_estimate(
    session: &SqlSession,
    sql: &str,
    print_explain: bool,
) -> anyhow::Result<bool> {
    let plan = session.plan(sql).await?;
    let explained = match &plan {
        LogicalPlan::Explain(e) => Some(e.plan.as_ref().clone()),
        _ => None,
    };
    if print_explain && explained.is_some() {
        // EXPLAIN only plans: its statement does not run here.
        let out = session
            .run_plan(plan.clone(), std::time::Instant::now())
            .await?;
        outln!("{}", pretty_format_batches(&out.batches)?)?;
    }
    // An estimate writes nothing, whatever EXPLAIN wraps.
    if matches!(
        explained.as_ref().unwrap_or(&plan),
        LogicalPlan::Dml(_)
            | LogicalPlan::Copy(_)
            | LogicalPlan::Ddl(_)
            | LogicalPlan::Statement(_)
    ) {
        return Ok(false);
    }
    let query = explained.unwrap_or(plan);
    let mut rows = aisql_engine::data::row_sink::CountedRows::default();
    session
        .run_plan_into(query, std::time::Instant::now(), &mut rows)
        .await?;
    Ok(true)
}

/// Whether `sql` is an `EXPLAIN` without `ANALYZE`: its plan and an estimate
/// of its statement are printed, nothing is run.
fn plain_explain(sql: &str) -> bool {
    let words: Vec<String> = sql
        .split_whitespace()
        .take(4)
        .map(|w| w.to_ascii_lowercase())
        .collect();
    words.first().is_some_and(|w| w == "explain")
        && !words[1..]
            .iter()
            .take_while(|w| ["analyze", "verbose"].contains(&w.as_str()))
            .any(|w| w == "analyze")
}

/// Whether a command-line argument is a SQL statement rather than a plan path
/// or query id.
pub fn looks_like_sql(arg: &str) -> bool {
    let first = arg.split_whitespace().next().unwrap_or_default();
    ["select", "with", "explain", "values"]
        .iter()
        .any(|k| first.eq_ignore_ascii_case(k))
}

/// A session over the QUAIL-B tables that asks no model (for EXPLAIN).
async fn explain_session(root: Option<&std::path::Path>, sf: f64) -> anyhow::Result<SqlSession> {
    let dataset = resolve(root, sf, None)?;
    let backend = std::sync::Arc::new(aisql_bench::quailb::oracle::OracleBackend::new(
        Default::default(),
    ));
    let session = SqlSession::new(backend, QueryOptions::default(), Evaluation::Operators)?;
    session
        .register_dataset(&dataset.require_all_tables()?)
        .await?;
    Ok(session)
}

/// `aisql explain PLAN` for a Substrait plan that is not a QUAIL-B plan: the
/// logical and physical plans DataFusion makes of it over the QUAIL-B tables.
pub fn explain_substrait(
    path: &str,
    not_quailb: &str,
    root: Option<&std::path::Path>,
    sf: f64,
) -> anyhow::Result<()> {
    let plan = aisql_engine::sql::plan_file::read_plan_file(std::path::Path::new(path))?;
    super::runtime()?.block_on(async {
        let session = explain_session(root, sf).await?;
        let planned = session
            .plan_substrait(&plan)
            .await
            .with_context(|| format!("{not_quailb}; as a general query"))?;
        let physical = session
            .context()
            .state()
            .create_physical_plan(&planned)
            .await?;
        outln!("logical plan:\n{}", planned.display_indent())?;
        outln!(
            "physical plan:\n{}",
            datafusion::physical_plan::displayable(physical.as_ref()).indent(true)
        )?;
        Ok(())
    })
}

/// `aisql explain "SELECT ..."`: the plans DataFusion makes of the statement
/// over the QUAIL-B tables, before any model runs.
pub fn explain(sql: &str, root: Option<&std::path::Path>, sf: f64) -> anyhow::Result<()> {
    let statement = if sql.trim_start().to_lowercase().starts_with("explain") {
        sql.to_string()
    } else {
        format!("EXPLAIN {sql}")
    };
    super::runtime()?.block_on(async {
        let session = explain_session(root, sf).await?;
        let out = session.run(&statement).await?;
        outln!(
            "{}",
            datafusion::arrow::util::pretty::pretty_format_batches(&out.batches)?
        )?;
        Ok(())
    })
}
