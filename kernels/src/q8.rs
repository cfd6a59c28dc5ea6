//! `y = x Wᵀ` for Q8_0 weights on the CPU's AMX-INT8 tile units (Intel Sapphire
//! Rapids and later), the prefill GEMM of a Q8_0 model.
//!
//! Q8_0 keeps 32 signed bytes per block with one f16 scale. At load the weights are
//! re-laid as AMX B tiles ([`Q8Matrix`]): per 16 output columns and 32-value block,
//! 8 rows of 64 bytes (4 consecutive k values of each of the 16 columns, the VNNI
//! pairing `tdpbssd` reads) and the 16 scales as f32. Activations are quantized
//! the same way, per row and 32-value block (absmax / 127, round to nearest), so
//! each block's product is exact in i32 and is scaled once by
//! `d_weight[col] · d_act[row]` into an f32 accumulator. One task computes a
//! 32 × 32 output tile over all of k with four C tiles, so two A and two B tile
//! loads feed four `tdpbssd`.
//!
//! Used only where [`amx_available`] says so; elsewhere the model keeps candle's
//! quantized matmul (AVX-512 VNNI, AVX2 or portable). [`matmul_reference`] is the
//! same arithmetic in plain Rust, for tests.

use half::f16;
use rayon::prelude::*;

use crate::{KernelError, Result};

/// Values per Q8_0 block.
pub const BLOCK: usize = 32;
/// Output columns per B tile.
const TILE_N: usize = 16;
/// Rows per A tile.
const TILE_M: usize = 16;
/// Bytes of one Q8_0 block as GGUF and candle store it: f16 scale, 32 × i8.
const BLOCK_BYTES: usize = 2 + BLOCK;
/// 32-row tiles per task.
const M_CHUNK: usize = 8;
/// Column-tile pairs per task.
const N_GROUP: usize = 4;

/// One 32-value block of 16 output columns, as an AMX B tile plus its scales.
#[repr(C, align(64))]
#[derive(Clone)]
struct Tile {
    /// `qs[kr * 64 + col * 4 + j]` = weight `(col, 4·kr + j)` of the block.
    qs: [i8; BLOCK * TILE_N],
    /// Each column's block scale.
    d: [f32; TILE_N],
}

/// A Q8_0 matrix `(n, k)` (Hugging Face `(out, in)` layout) re-laid as AMX tiles.
pub struct Q8Matrix {
    n: usize,
    k: usize,
    /// `[n / 16][k / 32]` tiles.
    tiles: Vec<Tile>,
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
    /// Re-lays the Q8_0 blocks of an `(n, k)` matrix (row after row, `k / 32` blocks
    /// of 34 bytes each). `n` must be a multiple of 16 and `k` of 32.
    pub fn from_q8_0(bytes: &[u8], n: usize, k: usize) -> Result<Self> {
        if n == 0 || !n.is_multiple_of(TILE_N) || k == 0 || !k.is_multiple_of(BLOCK) {
            return Err(bad(format!(
                "shape ({n}, {k}): rows must be a positive multiple of {TILE_N}, columns of {BLOCK}"
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
        let mut tiles = Vec::with_capacity(n / TILE_N * kb);
        for t in 0..n / TILE_N {
            for b in 0..kb {
                let mut tile = Tile {
                    qs: [0; BLOCK * TILE_N],
                    d: [0.0; TILE_N],
                };
                for col in 0..TILE_N {
                    let at = ((t * TILE_N + col) * kb + b) * BLOCK_BYTES;
                    let block = &bytes[at..at + BLOCK_BYTES];
                    tile.d[col] = f16::from_le_bytes([block[0], block[1]]).to_f32();
                    for (i, &q) in block[2..].iter().enumerate() {
                        tile.qs[(i / 4) * 64 + col * 4 + i % 4] = q as i8;
                    }
                }
                tiles.push(tile);
            }
        }
        Ok(Self { n, k, tiles })
    }

    /// Output columns.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Input columns.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Weight `(col, i)` and its block scale, for the reference.
    fn weight(&self, col: usize, i: usize) -> (i8, f32) {
        let tile = &self.tiles[(col / TILE_N) * (self.k / BLOCK) + i / BLOCK];
        let (c, j) = (col % TILE_N, i % BLOCK);
        (tile.qs[(j / 4) * 64 + c * 4 + j % 4], tile.d[c])
    }

    /// `x Wᵀ` for `x` of `m` rows of `k` values (row-major), on AMX. Call only where
    /// [`amx_available`] is true.
    pub fn matmul(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        if x.len() != m * self.k {
            return Err(bad(format!(
                "{} input values for {m} rows of {}",
                x.len(),
                self.k
            )));
        }
        if !amx_available() {
            return Err(bad("this CPU (or OS) does not offer AMX-INT8".into()));
        }
        let mut y = vec![0f32; m * self.n];
        if m == 0 {
            return Ok(y);
        }
        // Rows padded to whole 32-row tiles with zeros, so tile loads stay inside.
        let m_pad = m.div_ceil(2 * TILE_M) * 2 * TILE_M;
        let (aq, ad) = quantize_rows(x, m, m_pad, self.k);
        let (m_blocks, n_pairs) = (m_pad / (2 * TILE_M), (self.n / TILE_N).div_ceil(2));
        // A task is up to 8 row tiles × 4 column pairs (256 rows, 128 columns): its
        // weight tiles (4 × k/32 × 1.1 KiB) stay in L2 while each 32-row stripe of
        // activations is used four times from L1.
        let (m_chunks, n_groups) = (m_blocks.div_ceil(M_CHUNK), n_pairs.div_ceil(N_GROUP));
        let y_ptr = SendPtr(y.as_mut_ptr());
        (0..m_chunks * n_groups).into_par_iter().for_each(|task| {
            let (mc, ng) = (task / n_groups, task % n_groups);
            for mb in mc * M_CHUNK..((mc + 1) * M_CHUNK).min(m_blocks) {
                for np in ng * N_GROUP..((ng + 1) * N_GROUP).min(n_pairs) {
                    // SAFETY: AMX is available (checked above); each call writes only
                    // its own 32 × 32 output tile of `y`, rows below `m`.
                    unsafe { amx::tile_32x32(self, &aq, &ad, m, mb, np, y_ptr) };
                }
            }
        });
        Ok(y)
    }
}

/// [`Q8Matrix::matmul`] over a candle tensor: `x` `(rows, k)` f32 on the CPU (made
/// contiguous if it is not) gives `(rows, n)`.
pub fn q8_linear(x: &candle_core::Tensor, w: &Q8Matrix) -> Result<candle_core::Tensor> {
    let (rows, k) = x.dims2()?;
    if k != w.k || !crate::is_cpu_f32(x) {
        return Err(bad(format!(
            "input {:?} {:?} on {:?} for a ({}, {}) matrix: f32 CPU rows of {} values needed",
            x.shape(),
            x.dtype(),
            x.device().location(),
            w.n,
            w.k,
            w.k
        )));
    }
    let x = x.contiguous()?;
    let view = crate::cpu::CpuF32::new("q8_matmul", &x)?;
    let y = w.matmul(view.slice()?, rows)?;
    Ok(candle_core::Tensor::from_vec(y, (rows, w.n), x.device())?)
}

/// A raw output pointer shared by tasks that write disjoint tiles.
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: tasks write disjoint regions (see `Q8Matrix::matmul`).
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

/// Quantizes `m` rows of `x` per 32-value block: i8 values (`m_pad` rows, the
/// padding zero) and per-block scales `[m][k / 32]`.
fn quantize_rows(x: &[f32], m: usize, m_pad: usize, k: usize) -> (Vec<i8>, Vec<f32>) {
    let kb = k / BLOCK;
    let mut aq = vec![0i8; m_pad * k];
    let mut ad = vec![0f32; m * kb];
    aq[..m * k]
        .par_chunks_mut(k)
        .zip(ad.par_chunks_mut(kb))
        .zip(x.par_chunks(k))
        .for_each(|((q, d), x)| {
            for ((q, d), x) in q.chunks_exact_mut(BLOCK).zip(d).zip(x.chunks_exact(BLOCK)) {
                // SAFETY: AVX-512 is part of what `amx_available` checked.
                *d = unsafe { amx::quantize_block_avx512(x, q) };
            }
        });
    (aq, ad)
}

/// One block: `q = round(x / d)` with `d = max|x| / 127`; returns `d`.
#[inline]
fn quantize_block(x: &[f32], q: &mut [i8]) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    for (q, &v) in q.iter_mut().zip(x) {
        *q = (v * id).round_ties_even() as i8;
    }
    d
}

/// The arithmetic of [`Q8Matrix::matmul`] in plain Rust: each block's integer dot
/// product scaled by both scales, summed in f64.
pub fn matmul_reference(w: &Q8Matrix, x: &[f32], m: usize) -> Vec<f32> {
    let (n, k) = (w.n, w.k);
    let mut y = vec![0f32; m * n];
    let mut q = vec![0i8; BLOCK];
    for r in 0..m {
        let row = &x[r * k..(r + 1) * k];
        let blocks: Vec<(Vec<i8>, f32)> = row
            .chunks_exact(BLOCK)
            .map(|b| {
                let d = quantize_block(b, &mut q);
                (q.clone(), d)
            })
            .collect();
        for col in 0..n {
            let mut acc = 0f64;
            for (b, (qa, da)) in blocks.iter().enumerate() {
                let mut dot = 0i32;
                let mut dw = 0f32;
                for (j, &a) in qa.iter().enumerate() {
                    let (wq, d) = w.weight(col, b * BLOCK + j);
                    dot += i32::from(a) * i32::from(wq);
                    dw = d;
                }
                acc += f64::from(dot) * f64::from(dw) * f64::from(*da);
            }
            y[r * n + col] = acc as f32;
        }
    }
    y
}

/// Whether this CPU has AMX-INT8 and the OS let this process use the tile state
/// (Linux: `arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)`). Asked once.
pub fn amx_available() -> bool {
    use std::sync::OnceLock;
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        if std::env::var_os("AISQL_NO_AMX").is_some_and(|v| !v.is_empty() && v != "0") {
            return false;
        }
        amx::detect()
    })
}

#[cfg(target_arch = "x86_64")]
mod amx {
    use super::*;
    use core::arch::x86_64::*;

    pub(super) fn detect() -> bool {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return false;
        }
        // CPUID.(EAX=7, ECX=0):EDX bit 24 AMX-TILE, bit 25 AMX-INT8.
        // CPUID leaf 7 exists on every CPU with AVX-512.
        let edx = __cpuid_count(7, 0).edx;
        if edx & (1 << 24) == 0 || edx & (1 << 25) == 0 {
            return false;
        }
        #[cfg(target_os = "linux")]
        {
            const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
            const XFEATURE_XTILEDATA: libc::c_long = 18;
            // SAFETY: a plain syscall asking for a permission; no memory is passed.
            let rc = unsafe {
                libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
            };
            rc == 0
        }
        #[cfg(not(target_os = "linux"))]
        false
    }

    /// [`quantize_block`] in AVX-512: the same operations in the same order (max of
    /// |x|, `d = amax / 127`, `x · (1 / d)` rounded to nearest even), so the same bytes.
    ///
    /// # Safety
    /// The CPU must have AVX-512F; `x` and `q` hold 32 values.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn quantize_block_avx512(x: &[f32], q: &mut [i8]) -> f32 {
        debug_assert!(x.len() == BLOCK && q.len() == BLOCK);
        // SAFETY: 32 values are readable from x and writable to q.
        unsafe {
            let lo = _mm512_loadu_ps(x.as_ptr());
            let hi = _mm512_loadu_ps(x.as_ptr().add(16));
            let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
            let d = amax / 127.0;
            let id = _mm512_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
            // Current rounding mode: round to nearest even, as round_ties_even.
            let qlo = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(lo, id)));
            let qhi = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(hi, id)));
            _mm_storeu_si128(q.as_mut_ptr() as *mut __m128i, qlo);
            _mm_storeu_si128(q.as_mut_ptr().add(16) as *mut __m128i, qhi);
            d
        }
    }

    /// The tile palette: tmm0–3 C (16 × 16 i32), tmm4–5 A (16 rows × 32 i8),
    /// tmm6–7 B (8 rows × 64 i8).
    #[repr(C, align(64))]
    struct TileConfig {
        palette: u8,
        start_row: u8,
        reserved: [u8; 14],
        colsb: [u16; 16],
        rows: [u8; 16],
    }

    const CONFIG: TileConfig = {
        let mut c = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        let mut t = 0;
        while t < 8 {
            c.colsb[t] = if t == 4 || t == 5 { 32 } else { 64 };
            c.rows[t] = if t >= 6 { 8 } else { 16 };
            t += 1;
        }
        c
    };

    /// `acc[r][col] += C[r][col] · dw[col] · da[r·kb]` for one block's four C tiles
    /// (rows `0..rows`; `da` starts at the first row's scale of this block).
    ///
    /// # Safety
    /// The CPU must have AVX-512F; `da` holds `(rows - 1)·kb + 1` values.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn scale_block(
        acc: &mut [f32; 1024],
        c: &[i32; 1024],
        dw: [&[f32; TILE_N]; 2],
        da: &[f32],
        kb: usize,
        rows: usize,
    ) {
        // SAFETY: every access is inside `acc`, `c`, `dw` and `da` (checked above).
        unsafe {
            let dw = [_mm512_loadu_ps(dw[0].as_ptr()), _mm512_loadu_ps(dw[1].as_ptr())];
            for r in 0..rows {
                let da = _mm512_set1_ps(*da.get_unchecked(r * kb));
                let (half, ri) = (r / TILE_M, r % TILE_M);
                for (nt, dw) in dw.iter().enumerate() {
                    let ci = _mm512_loadu_si512(
                        c.as_ptr().add((half * 2 + nt) * 256 + ri * 16) as *const _,
                    );
                    let at = acc.as_mut_ptr().add(r * 32 + nt * 16);
                    let sum = _mm512_fmadd_ps(
                        _mm512_cvtepi32_ps(ci),
                        _mm512_mul_ps(*dw, da),
                        _mm512_loadu_ps(at),
                    );
                    _mm512_storeu_ps(at, sum);
                }
            }
        }
    }

    /// The 32 × 32 output tile (`mb`, `np`): rows `32·mb ..`, columns `32·np ..`
    /// (16 of them when the matrix has an odd number of column tiles and this is
    /// the last pair).
    ///
    /// # Safety
    /// AMX must be available; `aq` holds whole 32-row tiles; no other task writes
    /// this tile of `y`.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn tile_32x32(
        w: &Q8Matrix,
        aq: &[i8],
        ad: &[f32],
        m: usize,
        mb: usize,
        np: usize,
        y: SendPtr,
    ) {
        let (k, n, kb) = (w.k, w.n, w.k / BLOCK);
        let n_tiles = n / TILE_N;
        let (t0, t1) = (2 * np, (2 * np + 1).min(n_tiles - 1));
        let cols = if 2 * np + 1 < n_tiles { 32 } else { 16 };
        let m0 = mb * 2 * TILE_M;
        let rows = (m - m0.min(m)).min(2 * TILE_M);
        // Two C scratch areas: block b's tiles are stored while block b-1's are
        // scaled into `acc`, so the scaling never waits on the tile stores just issued.
        let mut c = [[0i32; 4 * 256]; 2];
        let mut acc = [0f32; 32 * 32];
        let tiles = |t: usize, b: usize| &w.tiles[t * kb + b];
        // SAFETY (whole block): the caller guarantees AMX; every tile load reads
        // inside `aq` (padded rows) or a `Tile`; stores go to `c` (2 × 4 KiB).
        unsafe {
            core::arch::asm!("ldtilecfg [{cfg}]", cfg = in(reg) &CONFIG, options(nostack));
            for b in 0..kb {
                let a0 = aq.as_ptr().add(m0 * k + b * BLOCK);
                let a1 = a0.add(TILE_M * k);
                let b0 = tiles(t0, b).qs.as_ptr();
                let b1 = tiles(t1, b).qs.as_ptr();
                core::arch::asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tilezero tmm2",
                    "tilezero tmm3",
                    "tileloadd tmm4, [{a0} + {sa}*1]",
                    "tileloadd tmm6, [{b0} + {sb}*1]",
                    "tdpbssd tmm0, tmm4, tmm6",
                    "tileloadd tmm7, [{b1} + {sb}*1]",
                    "tdpbssd tmm1, tmm4, tmm7",
                    "tileloadd tmm5, [{a1} + {sa}*1]",
                    "tdpbssd tmm2, tmm5, tmm6",
                    "tdpbssd tmm3, tmm5, tmm7",
                    "tilestored [{c} + {sc}*1], tmm0",
                    "tilestored [{c} + {sc}*1 + 1024], tmm1",
                    "tilestored [{c} + {sc}*1 + 2048], tmm2",
                    "tilestored [{c} + {sc}*1 + 3072], tmm3",
                    a0 = in(reg) a0,
                    a1 = in(reg) a1,
                    b0 = in(reg) b0,
                    b1 = in(reg) b1,
                    c = in(reg) c[b % 2].as_mut_ptr(),
                    sa = in(reg) k,
                    sb = in(reg) 64usize,
                    sc = in(reg) 64usize,
                    options(nostack)
                );
                if b > 0 {
                    let dw = [&tiles(t0, b - 1).d, &tiles(t1, b - 1).d];
                    let da = &ad[m0 * kb + b - 1..];
                    scale_block(&mut acc, &c[(b - 1) % 2], dw, da, kb, rows);
                }
            }
            let dw = [&tiles(t0, kb - 1).d, &tiles(t1, kb - 1).d];
            scale_block(&mut acc, &c[(kb - 1) % 2], dw, &ad[m0 * kb + kb - 1..], kb, rows);
            core::arch::asm!("tilerelease", options(nostack));
            for r in 0..rows {
                std::ptr::copy_nonoverlapping(
                    acc.as_ptr().add(r * 32),
                    y.0.add((m0 + r) * n + np * 32),
                    cols,
                );
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod amx {
    use super::*;

    pub(super) fn detect() -> bool {
        false
    }

    pub(super) unsafe fn quantize_block_avx512(x: &[f32], q: &mut [i8]) -> f32 {
        quantize_block(x, q)
    }

    pub(super) unsafe fn tile_32x32(
        _: &Q8Matrix,
        _: &[i8],
        _: &[f32],
        _: usize,
        _: usize,
        _: usize,
        _: SendPtr,
    ) {
        unreachable!("AMX is x86_64 only")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Q8_0 blocks of a pseudo-random `(n, k)` matrix.
    fn q8_bytes(n: usize, k: usize, seed: u64) -> Vec<u8> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let mut out = Vec::with_capacity(n * k / BLOCK * BLOCK_BYTES);
        for _ in 0..n * k / BLOCK {
            let d = f16::from_f32(0.001 + (next() % 1000) as f32 * 1e-5);
            out.extend_from_slice(&d.to_le_bytes());
            out.extend((0..BLOCK).map(|_| (next() % 255) as u8 ^ 0x80));
        }
        out
    }

    fn input(m: usize, k: usize) -> Vec<f32> {
        (0..m * k)
            .map(|i| ((i as f32 * 0.377).sin() * 3.0) * if i % 97 == 0 { 20.0 } else { 1.0 })
            .collect()
    }

    #[test]
    fn amx_matches_the_reference_on_ragged_shapes() {
        if !amx_available() {
            eprintln!("no AMX-INT8 on this machine: the AMX kernel is not exercised");
            return;
        }
        // m: one row (decode), a partial tile, several tiles; n: odd tile count.
        for (m, n, k) in [(1, 64, 64), (13, 48, 96), (45, 80, 256), (70, 32, 1024)] {
            let w = Q8Matrix::from_q8_0(&q8_bytes(n, k, (m * n) as u64), n, k).unwrap();
            let x = input(m, k);
            let got = w.matmul(&x, m).unwrap();
            let want = matmul_reference(&w, &x, m);
            for (i, (g, r)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - r).abs() <= 1e-4 * r.abs().max(1.0),
                    "({m}, {n}, {k}) element {i}: {g} vs {r}"
                );
            }
        }
    }

    #[test]
    fn the_layout_keeps_every_weight_and_bad_shapes_are_refused() {
        let (n, k) = (32, 64);
        let bytes = q8_bytes(n, k, 5);
        let w = Q8Matrix::from_q8_0(&bytes, n, k).unwrap();
        for col in [0, 7, 16, 31] {
            for i in [0, 5, 31, 32, 63] {
                let block = &bytes[(col * 2 + i / 32) * BLOCK_BYTES..][..BLOCK_BYTES];
                let (q, d) = w.weight(col, i);
                assert_eq!(q, block[2 + i % 32] as i8);
                assert_eq!(d, f16::from_le_bytes([block[0], block[1]]).to_f32());
            }
        }
        assert!(Q8Matrix::from_q8_0(&bytes, 24, 64).is_err());
        assert!(Q8Matrix::from_q8_0(&bytes, 32, 48).is_err());
        assert!(Q8Matrix::from_q8_0(&bytes[1..], 32, 64).is_err());
        assert!(w.matmul(&[0.0; 10], 1).is_err());
    }

    #[test]
    fn vector_quantization_gives_the_scalar_bytes() {
        if !amx_available() {
            return;
        }
        let x = input(64, 32);
        for block in x.chunks_exact(BLOCK).chain([&[0f32; 32][..]]) {
            let (mut a, mut b) = ([0i8; 32], [0i8; 32]);
            let da = quantize_block(block, &mut a);
            // SAFETY: AMX implies AVX-512F.
            let db = unsafe { amx::quantize_block_avx512(block, &mut b) };
            assert_eq!((da, a), (db, b));
        }
    }

    #[test]
    fn quantizing_a_block_rounds_to_nearest() {
        let x: Vec<f32> = (0..32).map(|i| i as f32 - 15.5).collect();
        let mut q = [0i8; 32];
        let d = quantize_block(&x, &mut q);
        assert!((d - 15.5 / 127.0).abs() < 1e-7);
        assert_eq!((q[0], q[31]), (-127, 127));
        assert_eq!(q[16], 4); // 0.5 / (15.5 / 127) = 4.097
        let mut z = [1i8; 32];
        assert_eq!(quantize_block(&[0.0; 32], &mut z), 0.0);
        assert_eq!(z, [0; 32]);
    }
}
