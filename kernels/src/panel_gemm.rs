//! How the CPU GEMMs with weights packed in panels of 32 output columns (f32, bf16
//! and Q8_0) split `y = x Wᵀ` into tasks, and the output buffer they write.
//!
//! A task is a chunk of rows (whole micro-tiles, chunks as even as they can be so the
//! last task is not a sliver) times a group of column panels. Within a task, for each
//! pass over a slice of k and each panel, every micro-tile of the chunk runs the
//! kernel: the pass's panel stays in L1 while the tiles stream over it from L2. The
//! first pass writes each output and later passes add to it, always in the same
//! order, so a row's result does not depend on the rows it is batched with.

use rayon::prelude::*;

use crate::cpu::SendPtr;

/// Output columns per weight panel (two registers of 16 lanes).
pub(crate) const NR: usize = 32;

/// How a GEMM splits its work.
pub(crate) struct Blocking {
    /// Rows per micro-tile.
    pub(crate) mr: usize,
    /// Micro-tiles per task.
    pub(crate) m_tiles: usize,
    /// Column panels per task.
    pub(crate) n_panels: usize,
    /// Steps of k per pass (values, pairs or blocks: whatever the kernel counts).
    pub(crate) kc: usize,
}

/// One micro-tile's pass over one panel: what a kernel computes.
pub(crate) struct TileJob {
    /// First row (a multiple of [`Blocking::mr`]).
    pub(crate) r0: usize,
    /// Rows in the tile (1 ..= `mr`; fewer only in the last tile).
    pub(crate) rows: usize,
    /// The weight panel (columns `32 · panel ..`).
    pub(crate) panel: usize,
    /// First step of k of the pass, and its number of steps.
    pub(crate) k0: usize,
    pub(crate) kc: usize,
    /// Output `(r0, 32 · panel)`; rows are `ldc` floats apart.
    pub(crate) c: *mut f32,
    pub(crate) ldc: usize,
    /// Columns of the panel that exist (1 ..= 32).
    pub(crate) cols: usize,
    /// Whether earlier passes wrote these outputs (add to them) or not (write them).
    pub(crate) accumulate: bool,
}

/// `y` (`m` × `n`, row-major) from running `tile` on every micro-tile, panel and pass
/// over `k_steps` steps of k, tasks spread over rayon's threads. `m` must be positive.
///
/// # Safety
/// `tile` must write exactly the job's `rows × cols` outputs at `c` (rows `ldc`
/// apart), every one of them when `accumulate` is false, and read them only when it
/// is true.
pub(crate) unsafe fn run(
    m: usize,
    n: usize,
    k_steps: usize,
    b: &Blocking,
    tile: impl Fn(&TileJob) + Sync,
) -> Vec<f32> {
    debug_assert!(m > 0 && n > 0 && k_steps > 0);
    let m_chunks = m.div_ceil(b.m_tiles * b.mr);
    let chunk_rows = m.div_ceil(m_chunks).next_multiple_of(b.mr);
    let m_chunks = m.div_ceil(chunk_rows);
    let panels = n.div_ceil(NR);
    let n_groups = panels.div_ceil(b.n_panels);
    // Not zeroed first: the first pass over k writes every output of its tile.
    let mut y: Vec<f32> = crate::cpu::large_buffer(m * n);
    let y_ptr = SendPtr(y.as_mut_ptr());
    (0..m_chunks * n_groups).into_par_iter().for_each(|task| {
        let (mc, ng) = (task / n_groups, task % n_groups);
        let rows = mc * chunk_rows..((mc + 1) * chunk_rows).min(m);
        let group = ng * b.n_panels..((ng + 1) * b.n_panels).min(panels);
        let run_job = |panel: usize, k0: usize, r0: usize| {
            tile(&TileJob {
                r0,
                rows: (m - r0).min(b.mr),
                panel,
                k0,
                kc: b.kc.min(k_steps - k0),
                // SAFETY: row r0 < m and column 32 · panel < n lie in `y`'s
                // capacity; only this task writes this tile's outputs.
                c: unsafe { y_ptr.at(r0 * n + panel * NR) },
                ldc: n,
                cols: (n - panel * NR).min(NR),
                accumulate: k0 > 0,
            })
        };
        if rows.len() <= b.mr {
            // One micro-tile (decoding): nothing reuses a pass's panel, so each
            // panel is read whole, front to back, before the next; each output
            // still sums its passes in the same order.
            for panel in group {
                for k0 in (0..k_steps).step_by(b.kc) {
                    run_job(panel, k0, rows.start);
                }
            }
            return;
        }
        for k0 in (0..k_steps).step_by(b.kc) {
            for panel in group.clone() {
                for r0 in rows.clone().step_by(b.mr) {
                    run_job(panel, k0, r0);
                }
            }
        }
    });
    // SAFETY: the tasks covered every (row chunk, column group), and their first
    // passes wrote every row below `m` of every column below `n` (the caller's
    // promise on `tile`): `m · n` values.
    unsafe { y.set_len(m * n) };
    y
}

/// The mask of a micro-kernel's 32 output lanes for a panel with `cols` columns.
pub(crate) fn column_mask(cols: usize) -> u32 {
    if cols >= NR {
        u32::MAX
    } else {
        (1u32 << cols) - 1
    }
}

/// Writes one micro-tile row of 32 sums (two registers) to `row`, or adds them to
/// what is there when `accumulate`, touching only the columns `mask` keeps: the
/// last step of every AVX-512 micro-kernel.
///
/// # Safety
/// AVX-512F must be available; the columns `mask` keeps of `row .. row + 32` are
/// writable (and, with `accumulate`, hold earlier passes' sums).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn store_row(
    row: *mut f32,
    lo: core::arch::x86_64::__m512,
    hi: core::arch::x86_64::__m512,
    mask: u32,
    accumulate: bool,
) {
    use core::arch::x86_64::*;
    let (m0, m1) = (mask as u16, (mask >> 16) as u16);
    // SAFETY: the masked loads and stores touch only the kept columns, which the
    // caller promises are writable.
    unsafe {
        let (mut l, mut h) = (lo, hi);
        if accumulate {
            l = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, row), l);
            h = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, row.add(16)), h);
        }
        _mm512_mask_storeu_ps(row, m0, l);
        _mm512_mask_storeu_ps(row.add(16), m1, h);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_output_is_written_once_then_added_to_in_pass_order() {
        // A "kernel" that records, per output, the passes that touched it; several
        // tiles per task, and one short tile (panel by panel).
        for m in [50, 4] {
            check_passes(m);
        }
    }

    fn check_passes(m: usize) {
        let (n, k_steps) = (70, 7);
        let b = Blocking {
            mr: 6,
            m_tiles: 3,
            n_panels: 2,
            kc: 3,
        };
        // SAFETY: the closure writes exactly the job's rows × cols outputs.
        let y = unsafe {
            run(m, n, k_steps, &b, |job| {
                assert!(job.rows >= 1 && job.rows <= 6 && job.cols >= 1 && job.cols <= NR);
                assert_eq!(job.accumulate, job.k0 > 0);
                for r in 0..job.rows {
                    for c in 0..job.cols {
                        let at = job.c.add(r * job.ldc + c);
                        let before = if job.accumulate { *at } else { 0.0 };
                        // Passes k0 = 0, 3, 6 add 1, 10, 100 in turn.
                        *at = before + 10f32.powi((job.k0 / 3) as i32);
                    }
                }
            })
        };
        assert_eq!(y.len(), m * n);
        assert!(y.iter().all(|&v| v == 111.0));
    }

    #[test]
    fn masks_cover_the_live_columns() {
        assert_eq!(column_mask(32), u32::MAX);
        assert_eq!(column_mask(1), 1);
        assert_eq!(column_mask(7), 0x7f);
    }
}
