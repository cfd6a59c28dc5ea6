//! The process's heap, measured: a global allocator that forwards to the
//! system allocator and counts live bytes, their peak and the largest single
//! request. The `aisql` binary installs it so that a query's memory guard
//! ([`crate::limits::memory_guard`]) sees every allocation, also those no memory pool
//! accounts (operator output batches, a string function's result); the fuzz
//! driver installs it refusing requests over 4 GiB. Without it installed every
//! figure reads 0 and the guard stands aside.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

static LARGEST: AtomicUsize = AtomicUsize::new(0);
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// The measuring allocator; install it with `#[global_allocator]`.
pub struct MeteredAlloc {
    /// A request over this many bytes is refused (the process then aborts
    /// with Rust's allocation-failure message): the fuzz driver's promise
    /// that no input takes the machine. `usize::MAX` in the product.
    refuse_over: usize,
}

impl MeteredAlloc {
    /// Counts and refuses nothing.
    pub const fn new() -> Self {
        Self::refusing_over(usize::MAX)
    }

    /// Counts and refuses any single request over `bytes`.
    pub const fn refusing_over(bytes: usize) -> Self {
        Self { refuse_over: bytes }
    }

    /// Whether a request of `size` bytes is refused (and noted as the largest).
    fn refuses(&self, size: usize) -> bool {
        if size > self.refuse_over {
            LARGEST.fetch_max(size, Ordering::Relaxed);
            return true;
        }
        false
    }
}

impl Default for MeteredAlloc {
    fn default() -> Self {
        Self::new()
    }
}

fn note(size: usize) {
    LARGEST.fetch_max(size, Ordering::Relaxed);
    let live = LIVE.fetch_add(size, Ordering::Relaxed) + size;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to the system allocator unchanged (or
// refused with null, which the contract allows); only counters are updated
// around it, and nothing here allocates or unwinds.
unsafe impl GlobalAlloc for MeteredAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if self.refuses(layout.size()) {
            return std::ptr::null_mut();
        }
        note(layout.size());
        // SAFETY: same layout contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if self.refuses(layout.size()) {
            return std::ptr::null_mut();
        }
        note(layout.size());
        // SAFETY: same layout contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from this allocator with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if self.refuses(new_size) {
            return std::ptr::null_mut();
        }
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        note(new_size);
        // SAFETY: `ptr` came from this allocator with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Heap bytes live now (0 where [`MeteredAlloc`] is not the global allocator).
pub fn live_bytes() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// Whether [`MeteredAlloc`] is the global allocator: it has counted something.
pub fn installed() -> bool {
    PEAK.load(Ordering::Relaxed) > 0
}

/// Peak of live heap bytes so far.
pub fn peak_live_bytes() -> usize {
    PEAK.load(Ordering::Relaxed)
}

/// Starts a new measurement of [`peak_live_bytes`] at what is live now.
pub fn reset_peak() {
    PEAK.store(LIVE.load(Ordering::Relaxed).max(1), Ordering::Relaxed);
}

/// Largest single allocation requested so far, in bytes (refused ones included).
pub fn largest_allocation() -> usize {
    LARGEST.load(Ordering::Relaxed)
}

/// Starts a new measurement of [`largest_allocation`].
pub fn reset_largest() {
    LARGEST.store(0, Ordering::Relaxed);
}
