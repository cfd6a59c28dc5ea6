//! Substrait plans written by a producer other than DataFusion: ibis-substrait
//! (`tests/substrait/ibis_plans.py` made them; Substrait 0.52, URIs rather than
//! URNs, its own function signatures). Each runs through DataFusion's consumer
//! and the AI rewrite and must return the rows of the same query written in
//! SQL, with the AI work planned as carefully (ordinary predicates first).
//! Hand-written plans use the fields DataFusion's consumer drops or trips on
//! (a read's filter and mask, emits, fetch; `engine/src/sql/consume.rs`).

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use aisql_engine::inference::backend::ContentHashBackend;
use aisql_engine::sql::options::QueryOptions;
use aisql_engine::sql::{Evaluation, SqlSession, row_lines};
use common::cli::aisql;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests")
}

async fn session() -> SqlSession {
    let s = SqlSession::new(
        Arc::new(ContentHashBackend::default()),
        QueryOptions::default(),
        Evaluation::Operators,
    )
    .unwrap();
    for t in ["docs", "topics"] {
        s.register(t, &dir().join(format!("sql/data/{t}.csv")))
            .await
            .unwrap();
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ibis_plans_return_the_rows_of_the_same_sql() {
    let cases = [
        (
            "ibis-filter.json",
            "SELECT id, year FROM docs WHERE year > 2017 AND ai_filter('Is the review {0} kind?', body) ORDER BY id",
        ),
        (
            "ibis-join.json",
            "SELECT d.id, t.id AS id_right FROM docs d JOIN topics t ON ai_join('Is {0} about {1}?', d.body, t.name) WHERE d.year > 2016",
        ),
        (
            "ibis-aggregate.json",
            "SELECT year, COUNT(id) AS n FROM docs WHERE ai_filter('Is {0} long?', body) GROUP BY year ORDER BY year",
        ),
    ];
    let s = session().await;
    for (file, sql) in cases {
        let path = dir().join("substrait").join(file);
        let plan = aisql_engine::sql::plan_file::read_plan_file(&path).unwrap();
        let planned = s
            .plan_substrait(&plan)
            .await
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        let from_plan = s
            .run_plan(planned, std::time::Instant::now())
            .await
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        let from_sql = s.run(sql).await.unwrap();
        assert!(!from_plan.calls.is_empty(), "{file}: no AI operator");
        let (mut a, mut b) = (
            row_lines(&from_plan.batches).unwrap(),
            row_lines(&from_sql.batches).unwrap(),
        );
        assert!(!b.is_empty(), "{sql}: no rows");
        a.sort();
        b.sort();
        assert_eq!(a, b, "{file} vs {sql}");
        // The same questions were asked: as many prompts per operator.
        let asked = |o: &aisql_engine::sql::SqlOutput| -> Vec<usize> {
            o.answers.iter().map(|t| t.len()).collect()
        };
        assert_eq!(asked(&from_plan), asked(&from_sql), "{file}");
    }
    // ibis wrote `year > 2017 AND ai_filter(...)`: the model saw only the
    // documents the cheap predicate kept (each text once: without unique ids a
    // document is keyed by its text).
    let newer = s
        .run("SELECT COUNT(DISTINCT body) FROM docs WHERE year > 2017")
        .await
        .unwrap();
    let newer = row_lines(&newer.batches).unwrap()[0]
        .parse::<usize>()
        .unwrap();
    let plan =
        aisql_engine::sql::plan_file::read_plan_file(&dir().join("substrait/ibis-filter.json"))
            .unwrap();
    let out = s
        .run_plan(
            s.plan_substrait(&plan).await.unwrap(),
            std::time::Instant::now(),
        )
        .await
        .unwrap();
    assert_eq!(out.answers[0].len(), newer);
}

/// The same plans are not QUAIL-B plans (no alias hints, another Substrait
/// version): `aisql query` runs them as general queries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aisql_query_runs_an_ibis_plan() {
    let tables = parquet_tables().await;
    let out = query("ibis-filter.json", tables.path()).success();
    let stdout = String::from_utf8_lossy(&out.get_output().stdout).to_string();
    assert!(stdout.starts_with("id,year"), "{stdout}");
}

/// `docs` and `topics` of the SQL corpus as `<table>.parquet` in a folder, as
/// `aisql query --tables` reads them.
async fn parquet_tables() -> tempfile::TempDir {
    use datafusion::dataframe::DataFrameWriteOptions;
    use datafusion::prelude::{CsvReadOptions, SessionContext};
    let tables = tempfile::tempdir().unwrap();
    let ctx = SessionContext::new();
    for t in ["docs", "topics"] {
        let csv = dir().join(format!("sql/data/{t}.csv"));
        ctx.read_csv(csv.to_str().unwrap(), CsvReadOptions::new())
            .await
            .unwrap()
            .write_parquet(
                tables.path().join(format!("{t}.parquet")).to_str().unwrap(),
                DataFrameWriteOptions::new().with_single_file_output(true),
                None,
            )
            .await
            .unwrap();
    }
    tables
}

/// `aisql query PLAN --tables DIR`: the plan's rows, or its error.
fn query(plan: &str, tables: &Path) -> assert_cmd::assert::Assert {
    aisql()
        .arg("query")
        .arg(dir().join("substrait").join(plan))
        .arg("--tables")
        .arg(tables)
        .args(["--backend", "model", "--model", "tiny", "--format", "csv"])
        .assert()
}

/// A read's filter and mask, a fetch's offset and count and its emit, in one
/// hand-written plan: the 2018 documents (d12, d21, d3, d30 by id), the second
/// and third. The plan of issue 32 whose filter emits nothing under a
/// projection of its field 0 is refused by name, without a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aisql_query_honours_read_masks_emits_and_fetches() {
    let tables = parquet_tables().await;
    let out = query("read-mask-emit-fetch.json", tables.path()).success();
    let stdout = String::from_utf8_lossy(&out.get_output().stdout).to_string();
    assert_eq!(stdout, "id,year\nd21,2018\nd3,2018\n");
    let out = query("empty-emit.json", tables.path()).failure().code(1);
    let stderr = String::from_utf8_lossy(&out.get_output().stderr).to_string();
    assert!(
        stderr.contains("a field reference into its input (no fields) names field 0"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
