//! Inputs sized to exhaust a resource get a clear error naming what and where, or
//! run in bounded time and memory; never a stack overflow, an abort or a silent
//! wrong answer: plans nested thousands of levels deep, a million-entry IN-list,
//! a prompt past the model's context, a KV budget smaller than one document, a
//! table of ten million rows, and a query over `--memory-limit`.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use aisql_engine::inference::backend::{AiCall, AiRequest, Answer, Answerer};
use aisql_engine::sql::options::QueryOptions;
use common::cli::aisql;
use common::{Fails, collect_query};
use datafusion::arrow::array::{ArrayRef, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::parquet::arrow::ArrowWriter;

const SF: &str = "0.002";

fn standin(dir: &Path) -> PathBuf {
    let root = dir.join("quailb");
    aisql_standin::generate(&root, SF.parse().unwrap()).unwrap();
    root
}

/// A reviews table `(id, body)` with the given rows, as Parquet.
fn write_reviews(dir: &Path, rows: &[(String, String)]) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("body", DataType::Utf8, false),
    ]));
    let path = dir.join("reviews.parquet");
    let mut w =
        ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), schema.clone(), None).unwrap();
    for chunk in rows.chunks(1 << 20) {
        let ids: ArrayRef = Arc::new(StringArray::from_iter_values(chunk.iter().map(|r| &r.0)));
        let bodies: ArrayRef = Arc::new(StringArray::from_iter_values(chunk.iter().map(|r| &r.1)));
        w.write(&RecordBatch::try_new(schema.clone(), vec![ids, bodies]).unwrap())
            .unwrap();
    }
    w.close().unwrap();
    path
}

fn varint(mut n: usize, out: &mut Vec<u8>) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// `field` as a length-delimited protobuf field holding `inner`.
fn wrap(field: u8, inner: &[u8]) -> Vec<u8> {
    let mut out = vec![(field << 3) | 2];
    varint(inner.len(), &mut out);
    out.extend_from_slice(inner);
    out
}

/// A Substrait plan, binary, whose root is `depth` filters over a read (built
/// bytes-first, so the test itself needs no deep recursion).
fn deep_plan_binary(depth: usize) -> Vec<u8> {
    let mut rel = wrap(1, &[]); // Rel { read: ReadRel {} }
    for _ in 0..depth {
        rel = wrap(2, &wrap(2, &rel)); // Rel { filter: FilterRel { input: rel } }
    }
    wrap(3, &wrap(2, &wrap(1, &rel))) // Plan { relations: [PlanRel { root: RelRoot { input } }] }
}

/// The same plan as ProtoJSON.
fn deep_plan_json(depth: usize) -> String {
    format!(
        r#"{{"version":{{"minorNumber":103}},"relations":[{{"root":{{"input":{}{{"read":{{}}}}{}}}}}]}}"#,
        r#"{"filter":{"input":"#.repeat(depth),
        "}}".repeat(depth)
    )
}

#[test]
fn plans_nested_thousands_deep_are_refused_without_a_stack_overflow() {
    let dir = tempfile::tempdir().unwrap();
    for depth in [90, 5_000, 100_000] {
        for (name, bytes) in [
            (format!("deep-{depth}.substrait"), deep_plan_binary(depth)),
            (
                format!("deep-{depth}.json"),
                deep_plan_json(depth).into_bytes(),
            ),
        ] {
            let path = dir.path().join(&name);
            std::fs::write(&path, bytes).unwrap();
            let err = aisql().arg("explain").arg(&path).fails();
            assert!(err.contains(&name), "{name}: {err}");
            assert!(
                !err.contains("overflow") && !err.contains("panicked"),
                "{name}: {err}"
            );
            if depth > 100 {
                assert!(err.contains("recursion limit"), "{name}: {err}");
            }
        }
    }
}

/// QUAIL-B's IN-list keeps rows whose classification label is one of the options,
/// and every option must be a label of that classification: a million options
/// that are not are read, and refused naming the first, in bounded time.
#[test]
fn a_million_entry_in_list_is_read_and_refused_naming_an_option() {
    let dir = tempfile::tempdir().unwrap();
    let original = aisql_bench::plans::repository_plans_dir().join("IMDB-13.json");
    let mut plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&original).unwrap()).unwrap();
    fn find_options(v: &mut serde_json::Value) -> Option<&mut Vec<serde_json::Value>> {
        match v {
            serde_json::Value::Object(m) => {
                if matches!(m.get("options"), Some(serde_json::Value::Array(_))) {
                    return m.get_mut("options").and_then(|o| o.as_array_mut());
                }
                m.values_mut().find_map(find_options)
            }
            serde_json::Value::Array(a) => a.iter_mut().find_map(find_options),
            _ => None,
        }
    }
    let options = find_options(&mut plan).expect("IMDB-13 has an IN-list");
    options.extend(
        (0..1_000_000)
            .map(|i| serde_json::json!({"literal": {"string": format!("no-such-label-{i}")}})),
    );
    let decoded =
        aisql_engine::sql::plan_file::decode_plan(plan.to_string().as_bytes(), true).unwrap();
    let big = dir.path().join("IMDB-13-million.substrait");
    std::fs::write(&big, aisql_engine::sql::plan_file::encode_plan(&decoded)).unwrap();
    let t0 = Instant::now();
    let err = aisql().arg("explain").arg(&big).fails();
    eprintln!(
        "IMDB-13 with 1,000,002 IN-list entries: refused in {:?}",
        t0.elapsed()
    );
    assert!(
        err.contains("in-list-1") && err.contains("no-such-label-0") && err.contains("classify-1"),
        "{err}"
    );
}

#[test]
fn a_prompt_past_the_models_context_names_its_row() {
    let dir = tempfile::tempdir().unwrap();
    let tables = dir.path().join("tables");
    // About 45,000 tokens: over the tiny model's 40,960 positions.
    let long = "word ".repeat(45_000);
    write_reviews(
        &tables,
        &[
            ("r-short".into(), "A fine film.".into()),
            ("r-long".into(), long),
        ],
    );
    let err = aisql()
        .args(["query", "IMDB-1", "--backend", "model", "--model", "tiny"])
        .arg("--tables")
        .arg(&tables)
        .fails();
    assert!(
        err.contains("row r-long of reviews") && err.contains("max_position_embeddings"),
        "{err}"
    );
}

#[test]
fn a_kv_budget_smaller_than_one_document_names_the_document() {
    let dir = tempfile::tempdir().unwrap();
    let tables = dir.path().join("tables");
    // About 3,000 tokens; the tiny model's KV takes 512 bytes a position in f32,
    // so 1 MiB holds 2,048 positions.
    write_reviews(&tables, &[("r-big".into(), "word ".repeat(3_000))]);
    let err = aisql()
        .args([
            "query",
            "IMDB-1",
            "--backend",
            "model",
            "--model",
            "tiny",
            "--kv-budget-mb",
            "1",
        ])
        .arg("--tables")
        .arg(&tables)
        .fails();
    assert!(
        err.contains("document r-big of reviews") && err.contains("KV budget"),
        "{err}"
    );
}

/// Answers every question FALSE at once: the engine's own cost per row.
struct NoModel;

impl Answerer for NoModel {
    fn name(&self) -> &str {
        "no-model"
    }
    fn answer(
        &self,
        call: &AiCall,
        requests: &[AiRequest<'_>],
    ) -> aisql_engine::Result<Vec<Answer>> {
        let none = if call.kind.has_labels() {
            Answer::Label(0)
        } else {
            Answer::Bool(false)
        };
        Ok(vec![none; requests.len()])
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_million_tiny_rows_run_through_an_ai_filter() {
    const ROWS: usize = 10_000_000;
    let dir = tempfile::tempdir().unwrap();
    let t0 = Instant::now();
    let rows: Vec<(String, String)> = (0..ROWS)
        .map(|i| (format!("r{i}"), "ok".to_string()))
        .collect();
    let path = write_reviews(dir.path(), &rows);
    drop(rows);
    let written = t0.elapsed();
    let query = aisql_bench::plans::PlanSource::Embedded
        .plan("IMDB-1")
        .unwrap();
    let paths = [("reviews".to_string(), path)].into_iter().collect();
    let t1 = Instant::now();
    let out = collect_query(&query, &paths, Arc::new(NoModel), &QueryOptions::default())
        .await
        .unwrap();
    eprintln!(
        "{ROWS} rows: written in {written:?}, queried in {:?} ({} answers recorded)",
        t1.elapsed(),
        out.answers[0].len()
    );
    assert_eq!(out.rows.num_rows(), 0);
    assert_eq!(out.table_rows["reviews"], ROWS);
    assert_eq!(out.answers[0].len(), ROWS, "every row asked exactly once");
}

#[test]
fn a_query_over_its_memory_limit_fails_naming_the_operator() {
    let dir = tempfile::tempdir().unwrap();
    let root = standin(dir.path());
    // At 16 kB the first batch any operator hands up passes the ceiling: the
    // check between operators names it (the AI join's partner side is named
    // where it is the one past the bound: tests/memory_bound_ai_joins.rs).
    let err = aisql()
        .args([
            "query",
            "IMDB-9",
            "--backend",
            "oracle",
            "--sf",
            SF,
            "--memory-limit",
            "16K",
        ])
        .arg("--root")
        .arg(&root)
        .fails();
    assert!(
        err.contains("Resources exhausted")
            && err.contains("--memory-limit 16.0 KB")
            && err.contains("Exec made a batch"),
        "{err}"
    );
    // The same query within the default limit runs.
    aisql()
        .args(["query", "IMDB-9", "--backend", "oracle", "--sf", SF])
        .arg("--root")
        .arg(&root)
        .assert()
        .success();
    for bad in ["lots", "0", "12Q"] {
        let out = aisql()
            .args(["query", "IMDB-7", "--memory-limit", bad])
            .assert()
            .code(2)
            .get_output()
            .stderr
            .clone();
        let err = String::from_utf8_lossy(&out);
        assert!(
            err.contains("--memory-limit") && err.contains(bad),
            "{bad}: {err}"
        );
    }
}
