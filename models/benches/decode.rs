//! Greedy decode speed on the CPU: 32 tokens generated after a shared 128-token
//! prompt (cached once, as a document is), by 1 sequence and by 16 sequences
//! decoding together, at the tiny shape and at the Qwen3-0.6B shape (random
//! weights, f32). Throughput counts generated tokens. The 0.6B shape takes
//! seconds per iteration on a small machine, so every group runs the fewest
//! samples criterion allows, one iteration each; `AISQL_BENCH_06B=0` skips it.

use std::time::Duration;

use criterion::{Criterion, SamplingMode, Throughput, criterion_group, criterion_main};

use aisql_models::{Device, GenerateRequest, Qwen3, tiny};

const PROMPT: usize = 128;
const NEW_TOKENS: usize = 32;
const BATCHES: [usize; 2] = [1, 16];

fn tokens(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed * 7919)) % 151_000)
        .collect()
}

/// Qwen3-0.6B's shape (its `config.json`): 28 layers, hidden 1024, 16 query and 8
/// KV heads of 128, intermediate 3072, tied embeddings.
/// Decodes `NEW_TOKENS` tokens for each batch size; every sequence continues the
/// shared prompt with one token of its own, so the sequences differ.
fn decode(c: &mut Criterion, name: &str, model: &Qwen3) {
    let prompt = model.prefill(None, &tokens(PROMPT, 1)).unwrap();
    let own: Vec<Vec<u32>> = (0..16).map(|i| tokens(1, 100 + i)).collect();
    let mut g = c.benchmark_group(name);
    // Flat sampling: one iteration per sample once iterations take seconds.
    g.sampling_mode(SamplingMode::Flat);
    g.sample_size(10);
    g.warm_up_time(Duration::from_millis(100));
    g.measurement_time(Duration::from_secs(1));
    for batch in BATCHES {
        let requests: Vec<GenerateRequest> = own[..batch]
            .iter()
            .map(|t| GenerateRequest::new(Some(&prompt), t, NEW_TOKENS))
            .collect();
        g.throughput(Throughput::Elements((batch * NEW_TOKENS) as u64));
        g.bench_function(format!("prompt{PROMPT}_new{NEW_TOKENS}_x{batch}"), |b| {
            b.iter(|| model.generate(&requests, &[], batch).unwrap())
        });
    }
    g.finish();
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    tiny::write_tiny_model(dir.path(), 1).unwrap();
    let model = Qwen3::load(dir.path(), &Device::Cpu, None).unwrap();
    decode(c, "tiny_decode", &model);
    if std::env::var("AISQL_BENCH_06B").as_deref() != Ok("0") {
        let model = Qwen3::random(tiny::qwen3_0_6b_config(), &Device::Cpu, None, 0).unwrap();
        decode(c, "qwen3_0.6b_shape_decode", &model);
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
