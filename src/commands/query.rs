//! `aisql query PLAN`: run one plan, print its rows, optionally save outputs.

use aisql_bench::layout::Dataset;
use aisql_bench::plans::{PlanSource, open_plan};
use aisql_bench::resolve::resolve;
use aisql_engine::query::{QueryOptions, run_query};
use aisql_engine::tables::{TablePaths, tables_in_dir};
use datafusion::arrow::util::pretty::pretty_format_batches;

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
    let source = PlanSource::choose(args.plans.dir.as_deref());
    let query = open_plan(&args.plan, &source)?;
    let format = args.backend.prompt_format.parse()?;
    let needed: Vec<&str> = query.relations.iter().map(|r| r.table.as_str()).collect();
    let (tables, dataset) = resolve_tables(&args.data, &needed)?;
    if let Some(out) = &args.output_dir {
        match (&args.data.tables, &dataset) {
            (Some(dir), _) => {
                super::paths::ensure_outside(out, "--output-dir", dir, "the --tables folder")?
            }
            (None, Some(d)) => {
                super::paths::ensure_outside(out, "--output-dir", d.source.root(), "the data root")?
            }
            (None, None) => {}
        }
    }
    let (backend, _meta) =
        super::backend::build(&args.backend, dataset.as_ref(), &query.templates())?;
    let rt = super::runtime()?;
    let out = rt.block_on(run_query(
        &query,
        &tables,
        backend,
        &QueryOptions {
            format,
            progress: true,
            batch_rows: args.backend.batch_rows,
            memory_limit: args.backend.memory_limit(),
        },
    ))?;
    let shown = out.rows.slice(0, out.rows.num_rows().min(args.limit));
    println!("{}", pretty_format_batches(&[shown])?);
    println!(
        "{} row{} in {:.3} s{}",
        out.rows.num_rows(),
        if out.rows.num_rows() == 1 { "" } else { "s" },
        out.runtime_s,
        if out.rows.num_rows() > args.limit {
            format!(" ({} shown)", args.limit)
        } else {
            String::new()
        }
    );
    if let Some(fresh) = out.measurements.get("fresh_tokens") {
        eprintln!("fresh tokens: {fresh} (prompt positions computed by the model)");
    }
    if let Some(dir) = &args.output_dir {
        aisql_engine::output::write_query_outputs(dir, "", &query, &out)?;
        eprintln!("outputs written to {}", dir.display());
    }
    Ok(())
}
