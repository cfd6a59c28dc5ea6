//! `y = x Wᵀ` in f32 on AVX-512F with the weights packed at load: the prefill GEMM
//! of f32 models (candle's CPU matmul runs the `gemm` crate's AVX2 kernels on stable
//! Rust, half the width this CPU has).
//!
//! At load a weight matrix `(n, k)` is re-laid as panels of 32 output columns
//! ([`F32Matrix`]): per panel and input value, the 32 weights side by side, so the
//! micro-kernel reads two registers per step of k. Per call, the rows of `x` are
//! packed 14 at a time, value after value, so each step broadcasts 14 consecutive
//! floats. A micro-tile keeps 14 rows × 32 columns in 28 registers over a pass of
//! [`KC`] values of k; the pass's 32-column weight panel (32 KiB) stays in L1 while
//! the row panels of a task stream over it from L2.
//!
//! Every output sums its products in the same order (passes of k in order, each
//! value after value), whatever the number of rows or a row's place in the batch, so
//! a row's result does not depend on what it is packed with.
//!
//! Used only where [`f32_gemm_available`] says so; elsewhere the model keeps candle's
//! matmul. [`matmul_reference`] is the plain-Rust reference for tests.

use rayon::prelude::*;

use crate::cpu::switched_off;
use crate::panel_gemm::{self, Blocking, NR, TileJob};
use crate::{KernelError, Result};

/// Rows per micro-tile.
const MR: usize = 14;
/// Values of k per pass.
const KC: usize = 256;
/// Row tiles per task (224 rows).
const M_PANELS: usize = 16;
/// Column panels per task (256 columns).
const N_PANELS: usize = 8;

/// A matrix `(n, k)` (Hugging Face `(out, in)` layout) of f32 weights packed in
/// panels of [`NR`] columns.
pub struct F32Matrix {
    n: usize,
    k: usize,
    /// `[n.div_ceil(32)][k][32]`: weight `(col, i)` at `[(col / 32) · k · 32 + i · 32 +
    /// col % 32]`; columns past `n` are zero.
    panels: Vec<f32>,
}

impl std::fmt::Debug for F32Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("F32Matrix")
            .field("n", &self.n)
            .field("k", &self.k)
            .finish()
    }
}

fn bad(message: String) -> KernelError {
    KernelError::BadInput {
        kernel: "f32_matmul",
        message,
    }
}

impl F32Matrix {
    /// Packs an `(n, k)` row-major matrix.
    pub fn new(values: &[f32], n: usize, k: usize) -> Result<Self> {
        if n == 0 || k == 0 || values.len() != n * k {
            return Err(bad(format!(
                "{} values for a ({n}, {k}) matrix (both sides positive)",
                values.len()
            )));
        }
        let mut panels = vec![0f32; n.div_ceil(NR) * k * NR];
        panels
            .par_chunks_mut(k * NR)
            .enumerate()
            .for_each(|(j, panel)| {
                let live = (n - j * NR).min(NR);
                for c in 0..live {
                    let row = &values[(j * NR + c) * k..][..k];
                    for (i, &v) in row.iter().enumerate() {
                        panel[i * NR + c] = v;
                    }
                }
            });
        Ok(Self { n, k, panels })
    }

    /// Output columns.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Input columns.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Weight `(col, i)`, for the reference.
    fn weight(&self, col: usize, i: usize) -> f32 {
        self.panels[(col / NR) * self.k * NR + i * NR + col % NR]
    }

    /// `x Wᵀ` for `x` of `m` rows of `k` values (row-major). Call only where
    /// [`f32_gemm_available`] is true.
    pub fn matmul(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        if x.len() != m * self.k {
            return Err(bad(format!(
                "{} input values for {m} rows of {}",
                x.len(),
                self.k
            )));
        }
        if !f32_gemm_available() {
            return Err(bad("this CPU does not offer AVX-512F".into()));
        }
        if m == 0 {
            return Ok(Vec::new());
        }
        let (n, k) = (self.n, self.k);
        let a = pack_rows(x, m, k);
        let blocking = Blocking {
            mr: MR,
            m_tiles: M_PANELS,
            n_panels: N_PANELS,
            kc: KC,
        };
        // SAFETY: AVX-512F is available (checked above); each job's tile reads its
        // rows of `a` (tile r0 / MR starts at r0 · k, earlier tiles being full) and
        // its pass of panel j, and writes exactly the job's outputs.
        let y = unsafe {
            panel_gemm::run(m, n, k, &blocking, |job| {
                let b = &self.panels[job.panel * k * NR + job.k0 * NR..][..job.kc * NR];
                let tile = &a[job.r0 * k + job.k0 * job.rows..][..job.kc * job.rows];
                kernel::tile(job, tile, b);
            })
        };
        Ok(y)
    }
}

/// The `m` rows of `x` in micro-tiles of [`MR`] rows (the last one holds only the
/// rows that exist): each tile value after value over the whole of k, its rows side
/// by side, so tile `t` starts at `t · MR · k` and a pass over values `k0 ..` of it
/// is one contiguous run.
fn pack_rows(x: &[f32], m: usize, k: usize) -> Vec<f32> {
    // Every value is written below, so no memset first.
    let mut a: Vec<f32> = crate::cpu::large_buffer(m * k);
    a.spare_capacity_mut()[..m * k]
        .par_chunks_mut(MR * k)
        .enumerate()
        .for_each(|(t, tile)| {
            let live = tile.len() / k;
            let src = &x[t * MR * k..][..live * k];
            for (i, values) in tile.chunks_exact_mut(live).enumerate() {
                for (r, v) in values.iter_mut().enumerate() {
                    v.write(src[r * k + i]);
                }
            }
        });
    // SAFETY: the tiles cover `m · k` values and each wrote all of its own.
    unsafe { a.set_len(m * k) };
    a
}

/// [`F32Matrix::matmul`] over a candle tensor: `x` `(rows, k)`, f32 on the CPU (made
/// contiguous if it is not), gives `(rows, n)`.
pub fn f32_linear(x: &candle_core::Tensor, w: &F32Matrix) -> Result<candle_core::Tensor> {
    use candle_core::DType;
    crate::cpu::linear("f32_matmul", x, (w.n, w.k), &[DType::F32], |v, m| {
        w.matmul(v, m)
    })
}

/// `x Wᵀ` with every product summed exactly (f64), for tests.
pub fn matmul_reference(w: &F32Matrix, x: &[f32], m: usize) -> Vec<f32> {
    let (n, k) = (w.n, w.k);
    let mut y = vec![0f32; m * n];
    for r in 0..m {
        for col in 0..n {
            let dot: f64 = (0..k)
                .map(|i| f64::from(x[r * k + i]) * f64::from(w.weight(col, i)))
                .sum();
            y[r * n + col] = dot as f32;
        }
    }
    y
}

/// Whether this CPU runs [`F32Matrix::matmul`] (AVX-512F). Asked once;
/// `AISQL_NO_AVX512_GEMM=1` says no (to measure or test candle's path).
pub fn f32_gemm_available() -> bool {
    use std::sync::OnceLock;
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| !switched_off("AISQL_NO_AVX512_GEMM") && kernel::detect())
}

#[cfg(target_arch = "x86_64")]
mod kernel {
    use super::{MR, NR, TileJob};
    use crate::panel_gemm::store_row;
    use core::arch::x86_64::*;

    pub(super) fn detect() -> bool {
        std::arch::is_x86_feature_detected!("avx512f")
    }

    /// One micro-tile's pass: dispatches to the build for its number of rows, so a
    /// short tile does no work for rows that do not exist.
    ///
    /// # Safety
    /// AVX-512F must be available; `a` holds `job.rows · job.kc` packed values, `b`
    /// `job.kc · 32`; the job's outputs are writable (and, with `accumulate`, hold
    /// earlier passes' sums).
    pub(super) unsafe fn tile(job: &TileJob, a: &[f32], b: &[f32]) {
        debug_assert!(a.len() >= job.rows * job.kc && b.len() >= job.kc * NR);
        let mask = crate::panel_gemm::column_mask(job.cols);
        let (a, b, kc, c, ldc, acc) = (
            a.as_ptr(),
            b.as_ptr(),
            job.kc,
            job.c,
            job.ldc,
            job.accumulate,
        );
        // SAFETY: forwarded from the caller.
        unsafe {
            match job.rows {
                14 => tile_r::<14>(a, b, kc, c, ldc, mask, acc),
                13 => tile_r::<13>(a, b, kc, c, ldc, mask, acc),
                12 => tile_r::<12>(a, b, kc, c, ldc, mask, acc),
                11 => tile_r::<11>(a, b, kc, c, ldc, mask, acc),
                10 => tile_r::<10>(a, b, kc, c, ldc, mask, acc),
                9 => tile_r::<9>(a, b, kc, c, ldc, mask, acc),
                8 => tile_r::<8>(a, b, kc, c, ldc, mask, acc),
                7 => tile_r::<7>(a, b, kc, c, ldc, mask, acc),
                6 => tile_r::<6>(a, b, kc, c, ldc, mask, acc),
                5 => tile_r::<5>(a, b, kc, c, ldc, mask, acc),
                4 => tile_r::<4>(a, b, kc, c, ldc, mask, acc),
                3 => tile_r::<3>(a, b, kc, c, ldc, mask, acc),
                2 => tile_r::<2>(a, b, kc, c, ldc, mask, acc),
                1 => tile_r::<1>(a, b, kc, c, ldc, mask, acc),
                _ => unreachable!("a micro-tile has 1 ..= {MR} rows"),
            }
        }
    }

    /// # Safety
    /// As [`tile`], with `R` rows.
    #[target_feature(enable = "avx512f")]
    unsafe fn tile_r<const R: usize>(
        a: *const f32,
        b: *const f32,
        kc: usize,
        c: *mut f32,
        ldc: usize,
        mask: u32,
        accumulate: bool,
    ) {
        let mut lo = [_mm512_setzero_ps(); R];
        let mut hi = [_mm512_setzero_ps(); R];
        // SAFETY (whole body): loads read `a[..R·kc]` and `b[..32·kc]`; `store_row`
        // gets rows of `c` whose masked columns are writable.
        unsafe {
            for p in 0..kc {
                let b0 = _mm512_loadu_ps(b.add(p * NR));
                let b1 = _mm512_loadu_ps(b.add(p * NR + 16));
                let ap = a.add(p * R);
                for r in 0..R {
                    let v = _mm512_set1_ps(*ap.add(r));
                    lo[r] = _mm512_fmadd_ps(v, b0, lo[r]);
                    hi[r] = _mm512_fmadd_ps(v, b1, hi[r]);
                }
            }
            for r in 0..R {
                store_row(c.add(r * ldc), lo[r], hi[r], mask, accumulate);
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod kernel {
    use super::TileJob;

    pub(super) fn detect() -> bool {
        false
    }

    pub(super) unsafe fn tile(_: &TileJob, _: &[f32], _: &[f32]) {
        unreachable!("the AVX-512 GEMM is x86_64 only")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{assert_relatively_close, spiky};

    #[test]
    fn the_gemm_matches_the_reference_on_ragged_shapes() {
        if !f32_gemm_available() {
            eprintln!("no AVX-512F on this machine: the f32 GEMM is not exercised");
            return;
        }
        // m: one row (decode), short tiles, a partial chunk, several chunks; n: a
        // partial panel, several column groups; k: a partial pass, several passes.
        for (m, n, k) in [
            (1, 32, 64),
            (13, 48, 96),
            (15, 7, 3),
            (45, 80, 300),
            (70, 288, 513),
            (230, 40, 256),
            (300, 272, 64),
        ] {
            let w = F32Matrix::new(&spiky(n * k, 1.0), n, k).unwrap();
            let x = spiky(m * k, 2.0);
            let got = w.matmul(&x, m).unwrap();
            let want = matmul_reference(&w, &x, m);
            assert_relatively_close(&got, &want, 1e-4, (m, n, k));
        }
    }

    #[test]
    fn a_rows_result_does_not_depend_on_its_batch() {
        if !f32_gemm_available() {
            return;
        }
        let (n, k) = (96, 600);
        let w = F32Matrix::new(&spiky(n * k, 3.0), n, k).unwrap();
        let x = spiky(250 * k, 4.0);
        let all = w.matmul(&x, 250).unwrap();
        for r in [0, 13, 14, 223, 224, 249] {
            let one = w.matmul(&x[r * k..(r + 1) * k], 1).unwrap();
            assert_eq!(one, all[r * n..(r + 1) * n], "row {r}");
        }
    }

    #[test]
    fn the_layout_keeps_every_weight_and_bad_shapes_are_refused() {
        let (n, k) = (40, 5);
        let v = spiky(n * k, 0.5);
        let w = F32Matrix::new(&v, n, k).unwrap();
        for col in 0..n {
            for i in 0..k {
                assert_eq!(w.weight(col, i), v[col * k + i]);
            }
        }
        // The padded columns of the last panel are zero.
        assert!((n..64).all(|col| (0..k).all(|i| w.weight(col, i) == 0.0)));
        assert!(F32Matrix::new(&v[1..], n, k).is_err());
        assert!(F32Matrix::new(&[], 0, 0).is_err());
        assert!(w.matmul(&[0.0; 7], 1).is_err());
    }

    #[test]
    fn f32_linear_checks_its_input() {
        if !f32_gemm_available() {
            return;
        }
        use candle_core::{DType, Device, Tensor};
        let (n, k, m) = (48, 64, 5);
        let w = F32Matrix::new(&spiky(n * k, 1.5), n, k).unwrap();
        let x = Tensor::from_vec(spiky(m * k, 2.5), (m, k), &Device::Cpu).unwrap();
        let y = f32_linear(&x, &w).unwrap();
        assert_eq!(y.dims2().unwrap(), (m, n));
        let y: Vec<f32> = y.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(y, w.matmul(&spiky(m * k, 2.5), m).unwrap());
        // A transposed (non-contiguous) view is copied first.
        let xt = Tensor::from_vec(spiky(m * k, 2.5), (k, m), &Device::Cpu)
            .unwrap()
            .t()
            .unwrap();
        assert_eq!(f32_linear(&xt, &w).unwrap().dims2().unwrap(), (m, n));
        let wrong = Tensor::zeros((m, k + 1), DType::F32, &Device::Cpu).unwrap();
        assert!(
            f32_linear(&wrong, &w)
                .unwrap_err()
                .to_string()
                .contains("f32_matmul")
        );
        assert!(f32_linear(&x.to_dtype(DType::BF16).unwrap(), &w).is_err());
    }
}
