//! The SQL corpus under `tests/sql/`, each query run twice over the small
//! labelled corpus in `tests/sql/data/`: through the AI operators, and naively,
//! the AI functions evaluated row by row as scalar functions. Both ask the same
//! deterministic backend, whose answer depends only on the prompt's template and
//! documents, so the rows must be identical: any document routed to the wrong
//! prompt, any pair lost or invented by an AI join, any predicate misplaced
//! around an AI operator shows up as a difference.
//!
//! Each `.sql` file holds queries, each after a `-- query: NAME` line. The
//! file's name is the construct it covers. A query may be followed by an
//! `-- equivalent:` line and the same question written by hand another way (a
//! correlated subquery as the join it stands for): run row by row, it must give
//! the same rows.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use aisql_engine::inference::backend::ContentHashBackend as ContentBackend;
use aisql_engine::sql::options::QueryOptions;
use aisql_engine::sql::{Evaluation, SqlSession};
use datafusion::arrow::array::RecordBatch;

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sql")
}

/// One query of the corpus.
struct Case {
    file: String,
    name: String,
    sql: String,
    /// The same question written another way, if the file gives one.
    equivalent: Option<String>,
}

/// Every query of the corpus.
fn corpus() -> Vec<Case> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "sql"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let stem = f.file_stem().unwrap().to_string_lossy().to_string();
        let text = std::fs::read_to_string(&f).unwrap();
        let mut name: Option<String> = None;
        let mut sql = String::new();
        let mut equivalent: Option<String> = None;
        for line in text.lines().chain(std::iter::once("-- query: <end>")) {
            if let Some(n) = line.strip_prefix("-- query:") {
                if let Some(prev) = name.take() {
                    out.push(Case {
                        file: stem.clone(),
                        name: prev,
                        sql: sql.trim().to_string(),
                        equivalent: equivalent.take().map(|e| e.trim().to_string()),
                    });
                }
                name = Some(n.trim().to_string());
                sql.clear();
            } else if line.trim() == "-- equivalent:" {
                equivalent = Some(String::new());
            } else if let Some(e) = equivalent.as_mut() {
                e.push_str(line);
                e.push('\n');
            } else if name.is_some() {
                sql.push_str(line);
                sql.push('\n');
            }
        }
    }
    out
}

async fn session(backend: Arc<ContentBackend>, evaluation: Evaluation) -> SqlSession {
    let options = QueryOptions {
        batch_rows: 7, // several batches per table: memo and streaming across batches
        // What a Snowflake AI_COMPLETE(model, ...) must name.
        model: Some("tiny".into()),
        ..QueryOptions::default()
    };
    let s = SqlSession::new(backend, options, evaluation).unwrap();
    for t in ["docs", "topics", "claims", "evidence"] {
        s.register(t, &corpus_dir().join("data").join(format!("{t}.csv")))
            .await
            .unwrap();
    }
    s
}

/// Rows as sorted lines of text (the corpus compares results as multisets; a
/// query's own ORDER BY is checked by comparing the unsorted lines too).
fn lines(batches: &[RecordBatch]) -> Vec<String> {
    aisql_engine::sql::row_lines(batches).unwrap()
}

/// `sql` written as Substrait (binary), decoded and run again.
async fn roundtrip(session: &SqlSession, sql: &str) -> aisql_engine::Result<Vec<RecordBatch>> {
    let plan = session.to_substrait(sql).await?;
    let bytes = aisql_engine::sql::plan_file::encode_plan(&plan);
    let plan = aisql_engine::sql::plan_file::decode_plan(&bytes, false)
        .map_err(aisql_engine::EngineError::Sql)?;
    let planned = session.plan_substrait(&plan).await?;
    Ok(session
        .run_plan(planned, std::time::Instant::now())
        .await?
        .batches)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ai_operators_match_row_by_row_evaluation() {
    let queries = corpus();
    assert!(
        queries.len() >= 60,
        "the corpus has {} queries",
        queries.len()
    );
    // Correlated subqueries with AI calls over outer columns, each with its join.
    let equivalents = queries.iter().filter(|c| c.equivalent.is_some()).count();
    assert!(
        equivalents >= 10,
        "{equivalents} queries have an equivalent"
    );
    let ops_backend = Arc::new(ContentBackend::default());
    let naive_backend = Arc::new(ContentBackend::default());
    let ops = session(ops_backend.clone(), Evaluation::Operators).await;
    let naive = session(naive_backend.clone(), Evaluation::Naive).await;
    let mut failures = Vec::new();
    let mut by_file: BTreeMap<String, usize> = BTreeMap::new();
    let mut nonempty = 0;
    for Case {
        file,
        name,
        sql,
        equivalent,
    } in &queries
    {
        *by_file.entry(file.clone()).or_default() += 1;
        let before = (ops_backend.prompts(), naive_backend.prompts());
        let want = match naive.run(sql).await {
            Ok(out) => out,
            Err(e) => {
                failures.push(format!("{file}/{name}: naive run failed: {e}"));
                continue;
            }
        };
        let got = match ops.run(sql).await {
            Ok(out) => out,
            Err(e) => {
                failures.push(format!("{file}/{name}: AI operators failed: {e}"));
                continue;
            }
        };
        let asked = (
            ops_backend.prompts() - before.0,
            naive_backend.prompts() - before.1,
        );
        if let Some(equivalent) = equivalent {
            match naive.run(equivalent).await {
                Ok(out) => {
                    let (mut w, mut e) = (lines(&want.batches), lines(&out.batches));
                    w.sort();
                    e.sort();
                    if w != e {
                        failures.push(format!(
                            "{file}/{name}: rows differ from the equivalent query's\n  query:      {w:?}\n  equivalent: {e:?}"
                        ));
                    }
                }
                Err(e) => failures.push(format!("{file}/{name}: the equivalent query failed: {e}")),
            }
        }
        if asked.0 != asked.1 {
            eprintln!(
                "{file}/{name}: prompts {} (operators) vs {} (row by row)",
                asked.0, asked.1
            );
        }
        // Planning the model work must never ask more than evaluating row by row.
        if asked.0 > asked.1 {
            failures.push(format!(
                "{file}/{name}: the AI operators asked {} prompts, row by row {}",
                asked.0, asked.1
            ));
        }
        // The same query as Substrait, read back and run: the same rows.
        match roundtrip(&ops, sql).await {
            Ok(batches) => {
                let (mut a, mut b) = (lines(&batches), lines(&got.batches));
                a.sort();
                b.sort();
                if a != b {
                    failures.push(format!(
                        "{file}/{name}: rows differ after a Substrait round trip\n  sql:       {b:?}\n  substrait: {a:?}"
                    ));
                }
            }
            Err(e) => failures.push(format!("{file}/{name}: Substrait round trip failed: {e}")),
        }
        if got.calls.is_empty() {
            failures.push(format!("{file}/{name}: no AI operator was planned"));
        }
        let (mut w, mut g) = (lines(&want.batches), lines(&got.batches));
        if !w.is_empty() {
            nonempty += 1;
        }
        let ordered = sql.to_lowercase().contains("order by");
        if ordered && w != g {
            failures.push(format!(
                "{file}/{name}: rows differ in order or content\n  naive: {w:?}\n  ops:   {g:?}"
            ));
            continue;
        }
        w.sort();
        g.sort();
        if w != g {
            failures.push(format!(
                "{file}/{name}: rows differ\n  naive: {w:?}\n  ops:   {g:?}"
            ));
        }
    }
    eprintln!("corpus by construct: {by_file:?}");
    eprintln!(
        "prompts asked: AI operators {}, row by row {}",
        ops_backend.prompts(),
        naive_backend.prompts()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // A corpus of empty results would prove little.
    assert!(
        nonempty * 10 >= queries.len() * 8,
        "only {nonempty} of {} queries return rows",
        queries.len()
    );
}

/// A relation's AI filters run cheapest per dropped row first: with prompts of
/// one size the written order stands, and a selectivity hint that one filter
/// keeps few rows puts it first, where it is asked about every row and the
/// other only about its survivors. The rows are the same either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selectivity_hints_order_a_relations_ai_filters() {
    let (work, food) = ("Is {0} about work?", "Is {0} about food?");
    let sql = format!(
        "SELECT id FROM docs WHERE ai_filter('{work}', body) AND ai_filter('{food}', body) ORDER BY id"
    );
    let run = |hint: Option<f64>| {
        let sql = sql.clone();
        async move {
            let s = session(Arc::new(ContentBackend::default()), Evaluation::Operators).await;
            if let Some(h) = hint {
                s.set_selectivity(food, h).unwrap();
            }
            s.run(&sql).await.unwrap()
        }
    };
    let order = |out: &aisql_engine::sql::SqlOutput| -> Vec<(String, usize)> {
        out.calls
            .iter()
            .zip(&out.answers)
            .map(|(c, a)| (c.template.clone(), a.len()))
            .collect()
    };
    let plain = run(None).await;
    let hinted = run(Some(0.1)).await;
    let (p, h) = (order(&plain), order(&hinted));
    assert_eq!((p[0].0.as_str(), p[1].0.as_str()), (work, food), "{p:?}");
    assert_eq!((h[0].0.as_str(), h[1].0.as_str()), (food, work), "{h:?}");
    // The first filter is asked about every document, the second about fewer.
    assert!(p[0].1 > p[1].1 && h[0].1 > h[1].1, "{p:?} {h:?}");
    assert_eq!(p[0].1, h[0].1);
    assert_eq!(lines(&plain.batches), lines(&hinted.batches));

    let s = session(Arc::new(ContentBackend::default()), Evaluation::Operators).await;
    let e = s.set_selectivity(food, 1.5).unwrap_err().to_string();
    assert!(e.contains("1.5") && e.contains("between 0 and 1"), "{e}");
}

/// Every query of the corpus (and its equivalent) written as Substrait the way
/// `aisql sql --to-substrait` writes it, binary and ProtoJSON, passes
/// substrait-validator (PyPI), a checker nobody here wrote: extensions
/// declared, output types on every call and measure, a condition on every
/// join.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_export_passes_substrait_validator() {
    let python = common::test_python("substrait_validator", "substrait-validator 0.1.4");
    let s = session(Arc::new(ContentBackend::default()), Evaluation::Operators).await;
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for case in corpus() {
        let sqls = [
            ("", Some(&case.sql)),
            ("-equivalent", case.equivalent.as_ref()),
        ];
        for (suffix, sql) in sqls {
            let Some(sql) = sql else { continue };
            let plan = s.to_substrait(sql).await.unwrap_or_else(|e| {
                panic!("{}/{}{suffix}: export failed: {e}", case.file, case.name)
            });
            let path = dir
                .path()
                .join(format!("{}-{}{suffix}.substrait", case.file, case.name));
            std::fs::write(&path, aisql_engine::sql::export::encode(&plan)).unwrap();
            let json = path.with_extension("json");
            files.push(path);
            std::fs::write(
                &json,
                aisql_engine::sql::export::encode_json(&plan).unwrap(),
            )
            .unwrap();
            files.push(json);
        }
    }
    let out = std::process::Command::new(&python)
        .arg(corpus_dir().join("../substrait/validate.py"))
        .args(&files)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "substrait-validator rejected exports:\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let n = files.len();
    assert!(
        stdout.contains(&format!("{n} of {n} plans valid")),
        "{stdout}"
    );
}
