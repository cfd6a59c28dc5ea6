//! `ai_search` through a [`SqlSession`] (no model: the query is a vector):
//! its rows are `ORDER BY cosine_distance(...) LIMIT k`'s, exactly, on a
//! small table and through the graph on a large one; an empty table gives no
//! rows, k past the table every row, NULL vectors are skipped, and every bad
//! argument is an error naming it.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, FixedSizeListArray, Float32Array, Float64Array, Int64Array, ListArray, RecordBatch,
    StringArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Float64Type, Schema};
use datafusion::datasource::MemTable;

use crate::error::Result;
use crate::inference::backend::NoAnswers;
use crate::sql::options::QueryOptions;
use crate::sql::{Evaluation, SqlSession};
use aisql_vector::sample::random;

fn session() -> SqlSession {
    SqlSession::new(
        Arc::new(NoAnswers),
        QueryOptions::default(),
        Evaluation::Operators,
    )
    .expect("session")
}

/// Registers `name` with `id` (0, 1, ...) and `v`, a FLOAT[dims] column of
/// `vectors` (None: NULL), in batches of `batch` rows.
fn fixed_table(
    s: &SqlSession,
    name: &str,
    dims: usize,
    vectors: &[Option<Vec<f32>>],
    batch: usize,
) {
    let item = Arc::new(Field::new("item", DataType::Float32, true));
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new(
            "v",
            DataType::FixedSizeList(item.clone(), dims as i32),
            true,
        ),
        Field::new("label", DataType::Utf8, false),
    ]));
    let mut batches = Vec::new();
    for (c, chunk) in vectors.chunks(batch.max(1)).enumerate() {
        let start = c * batch;
        let ids = Int64Array::from_iter_values((start..start + chunk.len()).map(|i| i as i64));
        let values: Vec<f32> = chunk
            .iter()
            .flat_map(|v| v.clone().unwrap_or_else(|| vec![0.0; dims]))
            .collect();
        let nulls: Vec<bool> = chunk.iter().map(Option::is_some).collect();
        let v = FixedSizeListArray::new(
            item.clone(),
            dims as i32,
            Arc::new(Float32Array::from(values)),
            Some(nulls.into()),
        );
        let labels =
            StringArray::from_iter_values((start..start + chunk.len()).map(|i| format!("r{i}")));
        batches.push(
            RecordBatch::try_new(
                schema.clone(),
                vec![Arc::new(ids), Arc::new(v), Arc::new(labels)],
            )
            .unwrap(),
        );
    }
    let partitions = if batches.is_empty() {
        vec![vec![]]
    } else {
        vec![batches]
    };
    let table = MemTable::try_new(schema, partitions).unwrap();
    s.context().register_table(name, Arc::new(table)).unwrap();
}

/// Registers `name` with `id` and `v`, a DOUBLE[] column (any lengths, NULLs).
fn list_table(s: &SqlSession, name: &str, vectors: Vec<Option<Vec<Option<f64>>>>) {
    let ids = Int64Array::from_iter_values(0..vectors.len() as i64);
    let v = ListArray::from_iter_primitive::<Float64Type, _, _>(vectors);
    let batch = RecordBatch::try_from_iter(vec![
        ("id", Arc::new(ids) as ArrayRef),
        ("v", Arc::new(v) as ArrayRef),
    ])
    .unwrap();
    s.context().register_batch(name, batch).unwrap();
}

fn run(s: &SqlSession, sql: &str) -> Result<Vec<RecordBatch>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    Ok(rt.block_on(s.run(sql))?.batches)
}

/// `(id, distance)` of each row of `sql`, whose first two columns they are.
fn ids_and_distances(s: &SqlSession, sql: &str) -> Vec<(i64, f64)> {
    let batches = run(s, sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    let mut out = Vec::new();
    for b in &batches {
        let ids = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
        let d = b.column(1).as_any().downcast_ref::<Float64Array>().unwrap();
        for i in 0..b.num_rows() {
            out.push((ids.value(i), d.value(i)));
        }
    }
    out
}

fn error(s: &SqlSession, sql: &str) -> String {
    match run(s, sql) {
        Ok(rows) => panic!("{sql} gave {rows:?}"),
        Err(e) => e.to_string(),
    }
}

/// `v` as a SQL list literal. Components are rounded to multiples of 1/1024,
/// which f32 and f64 hold alike, so that `ai_search` (which reads the query
/// as f32) and `cosine_distance` (f64) search for the same vector.
fn literal(v: &[f32]) -> String {
    let parts: Vec<String> = v
        .iter()
        .map(|x| format!("{:?}", (f64::from(*x) * 1024.0).round() / 1024.0))
        .collect();
    format!("[{}]", parts.join(", "))
}

fn rows_of(flat: &[f32], dims: usize) -> Vec<Option<Vec<f32>>> {
    flat.chunks_exact(dims).map(|c| Some(c.to_vec())).collect()
}

/// ai_search's rows and distances against the exact query in SQL.
fn assert_matches_order_by(s: &SqlSession, table: &str, q: &[f32], k: usize, exact: bool) {
    let q = literal(q);
    let method = if exact { "" } else { ", 'hnsw'" };
    let found = ids_and_distances(
        s,
        &format!("SELECT id, distance FROM ai_search('{table}', 'v', {q}, {k}{method})"),
    );
    let want = ids_and_distances(
        s,
        &format!(
            "SELECT id, cosine_distance(v, {q}) AS d FROM {table} \
             WHERE v IS NOT NULL ORDER BY d, id LIMIT {k}"
        ),
    );
    if exact {
        assert_eq!(found.len(), want.len());
        if let Some(i) = (0..found.len()).find(|&i| found[i] != want[i]) {
            panic!("row {i}: ai_search {:?}, ORDER BY {:?}", found[i], want[i]);
        }
    } else {
        // Distances exact, membership approximate.
        let want_ids: std::collections::HashSet<i64> = want.iter().map(|r| r.0).collect();
        let hit = found.iter().filter(|r| want_ids.contains(&r.0)).count();
        assert!(hit * 10 >= want.len() * 9, "{hit} of {}", want.len());
        let sorted = found.windows(2).all(|w| w[0].1 <= w[1].1);
        assert!(sorted, "{found:?}");
    }
}

#[test]
fn small_table_is_searched_exactly() {
    let s = session();
    let dims = 8;
    fixed_table(&s, "docs", dims, &rows_of(&random(11, 500, dims), dims), 64);
    for q in random(12, 5, dims).chunks_exact(dims) {
        assert_matches_order_by(&s, "docs", q, 10, true);
    }
    // All the table's columns and the distance, in the table's order.
    let batches = run(
        &s,
        &format!(
            "SELECT * FROM ai_search('docs', 'v', {}, 3)",
            literal(&[1.0; 8])
        ),
    )
    .unwrap();
    let names: Vec<String> = batches[0]
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(names, ["id", "v", "label", "distance"]);
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 3);
    // Projections, filters and joins around it.
    let rows = ids_and_distances(
        &s,
        &format!(
            "SELECT s.id, s.distance FROM ai_search('docs', 'v', make_array({}), 5) s \
             JOIN docs d ON d.id = s.id WHERE s.distance >= 0 ORDER BY s.distance",
            ["0.5"; 8].join(", ")
        ),
    );
    assert_eq!(rows.len(), 5);
}

#[test]
fn large_table_is_searched_through_the_graph() {
    let s = session();
    let dims = 16;
    let n = 12_000; // above FLAT_BELOW
    fixed_table(&s, "big", dims, &rows_of(&random(21, n, dims), dims), 4096);
    for q in random(22, 3, dims).chunks_exact(dims) {
        assert_matches_order_by(&s, "big", q, 10, false);
    }
    // k past the table: every row, exactly ordered.
    let q = random(23, 1, dims);
    assert_matches_order_by(&s, "big", &q, n + 5, true);
    // Without 'hnsw' the search is exact, whatever the table's size.
    for q in random(24, 2, dims).chunks_exact(dims) {
        assert_matches_order_by(&s, "big", q, 10, true);
    }
    let q = literal(&random(25, 1, dims));
    let explained = run(
        &s,
        &format!("EXPLAIN SELECT id FROM ai_search('big', 'v', {q}, 10, 'hnsw')"),
    )
    .unwrap();
    let plan = datafusion::arrow::util::pretty::pretty_format_batches(&explained)
        .unwrap()
        .to_string();
    assert!(plan.contains("search=hnsw (approximate"), "{plan}");
}

#[test]
fn empty_table_large_k_and_null_vectors() {
    let s = session();
    fixed_table(&s, "empty", 4, &[], 8);
    let q = literal(&[1.0, 0.0, 0.0, 0.0]);
    assert!(
        ids_and_distances(
            &s,
            &format!("SELECT id, distance FROM ai_search('empty', 'v', {q}, 5)")
        )
        .is_empty()
    );

    let rows = vec![
        Some(vec![1.0, 0.0, 0.0, 0.0]),
        None,
        Some(vec![0.0, 1.0, 0.0, 0.0]),
        Some(vec![1.0, 1.0, 0.0, 0.0]),
    ];
    fixed_table(&s, "few", 4, &rows, 2);
    // k larger than the table: every row with a vector; the NULL is skipped.
    let found = ids_and_distances(
        &s,
        &format!("SELECT id, distance FROM ai_search('few', 'v', {q}, 100)"),
    );
    let ids: Vec<i64> = found.iter().map(|r| r.0).collect();
    assert_eq!(ids, [0, 3, 2]);
    assert_eq!(found[0].1, 0.0);
    assert_eq!(found[2].1, 1.0);
    // A table whose vectors are all NULL: no rows.
    fixed_table(&s, "nulls", 4, &[None, None], 2);
    assert!(
        ids_and_distances(
            &s,
            &format!("SELECT id, distance FROM ai_search('nulls', 'v', {q}, 1)")
        )
        .is_empty()
    );
    // A variable-length DOUBLE[] column, its NULL skipped too.
    list_table(
        &s,
        "lists",
        vec![
            Some(vec![Some(0.0), Some(2.0)]),
            None,
            Some(vec![Some(3.0), Some(0.0)]),
        ],
    );
    let found = ids_and_distances(
        &s,
        "SELECT id, distance FROM ai_search('lists', 'v', [1, 0], 2)",
    );
    assert_eq!(found, [(2, 0.0), (0, 1.0)]);
}

#[test]
fn bad_arguments_are_errors() {
    let s = session();
    fixed_table(&s, "docs", 4, &rows_of(&random(31, 20, 4), 4), 8);
    list_table(
        &s,
        "ragged",
        vec![Some(vec![Some(1.0), Some(0.0)]), Some(vec![Some(1.0)])],
    );
    list_table(&s, "holes", vec![Some(vec![Some(1.0), None])]);
    list_table(&s, "zeros", vec![Some(vec![Some(0.0), Some(0.0)])]);
    s.context()
        .register_batch(
            "texts",
            RecordBatch::try_from_iter(vec![(
                "body",
                Arc::new(StringArray::from(vec!["a"])) as ArrayRef,
            )])
            .unwrap(),
        )
        .unwrap();
    let q = "[1.0, 0.0, 0.0, 0.0]";
    for (sql, message) in [
        (
            format!("SELECT * FROM ai_search('nope', 'v', {q}, 3)"),
            "no table nope",
        ),
        (
            format!("SELECT * FROM ai_search('docs', 'w', {q}, 3)"),
            "docs has no column w",
        ),
        (
            format!("SELECT * FROM ai_search('docs', 'label', {q}, 3)"),
            "not a list of numbers",
        ),
        (
            "SELECT * FROM ai_search('texts', 'body', [1.0], 3)".to_string(),
            "column body of texts is Utf8, not a list of numbers",
        ),
        (
            "SELECT * FROM ai_search('docs', 'v', [1.0, 0.0], 3)".to_string(),
            "the query vector has 2 components, column v 4",
        ),
        (
            "SELECT * FROM ai_search('ragged', 'v', [1.0, 0.0], 3)".to_string(),
            "ragged row 2: column v: the vector has 1 components, the search 2",
        ),
        (
            "SELECT * FROM ai_search('holes', 'v', [1.0, 0.0], 3)".to_string(),
            "holes row 1: column v: component 2 is NULL",
        ),
        (
            "SELECT * FROM ai_search('zeros', 'v', [1.0, 0.0], 3)".to_string(),
            "zeros row 1: column v: the cosine of a zero vector is undefined",
        ),
        (
            format!("SELECT * FROM ai_search('docs', 'v', {q}, 0)"),
            "k must be at least 1, not 0",
        ),
        (
            format!("SELECT * FROM ai_search('docs', 'v', {q}, -2)"),
            "k must be at least 1, not -2",
        ),
        (
            format!("SELECT * FROM ai_search('docs', 'v', {q}, 1.5)"),
            "k must be a positive integer",
        ),
        (
            format!("SELECT * FROM ai_search('docs', 'v', {q}, NULL)"),
            "k must be a positive integer",
        ),
        (
            "SELECT * FROM ai_search('docs', 'v', 'a red car', 3)".to_string(),
            "a text query is not embedded",
        ),
        (
            "SELECT * FROM ai_search('docs', 'v', [0.0, 0.0, 0.0, 0.0], 3)".to_string(),
            "the query vector: the cosine of a zero vector",
        ),
        (
            "SELECT * FROM ai_search('docs', 'v', NULL, 3)".to_string(),
            "query vector must be a list of numbers",
        ),
        (
            "SELECT * FROM ai_search('docs', 'v', 3)".to_string(),
            "takes (table, column, query_vector, k [, 'exact' | 'hnsw']), not 3 arguments",
        ),
        (
            format!("SELECT * FROM ai_search('docs', 'v', {q}, id)"),
            "k must be a constant",
        ),
        (
            format!("SELECT * FROM ai_search('docs', 'v', {q}, 3, 'fast')"),
            "method must be 'exact' (the default) or 'hnsw'",
        ),
    ] {
        let e = error(&s, &sql);
        assert!(e.contains(message), "{sql}: {e}");
        assert!(e.contains("ai_search"), "{sql}: {e}");
    }
}

#[test]
fn a_bare_table_name_works_too() {
    let s = session();
    fixed_table(&s, "docs", 4, &rows_of(&random(41, 30, 4), 4), 8);
    let a = ids_and_distances(
        &s,
        "SELECT id, distance FROM ai_search(docs, 'v', [1.0, 2.0, 3.0, 4.0], 4)",
    );
    let b = ids_and_distances(
        &s,
        "SELECT id, distance FROM ai_search('docs', 'v', [1.0, 2.0, 3.0, 4.0], 4)",
    );
    assert_eq!(a, b);
    assert_eq!(a.len(), 4);
}
