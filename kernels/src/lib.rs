//! Compute kernels used by the aisql models: attention of many suffixes over one
//! shared prefix KV, the restricted TRUE/FALSE output head, a decoder layer's
//! elementwise steps spread over the CPU's threads, Q8_0 and bf16 matmuls on AMX,
//! Q8_0 matmuls with AVX-512 VNNI, bf16 matmuls with AVX-512 BF16 and f32 matmuls on
//! AVX-512. CPU versions are always built; CUDA versions live behind the `cuda`
//! feature.
//!
//! Every kernel has a candle-`Tensor` entry point that picks the fast CPU path for
//! contiguous f32 CPU tensors, the hand-written CUDA kernels (`cuda/aisql_kernels.cu`,
//! see [`CudaKernels`]) for CUDA tensors in a `cuda` build, and otherwise plain
//! candle ops (any device, any float dtype).

#![warn(missing_docs)]

pub mod amx_gemm;
pub mod attention;
pub mod bf16_gemm;
pub(crate) mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(test)]
mod cuda_tests;
pub mod elementwise;
mod error;
pub mod f32_gemm;
pub mod grouped;
pub mod head;
mod launch;
pub mod malloc;
mod panel_gemm;
pub mod q8_gemm;
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

/// Whether CUDA tensors use the hand-written kernels of `cuda/aisql_kernels.cu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudaKernels {
    /// The kernels, except that runs of suffixes over one prefix with a lot of work
    /// (a long anchor with hundreds of partners) use cuBLAS matmuls (the default).
    Auto,
    /// The kernels for every sequence.
    All,
    /// Candle ops only ([`grouped`] and an `index_select` head).
    Off,
}

static CUDA_KERNELS: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// The current [`CudaKernels`] mode ([`CudaKernels::Auto`] unless
/// [`set_cuda_kernels`] chose another; the CLI's `--cuda-kernels` does).
pub fn cuda_kernels() -> CudaKernels {
    match CUDA_KERNELS.load(std::sync::atomic::Ordering::Relaxed) {
        1 => CudaKernels::All,
        2 => CudaKernels::Off,
        _ => CudaKernels::Auto,
    }
}

/// Chooses the [`CudaKernels`] mode for the whole process.
pub fn set_cuda_kernels(mode: CudaKernels) {
    let v = match mode {
        CudaKernels::Auto => 0,
        CudaKernels::All => 1,
        CudaKernels::Off => 2,
    };
    CUDA_KERNELS.store(v, std::sync::atomic::Ordering::Relaxed);
}

/// Whether this build has the hand-written CUDA kernels (the `cuda` feature).
pub const CUDA_KERNELS_BUILT: bool = cfg!(feature = "cuda");
