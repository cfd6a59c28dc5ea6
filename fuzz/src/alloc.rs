//! A global allocator that measures: the largest single allocation and the peak
//! of live bytes, so a fuzz run can report "no allocation over 4 GiB". A request
//! over [`REFUSE_OVER`] is refused (the process then aborts with Rust's
//! allocation-failure message) instead of letting one input take the machine.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The promise: no single allocation over 4 GiB.
pub const REFUSE_OVER: usize = 4 << 30;

static LARGEST: AtomicUsize = AtomicUsize::new(0);
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// The measuring allocator; install it with `#[global_allocator]`.
pub struct CountingAlloc;

fn note(size: usize) {
    LARGEST.fetch_max(size, Ordering::Relaxed);
    let live = LIVE.fetch_add(size, Ordering::Relaxed) + size;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to the system allocator unchanged; only
// counters are updated around it.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > REFUSE_OVER {
            LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
            return std::ptr::null_mut();
        }
        note(layout.size());
        // SAFETY: same layout contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > REFUSE_OVER {
            LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
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
        if new_size > REFUSE_OVER {
            LARGEST.fetch_max(new_size, Ordering::Relaxed);
            return std::ptr::null_mut();
        }
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        note(new_size);
        // SAFETY: `ptr` came from this allocator with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Largest single allocation requested so far, in bytes (refused ones included).
pub fn largest_allocation() -> usize {
    LARGEST.load(Ordering::Relaxed)
}

/// Starts a new measurement of [`largest_allocation`] (one per fuzz target).
pub fn reset_largest() {
    LARGEST.store(0, Ordering::Relaxed);
}

/// Peak of live heap bytes so far.
pub fn peak_live_bytes() -> usize {
    PEAK.load(Ordering::Relaxed)
}
