//! Streamed scoring against the materialised comparison: for every one of the
//! 43 plans over the stand-in corpus, a result file equal to the reference,
//! and the same file with rows dropped, rows added, labels changed (with and
//! without the right row alongside) and rows repeated (right rows, and rows
//! with a wrong label, also far apart), must score exactly as when both sides
//! are held in memory, whether the streamed comparison reads the rows as one
//! run or as three side by side; and the streamed path must be the one taken
//! for every plan whose shape allows it.

use std::path::Path;
use std::sync::Arc;

use aisql_bench::corpus::Corpus;
use aisql_bench::plans::PlanSource;
use aisql_bench::quailb::plan::QueryPlan;
use aisql_bench::reference::Reference;
use aisql_bench::scoring::{
    Interner, Tuples, compare_rows, compare_saved_rows, label_columns, reference_rows,
};
use aisql_engine::data::files::write_parquet;
use datafusion::arrow::array::{ArrayRef, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};

fn batch_of(columns: &[String], rows: &[Vec<String>]) -> RecordBatch {
    let schema = Arc::new(Schema::new(
        columns
            .iter()
            .map(|c| Field::new(c, DataType::Utf8, false))
            .collect::<Vec<_>>(),
    ));
    let arrays: Vec<ArrayRef> = (0..columns.len())
        .map(|c| {
            Arc::new(StringArray::from(
                rows.iter().map(|r| r[c].as_str()).collect::<Vec<_>>(),
            )) as ArrayRef
        })
        .collect();
    RecordBatch::try_new(schema, arrays).unwrap()
}

/// `batch` as three consecutive runs (the first may be empty), each with the
/// index of its first row, as a file read in parts hands them out.
fn in_three_runs(
    batch: &RecordBatch,
) -> Vec<(
    u64,
    std::vec::IntoIter<aisql_bench::error::Result<RecordBatch>>,
)> {
    let n = batch.num_rows();
    let cuts = [0, n / 3, 2 * n / 3, n];
    cuts.windows(2)
        .map(|w| {
            (
                w[0] as u64,
                vec![Ok(batch.slice(w[0], w[1] - w[0]))].into_iter(),
            )
        })
        .collect()
}

/// The variants of a reference result that scoring must tell apart.
fn variants(plan: &QueryPlan, rows: &[Vec<String>]) -> Vec<(&'static str, Vec<Vec<String>>)> {
    let names = plan.output_names();
    let labels = label_columns(plan);
    let label_col = names.iter().position(|n| labels.contains(n));
    let mut out = vec![("equal", rows.to_vec())];
    if rows.is_empty() {
        out.push((
            "one invented row",
            vec![vec!["nobody".to_string(); names.len()]],
        ));
        return out;
    }
    let mut dropped = rows.to_vec();
    dropped.truncate(rows.len() / 2);
    out.push(("half dropped", dropped));
    let mut added = rows.to_vec();
    added.push(vec!["nobody".to_string(); names.len()]);
    out.push(("one invented row", added));
    let mut repeated = rows.to_vec();
    repeated.extend(rows.iter().take(3).cloned());
    out.push(("rows repeated", repeated));
    // Ids of two reference rows crossed: documents that may not form a row.
    if rows.len() > 1 && names.len() > 1 {
        let mut crossed = rows.to_vec();
        let mut row = rows[0].clone();
        row[0] = rows[rows.len() - 1][0].clone();
        crossed.push(row);
        out.push(("ids crossed", crossed));
    }
    if let Some(c) = label_col {
        let mut relabelled = rows.to_vec();
        relabelled[0][c] = "not a label".to_string();
        out.push(("one label wrong", relabelled));
        let mut both = rows.to_vec();
        let mut wrong = rows[0].clone();
        wrong[c] = "not a label".to_string();
        both.push(wrong.clone());
        out.push(("wrong label beside the right row", both.clone()));
        // The same wrong row first and last: in different runs of a file read
        // in parts.
        let mut apart = vec![wrong.clone()];
        apart.extend(rows.iter().cloned());
        apart.push(wrong.clone());
        both.push(wrong);
        both.extend(rows.iter().rev().take(2).cloned());
        out.push(("wrong label and right rows repeated", both));
        out.push(("wrong label repeated apart", apart));
    }
    out
}

#[test]
fn streamed_scoring_equals_the_materialised_comparison_on_all_43_plans() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("quailb");
    aisql_standin::generate(&root, 0.01).unwrap();
    let dataset = aisql_bench::resolve::resolve(Some(&root), 0.01, None).unwrap();
    let plans = PlanSource::Embedded
        .select(None, Default::default())
        .unwrap();
    assert_eq!(plans.len(), 43);
    let templates = aisql_bench::driver::templates_of(plans.iter().map(|(_, p)| p));
    let labels = dataset.load_labels(Some(&templates)).unwrap();
    let corpus = Corpus::new(dataset.tables.clone());
    let (mut streamed, mut nonempty) = (0, 0);
    for (id, plan) in &plans {
        let mut interner = Interner::default();
        let expected = reference_rows(plan, &labels, &corpus, &mut interner).unwrap();
        let mut rows: Vec<Vec<String>> = expected
            .rows
            .iter()
            .map(|r| r.iter().map(|&v| interner.get(v).to_string()).collect())
            .collect();
        rows.sort();
        nonempty += usize::from(!rows.is_empty());
        let reference = Reference::build(plan, &labels, &corpus).unwrap();
        for (what, variant) in variants(plan, &rows) {
            let path = tmp.path().join(format!("{id}-rows.parquet"));
            let batch = batch_of(&expected.columns, &variant);
            write_parquet(&path, &batch).unwrap();
            let got = compare_saved_rows(plan, &labels, &corpus, &path).unwrap();
            let mut interner = Interner::default();
            let predicted = Tuples::from_batch(&batch, &mut interner).unwrap();
            let want_ref = reference_rows(plan, &labels, &corpus, &mut interner).unwrap();
            let (output, assessment) = compare_rows(&predicted, &want_ref, &label_columns(plan));
            assert_eq!(got, (Some(output), assessment), "{id}, {what}");
            let rows = Some(batch.num_rows() as u64);
            let split = reference
                .compare_stream(&expected.columns, rows, || Ok(in_three_runs(&batch)))
                .unwrap();
            if let Some((output, assessment)) = split {
                assert_eq!(
                    got,
                    (Some(output), assessment),
                    "{id}, {what}, in three runs"
                );
            }
            if what == "equal" {
                let exact = got.0.as_ref().is_some_and(|o| o.exact_match);
                assert!(exact, "{id}: the reference scores as exact");
                let direct = reference
                    .compare_stream(&expected.columns, None, || {
                        Ok(vec![(0, std::iter::once(Ok(batch.clone())))])
                    })
                    .unwrap();
                streamed += usize::from(direct.is_some());
            }
        }
        std::fs::remove_file(Path::new(&tmp.path().join(format!("{id}-rows.parquet")))).ok();
    }
    assert!(nonempty > 30, "only {nonempty} plans have reference rows");
    assert_eq!(streamed, 43, "every QUAIL-B plan is scored streamed");
}
