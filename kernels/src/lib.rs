//! Compute kernels used by the aisql models: attention of many suffixes over one
//! shared prefix KV and the restricted TRUE/FALSE output head. CPU versions are
//! always built; CUDA versions live behind the `cuda` feature.
//!
//! Every kernel has a candle-`Tensor` entry point that picks the fast CPU path for
//! contiguous f32 CPU tensors and otherwise falls back to plain candle ops (any
//! device, any float dtype), so a CUDA kernel can later slot into the same
//! dispatch without changing callers.

#![warn(missing_docs)]

pub mod attention;
pub(crate) mod cpu;
#[cfg(all(test, feature = "cuda"))]
mod cuda_tests;
mod error;
pub mod grouped;
pub mod head;
#[cfg(test)]
mod testutil;

pub use attention::{
    AttnDims, KvSlice, SeqKv, SeqSlices, prefix_suffix_attention,
    prefix_suffix_attention_reference, prefix_suffix_attention_slices,
};
pub use error::{KernelError, Result};
pub use grouped::prefix_suffix_attention_grouped;
pub use head::{restricted_head, target_logprobs};

/// Whether the fast CPU kernels can read `t` directly as an f32 slice.
pub(crate) fn is_cpu_f32(t: &candle_core::Tensor) -> bool {
    t.device().is_cpu() && t.dtype() == candle_core::DType::F32
}

#[cfg(feature = "cuda")]
/// The CUDA build runs candle's CUDA ops on GPU tensors (shared-prefix attention via
/// [`grouped::prefix_suffix_attention_grouped`], the restricted head via an 8-row
/// `index_select` + matmul); no hand-written CUDA kernels yet, hence `false`.
pub const CUDA_KERNELS: bool = false;
