//! `y = x Wᵀ` on the CPU's AMX tile units (Intel Sapphire Rapids and later) with
//! bfloat16 weights: the prefill GEMM of Q8_0 and bf16 models.
//!
//! At load a weight matrix is re-laid as AMX-BF16 B tiles ([`AmxMatrix`]): per 16
//! output columns and 32 input values, 16 rows of 64 bytes (2 consecutive k values of
//! each of the 16 columns, the pairing `tdpbf16ps` reads). A bf16 weight is kept as it
//! is; a Q8_0 weight becomes its value `d·q` rounded to bfloat16 (relative error at
//! most 2⁻⁹, below the 1/254 of its block's largest value that Q8_0 itself loses).
//! Activations are rounded to bfloat16 the same way (llama.cpp's AMX path rounds them
//! to Q8_0 instead). Each product is exact in f32 and the tile unit sums them in f32
//! over the whole of k, so nothing leaves the tiles until a 32 × 32 block of outputs
//! is done: one task computes it with four C tiles, two A and two B tile loads feeding
//! four `tdpbf16ps` per 32 values of k.
//!
//! Used only where [`amx_available`] says so; elsewhere the model keeps candle's
//! matmul (quantized: AVX-512 VNNI, AVX2 or portable). [`matmul_reference`] is the
//! same arithmetic in plain Rust, for tests.

use half::{bf16, f16};
use rayon::prelude::*;

use crate::cpu::{SendPtr, bf16_bits, switched_off};
use crate::{KernelError, Result};

/// Input values per B tile, and per Q8_0 block.
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

/// 32 input values of 16 output columns, as an AMX B tile: `[kr * 32 + col * 2 + j]`
/// holds the bf16 bits of weight `(col, 2·kr + j)`.
#[repr(C, align(64))]
#[derive(Clone)]
struct Tile([u16; BLOCK * TILE_N]);

/// A matrix `(n, k)` (Hugging Face `(out, in)` layout) of bf16 weights re-laid as
/// AMX tiles.
pub struct AmxMatrix {
    n: usize,
    k: usize,
    /// `[n / 16][k / 32]` tiles.
    tiles: Vec<Tile>,
}

impl std::fmt::Debug for AmxMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmxMatrix")
            .field("n", &self.n)
            .field("k", &self.k)
            .finish()
    }
}

fn bad(message: String) -> KernelError {
    KernelError::BadInput {
        kernel: "amx_matmul",
        message,
    }
}

impl AmxMatrix {
    /// Tiles of an `(n, k)` matrix whose weight `(col, i)` is `weight(col, i)` as bf16
    /// bits. `n` must be a multiple of 16 and `k` of 32.
    fn build(n: usize, k: usize, weight: impl Fn(usize, usize) -> u16 + Sync) -> Result<Self> {
        if !Self::fits(n, k) {
            return Err(bad(format!(
                "shape ({n}, {k}): rows must be a positive multiple of {TILE_N}, columns of {BLOCK}"
            )));
        }
        let kb = k / BLOCK;
        let mut tiles = vec![Tile([0; BLOCK * TILE_N]); n / TILE_N * kb];
        tiles.par_iter_mut().enumerate().for_each(|(at, tile)| {
            let (t, b) = (at / kb, at % kb);
            for col in 0..TILE_N {
                for i in 0..BLOCK {
                    tile.0[(i / 2) * 32 + col * 2 + i % 2] =
                        weight(t * TILE_N + col, b * BLOCK + i);
                }
            }
        });
        Ok(Self { n, k, tiles })
    }

    /// Whether an `(n, k)` matrix can be laid as tiles.
    pub fn fits(n: usize, k: usize) -> bool {
        n > 0 && n.is_multiple_of(TILE_N) && k > 0 && k.is_multiple_of(BLOCK)
    }

    /// The Q8_0 blocks of an `(n, k)` matrix (row after row, `k / 32` blocks of 34
    /// bytes each), each weight `d·q` rounded to bfloat16.
    pub fn from_q8_0(bytes: &[u8], n: usize, k: usize) -> Result<Self> {
        let kb = k / BLOCK;
        if Self::fits(n, k) && bytes.len() != n * kb * BLOCK_BYTES {
            return Err(bad(format!(
                "{} bytes for a ({n}, {k}) Q8_0 matrix, expected {}",
                bytes.len(),
                n * kb * BLOCK_BYTES
            )));
        }
        Self::build(n, k, |col, i| {
            let block = &bytes[(col * kb + i / BLOCK) * BLOCK_BYTES..][..BLOCK_BYTES];
            let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
            bf16_bits(d * f32::from(block[2 + i % BLOCK] as i8))
        })
    }

    /// An `(n, k)` matrix of bf16 values, row-major.
    pub fn from_bf16(values: &[bf16], n: usize, k: usize) -> Result<Self> {
        if values.len() != n * k {
            return Err(bad(format!(
                "{} values for a ({n}, {k}) matrix",
                values.len()
            )));
        }
        Self::build(n, k, |col, i| values[col * k + i].to_bits())
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
        let tile = &self.tiles[(col / TILE_N) * (self.k / BLOCK) + i / BLOCK];
        let (c, j) = (col % TILE_N, i % BLOCK);
        bf16::from_bits(tile.0[(j / 2) * 32 + c * 2 + j % 2]).to_f32()
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
        if m == 0 {
            return Ok(Vec::new());
        }
        let a = to_bf16_tiles(x, m, self.k);
        let (m_blocks, n_pairs) = (m.div_ceil(2 * TILE_M), (self.n / TILE_N).div_ceil(2));
        // A task is up to 8 row tiles × 4 column pairs (256 rows, 128 columns): its
        // weight tiles (4 × k/32 × 2 KiB) stay in L2 while each 32-row stripe of
        // activations is used four times.
        let (m_chunks, n_groups) = (m_blocks.div_ceil(M_CHUNK), n_pairs.div_ceil(N_GROUP));
        // Not zeroed first: the blocks below write every output (all rows below `m`,
        // all columns), so a memset would only be overwritten.
        let mut y: Vec<f32> = crate::cpu::large_buffer(m * self.n);
        let y_ptr = SendPtr(y.as_mut_ptr());
        (0..m_chunks * n_groups).into_par_iter().for_each(|task| {
            let (mc, ng) = (task / n_groups, task % n_groups);
            for mb in mc * M_CHUNK..((mc + 1) * M_CHUNK).min(m_blocks) {
                for np in ng * N_GROUP..((ng + 1) * N_GROUP).min(n_pairs) {
                    // SAFETY: AMX is available (checked above); each call writes only
                    // its own 32 × 32 output block of `y` (inside its capacity), rows
                    // below `m`.
                    unsafe { amx::block_32x32(self, &a, m, mb, np, y_ptr) };
                }
            }
        });
        // SAFETY: the tasks covered every (row block, column pair), and each block
        // wrote all of its rows below `m` and all of its columns: `m · n` values.
        unsafe { y.set_len(m * self.n) };
        Ok(y)
    }
}

/// [`AmxMatrix::matmul`] over a candle tensor: `x` `(rows, k)` on the CPU, f32 or
/// bf16 (made contiguous if it is not), gives `(rows, n)` in `x`'s dtype.
pub fn amx_linear(x: &candle_core::Tensor, w: &AmxMatrix) -> Result<candle_core::Tensor> {
    use candle_core::DType;
    let dtypes = [DType::F32, DType::BF16];
    crate::cpu::linear("amx_matmul", x, (w.n, w.k), &dtypes, |v, m| w.matmul(v, m))
}

/// The rows of `x` as bfloat16 bits (round to nearest even) in A-tile order:
/// per 32-row stripe (rows past `m` zero) and 32 values of k, its two 16-row tiles
/// of 1 KiB each, so every tile load reads one contiguous KiB.
fn to_bf16_tiles(x: &[f32], m: usize, k: usize) -> Vec<u16> {
    let stripe = 2 * TILE_M * k;
    let len = m.div_ceil(2 * TILE_M) * stripe;
    // Every value is written below (padding rows as zeros), so no memset first.
    let mut a: Vec<u16> = crate::cpu::large_buffer(len);
    a.spare_capacity_mut()[..len]
        .par_chunks_mut(stripe)
        .enumerate()
        .for_each(|(mb, tiles)| {
            let live = (m - mb * 2 * TILE_M).min(2 * TILE_M);
            for r in 0..2 * TILE_M {
                let (half, ri) = (r / TILE_M, r % TILE_M);
                for b in 0..k / BLOCK {
                    let at = (b * 2 + half) * TILE_M * BLOCK + ri * BLOCK;
                    let dst = &mut tiles[at..at + BLOCK];
                    if r < live {
                        let values = &x[(mb * 2 * TILE_M + r) * k + b * BLOCK..][..BLOCK];
                        for (a, &v) in dst.iter_mut().zip(values) {
                            a.write(bf16_bits(v));
                        }
                    } else {
                        dst.iter_mut().for_each(|a| {
                            a.write(0);
                        });
                    }
                }
            }
        });
    // SAFETY: the stripes cover `len` values and each wrote all of its own.
    unsafe { a.set_len(len) };
    a
}

/// The arithmetic of [`AmxMatrix::matmul`] in plain Rust: activations rounded to
/// bfloat16, the products summed exactly (f64).
pub fn matmul_reference(w: &AmxMatrix, x: &[f32], m: usize) -> Vec<f32> {
    let (n, k) = (w.n, w.k);
    let mut y = vec![0f32; m * n];
    for r in 0..m {
        let row: Vec<f64> = x[r * k..(r + 1) * k]
            .iter()
            .map(|&v| f64::from(bf16::from_bits(bf16_bits(v)).to_f32()))
            .collect();
        for col in 0..n {
            let dot: f64 = (0..k).map(|i| row[i] * f64::from(w.weight(col, i))).sum();
            y[r * n + col] = dot as f32;
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
    *OK.get_or_init(|| !switched_off("AISQL_NO_AMX") && amx::detect())
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

    /// The 32 × 32 outputs (`mb`, `np`): rows `32·mb ..`, columns `32·np ..` (16 of
    /// them when the matrix has an odd number of column tiles and this is the last
    /// pair).
    ///
    /// # Safety
    /// AMX must be available; `a` holds whole 32-row stripes of bf16 A tiles; no other task
    /// writes these outputs of `y`.
    pub(super) unsafe fn block_32x32(
        w: &AmxMatrix,
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
        let b0 = w.tiles[t0 * kb..].as_ptr();
        let b1 = w.tiles[t1 * kb..].as_ptr();
        // SAFETY (whole block): the caller guarantees AMX; every tile load reads
        // inside `a` (padded rows) or the tiles of columns t0 and t1; stores go to
        // `c` or to rows below `m` of this block's columns of `y`.
        unsafe {
            core::arch::asm!(
                "ldtilecfg [{cfg}]",
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                cfg = in(reg) &CONFIG,
                options(nostack)
            );
            let a0 = a.as_ptr().add(m0 * k);
            let a1 = a0.add(TILE_M * BLOCK);
            for b in 0..kb {
                core::arch::asm!(
                    "tileloadd tmm4, [{a0} + {sa}*1]",
                    "tileloadd tmm6, [{b0} + {sb}*1]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tileloadd tmm7, [{b1} + {sb}*1]",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "tileloadd tmm5, [{a1} + {sa}*1]",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    a0 = in(reg) a0.add(b * 2 * TILE_M * BLOCK),
                    a1 = in(reg) a1.add(b * 2 * TILE_M * BLOCK),
                    b0 = in(reg) b0.add(b),
                    b1 = in(reg) b1.add(b),
                    sa = in(reg) 64usize,
                    sb = in(reg) 64usize,
                    options(nostack)
                );
            }
            if rows == 2 * TILE_M && cols == 32 {
                // A whole block: straight into `y`.
                let at = y.at(m0 * n + np * 32);
                core::arch::asm!(
                    "tilestored [{c0} + {sy}*1], tmm0",
                    "tilestored [{c0} + {sy}*1 + 64], tmm1",
                    "tilestored [{c1} + {sy}*1], tmm2",
                    "tilestored [{c1} + {sy}*1 + 64], tmm3",
                    "tilerelease",
                    c0 = in(reg) at,
                    c1 = in(reg) at.add(TILE_M * n),
                    sy = in(reg) 4 * n,
                    options(nostack)
                );
                return;
            }
            // A ragged block: through scratch, then the rows and columns that exist.
            let mut c = [0f32; 4 * 256];
            core::arch::asm!(
                "tilestored [{c} + {sc}*1], tmm0",
                "tilestored [{c} + {sc}*1 + 1024], tmm1",
                "tilestored [{c} + {sc}*1 + 2048], tmm2",
                "tilestored [{c} + {sc}*1 + 3072], tmm3",
                "tilerelease",
                c = in(reg) c.as_mut_ptr(),
                sc = in(reg) 64usize,
                options(nostack)
            );
            for r in 0..rows {
                let (half, ri) = (r / TILE_M, r % TILE_M);
                for nt in 0..cols / TILE_N {
                    std::ptr::copy_nonoverlapping(
                        c.as_ptr().add((half * 2 + nt) * 256 + ri * 16),
                        y.at((m0 + r) * n + np * 32 + nt * TILE_N),
                        TILE_N,
                    );
                }
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

    pub(super) unsafe fn block_32x32(
        _: &AmxMatrix,
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
    use crate::testutil::{assert_relatively_close, q8_bytes, spiky};

    #[test]
    fn amx_matches_the_reference_on_ragged_shapes() {
        if !amx_available() {
            eprintln!("no AMX-BF16 on this machine: the AMX kernel is not exercised");
            return;
        }
        // m: one row (decode), a partial block, whole blocks, several tasks; n: an
        // odd tile count and several column groups.
        for (m, n, k) in [
            (1, 64, 64),
            (13, 48, 96),
            (45, 80, 256),
            (70, 32, 1024),
            (64, 160, 128),
            (300, 272, 64),
        ] {
            let w = AmxMatrix::from_q8_0(&q8_bytes(n, k, (m * n) as u64), n, k).unwrap();
            let x = spiky(m * k, 0.0);
            let got = w.matmul(&x, m).unwrap();
            let want = matmul_reference(&w, &x, m);
            assert_relatively_close(&got, &want, 1e-4, (m, n, k));
        }
    }

    #[test]
    fn the_layout_keeps_every_weight_and_bad_shapes_are_refused() {
        let (n, k) = (32, 64);
        let bytes = q8_bytes(n, k, 5);
        let w = AmxMatrix::from_q8_0(&bytes, n, k).unwrap();
        for col in [0, 7, 16, 31] {
            for i in [0, 5, 31, 32, 63] {
                let block = &bytes[(col * 2 + i / 32) * BLOCK_BYTES..][..BLOCK_BYTES];
                let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
                let q = f32::from(block[2 + i % 32] as i8);
                assert_eq!(w.weight(col, i), bf16::from_f32(d * q).to_f32());
                // Within bf16's rounding of the Q8_0 value.
                assert!((w.weight(col, i) - d * q).abs() <= (d * q).abs() / 256.0);
            }
        }
        let values: Vec<bf16> = (0..n * k)
            .map(|i| bf16::from_f32(i as f32 * 0.25))
            .collect();
        let b = AmxMatrix::from_bf16(&values, n, k).unwrap();
        for (col, i) in [(0, 0), (3, 17), (31, 63), (16, 40)] {
            assert_eq!(b.weight(col, i), values[col * k + i].to_f32());
        }
        assert!(AmxMatrix::from_q8_0(&bytes, 24, 64).is_err());
        assert!(AmxMatrix::from_q8_0(&bytes, 32, 48).is_err());
        assert!(AmxMatrix::from_q8_0(&bytes[1..], 32, 64).is_err());
        assert!(AmxMatrix::from_bf16(&values[1..], n, k).is_err());
        assert!(AmxMatrix::from_bf16(&values[..0], 0, 0).is_err());
        assert!(w.matmul(&[0.0; 10], 1).is_err());
    }

    #[test]
    fn amx_linear_keeps_the_input_dtype_and_checks_its_shape() {
        if !amx_available() {
            return;
        }
        use candle_core::{DType, Device, Tensor};
        let (n, k, m) = (48, 64, 5);
        let w = AmxMatrix::from_q8_0(&q8_bytes(n, k, 9), n, k).unwrap();
        let x = Tensor::from_vec(spiky(m * k, 0.0), (m, k), &Device::Cpu).unwrap();
        let want = matmul_reference(&w, &spiky(m * k, 0.0), m);
        for dtype in [DType::F32, DType::BF16] {
            let y = amx_linear(&x.to_dtype(dtype).unwrap(), &w).unwrap();
            assert_eq!((y.dtype(), y.dims2().unwrap()), (dtype, (m, n)));
            let y: Vec<f32> = y
                .to_dtype(DType::F32)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let tol = if dtype == DType::F32 { 1e-4 } else { 1e-2 };
            for (g, r) in y.iter().zip(&want) {
                assert!(
                    (g - r).abs() <= tol * r.abs().max(1.0),
                    "{dtype:?}: {g} vs {r}"
                );
            }
        }
        let wrong = Tensor::zeros((m, k + 32), DType::F32, &Device::Cpu).unwrap();
        assert!(
            amx_linear(&wrong, &w)
                .unwrap_err()
                .to_string()
                .contains("amx_matmul")
        );
        let f16 = x.to_dtype(DType::F16).unwrap();
        assert!(amx_linear(&f16, &w).is_err());
    }

    #[test]
    fn bf16_rounding_is_half_crates() {
        for v in spiky(4 * 512, 0.0)
            .into_iter()
            .chain([0.0, -0.0, 1.0, 1.0039062, 1.0117188, -3.5e-20, 3.0e38])
        {
            assert_eq!(bf16_bits(v), bf16::from_f32(v).to_bits(), "{v}");
        }
    }
}
