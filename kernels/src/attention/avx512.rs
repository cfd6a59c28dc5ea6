//! The tiled attention kernel's key-block step on AVX-512: query rows four at a
//! time (two where a task has no more, as a decode step's GQA group of two does),
//! so every key and value vector loaded serves four rows. Scores of four
//! rows × 64 keys sit in 16 registers over the whole head width; the weighted sum
//! of values keeps four rows × 64 output columns in 16 registers per pass.

use core::arch::x86_64::*;

use super::{BlockRows, BlockView, K_BLOCK, Scratch};

/// Query rows per step.
const ROWS: usize = 4;
/// f32 lanes of a register.
const LANES: usize = 16;
/// Registers across a key block (64 keys).
const KEY_VECS: usize = K_BLOCK / LANES;

/// Four query rows at a time on AVX-512F.
pub(super) struct FourRows;

impl BlockRows for FourRows {
    #[inline(always)]
    unsafe fn block<const D: usize>(sc: &mut Scratch, kt: &[f32], vb: &[f32], view: BlockView) {
        // SAFETY: the caller runs this only where AVX-512F is (`tile_avx512`).
        unsafe { block::<D>(sc, kt, vb, view) }
    }
}

/// Output registers per row in one pass over the values (64 columns, or the
/// whole head when it is narrower).
const fn out_vecs(d: usize) -> usize {
    if d >= 4 * LANES { 4 } else { d / LANES }
}

/// # Safety
/// AVX-512F must be available; `D` is a multiple of 16; `kt` holds `D × K_BLOCK`
/// values; `vb` holds `view.keys` rows of `D`; `sc.q` holds the task's rows padded
/// to a multiple of four.
#[target_feature(enable = "avx512f")]
unsafe fn block<const D: usize>(sc: &mut Scratch, kt: &[f32], vb: &[f32], view: BlockView) {
    // A decode step's task has one row per query head of its KV head's group (two
    // in Qwen3-0.6B): four-row steps would spend half their work on padding.
    // SAFETY: forwarded from the caller; `sc.q` padded to four rows covers two.
    unsafe {
        if sc.m.len() <= 2 {
            block_rows::<D, 2>(sc, kt, vb, view)
        } else {
            block_rows::<D, ROWS>(sc, kt, vb, view)
        }
    }
}

/// [`block`] `R` query rows at a time (each row's arithmetic is the same whatever
/// `R` is).
///
/// # Safety
/// As [`block`].
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn block_rows<const D: usize, const R: usize>(
    sc: &mut Scratch,
    kt: &[f32],
    vb: &[f32],
    view: BlockView,
) {
    debug_assert!(D.is_multiple_of(LANES) && kt.len() >= D * K_BLOCK);
    debug_assert!(vb.len() >= view.keys * D && sc.q.len() >= sc.m.len().next_multiple_of(R) * D);
    let rows = sc.m.len();
    let w = out_vecs(D);
    for r0 in (0..rows).step_by(R) {
        let live = (rows - r0).min(R);
        let mut nvalid = [0usize; R];
        for (i, nv) in nvalid.iter_mut().enumerate().take(live) {
            *nv = view.visible(r0 + i);
        }
        let most = nvalid.iter().copied().max().unwrap_or(0);
        if most == 0 {
            continue;
        }
        // SAFETY (whole loop body): loads read `sc.q` rows r0..r0+R (padded), `kt`
        // rows c < D of K_BLOCK values, `vb` rows j < most ≤ keys of D values, and
        // `sc.o` rows r0..r0+live; stores write `p` and those `sc.o` rows.
        unsafe {
            // Scores: four rows × 64 keys.
            let mut s = [[_mm512_setzero_ps(); KEY_VECS]; R];
            let q = sc.q.as_ptr().add(r0 * D);
            for c in 0..D {
                let kc = kt.as_ptr().add(c * K_BLOCK);
                let (k0, k1) = (_mm512_loadu_ps(kc), _mm512_loadu_ps(kc.add(LANES)));
                let (k2, k3) = (
                    _mm512_loadu_ps(kc.add(2 * LANES)),
                    _mm512_loadu_ps(kc.add(3 * LANES)),
                );
                for (i, row) in s.iter_mut().enumerate() {
                    let qc = _mm512_set1_ps(*q.add(i * D + c));
                    row[0] = _mm512_fmadd_ps(qc, k0, row[0]);
                    row[1] = _mm512_fmadd_ps(qc, k1, row[1]);
                    row[2] = _mm512_fmadd_ps(qc, k2, row[2]);
                    row[3] = _mm512_fmadd_ps(qc, k3, row[3]);
                }
            }
            // Weights and rescaling per row; a row that sees no key of this block
            // keeps its output (weight 0, factor 1).
            let mut p = [[0f32; K_BLOCK]; R];
            let mut alpha = [1f32; R];
            for i in 0..live {
                if nvalid[i] == 0 {
                    continue;
                }
                let r = r0 + i;
                let weights = softmax_step(&s[i], nvalid[i], &mut sc.m[r], &mut sc.l[r]);
                alpha[i] = weights.1;
                for (j, &v) in weights.0.iter().enumerate() {
                    _mm512_storeu_ps(p[i].as_mut_ptr().add(j * LANES), v);
                }
            }
            // Output: rescaled, plus the weighted values, 64 columns per pass.
            for col in (0..D).step_by(w * LANES) {
                let mut acc = [[_mm512_setzero_ps(); 4]; R];
                for i in 0..live {
                    let o = sc.o.as_ptr().add((r0 + i) * D + col);
                    let a = _mm512_set1_ps(alpha[i]);
                    for (t, acc) in acc[i].iter_mut().enumerate().take(w) {
                        *acc = _mm512_mul_ps(_mm512_loadu_ps(o.add(t * LANES)), a);
                    }
                }
                // `j` picks a value row and the same key's weight in every row of `p`.
                #[allow(clippy::needless_range_loop)]
                for j in 0..most {
                    let vj = vb.as_ptr().add(j * D + col);
                    if w == 4 {
                        let (v0, v1) = (_mm512_loadu_ps(vj), _mm512_loadu_ps(vj.add(LANES)));
                        let (v2, v3) = (
                            _mm512_loadu_ps(vj.add(2 * LANES)),
                            _mm512_loadu_ps(vj.add(3 * LANES)),
                        );
                        for (i, row) in acc.iter_mut().enumerate() {
                            let pj = _mm512_set1_ps(p[i][j]);
                            row[0] = _mm512_fmadd_ps(pj, v0, row[0]);
                            row[1] = _mm512_fmadd_ps(pj, v1, row[1]);
                            row[2] = _mm512_fmadd_ps(pj, v2, row[2]);
                            row[3] = _mm512_fmadd_ps(pj, v3, row[3]);
                        }
                    } else {
                        for (i, row) in acc.iter_mut().enumerate() {
                            let pj = _mm512_set1_ps(p[i][j]);
                            for (t, a) in row.iter_mut().enumerate().take(w) {
                                *a = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vj.add(t * LANES)), *a);
                            }
                        }
                    }
                }
                for (i, row) in acc.iter().enumerate().take(live) {
                    let o = sc.o.as_mut_ptr().add((r0 + i) * D + col);
                    for (t, &a) in row.iter().enumerate().take(w) {
                        _mm512_storeu_ps(o.add(t * LANES), a);
                    }
                }
            }
        }
    }
}

/// The online-softmax step of one row over a block (`super::online_softmax` on
/// registers): the scores of its 64 keys, of which the first `nvalid` (≥ 1) are
/// visible, become their weights `exp(s - m_new)` (zero past `nvalid`); the row's
/// running max `m` and sum `l` take the block in; returns the weights and the
/// factor that rescales the row's earlier output. With head widths of 16 or 32 the
/// scalar step cost as much as the dot products.
///
/// # Safety
/// AVX-512F must be available.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn softmax_step(
    s: &[__m512; KEY_VECS],
    nvalid: usize,
    m: &mut f32,
    l: &mut f32,
) -> ([__m512; KEY_VECS], f32) {
    let mask = |t: usize| -> __mmask16 {
        let n = nvalid.saturating_sub(t * LANES).min(LANES);
        ((1u32 << n) - 1) as __mmask16
    };
    let neg_inf = _mm512_set1_ps(f32::NEG_INFINITY);
    let mut top = neg_inf;
    for (t, &v) in s.iter().enumerate() {
        top = _mm512_max_ps(top, _mm512_mask_blend_ps(mask(t), neg_inf, v));
    }
    let m_old = *m;
    let m_new = m_old.max(_mm512_reduce_max_ps(top));
    let alpha = if m_old == f32::NEG_INFINITY {
        0.0
    } else {
        super::exp_nonpositive(m_old - m_new)
    };
    let shift = _mm512_set1_ps(m_new);
    let mut p = [_mm512_setzero_ps(); KEY_VECS];
    let mut sum = _mm512_setzero_ps();
    for (t, &v) in s.iter().enumerate() {
        p[t] = _mm512_maskz_mov_ps(mask(t), exp_nonpositive_x16(_mm512_sub_ps(v, shift)));
        sum = _mm512_add_ps(sum, p[t]);
    }
    *m = m_new;
    *l = *l * alpha + _mm512_reduce_add_ps(sum);
    (p, alpha)
}

/// `crate::cpu::exp_nonpositive` on 16 lanes, operation for operation (no fused
/// multiply-adds), so each lane gives the scalar function's value.
#[inline]
#[target_feature(enable = "avx512f")]
fn exp_nonpositive_x16(x: __m512) -> __m512 {
    const MAGIC: f32 = 12_582_912.0;
    let set = _mm512_set1_ps;
    let (mul, add, sub) = (_mm512_mul_ps, _mm512_add_ps, _mm512_sub_ps);
    let x = _mm512_max_ps(x, set(-87.0));
    let t = add(mul(x, set(std::f32::consts::LOG2_E)), set(MAGIC));
    let fx = sub(t, set(MAGIC));
    let r = add(
        sub(x, mul(fx, set(0.693_359_4))),
        mul(fx, set(2.121_944_4e-4)),
    );
    let z = mul(r, r);
    let mut p = add(mul(set(1.987_569_1e-4), r), set(1.398_2e-3));
    p = add(mul(p, r), set(8.333_452e-3));
    p = add(mul(p, r), set(4.166_579_6e-2));
    p = add(mul(p, r), set(1.666_666_5e-1));
    p = add(mul(p, r), set(0.5));
    let y = add(add(mul(p, z), r), set(1.0));
    let bias = _mm512_set1_epi32((MAGIC.to_bits() - 127) as i32);
    let pow2 = _mm512_slli_epi32::<23>(_mm512_sub_epi32(_mm512_castps_si512(t), bias));
    mul(y, _mm512_castsi512_ps(pow2))
}

/// `kt[c · K_BLOCK + j] = rows[j][c]` in 16 × 16 tiles transposed in registers
/// (a scalar scatter of a 64-key block was as slow as the attention over it).
///
/// # Safety
/// AVX-512F must be available; `D` is a multiple of 16, every row holds `D`
/// values and `kt` holds `D × K_BLOCK`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn transpose_block<const D: usize>(rows: &[&[f32]; K_BLOCK], kt: &mut [f32]) {
    debug_assert!(D.is_multiple_of(LANES) && kt.len() >= D * K_BLOCK);
    debug_assert!(rows.iter().all(|r| r.len() >= D));
    for j0 in (0..K_BLOCK).step_by(LANES) {
        for c0 in (0..D).step_by(LANES) {
            // SAFETY: each row has D values (c0 + 16 <= D); the stores write row
            // c0 + i of kt, 16 values from column j0 (j0 + 16 <= K_BLOCK).
            unsafe {
                let r: [__m512; LANES] =
                    std::array::from_fn(|i| _mm512_loadu_ps(rows[j0 + i].as_ptr().add(c0)));
                let t = transpose16(r);
                for (i, v) in t.iter().enumerate() {
                    _mm512_storeu_ps(kt.as_mut_ptr().add((c0 + i) * K_BLOCK + j0), *v);
                }
            }
        }
    }
}

/// Sixteen registers of sixteen lanes transposed: lane `j` of output `i` is lane
/// `i` of input `j`.
#[inline(always)]
unsafe fn transpose16(r: [__m512; LANES]) -> [__m512; LANES] {
    // SAFETY: register shuffles only; the caller has AVX-512F.
    unsafe {
        // Pairs of rows interleaved by lane, then by lane pairs: each 128-bit lane
        // of u[4q + p] holds a 4 × 4 transposed sub-block.
        let t: [__m512; LANES] = std::array::from_fn(|i| {
            let (a, b) = (r[i & !1], r[i | 1]);
            if i % 2 == 0 {
                _mm512_unpacklo_ps(a, b)
            } else {
                _mm512_unpackhi_ps(a, b)
            }
        });
        let pd = _mm512_castps_pd;
        let u: [__m512; LANES] = std::array::from_fn(|i| {
            // Group of four rows g, slot s: pairs (t[4g], t[4g + 2]) and
            // (t[4g + 1], t[4g + 3]), low and high halves.
            let (g, s) = (i / 4, i % 4);
            let (a, b) = (t[4 * g + s / 2], t[4 * g + 2 + s / 2]);
            _mm512_castpd_ps(if s % 2 == 0 {
                _mm512_unpacklo_pd(pd(a), pd(b))
            } else {
                _mm512_unpackhi_pd(pd(a), pd(b))
            })
        });
        // 128-bit lanes: first between row groups 0/1 and 2/3, then 0/2.
        let v: [__m512; LANES] = std::array::from_fn(|i| {
            let (half, s) = (i / 8, i % 8);
            let (a, b) = (u[8 * half + s % 4], u[8 * half + 4 + s % 4]);
            if s < 4 {
                _mm512_shuffle_f32x4::<0x88>(a, b)
            } else {
                _mm512_shuffle_f32x4::<0xdd>(a, b)
            }
        });
        std::array::from_fn(|i| {
            let (a, b) = (v[i % 8], v[8 + i % 8]);
            if i < 8 {
                _mm512_shuffle_f32x4::<0x88>(a, b)
            } else {
                _mm512_shuffle_f32x4::<0xdd>(a, b)
            }
        })
    }
}
