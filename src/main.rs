//! The `aisql` command line: thin — parse arguments, run the command, map the
//! outcome to an exit code (0 success, 1 error, 2 usage error, 141 when the
//! reader of its output went away, as for a process SIGPIPE ended).

use std::process::ExitCode;

use aisql::{cli, commands};
use aisql_engine::console;
use clap::Parser;

/// Every allocation is counted, so a query's memory bound sees the heap its
/// operators never reserve (`aisql_engine::limits::memory_guard`).
#[global_allocator]
static ALLOC: aisql_engine::limits::alloc_meter::MeteredAlloc =
    aisql_engine::limits::alloc_meter::MeteredAlloc::new();

fn main() -> ExitCode {
    // Before any thread starts: decoding reuses freed pages instead of faulting
    // fresh ones in on every step (see the module's measurements).
    aisql_kernels::malloc::keep_freed_pages();
    let args = cli::Cli::parse();
    // Panics that aisql catches become errors; none prints a trace of its own.
    aisql_engine::panic_hook::install();
    // DataFusion plans recursively: a deeply nested query needs a deep stack
    // (the SQL reader refuses what would not fit in this one).
    let outcome = std::thread::Builder::new()
        .name("aisql".into())
        .stack_size(commands::STACK_BYTES)
        .spawn(move || commands::run(args))
        .and_then(|t| {
            t.join().map_err(|panic| {
                std::io::Error::other(format!(
                    "internal error (a bug in aisql; RUST_BACKTRACE=1 shows where): {}",
                    aisql_engine::panic_hook::describe(panic.as_ref())
                ))
            })
        })
        .unwrap_or_else(|e| Err(e.into()));
    // Output cut short by its reader ends quietly: nobody reads an error.
    if console::pipe_closed()
        || outcome
            .as_ref()
            .is_err_and(|e| console::is_closed_pipe(e.as_ref()))
    {
        return ExitCode::from(console::CLOSED_PIPE_EXIT);
    }
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            let _ = aisql_engine::errln!("aisql: error: {err:#}");
            if err.downcast_ref::<commands::UsageError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::from(1)
            }
        }
    }
}
