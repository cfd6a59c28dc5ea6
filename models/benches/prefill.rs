//! Prefill throughput of the tiny Qwen3 (random weights, real vocabulary): one
//! 300-token document, and a packed batch of 16 such documents; and, where attention
//! dominates, 4,096 new tokens continuing a cached 8,192-token prefix, plus a packed
//! batch of 8 × 1,024-token continuations of 4,096-token prefixes. Reports tokens/s.

use std::time::Duration;

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

    // Long cached prefixes: the attention kernel dominates here.
    const PREFIX: usize = 8192;
    const NEW: usize = 4096;
    let prefix_tokens = tokens(PREFIX, 77);
    let prefix = model.prefill(None, &prefix_tokens).unwrap();
    let new = tokens(NEW, 78);
    let mut g = c.benchmark_group("tiny_long_prefill");
    g.sample_size(10);
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(5));
    g.throughput(Throughput::Elements(NEW as u64));
    g.bench_function("new4096_on_prefix8192", |b| {
        b.iter(|| model.prefill(Some(&prefix), &new).unwrap())
    });
    const SEQS: usize = 8;
    const SEQ_PREFIX: usize = 4096;
    const SEQ_NEW: usize = 1024;
    let prefixes: Vec<_> = (0..SEQS as u32)
        .map(|i| model.prefill(None, &tokens(SEQ_PREFIX, 100 + i)).unwrap())
        .collect();
    let news: Vec<Vec<u32>> = (0..SEQS as u32).map(|i| tokens(SEQ_NEW, 200 + i)).collect();
    let items: Vec<Continuation> = prefixes
        .iter()
        .zip(&news)
        .map(|(p, n)| Continuation::new(Some(p), n))
        .collect();
    g.throughput(Throughput::Elements((SEQS * SEQ_NEW) as u64));
    g.bench_function("new1024_on_prefix4096_x8_packed", |b| {
        b.iter(|| model.prefill_batch(&items).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
