//! The model backend on the tiny Qwen3 over a small stand-in corpus:
//! - the prefix-cached path and `--prefix-cache off` give identical answers
//!   (filter chain, join, three-join chain, two aliases of one table, joined-row
//!   classification, agent traces, chained classifications);
//! - fresh tokens with the cache off equal the input tokens, and with the cache on
//!   never fall below — and here equal — the QUAIL-B minimum, which the test
//!   computes itself from the answer tables and the documents' tokens;
//! - the simulation (scheduler over a virtual KV, answers from labels) reports
//!   the same fresh tokens as the model when given the model's answers.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;

use aisql_bench::layout::Dataset;
use aisql_bench::quailb::labels::{LabelSet, LabelStore, LabelValue, PredicateInfo};
use aisql_bench::quailb::oracle::OracleBackend;
use aisql_bench::quailb::plan::{Operator, QueryPlan};
use aisql_bench::quailb::query::{QueryOutput, run_query};
use aisql_engine::exec::answers::AnswerTable;
use aisql_engine::inference::backend::{AiKind, InferenceBackend};
use aisql_engine::inference::prompt::PromptFormat;
use aisql_engine::inference::scheduler::{
    Executor, ModelSpec, SchedulerConfig, load_model_backend, simulation_backend,
};
use aisql_engine::sql::options::QueryOptions;
use aisql_models::Tokenizer;
use datafusion::arrow::array::AsArray;

const SF: f64 = 0.0005;
const QUERIES: [&str; 9] = [
    "IMDB-7", "IMDB-4", "FEV-8", "FEV-9", "IMDB-8", "IMDB-15", "AGENT-1", "AGENT-4", "FEV-10",
];

fn plans_dir() -> std::path::PathBuf {
    aisql_bench::plans::repository_plans_dir()
}

fn config(prefix_cache: bool) -> SchedulerConfig {
    SchedulerConfig {
        prefix_cache,
        lookahead: true,
        kv_budget_bytes: 4 << 30,
        host_kv_budget_bytes: 0,
        batch_tokens: 4096,
    }
}

/// Document texts of a table: id -> text of `column`.
fn texts(path: &Path, column: &str) -> HashMap<String, String> {
    let batch = aisql_engine::data::files::read_parquet(path).unwrap();
    let ids = batch
        .column_by_name("id")
        .unwrap()
        .as_string::<i32>()
        .clone();
    let text = batch
        .column_by_name(column)
        .unwrap()
        .as_string::<i32>()
        .clone();
    (0..batch.num_rows())
        .map(|i| (ids.value(i).to_string(), text.value(i).to_string()))
        .collect()
}

/// Number of distinct prefixes of a set of sequences.
fn trie_size(mut seqs: Vec<Vec<u32>>) -> usize {
    seqs.sort();
    seqs.dedup();
    let total: usize = seqs.iter().map(Vec::len).sum();
    let shared: usize = seqs
        .windows(2)
        .map(|w| w[0].iter().zip(&w[1]).take_while(|(a, b)| a == b).count())
        .sum();
    total - shared
}

struct Tokens<'a> {
    tok: &'a Tokenizer,
    dataset: &'a Dataset,
    cache: HashMap<(String, String), HashMap<String, Vec<u32>>>,
}

impl Tokens<'_> {
    fn doc(&mut self, table: &str, column: &str, id: &str) -> Vec<u32> {
        let key = (table.to_string(), column.to_string());
        if !self.cache.contains_key(&key) {
            let t = texts(&self.dataset.tables[table], column);
            let ids: Vec<&String> = t.keys().collect();
            let strs: Vec<&str> = ids.iter().map(|i| t[*i].as_str()).collect();
            let enc = self.tok.encode_batch(&strs).unwrap();
            let map = ids.into_iter().cloned().zip(enc).collect();
            self.cache.insert(key.clone(), map);
        }
        self.cache[&key][id].clone()
    }
}

/// (input tokens, minimum tokens by the 43-query rule) of a query's answers.
fn input_and_minimum(q: &QueryPlan, out: &QueryOutput, tokens: &mut Tokens<'_>) -> (usize, usize) {
    let enc = |s: &str| tokens.tok.encode(s).unwrap();
    let mut input = 0;
    // A document: ("table.column", row id).
    type Subject = (String, String);
    let mut subjects: BTreeMap<Subject, Vec<u32>> = BTreeMap::new();
    let mut suffixes: BTreeMap<Subject, Vec<Vec<u32>>> = BTreeMap::new();
    let mut groups: BTreeMap<(Subject, Vec<u32>), (usize, BTreeSet<Subject>)> = BTreeMap::new();
    for table in &out.answers {
        let op = q.operator(&table.op_id).unwrap();
        let pieces = op.prompt_pieces(PromptFormat::RawV1).unwrap().unwrap();
        let (pre, frame, label, tail) = (
            enc(&pieces.preamble),
            enc(&pieces.frame),
            enc(&pieces.label),
            enc(&pieces.tail),
        );
        let rel = |alias: &str| q.relation(alias).unwrap().clone();
        let anchor = rel(&table.aliases[0]);
        for row in 0..table.len() {
            let a_id = &table.ids[0][row];
            let a = tokens.doc(&anchor.table, &anchor.text_column, a_id);
            let a_key = (
                format!("{}.{}", anchor.table, anchor.text_column),
                a_id.clone(),
            );
            subjects.insert(a_key.clone(), [pre.clone(), a.clone()].concat());
            input += pre.len() + a.len() + frame.len() + tail.len();
            if pieces.pair {
                let partner = rel(&table.aliases[1]);
                let p_id = &table.ids[1][row];
                let p = tokens.doc(&partner.table, &partner.text_column, p_id);
                input += label.len() + p.len();
                suffixes
                    .entry(a_key.clone())
                    .or_default()
                    .push(frame.clone());
                let group_key = [
                    frame.clone(),
                    vec![u32::MAX],
                    label.clone(),
                    vec![u32::MAX],
                    tail.clone(),
                ]
                .concat();
                let g = groups
                    .entry((a_key, group_key))
                    .or_insert((label.len() + tail.len(), BTreeSet::new()));
                g.1.insert((
                    format!("{}.{}", partner.table, partner.text_column),
                    p_id.clone(),
                ));
            } else {
                suffixes.entry(a_key).or_default().push(tail.clone());
            }
        }
    }
    let part1 = trie_size(subjects.into_values().collect());
    let part2: usize = suffixes.into_values().map(trie_size).sum();
    let mut part3 = 0;
    for ((_, _), (fixed, partners)) in groups {
        for (tc, id) in &partners {
            let (t, c) = tc.split_once('.').unwrap();
            part3 += fixed + tokens.doc(t, c, id).len();
        }
    }
    (input, part1 + part2 + part3)
}

fn fresh(out: &QueryOutput) -> usize {
    out.measurements.fresh() as usize
}

/// A label store holding exactly the answers of `out` (so an oracle repeats them).
fn labels_from_answers(q: &QueryPlan, outs: &[&QueryOutput]) -> LabelStore {
    let mut sets: BTreeMap<String, LabelSet> = BTreeMap::new();
    let mut seen: BTreeSet<(String, String, String)> = BTreeSet::new();
    for out in outs {
        for t in &out.answers {
            let op = q.operator(&t.op_id).unwrap();
            let template = op.template().unwrap().to_string();
            let kind = t.kind;
            let labels = match op {
                Operator::Classify { labels, .. } => labels.clone(),
                _ => vec![],
            };
            let set = sets.entry(template.clone()).or_insert_with(|| {
                LabelSet::new(
                    PredicateInfo {
                        key: t.op_id.clone(),
                        kind,
                        template: template.clone(),
                        left_table: String::new(),
                        left_column: String::new(),
                        right_table: None,
                        right_column: None,
                        descriptions: labels.iter().map(|_| String::new()).collect(),
                        labels,
                    },
                    "ls_model",
                )
            });
            for row in 0..t.len() {
                let l = &t.ids[0][row];
                let r = t.ids.get(1).map(|c| c[row].clone());
                if !seen.insert((template.clone(), l.clone(), r.clone().unwrap_or_default())) {
                    continue;
                }
                let value = match t.kind {
                    AiKind::Classify => LabelValue::Label(t.label(row).unwrap().to_string()),
                    _ => LabelValue::Bool(t.decision(row).unwrap()),
                };
                set.insert(l, r.as_deref(), value).unwrap();
            }
        }
    }
    let mut store = LabelStore::new("gt_model_answers", "tiny");
    for s in sets.into_values() {
        store.insert(s).unwrap();
    }
    store
}

fn same_answers(a: &[AnswerTable], b: &[AnswerTable], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (x, y) in a.iter().zip(b) {
        let key = |t: &AnswerTable| -> BTreeMap<Vec<String>, String> {
            (0..t.len())
                .map(|r| {
                    let ids = t.ids.iter().map(|c| c[r].clone()).collect();
                    let v = if t.kind == AiKind::Classify {
                        t.label(r).unwrap().to_string()
                    } else {
                        format!("{:?}", t.answers[r])
                    };
                    (ids, v)
                })
                .collect()
        };
        assert_eq!(key(x), key(y), "{what} {}", x.op_id);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_equals_uncached_and_fresh_tokens_meet_the_minimum() {
    let dir = tempfile::tempdir().unwrap();
    aisql_standin::generate(dir.path(), SF).unwrap();
    let dataset = Dataset::open(dir.path(), SF, None).unwrap();
    let tok = Tokenizer::vendored().unwrap();
    let mut tokens = Tokens {
        tok: &tok,
        dataset: &dataset,
        cache: HashMap::new(),
    };
    let spec = |cache: bool| ModelSpec {
        model: "tiny".into(),
        gpu: None,
        dtype: None,
        scheduler: config(cache),
        kv_budget_from_device: true, // on the CPU: keeps config(cache)'s budget
        host_kv_from_memory: false,
        kv_store: None,
    };
    let (cached, _) = load_model_backend(&spec(true)).unwrap();
    let (uncached, _) = load_model_backend(&spec(false)).unwrap();
    let options = QueryOptions::default();
    let mut shared_prefix_seen = false;
    for id in QUERIES {
        let q = QueryPlan::from_file(&plans_dir().join(format!("{id}.json"))).unwrap();
        let (c_rows, c) = run_query(
            &q,
            &dataset.tables,
            cached.clone() as Arc<dyn InferenceBackend>,
            &options,
        )
        .await
        .unwrap();
        let (o_rows, o) = run_query(
            &q,
            &dataset.tables,
            uncached.clone() as Arc<dyn InferenceBackend>,
            &options,
        )
        .await
        .unwrap();
        same_answers(&c.answers, &o.answers, id);
        assert_eq!(c_rows, o_rows, "{id}: rows");
        let (input, minimum) = input_and_minimum(&q, &c, &mut tokens);
        assert_eq!(
            fresh(&o),
            input,
            "{id}: without the cache every input token is fresh"
        );
        assert!(
            fresh(&c) >= minimum,
            "{id}: fresh {} below the minimum {minimum}",
            fresh(&c)
        );
        assert_eq!(
            fresh(&c),
            minimum,
            "{id}: regret with an unlimited KV budget (input {input})"
        );
        shared_prefix_seen |= id == "AGENT-1" && minimum * 2 < input;

        // The simulation, fed the model's answers, schedules the same work.
        let store = Arc::new(labels_from_answers(&q, &[&c]));
        let sim = simulation_backend(
            Arc::new(OracleBackend::new(store)),
            config(true),
            cached.executor().kv_bytes_per_token(),
        )
        .unwrap();
        let (_, s) = run_query(
            &q,
            &dataset.tables,
            sim as Arc<dyn InferenceBackend>,
            &options,
        )
        .await
        .unwrap();
        same_answers(&c.answers, &s.answers, id);
        assert_eq!(
            fresh(&s),
            fresh(&c),
            "{id}: simulation and model fresh tokens"
        );
        eprintln!(
            "{id}: input {input} minimum {minimum} fresh {} (cached {:.2} s, uncached {:.2} s)",
            fresh(&c),
            c.runtime_s,
            o.runtime_s
        );
    }
    assert!(
        shared_prefix_seen,
        "agent-trace snapshots should share most of their tokens"
    );
}

#[tokio::test]
async fn a_document_larger_than_the_kv_budget_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    aisql_standin::generate(dir.path(), SF).unwrap();
    let dataset = Dataset::open(dir.path(), SF, None).unwrap();
    let spec = ModelSpec {
        model: "tiny".into(),
        gpu: None,
        dtype: None,
        scheduler: SchedulerConfig {
            prefix_cache: true,
            lookahead: true,
            kv_budget_bytes: 64 * 1024,
            host_kv_budget_bytes: 0,
            batch_tokens: 4096,
        },
        kv_budget_from_device: false,
        host_kv_from_memory: false,
        kv_store: None,
    };
    let (backend, _) = load_model_backend(&spec).unwrap();
    let q = QueryPlan::from_file(&plans_dir().join("AGENT-1.json")).unwrap();
    let err = run_query(
        &q,
        &dataset.tables,
        backend as Arc<dyn InferenceBackend>,
        &QueryOptions::default(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("over the KV budget") && err.contains("agent_traces"),
        "{err}"
    );
}
