//! QUAIL-B queries written in SQL (`tests/sql/quailb/<ID>.sql`) against their
//! Substrait plans, over the tiny labelled corpus: the same rows, the same
//! answer tables (operator ids, tuples, answers), and in simulation the same
//! fresh tokens — the scheduler sees the same AI operators from either front end.

mod common;

use std::path::Path;
use std::sync::Arc;

use aisql_bench::quailb::oracle::OracleBackend;
use aisql_engine::exec::answers::AnswerTable;
use aisql_engine::inference::backend::InferenceBackend;
use aisql_engine::inference::scheduler::{SchedulerConfig, simulation_backend};
use aisql_engine::sql::options::QueryOptions;
use aisql_engine::sql::{Evaluation, SqlSession};
use common::*;

fn sql_of(id: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/sql/quailb/{id}.sql")),
    )
    .unwrap()
}

/// An answer table as sorted (tuple, answer) lines.
fn answer_lines(t: &AnswerTable) -> Vec<String> {
    let mut lines: Vec<String> = (0..t.len())
        .map(|row| {
            let ids: Vec<&str> = t.ids.iter().map(|c| c[row].as_str()).collect();
            let answer = match (t.decision(row), t.label(row)) {
                (Some(b), _) => b.to_string(),
                (_, Some(l)) => l.to_string(),
                _ => format!("{:?}", t.answers[row]),
            };
            format!("{} = {answer}", ids.join(","))
        })
        .collect();
    lines.sort();
    lines
}

async fn sql_session(
    backend: Arc<dyn InferenceBackend>,
    corpus: &TinyCorpus,
    options: &QueryOptions,
) -> SqlSession {
    let s = SqlSession::new(backend, options.clone(), Evaluation::Operators).unwrap();
    for (name, path) in corpus.paths() {
        s.register(&name, &path).await.unwrap();
        s.set_unique_ids(&name);
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_spellings_of_quailb_queries_match_their_plans() {
    let ids = [
        "IMDB-1", "IMDB-3", "IMDB-7", "IMDB-11", "IMDB-13", "IMDB-15", "FEV-8", "FEV-10",
        "AGENT-1", "AGENT-4", "BIO-2",
    ];
    let dir = tempfile::tempdir().unwrap();
    let corpus = TinyCorpus::write(dir.path());
    let plans = load_plans(&ids);
    let (store, _) = draw_labels(&corpus, &plans);
    let store = Arc::new(store);
    let mut nonempty = 0;
    // A KV budget far below the documents too: eviction must not tell the two apart.
    for kv_budget_bytes in [usize::MAX / 2, 4 << 20] {
        let config = SchedulerConfig {
            prefix_cache: true,
            lookahead: true,
            kv_budget_bytes,
            host_kv_budget_bytes: 0,
            batch_tokens: 512,
        };
        let backend =
            simulation_backend(Arc::new(OracleBackend::new(store.clone())), config, 1024).unwrap();
        let options = QueryOptions {
            batch_rows: 16,
            ..Default::default()
        };
        let sql = sql_session(backend.clone(), &corpus, &options).await;
        for (id, plan) in ids.iter().zip(&plans) {
            let want = collect_query(plan, &corpus.paths(), backend.clone(), &options)
                .await
                .unwrap_or_else(|e| panic!("{id} (Substrait): {e}"));
            let got = sql
                .run(&sql_of(id))
                .await
                .unwrap_or_else(|e| panic!("{id} (SQL): {e}"));
            let rows = got.rows().unwrap();
            let names: Vec<&String> = rows
                .schema_ref()
                .fields()
                .iter()
                .map(|f| f.name())
                .collect();
            assert_eq!(
                names,
                plan.output_names().iter().collect::<Vec<_>>(),
                "{id}: columns"
            );
            let mut got_rows = result_rows(&rows);
            got_rows.sort();
            let mut want_rows = result_rows(&want.rows);
            want_rows.sort();
            assert_eq!(got_rows, want_rows, "{id}: rows");
            nonempty += usize::from(!want_rows.is_empty());
            let op_ids = |t: &[AnswerTable]| t.iter().map(|t| t.op_id.clone()).collect::<Vec<_>>();
            assert_eq!(
                op_ids(&got.answers),
                op_ids(&want.answers),
                "{id}: operators"
            );
            for (g, w) in got.answers.iter().zip(&want.answers) {
                assert_eq!(g.kind, w.kind, "{id} {}", w.op_id);
                assert_eq!(
                    answer_lines(g),
                    answer_lines(w),
                    "{id} {}: answers",
                    w.op_id
                );
            }
            assert_eq!(
                got.measurements.fresh_tokens, want.measurements.fresh_tokens,
                "{id}: fresh tokens (KV budget {kv_budget_bytes} bytes)"
            );
        }
    }
    assert!(nonempty >= 14, "only {nonempty} runs had rows");
}

/// A correlated `EXISTS` whose AI join reads the subquery's documents keys
/// them by their ids, as the join written by hand does: the labelled oracle
/// (which answers by document id) answers it, with the hand-written join's
/// rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_correlated_exists_with_an_ai_join_keys_partners_by_id() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = TinyCorpus::write(dir.path());
    let (store, _) = draw_labels(&corpus, &load_plans(&["IMDB-3"]));
    let backend = Arc::new(OracleBackend::new(Arc::new(store)));
    let options = QueryOptions::default();
    let sql = sql_session(backend, &corpus, &options).await;
    let aspects = sql
        .run("SELECT aspect FROM aspects ORDER BY id LIMIT 3")
        .await
        .unwrap();
    let aspects: Vec<String> = result_rows(&aspects.rows().unwrap())
        .into_iter()
        .map(|row| format!("'{}'", row[0].replace('\'', "''")))
        .collect();
    let aspects = aspects.join(", ");
    let join = "ai_join('Does the review in DOCUMENT {0} discuss the movie aspect in DOCUMENT {1}?', r.body, a.aspect)";
    let run = |query: String| {
        let sql = &sql;
        async move {
            let out = sql
                .run(&query)
                .await
                .unwrap_or_else(|e| panic!("{query}: {e}"));
            let mut rows = result_rows(&out.rows().unwrap());
            rows.sort();
            rows
        }
    };
    let correlated = run(format!(
        "SELECT r.id FROM reviews r WHERE EXISTS \
         (SELECT 1 FROM aspects a WHERE a.aspect IN ({aspects}) AND {join})"
    ))
    .await;
    let by_hand = run(format!(
        "SELECT DISTINCT r.id FROM reviews r JOIN aspects a ON {join} \
         WHERE a.aspect IN ({aspects})"
    ))
    .await;
    assert!(!by_hand.is_empty(), "no review discusses {aspects}");
    assert_eq!(correlated, by_hand);
    // NOT EXISTS keeps the other reviews.
    let not_exists = run(format!(
        "SELECT r.id FROM reviews r WHERE NOT EXISTS \
         (SELECT 1 FROM aspects a WHERE a.aspect IN ({aspects}) AND {join})"
    ))
    .await;
    let all = run("SELECT id FROM reviews".into()).await;
    assert_eq!(correlated.len() + not_exists.len(), all.len());
    assert!(not_exists.iter().all(|r| !correlated.contains(r)));
}
