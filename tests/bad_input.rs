//! Bad input gets a clear error naming what and where, a non-zero exit code and
//! never a panic: malformed plans, wrong version, unknown functions, wrong
//! arity, missing or malformed tables, missing labels, bad flags; input files
//! that are not regular files, malformed CSV and JSON lines (by file and line),
//! tables past the limits on width and size, an output into a missing folder,
//! and a document too long for the model, named but never printed whole.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use aisql_bench::quailb::labels::{LabelSet, LabelStore};
use aisql_bench::quailb::oracle::OracleBackend;
use aisql_bench::quailb::plan::QueryPlan;
use aisql_engine::sql::options::QueryOptions;
use assert_cmd::Command;
#[cfg(unix)]
use common::cli::mkfifo;
use common::cli::{aisql, table_arg};
use common::*;
use predicates::prelude::*;

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
        aisql_engine::data::files::write_parquet(&reviews, &batch).unwrap();
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
        set.insert(id, None, aisql_bench::quailb::labels::LabelValue::Bool(b))
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

/// `aisql sql ARGS` with the tiny model, bounded in time: a read that blocks
/// (a FIFO) fails the test instead of hanging it.
fn sql(args: &[&str]) -> Command {
    let mut c = aisql();
    c.arg("sql")
        .args(args)
        .args(["--backend", "model", "--model", "tiny"])
        .timeout(Duration::from_secs(120));
    c
}

/// Runs `aisql sql ARGS`, expecting exit 1 with every needle on stderr and no
/// panic; returns stderr.
fn sql_fails(args: &[&str], needles: &[&str]) -> String {
    let out = sql(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
    for needle in needles {
        assert!(
            stderr.contains(needle),
            "{args:?}: no {needle:?} in {stderr}"
        );
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

/// A FIFO would block the read forever and a device would read as an endless
/// (or empty) file: each is refused by name, before it is opened.
#[cfg(unix)]
#[test]
fn input_files_that_are_not_regular_files_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.csv");
    std::fs::write(&good, "id,text\na,x\n").unwrap();
    let fifo = dir.path().join("pipe.csv");
    mkfifo(&fifo);
    sql_fails(
        &["SELECT * FROM t", "--table", &table_arg("t", &fifo)],
        &[
            &format!("table t ({})", fifo.display()),
            "a FIFO (named pipe), not a regular file",
        ],
    );
    // Inside a table folder, next to a good file.
    let folder = dir.path().join("parts");
    std::fs::create_dir(&folder).unwrap();
    std::fs::write(folder.join("a.csv"), "id,text\na,x\n").unwrap();
    let part = folder.join("b.csv");
    mkfifo(&part);
    sql_fails(
        &["SELECT * FROM t", "--table", &table_arg("t", &folder)],
        &[&format!("({}): a FIFO", part.display())],
    );
    // A link to /dev/zero is not an empty table.
    let zero = dir.path().join("zero.parquet");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    sql_fails(
        &["SELECT * FROM t", "--table", &table_arg("t", &zero)],
        &[
            "zero.parquet",
            "a symbolic link to a character device (/dev/zero)",
        ],
    );
    // The SQL file, and a plan file.
    let sql_fifo = dir.path().join("query.sql");
    mkfifo(&sql_fifo);
    sql_fails(
        &[
            "-f",
            sql_fifo.to_str().unwrap(),
            "--table",
            &table_arg("t", &good),
        ],
        &["query.sql", "a FIFO (named pipe)"],
    );
    // A QUAIL-B table of `aisql query --tables`.
    let tables = dir.path().join("tables");
    TinyCorpus::write(&tables);
    let reviews = tables.join("reviews.parquet");
    std::fs::remove_file(&reviews).unwrap();
    std::os::unix::fs::symlink("/dev/urandom", &reviews).unwrap();
    query_fails(
        &plans_dir().join("IMDB-1.json"),
        &tables,
        "reviews.parquet: a symbolic link to a character device (/dev/urandom)",
    );
    let plan_fifo = dir.path().join("plan.json");
    mkfifo(&plan_fifo);
    for command in ["query", "explain"] {
        aisql()
            .args([command, plan_fifo.to_str().unwrap()])
            .timeout(Duration::from_secs(120))
            .assert()
            .code(1)
            .stderr(
                predicate::str::contains("plan.json")
                    .and(predicate::str::contains("a FIFO (named pipe)"))
                    .and(predicate::str::contains("panicked").not()),
            );
    }
}

#[test]
fn malformed_csv_names_file_and_line_unless_read_leniently() {
    let dir = tempfile::tempdir().unwrap();
    // A quote left open would merge every later row into one value.
    let open = dir.path().join("open.csv");
    std::fs::write(&open, "id,text\na,x\nb,\"it\nc,z\nd,w\n").unwrap();
    sql_fails(
        &["SELECT * FROM t", "--table", &table_arg("t", &open)],
        &[&format!(
            "table t ({}): not readable as CSV: line 3: a quoted field opens here and is never closed",
            open.display()
        )],
    );
    let ragged = dir.path().join("ragged.csv");
    std::fs::write(&ragged, "id,text\na,x\nb\nc,z,extra\n").unwrap();
    sql_fails(
        &["SELECT * FROM t", "--table", &table_arg("t", &ragged)],
        &[&format!(
            "table t ({}): not readable as CSV: line 3: 1 field, the header (line 1) has 2",
            ragged.display()
        )],
    );
    // Leniently a missing field is a null; a field too many is still an error.
    sql_fails(
        &[
            "SELECT * FROM t",
            "--lenient-csv",
            "--table",
            &table_arg("t", &ragged),
        ],
        &["ragged.csv", "line 4: 3 fields, the header (line 1) has 2"],
    );
    let short = dir.path().join("short.csv");
    std::fs::write(&short, "id,text\na,x\nb\n").unwrap();
    sql(&[
        "SELECT id, text IS NULL AS missing FROM t ORDER BY id",
        "--lenient-csv",
        "--format",
        "csv",
        "--table",
        &table_arg("t", &short),
    ])
    .assert()
    .success()
    .stdout("id,missing\na,false\nb,true\n");
}

/// Past the limits on columns, a value and a row, a table fails at once, naming
/// the file, the line and the limit (these took DataFusion minutes).
#[test]
fn tables_past_the_limits_fail_naming_file_line_and_limit() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let wide = dir.path().join("wide.csv");
    let header: Vec<String> = (0..100_000).map(|i| format!("c{i}")).collect();
    std::fs::write(&wide, format!("{}\n", header.join(","))).unwrap();
    sql_fails(
        &["SELECT * FROM t", "--table", &table_arg("t", &wide)],
        &[&format!(
            "table t ({}): not readable as CSV: line 1: more than 10000 fields",
            wide.display()
        )],
    );

    let huge = dir.path().join("huge.csv");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&huge).unwrap());
    f.write_all(b"id,text\na,x\nb,\"").unwrap();
    let chunk = vec![b'x'; 1 << 20];
    for _ in 0..200 {
        f.write_all(&chunk).unwrap();
    }
    f.write_all(b"\"\n").unwrap();
    drop(f);
    sql_fails(
        &["SELECT * FROM t", "--table", &table_arg("t", &huge)],
        &[&format!(
            "table t ({}): not readable as CSV: line 3: a field longer than 64 MiB",
            huge.display()
        )],
    );
    std::fs::remove_file(&huge).unwrap();

    let long = dir.path().join("long.json");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&long).unwrap());
    f.write_all(b"{\"id\": \"a\"}\n{\"id\": \"").unwrap();
    for _ in 0..100 {
        f.write_all(&chunk).unwrap();
    }
    f.write_all(b"\"}\n").unwrap();
    drop(f);
    sql_fails(
        &["SELECT * FROM t", "--table", &table_arg("t", &long)],
        &[&format!(
            "table t ({}): not readable as JSON lines: line 2: a line longer than 64 MiB",
            long.display()
        )],
    );
}

#[test]
fn a_json_lines_error_names_its_own_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.jsonl");
    std::fs::write(
        &path,
        "{\"id\": \"a\"}\n{\"id\": \"b\",}\n{\"id\": \"c\"}\n",
    )
    .unwrap();
    let stderr = sql_fails(
        &["SELECT * FROM t", "--table", &table_arg("t", &path)],
        &[&format!(
            "table t ({}): not readable as JSON lines: line 2:",
            path.display()
        )],
    );
    assert!(!stderr.contains("line 1"), "{stderr}");
}

#[test]
fn an_output_into_a_missing_folder_names_the_folder() {
    let dir = tempfile::tempdir().unwrap();
    let table_file = dir.path().join("t.csv");
    std::fs::write(&table_file, "id,text\na,x\n").unwrap();
    for flag in ["--output", "--to-substrait"] {
        let out = sql(&[
            "SELECT * FROM t",
            "--table",
            &table_arg("t", &table_file),
            flag,
            "some/missing/dir/x.csv",
        ])
        .current_dir(dir.path())
        .output()
        .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains(&format!(
                "cannot write {flag} some/missing/dir/x.csv: folder some/missing/dir does not exist"
            )),
            "{stderr}"
        );
        assert!(!stderr.contains(".tmp"), "{stderr}");
    }
    assert!(!dir.path().join("some").exists());
}

/// A document that is its row's id (no id column) and longer than the model's
/// context is named by its first characters and its size, not printed whole.
#[test]
fn a_context_length_error_quotes_a_prefix_of_the_document() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.csv");
    let document = "word ".repeat(200_000);
    std::fs::write(&path, format!("text\nshort\n{document}\n")).unwrap();
    let stderr = sql_fails(
        &[
            "SELECT ai_filter('Is {0} kind?', text) AS kind FROM t",
            "--table",
            &table_arg("t", &path),
        ],
        &[
            "max_position_embeddings",
            &format!("… ({} bytes) of t", document.len()),
        ],
    );
    assert!(stderr.len() < 2_000, "{} bytes of error", stderr.len());
}
