//! Output-head kernels: logits for a handful of vocabulary rows (the eight
//! TRUE/FALSE answer ids) without multiplying by the whole `(vocab, hidden)` matrix,
//! and full-vocabulary log-probabilities of given target tokens (label scoring)
//! without materialising the log-softmax.

use candle_core::{DType, Tensor};
use rayon::prelude::*;

use crate::cpu::{CpuF32, dot, log_sum_exp};
use crate::{KernelError, Result};

const KERNEL: &str = "restricted_head";

/// Logits of `rows` only: `hidden` `(n, hidden)` times the selected rows of
/// `head_weight` `(vocab, hidden)`, giving `(n, rows.len())` in f32. Contiguous f32 CPU
/// tensors use a rayon dot-product kernel; other inputs gather rows with
/// `index_select` and matmul on their device.
pub fn restricted_head(hidden: &Tensor, head_weight: &Tensor, rows: &[u32]) -> Result<Tensor> {
    let (n, width) = hidden.dims2()?;
    let (vocab, head_width) = head_weight.dims2()?;
    if width != head_width {
        return Err(KernelError::BadInput {
            kernel: KERNEL,
            message: format!("hidden width {width} differs from head width {head_width}"),
        });
    }
    if let Some(&bad) = rows.iter().find(|&&r| r as usize >= vocab) {
        return Err(KernelError::BadInput {
            kernel: KERNEL,
            message: format!("row {bad} is out of range for {vocab} rows"),
        });
    }
    #[cfg(feature = "cuda")]
    if hidden.device().is_cuda() && crate::cuda_kernels() != crate::CudaKernels::Off {
        return crate::cuda::restricted_head(hidden, head_weight, rows);
    }
    if !(crate::is_cpu_f32(hidden) && crate::is_cpu_f32(head_weight)) {
        let ids = Tensor::new(rows, head_weight.device())?;
        let sel = head_weight.index_select(&ids, 0)?.to_dtype(DType::F32)?;
        return Ok(hidden.to_dtype(DType::F32)?.matmul(&sel.t()?)?);
    }
    let hidden = hidden.contiguous()?;
    let (gh, gw) = (
        CpuF32::new(KERNEL, &hidden)?,
        CpuF32::new(KERNEL, head_weight)?,
    );
    let (h, w) = (gh.slice()?, gw.slice()?);
    let mut out = vec![0f32; n * rows.len()];
    if !rows.is_empty() && width > 0 {
        out.par_chunks_mut(rows.len())
            .zip(h.par_chunks(width))
            .for_each(|(o, x)| {
                for (o, &r) in o.iter_mut().zip(rows) {
                    *o = dot(x, &w[r as usize * width..(r as usize + 1) * width]);
                }
            });
    }
    Ok(Tensor::from_vec(out, (n, rows.len()), hidden.device())?)
}

/// Log-probability of `targets[r]` under a full-vocabulary softmax (temperature 1)
/// of row `r` of `hidden` `(n, hidden)` times `head_weight` `(vocab, hidden)`.
/// On CPU in f32 the logits come from one matmul and each row's log-sum-exp is a
/// single fused, vectorised pass (rayon over rows); elsewhere plain candle ops.
pub fn target_logprobs(hidden: &Tensor, head_weight: &Tensor, targets: &[u32]) -> Result<Vec<f32>> {
    const KERNEL: &str = "target_logprobs";
    let (n, width) = hidden.dims2()?;
    let (vocab, head_width) = head_weight.dims2()?;
    let bad = |message: String| KernelError::BadInput {
        kernel: KERNEL,
        message,
    };
    if width != head_width || n != targets.len() {
        return Err(bad(format!(
            "hidden {:?}, head {:?}, {} targets disagree",
            hidden.shape(),
            head_weight.shape(),
            targets.len()
        )));
    }
    if let Some(&t) = targets.iter().find(|&&t| t as usize >= vocab) {
        return Err(bad(format!("target {t} is out of range for {vocab} rows")));
    }
    if n == 0 {
        return Ok(Vec::new());
    }
    let logits = hidden.matmul(&head_weight.t()?)?.to_dtype(DType::F32)?;
    if !logits.device().is_cpu() {
        let max = logits.max_keepdim(1)?;
        let lse = (logits.broadcast_sub(&max)?.exp()?.sum_keepdim(1)?.log()? + max)?;
        let ids = Tensor::new(targets, logits.device())?.unsqueeze(1)?;
        return Ok(logits.gather(&ids, 1)?.sub(&lse)?.squeeze(1)?.to_vec1()?);
    }
    let logits = logits.contiguous()?;
    let guard = CpuF32::new(KERNEL, &logits)?;
    let rows = guard.slice()?;
    let mut out = vec![0f32; n];
    out.par_iter_mut()
        .zip(rows.par_chunks(vocab))
        .zip(targets.par_iter())
        .for_each(|((o, row), &t)| {
            *o = row[t as usize] - log_sum_exp(row);
        });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn equals_full_matmul_columns() {
        let dev = Device::Cpu;
        let hidden = Tensor::arange(0f32, 60., &dev)
            .unwrap()
            .reshape((3, 20))
            .unwrap()
            .sin()
            .unwrap();
        let head = Tensor::arange(0f32, 200., &dev)
            .unwrap()
            .reshape((10, 20))
            .unwrap()
            .cos()
            .unwrap();
        let rows = [7u32, 0, 3, 9];
        let got = restricted_head(&hidden, &head, &rows).unwrap();
        let full = hidden.matmul(&head.t().unwrap()).unwrap();
        let want = full
            .index_select(&Tensor::new(&rows, &dev).unwrap(), 1)
            .unwrap();
        let diff = (got - want)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(diff < 1e-5, "{diff}");
    }

    #[test]
    fn generic_path_matches_cpu_kernel() {
        let dev = Device::Cpu;
        let hidden = Tensor::arange(0f32, 40., &dev)
            .unwrap()
            .reshape((2, 20))
            .unwrap()
            .sin()
            .unwrap();
        let head = Tensor::arange(0f32, 100., &dev)
            .unwrap()
            .reshape((5, 20))
            .unwrap()
            .cos()
            .unwrap();
        let fast = restricted_head(&hidden, &head, &[4, 1]).unwrap();
        let slow = restricted_head(
            &hidden.to_dtype(DType::F64).unwrap(),
            &head.to_dtype(DType::F64).unwrap(),
            &[4, 1],
        )
        .unwrap();
        let diff = (fast - slow)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(diff < 1e-5, "{diff}");
    }

    #[test]
    fn target_logprobs_equal_log_softmax() {
        let dev = Device::Cpu;
        let hidden = (Tensor::arange(0f32, 96., &dev)
            .unwrap()
            .reshape((3, 32))
            .unwrap()
            .sin()
            .unwrap()
            * 3.0)
            .unwrap();
        let head = Tensor::arange(0f32, 32_000., &dev)
            .unwrap()
            .reshape((1000, 32))
            .unwrap()
            .cos()
            .unwrap();
        let targets = [0u32, 999, 417];
        let got = target_logprobs(&hidden, &head, &targets).unwrap();
        let logits = hidden
            .matmul(&head.t().unwrap())
            .unwrap()
            .to_dtype(DType::F64)
            .unwrap();
        let max = logits.max_keepdim(1).unwrap();
        let lse = (logits
            .broadcast_sub(&max)
            .unwrap()
            .exp()
            .unwrap()
            .sum_keepdim(1)
            .unwrap()
            .log()
            .unwrap()
            + max)
            .unwrap();
        let want = logits
            .broadcast_sub(&lse)
            .unwrap()
            .to_vec2::<f64>()
            .unwrap();
        for (r, &t) in targets.iter().enumerate() {
            assert!(
                (got[r] as f64 - want[r][t as usize]).abs() < 1e-5,
                "{} vs {}",
                got[r],
                want[r][t as usize]
            );
        }
        assert!(target_logprobs(&hidden, &head, &[0, 1]).is_err());
        assert!(target_logprobs(&hidden, &head, &[0, 1, 1000]).is_err());
    }

    #[test]
    fn rejects_out_of_range_rows() {
        let dev = Device::Cpu;
        let hidden = Tensor::zeros((1, 4), DType::F32, &dev).unwrap();
        let head = Tensor::zeros((3, 4), DType::F32, &dev).unwrap();
        let err = restricted_head(&hidden, &head, &[3]).unwrap_err();
        assert!(err.to_string().contains("row 3"), "{err}");
    }
}
