//! The AVX-512 f32 GEMM, and the AVX-512 BF16 GEMM with the same weights rounded to
//! bf16, against candle's CPU matmul (the `gemm` crate) on the projection shapes of a
//! Qwen3-0.6B prefill (hidden 1024, 16 query and 8 KV heads of 128, MLP 3072) for one
//! 300-token document and a packed batch of 16. Reports multiply-adds per second;
//! numpy's sgemm on the same shapes is the bar (`scripts/llama-compare.sh` measures
//! it). Each kernel is skipped where the CPU lacks its instructions.

mod shapes;

use candle_core::{Device, Tensor};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use half::bf16;
use shapes::{ROWS, SHAPES};

use aisql_kernels::bf16_gemm::{Bf16Matrix, bf16_gemm_available};
use aisql_kernels::f32_gemm::{F32Matrix, f32_gemm_available};

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("f32_gemm");
    g.sample_size(10);
    for (name, n, k) in SHAPES {
        let values: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-4)
            .collect();
        let halves: Vec<bf16> = values.iter().map(|&v| bf16::from_f32(v)).collect();
        let w = F32Matrix::new(&values, n, k).unwrap();
        let wb = Bf16Matrix::from_bf16(&halves, n, k).unwrap();
        let wt = Tensor::from_vec(values, (n, k), &Device::Cpu).unwrap();
        for m in ROWS {
            let x: Vec<f32> = (0..m * k)
                .map(|i| ((i % 113) as f32 - 56.0) * 0.01)
                .collect();
            let xt = Tensor::from_vec(x.clone(), (m, k), &Device::Cpu).unwrap();
            g.throughput(Throughput::Elements((m * n * k) as u64));
            if f32_gemm_available() {
                g.bench_function(format!("{name}_m{m}"), |b| {
                    b.iter(|| w.matmul(&x, m).unwrap())
                });
            }
            if bf16_gemm_available() {
                g.bench_function(format!("{name}_m{m}_bf16"), |b| {
                    b.iter(|| wb.matmul(&x, m).unwrap())
                });
            }
            g.bench_function(format!("{name}_m{m}_candle"), |b| {
                b.iter(|| xt.matmul(&wt.t().unwrap()).unwrap())
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
