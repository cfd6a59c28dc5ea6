//! The fuzz driver's measuring allocator: the engine's [`MeteredAlloc`]
//! refusing any request over [`REFUSE_OVER`] (the process then aborts with
//! Rust's allocation-failure message) instead of letting one input take the
//! machine, so a run can report "no allocation over 4 GiB".

pub use aisql_engine::limits::alloc_meter::{MeteredAlloc, largest_allocation, reset_largest};

/// The promise: no single allocation over 4 GiB.
pub const REFUSE_OVER: usize = 4 << 30;

/// The allocator the fuzz binaries install with `#[global_allocator]`.
pub const FUZZ_ALLOC: MeteredAlloc = MeteredAlloc::refusing_over(REFUSE_OVER);
