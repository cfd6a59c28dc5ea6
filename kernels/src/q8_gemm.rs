//! `y = x Wᵀ` for Q8_0 weights with AVX-512 VNNI integer dot products: the prefill
//! GEMM of Q8_0 models on CPUs that have VNNI but no AMX (AMD Zen 4 and later, Intel
//! Ice Lake and Cascade Lake). candle's quantized matmul takes one dot product per
//! output (row by row, AVX2), which leaves most of such a CPU's int8 rate unused.
//!
//! The arithmetic is ggml's Q8_0 × Q8_0 dot product (llama.cpp's, and candle's for
//! rows whose length is not a multiple of 256): each row of `x` is quantized per block
//! of 32 values exactly as ggml does, each block's integer dot product with the
//! weights is exact, and the blocks are summed in f32 as `Σ float(dot) · d_x · d_w`.
//! Only the order of those float operations differs from ggml's.
//!
//! `vpdpbusd` multiplies unsigned bytes by signed ones, so the weights are stored
//! offset by +128 (0 ..= 255) and each block's integer sum starts at `−128 · Σ q_x`,
//! computed per row as the activations are quantized: after the block, the sum is
//! the exact signed dot product. (Offsetting the activations instead would need a
//! `−128 · Σ q_w` per column and block beside the weights: 4 more bytes per 32
//! weights read by every decode step.)
//!
//! At load a weight matrix `(n, k)` is re-laid as panels of 32 output columns
//! ([`Q8Matrix`]): per panel and block, one 64-byte-aligned [`PanelBlock`] holding,
//! per group of 4 input values, the 32 columns' 4 bytes side by side (two registers),
//! then the 32 column scales as f16. That is GGUF's 34 bytes per 32 weights, read as
//! one stream per panel. Per call, the rows of `x` are quantized into micro-tiles of
//! [`MR`] rows, 4 bytes of each row side by side, so one 32-bit broadcast feeds a row.
//! A micro-tile keeps 6 rows × 32 columns of f32 sums and of int32 block sums in 24
//! registers over a pass of [`KC_BLOCKS`] blocks; the pass's weight panel (17 KiB)
//! stays in L1 while the tiles of a task stream over it from L2.
//!
//! Every output sums its blocks in the same order whatever the batch, so a row's
//! result does not depend on what it is packed with.
//!
//! Used only where [`q8_gemm_available`] says so. [`matmul_reference`] is the same
//! arithmetic in plain Rust (exact sums), for tests.

use half::f16;
use rayon::prelude::*;

use crate::cpu::switched_off;
use crate::panel_gemm::{self, Blocking, NR, TileJob};
use crate::{KernelError, Result};

/// Input values per Q8_0 block.
pub const BLOCK: usize = 32;
/// Bytes of one Q8_0 block as GGUF and candle store it: f16 scale, 32 × i8.
const BLOCK_BYTES: usize = 2 + BLOCK;
/// Input values per group: the 4 bytes one `vpdpbusd` lane sums.
const GROUP: usize = 4;
/// Rows per micro-tile.
const MR: usize = 6;
/// Blocks of k per pass (512 values).
const KC_BLOCKS: usize = 16;
/// Row tiles per task (192 rows).
const M_TILES: usize = 32;
/// Column panels per task (256 columns).
const N_PANELS: usize = 8;

/// A matrix `(n, k)` (Hugging Face `(out, in)` layout) of Q8_0 weights re-laid in
/// panels of [`NR`] columns for the VNNI kernel.
pub struct Q8Matrix {
    n: usize,
    k: usize,
    /// `[n.div_ceil(32)][k / 32]`: block `i / 32` of the panel holding column `col`
    /// at `(col / 32) · kb + i / 32`; columns past `n` are zero.
    blocks: Vec<PanelBlock>,
}

/// One block of 32 input values of one panel of 32 columns, as the kernel reads it:
/// the quants, then the scales, in one run of 17 cache lines.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct PanelBlock {
    /// `[8][32][4]`: quant `(col, i)` (within the panel and block) at
    /// `(i / 4) · 128 + col · 4 + i % 4`, stored offset by +128.
    quants: [u8; BLOCK * NR],
    /// Each column's block scale, f16 bits as GGUF stores them.
    scales: [u16; NR],
}

impl PanelBlock {
    /// Zero weights (quant 0 is stored as 128) with zero scales.
    const ZERO: Self = Self {
        quants: [128; BLOCK * NR],
        scales: [0; NR],
    };
}

impl std::fmt::Debug for Q8Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Q8Matrix")
            .field("n", &self.n)
            .field("k", &self.k)
            .finish()
    }
}

fn bad(message: String) -> KernelError {
    KernelError::BadInput {
        kernel: "q8_matmul",
        message,
    }
}

impl Q8Matrix {
    /// The Q8_0 blocks of an `(n, k)` matrix (row after row, `k / 32` blocks of 34
    /// bytes each: f16 scale, 32 signed bytes). `k` must be a multiple of 32.
    pub fn from_q8_0(bytes: &[u8], n: usize, k: usize) -> Result<Self> {
        if !Self::fits(n, k) {
            return Err(bad(format!(
                "shape ({n}, {k}): rows must be positive, columns a positive multiple of {BLOCK}"
            )));
        }
        let kb = k / BLOCK;
        if bytes.len() != n * kb * BLOCK_BYTES {
            return Err(bad(format!(
                "{} bytes for a ({n}, {k}) Q8_0 matrix, expected {}",
                bytes.len(),
                n * kb * BLOCK_BYTES
            )));
        }
        let panels = n.div_ceil(NR);
        let mut blocks = vec![PanelBlock::ZERO; panels * kb];
        blocks
            .par_chunks_mut(kb)
            .enumerate()
            .for_each(|(j, panel)| {
                for c in 0..(n - j * NR).min(NR) {
                    let row = &bytes[(j * NR + c) * kb * BLOCK_BYTES..][..kb * BLOCK_BYTES];
                    for (to, block) in panel.iter_mut().zip(row.chunks_exact(BLOCK_BYTES)) {
                        to.scales[c] = u16::from_le_bytes([block[0], block[1]]);
                        for (i, &v) in block[2..].iter().enumerate() {
                            to.quants[(i / GROUP) * GROUP * NR + c * GROUP + i % GROUP] = v ^ 0x80;
                        }
                    }
                }
            });
        Ok(Self { n, k, blocks })
    }

    /// Whether an `(n, k)` matrix can be laid out (Q8_0 needs whole blocks of k).
    pub fn fits(n: usize, k: usize) -> bool {
        n > 0 && k > 0 && k.is_multiple_of(BLOCK)
    }

    /// Output columns.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Input columns.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Weight `(col, i)`: its quant and its block's scale, for the reference.
    fn weight(&self, col: usize, i: usize) -> (i8, f32) {
        let block = &self.blocks[(col / NR) * (self.k / BLOCK) + i / BLOCK];
        let u = block.quants[(i % BLOCK / GROUP) * GROUP * NR + (col % NR) * GROUP + i % GROUP];
        let scale = f16::from_bits(block.scales[col % NR]).to_f32();
        ((u ^ 0x80) as i8, scale)
    }

    /// `x Wᵀ` for `x` of `m` rows of `k` values (row-major). Call only where
    /// [`q8_gemm_available`] is true.
    pub fn matmul(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        matmul_side_by_side(&[self], x, m)
    }

    /// Whether matrices can be multiplied side by side ([`matmul_side_by_side`]):
    /// the same `k`, and every one's columns whole panels but the last one's.
    pub fn side_by_side(matrices: &[&Q8Matrix]) -> bool {
        let Some((last, rest)) = matrices.split_last() else {
            return false;
        };
        rest.iter().all(|w| w.k == last.k && w.n.is_multiple_of(NR))
    }
}

/// `x [W₁ W₂ …]ᵀ`: the products of `x` with several matrices of the same `k` as
/// one GEMM, their columns side by side in each output row (row `r`: `W₁`'s `n₁`
/// outputs, then `W₂`'s …). The rows are quantized once and the work is one set of
/// tasks: a decode step's query, key and value projections (or gate and up) read
/// the same input. Each output's value is that of the matrix's own [`Q8Matrix::matmul`].
/// Call only where [`q8_gemm_available`] is true, with matrices that
/// [`Q8Matrix::side_by_side`] accepts.
pub fn matmul_side_by_side(matrices: &[&Q8Matrix], x: &[f32], m: usize) -> Result<Vec<f32>> {
    if !Q8Matrix::side_by_side(matrices) {
        return Err(bad(
            "matrices side by side need the same k and whole panels of columns".into(),
        ));
    }
    let k = matrices[0].k;
    if x.len() != m * k {
        return Err(bad(format!("{} input values for {m} rows of {k}", x.len())));
    }
    if !q8_gemm_available() {
        return Err(bad("this CPU does not offer AVX-512 VNNI".into()));
    }
    if m == 0 {
        return Ok(Vec::new());
    }
    let kb = k / BLOCK;
    let n: usize = matrices.iter().map(|w| w.n).sum();
    // Panel `p` of the whole is panel `p - first` of the matrix that holds it.
    let mut firsts = Vec::with_capacity(matrices.len());
    let mut first = 0;
    for w in matrices {
        firsts.push(first);
        first += w.n.div_ceil(NR);
    }
    let a = QuantizedRows::new(x, m, k);
    let blocking = Blocking {
        mr: MR,
        m_tiles: M_TILES,
        n_panels: N_PANELS,
        kc: KC_BLOCKS,
    };
    // SAFETY: VNNI is available (checked above); each job reads its pass of its
    // tile and panel (slices of the right length) and writes exactly its outputs.
    let y = unsafe {
        panel_gemm::run(m, n, kb, &blocking, |job| {
            let i = firsts.partition_point(|&f| f <= job.panel) - 1;
            let at = (job.panel - firsts[i]) * kb + job.k0;
            let panel = &matrices[i].blocks[at..][..job.kc];
            kernel::tile(job, &a.tile(job.r0, job.k0, job.kc), panel);
        })
    };
    Ok(y)
}

/// One pass of one micro-tile of quantized rows.
struct Tile<'a> {
    /// Rows in the tile (1 ..= [`MR`]).
    rows: usize,
    /// `[blocks][8][rows][4]` activations.
    quants: &'a [i8],
    /// `[blocks][rows]` row scales.
    scales: &'a [f32],
    /// `[blocks][rows]`: `−128 · Σ q` over each row's block, where the block's sum of
    /// products with the weights' stored (+128) bytes starts.
    starts: &'a [i32],
}

/// The `m` rows of `x` quantized per block of 32 values, in micro-tiles of [`MR`] rows
/// (the last holds only the rows that exist). Tile `t` starts at `t · MR · k` bytes
/// and `t · MR · k/32` scales, so a pass over blocks `b0 ..` of it is one run of each.
struct QuantizedRows {
    m: usize,
    k: usize,
    quants: Vec<i8>,
    scales: Vec<f32>,
    starts: Vec<i32>,
}

impl QuantizedRows {
    fn new(x: &[f32], m: usize, k: usize) -> Self {
        let kb = k / BLOCK;
        let mut quants: Vec<i8> = crate::cpu::large_buffer(m * k);
        let mut scales: Vec<f32> = Vec::with_capacity(m * kb);
        let mut starts: Vec<i32> = Vec::with_capacity(m * kb);
        quants.spare_capacity_mut()[..m * k]
            .par_chunks_mut(MR * k)
            .zip(scales.spare_capacity_mut()[..m * kb].par_chunks_mut(MR * kb))
            .zip(starts.spare_capacity_mut()[..m * kb].par_chunks_mut(MR * kb))
            .enumerate()
            .for_each(|(t, ((q, s), o))| {
                let live = q.len() / k;
                for r in 0..live {
                    let row = &x[(t * MR + r) * k..][..k];
                    for (b, values) in row.chunks_exact(BLOCK).enumerate() {
                        // SAFETY: only `matmul` builds these rows, after checking
                        // that the CPU has AVX-512F; `values` holds one block.
                        let (d, block) = unsafe { kernel::quantize_block(values) };
                        s[b * live + r].write(d);
                        o[b * live + r]
                            .write(-128 * block.iter().map(|&v| i32::from(v)).sum::<i32>());
                        let out = &mut q[b * BLOCK * live..][..BLOCK * live];
                        for (g, four) in block.chunks_exact(GROUP).enumerate() {
                            out[(g * live + r) * GROUP..][..GROUP].write_copy_of_slice(four);
                        }
                    }
                }
            });
        // SAFETY: the tiles cover `m · k` quants and `m · k/32` scales and starts,
        // and each wrote all of its own.
        unsafe {
            quants.set_len(m * k);
            scales.set_len(m * kb);
            starts.set_len(m * kb);
        }
        Self {
            m,
            k,
            quants,
            scales,
            starts,
        }
    }

    /// Blocks `b0 .. b0 + blocks` of the tile that starts at row `r0` (a multiple of
    /// [`MR`]).
    fn tile(&self, r0: usize, b0: usize, blocks: usize) -> Tile<'_> {
        let rows = (self.m - r0).min(MR);
        let kb = self.k / BLOCK;
        Tile {
            rows,
            quants: &self.quants[r0 * self.k + b0 * BLOCK * rows..][..blocks * BLOCK * rows],
            scales: &self.scales[r0 * kb + b0 * rows..][..blocks * rows],
            starts: &self.starts[r0 * kb + b0 * rows..][..blocks * rows],
        }
    }
}

/// One block of 32 values exactly as ggml's Q8_0 quantizes it (`quantize_row_q8_0`,
/// and candle's `BlockQ8_0::from_float`): scale `max|x| / 127`, stored as f16; values
/// `round(x · 127 / max|x|)`, halves away from zero, in −127 ..= 127. A NaN value
/// counts as 0 (and is quantized to 0).
///
/// The reference for `kernel::quantize_block`, which the GEMM runs: with the
/// tiny models' 64-wide rows, this loop took as long as the GEMM itself.
fn quantize_block(values: &[f32]) -> (f32, [i8; BLOCK]) {
    let amax = values.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut q = [0i8; BLOCK];
    for (q, &v) in q.iter_mut().zip(values) {
        // Halves away from zero, as C's `roundf`, without a libm call per value
        // (`f32::round` and `f32::trunc` are calls on baseline x86-64): the cast
        // truncates and `x - trunc(x)` is exact. |x| ≤ 127 up to rounding; the clamp
        // keeps an overshoot from wrapping (and a NaN becomes 0).
        let x = (v * id).clamp(-127.0, 127.0);
        let t = x as i32;
        let away = if x < 0.0 { -1 } else { 1 };
        let i = if (x - t as f32).abs() >= 0.5 {
            t + away
        } else {
            t
        };
        *q = i as i8;
    }
    (f16::from_f32(d).to_f32(), q)
}

/// [`Q8Matrix::matmul`] over a candle tensor: `x` `(rows, k)` on the CPU, f32 or
/// bf16 (made contiguous if it is not), gives `(rows, n)` in `x`'s dtype.
pub fn q8_linear(x: &candle_core::Tensor, w: &Q8Matrix) -> Result<candle_core::Tensor> {
    Ok(q8_linear_side_by_side(x, &[w])?.remove(0))
}

/// [`matmul_side_by_side`] over a candle tensor, as [`q8_linear`] takes it: one
/// `(rows, nᵢ)` tensor per matrix.
pub fn q8_linear_side_by_side(
    x: &candle_core::Tensor,
    matrices: &[&Q8Matrix],
) -> Result<Vec<candle_core::Tensor>> {
    use candle_core::DType;
    let dtypes = [DType::F32, DType::BF16];
    let n: usize = matrices.iter().map(|w| w.n).sum();
    let k = matrices.first().map_or(0, |w| w.k);
    let y = crate::cpu::linear("q8_matmul", x, (n, k), &dtypes, |v, m| {
        matmul_side_by_side(matrices, v, m)
    })?;
    let mut parts = Vec::with_capacity(matrices.len());
    let mut at = 0;
    for w in matrices {
        parts.push(y.narrow(1, at, w.n)?.contiguous()?);
        at += w.n;
    }
    Ok(parts)
}

/// The arithmetic of [`Q8Matrix::matmul`] in plain Rust: the same quantized rows, each
/// block's dot product and the sum over blocks exact (f64). Also returns, per output,
/// `Σ |float(dot) · d_x · d_w|`, the scale of f32's rounding error in that sum.
pub fn matmul_reference(w: &Q8Matrix, x: &[f32], m: usize) -> (Vec<f32>, Vec<f32>) {
    let (n, k) = (w.n, w.k);
    let mut y = vec![0f32; m * n];
    let mut magnitude = vec![0f32; m * n];
    for r in 0..m {
        let blocks: Vec<(f32, [i8; BLOCK])> = x[r * k..(r + 1) * k]
            .chunks_exact(BLOCK)
            .map(quantize_block)
            .collect();
        for col in 0..n {
            let (mut sum, mut abs) = (0f64, 0f64);
            for (b, (dx, q)) in blocks.iter().enumerate() {
                let mut dot = 0i64;
                let mut dw = 0f32;
                for (i, &qx) in q.iter().enumerate() {
                    let (qw, d) = w.weight(col, b * BLOCK + i);
                    dot += i64::from(qx) * i64::from(qw);
                    dw = d;
                }
                let term = dot as f64 * f64::from(*dx) * f64::from(dw);
                sum += term;
                abs += term.abs();
            }
            y[r * n + col] = sum as f32;
            magnitude[r * n + col] = abs as f32;
        }
    }
    (y, magnitude)
}

/// Whether this CPU runs [`Q8Matrix::matmul`] (AVX-512F, BW and VNNI). Asked once;
/// `AISQL_NO_VNNI_GEMM=1` says no (to measure or test candle's path).
pub fn q8_gemm_available() -> bool {
    use std::sync::OnceLock;
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| !switched_off("AISQL_NO_VNNI_GEMM") && kernel::detect())
}

#[cfg(target_arch = "x86_64")]
mod kernel {
    use super::{BLOCK, GROUP, MR, NR, PanelBlock, Tile, TileJob};
    use crate::panel_gemm::store_row;
    use core::arch::x86_64::*;

    pub(super) fn detect() -> bool {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vnni")
    }

    /// One pass of one micro-tile: dispatches to the build for its number of rows,
    /// so a short tile does no work for rows that do not exist.
    ///
    /// # Safety
    /// AVX-512F, BW and VNNI must be available; `tile` and `panel` hold `job.kc`
    /// blocks; the job's outputs are writable (and, with `accumulate`, hold earlier
    /// passes' sums).
    pub(super) unsafe fn tile(job: &TileJob, tile: &Tile, panel: &[PanelBlock]) {
        let blocks = job.kc;
        debug_assert!(
            tile.rows == job.rows
                && tile.quants.len() >= blocks * BLOCK * tile.rows
                && tile.scales.len() >= blocks * tile.rows
                && tile.starts.len() >= blocks * tile.rows
                && panel.len() >= blocks
        );
        let args = Args {
            a: tile.quants.as_ptr(),
            sa: tile.scales.as_ptr(),
            oa: tile.starts.as_ptr(),
            b: panel.as_ptr(),
            blocks,
            c: job.c,
            ldc: job.ldc,
            mask: crate::panel_gemm::column_mask(job.cols),
            accumulate: job.accumulate,
        };
        // SAFETY: forwarded from the caller.
        unsafe {
            match tile.rows {
                6 => tile_r::<6>(&args),
                5 => tile_r::<5>(&args),
                4 => tile_r::<4>(&args),
                3 => tile_r::<3>(&args),
                2 => tile_r::<2>(&args),
                1 => tile_r::<1>(&args),
                _ => unreachable!("a micro-tile has 1 ..= {MR} rows"),
            }
        }
    }

    /// [`super::quantize_block`] in AVX-512, bit for bit: the same maximum (a NaN
    /// value leaves it as it was), the same products `x · (1/d)`, the same clamp
    /// and rounding (truncate, then step away from zero when the exact remainder is
    /// at least a half).
    ///
    /// # Safety
    /// AVX-512F must be available; `values` holds [`BLOCK`] values.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn quantize_block(values: &[f32]) -> (f32, [i8; BLOCK]) {
        debug_assert_eq!(values.len(), BLOCK);
        // SAFETY: `values` holds two vectors' worth; `q` has room for both halves.
        unsafe {
            let halves = [
                _mm512_loadu_ps(values.as_ptr()),
                _mm512_loadu_ps(values.as_ptr().add(16)),
            ];
            // `vmaxps` returns its second operand when the first is NaN: the
            // running maximum, as `f32::max` keeps it.
            let mut most = _mm512_setzero_ps();
            for v in halves {
                most = _mm512_max_ps(_mm512_abs_ps(v), most);
            }
            let amax = _mm512_reduce_max_ps(most);
            let d = amax / 127.0;
            let id = _mm512_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
            let (lowest, highest) = (_mm512_set1_ps(-127.0), _mm512_set1_ps(127.0));
            let (half, one) = (_mm512_set1_ps(0.5), _mm512_set1_ps(1.0));
            let sign = _mm512_set1_epi32(i32::MIN);
            let mut q = [0i8; BLOCK];
            for (h, v) in halves.into_iter().enumerate() {
                let x = _mm512_mul_ps(v, id);
                // NaN (a NaN value, or ∞ · 0) becomes 0, as `NaN as i32` does.
                let x = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_ORD_Q>(x, x), x);
                let x = _mm512_min_ps(_mm512_max_ps(x, lowest), highest);
                let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(x);
                let away =
                    _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_abs_ps(_mm512_sub_ps(x, t)), half);
                // ±1 with x's sign (x = −0 has no remainder, so its sign never counts).
                let step = _mm512_castsi512_ps(_mm512_or_si512(
                    _mm512_and_si512(_mm512_castps_si512(x), sign),
                    _mm512_castps_si512(one),
                ));
                let r = _mm512_mask_add_ps(t, away, t, step);
                let i = _mm512_cvttps_epi32(r);
                _mm_storeu_si128(q.as_mut_ptr().add(16 * h).cast(), _mm512_cvtepi32_epi8(i));
            }
            (half::f16::from_f32(d).to_f32(), q)
        }
    }

    struct Args {
        a: *const i8,
        sa: *const f32,
        oa: *const i32,
        b: *const PanelBlock,
        blocks: usize,
        c: *mut f32,
        ldc: usize,
        mask: u32,
        accumulate: bool,
    }

    /// # Safety
    /// As [`tile`], with `R` rows.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn tile_r<const R: usize>(p: &Args) {
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        // SAFETY (whole body): loads read the pass's `blocks` blocks of the tile
        // (`R · 32` bytes, `R` scales and `R` starts each) and of the panel (one
        // aligned `PanelBlock` each); `store_row` gets rows of `c` whose masked
        // columns are writable.
        unsafe {
            for blk in 0..p.blocks {
                let mut dot = [[_mm512_setzero_si512(); 2]; R];
                for (r, [lo, hi]) in dot.iter_mut().enumerate() {
                    let start = _mm512_set1_epi32(*p.oa.add(blk * R + r));
                    (*lo, *hi) = (start, start);
                }
                let a = p.a.add(blk * BLOCK * R);
                let block = p.b.add(blk);
                let b = (*block).quants.as_ptr();
                for g in 0..BLOCK / GROUP {
                    let w0 = _mm512_load_si512(b.add(g * GROUP * NR).cast());
                    let w1 = _mm512_load_si512(b.add(g * GROUP * NR + 64).cast());
                    for (r, [lo, hi]) in dot.iter_mut().enumerate() {
                        let four = a.add((g * R + r) * GROUP).cast::<i32>().read_unaligned();
                        let v = _mm512_set1_epi32(four);
                        *lo = _mm512_dpbusd_epi32(*lo, w0, v);
                        *hi = _mm512_dpbusd_epi32(*hi, w1, v);
                    }
                }
                let scales = (*block).scales.as_ptr();
                let s0 = _mm512_cvtph_ps(_mm256_load_si256(scales.cast()));
                let s1 = _mm512_cvtph_ps(_mm256_load_si256(scales.add(16).cast()));
                for (r, ([lo, hi], [d_lo, d_hi])) in acc.iter_mut().zip(dot).enumerate() {
                    let dx = _mm512_set1_ps(*p.sa.add(blk * R + r));
                    let d0 = _mm512_mul_ps(_mm512_cvtepi32_ps(d_lo), dx);
                    let d1 = _mm512_mul_ps(_mm512_cvtepi32_ps(d_hi), dx);
                    *lo = _mm512_fmadd_ps(d0, s0, *lo);
                    *hi = _mm512_fmadd_ps(d1, s1, *hi);
                }
            }
            for (r, [lo, hi]) in acc.into_iter().enumerate() {
                store_row(p.c.add(r * p.ldc), lo, hi, p.mask, p.accumulate);
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod kernel {
    use super::{Panel, Tile, TileJob};

    pub(super) fn detect() -> bool {
        false
    }

    pub(super) unsafe fn tile(_: &TileJob, _: &Tile, _: &[super::PanelBlock]) {
        unreachable!("the VNNI GEMM is x86_64 only")
    }

    pub(super) unsafe fn quantize_block(_: &[f32]) -> (f32, [i8; super::BLOCK]) {
        unreachable!("the VNNI GEMM is x86_64 only")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{assert_within_rounding, q8_bytes, spiky};

    #[test]
    fn the_gemm_matches_the_reference_on_ragged_shapes() {
        if !q8_gemm_available() {
            eprintln!("no AVX-512 VNNI on this machine: the Q8_0 GEMM is not exercised");
            return;
        }
        // m: one row (decode), short tiles, a partial chunk, several chunks; n: a
        // partial panel, several column groups; k: a partial pass, several passes.
        for (m, n, k) in [
            (1, 32, 64),
            (5, 7, 32),
            (13, 48, 96),
            (45, 80, 1024),
            (70, 288, 544),
            (200, 40, 256),
            (300, 272, 64),
        ] {
            let w = Q8Matrix::from_q8_0(&q8_bytes(n, k, (m * n) as u64), n, k).unwrap();
            let x = spiky(m * k, 2.0);
            let got = w.matmul(&x, m).unwrap();
            let (want, magnitude) = matmul_reference(&w, &x, m);
            assert_within_rounding(&got, &want, &magnitude, (m, n, k));
        }
    }

    #[test]
    fn matrices_side_by_side_give_each_ones_own_outputs() {
        if !q8_gemm_available() {
            return;
        }
        // Two whole-panel matrices and a ragged last one; one row (decode) and a
        // few tiles.
        let k = 96;
        let shapes = [64, 32, 40];
        let ws: Vec<Q8Matrix> = shapes
            .iter()
            .enumerate()
            .map(|(i, &n)| Q8Matrix::from_q8_0(&q8_bytes(n, k, 11 + i as u64), n, k).unwrap())
            .collect();
        let refs: Vec<&Q8Matrix> = ws.iter().collect();
        assert!(Q8Matrix::side_by_side(&refs));
        for m in [1, 13] {
            let x = spiky(m * k, 3.0);
            let all = matmul_side_by_side(&refs, &x, m).unwrap();
            let width: usize = shapes.iter().sum();
            let mut at = 0;
            for w in &ws {
                let own = w.matmul(&x, m).unwrap();
                for r in 0..m {
                    assert_eq!(
                        all[r * width + at..][..w.n()],
                        own[r * w.n()..][..w.n()],
                        "m {m}, row {r}, columns from {at}"
                    );
                }
                at += w.n();
            }
        }
        // A ragged matrix before another, or another k, cannot sit side by side.
        let other_k = Q8Matrix::from_q8_0(&q8_bytes(32, 64, 1), 32, 64).unwrap();
        assert!(!Q8Matrix::side_by_side(&[&ws[2], &ws[0]]));
        assert!(!Q8Matrix::side_by_side(&[&ws[0], &other_k]));
        assert!(!Q8Matrix::side_by_side(&[]));
        assert!(matmul_side_by_side(&[&ws[2], &ws[0]], &[0.0; 96], 1).is_err());
    }

    #[test]
    fn a_rows_result_does_not_depend_on_its_batch() {
        if !q8_gemm_available() {
            return;
        }
        let (n, k) = (96, 640);
        let w = Q8Matrix::from_q8_0(&q8_bytes(n, k, 3), n, k).unwrap();
        let x = spiky(250 * k, 4.0);
        let all = w.matmul(&x, 250).unwrap();
        for r in [0, 5, 6, 191, 192, 249] {
            let one = w.matmul(&x[r * k..(r + 1) * k], 1).unwrap();
            assert_eq!(one, all[r * n..(r + 1) * n], "row {r}");
        }
    }

    #[test]
    fn the_gemm_agrees_with_candles_quantized_matmul() {
        if !q8_gemm_available() {
            return;
        }
        // candle's Q8_0 matmul (ggml's arithmetic) on the same weights: the two
        // differ only in the order of the float operations over blocks. (k is not a
        // multiple of 256: there candle quantizes the activations per 256 values
        // instead, a coarser arithmetic.)
        use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
        use candle_core::{Device, Module, Tensor};
        let (m, n, k) = (37, 64, 480);
        let dense = Tensor::from_vec(spiky(n * k, 7.0), (n, k), &Device::Cpu)
            .unwrap()
            .affine(0.01, 0.0)
            .unwrap();
        let q = QTensor::quantize(&dense, GgmlDType::Q8_0).unwrap();
        let w = Q8Matrix::from_q8_0(&q.data().unwrap(), n, k).unwrap();
        let x = spiky(m * k, 8.0);
        let got = w.matmul(&x, m).unwrap();
        let xt = Tensor::from_vec(x, (m, k), &Device::Cpu).unwrap();
        let want: Vec<f32> = QMatMul::from_qtensor(q)
            .unwrap()
            .forward(&xt)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let norm = want.iter().map(|v| v * v).sum::<f32>().sqrt();
        let diff = got
            .iter()
            .zip(&want)
            .map(|(g, w)| (g - w) * (g - w))
            .sum::<f32>()
            .sqrt();
        assert!(diff <= 1e-6 * norm, "difference {diff} against norm {norm}");
    }

    #[test]
    fn quantizing_a_block_keeps_ggmls_range() {
        let values: Vec<f32> = (0..32).map(|i| (i as f32 - 15.5) * 0.3).collect();
        let (d, q) = quantize_block(&values);
        assert_eq!(d, f16::from_f32(4.65 / 127.0).to_f32());
        assert!(q.iter().all(|&v| (-127..=127).contains(&v)));
        assert_eq!((q[0], q[31]), (-127, 127));
        for (&u, &v) in q.iter().zip(&values) {
            assert!((f32::from(u) * d - v).abs() <= d / 2.0 + 1e-3);
        }
        let (d, q) = quantize_block(&[0.0; 32]);
        assert_eq!(d, 0.0);
        assert!(q.iter().all(|&u| u == 0));
        // Rounding is C's roundf: halves away from zero, and just below a half down.
        let mut edge = [0f32; 32];
        edge[..6].copy_from_slice(&[127.0, 2.5, -2.5, 0.49999997, -1.5, 3.4999998]);
        let (d, q) = quantize_block(&edge);
        assert_eq!(d, 1.0);
        let got: Vec<i32> = q[..6].iter().map(|&u| i32::from(u)).collect();
        assert_eq!(got, [127, 3, -3, 0, -2, 3]);
    }

    #[test]
    fn the_vector_quantizer_gives_the_references_bits() {
        if !q8_gemm_available() {
            return;
        }
        let mut blocks: Vec<[f32; 32]> = Vec::new();
        // Halves, values just below a half, both signs, ±0 and the clamp's edges.
        let mut edge = [0f32; 32];
        edge[..10].copy_from_slice(&[
            127.0,
            2.5,
            -2.5,
            0.49999997,
            -0.49999997,
            -1.5,
            3.4999998,
            -0.0,
            126.5,
            -126.5,
        ]);
        blocks.push(edge);
        blocks.push([0.0; 32]);
        blocks.push([-0.0; 32]);
        let mut special = [1.0f32; 32];
        special[3] = f32::NAN;
        special[7] = -3.0;
        blocks.push(special);
        let mut infinite = [2.0f32; 32];
        infinite[5] = f32::INFINITY;
        blocks.push(infinite);
        blocks.push([f32::NAN; 32]);
        blocks.push([1e-40; 32]);
        for seed in 0..200 {
            let v = spiky(32, seed as f32);
            let scale = 10f32.powi(seed % 9 - 4);
            blocks.push(std::array::from_fn(|i| v[i] * scale));
        }
        for (i, b) in blocks.iter().enumerate() {
            let want = quantize_block(b);
            // SAFETY: AVX-512F is available (checked above).
            let got = unsafe { kernel::quantize_block(b) };
            assert_eq!(got.0.to_bits(), want.0.to_bits(), "block {i}: scale");
            assert_eq!(got.1, want.1, "block {i}: {b:?}");
        }
    }

    #[test]
    fn the_layout_keeps_every_weight_and_bad_shapes_are_refused() {
        let (n, k) = (40, 64);
        let bytes = q8_bytes(n, k, 5);
        let w = Q8Matrix::from_q8_0(&bytes, n, k).unwrap();
        for col in 0..n {
            for i in 0..k {
                let block = &bytes[(col * 2 + i / 32) * BLOCK_BYTES..][..BLOCK_BYTES];
                let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
                assert_eq!(w.weight(col, i), (block[2 + i % 32] as i8, d));
            }
        }
        // The padded columns of the last panel are zero.
        assert!((n..64).all(|col| (0..k).all(|i| w.weight(col, i) == (0, 0.0))));
        assert!(Q8Matrix::from_q8_0(&bytes, 40, 48).is_err());
        assert!(Q8Matrix::from_q8_0(&bytes[1..], n, k).is_err());
        assert!(Q8Matrix::from_q8_0(&[], 0, 0).is_err());
        assert!(w.matmul(&[0.0; 7], 1).is_err());
    }

    #[test]
    fn q8_linear_keeps_the_input_dtype_and_checks_its_shape() {
        if !q8_gemm_available() {
            return;
        }
        use candle_core::{DType, Device, Tensor};
        let (n, k, m) = (48, 64, 5);
        let w = Q8Matrix::from_q8_0(&q8_bytes(n, k, 9), n, k).unwrap();
        let x = Tensor::from_vec(spiky(m * k, 1.0), (m, k), &Device::Cpu).unwrap();
        let want = w.matmul(&spiky(m * k, 1.0), m).unwrap();
        let y = q8_linear(&x, &w).unwrap();
        assert_eq!((y.dtype(), y.dims2().unwrap()), (DType::F32, (m, n)));
        assert_eq!(y.flatten_all().unwrap().to_vec1::<f32>().unwrap(), want);
        let yb = q8_linear(&x.to_dtype(DType::BF16).unwrap(), &w).unwrap();
        assert_eq!((yb.dtype(), yb.dims2().unwrap()), (DType::BF16, (m, n)));
        let wrong = Tensor::zeros((m, k + 32), DType::F32, &Device::Cpu).unwrap();
        assert!(
            q8_linear(&wrong, &w)
                .unwrap_err()
                .to_string()
                .contains("q8_matmul")
        );
        assert!(q8_linear(&x.to_dtype(DType::F16).unwrap(), &w).is_err());
    }
}
