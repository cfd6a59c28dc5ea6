//! The Q8_0 VNNI GEMM against candle's quantized matmul (on x86 with VNNI, its
//! repacked kernel) on the projection shapes of a Qwen3-0.6B prefill, for one
//! 300-token document and a packed batch of 16. Reports multiply-adds per second.
//! The VNNI GEMM is skipped where the CPU has no AVX-512 VNNI.

mod shapes;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use shapes::{ROWS, SHAPES};

use aisql_kernels::q8_gemm::{Q8Matrix, q8_gemm_available};

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("q8_gemm");
    g.sample_size(10);
    for (name, n, k) in SHAPES {
        let values: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-4)
            .collect();
        let dense = Tensor::from_vec(values, (n, k), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&dense, GgmlDType::Q8_0).unwrap();
        let ours = Q8Matrix::from_q8_0(&q.data().unwrap(), n, k).unwrap();
        let candle = QMatMul::from_qtensor(q).unwrap();
        for m in ROWS {
            let x: Vec<f32> = (0..m * k)
                .map(|i| ((i % 113) as f32 - 56.0) * 0.01)
                .collect();
            g.throughput(Throughput::Elements((m * n * k) as u64));
            if q8_gemm_available() {
                g.bench_function(format!("vnni/{name}_m{m}"), |b| {
                    b.iter(|| ours.matmul(&x, m).unwrap())
                });
            }
            let xt = Tensor::from_vec(x, (m, k), &Device::Cpu).unwrap();
            g.bench_function(format!("candle/{name}_m{m}"), |b| {
                b.iter(|| candle.forward(&xt).unwrap())
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
