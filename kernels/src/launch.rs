//! How the CUDA kernels in `cuda/aisql_kernels.cu` are launched, as plain data:
//! the attention kernel's block shape and the metadata a launch reads. Always
//! built and tested, so the CPU build checks what every GPU launch gets;
//! `cuda/emulation/harness.cpp` rebuilds the same layout to run the kernel source.
#![cfg_attr(not(feature = "cuda"), allow(dead_code))]

// Mirrors of the constants in aisql_kernels.cu.
const PSA_BK: usize = 16;
/// Threads per block of the attention kernel.
pub(crate) const PSA_THREADS: usize = 256;
const PSA_MAX_ACC: usize = 32;
const SHARED_LIMIT: usize = 48 * 1024;

/// Block shape of the attention kernel for one head width and GQA group: padded
/// rows per block (a power of two), query tokens per block, shared-memory bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct PsaShape {
    pub(crate) rows_padded: usize,
    pub(crate) tokens: usize,
    pub(crate) shared_bytes: usize,
}

pub(crate) fn psa_shape(head_dim: usize, group: usize) -> Option<PsaShape> {
    [32usize, 16, 8, 4, 2, 1]
        .into_iter()
        .find_map(|rows_padded| {
            let threads_per_row = PSA_THREADS / rows_padded;
            let stride = head_dim + 1;
            let shared_bytes =
                4 * (rows_padded * stride + 2 * PSA_BK * stride + rows_padded * PSA_BK);
            let fits = group >= 1
                && rows_padded >= group
                && head_dim.is_multiple_of(threads_per_row)
                && head_dim / threads_per_row <= PSA_MAX_ACC
                && shared_bytes <= SHARED_LIMIT;
            fits.then_some(PsaShape {
                rows_padded,
                tokens: rows_padded / group,
                shared_bytes,
            })
        })
}

/// One sequence of a packed batch as the launch plan sees it: where its suffix
/// rows are and its prefix segments, each a key (two sequences with equal keys
/// share that segment's KV) and a length.
#[derive(Debug, Clone)]
pub(crate) struct PsaSeq<K> {
    pub(crate) start: usize,
    pub(crate) len: usize,
    pub(crate) prefix: Vec<(K, usize)>,
}

/// Everything one launch of the attention kernel reads besides q, k and v.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PsaPlan<K> {
    /// The distinct prefix segments, in the order they are concatenated into the
    /// one prefix buffer: a document shared by many suffixes is copied once.
    pub(crate) segments: Vec<K>,
    /// Positions in that buffer.
    pub(crate) prefix_positions: usize,
    /// The kernel's seven index arrays back to back (`tile_seq`, `tile_q0`,
    /// `seq_start`, `seq_len`, `seq_seg_begin`, `seg_off`, `seg_len`) and
    /// a trailing 0, so the device buffer is never empty.
    pub(crate) meta: Vec<u32>,
    /// Where each of the seven arrays sits in `meta`.
    pub(crate) ranges: Vec<std::ops::Range<usize>>,
    /// Thread blocks per KV head: tiles of at most `tokens` query tokens.
    pub(crate) tiles: usize,
}

/// The launch plan for sequences `which` of `seqs` (indices into `seqs`, any order),
/// with tiles of `tokens` query tokens. Sequences are numbered by their place in
/// `which`; `seg_off`/`seg_len` list each sequence's own segments in order, as
/// offsets into the concatenated prefix buffer.
pub(crate) fn psa_plan<K: Copy + Eq + std::hash::Hash>(
    seqs: &[PsaSeq<K>],
    which: &[usize],
    tokens: usize,
) -> PsaPlan<K> {
    let tokens = tokens.max(1);
    let mut offset_of: std::collections::HashMap<K, u32> = std::collections::HashMap::new();
    let mut segments = Vec::new();
    let mut prefix_positions = 0usize;
    let mut arrays: [Vec<u32>; 7] = Default::default();
    let [
        tile_seq,
        tile_q0,
        seq_start,
        seq_len,
        seq_seg_begin,
        seg_off,
        seg_len,
    ] = &mut arrays;
    seq_seg_begin.push(0);
    for (local, &i) in which.iter().enumerate() {
        let s = &seqs[i];
        for &(key, len) in &s.prefix {
            let off = *offset_of.entry(key).or_insert_with(|| {
                segments.push(key);
                prefix_positions += len;
                (prefix_positions - len) as u32
            });
            seg_off.push(off);
            seg_len.push(len as u32);
        }
        seq_seg_begin.push(seg_off.len() as u32);
        seq_start.push(s.start as u32);
        seq_len.push(s.len as u32);
        for q0 in (0..s.len).step_by(tokens) {
            tile_seq.push(local as u32);
            tile_q0.push(q0 as u32);
        }
    }
    let tiles = tile_seq.len();
    let mut meta = Vec::new();
    let mut ranges = Vec::new();
    for part in &arrays {
        ranges.push(meta.len()..meta.len() + part.len());
        meta.extend_from_slice(part);
    }
    meta.push(0);
    PsaPlan {
        segments,
        prefix_positions,
        meta,
        ranges,
        tiles,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's index arguments, in order.
    const PSA_META_ARRAYS: [&str; 7] = [
        "tile_seq",
        "tile_q0",
        "seq_start",
        "seq_len",
        "seq_seg_begin",
        "seg_off",
        "seg_len",
    ];

    /// Qwen3 shapes (head width 128; groups 2, 4 and 5), the tiny model's and wider
    /// heads fit the kernel with 256 threads and no more than 48 KiB of shared memory.
    #[test]
    fn block_shapes_fit_the_kernel() {
        for (d, group) in [(128, 2), (128, 4), (128, 5), (16, 2), (64, 4), (256, 8)] {
            let s = psa_shape(d, group).unwrap_or_else(|| panic!("no shape for {d}/{group}"));
            let tpr = PSA_THREADS / s.rows_padded;
            assert!(s.tokens * group <= s.rows_padded);
            assert!(s.tokens >= 1 && d % tpr == 0 && d / tpr <= PSA_MAX_ACC);
            assert!(s.shared_bytes <= SHARED_LIMIT);
        }
        assert_eq!(psa_shape(128, 4).map(|s| s.tokens), Some(8));
        assert_eq!(
            psa_shape(128, 64),
            None,
            "64 query heads per KV head exceed a block"
        );
    }

    fn array<'a>(plan: &'a PsaPlan<char>, name: &str) -> &'a [u32] {
        let i = PSA_META_ARRAYS.iter().position(|n| *n == name).unwrap();
        &plan.meta[plan.ranges[i].clone()]
    }

    /// Shared documents are concatenated once, every sequence's segments point at
    /// their own positions, and the tiles cover each chosen token exactly once.
    #[test]
    fn plan_dedupes_segments_and_tiles_every_token_once() {
        let seq = |start, len, prefix: &[(char, usize)]| PsaSeq {
            start,
            len,
            prefix: prefix.to_vec(),
        };
        let seqs = vec![
            seq(0, 3, &[('a', 37)]),
            seq(3, 17, &[('a', 37), ('q', 5)]),
            seq(20, 1, &[]),
            seq(21, 9, &[('b', 300)]),
            seq(30, 0, &[('a', 37)]),
            seq(30, 8, &[('b', 300), ('a', 37)]),
        ];
        let which = [5, 1, 0, 2, 4];
        let plan = psa_plan(&seqs, &which, 8);
        assert_eq!(
            plan.segments,
            vec!['b', 'a', 'q'],
            "first use order, each once"
        );
        assert_eq!(plan.prefix_positions, 342);
        let offset = |c| match c {
            'b' => 0,
            'a' => 300,
            'q' => 337,
            _ => unreachable!(),
        };
        let (begin, off, len) = (
            array(&plan, "seq_seg_begin"),
            array(&plan, "seg_off"),
            array(&plan, "seg_len"),
        );
        assert_eq!(begin.len(), which.len() + 1);
        for (local, &i) in which.iter().enumerate() {
            let r = begin[local] as usize..begin[local + 1] as usize;
            let want: Vec<(u32, u32)> = seqs[i]
                .prefix
                .iter()
                .map(|&(c, l)| (offset(c), l as u32))
                .collect();
            let got: Vec<(u32, u32)> = r.map(|j| (off[j], len[j])).collect();
            assert_eq!(got, want, "sequence {i}");
            assert_eq!(array(&plan, "seq_start")[local] as usize, seqs[i].start);
            assert_eq!(array(&plan, "seq_len")[local] as usize, seqs[i].len);
        }
        // Every (sequence, token) of `which` in exactly one tile; sequence 3 in none.
        let mut covered = std::collections::BTreeMap::new();
        for (&t, &q0) in array(&plan, "tile_seq").iter().zip(array(&plan, "tile_q0")) {
            let i = which[t as usize];
            for tok in q0 as usize..(q0 as usize + 8).min(seqs[i].len) {
                *covered.entry((i, tok)).or_insert(0) += 1;
            }
        }
        let want: usize = which.iter().map(|&i| seqs[i].len).sum();
        assert_eq!(covered.len(), want);
        assert!(covered.values().all(|&n| n == 1));
        assert_eq!(plan.tiles, 1 + 3 + 1 + 1);
        assert_eq!(*plan.meta.last().unwrap(), 0);
        assert_eq!(plan.ranges.last().unwrap().end + 1, plan.meta.len());
    }
}
