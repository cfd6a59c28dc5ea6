//! The AMX GEMM on the projection shapes of a Qwen3-0.6B prefill (hidden 1024,
//! 16 query and 8 KV heads of 128, MLP 3072) for one 300-token document and a
//! packed batch of 16. Reports multiply-adds per second. Skipped where the CPU
//! has no AMX-BF16.

mod shapes;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use shapes::{ROWS, SHAPES};

use aisql_kernels::amx_gemm::{AmxMatrix, amx_available};
use half::bf16;

fn bench(c: &mut Criterion) {
    if !amx_available() {
        eprintln!("no AMX-BF16 on this CPU: nothing to measure");
        return;
    }
    let mut g = c.benchmark_group("amx_gemm");
    g.sample_size(10);
    for (name, n, k) in SHAPES {
        let values: Vec<bf16> = (0..n * k)
            .map(|i| bf16::from_f32(((i * 7919 % 1000) as f32 - 500.0) * 1e-4))
            .collect();
        let w = AmxMatrix::from_bf16(&values, n, k).unwrap();
        for m in ROWS {
            let x: Vec<f32> = (0..m * k)
                .map(|i| ((i % 113) as f32 - 56.0) * 0.01)
                .collect();
            g.throughput(Throughput::Elements((m * n * k) as u64));
            g.bench_function(format!("{name}_m{m}"), |b| {
                b.iter(|| w.matmul(&x, m).unwrap())
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
