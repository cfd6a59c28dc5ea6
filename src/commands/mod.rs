//! One module per subcommand; `run` dispatches.

mod backend;
mod bench;
mod budget;
pub mod connect;
mod data;
mod deadline;
mod estimate;
mod kv_store;
mod model;
mod owner_secret;
mod paths;
mod query;
mod rows;
mod serve;
mod shell;
mod sql;
mod worker;

use crate::cli::{Cli, Command};

/// Runs the parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    cli.validate()?;
    match cli.command {
        Command::Explain {
            plan,
            plans,
            root,
            sf,
        } => {
            if sql::looks_like_sql(&plan) && !std::path::Path::new(&plan).exists() {
                return sql::explain(&plan, root.as_deref(), sf);
            }
            let source = aisql_bench::plans::PlanSource::choose(plans.dir.as_deref());
            match aisql_bench::plans::open_plan(&plan, &source, Default::default()) {
                Ok(query) => {
                    aisql_engine::console::out(
                        aisql_bench::quailb::explain::explain(&query).as_bytes(),
                    )?;
                    Ok(())
                }
                // Any other plan: DataFusion's plans of it, as for SQL.
                Err(e @ aisql_bench::error::BenchError::NotQuailb(_)) => {
                    sql::explain_substrait(&plan, &e.to_string(), root.as_deref(), sf)
                }
                Err(e) => Err(e.into()),
            }
        }
        Command::Query(args) => query::run(args),
        Command::Sql(args) => sql::run(args),
        Command::Data(cmd) => data::run(cmd),
        Command::Model(cmd) => model::run(cmd),
        Command::Bench(args) => bench::run(args),
        Command::Worker(args) => worker::run(args),
        Command::Serve(args) => serve::run(args),
        Command::KvStore(cmd) => kv_store::run(cmd),
    }
}

/// A mistake in how aisql was called (exit code 2), found after argument
/// parsing; the configuration's field checks make the same kind.
pub use crate::config::UsageError;

/// Stack of the threads that plan and run queries (address space; pages are
/// touched only as deep as a query goes).
pub const STACK_BYTES: usize = 256 << 20;

/// A tokio runtime for the async parts of a command.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(STACK_BYTES)
        .build()?)
}
