//! Bad input gets a clear error naming what and where, a non-zero exit code and
//! never a panic: malformed plans, wrong version, unknown functions, wrong
//! arity, missing or malformed tables, missing labels, bad flags.

mod common;

use std::path::Path;
use std::sync::Arc;

use aisql_engine::backend::OracleBackend;
use aisql_engine::labels::{LabelSet, LabelStore};
use aisql_engine::plan::QueryPlan;
use aisql_engine::query::QueryOptions;
use assert_cmd::Command;
use common::*;
use predicates::prelude::*;

fn aisql() -> Command {
    Command::cargo_bin("aisql").unwrap()
}

fn imdb1() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(plans_dir().join("IMDB-1.json")).unwrap())
        .unwrap()
}

fn write_plan(dir: &Path, name: &str, v: &serde_json::Value) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, v.to_string()).unwrap();
    p
}

/// Runs `aisql query PLAN --tables DIR` and expects exit 1 with `needle` on stderr.
fn query_fails(plan: &Path, tables: &Path, needle: &str) {
    aisql()
        .args([
            "query",
            plan.to_str().unwrap(),
            "--tables",
            tables.to_str().unwrap(),
            "--backend",
            "model",
        ])
        .assert()
        .code(1)
        .stderr(predicate::str::contains(needle).and(predicate::str::contains("panicked").not()));
}

#[test]
fn malformed_plans_are_rejected_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let tables = dir.path().join("tables");
    TinyCorpus::write(&tables);

    let bad_json = dir.path().join("bad.json");
    std::fs::write(&bad_json, "{\"relations\": [").unwrap();
    query_fails(&bad_json, &tables, "malformed Substrait JSON");

    let bad_pb = dir.path().join("bad.substrait");
    std::fs::write(&bad_pb, b"\xff\xff\xff not protobuf").unwrap();
    query_fails(&bad_pb, &tables, "malformed Substrait protobuf");

    let mut v = imdb1();
    v["version"]["minor_number"] = serde_json::json!(64);
    query_fails(
        &write_plan(dir.path(), "version.json", &v),
        &tables,
        "Substrait version 0.64.0 is not supported",
    );

    let mut v = imdb1();
    v["extensions"][0]["extension_function"]["name"] = serde_json::json!("ai_summarize:str_str");
    query_fails(
        &write_plan(dir.path(), "function.json", &v),
        &tables,
        "unknown function \"ai_summarize\"",
    );

    let mut v = imdb1();
    v["relations"][0]["root"]["input"]["project"]["input"]["filter"]["condition"]["scalar_function"]["arguments"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"value": {"literal": {"string": "extra"}}}));
    query_fails(
        &write_plan(dir.path(), "arity.json", &v),
        &tables,
        "ai_filter takes 2 arguments, got 3",
    );

    // explain reports the same errors.
    aisql()
        .args(["explain", bad_json.to_str().unwrap()])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("bad.json"));
}

#[test]
fn missing_or_malformed_tables_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let plan = plans_dir().join("IMDB-1.json");
    let tables = dir.path().join("tables");
    TinyCorpus::write(&tables);
    let reviews = tables.join("reviews.parquet");
    let good = std::fs::read(&reviews).unwrap();

    std::fs::remove_file(&reviews).unwrap();
    query_fails(
        &plan,
        &tables,
        "table reviews is needed by the plan but no file was given",
    );

    std::fs::write(&reviews, &good[..good.len() / 2]).unwrap();
    query_fails(&plan, &tables, "is not a readable Parquet file");

    // A reviews table without its text column, an empty one, one with a repeated id.
    let aspects = std::fs::read(tables.join("aspects.parquet")).unwrap();
    std::fs::write(&reviews, &aspects).unwrap();
    query_fails(&plan, &tables, "has no column \"body\"");

    use datafusion::arrow::array::{ArrayRef, RecordBatch, StringArray};
    let write = |ids: Vec<&str>| {
        let ids: ArrayRef = Arc::new(StringArray::from(ids.clone()));
        let body: ArrayRef = Arc::new(StringArray::from(vec!["text"; ids.len()]));
        let batch = RecordBatch::try_from_iter([("id", ids), ("body", body)]).unwrap();
        aisql_engine::output::write_parquet(&reviews, &batch).unwrap();
    };
    write(vec![]);
    query_fails(&plan, &tables, "table reviews");
    query_fails(&plan, &tables, "is empty");
    write(vec!["rv0", "rv1", "rv0"]);
    query_fails(&plan, &tables, "id \"rv0\" repeats in row 2");
}

#[test]
fn bad_flags_are_usage_errors() {
    aisql().args(["query", "--bogus"]).assert().code(2);
    aisql()
        .args(["query", "x.json", "--prefix-cache", "maybe"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("maybe"));
    aisql()
        .args(["query", "x.json", "--cuda-kernels", "fast"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("fast"));
    aisql()
        .env("AISQL_CUDA_KERNELS", "fast")
        .args(["query", "x.json"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("fast"));
    let dir = tempfile::tempdir().unwrap();
    TinyCorpus::write(dir.path());
    aisql()
        .args([
            "query",
            plans_dir().join("IMDB-1.json").to_str().unwrap(),
            "--tables",
            dir.path().to_str().unwrap(),
            "--backend",
            "oracle",
        ])
        .assert()
        .code(1)
        .stderr(predicate::str::contains(
            "--backend oracle needs reference labels",
        ));
    aisql()
        .args([
            "query",
            plans_dir().join("IMDB-1.json").to_str().unwrap(),
            "--tables",
            dir.path().to_str().unwrap(),
            "--gpu",
            "0",
        ])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("cuda"));
}

#[test]
fn cpu_workers_beyond_the_machine_are_a_usage_error() {
    aisql()
        .args(["sql", "SELECT 1", "--cpu-workers", "4000"])
        .assert()
        .code(2)
        .stderr(
            predicate::str::contains("--cpu-workers 4000")
                .and(predicate::str::contains("panicked").not()),
        );
}

/// A plan that DataFusion's consumer panicked on (a filter emitting no column,
/// read by the projection above it) fails with one error naming the plan, and
/// no `panicked` line or trace reaches the user.
#[test]
fn a_plan_the_consumer_cannot_take_fails_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let tables = dir.path().join("tables");
    std::fs::create_dir(&tables).unwrap();
    TinyCorpus::write(&tables);
    let exported = dir.path().join("export.json");
    aisql()
        .args([
            "sql",
            "SELECT id FROM reviews WHERE id < 'rv2'",
            "--to-substrait",
        ])
        .arg(&exported)
        .args([
            "--table",
            &format!("reviews={}", tables.join("reviews.parquet").display()),
        ])
        .assert()
        .success();
    let mut plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&exported).unwrap()).unwrap();
    fn empty_filter_emit(v: &mut serde_json::Value) -> bool {
        if let Some(filter) = v.get_mut("filter").filter(|f| f.get("input").is_some()) {
            filter["common"] = serde_json::json!({"emit": {"outputMapping": []}});
            return true;
        }
        match v {
            serde_json::Value::Object(m) => m.values_mut().any(empty_filter_emit),
            serde_json::Value::Array(a) => a.iter_mut().any(empty_filter_emit),
            _ => false,
        }
    }
    assert!(empty_filter_emit(&mut plan));
    let path = write_plan(dir.path(), "empty-emit.json", &plan);
    aisql()
        .args([
            "query",
            path.to_str().unwrap(),
            "--tables",
            tables.to_str().unwrap(),
        ])
        .env_remove("RUST_BACKTRACE")
        .assert()
        .code(1)
        .stderr(
            predicate::str::contains("empty-emit.json")
                .and(predicate::str::contains("panicked").not())
                .and(predicate::str::contains("stack backtrace").not()),
        );
}

#[tokio::test]
async fn a_label_missing_from_the_collection_names_predicate_and_id() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = TinyCorpus::write(dir.path());
    let q = QueryPlan::from_file(&plans_dir().join("IMDB-1.json")).unwrap();
    let (store, _) = draw_labels(&corpus, std::slice::from_ref(&q));
    // Rebuild the one label set without the label of rv3.
    let old = store.sets().next().unwrap().clone();
    let mut set = LabelSet::new(old.info.clone(), old.label_set_id.clone());
    for id in corpus.tables["reviews"]
        .ids
        .iter()
        .filter(|id| *id != "rv3")
    {
        let b = old.get_bool(id, None).unwrap();
        set.insert(id, None, aisql_engine::labels::LabelValue::Bool(b))
            .unwrap();
    }
    let mut broken = LabelStore::new("gt_broken", "none");
    broken.insert(set).unwrap();
    let err = collect_query(
        &q,
        &corpus.paths(),
        Arc::new(OracleBackend::new(Arc::new(broken))),
        &QueryOptions::default(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains(&old.info.key) && err.contains("rv3"), "{err}");
}
