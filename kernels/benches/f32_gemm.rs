//! The AVX-512 f32 GEMM against candle's CPU matmul (the `gemm` crate) on the
//! projection shapes of a Qwen3-0.6B prefill (hidden 1024, 16 query and 8 KV heads
//! of 128, MLP 3072) for one 300-token document and a packed batch of 16. Reports
//! multiply-adds per second; numpy's sgemm on the same shapes is the bar
//! (`scripts/llama-compare.sh` measures it). Skipped where the CPU has no AVX-512F.

mod shapes;

use candle_core::{Device, Tensor};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use shapes::{ROWS, SHAPES};

use aisql_kernels::f32_gemm::{F32Matrix, f32_gemm_available};

fn bench(c: &mut Criterion) {
    if !f32_gemm_available() {
        eprintln!("no AVX-512F on this CPU: nothing to measure");
        return;
    }
    if std::env::var_os("MALLOPT").is_some() {
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 30);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
        }
    }
    let mut g = c.benchmark_group("f32_gemm");
    g.sample_size(10);
    for (name, n, k) in SHAPES {
        let values: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-4)
            .collect();
        let w = F32Matrix::new(&values, n, k).unwrap();
        let wt = Tensor::from_vec(values, (n, k), &Device::Cpu).unwrap();
        for m in ROWS {
            let x: Vec<f32> = (0..m * k)
                .map(|i| ((i % 113) as f32 - 56.0) * 0.01)
                .collect();
            let xt = Tensor::from_vec(x.clone(), (m, k), &Device::Cpu).unwrap();
            g.throughput(Throughput::Elements((m * n * k) as u64));
            g.bench_function(format!("{name}_m{m}"), |b| {
                b.iter(|| w.matmul(&x, m).unwrap())
            });
            g.bench_function(format!("{name}_m{m}_candle"), |b| {
                b.iter(|| xt.matmul(&wt.t().unwrap()).unwrap())
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
