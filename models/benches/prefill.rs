//! Prefill throughput of the tiny Qwen3 (random weights, real vocabulary): one
//! 300-token document, and a packed batch of 16 such documents. Reports tokens/s.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};

use aisql_models::{Continuation, Device, Qwen3, tiny};

const DOC_LEN: usize = 300;
const BATCH: usize = 16;

fn tokens(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed * 7919)) % 151_000)
        .collect()
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    tiny::write_tiny_model(dir.path(), 1).unwrap();
    let model = Qwen3::load(dir.path(), &Device::Cpu, None).unwrap();
    let docs: Vec<Vec<u32>> = (0..BATCH as u32).map(|i| tokens(DOC_LEN, i)).collect();

    let mut g = c.benchmark_group("tiny_prefill");
    g.sample_size(10);
    g.throughput(Throughput::Elements(DOC_LEN as u64));
    g.bench_function("doc300_x1", |b| {
        b.iter(|| model.prefill(None, &docs[0]).unwrap())
    });
    g.throughput(Throughput::Elements((DOC_LEN * BATCH) as u64));
    let items: Vec<Continuation> = docs.iter().map(|d| Continuation::new(None, d)).collect();
    g.bench_function("doc300_x16_packed", |b| {
        b.iter(|| model.prefill_batch(&items).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
