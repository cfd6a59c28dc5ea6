//! Launches of the hand-written CUDA kernels in `cuda/aisql_kernels.cu` (built to PTX
//! by `build.rs`) as candle custom ops, and the choice between them and the
//! candle-ops composition in [`crate::grouped`]:
//!
//! * attention: runs of suffixes over one prefix whose work is large (a long
//!   anchor with hundreds of partners, BIO-2) go to cuBLAS through
//!   [`crate::grouped`]; every other sequence of the batch goes to one launch of
//!   the `psa_*` kernel, which reads each sequence's prefix segments in place of the
//!   dozen candle launches a run costs;
//! * the restricted head: one launch of `rhead_*`.
//!
//! The first use on a device checks both kernels against the candle-ops composition
//! on random inputs, so a kernel fault is an error naming it, never wrong answers.

use std::collections::HashMap;
use std::sync::Mutex;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits,
};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{
    CpuStorage, CudaDevice, CudaStorage, CustomOp2, CustomOp3, DType, Device, Layout, Shape,
    Storage, StorageRef, Tensor,
};

use crate::attention::SeqKv;
use crate::launch::{PSA_THREADS, PsaSeq, PsaShape, psa_plan, psa_shape};
use crate::{CudaKernels, KernelError, Result, cuda_kernels};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/aisql_kernels.ptx"));
const MODULE: &str = "aisql_kernels";

/// Estimated floating-point work of a run of suffixes over one prefix above which
/// cuBLAS matmuls (tensor cores) beat the kernel's CUDA-core loop despite the
/// dozen launches the run costs. A first estimate (100 µs of launches against
/// ~20 vs ~300 TFLOP/s); `scripts/gpu-check.sh` measures both paths so it can be
/// tuned. `AISQL_PSA_CUBLAS_FLOP` overrides it.
const DEFAULT_CUBLAS_FLOP: f64 = 2e9;

fn cublas_flop_threshold() -> f64 {
    static THRESHOLD: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *THRESHOLD.get_or_init(|| match std::env::var("AISQL_PSA_CUBLAS_FLOP") {
        Err(_) => DEFAULT_CUBLAS_FLOP,
        Ok(v) => v
            .parse::<f64>()
            .ok()
            .filter(|t| *t >= 0.0)
            .unwrap_or_else(|| {
                eprintln!(
                    "warning: AISQL_PSA_CUBLAS_FLOP={v:?} is not a non-negative number; \
                 using {DEFAULT_CUBLAS_FLOP:e}"
                );
                DEFAULT_CUBLAS_FLOP
            }),
    })
}

/// Shared-prefix attention on CUDA tensors (same contract as
/// [`crate::prefix_suffix_attention`]). Falls back to [`crate::grouped`] when the
/// kernels are off or the shape is outside what the kernel supports.
pub(crate) fn prefix_suffix_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqs: &[SeqKv],
    scale: f32,
) -> Result<Tensor> {
    let grouped = crate::grouped::prefix_suffix_attention_grouped;
    let mode = cuda_kernels();
    if mode == CudaKernels::Off {
        return grouped(q, k, v, seqs, scale);
    }
    let (num_heads, total, head_dim) = q.dims3()?;
    let kvh = k.dim(0)?;
    let shape = (kvh > 0 && num_heads.is_multiple_of(kvh))
        .then(|| psa_shape(head_dim, num_heads / kvh))
        .flatten();
    let Some(shape) = shape else {
        return grouped(q, k, v, seqs, scale);
    };
    if !crate::grouped::packed_in_order(seqs, total) || total > i32::MAX as usize {
        return grouped(q, k, v, seqs, scale);
    }
    self_check(q.device())?;
    let group = num_heads / kvh;
    let threshold = match mode {
        CudaKernels::All => f64::INFINITY,
        _ => cublas_flop_threshold(),
    };
    // Each run either goes to cuBLAS (large) or into the one kernel launch.
    let runs = crate::grouped::prefix_runs(seqs);
    let to_cublas: Vec<bool> = runs
        .iter()
        .map(|run| {
            let first = &seqs[run.start];
            let prefix: usize = first
                .prefix
                .iter()
                .map(|(pk, _)| pk.dim(1).unwrap_or(0))
                .sum();
            let rows = (run.len() * first.len * num_heads) as f64;
            4.0 * rows * (prefix + first.len) as f64 * head_dim as f64 > threshold
        })
        .collect();
    let in_kernel: Vec<usize> = runs
        .iter()
        .zip(&to_cublas)
        .filter(|(_, big)| !**big)
        .flat_map(|(run, _)| run.clone())
        .collect();
    let kernel_out = if in_kernel.is_empty() {
        None
    } else {
        Some(launch_psa(q, k, v, seqs, &in_kernel, scale, shape, group)?)
    };
    if !to_cublas.iter().any(|&b| b) {
        // Every run went to the kernel (or the batch has no rows).
        return match kernel_out {
            Some(out) => Ok(out),
            None => Ok(q.zeros_like()?),
        };
    }
    // Assemble in row order: kernel rows for its runs, cuBLAS outputs for the rest.
    let mut parts = Vec::new();
    for (run, &big) in runs.iter().zip(&to_cublas) {
        let first = &seqs[run.start];
        let rows = run.len() * first.len;
        if rows == 0 {
            continue;
        }
        if big {
            let out = crate::grouped::group_attention(
                q,
                k,
                v,
                first,
                run.len(),
                group,
                kvh,
                head_dim,
                scale,
            )?;
            parts.push(out.to_dtype(q.dtype())?);
        } else if let Some(out) = &kernel_out {
            parts.push(out.narrow(1, first.start, rows)?);
        }
    }
    Ok(Tensor::cat(&parts, 1)?)
}

/// One launch of `psa_*` over the sequences `which` of `seqs`; rows of the other
/// sequences are left zero.
#[allow(clippy::too_many_arguments)]
fn launch_psa(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqs: &[SeqKv],
    which: &[usize],
    scale: f32,
    shape: PsaShape,
    group: usize,
) -> Result<Tensor> {
    let dtype = q.dtype();
    let dev = q.device();
    let (q, k, v) = (
        q.contiguous()?,
        k.to_dtype(dtype)?.contiguous()?,
        v.to_dtype(dtype)?.contiguous()?,
    );
    let (kvh, _, head_dim) = k.dims3()?;
    // Each prefix segment is keyed by its tensors: sequences continuing the same
    // document's KV share one copy of it in the concatenated prefix buffer.
    type Key = (candle_core::TensorId, candle_core::TensorId);
    let mut tensors: HashMap<Key, (&Tensor, &Tensor)> = HashMap::new();
    let mut plan_seqs = Vec::with_capacity(seqs.len());
    for s in seqs {
        let mut prefix = Vec::with_capacity(s.prefix.len());
        for (pk, pv) in &s.prefix {
            let len = pk.dim(1)?;
            if pk.dims() != [kvh, len, head_dim] || pv.dims() != pk.dims() {
                return Err(KernelError::BadInput {
                    kernel: "prefix_suffix_attention",
                    message: format!(
                        "prefix K {:?} / V {:?}, expected ({kvh}, len, {head_dim})",
                        pk.shape(),
                        pv.shape()
                    ),
                });
            }
            let key = (pk.id(), pv.id());
            tensors.insert(key, (pk, pv));
            prefix.push((key, len));
        }
        plan_seqs.push(PsaSeq {
            start: s.start,
            len: s.len,
            prefix,
        });
    }
    let plan = psa_plan(&plan_seqs, which, shape.tokens);
    if plan.prefix_positions > i32::MAX as usize {
        return Err(KernelError::BadInput {
            kernel: "prefix_suffix_attention",
            message: format!(
                "{} prefix positions in one call exceed the kernel's i32 range",
                plan.prefix_positions
            ),
        });
    }
    // No prefix positions at all (no segments, or only empty ones): a 1-position
    // placeholder, since empty CUDA tensors are not safe to hand to a launch.
    let (pk, pv) = if plan.prefix_positions == 0 {
        let z = Tensor::zeros((1, 1, head_dim), dtype, dev)?;
        (z.clone(), z)
    } else {
        let k_parts: Vec<Tensor> = plan
            .segments
            .iter()
            .map(|key| tensors[key].0.clone())
            .collect();
        let v_parts: Vec<Tensor> = plan
            .segments
            .iter()
            .map(|key| tensors[key].1.clone())
            .collect();
        (
            Tensor::cat(&k_parts, 1)?.to_dtype(dtype)?.contiguous()?,
            Tensor::cat(&v_parts, 1)?.to_dtype(dtype)?.contiguous()?,
        )
    };
    let meta_len = plan.meta.len();
    let meta = Tensor::from_vec(plan.meta, meta_len, dev)?;
    let op = PsaOp {
        pk,
        pv,
        meta,
        ranges: plan.ranges,
        tiles: plan.tiles,
        kv_heads: kvh,
        ptotal: plan.prefix_positions,
        group,
        shape,
        scale,
    };
    Ok(q.apply_op3_no_bwd(&k, &v, &op)?)
}

struct PsaOp {
    pk: Tensor,
    pv: Tensor,
    meta: Tensor,
    ranges: Vec<std::ops::Range<usize>>,
    tiles: usize,
    kv_heads: usize,
    ptotal: usize,
    group: usize,
    shape: PsaShape,
    scale: f32,
}

/// The contiguous device slice of a tensor argument, or an error naming it.
macro_rules! contiguous_slice {
    ($storage:expr, $layout:expr, $t:ty, $what:literal) => {{
        let (lo, hi) = $layout.contiguous_offsets().ok_or_else(|| {
            candle_core::Error::Msg(format!("{}: {} is not contiguous", "aisql kernel", $what))
        })?;
        $storage.as_cuda_slice::<$t>()?.slice(lo..hi)
    }};
}

fn cuda_storage(t: &Tensor) -> candle_core::Result<(StorageRef<'_>, &Layout)> {
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        Storage::Cuda(_) => Ok((storage, layout)),
        _ => candle_core::bail!("aisql kernel: expected a CUDA tensor"),
    }
}

impl PsaOp {
    #[allow(clippy::too_many_arguments)]
    fn run<T: CudaDType + DeviceRepr + ValidAsZeroBits>(
        &self,
        name: &str,
        q: (&CudaStorage, &Layout),
        k: (&CudaStorage, &Layout),
        v: (&CudaStorage, &Layout),
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let dev: &CudaDevice = q.0.device();
        let shape = q.1.shape().clone();
        let (num_heads, total, head_dim) = shape.dims3()?;
        let qs = contiguous_slice!(q.0, q.1, T, "q");
        let ks = contiguous_slice!(k.0, k.1, T, "k");
        let vs = contiguous_slice!(v.0, v.1, T, "v");
        let (pk_guard, pk_layout) = cuda_storage(&self.pk)?;
        let (pv_guard, pv_layout) = cuda_storage(&self.pv)?;
        let (meta_guard, meta_layout) = cuda_storage(&self.meta)?;
        let (Storage::Cuda(pk), Storage::Cuda(pv), Storage::Cuda(meta)) =
            (&*pk_guard, &*pv_guard, &*meta_guard)
        else {
            unreachable!("checked by cuda_storage")
        };
        let pks = contiguous_slice!(pk, pk_layout, T, "prefix k");
        let pvs = contiguous_slice!(pv, pv_layout, T, "prefix v");
        let meta = contiguous_slice!(meta, meta_layout, u32, "metadata");
        let parts: Vec<_> = self.ranges.iter().map(|r| meta.slice(r.clone())).collect();
        let out = dev.alloc_zeros::<T>(num_heads * total * head_dim)?;
        let func = dev.get_or_load_custom_func(name, MODULE, PTX)?;
        let cfg = LaunchConfig {
            grid_dim: (self.tiles as u32, self.kv_heads as u32, 1),
            block_dim: (PSA_THREADS as u32, 1, 1),
            shared_mem_bytes: self.shape.shared_bytes as u32,
        };
        let mut b = func.builder();
        b.arg(&qs);
        b.arg(&ks);
        b.arg(&vs);
        b.arg(&pks);
        b.arg(&pvs);
        b.arg(&out);
        for p in &parts {
            b.arg(p);
        }
        candle_core::builder_arg!(
            b,
            total as i32,
            self.ptotal as i32,
            head_dim as i32,
            self.group as i32,
            self.shape.tokens as i32,
            self.shape.rows_padded as i32,
            self.scale
        );
        if self.tiles > 0 {
            // SAFETY: argument order and types match `PSA` in aisql_kernels.cu; every
            // index the kernel forms is bounded by the metadata built in launch_psa.
            unsafe { b.launch(cfg) }.w()?;
        }
        Ok((CudaStorage::wrap_cuda_slice(out, dev.clone()), shape))
    }
}

impl CustomOp3 for PsaOp {
    fn name(&self) -> &'static str {
        "aisql-prefix-suffix-attention"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!(
            "aisql-prefix-suffix-attention is CUDA-only; CPU uses kernels::attention"
        )
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
        s3: &CudaStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let args = ((s1, l1), (s2, l2), (s3, l3));
        match s1.dtype() {
            DType::F32 => self.run::<f32>("psa_f32", args.0, args.1, args.2),
            DType::BF16 => self.run::<half::bf16>("psa_bf16", args.0, args.1, args.2),
            DType::F16 => self.run::<half::f16>("psa_f16", args.0, args.1, args.2),
            other => {
                candle_core::bail!("aisql-prefix-suffix-attention: unsupported dtype {other:?}")
            }
        }
    }
}

/// Logits of `rows` of `head_weight` for every row of `hidden`, `(n, rows.len())` in
/// f32, in one launch of `rhead_*` (inputs already checked by [`crate::restricted_head`]).
pub(crate) fn restricted_head(
    hidden: &Tensor,
    head_weight: &Tensor,
    rows: &[u32],
) -> Result<Tensor> {
    self_check(hidden.device())?;
    let dtype = head_weight.dtype();
    let hidden = hidden.to_dtype(dtype)?.contiguous()?;
    let op = HeadOp {
        rows: Tensor::new(rows, hidden.device())?,
        count: rows.len(),
    };
    Ok(hidden.apply_op2_no_bwd(&head_weight.contiguous()?, &op)?)
}

struct HeadOp {
    rows: Tensor,
    count: usize,
}

impl HeadOp {
    fn run<T: CudaDType + DeviceRepr + ValidAsZeroBits>(
        &self,
        name: &str,
        hidden: (&CudaStorage, &Layout),
        head: (&CudaStorage, &Layout),
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let dev: &CudaDevice = hidden.0.device();
        let (n, width) = hidden.1.shape().dims2()?;
        let hs = contiguous_slice!(hidden.0, hidden.1, T, "hidden");
        let ws = contiguous_slice!(head.0, head.1, T, "head weight");
        let (rows_guard, rows_layout) = cuda_storage(&self.rows)?;
        let Storage::Cuda(rows) = &*rows_guard else {
            unreachable!("checked by cuda_storage")
        };
        let rows = contiguous_slice!(rows, rows_layout, u32, "row ids");
        let out = dev.alloc_zeros::<f32>(n * self.count)?;
        if n > 0 && self.count > 0 {
            let func = dev.get_or_load_custom_func(name, MODULE, PTX)?;
            let cfg = LaunchConfig {
                grid_dim: (n as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut b = func.builder();
            b.arg(&hs);
            b.arg(&ws);
            b.arg(&rows);
            b.arg(&out);
            candle_core::builder_arg!(b, width as i32, self.count as i32);
            // SAFETY: argument order and types match `RHEAD` in aisql_kernels.cu; the
            // row ids were checked against the vocabulary by the caller.
            unsafe { b.launch(cfg) }.w()?;
        }
        Ok((
            CudaStorage::wrap_cuda_slice(out, dev.clone()),
            Shape::from((n, self.count)),
        ))
    }
}

impl CustomOp2 for HeadOp {
    fn name(&self) -> &'static str {
        "aisql-restricted-head"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!("aisql-restricted-head is CUDA-only; CPU uses kernels::head")
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        match s1.dtype() {
            DType::F32 => self.run::<f32>("rhead_f32", (s1, l1), (s2, l2)),
            DType::BF16 => self.run::<half::bf16>("rhead_bf16", (s1, l1), (s2, l2)),
            DType::F16 => self.run::<half::f16>("rhead_f16", (s1, l1), (s2, l2)),
            other => candle_core::bail!("aisql-restricted-head: unsupported dtype {other:?}"),
        }
    }
}

/// Devices whose kernels passed [`run_self_check`] (keyed by ordinal).
static CHECKED: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// On the first use of the kernels on a device, compares them with the candle-ops
/// composition on random inputs; a mismatch is an error naming the kernel.
fn self_check(device: &Device) -> Result<()> {
    let candle_core::DeviceLocation::Cuda { gpu_id } = device.location() else {
        return Ok(());
    };
    let mut checked = CHECKED.lock().unwrap_or_else(|p| p.into_inner());
    if checked.contains(&gpu_id) {
        return Ok(());
    }
    run_self_check(device)?;
    checked.push(gpu_id);
    Ok(())
}

fn run_self_check(dev: &Device) -> Result<()> {
    let fail = |kernel: &'static str, diff: f32| KernelError::SelfCheck {
        kernel,
        message: format!(
            "max |kernel - candle ops| = {diff:.3e} on random f32 inputs; \
             run with --cuda-kernels off to use candle ops only"
        ),
    };
    let randn = |shape: (usize, usize, usize)| Tensor::randn(0f32, 1f32, shape, dev);
    // Two shared documents (one a two-segment chain), suffixes of several lengths,
    // one suffix with no prefix; group 4, head width 64, more tokens than one tile.
    let (h, kvh, d) = (8, 2, 64);
    let doc = (randn((kvh, 37, d))?, randn((kvh, 37, d))?);
    let question = (randn((kvh, 5, d))?, randn((kvh, 5, d))?);
    let plan: [(usize, usize); 6] = [(3, 1), (3, 1), (19, 2), (19, 2), (1, 0), (11, 1)];
    let total: usize = plan.iter().map(|p| p.0).sum();
    let (q, k, v) = (
        randn((h, total, d))?,
        randn((kvh, total, d))?,
        randn((kvh, total, d))?,
    );
    let seqs = SeqKv::packed(
        plan.iter()
            .map(|&(len, segs)| (len, [doc.clone(), question.clone()][..segs].to_vec())),
    );
    let all: Vec<usize> = (0..seqs.len()).collect();
    let shape = psa_shape(d, h / kvh).expect("the self-check shape is supported");
    let ours = launch_psa(&q, &k, &v, &seqs, &all, 0.125, shape, h / kvh)?;
    let theirs = crate::grouped::prefix_suffix_attention_grouped(&q, &k, &v, &seqs, 0.125)?;
    let diff = max_abs_diff(&ours, &theirs)?;
    if diff.is_nan() || diff >= 1e-3 {
        return Err(fail("prefix_suffix_attention", diff));
    }
    let hidden = randn((1, 5, 96))?.squeeze(0)?;
    let head = randn((1, 1000, 96))?.squeeze(0)?;
    let rows = [3u32, 999, 0, 512, 7, 8, 100, 640, 41];
    let op = HeadOp {
        rows: Tensor::new(&rows[..], dev)?,
        count: rows.len(),
    };
    let ours = hidden.apply_op2_no_bwd(&head, &op)?;
    let ids = Tensor::new(&rows[..], dev)?;
    let theirs = hidden.matmul(&head.index_select(&ids, 0)?.t()?)?;
    let diff = max_abs_diff(&ours, &theirs)?;
    if diff.is_nan() || diff >= 1e-3 {
        return Err(fail("restricted_head", diff));
    }
    Ok(())
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
    let d = (a.to_dtype(DType::F32)? - b.to_dtype(DType::F32)?)?.abs()?;
    Ok(d.flatten_all()?.max(0)?.to_scalar::<f32>()?)
}
