//! A query's memory bound: DataFusion's pool of `--memory-limit` bytes, and a
//! check on the whole heap at every reservation.
//!
//! DataFusion's pool sees only what operators reserve. Their output batches,
//! a join's probe-side copies and a string function's result are not
//! reserved: twenty chained self-joins at `--memory-limit 2G` held 9 GB
//! before any reservation failed. [`HeapBoundedPool`] is the session's pool:
//! besides the pool's own limit it refuses a reservation while the heap
//! ([`crate::limits::alloc_meter`], installed by the `aisql` binary) has grown more
//! than the limit (and the backend's allowance for its KV cache) since the
//! query started, so the next reservation anywhere fails with the pool's
//! error, and operators that can spill spill. Reservations come with every
//! batch a join builds, an aggregate or sort keeps, and a result row kept,
//! so the heap is checked often wherever memory grows.

use std::fmt::{Display, Formatter};
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};

use datafusion::common::{DataFusionError, Result as DfResult, human_readable_size};
use datafusion::execution::memory_pool::{
    GreedyMemoryPool, MemoryConsumer, MemoryLimit, MemoryPool, MemoryReservation,
    TrackConsumersPool,
};

/// The session's memory pool: DataFusion's greedy pool of `limit` bytes
/// (naming its largest consumers when it refuses), whose reservations also
/// fail while the heap is over the query's ceiling.
#[derive(Debug)]
pub struct HeapBoundedPool {
    /// DataFusion's pool of `limit` bytes.
    inner: TrackConsumersPool<GreedyMemoryPool>,
    /// `--memory-limit`, bytes.
    limit: usize,
    /// Live heap bytes past which no reservation is granted: the heap at the
    /// query's start plus `limit` plus the backend's allowance.
    ceiling: AtomicUsize,
}

impl HeapBoundedPool {
    /// A pool of `limit` bytes; no heap ceiling until [`Self::start_query`].
    pub fn new(limit: usize) -> Self {
        Self {
            inner: TrackConsumersPool::new(
                GreedyMemoryPool::new(limit),
                NonZeroUsize::new(5).expect("five is not zero"),
            ),
            limit,
            ceiling: AtomicUsize::new(usize::MAX),
        }
    }

    /// Starts a query: from now on the heap may hold `limit + allowance`
    /// bytes more than it does now (`allowance`: what the backend may add on
    /// the host, its KV cache and a forward batch's activations).
    pub fn start_query(&self, allowance: usize) {
        let ceiling = match crate::limits::alloc_meter::installed() {
            true => crate::limits::alloc_meter::live_bytes()
                .saturating_add(self.limit)
                .saturating_add(allowance),
            false => usize::MAX,
        };
        self.ceiling.store(ceiling, Ordering::Relaxed);
    }

    /// The heap ceiling of the running query (`usize::MAX`: none).
    pub fn ceiling(&self) -> usize {
        self.ceiling.load(Ordering::Relaxed)
    }

    /// An error when the heap has no room left under the query's ceiling, now
    /// that `operator` has made a batch (the check between operators,
    /// [`crate::limits::heap_check`]).
    pub fn check_heap_now(&self, operator: &str) -> DfResult<()> {
        let ceiling = self.ceiling();
        let live = crate::limits::alloc_meter::live_bytes();
        // No room left: the heap is at its ceiling or past it.
        if ceiling == usize::MAX || live < ceiling {
            return Ok(());
        }
        Err(DataFusionError::ResourcesExhausted(format!(
            "the query's memory passed --memory-limit {} when {operator} made a batch \
             (the heap holds {} over its ceiling, {} of it reserved in the pool; output \
             batches and function results count too). Raise --memory-limit or narrow the query",
            human_readable_size(self.limit),
            human_readable_size(live - ceiling),
            human_readable_size(self.inner.reserved()),
        )))
    }

    /// Sets the ceiling as a query's start would (tests of what checks it).
    #[cfg(test)]
    pub(crate) fn set_ceiling_for_tests(&self, ceiling: usize) {
        self.ceiling.store(ceiling, Ordering::Relaxed);
    }

    /// An error when the heap, grown by `additional` for `consumer`, would
    /// pass the query's ceiling.
    fn check_heap(&self, consumer: &str, additional: usize) -> DfResult<()> {
        let ceiling = self.ceiling();
        if ceiling == usize::MAX {
            return Ok(());
        }
        let live = crate::limits::alloc_meter::live_bytes();
        if live.saturating_add(additional) <= ceiling {
            return Ok(());
        }
        Err(DataFusionError::ResourcesExhausted(format!(
            "Failed to allocate additional {} for {}: the query's memory passed \
             --memory-limit {} (the heap holds {} over its ceiling, {} of it \
             reserved in the pool; output batches and function results count too). \
             Raise --memory-limit or narrow the query",
            human_readable_size(additional),
            consumer,
            human_readable_size(self.limit),
            human_readable_size(live + additional - ceiling),
            human_readable_size(self.inner.reserved()),
        )))
    }
}

impl Display for HeapBoundedPool {
    fn fmt(&self, f: &mut Formatter<'_>) -> std::fmt::Result {
        write!(f, "heap-bounded {}", self.inner)
    }
}

impl MemoryPool for HeapBoundedPool {
    fn name(&self) -> &str {
        "heap_bounded"
    }

    fn register(&self, consumer: &MemoryConsumer) {
        self.inner.register(consumer);
    }

    fn unregister(&self, consumer: &MemoryConsumer) {
        self.inner.unregister(consumer);
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.inner.grow(reservation, additional);
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.inner.shrink(reservation, shrink);
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> DfResult<()> {
        self.check_heap(reservation.consumer().name(), additional)?;
        self.inner.try_grow(reservation, additional)
    }

    fn reserved(&self) -> usize {
        self.inner.reserved()
    }

    fn memory_limit(&self) -> MemoryLimit {
        self.inner.memory_limit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Without the metered allocator (unit tests) the heap is not known and
    /// the pool is DataFusion's: its own limit still refuses, naming the
    /// consumer.
    #[test]
    fn without_the_meter_the_pool_keeps_its_own_limit() {
        let pool: Arc<dyn MemoryPool> = Arc::new(HeapBoundedPool::new(1000));
        let bounded = pool.downcast_ref::<HeapBoundedPool>().unwrap();
        bounded.start_query(0);
        assert_eq!(bounded.ceiling(), usize::MAX);
        let reservation = MemoryConsumer::new("rows").register(&pool);
        reservation.try_grow(600).unwrap();
        let e = reservation.try_grow(600).unwrap_err().to_string();
        assert!(e.contains("rows"), "{e}");
        assert_eq!(pool.reserved(), 600);
    }

    /// A ceiling below what the heap holds refuses every reservation with a
    /// message naming the consumer and --memory-limit; a new query's start
    /// lifts it.
    #[test]
    fn a_heap_over_the_ceiling_refuses_reservations() {
        let pool: Arc<dyn MemoryPool> = Arc::new(HeapBoundedPool::new(4 << 30));
        let bounded = pool.downcast_ref::<HeapBoundedPool>().unwrap();
        bounded.ceiling.store(0, Ordering::Relaxed);
        let reservation = MemoryConsumer::new("join build side").register(&pool);
        // The unit-test binary has no meter: live reads 0, so 1 byte is over 0.
        let e = reservation.try_grow(1).unwrap_err().to_string();
        assert!(e.contains("join build side"), "{e}");
        assert!(e.contains("--memory-limit 4.0 GB"), "{e}");
        bounded.ceiling.store(usize::MAX, Ordering::Relaxed);
        reservation.try_grow(1).unwrap();
    }
}
