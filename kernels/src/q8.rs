//! `y = x Wᵀ` for Q8_0 weights on the CPU's AMX tile units (Intel Sapphire Rapids
//! and later), the prefill GEMM of a Q8_0 model.
//!
//! Q8_0 keeps 32 signed bytes per block with one f16 scale. At load the weights are
//! re-laid as AMX-BF16 B tiles ([`Q8Matrix`]): per 16 output columns and 32-value
//! block, 16 rows of 64 bytes (2 consecutive k values of each of the 16 columns,
//! the pairing `tdpbf16ps` reads), each weight its byte as a bfloat16 (exact: 8
//! mantissa bits hold any |q| ≤ 127), and the 16 scales as f32. Activations are
//! rounded to bfloat16 (relative error 2⁻⁹ per value, where llama.cpp's Q8_0
//! activations lose up to 1/254 of their block's largest value), each block's
//! products are exact in f32 and summed by the tile unit, and the block is scaled
//! once by each column's `d` into an f32 accumulator. One task computes 32 × 32
//! outputs over all of k with four C tiles, so two A and two B tile loads feed four
//! `tdpbf16ps`; two C scratch areas let block b−1 be scaled while block b's tiles
//! are stored.
//!
//! Used only where [`amx_available`] says so; elsewhere the model keeps candle's
//! quantized matmul (AVX-512 VNNI, AVX2 or portable). [`matmul_reference`] is the
//! same arithmetic in plain Rust, for tests.

use half::{bf16, f16};
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
    /// `qs[kr * 32 + col * 2 + j]` = bf16 bits of weight `(col, 2·kr + j)`.
    qs: [u16; BLOCK * TILE_N],
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
                        let w = bf16::from_f32(f32::from(q as i8));
                        tile.qs[(i / 2) * 32 + col * 2 + i % 2] = w.to_bits();
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
    fn weight(&self, col: usize, i: usize) -> (f32, f32) {
        let tile = &self.tiles[(col / TILE_N) * (self.k / BLOCK) + i / BLOCK];
        let (c, j) = (col % TILE_N, i % BLOCK);
        let q = bf16::from_bits(tile.qs[(j / 2) * 32 + c * 2 + j % 2]);
        (q.to_f32(), tile.d[c])
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
            return Err(bad("this CPU (or OS) does not offer AMX-BF16".into()));
        }
        let mut y = vec![0f32; m * self.n];
        if m == 0 {
            return Ok(y);
        }
        // Rows padded to whole 32-row tiles with zeros, so tile loads stay inside.
        let m_pad = m.div_ceil(2 * TILE_M) * 2 * TILE_M;
        let a = to_bf16_rows(x, m_pad, self.k);
        let (m_blocks, n_pairs) = (m_pad / (2 * TILE_M), (self.n / TILE_N).div_ceil(2));
        // A task is up to 8 row tiles × 4 column pairs (256 rows, 128 columns): its
        // weight tiles (4 × k/32 × 2.1 KiB) stay in L2 while each 32-row stripe of
        // activations is used four times.
        let (m_chunks, n_groups) = (m_blocks.div_ceil(M_CHUNK), n_pairs.div_ceil(N_GROUP));
        let y_ptr = SendPtr(y.as_mut_ptr());
        (0..m_chunks * n_groups).into_par_iter().for_each(|task| {
            let (mc, ng) = (task / n_groups, task % n_groups);
            for mb in mc * M_CHUNK..((mc + 1) * M_CHUNK).min(m_blocks) {
                for np in ng * N_GROUP..((ng + 1) * N_GROUP).min(n_pairs) {
                    // SAFETY: AMX is available (checked above); each call writes only
                    // its own 32 × 32 output tile of `y`, rows below `m`.
                    unsafe { amx::tile_32x32(self, &a, m, mb, np, y_ptr) };
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

/// The rows of `x` as bfloat16 bits (round to nearest even), padded with zero rows
/// to `m_pad`.
fn to_bf16_rows(x: &[f32], m_pad: usize, k: usize) -> Vec<u16> {
    let mut a = vec![0u16; m_pad * k];
    a[..x.len()]
        .par_chunks_mut(1 << 14)
        .zip(x.par_chunks(1 << 14))
        .for_each(|(a, x)| {
            for (a, &v) in a.iter_mut().zip(x) {
                *a = bf16_bits(v);
            }
        });
    a
}

/// `v` rounded to the nearest bfloat16, ties to even (as `half::bf16::from_f32`
/// for finite values), branch-free so it vectorises.
#[inline(always)]
fn bf16_bits(v: f32) -> u16 {
    let b = v.to_bits();
    let round = 0x7fff + ((b >> 16) & 1);
    (b.wrapping_add(round) >> 16) as u16
}

/// The arithmetic of [`Q8Matrix::matmul`] in plain Rust: activations rounded to
/// bfloat16, each block's products summed exactly (f64) and scaled by its `d`.
pub fn matmul_reference(w: &Q8Matrix, x: &[f32], m: usize) -> Vec<f32> {
    let (n, k) = (w.n, w.k);
    let mut y = vec![0f32; m * n];
    for r in 0..m {
        let row: Vec<f64> = x[r * k..(r + 1) * k]
            .iter()
            .map(|&v| f64::from(bf16::from_bits(bf16_bits(v)).to_f32()))
            .collect();
        for col in 0..n {
            let mut acc = 0f64;
            for b in 0..k / BLOCK {
                let mut dot = 0f64;
                let mut d = 0f32;
                for j in 0..BLOCK {
                    let (q, dw) = w.weight(col, b * BLOCK + j);
                    dot += row[b * BLOCK + j] * f64::from(q);
                    d = dw;
                }
                acc += dot * f64::from(d);
            }
            y[r * n + col] = acc as f32;
        }
    }
    y
}

/// Whether this CPU has AMX-BF16 and the OS let this process use the tile state
/// (Linux: `arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)`). Asked once;
/// `AISQL_NO_AMX=1` says no (to measure or test the other path).
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
        // CPUID.(EAX=7, ECX=0):EDX bit 22 AMX-BF16, bit 24 AMX-TILE (leaf 7
        // exists on every CPU with AVX-512).
        let edx = __cpuid_count(7, 0).edx;
        if edx & (1 << 22) == 0 || edx & (1 << 24) == 0 {
            return false;
        }
        #[cfg(target_os = "linux")]
        {
            const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
            const XFEATURE_XTILEDATA: libc::c_long = 18;
            // SAFETY: a plain syscall asking for a permission; no memory is passed.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_arch_prctl,
                    ARCH_REQ_XCOMP_PERM,
                    XFEATURE_XTILEDATA,
                )
            };
            rc == 0
        }
        #[cfg(not(target_os = "linux"))]
        false
    }

    /// The tile palette: tmm0–3 C (16 × 16 f32), tmm4–5 A (16 rows × 32 bf16),
    /// tmm6–7 B (16 rows × 16 column pairs of bf16): every tile 16 rows of 64 bytes.
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
            c.colsb[t] = 64;
            c.rows[t] = 16;
            t += 1;
        }
        c
    };

    /// `acc[r][col] += C[r][col] · dw[col]` for one block's four C tiles (rows
    /// `0..rows`).
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn scale_block(
        acc: &mut [f32; 1024],
        c: &[f32; 1024],
        dw: [&[f32; TILE_N]; 2],
        rows: usize,
    ) {
        let rows = rows.min(2 * TILE_M);
        // SAFETY: every access is inside `acc`, `c` and `dw` (rows ≤ 32).
        unsafe {
            let dw = [
                _mm512_loadu_ps(dw[0].as_ptr()),
                _mm512_loadu_ps(dw[1].as_ptr()),
            ];
            for r in 0..rows {
                let (half, ri) = (r / TILE_M, r % TILE_M);
                for (nt, dw) in dw.iter().enumerate() {
                    let ci = _mm512_loadu_ps(c.as_ptr().add((half * 2 + nt) * 256 + ri * 16));
                    let at = acc.as_mut_ptr().add(r * 32 + nt * 16);
                    _mm512_storeu_ps(at, _mm512_fmadd_ps(ci, *dw, _mm512_loadu_ps(at)));
                }
            }
        }
    }

    /// The 32 × 32 outputs (`mb`, `np`): rows `32·mb ..`, columns `32·np ..` (16 of
    /// them when the matrix has an odd number of column tiles and this is the last
    /// pair).
    ///
    /// # Safety
    /// AMX must be available; `a` holds whole 32-row tiles of bf16; no other task
    /// writes these outputs of `y`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile_32x32(
        w: &Q8Matrix,
        a: &[u16],
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
        let mut c = [[0f32; 4 * 256]; 2];
        let mut acc = [0f32; 32 * 32];
        let tile = |t: usize, b: usize| &w.tiles[t * kb + b];
        // SAFETY (whole block): the caller guarantees AMX; every tile load reads
        // inside `a` (padded rows) or a `Tile`; stores go to `c` (2 × 4 KiB).
        unsafe {
            core::arch::asm!("ldtilecfg [{cfg}]", cfg = in(reg) &CONFIG, options(nostack));
            for b in 0..kb {
                let a0 = a.as_ptr().add(m0 * k + b * BLOCK);
                let a1 = a0.add(TILE_M * k);
                core::arch::asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tilezero tmm2",
                    "tilezero tmm3",
                    "tileloadd tmm4, [{a0} + {sa}*1]",
                    "tileloadd tmm6, [{b0} + {sb}*1]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tileloadd tmm7, [{b1} + {sb}*1]",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "tileloadd tmm5, [{a1} + {sa}*1]",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    "tilestored [{c} + {sc}*1], tmm0",
                    "tilestored [{c} + {sc}*1 + 1024], tmm1",
                    "tilestored [{c} + {sc}*1 + 2048], tmm2",
                    "tilestored [{c} + {sc}*1 + 3072], tmm3",
                    a0 = in(reg) a0,
                    a1 = in(reg) a1,
                    b0 = in(reg) tile(t0, b).qs.as_ptr(),
                    b1 = in(reg) tile(t1, b).qs.as_ptr(),
                    c = in(reg) c[b % 2].as_mut_ptr(),
                    sa = in(reg) 2 * k,
                    sb = in(reg) 64usize,
                    sc = in(reg) 64usize,
                    options(nostack)
                );
                if b > 0 {
                    let dw = [&tile(t0, b - 1).d, &tile(t1, b - 1).d];
                    scale_block(&mut acc, &c[(b - 1) % 2], dw, rows);
                }
            }
            let dw = [&tile(t0, kb - 1).d, &tile(t1, kb - 1).d];
            scale_block(&mut acc, &c[(kb - 1) % 2], dw, rows);
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

    pub(super) unsafe fn tile_32x32(
        _: &Q8Matrix,
        _: &[u16],
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
            eprintln!("no AMX-BF16 on this machine: the AMX kernel is not exercised");
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
                assert_eq!(q, f32::from(block[2 + i % 32] as i8));
                assert_eq!(d, f16::from_le_bytes([block[0], block[1]]).to_f32());
            }
        }
        assert!(Q8Matrix::from_q8_0(&bytes, 24, 64).is_err());
        assert!(Q8Matrix::from_q8_0(&bytes, 32, 48).is_err());
        assert!(Q8Matrix::from_q8_0(&bytes[1..], 32, 64).is_err());
        assert!(w.matmul(&[0.0; 10], 1).is_err());
    }

    #[test]
    fn bf16_rounding_is_half_crates() {
        for v in input(4, 512)
            .into_iter()
            .chain([0.0, -0.0, 1.0, 1.0039062, 1.0117188, -3.5e-20, 3.0e38])
        {
            assert_eq!(bf16_bits(v), bf16::from_f32(v).to_bits(), "{v}");
        }
    }
}
