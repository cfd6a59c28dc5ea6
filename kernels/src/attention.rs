//! Attention of a packed batch of suffixes, each continuing its own cached prefix:
//! every suffix token attends to all of its prefix's keys and causally to its own
//! suffix's keys. Prefixes are given as a chain of KV segments (e.g. a document's
//! KV, then a question prefilled on top of it), so nothing is copied to share them.
//!
//! Layouts are head-major throughout, matching the KV cache:
//! * queries `q`: `(num_heads, total, head_dim)`, all suffixes packed along `total`;
//! * suffix keys/values `k`, `v`: `(num_kv_heads, total, head_dim)`;
//! * each prefix segment's K/V: `(num_kv_heads, seg_len, head_dim)`, or a view of
//!   the first `seg_len` positions of a longer buffer (a decoding sequence's open KV
//!   block, written in place), read where it lies;
//! * output: `(num_heads, total, head_dim)`.
//!
//! GQA: query head `h` reads KV head `h / (num_heads / num_kv_heads)`.

use candle_core::{DType, Tensor};
use rayon::prelude::*;

use crate::cpu::{CpuF32, axpy, dot, exp_nonpositive};
use crate::{KernelError, Result};

const KERNEL: &str = "prefix_suffix_attention";

/// Head counts and softmax scale shared by every sequence of a call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnDims {
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (divides `num_heads`).
    pub num_kv_heads: usize,
    /// Per-head width.
    pub head_dim: usize,
    /// Multiplier applied to `q·k` before the softmax, usually `1/sqrt(head_dim)`.
    pub scale: f32,
}

/// One cached KV segment as f32 slices, layout `(num_kv_heads, len, head_dim)` with
/// KV head `g`'s keys starting `g · stride · head_dim` values in.
#[derive(Debug, Clone, Copy)]
pub struct KvSlice<'a> {
    /// Keys: `(num_kv_heads - 1) · stride · head_dim + len · head_dim` values.
    pub k: &'a [f32],
    /// Values, laid out as the keys.
    pub v: &'a [f32],
    /// Positions in the segment.
    pub len: usize,
    /// Positions from one KV head's first key to the next's: `len` for a segment of
    /// its own, the buffer's capacity for a view of the start of a longer one.
    pub stride: usize,
}

impl KvSlice<'_> {
    /// Values `k` and `v` must hold for `num_kv_heads` heads of width `d`.
    fn values(&self, num_kv_heads: usize, d: usize) -> usize {
        (num_kv_heads.max(1) - 1) * self.stride * d + self.len * d
    }
}

/// One suffix of a packed batch, slice form: its prefix segments (oldest first) and
/// where its tokens sit in the packed `total` dimension.
#[derive(Debug, Clone)]
pub struct SeqSlices<'a> {
    /// Prefix segments, in position order.
    pub prefix: Vec<KvSlice<'a>>,
    /// First packed row of this suffix.
    pub start: usize,
    /// Number of suffix tokens.
    pub len: usize,
}

/// One suffix of a packed batch, tensor form (see [`SeqSlices`]); each prefix entry is
/// a `(k, v)` pair of shape `(num_kv_heads, seg_len, head_dim)`.
#[derive(Debug, Clone)]
pub struct SeqKv {
    /// Prefix segments `(k, v)`, in position order.
    pub prefix: Vec<(Tensor, Tensor)>,
    /// First packed row of this suffix.
    pub start: usize,
    /// Number of suffix tokens.
    pub len: usize,
}

impl SeqKv {
    /// Suffixes of the given lengths over the given prefixes, packed back to back
    /// from row 0 in order.
    pub fn packed(plan: impl IntoIterator<Item = (usize, Vec<(Tensor, Tensor)>)>) -> Vec<SeqKv> {
        let mut start = 0;
        plan.into_iter()
            .map(|(len, prefix)| {
                let s = SeqKv { prefix, start, len };
                start += len;
                s
            })
            .collect()
    }
}

fn bad(message: String) -> KernelError {
    KernelError::BadInput {
        kernel: KERNEL,
        message,
    }
}

fn check_seqs(total: usize, seqs: impl Iterator<Item = (usize, usize)>) -> Result<()> {
    let mut next = 0;
    for (start, len) in seqs {
        if start != next {
            return Err(bad(format!(
                "suffixes must tile the packed rows in order: expected start {next}, got {start}"
            )));
        }
        next = start + len;
    }
    if next != total {
        return Err(bad(format!(
            "suffix lengths sum to {next}, but {total} rows are packed"
        )));
    }
    Ok(())
}

/// Shared-prefix attention on f32 slices (CPU), parallel over suffixes × heads.
/// Writes `(num_heads, total, head_dim)` into `out`.
pub fn prefix_suffix_attention_slices(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    seqs: &[SeqSlices<'_>],
    dims: AttnDims,
    out: &mut [f32],
) -> Result<()> {
    let AttnDims {
        num_heads,
        num_kv_heads,
        head_dim: d,
        scale,
    } = dims;
    if num_kv_heads == 0 || d == 0 || !num_heads.is_multiple_of(num_kv_heads) {
        return Err(bad(format!(
            "{num_heads} query heads cannot share {num_kv_heads} KV heads"
        )));
    }
    let total = q.len() / (num_heads * d);
    if q.len() != num_heads * total * d || out.len() != q.len() {
        return Err(bad(format!(
            "q has {} values, out {}; not (num_heads={num_heads}, T, {d})",
            q.len(),
            out.len()
        )));
    }
    if k.len() != num_kv_heads * total * d || v.len() != k.len() {
        return Err(bad(format!(
            "k/v have {}/{} values, expected {}",
            k.len(),
            v.len(),
            num_kv_heads * total * d
        )));
    }
    check_seqs(total, seqs.iter().map(|s| (s.start, s.len)))?;
    if total == 0 {
        return Ok(());
    }
    for (i, s) in seqs.iter().enumerate() {
        for seg in &s.prefix {
            if seg.stride < seg.len
                || seg.k.len() != seg.values(num_kv_heads, d)
                || seg.v.len() != seg.k.len()
            {
                return Err(bad(format!(
                    "suffix {i}: prefix segment of len {} (head stride {}) has {} K values",
                    seg.len,
                    seg.stride,
                    seg.k.len()
                )));
            }
        }
    }
    let group = num_heads / num_kv_heads;
    match d {
        16 => {
            tiled::<16>(q, k, v, seqs, dims, out, BlockPath::best());
            return Ok(());
        }
        32 => {
            tiled::<32>(q, k, v, seqs, dims, out, BlockPath::best());
            return Ok(());
        }
        64 => {
            tiled::<64>(q, k, v, seqs, dims, out, BlockPath::best());
            return Ok(());
        }
        128 => {
            tiled::<128>(q, k, v, seqs, dims, out, BlockPath::best());
            return Ok(());
        }
        _ => {}
    }

    // Other head widths: one row at a time, full score rows.
    // Split `out` into one disjoint (head, suffix) block each, so rayon can hand
    // every block to a different thread without locking.
    let mut tasks: Vec<(usize, usize, &mut [f32])> = Vec::with_capacity(num_heads * seqs.len());
    for (h, head_out) in out.chunks_mut(total * d).enumerate() {
        let mut rest = head_out;
        for (s, seq) in seqs.iter().enumerate() {
            let (block, tail) = rest.split_at_mut(seq.len * d);
            tasks.push((h, s, block));
            rest = tail;
        }
    }

    tasks
        .into_par_iter()
        .for_each_init(Vec::new, |scores: &mut Vec<f32>, (h, s, block)| {
            let seq = &seqs[s];
            let g = h / group;
            let prefix_len: usize = seq.prefix.iter().map(|p| p.len).sum();
            let q_head = &q[h * total * d..(h + 1) * total * d];
            let k_head = &k[g * total * d..(g + 1) * total * d];
            let v_head = &v[g * total * d..(g + 1) * total * d];
            for i in 0..seq.len {
                let qi = &q_head[(seq.start + i) * d..(seq.start + i + 1) * d];
                scores.clear();
                for seg in &seq.prefix {
                    let ks = &seg.k[g * seg.stride * d..][..seg.len * d];
                    scores.extend(ks.chunks_exact(d).map(|kj| dot(qi, kj) * scale));
                }
                let own = &k_head[seq.start * d..(seq.start + i + 1) * d];
                scores.extend(own.chunks_exact(d).map(|kj| dot(qi, kj) * scale));

                let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0f32;
                for x in scores.iter_mut() {
                    *x = (*x - max).exp();
                    sum += *x;
                }
                let o = &mut block[i * d..(i + 1) * d];
                o.fill(0.0);
                let mut j = 0;
                for seg in &seq.prefix {
                    let vs = &seg.v[g * seg.stride * d..][..seg.len * d];
                    for vj in vs.chunks_exact(d) {
                        axpy(o, scores[j], vj);
                        j += 1;
                    }
                }
                debug_assert_eq!(j, prefix_len);
                for vj in v_head[seq.start * d..(seq.start + i + 1) * d].chunks_exact(d) {
                    axpy(o, scores[j], vj);
                    j += 1;
                }
                let inv = 1.0 / sum;
                o.iter_mut().for_each(|x| *x *= inv);
            }
        });
    Ok(())
}

/// Query positions per task of the tiled kernel; a task covers them for every query
/// head of one GQA group, so each K/V block it loads serves `group × Q_TILE` rows.
const Q_TILE: usize = 32;
/// Keys per block of the tiled kernel: a block's K (transposed) and V stay in L1.
/// Blocks are counted from a sequence's first position, whatever segments hold their
/// keys, so a row's sums run in the same order however its prefix was cached (as
/// one segment, several, or none with the whole prompt computed at once).
const K_BLOCK: usize = 64;

#[cfg(target_arch = "x86_64")]
mod avx512;

/// Which build of the tiled kernel's key-block step runs: the widest this CPU has
/// ([`BlockPath::best`]); tests run each of [`BlockPath::available`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BlockPath {
    /// Four query rows at a time on AVX-512F.
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// One row at a time, AVX2 with fused multiply-adds.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// One row at a time, portable.
    Plain,
}

impl BlockPath {
    /// The builds this CPU can run, widest first.
    fn available() -> Vec<Self> {
        let mut paths = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f") {
                paths.push(Self::Avx512);
            }
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                paths.push(Self::Avx2);
            }
        }
        paths.push(Self::Plain);
        paths
    }

    /// The widest build this CPU can run (asked once).
    fn best() -> Self {
        static BEST: std::sync::OnceLock<BlockPath> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| Self::available()[0])
    }
}

/// `a * b + c`; fused (one rounding) in the FMA build of the kernel.
trait Madd {
    fn madd(a: f32, b: f32, c: f32) -> f32;
}
struct Plain;
impl Madd for Plain {
    #[inline(always)]
    fn madd(a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }
}
#[cfg(target_arch = "x86_64")]
struct Fused;
#[cfg(target_arch = "x86_64")]
impl Madd for Fused {
    #[inline(always)]
    fn madd(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
}

/// One task of the tiled kernel: query positions `i0..i1` of suffix `seq`, for the
/// query heads of KV head `g`; `outs[hh]` is head `g·group + hh`'s output block.
struct TileTask<'o> {
    seq: usize,
    g: usize,
    i0: usize,
    i1: usize,
    outs: Vec<&'o mut [f32]>,
}

/// Per-thread buffers of the tiled kernel.
#[derive(Default)]
struct Scratch {
    q: Vec<f32>,
    o: Vec<f32>,
    m: Vec<f32>,
    l: Vec<f32>,
    /// One key block gathered for a suffix without [`KeyBlocks`].
    block: BlockScratch,
}

/// One key block as [`KeyBlocks`] holds it, gathered by the task that reads it.
#[derive(Default)]
struct BlockScratch {
    /// Keys transposed, `D × K_BLOCK`, zero past the block's keys.
    kt: Vec<f32>,
    /// Values, when the block's keys span two segments (else read in place).
    v: Vec<f32>,
}

/// Flash-attention style kernel for head width `D`: parallel over (KV head, suffix,
/// query tile); each task streams its keys (prefix segments, then the causal part of
/// its own suffix, skipping blocks wholly in its future) in blocks of `K_BLOCK`
/// positions,
/// keeping a running max / sum / output per query row, so no score row is
/// materialised beyond one block. Inputs were validated by the caller.
fn tiled<const D: usize>(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    seqs: &[SeqSlices<'_>],
    dims: AttnDims,
    out: &mut [f32],
    path: BlockPath,
) {
    let group = dims.num_heads / dims.num_kv_heads;
    let total = q.len() / (dims.num_heads * D);
    let tiles: Vec<(usize, usize, usize)> = seqs
        .iter()
        .enumerate()
        .flat_map(|(s, seq)| {
            (0..seq.len)
                .step_by(Q_TILE)
                .map(move |i0| (s, i0, (i0 + Q_TILE).min(seq.len)))
        })
        .collect();
    let mut tasks: Vec<TileTask<'_>> = (0..dims.num_kv_heads)
        .flat_map(|g| {
            tiles.iter().map(move |&(seq, i0, i1)| TileTask {
                seq,
                g,
                i0,
                i1,
                outs: Vec::with_capacity(group),
            })
        })
        .collect();
    // Tiles are in packed-row order, so each head's output splits into them in turn.
    for (h, head_out) in out.chunks_mut(total * D).enumerate() {
        let base = (h / group) * tiles.len();
        let mut rest = head_out;
        for (t, &(_, i0, i1)) in tiles.iter().enumerate() {
            let (block, tail) = rest.split_at_mut((i1 - i0) * D);
            tasks[base + t].outs.push(block);
            rest = tail;
        }
    }
    let heads = dims.num_kv_heads;
    // A suffix of one query tile (every decode step's one new position) has one
    // task per KV head, which reads each key block once: its task gathers the block
    // as it goes, instead of a copy of the whole prefix made first (at 16 decoding
    // sequences over a 300-token prefix, that copy was a gigabyte of fresh memory
    // per step).
    let inputs = TileInputs {
        q,
        k,
        v,
        seqs,
        dims,
        total,
        blocks: (0..seqs.len() * heads)
            .into_par_iter()
            .map(|i| {
                let seq = &seqs[i / heads];
                (seq.len > Q_TILE).then(|| KeyBlocks::new::<D>(seq, k, v, i % heads, total))
            })
            .collect(),
    };
    let inputs = &inputs;
    tasks
        .into_par_iter()
        .for_each_init(Scratch::default, |sc, mut task| match path {
            // SAFETY: `BlockPath::available` offers only what this CPU has.
            #[cfg(target_arch = "x86_64")]
            BlockPath::Avx512 => unsafe { tile_avx512::<D>(inputs, &mut task, sc) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            BlockPath::Avx2 => unsafe { tile_avx2::<D>(inputs, &mut task, sc) },
            BlockPath::Plain => tile::<D, PerRow<Plain>>(inputs, &mut task, sc),
        });
}

/// What every task of one call reads.
struct TileInputs<'a> {
    /// Queries `(num_heads, total, D)`.
    q: &'a [f32],
    /// The suffixes' own keys and values `(num_kv_heads, total, D)`.
    k: &'a [f32],
    v: &'a [f32],
    /// The suffixes.
    seqs: &'a [SeqSlices<'a>],
    dims: AttnDims,
    /// Packed suffix rows.
    total: usize,
    /// The [`KeyBlocks`] of each (suffix, KV head), suffix-major; `None` for a
    /// suffix of one query tile, whose task gathers its blocks itself.
    blocks: Vec<Option<KeyBlocks>>,
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn tile_avx2<const D: usize>(inputs: &TileInputs<'_>, task: &mut TileTask<'_>, sc: &mut Scratch) {
    tile::<D, PerRow<Fused>>(inputs, task, sc)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn tile_avx512<const D: usize>(inputs: &TileInputs<'_>, task: &mut TileTask<'_>, sc: &mut Scratch) {
    tile::<D, avx512::FourRows>(inputs, task, sc)
}

/// Where a key block's keys are visible to a task's query rows: row `r` (head in
/// group, position `r % n` of the tile) sees the block's first
/// [`Self::visible`] keys.
#[derive(Clone, Copy)]
struct BlockView {
    /// Position of the block's first key.
    first: usize,
    /// Keys in the block (the last may be short).
    keys: usize,
    /// Prefix positions before the suffix.
    prefix_len: usize,
    /// The tile's first query position in its suffix.
    i0: usize,
    /// Query positions in the tile.
    n: usize,
}

impl BlockView {
    /// Keys of the block row `r` sees (causal: positions ≤ its own).
    #[inline(always)]
    fn visible(&self, r: usize) -> usize {
        let qpos = self.prefix_len + self.i0 + r % self.n;
        (qpos + 1).saturating_sub(self.first).min(self.keys)
    }
}

/// How a task's query rows take in one key block: scores against the block's
/// transposed keys `kt` (`D × K_BLOCK`, zero past the block's keys), the online
/// softmax update of `sc.m`/`sc.l`, and `sc.o += p · V` for the block's values `vb`.
trait BlockRows {
    /// # Safety
    /// The CPU must have what the implementation's kernel was built for; `sc.q`
    /// holds every row (padded to a multiple of four rows with zeros).
    unsafe fn block<const D: usize>(sc: &mut Scratch, kt: &[f32], vb: &[f32], view: BlockView);
}

/// One query row at a time, in plain (auto-vectorised) Rust.
struct PerRow<M>(std::marker::PhantomData<M>);

impl<M: Madd> BlockRows for PerRow<M> {
    #[inline(always)]
    unsafe fn block<const D: usize>(sc: &mut Scratch, kt: &[f32], vb: &[f32], view: BlockView) {
        let rows = sc.m.len();
        for r in 0..rows {
            let nvalid = view.visible(r);
            if nvalid == 0 {
                continue;
            }
            let qr: &[f32; D] = sc.q[r * D..(r + 1) * D].try_into().unwrap();
            let mut s = [0f32; K_BLOCK];
            for (c, &qc) in qr.iter().enumerate() {
                let kc: &[f32; K_BLOCK] = kt[c * K_BLOCK..(c + 1) * K_BLOCK].try_into().unwrap();
                for j in 0..K_BLOCK {
                    s[j] = M::madd(qc, kc[j], s[j]);
                }
            }
            let alpha = online_softmax(&mut s, nvalid, &mut sc.m[r], &mut sc.l[r]);
            // Four independent accumulators, so the FMA chains overlap.
            let mut o4 = [[0f32; D]; 4];
            let (ps, vs) = (&s[..nvalid], &vb[..nvalid * D]);
            for (p4, v4) in ps.chunks_exact(4).zip(vs.chunks_exact(4 * D)) {
                for (u, acc) in o4.iter_mut().enumerate() {
                    let vj = &v4[u * D..(u + 1) * D];
                    for c in 0..D {
                        acc[c] = M::madd(p4[u], vj[c], acc[c]);
                    }
                }
            }
            let tail = nvalid / 4 * 4;
            for (&p, vj) in ps[tail..].iter().zip(vs[tail * D..].chunks_exact(D)) {
                for c in 0..D {
                    o4[0][c] = M::madd(p, vj[c], o4[0][c]);
                }
            }
            let mut o = [0f32; D];
            for c in 0..D {
                o[c] = (o4[0][c] + o4[1][c]) + (o4[2][c] + o4[3][c]);
            }
            let or = &mut sc.o[r * D..(r + 1) * D];
            for c in 0..D {
                or[c] = M::madd(or[c], alpha, o[c]);
            }
        }
    }
}

/// Runs one [`TileTask`].
#[inline(always)]
fn tile<const D: usize, R: BlockRows>(
    inputs: &TileInputs<'_>,
    task: &mut TileTask<'_>,
    sc: &mut Scratch,
) {
    let TileInputs {
        q,
        seqs,
        dims,
        total,
        ..
    } = *inputs;
    let blocks = &inputs.blocks[task.seq * dims.num_kv_heads + task.g];
    let group = dims.num_heads / dims.num_kv_heads;
    let (g, i0, i1) = (task.g, task.i0, task.i1);
    let seq = &seqs[task.seq];
    let n = i1 - i0;
    let rows = group * n;
    // Rows are (head in group, position); queries pre-scaled.
    sc.q.clear();
    for hh in 0..group {
        let base = ((g * group + hh) * total + seq.start + i0) * D;
        sc.q.extend(q[base..base + n * D].iter().map(|x| x * dims.scale));
    }
    // Zero rows up to a multiple of four, for kernels that take rows four at a time.
    sc.q.resize(rows.next_multiple_of(4) * D, 0.0);
    sc.o.clear();
    sc.o.resize(rows * D, 0.0);
    sc.m.clear();
    sc.m.resize(rows, f32::NEG_INFINITY);
    sc.l.clear();
    sc.l.resize(rows, 0.0);
    let prefix_len: usize = seq.prefix.iter().map(|p| p.len).sum();
    // Keys up to the last one this tile's queries can see, block by block.
    let upto = prefix_len + i1;
    let view = |b: usize| BlockView {
        first: b * K_BLOCK,
        keys: (upto - b * K_BLOCK).min(K_BLOCK),
        prefix_len,
        i0,
        n,
    };
    match blocks {
        Some(blocks) => {
            for b in 0..upto.div_ceil(K_BLOCK) {
                let view = view(b);
                let kt = &blocks.kt[b * D * K_BLOCK..][..D * K_BLOCK];
                let vb = &blocks.v[b * K_BLOCK * D..][..view.keys * D];
                // SAFETY: `R` is chosen by the caller for this CPU; `sc.q` is padded.
                unsafe { R::block::<D>(sc, kt, vb, view) };
            }
        }
        None => {
            // One tile reads every key of its suffix (upto is all of them).
            let mut gathered = std::mem::take(&mut sc.block);
            gathered.kt.resize(D * K_BLOCK, 0.0);
            let mut keys = KeyCursor::new::<D>(seq, inputs.k, inputs.v, g, total);
            for b in 0..upto.div_ceil(K_BLOCK) {
                let view = view(b);
                let vb = keys.next_block::<D>(view.keys, &mut gathered.kt, &mut gathered.v);
                // SAFETY: as above; `kt` holds `D × K_BLOCK` values, `vb` the
                // block's rows.
                unsafe { R::block::<D>(sc, &gathered.kt, vb, view) };
            }
            sc.block = gathered;
        }
    }
    for (hh, block) in task.outs.iter_mut().enumerate() {
        for ii in 0..n {
            let r = hh * n + ii;
            let inv = 1.0 / sc.l[r];
            for (dst, &x) in block[ii * D..(ii + 1) * D]
                .iter_mut()
                .zip(&sc.o[r * D..(r + 1) * D])
            {
                *dst = x * inv;
            }
        }
    }
}

/// The keys and values a suffix's queries read from KV head `g`, oldest first: its
/// prefix segments, then its own positions.
fn key_sources<'a, const D: usize>(
    seq: &'a SeqSlices<'a>,
    k: &'a [f32],
    v: &'a [f32],
    g: usize,
    total: usize,
) -> impl Iterator<Item = (&'a [f32], &'a [f32])> + 'a {
    let own = (g * total + seq.start) * D..(g * total + seq.start + seq.len) * D;
    seq.prefix
        .iter()
        .map(move |p| {
            let r = g * p.stride * D..g * p.stride * D + p.len * D;
            (&p.k[r.clone()], &p.v[r])
        })
        .chain(std::iter::once((&k[own.clone()], &v[own])))
}

/// A suffix's keys and values from one KV head in blocks of [`K_BLOCK`] positions
/// counted from its first prefix position (a block may take keys from two segments):
/// made once per call, as each of the suffix's query tiles reads them all.
struct KeyBlocks {
    /// Per block, its keys transposed: `D × K_BLOCK`, zero past the last key.
    kt: Vec<f32>,
    /// Per block, its values: `K_BLOCK × D`, zero past the last key.
    v: Vec<f32>,
}

impl KeyBlocks {
    fn new<const D: usize>(
        seq: &SeqSlices<'_>,
        k: &[f32],
        v: &[f32],
        g: usize,
        total: usize,
    ) -> Self {
        let keys = seq.prefix.iter().map(|p| p.len).sum::<usize>() + seq.len;
        let blocks = keys.div_ceil(K_BLOCK);
        let mut kt = vec![0f32; blocks * D * K_BLOCK];
        let mut vs = vec![0f32; blocks * K_BLOCK * D];
        let mut pos = 0;
        for (ks, seg_v) in key_sources::<D>(seq, k, v, g, total) {
            for (kj, vj) in ks.chunks_exact(D).zip(seg_v.chunks_exact(D)) {
                let (b, j) = (pos / K_BLOCK, pos % K_BLOCK);
                let block = &mut kt[b * D * K_BLOCK..][..D * K_BLOCK];
                for (c, &x) in kj.iter().enumerate() {
                    block[c * K_BLOCK + j] = x;
                }
                vs[pos * D..(pos + 1) * D].copy_from_slice(vj);
                pos += 1;
            }
        }
        Self { kt, v: vs }
    }
}

/// A suffix's keys and values from one KV head (as [`key_sources`] gives them),
/// read a key block at a time into the layout of [`KeyBlocks`].
struct KeyCursor<'a> {
    sources: Vec<(&'a [f32], &'a [f32])>,
    /// The source holding the next key, and the key's row in it.
    source: usize,
    row: usize,
}

impl<'a> KeyCursor<'a> {
    fn new<const D: usize>(
        seq: &'a SeqSlices<'a>,
        k: &'a [f32],
        v: &'a [f32],
        g: usize,
        total: usize,
    ) -> Self {
        Self {
            sources: key_sources::<D>(seq, k, v, g, total).collect(),
            source: 0,
            row: 0,
        }
    }

    /// The next `nb` keys transposed into `kt` (`D × K_BLOCK`, zero past them, the
    /// values [`KeyBlocks`] would hold), and their values: read in place when one
    /// segment holds them all, else copied into `copy`. The caller asks for no
    /// more keys than the sources hold.
    fn next_block<'s, const D: usize>(
        &mut self,
        nb: usize,
        kt: &mut [f32],
        copy: &'s mut Vec<f32>,
    ) -> &'s [f32]
    where
        'a: 's,
    {
        // Skip exhausted (and empty) sources first, so the one-segment check sees
        // where the block starts.
        while self.row * D >= self.sources[self.source].0.len() {
            self.source += 1;
            self.row = 0;
        }
        let (ks, vs) = self.sources[self.source];
        let in_place = (self.row + nb) * D <= ks.len();
        let first_row = self.row;
        if !in_place {
            copy.clear();
        }
        // The block's keys, a row each; rows past `nb` read zeros.
        let zeros = [0f32; D];
        let mut rows: [&[f32]; K_BLOCK] = [&zeros; K_BLOCK];
        for row in rows.iter_mut().take(nb) {
            while self.row * D >= self.sources[self.source].0.len() {
                self.source += 1;
                self.row = 0;
            }
            let (ks, vs) = self.sources[self.source];
            *row = &ks[self.row * D..][..D];
            if !in_place {
                copy.extend_from_slice(&vs[self.row * D..][..D]);
            }
            self.row += 1;
        }
        transpose_block::<D>(&rows, kt);
        if in_place {
            &vs[first_row * D..(first_row + nb) * D]
        } else {
            copy
        }
    }
}

/// `kt[c · K_BLOCK + j] = rows[j][c]`: a key block transposed (each row `D` long).
/// Moves values only, so every build gives the same bits.
fn transpose_block<const D: usize>(rows: &[&[f32]; K_BLOCK], kt: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if D.is_multiple_of(16) && std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F is present; rows hold D values each and kt D × K_BLOCK.
        unsafe { avx512::transpose_block::<D>(rows, kt) };
        return;
    }
    for (j, row) in rows.iter().enumerate() {
        for (c, &x) in row[..D].iter().enumerate() {
            kt[c * K_BLOCK + j] = x;
        }
    }
}

/// The online-softmax step of one query row over one key block: `s` holds the
/// block's scores, of which the first `nvalid` are visible; it becomes their
/// weights `exp(s - m_new)` (zero past `nvalid`), the row's running max `m` and sum
/// `l` take the block in, and the factor that rescales the row's earlier output
/// is returned.
#[inline(always)]
fn online_softmax(s: &mut [f32; K_BLOCK], nvalid: usize, m: &mut f32, l: &mut f32) -> f32 {
    for x in &mut s[nvalid..] {
        *x = f32::NEG_INFINITY;
    }
    let m_old = *m;
    let m_new = m_old.max(block_max(s));
    let alpha = if m_old == f32::NEG_INFINITY {
        0.0
    } else {
        exp_nonpositive(m_old - m_new)
    };
    let mut acc = [0f32; 8];
    for c in s.chunks_exact_mut(8) {
        for i in 0..8 {
            let p = exp_nonpositive(c[i] - m_new);
            c[i] = p;
            acc[i] += p;
        }
    }
    for x in &mut s[nvalid..] {
        *x = 0.0;
    }
    // Masked lanes contributed exp(-87) ≈ 1.6e-38 each; negligible, but
    // recompute the sum over the valid lanes only when any were masked.
    let sum = if nvalid == K_BLOCK {
        acc.iter().sum::<f32>()
    } else {
        s[..nvalid].iter().sum::<f32>()
    };
    *m = m_new;
    *l = *l * alpha + sum;
    alpha
}

/// Max of a score block, in eight lanes so it vectorises.
#[inline(always)]
fn block_max(s: &[f32; K_BLOCK]) -> f32 {
    let mut m = [f32::NEG_INFINITY; 8];
    for c in s.chunks_exact(8) {
        for i in 0..8 {
            if c[i] > m[i] {
                m[i] = c[i];
            }
        }
    }
    m.iter().copied().fold(f32::NEG_INFINITY, f32::max)
}

/// Shared-prefix attention on tensors. `q`: `(num_heads, total, head_dim)`, `k`/`v`:
/// `(num_kv_heads, total, head_dim)`; returns `(num_heads, total, head_dim)` in `q`'s
/// dtype. f32 CPU inputs run the rayon kernel, bf16 and f16 ones too (widened to
/// f32); GPU inputs run the CUDA or grouped kernels; anything else runs
/// [`prefix_suffix_attention_reference`].
pub fn prefix_suffix_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqs: &[SeqKv],
    scale: f32,
) -> Result<Tensor> {
    let (num_heads, total, head_dim) = q.dims3()?;
    let (num_kv_heads, k_total, k_dim) = k.dims3()?;
    if k_total != total || k_dim != head_dim || v.dims() != k.dims() {
        return Err(bad(format!(
            "q {:?}, k {:?}, v {:?} disagree",
            q.shape(),
            k.shape(),
            v.shape()
        )));
    }
    // Whether `is` holds for every tensor of the call, prefixes included.
    let all = |is: &dyn Fn(&Tensor) -> bool| {
        [q, k, v].iter().all(|t| is(t))
            && seqs
                .iter()
                .flat_map(|s| &s.prefix)
                .all(|(pk, pv)| is(pk) && is(pv))
    };
    if !all(&crate::is_cpu_f32) {
        // GPU tensors: suffixes sharing a prefix batched into large candle ops. CPU
        // tensors of other dtypes keep the per-sequence reference.
        #[cfg(feature = "cuda")]
        if q.device().is_cuda() {
            return crate::cuda::prefix_suffix_attention(q, k, v, seqs, scale);
        }
        if !q.device().is_cpu() {
            return crate::grouped::prefix_suffix_attention_grouped(q, k, v, seqs, scale);
        }
        if all(&|t| matches!(t.dtype(), DType::BF16 | DType::F16)) {
            // bf16 and f16 widen to f32 exactly: the f32 kernel, then back.
            let wide = |t: &Tensor| t.to_dtype(DType::F32);
            let seqs = seqs
                .iter()
                .map(|s| {
                    Ok(SeqKv {
                        prefix: s
                            .prefix
                            .iter()
                            .map(|(pk, pv)| Ok((wide(pk)?, wide(pv)?)))
                            .collect::<candle_core::Result<_>>()?,
                        start: s.start,
                        len: s.len,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let out = prefix_suffix_attention(&wide(q)?, &wide(k)?, &wide(v)?, &seqs, scale)?;
            return Ok(out.to_dtype(q.dtype())?);
        }
        return prefix_suffix_attention_reference(q, k, v, seqs, scale);
    }
    let (q, k, v) = (q.contiguous()?, k.contiguous()?, v.contiguous()?);
    // Segments are read where they lie, views of a longer buffer included; only
    // another layout is copied.
    let prefix: Vec<Vec<(Tensor, Tensor)>> = seqs
        .iter()
        .map(|s| {
            s.prefix
                .iter()
                .map(|(a, b)| Ok((head_strided(a)?, head_strided(b)?)))
                .collect::<Result<_>>()
        })
        .collect::<Result<_>>()?;
    let guards: Vec<Vec<(CpuF32<'_>, CpuF32<'_>, usize, usize)>> = prefix
        .iter()
        .map(|p| {
            p.iter()
                .map(|(a, b)| {
                    let (ga, stride) = CpuF32::heads(KERNEL, a)?;
                    let (gb, v_stride) = CpuF32::heads(KERNEL, b)?;
                    if v_stride != stride || a.dims() != b.dims() {
                        return Err(bad(format!(
                            "a prefix segment's keys {:?} and values {:?} are laid out apart",
                            a.layout(),
                            b.layout()
                        )));
                    }
                    Ok((ga, gb, a.dim(1)?, stride))
                })
                .collect()
        })
        .collect::<Result<_>>()?;
    let mut slices = Vec::with_capacity(seqs.len());
    for (s, g) in seqs.iter().zip(&guards) {
        let prefix = g
            .iter()
            .map(|(a, b, len, stride)| {
                Ok(KvSlice {
                    k: a.slice()?,
                    v: b.slice()?,
                    len: *len,
                    stride: *stride,
                })
            })
            .collect::<Result<_>>()?;
        slices.push(SeqSlices {
            prefix,
            start: s.start,
            len: s.len,
        });
    }
    let (gq, gk, gv) = (
        CpuF32::new(KERNEL, &q)?,
        CpuF32::new(KERNEL, &k)?,
        CpuF32::new(KERNEL, &v)?,
    );
    let mut out = vec![0f32; num_heads * total * head_dim];
    let dims = AttnDims {
        num_heads,
        num_kv_heads,
        head_dim,
        scale,
    };
    prefix_suffix_attention_slices(
        gq.slice()?,
        gk.slice()?,
        gv.slice()?,
        &slices,
        dims,
        &mut out,
    )?;
    Ok(Tensor::from_vec(
        out,
        (num_heads, total, head_dim),
        q.device(),
    )?)
}

/// `t` itself when [`CpuF32::heads`] can read it in place (contiguous, or the
/// first positions of a longer `(heads, capacity, d)` buffer), else a contiguous
/// copy.
fn head_strided(t: &Tensor) -> Result<Tensor> {
    if CpuF32::head_stride(t).is_some() {
        Ok(t.clone())
    } else {
        Ok(t.contiguous()?)
    }
}

/// The same attention written with plain candle ops (concatenate the prefix, repeat KV
/// heads, matmul, additive causal mask, softmax, matmul), one suffix at a time. Works
/// on any device and dtype (computing in f32); the oracle for the fast kernels.
pub fn prefix_suffix_attention_reference(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqs: &[SeqKv],
    scale: f32,
) -> Result<Tensor> {
    let (num_heads, total, _) = q.dims3()?;
    let num_kv_heads = k.dim(0)?;
    if num_kv_heads == 0 || !num_heads.is_multiple_of(num_kv_heads) {
        return Err(bad(format!(
            "{num_heads} query heads cannot share {num_kv_heads} KV heads"
        )));
    }
    check_seqs(total, seqs.iter().map(|s| (s.start, s.len)))?;
    let group = num_heads / num_kv_heads;
    let dtype = q.dtype();
    let f32 = |t: &Tensor| t.to_dtype(DType::F32);
    let mut outs = Vec::with_capacity(seqs.len());
    for s in seqs.iter().filter(|s| s.len > 0) {
        let qs = f32(&q.narrow(1, s.start, s.len)?)?;
        let mut ks: Vec<Tensor> = s
            .prefix
            .iter()
            .map(|(pk, _)| f32(pk))
            .collect::<candle_core::Result<_>>()?;
        let mut vs: Vec<Tensor> = s
            .prefix
            .iter()
            .map(|(_, pv)| f32(pv))
            .collect::<candle_core::Result<_>>()?;
        ks.push(f32(&k.narrow(1, s.start, s.len)?)?);
        vs.push(f32(&v.narrow(1, s.start, s.len)?)?);
        let (kall, vall) = (Tensor::cat(&ks, 1)?, Tensor::cat(&vs, 1)?);
        let kv_len = kall.dim(1)?;
        let prefix_len = kv_len - s.len;
        let repeat = |t: Tensor| -> candle_core::Result<Tensor> {
            let (h, l, d) = t.dims3()?;
            t.unsqueeze(1)?
                .expand((h, group, l, d))?
                .reshape((h * group, l, d))
        };
        let (kall, vall) = (repeat(kall)?, repeat(vall)?);
        let scores = (qs.matmul(&kall.t()?)? * scale as f64)?;
        let mask: Vec<f32> = (0..s.len)
            .flat_map(|i| {
                (0..kv_len).map(move |j| {
                    if j <= prefix_len + i {
                        0.0
                    } else {
                        f32::NEG_INFINITY
                    }
                })
            })
            .collect();
        let mask = Tensor::from_vec(mask, (s.len, kv_len), q.device())?;
        let probs = softmax_last_dim(&scores.broadcast_add(&mask)?)?;
        outs.push(probs.matmul(&vall)?);
    }
    if outs.is_empty() {
        return Ok(q.zeros_like()?);
    }
    Ok(Tensor::cat(&outs, 1)?.to_dtype(dtype)?)
}

/// Softmax over the last dimension, in plain ops (this crate does not depend on candle-nn).
pub(crate) fn softmax_last_dim(x: &Tensor) -> candle_core::Result<Tensor> {
    let max = x.max_keepdim(candle_core::D::Minus1)?;
    let e = x.broadcast_sub(&max)?.exp()?;
    e.broadcast_div(&e.sum_keepdim(candle_core::D::Minus1)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{max_diff, randn};

    #[test]
    fn matches_plain_attention_with_gqa_mixed_prefixes_and_lengths() {
        let (h, kvh, d) = (8, 2, 32);
        let doc_a = (randn((kvh, 7, d), 1), randn((kvh, 7, d), 2));
        let doc_b = (randn((kvh, 13, d), 3), randn((kvh, 13, d), 4));
        let question = (randn((kvh, 5, d), 5), randn((kvh, 5, d), 6));
        let lens = [3usize, 1, 6, 4];
        let total: usize = lens.iter().sum();
        let (q, k, v) = (
            randn((h, total, d), 7),
            randn((kvh, total, d), 8),
            randn((kvh, total, d), 9),
        );
        let prefixes = [
            vec![doc_a.clone()],
            vec![doc_b.clone()],
            vec![doc_a.clone(), question.clone()],
            vec![],
        ];
        let seqs = SeqKv::packed(lens.into_iter().zip(prefixes));
        let scale = 1.0 / (d as f32).sqrt();
        let fast = prefix_suffix_attention(&q, &k, &v, &seqs, scale).unwrap();
        let slow = prefix_suffix_attention_reference(&q, &k, &v, &seqs, scale).unwrap();
        assert_eq!(fast.dims(), &[h, total, d]);
        let diff = max_diff(&fast, &slow);
        assert!(diff < 1e-5, "max diff {diff}");
    }

    #[test]
    fn bf16_inputs_run_the_kernel_widened_and_come_back_in_bf16() {
        let (h, kvh, d) = (4, 2, 64);
        let bf = |t: Tensor| t.to_dtype(DType::BF16).unwrap();
        let doc = (bf(randn((kvh, 70, d), 1)), bf(randn((kvh, 70, d), 2)));
        let lens = [40usize, 3];
        let total: usize = lens.iter().sum();
        let (q, k, v) = (
            bf(randn((h, total, d), 3)),
            bf(randn((kvh, total, d), 4)),
            bf(randn((kvh, total, d), 5)),
        );
        let seqs = SeqKv::packed(lens.into_iter().zip([vec![doc.clone()], vec![doc]]));
        let scale = 1.0 / (d as f32).sqrt();
        let fast = prefix_suffix_attention(&q, &k, &v, &seqs, scale).unwrap();
        let slow = prefix_suffix_attention_reference(&q, &k, &v, &seqs, scale).unwrap();
        assert_eq!(
            (fast.dtype(), fast.dims()),
            (DType::BF16, &[h, total, d][..])
        );
        // Both round their f32 result to bf16 once: within one bf16 step.
        let diff = max_diff(&fast, &slow);
        assert!(diff < 2e-2, "max diff {diff}");
    }

    #[test]
    fn tiled_kernel_matches_plain_attention_across_blocks_and_tiles() {
        // Lengths straddle Q_TILE / K_BLOCK boundaries; head widths hit the tiled
        // kernel (16, 64) and the row-at-a-time one (8).
        for (h, kvh, d) in [(4, 2, 16), (6, 3, 64), (4, 1, 8)] {
            let seg_a = (randn((kvh, 130, d), 21), randn((kvh, 130, d), 22));
            let seg_b = (randn((kvh, 63, d), 23), randn((kvh, 63, d), 24));
            let lens = [97usize, 1, 64, 33, 0, 5];
            let total: usize = lens.iter().sum();
            let (q, k, v) = (
                (randn((h, total, d), 25) * 3.0).unwrap(),
                randn((kvh, total, d), 26),
                randn((kvh, total, d), 27),
            );
            let prefixes = [
                vec![seg_a.clone(), seg_b.clone()],
                vec![seg_a.clone()],
                vec![],
                vec![seg_b.clone()],
                vec![seg_a.clone()],
                vec![seg_b.clone(), seg_a.clone()],
            ];
            let seqs = SeqKv::packed(lens.into_iter().zip(prefixes));
            let scale = 1.0 / (d as f32).sqrt();
            let fast = prefix_suffix_attention(&q, &k, &v, &seqs, scale).unwrap();
            let slow = prefix_suffix_attention_reference(&q, &k, &v, &seqs, scale).unwrap();
            let diff = max_diff(&fast, &slow);
            assert!(diff < 1e-5, "d={d}: max diff {diff}");
        }
    }

    #[test]
    fn every_block_path_this_cpu_has_matches_plain_attention() {
        let (h, kvh, d) = (4, 2, 64);
        let seg = (randn((kvh, 130, d), 31), randn((kvh, 130, d), 32));
        let lens = [97usize, 33, 1];
        let total: usize = lens.iter().sum();
        let (q, k, v) = (
            (randn((h, total, d), 33) * 3.0).unwrap(),
            randn((kvh, total, d), 34),
            randn((kvh, total, d), 35),
        );
        let prefixes = [vec![seg.clone()], vec![], vec![seg.clone()]];
        let seqs = SeqKv::packed(lens.into_iter().zip(prefixes));
        let scale = 1.0 / (d as f32).sqrt();
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let want = flat(&prefix_suffix_attention_reference(&q, &k, &v, &seqs, scale).unwrap());
        let (seg_k, seg_v) = (flat(&seg.0), flat(&seg.1));
        let slices: Vec<SeqSlices<'_>> = seqs
            .iter()
            .map(|s| SeqSlices {
                prefix: s
                    .prefix
                    .iter()
                    .map(|_| KvSlice {
                        k: &seg_k,
                        v: &seg_v,
                        len: 130,
                        stride: 130,
                    })
                    .collect(),
                start: s.start,
                len: s.len,
            })
            .collect();
        let dims = AttnDims {
            num_heads: h,
            num_kv_heads: kvh,
            head_dim: d,
            scale,
        };
        let (qf, kf, vf) = (flat(&q), flat(&k), flat(&v));
        let paths = BlockPath::available();
        assert_eq!(paths.last(), Some(&BlockPath::Plain));
        for path in paths {
            let mut out = vec![0f32; want.len()];
            tiled::<64>(&qf, &kf, &vf, &slices, dims, &mut out, path);
            let diff = out
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(diff < 1e-5, "{path:?}: max diff {diff}");
        }
    }

    #[test]
    fn split_prefix_equals_one_segment() {
        let (h, kvh, d) = (4, 4, 16);
        let (pk, pv) = (randn((kvh, 9, d), 11), randn((kvh, 9, d), 12));
        let (q, k, v) = (
            randn((h, 2, d), 13),
            randn((kvh, 2, d), 14),
            randn((kvh, 2, d), 15),
        );
        let whole = [SeqKv {
            prefix: vec![(pk.clone(), pv.clone())],
            start: 0,
            len: 2,
        }];
        let split = [SeqKv {
            prefix: vec![
                (pk.narrow(1, 0, 4).unwrap(), pv.narrow(1, 0, 4).unwrap()),
                (pk.narrow(1, 4, 5).unwrap(), pv.narrow(1, 4, 5).unwrap()),
            ],
            start: 0,
            len: 2,
        }];
        let a = prefix_suffix_attention(&q, &k, &v, &whole, 0.25).unwrap();
        let b = prefix_suffix_attention(&q, &k, &v, &split, 0.25).unwrap();
        assert_eq!(max_diff(&a, &b), 0.0);
    }

    #[test]
    fn a_cached_prefix_gives_the_bits_of_the_whole_prompt() {
        // The whole prompt at once, against its first 70 positions cached as two
        // segments (40 + 30, neither a whole number of key blocks) and the rest as the
        // suffix: the suffix rows come out bit for bit the same. (A quantized model
        // rounds its activations, so any difference here could flip an answer
        // between `--prefix-cache on` and `off`.)
        let (h, kvh, d) = (4, 2, 64);
        let (p, n) = (70, 45);
        let (q, k, v) = (
            (randn((h, p + n, d), 41) * 3.0).unwrap(),
            randn((kvh, p + n, d), 42),
            randn((kvh, p + n, d), 43),
        );
        let part =
            |t: &Tensor, at: usize, len: usize| t.narrow(1, at, len).unwrap().contiguous().unwrap();
        let whole = [SeqKv {
            prefix: vec![],
            start: 0,
            len: p + n,
        }];
        let cached = [SeqKv {
            prefix: vec![
                (part(&k, 0, 40), part(&v, 0, 40)),
                (part(&k, 40, 30), part(&v, 40, 30)),
            ],
            start: 0,
            len: n,
        }];
        let a = prefix_suffix_attention(&q, &k, &v, &whole, 0.125).unwrap();
        let b = prefix_suffix_attention(
            &part(&q, p, n),
            &part(&k, p, n),
            &part(&v, p, n),
            &cached,
            0.125,
        )
        .unwrap();
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(flat(&part(&a, p, n)), flat(&b));
    }

    #[test]
    fn key_blocks_transpose_exactly() {
        let values: Vec<f32> = (0..K_BLOCK * 128).map(|i| i as f32 * 0.5 - 7.0).collect();
        let zeros = [0f32; 128];
        for nb in [64, 37, 1] {
            let mut rows: [&[f32]; K_BLOCK] = [&zeros; K_BLOCK];
            for (j, row) in rows.iter_mut().enumerate().take(nb) {
                *row = &values[j * 128..(j + 1) * 128];
            }
            let mut kt = vec![f32::NAN; 128 * K_BLOCK];
            transpose_block::<128>(&rows, &mut kt);
            for c in 0..128 {
                for j in 0..K_BLOCK {
                    let want = if j < nb { values[j * 128 + c] } else { 0.0 };
                    assert_eq!(kt[c * K_BLOCK + j], want, "nb {nb}, key {j}, column {c}");
                }
            }
        }
    }

    #[test]
    fn short_suffixes_give_the_bits_of_the_whole_prompt() {
        // Suffixes of one query tile gather their key blocks as they go (decode
        // steps: one position each); they must give the bits that the rows get when
        // the whole prompt runs at once through the precomputed blocks. Prefixes
        // cut anywhere, in several segments (an empty one too), and several
        // suffixes over one shared prefix in one call.
        let (h, kvh, d) = (4, 2, 128);
        let total = 160;
        let (q, k, v) = (
            (randn((h, total, d), 51) * 3.0).unwrap(),
            randn((kvh, total, d), 52),
            randn((kvh, total, d), 53),
        );
        let part =
            |t: &Tensor, at: usize, len: usize| t.narrow(1, at, len).unwrap().contiguous().unwrap();
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let whole = [SeqKv {
            prefix: vec![],
            start: 0,
            len: total,
        }];
        let a = prefix_suffix_attention(&q, &k, &v, &whole, 0.09).unwrap();
        for (cuts, n) in [
            (vec![64], 1),
            (vec![70], 1),
            (vec![40, 40, 40], 1),
            (vec![3, 0, 61, 1], 5),
            (vec![127], 32),
            (vec![100, 28], 32),
        ] {
            let p: usize = cuts.iter().sum();
            let mut at = 0;
            let prefix: Vec<(Tensor, Tensor)> = cuts
                .iter()
                .map(|&len| {
                    let seg = (part(&k, at, len), part(&v, at, len));
                    at += len;
                    seg
                })
                .collect();
            // Three suffixes over the same prefix: positions p.., each the same
            // rows, so each must equal the whole prompt's rows.
            let seqs = SeqKv::packed((0..3).map(|_| (n, prefix.clone())));
            let rep = |t: &Tensor| Tensor::cat(&[&part(t, p, n); 3], 1).unwrap();
            let b = prefix_suffix_attention(&rep(&q), &rep(&k), &rep(&v), &seqs, 0.09).unwrap();
            for s in 0..3 {
                assert_eq!(
                    flat(&part(&a, p, n)),
                    flat(&part(&b, s * n, n)),
                    "prefix {cuts:?}, suffix {n}, copy {s}"
                );
            }
        }
    }

    #[test]
    fn rejects_inconsistent_inputs() {
        let (q, k, v) = (
            randn((4, 3, 8), 1),
            randn((2, 3, 8), 2),
            randn((2, 3, 8), 3),
        );
        let short = [SeqKv {
            prefix: vec![],
            start: 0,
            len: 2,
        }];
        let err = prefix_suffix_attention(&q, &k, &v, &short, 1.0).unwrap_err();
        assert!(err.to_string().contains("sum to 2"), "{err}");
        let bad_heads = randn((3, 3, 8), 4);
        let one = [SeqKv {
            prefix: vec![],
            start: 0,
            len: 3,
        }];
        assert!(prefix_suffix_attention(&q, &bad_heads, &bad_heads, &one, 1.0).is_err());
    }
}
