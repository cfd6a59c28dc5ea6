//! `y = x Wᵀ` for bf16 weights with AVX-512 BF16 dot products (`vdpbf16ps`: AMD Zen 4
//! and later, Intel Cooper Lake): the prefill GEMM of bf16 models on CPUs without AMX.
//! candle's CPU matmul widens both bf16 operands to f32 at every call, which made bf16
//! slower than f32.
//!
//! Activations are rounded to bfloat16 (ties to even), as the AMX path does; each
//! product of two bf16 values is exact in f32 and `vdpbf16ps` sums the two products
//! of a pair into an f32 lane.
//!
//! At load a weight matrix `(n, k)` is re-laid as panels of 32 output columns
//! ([`Bf16Matrix`]): per panel and pair of input values, the 32 columns' two bf16
//! side by side (two registers). Per call, the rows of `x` are rounded and packed 14 at
//! a time, pair after pair, so one 32-bit broadcast feeds a row. A micro-tile keeps
//! 14 rows × 32 columns in 28 registers over a pass of [`KC`] pairs; the pass's
//! weight panel (32 KiB) stays in L1 while the tiles of a task stream over it from L2.
//! Tasks and passes are [`panel_gemm`](crate::panel_gemm)'s, so a row's result does
//! not depend on what it is batched with.
//!
//! Used only where [`bf16_gemm_available`] says so. [`matmul_reference`] is the same
//! arithmetic in plain Rust (exact sums), for tests.

use half::bf16;
use rayon::prelude::*;

use crate::cpu::{bf16_bits, switched_off};
use crate::panel_gemm::{self, Blocking, NR, TileJob};
use crate::{KernelError, Result};

/// Rows per micro-tile.
const MR: usize = 14;
/// Pairs of k per pass (512 values).
const KC: usize = 256;
/// Row tiles per task (224 rows).
const M_TILES: usize = 16;
/// Column panels per task (256 columns).
const N_PANELS: usize = 8;

/// A matrix `(n, k)` (Hugging Face `(out, in)` layout) of bf16 weights packed in
/// panels of [`NR`] columns.
pub struct Bf16Matrix {
    n: usize,
    k: usize,
    /// `[n.div_ceil(32)][k.div_ceil(2)][32]`, each the bits of weights `(col, 2p)`
    /// (low half) and `(col, 2p + 1)` (high half); columns past `n` and the value past
    /// an odd `k` are zero.
    panels: Vec<u32>,
}

impl std::fmt::Debug for Bf16Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bf16Matrix")
            .field("n", &self.n)
            .field("k", &self.k)
            .finish()
    }
}

fn bad(message: String) -> KernelError {
    KernelError::BadInput {
        kernel: "bf16_matmul",
        message,
    }
}

impl Bf16Matrix {
    /// Packs an `(n, k)` row-major matrix of bf16 values.
    pub fn from_bf16(values: &[bf16], n: usize, k: usize) -> Result<Self> {
        if n == 0 || k == 0 || values.len() != n * k {
            return Err(bad(format!(
                "{} values for a ({n}, {k}) matrix (both sides positive)",
                values.len()
            )));
        }
        let pairs = k.div_ceil(2);
        let mut panels = vec![0u32; n.div_ceil(NR) * pairs * NR];
        panels
            .par_chunks_mut(pairs * NR)
            .enumerate()
            .for_each(|(j, panel)| {
                for c in 0..(n - j * NR).min(NR) {
                    let row = &values[(j * NR + c) * k..][..k];
                    for (p, two) in row.chunks(2).enumerate() {
                        let lo = u32::from(two[0].to_bits());
                        let hi = two.get(1).map_or(0, |v| u32::from(v.to_bits()));
                        panel[p * NR + c] = lo | hi << 16;
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
        let pairs = self.k.div_ceil(2);
        let two = self.panels[(col / NR) * pairs * NR + (i / 2) * NR + col % NR];
        bf16::from_bits((two >> (16 * (i % 2))) as u16).to_f32()
    }

    /// `x Wᵀ` for `x` of `m` rows of `k` values (row-major). Call only where
    /// [`bf16_gemm_available`] is true.
    pub fn matmul(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        if x.len() != m * self.k {
            return Err(bad(format!(
                "{} input values for {m} rows of {}",
                x.len(),
                self.k
            )));
        }
        if !bf16_gemm_available() {
            return Err(bad("this CPU does not offer AVX-512 BF16".into()));
        }
        if m == 0 {
            return Ok(Vec::new());
        }
        let (n, pairs) = (self.n, self.k.div_ceil(2));
        let a = pack_rows(x, m, self.k);
        let blocking = Blocking {
            mr: MR,
            m_tiles: M_TILES,
            n_panels: N_PANELS,
            kc: KC,
        };
        // SAFETY: AVX-512 BF16 is available (checked above); each job reads its pass
        // of its tile (tile r0 / MR starts at r0 · pairs, earlier tiles being full) and
        // of its panel, and writes exactly its outputs.
        let y = unsafe {
            panel_gemm::run(m, n, pairs, &blocking, |job| {
                let b = &self.panels[job.panel * pairs * NR + job.k0 * NR..][..job.kc * NR];
                let tile = &a[job.r0 * pairs + job.k0 * job.rows..][..job.kc * job.rows];
                kernel::tile(job, tile, b);
            })
        };
        Ok(y)
    }
}

/// The `m` rows of `x` rounded to bfloat16 in micro-tiles of [`MR`] rows (the last
/// one holds only the rows that exist): each tile pair after pair over the whole of
/// k, its rows side by side (a 32-bit pair each, an odd `k`'s last pair padded with
/// zero), so tile `t` starts at `t · MR · k.div_ceil(2)`.
fn pack_rows(x: &[f32], m: usize, k: usize) -> Vec<u32> {
    let pairs = k.div_ceil(2);
    let mut a: Vec<u32> = crate::cpu::large_buffer(m * pairs);
    a.spare_capacity_mut()[..m * pairs]
        .par_chunks_mut(MR * pairs)
        .enumerate()
        .for_each(|(t, tile)| {
            let live = tile.len() / pairs;
            for r in 0..live {
                let row = &x[(t * MR + r) * k..][..k];
                for (p, two) in row.chunks(2).enumerate() {
                    let lo = u32::from(bf16_bits(two[0]));
                    let hi = two.get(1).map_or(0, |&v| u32::from(bf16_bits(v)));
                    tile[p * live + r].write(lo | hi << 16);
                }
            }
        });
    // SAFETY: the tiles cover `m · pairs` values and each wrote all of its own.
    unsafe { a.set_len(m * pairs) };
    a
}

/// [`Bf16Matrix::matmul`] over a candle tensor: `x` `(rows, k)` on the CPU, f32 or
/// bf16 (made contiguous if it is not), gives `(rows, n)` in `x`'s dtype.
pub fn bf16_linear(x: &candle_core::Tensor, w: &Bf16Matrix) -> Result<candle_core::Tensor> {
    use candle_core::DType;
    let dtypes = [DType::F32, DType::BF16];
    crate::cpu::linear("bf16_matmul", x, (w.n, w.k), &dtypes, |v, m| w.matmul(v, m))
}

/// The arithmetic of [`Bf16Matrix::matmul`] in plain Rust: activations rounded to
/// bfloat16, the products summed exactly (f64). Also returns, per output, the sum of
/// the products' magnitudes, the scale of f32's rounding error in that sum.
pub fn matmul_reference(w: &Bf16Matrix, x: &[f32], m: usize) -> (Vec<f32>, Vec<f32>) {
    let (n, k) = (w.n, w.k);
    let mut y = vec![0f32; m * n];
    let mut magnitude = vec![0f32; m * n];
    for r in 0..m {
        let row: Vec<f64> = x[r * k..(r + 1) * k]
            .iter()
            .map(|&v| f64::from(bf16::from_bits(bf16_bits(v)).to_f32()))
            .collect();
        for col in 0..n {
            let (mut sum, mut abs) = (0f64, 0f64);
            for (i, v) in row.iter().enumerate() {
                let p = v * f64::from(w.weight(col, i));
                sum += p;
                abs += p.abs();
            }
            y[r * n + col] = sum as f32;
            magnitude[r * n + col] = abs as f32;
        }
    }
    (y, magnitude)
}

/// Whether this CPU runs [`Bf16Matrix::matmul`] (AVX-512F and AVX-512 BF16). Asked
/// once; `AISQL_NO_BF16_GEMM=1` says no (to measure or test the other path).
pub fn bf16_gemm_available() -> bool {
    use std::sync::OnceLock;
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| !switched_off("AISQL_NO_BF16_GEMM") && kernel::detect())
}

#[cfg(target_arch = "x86_64")]
mod kernel {
    use super::{MR, NR, TileJob};
    use crate::panel_gemm::store_row;
    use core::arch::x86_64::*;

    pub(super) fn detect() -> bool {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bf16")
    }

    /// One micro-tile's pass: dispatches to the build for its number of rows, so a
    /// short tile does no work for rows that do not exist.
    ///
    /// # Safety
    /// AVX-512F and BF16 must be available; `a` holds `job.rows · job.kc` packed
    /// pairs, `b` `job.kc · 32`; the job's outputs are writable (and, with
    /// `accumulate`, hold earlier passes' sums).
    pub(super) unsafe fn tile(job: &TileJob, a: &[u32], b: &[u32]) {
        debug_assert!(a.len() >= job.rows * job.kc && b.len() >= job.kc * NR);
        let mask = crate::panel_gemm::column_mask(job.cols);
        let (a, b) = (a.as_ptr(), b.as_ptr());
        let (kc, c, ldc, acc) = (job.kc, job.c, job.ldc, job.accumulate);
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
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn tile_r<const R: usize>(
        a: *const u32,
        b: *const u32,
        kc: usize,
        c: *mut f32,
        ldc: usize,
        mask: u32,
        accumulate: bool,
    ) {
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        // SAFETY (whole body): loads read `a[..R·kc]` and `b[..32·kc]`; `store_row`
        // gets rows of `c` whose masked columns are writable.
        unsafe {
            for p in 0..kc {
                let b0: __m512bh = core::mem::transmute(_mm512_loadu_si512(b.add(p * NR).cast()));
                let b1: __m512bh =
                    core::mem::transmute(_mm512_loadu_si512(b.add(p * NR + 16).cast()));
                let ap = a.add(p * R);
                for (r, [lo, hi]) in acc.iter_mut().enumerate() {
                    let v: __m512bh = core::mem::transmute(_mm512_set1_epi32(*ap.add(r) as i32));
                    *lo = _mm512_dpbf16_ps(*lo, v, b0);
                    *hi = _mm512_dpbf16_ps(*hi, v, b1);
                }
            }
            for (r, [lo, hi]) in acc.into_iter().enumerate() {
                store_row(c.add(r * ldc), lo, hi, mask, accumulate);
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

    pub(super) unsafe fn tile(_: &TileJob, _: &[u32], _: &[u32]) {
        unreachable!("the AVX-512 BF16 GEMM is x86_64 only")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{assert_within_rounding, spiky};

    fn matrix(n: usize, k: usize, seed: f32) -> Bf16Matrix {
        let w: Vec<bf16> = spiky(n * k, seed)
            .into_iter()
            .map(|v| bf16::from_f32(v * 0.01))
            .collect();
        Bf16Matrix::from_bf16(&w, n, k).unwrap()
    }

    #[test]
    fn the_gemm_matches_the_reference_on_ragged_shapes() {
        if !bf16_gemm_available() {
            eprintln!("no AVX-512 BF16 on this machine: the bf16 GEMM is not exercised");
            return;
        }
        // m: one row (decode), short tiles, a partial chunk, several chunks; n: a
        // partial panel, several column groups; k: odd, a partial pass, several passes.
        for (m, n, k) in [
            (1, 32, 64),
            (13, 48, 96),
            (15, 7, 3),
            (45, 80, 1100),
            (70, 288, 513),
            (230, 40, 256),
            (300, 272, 64),
        ] {
            let w = matrix(n, k, 1.0);
            let x = spiky(m * k, 2.0);
            let got = w.matmul(&x, m).unwrap();
            let (want, magnitude) = matmul_reference(&w, &x, m);
            assert_within_rounding(&got, &want, &magnitude, (m, n, k));
        }
    }

    #[test]
    fn a_rows_result_does_not_depend_on_its_batch() {
        if !bf16_gemm_available() {
            return;
        }
        let (n, k) = (96, 600);
        let w = matrix(n, k, 3.0);
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
        let v: Vec<bf16> = spiky(n * k, 0.5).into_iter().map(bf16::from_f32).collect();
        let w = Bf16Matrix::from_bf16(&v, n, k).unwrap();
        for col in 0..n {
            for i in 0..k {
                assert_eq!(w.weight(col, i), v[col * k + i].to_f32());
            }
        }
        // The padded columns of the last panel, and the pad past odd k, are zero.
        assert!((n..64).all(|col| (0..6).all(|i| w.weight(col, i) == 0.0)));
        assert!((0..n).all(|col| w.weight(col, 5) == 0.0));
        assert!(Bf16Matrix::from_bf16(&v[1..], n, k).is_err());
        assert!(Bf16Matrix::from_bf16(&[], 0, 0).is_err());
        assert!(w.matmul(&[0.0; 7], 1).is_err());
    }

    #[test]
    fn bf16_linear_keeps_the_input_dtype_and_checks_its_shape() {
        if !bf16_gemm_available() {
            return;
        }
        use candle_core::{DType, Device, Tensor};
        let (n, k, m) = (48, 64, 5);
        let w = matrix(n, k, 1.5);
        let x = Tensor::from_vec(spiky(m * k, 2.5), (m, k), &Device::Cpu).unwrap();
        let y = bf16_linear(&x, &w).unwrap();
        assert_eq!((y.dtype(), y.dims2().unwrap()), (DType::F32, (m, n)));
        let y: Vec<f32> = y.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(y, w.matmul(&spiky(m * k, 2.5), m).unwrap());
        let yb = bf16_linear(&x.to_dtype(DType::BF16).unwrap(), &w).unwrap();
        assert_eq!((yb.dtype(), yb.dims2().unwrap()), (DType::BF16, (m, n)));
        let wrong = Tensor::zeros((m, k + 1), DType::F32, &Device::Cpu).unwrap();
        assert!(
            bf16_linear(&wrong, &w)
                .unwrap_err()
                .to_string()
                .contains("bf16_matmul")
        );
        assert!(bf16_linear(&x.to_dtype(DType::F16).unwrap(), &w).is_err());
    }
}
