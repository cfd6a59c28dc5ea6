//! Shared-prefix scoring on the tiny Qwen3: 64 forty-token questions scored as
//! TRUE/FALSE decisions on top of one cached 300-token document, versus the same 64
//! decisions with the document recomputed for every question (a packed batch of
//! 64 × 340-token prompts). Also label scoring: a question prefilled on the document,
//! then 8 three-token labels. Throughput counts prompt tokens answered (document +
//! question), so the two decision variants compare directly.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};

use aisql_models::{ClassifyRequest, Continuation, Device, Qwen3, Tokenizer, tiny};

const DOC_LEN: usize = 300;
const Q_LEN: usize = 40;
const SUFFIXES: usize = 64;

fn tokens(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed * 7919)) % 151_000)
        .collect()
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    tiny::write_tiny_model(dir.path(), 1).unwrap();
    let model = Qwen3::load(dir.path(), &Device::Cpu, None).unwrap();
    let answers = Tokenizer::vendored().unwrap().answer_ids().unwrap();
    let doc = tokens(DOC_LEN, 1000);
    let questions: Vec<Vec<u32>> = (0..SUFFIXES as u32).map(|i| tokens(Q_LEN, i)).collect();
    let doc_kv = model.prefill(None, &doc).unwrap();

    let mut g = c.benchmark_group("tiny_shared_prefix");
    g.sample_size(10);
    g.throughput(Throughput::Elements((SUFFIXES * (DOC_LEN + Q_LEN)) as u64));
    let shared: Vec<Continuation> = questions
        .iter()
        .map(|q| Continuation::new(Some(&doc_kv), q))
        .collect();
    g.bench_function("decide_64x40_on_shared_doc300", |b| {
        b.iter(|| model.decide(&shared, &answers).unwrap())
    });
    let whole: Vec<Vec<u32>> = questions
        .iter()
        .map(|q| doc.iter().chain(q).copied().collect())
        .collect();
    let recompute: Vec<Continuation> = whole.iter().map(|p| Continuation::new(None, p)).collect();
    g.bench_function("decide_64x340_recomputing_doc", |b| {
        b.iter(|| model.decide(&recompute, &answers).unwrap())
    });

    let labels: Vec<Vec<u32>> = (0..8).map(|i| tokens(3, 500 + i)).collect();
    let requests: Vec<ClassifyRequest> = questions
        .iter()
        .take(16)
        .map(|q| ClassifyRequest {
            prefix: Some(&doc_kv),
            prompt: q,
            labels: &labels,
        })
        .collect();
    g.throughput(Throughput::Elements((16 * (DOC_LEN + Q_LEN)) as u64));
    g.bench_function("classify_16x40_8labels_on_shared_doc300", |b| {
        b.iter(|| model.classify(&requests).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
