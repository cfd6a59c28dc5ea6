//! What a query may use and whether it may go on: memory (the host's figures,
//! the allocation meter and guard), spend budgets, and the gate that stops a
//! cancelled query's model work.

pub mod alloc_meter;
pub mod heap_check;
pub mod host_memory;
pub mod memory_guard;
pub mod query_gate;
pub mod spend;
