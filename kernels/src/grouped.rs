//! Shared-prefix attention in a few large candle ops: consecutive suffixes that
//! continue the *same* prefix tensors with the same length are batched, so a prefix
//! is multiplied once per group (one matmul for all its suffixes and all the query
//! heads of a KV head) instead of once per suffix. Device-agnostic; this is the path
//! GPU tensors take (candle's CUDA matmul/softmax ops, cuBLAS underneath). Computes
//! in f32 like [`crate::prefix_suffix_attention_reference`], which it matches.

use candle_core::{D, DType, Tensor};

use crate::attention::SeqKv;
use crate::{KernelError, Result};

/// Same contract as [`crate::prefix_suffix_attention`]. Sequences must be packed in
/// order (`start` ascending, back to back, covering `total`); otherwise this falls
/// back to the per-sequence reference.
pub fn prefix_suffix_attention_grouped(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqs: &[SeqKv],
    scale: f32,
) -> Result<Tensor> {
    let (num_heads, total, d) = q.dims3()?;
    let kvh = k.dim(0)?;
    if kvh == 0 || !num_heads.is_multiple_of(kvh) || !packed_in_order(seqs, total) {
        return crate::prefix_suffix_attention_reference(q, k, v, seqs, scale);
    }
    let group = num_heads / kvh;
    let mut outs = Vec::new();
    for run in prefix_runs(seqs) {
        let first = &seqs[run.start];
        if first.len > 0 {
            outs.push(group_attention(
                q,
                k,
                v,
                first,
                run.len(),
                group,
                kvh,
                d,
                scale,
            )?);
        }
    }
    if outs.is_empty() {
        return Ok(q.zeros_like()?);
    }
    Ok(Tensor::cat(&outs, 1)?.to_dtype(q.dtype())?)
}

/// Whether `seqs` are packed back to back in order from row 0 and cover `total` rows.
pub(crate) fn packed_in_order(seqs: &[SeqKv], total: usize) -> bool {
    let mut next = 0;
    seqs.iter().all(|s| {
        let ok = s.start == next;
        next += s.len;
        ok
    }) && next == total
}

/// Runs of consecutive sequences with the same length over the same prefix tensors:
/// each run is one batched computation in [`group_attention`].
pub(crate) fn prefix_runs(seqs: &[SeqKv]) -> Vec<std::ops::Range<usize>> {
    let same_prefix = |a: &SeqKv, b: &SeqKv| {
        a.len == b.len
            && a.prefix.len() == b.prefix.len()
            && a.prefix
                .iter()
                .zip(&b.prefix)
                .all(|((ak, av), (bk, bv))| ak.id() == bk.id() && av.id() == bv.id())
    };
    let mut runs = Vec::new();
    let mut i = 0;
    while i < seqs.len() {
        let mut n = 1;
        while i + n < seqs.len() && same_prefix(&seqs[i], &seqs[i + n]) {
            n += 1;
        }
        runs.push(i..i + n);
        i += n;
    }
    runs
}

/// `n` suffixes of `first.len` tokens each, packed from `first.start`, all over
/// `first.prefix`. Returns `(num_heads, n * len, d)` in f32.
#[allow(clippy::too_many_arguments)]
pub(crate) fn group_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    first: &SeqKv,
    n: usize,
    group: usize,
    kvh: usize,
    d: usize,
    scale: f32,
) -> Result<Tensor> {
    let s = first.len;
    let rows = n * s;
    let f32 = |t: &Tensor| t.to_dtype(DType::F32);
    // Queries as (kvh, n, group, s, d): every query row that reads one KV head and one
    // suffix is contiguous, so both score matmuls are plain batched matmuls.
    let qq = f32(&q.narrow(1, first.start, rows)?)?
        .reshape((kvh, group, n, s, d))?
        .transpose(1, 2)?
        .contiguous()?;
    let ks = f32(&k.narrow(1, first.start, rows)?)?.reshape((kvh * n, s, d))?;
    let vs = f32(&v.narrow(1, first.start, rows)?)?.reshape((kvh * n, s, d))?;
    // Causal mask of the suffix part, built on the device: key j is visible to suffix
    // token i when j <= i.
    let idx = Tensor::arange(0u32, s as u32, q.device())?;
    let visible = idx.unsqueeze(0)?.broadcast_le(&idx.unsqueeze(1)?)?;
    let mask = visible.where_cond(
        &Tensor::zeros((s, s), DType::F32, q.device())?,
        &Tensor::full(f32::NEG_INFINITY, (s, s), q.device())?,
    )?;
    let suffix_scores = qq
        .reshape((kvh * n, group * s, d))?
        .matmul(&ks.t()?)?
        .reshape((kvh * n * group, s, s))?
        .broadcast_add(&mask)?
        .reshape((kvh * n, group * s, s))?;
    let (scores, prefix_v) = if first.prefix.is_empty() {
        (suffix_scores, None)
    } else {
        let pk: Vec<Tensor> = first
            .prefix
            .iter()
            .map(|(a, _)| f32(a))
            .collect::<candle_core::Result<_>>()?;
        let pv: Vec<Tensor> = first
            .prefix
            .iter()
            .map(|(_, b)| f32(b))
            .collect::<candle_core::Result<_>>()?;
        let (pk, pv) = (Tensor::cat(&pk, 1)?, Tensor::cat(&pv, 1)?);
        let p = pk.dim(1)?;
        if pk.dims() != [kvh, p, d] {
            return Err(KernelError::BadInput {
                kernel: "prefix_suffix_attention",
                message: format!("prefix K {:?}, expected ({kvh}, len, {d})", pk.shape()),
            });
        }
        let prefix_scores = qq
            .reshape((kvh, n * group * s, d))?
            .matmul(&pk.t()?)?
            .reshape((kvh * n, group * s, p))?;
        (
            Tensor::cat(&[prefix_scores, suffix_scores], D::Minus1)?,
            Some((pv, p)),
        )
    };
    let probs = crate::attention::softmax_last_dim(&(scores * scale as f64)?)?;
    let total_keys = probs.dim(D::Minus1)?;
    let p = total_keys - s;
    let mut out = probs.narrow(D::Minus1, p, s)?.matmul(&vs)?;
    if let Some((pv, p)) = prefix_v {
        let from_prefix = probs
            .narrow(D::Minus1, 0, p)?
            .contiguous()?
            .reshape((kvh, n * group * s, p))?
            .matmul(&pv)?
            .reshape((kvh * n, group * s, d))?;
        out = (out + from_prefix)?;
    }
    // Back to (num_heads, n * s, d).
    Ok(out
        .reshape((kvh, n, group, s, d))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((kvh * group, rows, d))?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{max_diff, randn};

    /// Groups of suffixes sharing a prefix, a lone suffix, a no-prefix run and a
    /// two-segment prefix, all against the per-sequence reference.
    #[test]
    fn grouped_matches_reference() {
        let (h, kvh, d) = (8, 2, 16);
        let doc_a = (randn((kvh, 7, d), 1), randn((kvh, 7, d), 2));
        let doc_b = (randn((kvh, 11, d), 3), randn((kvh, 11, d), 4));
        let q1 = (randn((kvh, 3, d), 5), randn((kvh, 3, d), 6));
        let plan: Vec<(usize, Vec<(Tensor, Tensor)>)> = vec![
            (4, vec![]),
            (4, vec![]),
            (3, vec![doc_a.clone()]),
            (3, vec![doc_a.clone()]),
            (3, vec![doc_a.clone()]),
            (2, vec![doc_b.clone()]),
            (5, vec![doc_a.clone(), q1.clone()]),
            (5, vec![doc_a.clone(), q1.clone()]),
            (1, vec![doc_b.clone()]),
        ];
        let total: usize = plan.iter().map(|p| p.0).sum();
        let (q, k, v) = (
            randn((h, total, d), 7),
            randn((kvh, total, d), 8),
            randn((kvh, total, d), 9),
        );
        let seqs = SeqKv::packed(plan);
        let a = prefix_suffix_attention_grouped(&q, &k, &v, &seqs, 0.3).unwrap();
        let b = crate::prefix_suffix_attention_reference(&q, &k, &v, &seqs, 0.3).unwrap();
        assert_eq!(a.dims(), b.dims());
        let diff = max_diff(&a, &b);
        assert!(diff < 1e-5, "max diff {diff}");
        // bf16 inputs: output in bf16, close to the f32 result.
        let bf = |t: &Tensor| t.to_dtype(DType::BF16).unwrap();
        let c = prefix_suffix_attention_grouped(&bf(&q), &bf(&k), &bf(&v), &seqs, 0.3).unwrap();
        assert_eq!(c.dtype(), DType::BF16);
        assert!(max_diff(&c.to_dtype(DType::F32).unwrap(), &b) < 5e-2);
    }
}
