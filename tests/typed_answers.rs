//! The typed answers of the tiny Qwen3, through the scheduler (shared-prefix
//! KV cache) against the model asked without any cache:
//! - `ai_score` is the softmax of the restricted TRUE/FALSE head's best logits,
//!   and `ai_classify_scores` the softmax of the labels' summed
//!   log-probabilities, each computed from the whole prompt from its first
//!   token (tolerance 1e-5);
//! - `ai_complete` and `ai_extract` give the same texts with the prefix cache
//!   on and off (decoding over a document's shared KV preserves answers), and
//!   the sharing saves the document's positions for every field.

use std::sync::Arc;

use aisql_engine::exec::ai_functions::{AiArgs, AiFunction};
use aisql_engine::inference::backend::{
    AiCall, AiRequest, Answer, Doc, InferenceBackend, QueryStart, require_answered,
};
use aisql_engine::inference::prompt::PromptFormat;
use aisql_engine::inference::scheduler::{
    ModelExecutor, ModelSpec, ScheduledBackend, SchedulerConfig, label_probabilities,
    load_model_backend, tiny_model_dir,
};
use aisql_models::{ClassifyRequest, Continuation};
use datafusion::prelude::{col, lit};

const TOLERANCE: f64 = 1e-5;

fn backend(prefix_cache: bool) -> Arc<ScheduledBackend<ModelExecutor>> {
    let spec = ModelSpec {
        model: "tiny".into(),
        gpu: None,
        dtype: None,
        scheduler: SchedulerConfig {
            prefix_cache,
            kv_budget_bytes: 256 << 20,
            ..SchedulerConfig::default()
        },
        kv_budget_from_device: false,
        host_kv_from_memory: false,
        kv_store: None,
    };
    load_model_backend(&spec).unwrap().0
}

/// `function(template?, body, extra...)` as the planner would make it.
fn call(name: &str, args: Vec<datafusion::prelude::Expr>) -> AiCall {
    let function = AiFunction::from_name(name).unwrap();
    AiArgs::parse(function, &args)
        .unwrap()
        .call(
            "op-1",
            PromptFormat::default(),
            vec!["docs".into()],
            vec!["body".into()],
        )
        .unwrap()
}

/// A list literal of strings, as Substrait or constant folding gives one.
fn list(items: &[&str]) -> datafusion::prelude::Expr {
    use datafusion::common::ScalarValue;
    let values: Vec<ScalarValue> = items.iter().map(|s| ScalarValue::from(*s)).collect();
    lit(ScalarValue::List(ScalarValue::new_list_nullable(
        &values,
        &datafusion::arrow::datatypes::DataType::Utf8,
    )))
}

/// Eight reviews, two of them sharing an opening.
fn documents() -> Vec<(String, String)> {
    [
        "A warm, funny film; the cast is superb.",
        "Dull plot and wooden acting. I left early.",
        "The soup was cold but the bread was fresh and cheap.",
        "Service was slow; the waiter forgot our order twice.",
        "Great value: two courses for ten euros, well cooked.",
        "The soup was cold and the fish was worse.",
        "An ambitious sequel that never finds its tone.",
        "Lovely terrace, average coffee, friendly staff.",
    ]
    .iter()
    .enumerate()
    .map(|(i, t)| (format!("d{i}"), t.to_string()))
    .collect()
}

fn requests(docs: &[(String, String)]) -> Vec<AiRequest<'_>> {
    docs.iter()
        .map(|(id, text)| AiRequest {
            anchor: Doc { id, text },
            partner: None,
        })
        .collect()
}

/// The prompt's token ids as the scheduler feeds them: each fixed piece and
/// the document encoded on its own.
fn prompt_ids(tokenizer: &aisql_models::Tokenizer, call: &AiCall, doc: &str) -> Vec<u32> {
    let p = &call.pieces;
    [
        tokenizer.encode(&p.preamble).unwrap(),
        tokenizer.encode_document(doc).unwrap(),
        tokenizer.encode(&p.tail).unwrap(),
    ]
    .concat()
}

#[test]
fn scores_equal_the_softmax_of_the_uncached_heads() {
    let cached = backend(true);
    let (model, tokenizer) = aisql_models::load(
        tiny_model_dir().unwrap().to_str().unwrap(),
        &aisql_models::Device::Cpu,
        None,
    )
    .unwrap();
    let docs = documents();
    let reqs = requests(&docs);

    let score = call(
        "ai_score",
        vec![lit("Is the review {0} positive?"), col("body")],
    );
    let decide = call(
        "ai_filter",
        vec![lit("Is the review {0} positive?"), col("body")],
    );
    let scheduled = cached;
    let cached = scheduled
        .clone()
        .begin(QueryStart {
            calls: vec![score.clone(), decide.clone()],
            spend: None,
            ..QueryStart::default()
        })
        .unwrap();
    let scores = cached.answer(&score, &reqs).unwrap().answers;
    let decisions = cached.answer(&decide, &reqs).unwrap().answers;
    let answer_ids = tokenizer.answer_ids().unwrap().all();
    for (i, (_, text)) in docs.iter().enumerate() {
        let ids = prompt_ids(&tokenizer, &score, text);
        let logits = model
            .next_token_logits(&[Continuation::new(None, &ids)], &answer_ids)
            .unwrap()
            .remove(0);
        let best = |s: &[f32]| s.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let (t, f) = (best(&logits[..4]), best(&logits[4..]));
        let want = t.exp() / (t.exp() + f.exp());
        let Answer::Score(got) = scores[i] else {
            panic!("{:?}", scores[i])
        };
        assert!((got - want).abs() <= TOLERANCE, "doc {i}: {got} vs {want}");
        // The filter of the same prompt says TRUE exactly when P(TRUE) > 0.5.
        assert_eq!(decisions[i], Answer::Bool(got > 0.5), "doc {i}: {got}");
    }

    let labels = ["positive", "negative", "mixed"];
    let args = vec![
        lit("What is the tone of {0}?"),
        col("body"),
        list(&labels),
        list(&["", "", ""]),
    ];
    let probabilities = call("ai_classify_scores", args.clone());
    let classify = call("ai_classify", args);
    let cached = scheduled
        .clone()
        .begin(QueryStart {
            calls: vec![probabilities.clone(), classify.clone()],
            spend: None,
            ..QueryStart::default()
        })
        .unwrap();
    let got = cached.answer(&probabilities, &reqs).unwrap().answers;
    let chosen = cached.answer(&classify, &reqs).unwrap().answers;
    let label_ids: Vec<Vec<u32>> = labels
        .iter()
        .map(|l| tokenizer.encode(&format!(" {l}")).unwrap())
        .collect();
    for (i, (_, text)) in docs.iter().enumerate() {
        let ids = prompt_ids(&tokenizer, &probabilities, text);
        let sums = model
            .classify(&[ClassifyRequest {
                prefix: None,
                prompt: &ids,
                labels: &label_ids,
            }])
            .unwrap()
            .remove(0);
        let want = label_probabilities(&sums);
        let Answer::LabelScores(p) = &got[i] else {
            panic!("{:?}", got[i])
        };
        assert!((p.iter().sum::<f64>() - 1.0).abs() <= 1e-9);
        for (a, b) in p.iter().zip(want.iter()) {
            assert!((a - b).abs() <= TOLERANCE, "doc {i}: {p:?} vs {want:?}");
        }
        // The label ai_classify chooses is the most probable one.
        let best = (0..p.len()).fold(0, |b, j| if p[j] > p[b] { j } else { b });
        assert_eq!(chosen[i], Answer::Label(best as u32), "doc {i}: {p:?}");
    }
}

#[test]
fn generation_over_shared_document_kv_gives_the_uncached_texts() {
    let docs = documents();
    let reqs = requests(&docs);
    let complete = call(
        "ai_complete",
        vec![lit("Summarise the review {0}."), col("body"), lit(6i64)],
    );
    let extract = call(
        "ai_extract",
        vec![
            col("body"),
            list(&[
                "dish: Which dish is named?",
                "price: What did it cost?",
                "tone: One word for the tone?",
            ]),
            lit(5i64),
        ],
    );
    let mut runs = Vec::new();
    for prefix_cache in [true, false] {
        let b = backend(prefix_cache);
        let b = b
            .clone()
            .begin(QueryStart {
                calls: vec![complete.clone(), extract.clone()],
                spend: None,
                ..QueryStart::default()
            })
            .unwrap();
        let texts = b.answer(&complete, &reqs).unwrap().answers;
        let fresh_complete = b.work().fresh();
        let fields = b.answer(&extract, &reqs).unwrap().answers;
        let m = b.work();
        let fresh_extract = m.fresh() - fresh_complete;
        let decoded = m.decoded();
        runs.push((texts, fields, fresh_extract, decoded));
    }
    let (cached, uncached) = (&runs[0], &runs[1]);
    assert_eq!(cached.0, uncached.0, "ai_complete texts");
    assert_eq!(cached.1, uncached.1, "ai_extract fields");
    for a in &cached.1 {
        let Answer::Fields(f) = a else {
            panic!("{a:?}")
        };
        assert_eq!(f.len(), 3);
    }
    // The same tokens decoded either way (decoding is the same work); the
    // document's positions computed once for its three fields, not thrice.
    assert_eq!(cached.3, uncached.3);
    assert!(
        cached.2 < uncached.2,
        "extraction fresh tokens: shared {} vs unshared {}",
        cached.2,
        uncached.2
    );
    eprintln!(
        "ai_extract of 3 fields over 8 documents: {} fresh tokens sharing the document's KV, \
         {} without",
        cached.2, uncached.2
    );
}

#[test]
fn a_generating_call_past_the_context_names_its_row() {
    let b = backend(true);
    let mut complete = call(
        "ai_complete",
        vec![lit("Summarise the review {0}."), col("body")],
    );
    complete.max_tokens = 40_960;
    let docs = documents();
    let b = b.begin(QueryStart::one(&complete)).unwrap();
    // Every row is answered as failed, naming it: what the query does with
    // it is the operator's policy (--on-row-error).
    let answers = b.answer(&complete, &requests(&docs)).unwrap().answers;
    assert_eq!(answers.len(), docs.len());
    for (a, (id, _)) in answers.iter().zip(&docs) {
        let Answer::Failed(reason) = a else {
            panic!("{id}: {a:?}");
        };
        assert!(reason.contains(&format!("row {id} ")), "{reason}");
    }
    let e = require_answered(answers).unwrap_err().to_string();
    assert!(
        e.contains("row d0") && e.contains("max_tokens") && e.contains("40960"),
        "{e}"
    );
}

/// Typed fields of `ai_extract` are decoded in their types' grammars: every
/// answer is a value of its type, the same with the prefix cache on and
/// off, the struct's fields carry the types, and a type that cannot finish
/// within `max_tokens` fails its row naming the field.
#[test]
fn typed_fields_are_values_of_their_types_with_and_without_the_prefix_cache() {
    use aisql_engine::inference::field_type::FieldDecl;
    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::arrow::datatypes::{DataType, Field, Fields};

    let docs = documents();
    let reqs = requests(&docs);
    let questions = [
        "year INT: Which year is it about?",
        "rating DOUBLE: Its rating out of ten?",
        "visited DATE: On which date?",
        "again BOOLEAN: Would the writer come back?",
        "genre ENUM(drama, comedy, 'food & drink'): Which genre?",
        "tone: One word for the tone?",
        "facts STRUCT<n INT, ok BOOLEAN, on DATE>: Its facts?",
        "maybe ENUM(drama, comedy) OR NULL: Which genre, if any?",
    ];
    let extract = call(
        "ai_extract",
        vec![col("body"), list(&questions), lit(64i64)],
    );
    assert_eq!(
        extract.return_type(),
        DataType::Struct(Fields::from(vec![
            Field::new("year", DataType::Int64, true),
            Field::new("rating", DataType::Float64, true),
            Field::new("visited", DataType::Date32, true),
            Field::new("again", DataType::Boolean, true),
            Field::new("genre", DataType::Utf8, true),
            Field::new("tone", DataType::Utf8, true),
            Field::new(
                "facts",
                DataType::Struct(Fields::from(vec![
                    Field::new("n", DataType::Int64, true),
                    Field::new("ok", DataType::Boolean, true),
                    Field::new("on", DataType::Date32, true),
                ])),
                true
            ),
            Field::new("maybe", DataType::Utf8, true),
        ]))
    );
    let mut runs = Vec::new();
    for prefix_cache in [true, false] {
        let b = backend(prefix_cache)
            .begin(QueryStart::one(&extract))
            .unwrap();
        runs.push(b.answer(&extract, &reqs).unwrap().answers);
    }
    assert_eq!(
        runs[0], runs[1],
        "typed fields with and without the prefix cache"
    );
    let decls: Vec<FieldDecl> = extract
        .labels
        .iter()
        .map(|l| FieldDecl::parse(l).unwrap())
        .collect();
    for a in &runs[0] {
        let Answer::Fields(f) = a else {
            panic!("{a:?}")
        };
        for (d, text) in decls.iter().zip(f.iter()) {
            assert!(d.ty.accepts(text), "{d}: {text:?}");
        }
    }
    let column = extract.kind.describe().column(
        &extract.labels,
        extract.max_tokens,
        &runs[0].iter().map(Some).collect::<Vec<_>>(),
    );
    let column = column.unwrap();
    let column = column.as_struct();
    assert_eq!(column.column(0).data_type(), &DataType::Int64);
    assert_eq!(column.column(2).null_count(), 0);
    assert_eq!(column.column(6).null_count(), 0);
    assert_eq!(
        column.column(6).as_struct().column(2).data_type(),
        &DataType::Date32
    );
    eprintln!("typed fields of the first review: {:?}", runs[0][0]);

    // A date takes more than two tokens: no row can finish one.
    let short = call(
        "ai_extract",
        vec![
            col("body"),
            list(&["visited DATE: On which date?"]),
            lit(2i64),
        ],
    );
    let b = backend(true).begin(QueryStart::one(&short)).unwrap();
    for a in b.answer(&short, &reqs).unwrap().answers {
        let Answer::Failed(why) = &a else {
            panic!("{a:?}")
        };
        assert!(
            why.contains("field visited has no whole DATE answer within max_tokens 2"),
            "{why}"
        );
    }
}
