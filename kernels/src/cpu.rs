//! Shared CPU helpers: borrowing a tensor's f32 storage, the tensor entry point of the
//! packed-weight GEMMs, a vectorisable dot product, large output buffers on huge
//! pages, the pointer parallel GEMM tasks write through, and the environment switches
//! that turn kernels off.

use candle_core::{DType, Storage, Tensor};

use crate::{KernelError, Result};

/// A read guard on a contiguous f32 CPU tensor's storage, from which a slice is borrowed.
pub(crate) struct CpuF32<'a> {
    guard: candle_core::StorageRef<'a>,
    start: usize,
    end: usize,
}

impl<'a> CpuF32<'a> {
    pub(crate) fn new(kernel: &'static str, t: &'a Tensor) -> Result<Self> {
        let (guard, layout) = t.storage_and_layout();
        let Some((start, end)) = layout.contiguous_offsets() else {
            return Err(KernelError::BadInput {
                kernel,
                message: format!("tensor {:?} is not contiguous", t.shape()),
            });
        };
        if !matches!(&*guard, Storage::Cpu(_)) {
            return Err(KernelError::BadInput {
                kernel,
                message: "tensor is not on the CPU".into(),
            });
        }
        Ok(Self { guard, start, end })
    }

    /// A `(heads, len, d)` f32 CPU tensor, contiguous or the first `len` positions
    /// of a `(heads, capacity, d)` buffer, with its head stride in positions: the
    /// slice runs from the first head's first value to the last head's last.
    pub(crate) fn heads(kernel: &'static str, t: &'a Tensor) -> Result<(Self, usize)> {
        let Some(stride) = Self::head_stride(t) else {
            return Err(KernelError::BadInput {
                kernel,
                message: format!(
                    "tensor {:?} is not (heads, len, d) with rows of d side by side",
                    t.layout()
                ),
            });
        };
        let (guard, layout) = t.storage_and_layout();
        if !matches!(&*guard, Storage::Cpu(_)) {
            return Err(KernelError::BadInput {
                kernel,
                message: "tensor is not on the CPU".into(),
            });
        }
        let (heads, len, d) = (layout.dims()[0], layout.dims()[1], layout.dims()[2]);
        let start = layout.start_offset();
        let end = start + (heads.max(1) - 1) * stride * d + len * d;
        Ok((Self { guard, start, end }, stride))
    }

    /// The head stride (positions) of a rank-3 tensor [`Self::heads`] can read, or
    /// `None`.
    pub(crate) fn head_stride(t: &Tensor) -> Option<usize> {
        let layout = t.layout();
        let (dims, strides) = (layout.dims(), layout.stride());
        let [heads, len, d] = *dims else {
            return None;
        };
        if t.is_contiguous() {
            return Some(len);
        }
        // Rows of d side by side, heads a whole number of rows apart, no overlap.
        let ok = strides[2] == 1
            && strides[1] == d
            && d > 0
            && strides[0] % d == 0
            && strides[0] / d >= len;
        (ok || heads <= 1 && strides[2] == 1 && strides[1] == d)
            .then(|| if heads <= 1 { len } else { strides[0] / d })
    }

    pub(crate) fn slice(&self) -> Result<&[f32]> {
        match &*self.guard {
            Storage::Cpu(cpu) => Ok(&cpu.as_slice::<f32>()?[self.start..self.end]),
            _ => unreachable!("checked in CpuF32::new"),
        }
    }
}

/// A CPU GEMM over a candle tensor: `x` `(rows, k)` on the CPU in one of `dtypes`
/// (f32 or bf16; made contiguous if it is not) goes through `matmul` as f32 rows,
/// giving `(rows, n)` in `x`'s dtype. The entry point of every packed-weight GEMM.
pub(crate) fn linear(
    kernel: &'static str,
    x: &Tensor,
    (n, k): (usize, usize),
    dtypes: &[DType],
    matmul: impl FnOnce(&[f32], usize) -> Result<Vec<f32>>,
) -> Result<Tensor> {
    let (rows, cols) = x.dims2()?;
    let dtype = x.dtype();
    if cols != k || !x.device().is_cpu() || !dtypes.contains(&dtype) {
        let wanted: Vec<&str> = dtypes.iter().map(|d| d.as_str()).collect();
        return Err(KernelError::BadInput {
            kernel,
            message: format!(
                "input {:?} {:?} on {:?} for a ({n}, {k}) matrix: {} CPU rows of {k} values needed",
                x.shape(),
                dtype,
                x.device().location(),
                wanted.join(" or "),
            ),
        });
    }
    // A bf16 value widened to f32 rounds back to itself.
    let x = x.to_dtype(DType::F32)?.contiguous()?;
    let view = CpuF32::new(kernel, &x)?;
    let y = matmul(view.slice()?, rows)?;
    Ok(Tensor::from_vec(y, (rows, n), x.device())?.to_dtype(dtype)?)
}

/// Dot product with eight independent accumulators, so the compiler can vectorise
/// it (a single running sum would serialise on float addition order).
#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s = acc.iter().sum::<f32>();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// `acc += w * x`, elementwise.
#[inline]
pub(crate) fn axpy(acc: &mut [f32], w: f32, x: &[f32]) {
    for (a, b) in acc.iter_mut().zip(x) {
        *a += w * b;
    }
}

/// `ln Σ exp(x)` over a row, stable (max-shifted), in two vectorisable passes.
pub(crate) fn log_sum_exp(x: &[f32]) -> f32 {
    let mut m = [f32::NEG_INFINITY; 8];
    let chunks = x.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..8 {
            if c[i] > m[i] {
                m[i] = c[i];
            }
        }
    }
    let max = rest
        .iter()
        .chain(&m)
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return max;
    }
    let mut acc = [0f32; 8];
    let chunks = x.chunks_exact(8);
    for c in chunks {
        for i in 0..8 {
            acc[i] += exp_nonpositive(c[i] - max);
        }
    }
    let sum = acc.iter().sum::<f32>() + rest.iter().map(|&v| (v - max).exp()).sum::<f32>();
    max + sum.ln()
}

/// `exp(x)` for `x ≤ 0`, branch-free so it vectorises (libm's `expf` does not); the
/// Cephes `expf` reduction and polynomial, about 2 ulp, which is far inside the
/// 1e-4 tolerance of label scores. Inputs below -87 flush to 0 like `expf` does.
#[inline(always)]
pub(crate) fn exp_nonpositive(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // 1.5·2^23: adding it rounds to an integer held in the low mantissa bits.
    const MAGIC: f32 = 12_582_912.0;
    let x = x.max(-87.0);
    // n = round(x·log2e) without a float→int cast (Rust's saturating `as` does not
    // vectorise): after adding MAGIC the low mantissa bits hold n.
    let t = x * LOG2E + MAGIC;
    let fx = t - MAGIC;
    let r = x - fx * 0.693_359_4 + fx * 2.121_944_4e-4;
    let z = r * r;
    let p = ((((1.987_569_1e-4 * r + 1.398_2e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let y = p * z + r + 1.0;
    // 2^n: n + 127 (≥ 1 since x ≥ -87) shifted into the exponent field.
    y * f32::from_bits(t.to_bits().wrapping_sub(MAGIC.to_bits() - 127) << 23)
}

/// `v` rounded to the nearest bfloat16, ties to even (as `half::bf16::from_f32`
/// for finite values), branch-free so it vectorises.
#[inline(always)]
pub(crate) fn bf16_bits(v: f32) -> u16 {
    let b = v.to_bits();
    let round = 0x7fff + ((b >> 16) & 1);
    (b.wrapping_add(round) >> 16) as u16
}

/// Whether the environment variable `var` is set to anything but empty or `0`: the
/// switches that turn a CPU kernel off (to measure or test the other path).
pub(crate) fn switched_off(var: &str) -> bool {
    std::env::var_os(var).is_some_and(|v| !v.is_empty() && v != "0")
}

/// A raw output pointer shared by parallel tasks that write disjoint blocks of one
/// buffer (the GEMMs' outputs).
#[derive(Clone, Copy)]
pub(crate) struct SendPtr(pub(crate) *mut f32);
// SAFETY: the tasks sharing one write disjoint regions (see its users).
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// The pointer `i` floats on (a method, so closures capture the whole `SendPtr`).
    ///
    /// # Safety
    /// `i` must lie inside the allocation.
    pub(crate) unsafe fn at(self, i: usize) -> *mut f32 {
        // SAFETY: forwarded from the caller.
        unsafe { self.0.add(i) }
    }
}

/// An empty vector with room for `len` values whose pages, when it is large, the
/// kernel backs with 2 MiB huge pages (where transparent huge pages are on in
/// `madvise` mode, Linux's common default): a GEMM's output of thousands of rows
/// (tens of MB, which glibc maps afresh for every call) then takes one page fault
/// per 2 MiB instead of one per 4 KiB.
pub(crate) fn large_buffer<T>(len: usize) -> Vec<T> {
    let v: Vec<T> = Vec::with_capacity(len);
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let bytes = len * std::mem::size_of::<T>();
        if bytes >= 4 * HUGE {
            let start = (v.as_ptr() as usize).next_multiple_of(HUGE);
            let end = (v.as_ptr() as usize + bytes) / HUGE * HUGE;
            if end > start {
                // SAFETY: advice on pages inside this vector's own allocation; it
                // changes how they are backed, never their contents (none yet).
                unsafe {
                    libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
                }
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_matches_libm() {
        for i in 0..19_300 {
            let x = -(i as f32) * 0.0045;
            let (got, want) = (exp_nonpositive(x), x.exp());
            assert!(
                (got - want).abs() <= 4.0 * f32::EPSILON * want.max(f32::MIN_POSITIVE),
                "exp({x}) = {got}, want {want}"
            );
        }
        assert_eq!(exp_nonpositive(-1000.0), exp_nonpositive(-87.0));
        assert!(exp_nonpositive(-87.0) < 1e-37);
    }

    #[test]
    fn log_sum_exp_is_stable() {
        let x: Vec<f32> = (0..1003)
            .map(|i| (i as f32 * 0.37).sin() * 50.0 + 1000.0)
            .collect();
        let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let want = max + x.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln();
        assert!((log_sum_exp(&x) as f64 - want).abs() < 1e-4);
    }
}
