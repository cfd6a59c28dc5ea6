//! Launch shapes of the CUDA kernels in `cuda/aisql_kernels.cu`: plain arithmetic,
//! always built and tested, so the CPU build checks the shapes every supported
//! model gets.
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
