//! Test helpers shared by the kernels' unit tests: deterministic tensors, spiky
//! values, Q8_0 blocks, the largest absolute difference between two tensors and
//! the GEMMs' checks against their references.

use candle_core::{Device, Tensor};

pub(crate) fn randn(shape: (usize, usize, usize), seed: u64) -> Tensor {
    // A tiny LCG keeps the test free of extra dependencies and fully deterministic.
    let n = shape.0 * shape.1 * shape.2;
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let data: Vec<f32> = (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    Tensor::from_vec(data, shape, &Device::Cpu).unwrap()
}

/// Compared on the CPU in f32, so GPU and lower-precision results compare directly.
pub(crate) fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    let cpu_f32 = |t: &Tensor| {
        t.to_device(&Device::Cpu)
            .unwrap()
            .to_dtype(candle_core::DType::F32)
            .unwrap()
    };
    (cpu_f32(a) - cpu_f32(b))
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

/// Q8_0 blocks (f16 scale, 32 signed bytes in −127 ..= 127, as ggml writes them) of
/// a pseudo-random `(n, k)` matrix, row after row.
pub(crate) fn q8_bytes(n: usize, k: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut out = Vec::with_capacity(n * k / 32 * 34);
    for _ in 0..n * k / 32 {
        let d = half::f16::from_f32(0.001 + (next() % 1000) as f32 * 1e-5);
        out.extend_from_slice(&d.to_le_bytes());
        out.extend((0..32).map(|_| ((next() % 255) as i32 - 127) as i8 as u8));
    }
    out
}

/// `len` test values of both signs, mostly within ±3 with every 97th twenty times
/// larger (the outliers real activations have), shifted by `seed`.
pub(crate) fn spiky(len: usize, seed: f32) -> Vec<f32> {
    (0..len)
        .map(|i| ((i as f32 * 0.377 + seed).sin() * 3.0) * if i % 97 == 0 { 20.0 } else { 1.0 })
        .collect()
}

/// Asserts that each GEMM output `got` is its exact reference `want` up to f32's
/// rounding of a sum whose terms' magnitudes add up to `magnitude` (what the
/// `matmul_reference`s return); `shape` names the case in a failure.
pub(crate) fn assert_within_rounding(
    got: &[f32],
    want: &[f32],
    magnitude: &[f32],
    shape: (usize, usize, usize),
) {
    let (m, n, k) = shape;
    assert_eq!(got.len(), want.len(), "({m}, {n}, {k}): output length");
    assert_eq!(magnitude.len(), want.len(), "({m}, {n}, {k}): magnitudes");
    for (i, ((g, r), s)) in got.iter().zip(want).zip(magnitude).enumerate() {
        assert!(
            (g - r).abs() <= 1e-5 * s + 1e-6,
            "({m}, {n}, {k}) element {i}: {g} vs {r} (scale {s})"
        );
    }
}

/// Asserts that each GEMM output `got` is within `relative` of `want` (of 1 where
/// `want` is smaller), for the GEMMs whose references do not return magnitudes;
/// `shape` names the case in a failure.
pub(crate) fn assert_relatively_close(
    got: &[f32],
    want: &[f32],
    relative: f32,
    shape: (usize, usize, usize),
) {
    let (m, n, k) = shape;
    assert_eq!(got.len(), want.len(), "({m}, {n}, {k}): output length");
    for (i, (g, r)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - r).abs() <= relative * r.abs().max(1.0),
            "({m}, {n}, {k}) element {i}: {g} vs {r}"
        );
    }
}
