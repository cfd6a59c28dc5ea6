//! All 43 QUAIL-B plans run with the oracle backend over a tiny labelled corpus,
//! and their rows equal the reference result that the test computes itself from
//! the labels (SPEC §D.2).

mod common;

use std::collections::HashSet;
use std::sync::Arc;

use aisql_bench::quailb::oracle::OracleBackend;
use aisql_engine::inference::backend::AiKind;
use aisql_engine::sql::options::QueryOptions;
use common::*;

#[tokio::test]
async fn every_catalog_query_matches_the_reference_result() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = TinyCorpus::write(dir.path());
    let ids = catalog_ids();
    assert_eq!(ids.len(), 43);
    let plans = load_plans(&ids);
    let (store, labels) = draw_labels(&corpus, &plans);
    let backend = Arc::new(OracleBackend::new(Arc::new(store)));
    let mut nonempty = 0;
    // One batch per table, and many small batches streamed through the operators.
    for batch_rows in [256, 3] {
        let options = QueryOptions {
            batch_rows,
            ..Default::default()
        };
        for (id, q) in ids.iter().zip(&plans) {
            let out = collect_query(q, &corpus.paths(), backend.clone(), &options)
                .await
                .unwrap_or_else(|e| panic!("{id} (batches of {batch_rows}): {e}"));
            let names: Vec<String> = out
                .rows
                .schema()
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect();
            assert_eq!(names, q.output_names(), "{id}: output columns");
            let expected = reference_rows(q, &corpus, &labels);
            let got = result_rows(&out.rows);
            assert_eq!(
                got.len(),
                out.rows.num_rows(),
                "{id}: duplicate result rows"
            );
            assert_eq!(
                got, expected,
                "{id} (batches of {batch_rows}): rows differ from the reference"
            );
            nonempty += usize::from(!expected.is_empty() && batch_rows == 256);
            // Answer tables: one per AI operator, each tuple once.
            let ai_ops = q
                .operators
                .iter()
                .filter(|o| o.template().is_some())
                .count();
            assert_eq!(out.answers.len(), ai_ops, "{id}");
            for t in &out.answers {
                let mut seen = HashSet::new();
                for row in 0..t.len() {
                    let key: Vec<&str> = t.ids.iter().map(|c| c[row].as_str()).collect();
                    assert!(seen.insert(key), "{id} {}: duplicate tuple", t.op_id);
                }
                assert_eq!(t.answers.len(), t.len());
                match t.kind {
                    AiKind::Classify => assert!((0..t.len()).all(|r| t.label(r).is_some())),
                    _ => assert!((0..t.len()).all(|r| t.decision(r).is_some())),
                }
            }
        }
    }
    assert!(
        nonempty >= 35,
        "only {nonempty} queries had rows: the corpus is too sparse to test"
    );
}
