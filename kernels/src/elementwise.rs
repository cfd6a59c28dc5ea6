//! Elementwise steps of a decoder layer over packed rows, spread over the CPU's
//! threads: SwiGLU's `silu(gate) · up`, the residual add, and the swap between
//! row-major `(rows, heads, d)` and head-major `(heads, rows, d)` around attention.
//! candle's CPU unary and binary maps and its strided copies run on one thread; over
//! thousands of packed rows those passes left all but one core idle between the
//! (parallel) matmuls.
//!
//! Contiguous f32 CPU tensors take the parallel path; anything else (another
//! dtype, a GPU) takes candle's own ops.

use candle_core::Tensor;
use rayon::prelude::*;

use crate::cpu::{CpuF32, exp_nonpositive};
use crate::{KernelError, Result, is_cpu_f32};

/// Elements per parallel task: large enough to amortise scheduling, small enough
/// to share a few million elements among the threads.
const CHUNK: usize = 1 << 14;

/// `silu(gate) · up`, elementwise, where `silu(v) = v / (1 + e^(-v))`.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    check_same("swiglu", gate, up)?;
    if !(is_cpu_f32(gate) && is_cpu_f32(up) && gate.is_contiguous() && up.is_contiguous()) {
        return Ok((gate.silu()? * up)?);
    }
    let (g, u) = (CpuF32::new("swiglu", gate)?, CpuF32::new("swiglu", up)?);
    let out = zip_map(g.slice()?, u.slice()?, |g, u| silu(g) * u);
    Ok(Tensor::from_vec(out, gate.shape(), gate.device())?)
}

/// `a + b`, elementwise (same shapes).
pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    check_same("add", a, b)?;
    if !(is_cpu_f32(a) && is_cpu_f32(b) && a.is_contiguous() && b.is_contiguous()) {
        return Ok((a + b)?);
    }
    let (x, y) = (CpuF32::new("add", a)?, CpuF32::new("add", b)?);
    let out = zip_map(x.slice()?, y.slice()?, |x, y| x + y);
    Ok(Tensor::from_vec(out, a.shape(), a.device())?)
}

/// `x.transpose(0, 1)` made contiguous, for a 3-D `x` `(a, b, d)`: `(b, a, d)`.
pub fn transpose_01(x: &Tensor) -> Result<Tensor> {
    let (a, b, d) = x.dims3()?;
    if !(is_cpu_f32(x) && x.is_contiguous()) || d == 0 {
        return Ok(x.transpose(0, 1)?.contiguous()?);
    }
    let src = CpuF32::new("transpose_01", x)?;
    let src = src.slice()?;
    let mut out = vec![0f32; a * b * d];
    // Output row (j, i) is input row (i, j); rows grouped so a task copies at
    // least a few KiB.
    out.par_chunks_mut(d)
        .with_min_len(CHUNK / d + 1)
        .enumerate()
        .for_each(|(row, o)| {
            let (j, i) = (row / a, row % a);
            o.copy_from_slice(&src[(i * b + j) * d..][..d]);
        });
    Ok(Tensor::from_vec(out, (b, a, d), x.device())?)
}

fn check_same(kernel: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.shape() != b.shape() || a.dtype() != b.dtype() {
        return Err(KernelError::BadInput {
            kernel,
            message: format!(
                "operands {:?} {:?} and {:?} {:?} differ",
                a.shape(),
                a.dtype(),
                b.shape(),
                b.dtype()
            ),
        });
    }
    Ok(())
}

fn zip_map(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32 + Sync) -> Vec<f32> {
    let mut out = vec![0f32; a.len()];
    out.par_chunks_mut(CHUNK)
        .zip(a.par_chunks(CHUNK).zip(b.par_chunks(CHUNK)))
        .for_each(|(o, (a, b))| {
            for ((o, &a), &b) in o.iter_mut().zip(a).zip(b) {
                *o = f(a, b);
            }
        });
    out
}

/// `v / (1 + e^(-v))` through `e = e^(-|v|) ≤ 1`, branch-free so it vectorises:
/// `v / (1 + e)` for `v ≥ 0`, `v·e / (1 + e)` below.
#[inline(always)]
fn silu(v: f32) -> f32 {
    let e = exp_nonpositive(-v.abs());
    let num = if v >= 0.0 { v } else { v * e };
    num / (1.0 + e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    fn values(n: usize, seed: f32) -> Tensor {
        let v: Vec<f32> = (0..n)
            .map(|i| (i as f32 * 0.731 + seed).sin() * 12.0)
            .collect();
        Tensor::from_vec(v, (n / 64, 64), &Device::Cpu).unwrap()
    }

    fn max_rel_diff(a: &Tensor, b: &Tensor) -> f32 {
        let (a, b) = (
            a.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            b.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        );
        a.iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs() / y.abs().max(1e-6))
            .fold(0.0, f32::max)
    }

    #[test]
    fn swiglu_matches_candle_ops() {
        // Several chunks and a ragged end.
        let n = 3 * CHUNK + 64 * 5;
        let (g, u) = (values(n, 0.3), values(n, 1.7));
        let want = (g.silu().unwrap() * &u).unwrap();
        let got = swiglu(&g, &u).unwrap();
        assert!(max_rel_diff(&got, &want) < 1e-5);
        // Extremes: no NaN, and silu's limits.
        let x = Tensor::new(
            &[-200f32, -88.0, -1e-30, 0.0, 1e-30, 88.0, 200.0],
            &Device::Cpu,
        )
        .unwrap();
        let ones = x.ones_like().unwrap();
        let got = swiglu(&x, &ones).unwrap().to_vec1::<f32>().unwrap();
        assert!(got.iter().all(|v| v.is_finite()), "{got:?}");
        assert_eq!(got[3], 0.0);
        assert!(
            (got[6] - 200.0).abs() < 1e-4 && got[0].abs() < 1e-30,
            "{got:?}"
        );
    }

    #[test]
    fn transpose_01_matches_candle() {
        for (a, b, d) in [(300, 16, 128), (3, 5, 64), (1, 7, 2), (70, 1, 16)] {
            let x = values(a * b * d * 64, 0.2).reshape((a * 64, b, d)).unwrap();
            let want = x.transpose(0, 1).unwrap().contiguous().unwrap();
            let got = transpose_01(&x).unwrap();
            assert_eq!(got.dims3().unwrap(), (b, a * 64, d));
            assert_eq!(
                got.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                want.flatten_all().unwrap().to_vec1::<f32>().unwrap()
            );
            // A strided view and another dtype take candle's path.
            let view = x.transpose(0, 1).unwrap();
            let back = transpose_01(&view).unwrap();
            assert_eq!(
                back.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                x.flatten_all().unwrap().to_vec1::<f32>().unwrap()
            );
            let h = transpose_01(&x.to_dtype(DType::BF16).unwrap()).unwrap();
            assert_eq!(
                (h.dtype(), h.dims3().unwrap()),
                (DType::BF16, (b, a * 64, d))
            );
        }
        assert!(transpose_01(&values(64, 0.0)).is_err());
    }

    #[test]
    fn add_matches_and_other_dtypes_fall_back() {
        let n = 2 * CHUNK + 64;
        let (a, b) = (values(n, 0.1), values(n, 0.9));
        assert_eq!(
            add(&a, &b).unwrap().to_vec2::<f32>().unwrap(),
            (&a + &b).unwrap().to_vec2::<f32>().unwrap()
        );
        let (ah, bh) = (
            a.to_dtype(DType::BF16).unwrap(),
            b.to_dtype(DType::BF16).unwrap(),
        );
        assert_eq!(add(&ah, &bh).unwrap().dtype(), DType::BF16);
        assert!(swiglu(&ah, &bh).is_ok());
        // A strided view takes candle's path and gives the same values.
        let t = a.t().unwrap();
        let want = (t.silu().unwrap() * &t).unwrap();
        assert!(max_rel_diff(&swiglu(&t, &t).unwrap(), &want) < 1e-5);
        assert!(add(&a, &a.narrow(0, 0, 2).unwrap()).is_err());
    }
}
