//! glibc's allocator set to keep the pages it frees, for a process whose hot loop
//! allocates and frees the same buffers over and over: a decode step's
//! activations, logits and KV blocks are each a few hundred KiB to tens of MiB.
//! With glibc's defaults, blocks over the mmap threshold (128 KiB, rising only as
//! such blocks are freed) are mapped afresh and unmapped on free, and the top of a
//! heap is handed back once 128 KiB of it is free, so each step touched its
//! buffers' pages anew: one minor page fault per 4 KiB, and most of the CPU time
//! in the kernel at 16 decoding sequences.
//!
//! [`keep_freed_pages`] is for the `aisql` binary, which owns its process; a
//! library loaded into someone else's process (the Python package) leaves their
//! allocator alone. Between queries the engine still hands free memory back
//! (`malloc_trim`), so a long-running process does not keep a past query's peak.

/// Raises glibc's mmap threshold to its largest value (32 MiB on 64-bit hosts)
/// and its trim threshold to 1 GiB, so blocks under 32 MiB come from the heap and
/// freed ones are reused without going back to the kernel. Returns whether the
/// allocator took both settings; a no-op (false) off glibc, and when
/// `AISQL_MALLOC_DEFAULTS` is set to anything but empty or `0` (to measure the
/// difference). Call it once, first thing in `main`, before threads start.
pub fn keep_freed_pages() -> bool {
    if crate::cpu::switched_off("AISQL_MALLOC_DEFAULTS") {
        return false;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // glibc refuses an mmap threshold above HEAP_MAX_SIZE / 2.
        const MMAP_THRESHOLD: libc::c_int = 32 << 20;
        const TRIM_THRESHOLD: libc::c_int = 1 << 30;
        // SAFETY: mallopt only changes the allocator's parameters; it takes the
        // main arena's lock and is safe to call at any time.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    false
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn glibc_takes_the_settings() {
        // The test binary's allocator is glibc's; the values are in its range.
        if !crate::cpu::switched_off("AISQL_MALLOC_DEFAULTS") {
            assert!(super::keep_freed_pages());
        }
    }
}
