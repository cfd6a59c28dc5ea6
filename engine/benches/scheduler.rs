//! Throughput of the plan-aware scheduler and its prefix cache, without a model:
//! the simulation executor (virtual KV, answers from a fixed pattern) runs an IMDB-7-like
//! filter chain and an IMDB-2-like join at sf 0.1 shapes (5,000 reviews of ~300
//! tokens, 12 aspects). Reports prompts scheduled per second; documents are
//! tokenized once before timing (the backend caches their tokens).

use std::sync::Arc;

use aisql_engine::inference::backend::{
    AiCall, AiKind, AiRequest, Answer, Answerer, AskTyped, Doc, InferenceBackend, QueryStart,
};
use aisql_engine::inference::prompt::{PromptFormat, filter_pieces, join_pieces};
use aisql_engine::inference::scheduler::{
    QWEN3_4B_KV_BYTES_PER_TOKEN, SchedulerConfig, simulation_backend,
};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

const WORDS: [&str; 16] = [
    "the", "movie", "acting", "plot", "was", "great", "terrible", "ending", "director", "scene",
    "music", "I", "loved", "boring", "actor", "story",
];

fn review(i: usize) -> String {
    (0..260)
        .map(|j| WORDS[(i * 7 + j * 13 + j / 5) % WORDS.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

/// Answers by a fixed pattern of the document numbers (`rv{i}`, `as{j}`):
/// filter `k` keeps `(i + k) % 3 != 0`, the join `(i + j) % 4 == 0`.
struct PatternAnswers {
    templates: Vec<String>,
}

fn number(id: &str) -> usize {
    id.trim_start_matches(|c: char| c.is_ascii_alphabetic())
        .parse()
        .expect("a numbered id")
}

impl Answerer for PatternAnswers {
    fn name(&self) -> &str {
        "pattern"
    }

    fn answer(
        &self,
        call: &AiCall,
        requests: &[AiRequest<'_>],
    ) -> aisql_engine::Result<Vec<Answer>> {
        let k = self.templates.iter().position(|t| *t == call.template);
        Ok(requests
            .iter()
            .map(|r| {
                let i = number(r.anchor.id);
                Answer::Bool(match (k, r.partner) {
                    (_, Some(p)) => (i + number(p.id)).is_multiple_of(4),
                    (Some(k), None) => !(i + k).is_multiple_of(3),
                    (None, None) => false,
                })
            })
            .collect())
    }
}

fn bench(c: &mut Criterion) {
    let ids: Vec<String> = (0..5000).map(|i| format!("rv{i}")).collect();
    let texts: Vec<String> = (0..5000).map(review).collect();
    let aspects: Vec<(String, String)> = (0..12)
        .map(|i| (format!("as{i}"), format!("the aspect {i}")))
        .collect();
    let templates = [
        "Judge strictly from the review above whether it mentions at least one positive aspect of the movie.\n\n{0}\n\nInstruction: answer TRUE if the review mentions at least one positive aspect of the movie, FALSE otherwise.",
        "Judge strictly from the review above whether it discusses the ending of the movie.\n\n{0}\n\nInstruction: answer TRUE if the review discusses the ending of the movie, FALSE otherwise.",
        "Judge strictly from the review above whether it mentions any specific actor or actress by name.\n\n{0}\n\nInstruction: answer TRUE if the review mentions a specific actor or actress by name, FALSE otherwise.",
    ];
    let join_template = "Does the review in DOCUMENT {0} discuss the movie aspect in DOCUMENT {1}?";
    let answers = Arc::new(PatternAnswers {
        templates: templates.iter().map(|t| t.to_string()).collect(),
    });
    let calls: Vec<AiCall> = templates
        .iter()
        .enumerate()
        .map(|(k, t)| AiCall {
            op_id: format!("filter-{}", k + 1),
            kind: AiKind::Filter,
            template: t.to_string(),
            tables: vec!["reviews".into()],
            columns: vec!["body".into()],
            pieces: filter_pieces(PromptFormat::RawV1, t).unwrap(),
            labels: vec![],
            max_tokens: 0,
            descriptions: vec![],
            relations: vec![],
        })
        .collect();
    let join = AiCall {
        op_id: "join-1".into(),
        kind: AiKind::Join,
        template: join_template.into(),
        tables: vec!["reviews".into(), "aspects".into()],
        columns: vec!["body".into(), "aspect".into()],
        pieces: join_pieces(PromptFormat::RawV1, join_template),
        labels: vec![],
        max_tokens: 0,
        descriptions: vec![],
        relations: vec![],
    };
    let config = SchedulerConfig {
        prefix_cache: true,
        lookahead: true,
        kv_budget_bytes: usize::MAX / 2,
        host_kv_budget_bytes: 0,
        batch_tokens: 8192,
    };
    let backend = simulation_backend(answers, config, QWEN3_4B_KV_BYTES_PER_TOKEN).unwrap();
    let requests: Vec<AiRequest<'_>> = ids
        .iter()
        .zip(&texts)
        .map(|(id, text)| AiRequest {
            anchor: Doc { id, text },
            partner: None,
        })
        .collect();
    // Warm the token cache once: timing covers scheduling and the virtual cache.
    let begin = |calls: &[AiCall]| {
        backend
            .clone()
            .begin(QueryStart {
                calls: calls.to_vec(),
                ..QueryStart::default()
            })
            .unwrap()
    };
    begin(&calls).decide(&calls[0], &requests).unwrap();

    let mut group = c.benchmark_group("scheduler");
    group.sample_size(10);
    group.throughput(Throughput::Elements((requests.len() * 3) as u64));
    group.bench_function("filter_chain_5000x3", |b| {
        b.iter(|| {
            let query = begin(&calls);
            for call in &calls {
                query.decide(call, &requests).unwrap();
            }
        })
    });
    let pairs: Vec<AiRequest<'_>> = requests
        .iter()
        .flat_map(|r| {
            aspects.iter().map(move |(a, t)| AiRequest {
                anchor: r.anchor,
                partner: Some(Doc { id: a, text: t }),
            })
        })
        .collect();
    group.throughput(Throughput::Elements(pairs.len() as u64));
    group.bench_function("join_5000x12", |b| {
        b.iter(|| {
            begin(std::slice::from_ref(&join))
                .decide(&join, &pairs)
                .unwrap();
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
