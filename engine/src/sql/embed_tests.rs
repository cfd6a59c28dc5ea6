//! `ai_embed`, `ai_similarity` and the vector functions through a session on
//! the generated tiny model: every embedding is held to the numpy forward of
//! `tests/reference/qwen3_numpy.py --embed` (float64, no code shared with
//! aisql or candle) within 1e-5, for bare texts, an instruction, a `dims`
//! prefix and the empty text; a NULL text gives NULL; a row embedded in a
//! batch of many gets the vector it gets alone; and bad calls are errors
//! naming what is wrong.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use aisql_models::{Device, Tokenizer};
use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::Float32Type;

use super::{Evaluation, SqlSession};
use crate::error::Result;
use crate::inference::kinds::embedding_pieces;
use crate::inference::scheduler::{ModelExecutor, ScheduledBackend, SchedulerConfig};
use crate::sql::options::QueryOptions;

/// The tiny model's hidden size: the dimensions of an embedding without dims.
const HIDDEN: usize = 64;

/// A session on a tiny model written to a fresh folder, the folder, and the
/// model's tokenizer.
struct Tiny {
    dir: tempfile::TempDir,
    tokenizer: Tokenizer,
    session: SqlSession,
}

fn tiny() -> Tiny {
    let dir = tempfile::tempdir().unwrap();
    aisql_models::tiny::write_tiny_model(dir.path(), 3).unwrap();
    let (model, tokenizer) =
        aisql_models::load(dir.path().to_str().unwrap(), &Device::Cpu, None).unwrap();
    let exec = ModelExecutor::new(Arc::new(model), &tokenizer, "model").unwrap();
    let backend = Arc::new(ScheduledBackend::new(
        exec,
        tokenizer.clone(),
        SchedulerConfig::default(),
    ));
    let session = SqlSession::new(backend, QueryOptions::default(), Evaluation::Operators).unwrap();
    Tiny {
        dir,
        tokenizer,
        session,
    }
}

/// The first column of `sql`'s rows, each a vector or NULL.
fn vectors(session: &SqlSession, sql: &str) -> Result<Vec<Option<Vec<f32>>>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let out = rt.block_on(session.run(sql))?;
    let mut rows = Vec::new();
    for b in &out.batches {
        let col = b.column(0).as_fixed_size_list();
        for i in 0..col.len() {
            rows.push(
                col.is_valid(i)
                    .then(|| col.value(i).as_primitive::<Float32Type>().values().to_vec()),
            );
        }
    }
    Ok(rows)
}

/// The one vector of a one-row query.
fn vector(session: &SqlSession, sql: &str) -> Vec<f32> {
    let rows = vectors(session, sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    assert_eq!(rows.len(), 1, "{sql}");
    rows[0].clone().unwrap_or_else(|| panic!("{sql}: NULL"))
}

/// The first f64 column of a query's rows.
fn numbers(session: &SqlSession, sql: &str) -> Result<Vec<Option<f64>>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let out = rt.block_on(session.run(sql))?;
    Ok(out
        .batches
        .iter()
        .flat_map(|b| {
            b.column(0)
                .as_primitive::<datafusion::arrow::datatypes::Float64Type>()
                .iter()
                .collect::<Vec<_>>()
        })
        .collect())
}

fn error(session: &SqlSession, sql: &str) -> String {
    match vectors(session, sql) {
        Ok(rows) => panic!("{sql} gave {rows:?}"),
        Err(e) => e.to_string(),
    }
}

/// The prompt ids aisql's scheduler feeds: the pieces and the text each
/// tokenized on its own, as [`crate::inference::scheduler`] does.
fn prompt_ids(tokenizer: &Tokenizer, instruction: &str, text: &str) -> Vec<u32> {
    let pieces = embedding_pieces(instruction);
    [
        tokenizer.encode(&pieces.preamble).unwrap(),
        tokenizer.encode_documents(&[text]).unwrap().remove(0),
        tokenizer.encode(&pieces.tail).unwrap(),
    ]
    .concat()
}

fn python() -> PathBuf {
    std::env::var_os("AISQL_TEST_PYTHON")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .map(|h| Path::new(&h).join(".cache/aisql-test-venv/bin/python"))
                .filter(|p| p.exists())
        })
        .unwrap_or_else(|| PathBuf::from("python3"))
}

/// The numpy reference's embedding of `ids`, `dims` components.
fn numpy_embedding(dir: &Path, ids: &[u32], dims: Option<usize>) -> Vec<f64> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/reference/qwen3_numpy.py");
    let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
    let mut cmd = std::process::Command::new(python());
    cmd.arg(script)
        .arg(dir)
        .args(["--prompt-ids", &ids.join(","), "--embed"]);
    if let Some(d) = dims {
        cmd.args(["--dims", &d.to_string()]);
    }
    let out = cmd.output().expect("python runs");
    assert!(
        out.status.success(),
        "qwen3_numpy.py failed (a Python with numpy: scripts/test-tools.sh, or \
         AISQL_TEST_PYTHON): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn assert_close(what: &str, ours: &[f32], reference: &[f64], tolerance: f64) {
    assert_eq!(ours.len(), reference.len(), "{what}: lengths");
    let worst = ours
        .iter()
        .zip(reference)
        .map(|(a, b)| (f64::from(*a) - b).abs())
        .fold(0.0, f64::max);
    // Printed so a run reports how close the two forwards are (`--nocapture`).
    eprintln!("{what}: max abs diff {worst:e}");
    assert!(
        worst <= tolerance,
        "{what}: aisql and the numpy reference differ by {worst:e} (> {tolerance:e})\n\
         aisql {ours:?}\nnumpy {reference:?}"
    );
}

fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

#[test]
fn embeddings_equal_the_numpy_reference() {
    let t = tiny();
    let instruction = "Given a question, find the passage that answers it";
    let cases: [(&str, &str, Option<usize>); 5] = [
        ("Hello, world", "", None),
        ("The film was long, but the ending paid for it.", "", None),
        ("What is the capital of France?", instruction, None),
        (
            "The film was long, but the ending paid for it.",
            "",
            Some(16),
        ),
        ("", "", None),
    ];
    for (text, instr, dims) in cases {
        let mut args = vec![quoted(text)];
        if !instr.is_empty() {
            args.push(quoted(instr));
        }
        if let Some(d) = dims {
            args.push(d.to_string());
        }
        let sql = format!("SELECT ai_embed({})", args.join(", "));
        let ours = vector(&t.session, &sql);
        assert_eq!(ours.len(), dims.unwrap_or(HIDDEN), "{sql}");
        let norm: f64 = ours.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>();
        assert!((norm - 1.0).abs() < 1e-5, "{sql}: squared norm {norm}");
        let ids = prompt_ids(&t.tokenizer, instr, text);
        // The pooled position is Qwen3's <|endoftext|> control token, not its
        // spelling as text.
        assert_eq!(ids.last(), Some(&151_643), "{sql}: {ids:?}");
        let reference = numpy_embedding(t.dir.path(), &ids, dims);
        assert_close(&sql, &ours, &reference, 1e-5);
    }
}

#[test]
fn dims_instruction_null_and_empty_text() {
    let t = tiny();
    let full = vector(&t.session, "SELECT ai_embed('a quiet film')");
    let short = vector(&t.session, "SELECT ai_embed('a quiet film', 8)");
    // The first 8 components of the full vector, renormalised.
    let norm = full[..8]
        .iter()
        .map(|x| f64::from(*x).powi(2))
        .sum::<f64>()
        .sqrt();
    let expected: Vec<f64> = full[..8].iter().map(|x| f64::from(*x) / norm).collect();
    assert_close("dims 8", &short, &expected, 1e-6);
    // An instruction changes the prompt, so the vector.
    let instructed = vector(&t.session, "SELECT ai_embed('a quiet film', 'Find films')");
    let d: f32 = full
        .iter()
        .zip(&instructed)
        .map(|(a, b)| (a - b).abs())
        .sum();
    assert!(d > 1e-3, "the instruction changed nothing");
    // NULL in, NULL out; the empty text is a vector (its prompt is the end token).
    let rows = vectors(
        &t.session,
        "SELECT ai_embed(t) FROM (VALUES ('a quiet film'), (NULL), ('')) AS v(t)",
    )
    .unwrap();
    assert_eq!(rows.len(), 3);
    assert_close("row 1", rows[0].as_ref().unwrap(), &to_f64(&full), 1e-6);
    assert!(rows[1].is_none(), "{rows:?}");
    let empty = rows[2].as_ref().expect("the empty text has a vector");
    assert_close(
        "empty text",
        empty,
        &to_f64(&vector(&t.session, "SELECT ai_embed('')")),
        1e-6,
    );
}

fn to_f64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|x| f64::from(*x)).collect()
}

#[test]
fn a_row_in_a_batch_gets_the_vector_it_gets_alone() {
    let t = tiny();
    let texts: Vec<String> = (0..48)
        .map(|i| {
            format!(
                "review {i}: {}",
                "a long and winding film ".repeat(i % 5 + 1)
            )
        })
        .collect();
    let values: Vec<String> = texts.iter().map(|s| format!("({})", quoted(s))).collect();
    let sql = format!(
        "SELECT ai_embed(t, 'Find reviews') FROM (VALUES {}) AS v(t)",
        values.join(", ")
    );
    let started = std::time::Instant::now();
    let batch = vectors(&t.session, &sql).unwrap();
    let seconds = started.elapsed().as_secs_f64();
    eprintln!(
        "{} rows embedded in one query in {seconds:.3} s: {:.0} rows/s (tiny model, debug build)",
        texts.len(),
        texts.len() as f64 / seconds
    );
    assert_eq!(batch.len(), texts.len());
    for i in [0, 7, 31, 47] {
        let alone = vector(
            &t.session,
            &format!("SELECT ai_embed({}, 'Find reviews')", quoted(&texts[i])),
        );
        assert_close(
            &format!("row {i}"),
            batch[i].as_ref().unwrap(),
            &to_f64(&alone),
            1e-6,
        );
    }
}

#[test]
fn similarity_is_the_cosine_of_the_embeddings() {
    let t = tiny();
    let a = vector(&t.session, "SELECT ai_embed('a quiet film')");
    let b = vector(&t.session, "SELECT ai_embed('a loud film')");
    let cosine: f64 = a
        .iter()
        .zip(&b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let got = numbers(
        &t.session,
        "SELECT ai_similarity('a quiet film', 'a loud film')",
    )
    .unwrap();
    assert!(
        (got[0].unwrap() - cosine).abs() < 1e-6,
        "{got:?} vs {cosine}"
    );
    let same = numbers(
        &t.session,
        "SELECT vector_cosine_similarity(ai_embed('x'), ai_embed('x'))",
    )
    .unwrap();
    assert!((same[0].unwrap() - 1.0).abs() < 1e-6, "{same:?}");
    let distance = numbers(
        &t.session,
        "SELECT cosine_distance(ai_embed('a quiet film'), ai_embed('a loud film'))",
    )
    .unwrap();
    assert!((distance[0].unwrap() - (1.0 - cosine)).abs() < 1e-6);
    // A NULL text has no embedding, so no similarity.
    let rows = numbers(
        &t.session,
        "SELECT ai_similarity(t, 'a loud film') FROM (VALUES ('a quiet film'), (NULL)) AS v(t)",
    )
    .unwrap();
    assert_eq!(rows.len(), 2);
    assert!((rows[0].unwrap() - cosine).abs() < 1e-6, "{rows:?}");
    assert_eq!(rows[1], None);
    // Embeddings of other dims are vectors of other lengths: an error naming
    // the function and both lengths.
    let e = numbers(
        &t.session,
        "SELECT vector_inner_product(ai_embed('x', 8), ai_embed('x', 16))",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("vector_inner_product: row 1: the vectors have 8 and 16 components"),
        "{e}"
    );
}

/// A query calling `ai_embed` written as Substrait (`--to-substrait`, the
/// binary file's bytes) and read back (`aisql query`) gives the vectors the
/// SQL gives.
#[test]
fn a_query_with_ai_embed_round_trips_through_substrait() {
    use datafusion_substrait::substrait::proto::Plan;
    use prost::Message;

    let t = tiny();
    let sql = "SELECT t, ai_embed(t, 'Find films', 16) AS e \
               FROM (VALUES ('a quiet film'), ('a loud film'), (NULL)) AS v(t)";
    let want = rt().block_on(t.session.run(sql)).unwrap();
    let plan = rt().block_on(t.session.to_substrait(sql)).unwrap();
    let bytes = crate::sql::export::encode(&plan);
    let read = Plan::decode(bytes.as_slice()).unwrap();
    let planned = rt().block_on(t.session.plan_substrait(&read)).unwrap();
    let got = rt()
        .block_on(t.session.run_plan(planned, std::time::Instant::now()))
        .unwrap();
    let rows = |out: &super::SqlOutput| -> Vec<Option<Vec<f32>>> {
        out.batches
            .iter()
            .flat_map(|b| {
                let col = b.column(1).as_fixed_size_list().clone();
                (0..col.len())
                    .map(|i| {
                        col.is_valid(i)
                            .then(|| col.value(i).as_primitive::<Float32Type>().values().to_vec())
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let (want, got) = (rows(&want), rows(&got));
    assert_eq!(want.len(), 3);
    assert!(want[0].as_ref().is_some_and(|v| v.len() == 16), "{want:?}");
    assert_eq!(got, want);
}

/// A session without a model (as `--to-substrait` has) writes a plan whose
/// embeddings have no dims, typed as lists; a session with the model runs it
/// to the vectors and similarity the SQL gives there. Running it without a
/// model is an error saying dims are missing.
#[test]
fn a_plan_written_without_a_model_runs_on_one() {
    use crate::inference::backend::NoAnswers;

    let sql = "SELECT ai_embed(t) AS e, ai_similarity(t, 'a loud film') AS s \
               FROM (VALUES ('a quiet film'), (NULL)) AS v(t)";
    let bare = SqlSession::new(
        Arc::new(NoAnswers),
        QueryOptions::default(),
        Evaluation::Operators,
    )
    .unwrap();
    let plan = rt().block_on(bare.to_substrait(sql)).unwrap();
    let e = rt().block_on(bare.run(sql)).unwrap_err().to_string();
    assert!(e.contains("ai_embed: no dims given"), "{e}");
    let t = tiny();
    let want = rt().block_on(t.session.run(sql)).unwrap();
    let planned = rt().block_on(t.session.plan_substrait(&plan)).unwrap();
    let got = rt()
        .block_on(t.session.run_plan(planned, std::time::Instant::now()))
        .unwrap();
    let (want, got) = (&want.batches[0], &got.batches[0]);
    assert_eq!(got.column(0).data_type(), want.column(0).data_type());
    assert_eq!(got.column(0).len(), 2);
    assert!(got.column(0).is_null(1));
    assert_eq!(
        got.column(0).as_fixed_size_list().value(0).as_ref(),
        want.column(0).as_fixed_size_list().value(0).as_ref()
    );
    assert_eq!(
        got.column(1)
            .as_primitive::<datafusion::arrow::datatypes::Float64Type>(),
        want.column(1)
            .as_primitive::<datafusion::arrow::datatypes::Float64Type>()
    );
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn bad_embedding_calls_are_errors() {
    let t = tiny();
    let e = error(&t.session, "SELECT ai_embed('x', 65)");
    assert!(
        e.contains("dims 65 is more than the embedding model's 64 dimensions"),
        "{e}"
    );
    let e = error(&t.session, "SELECT ai_embed('x', 0)");
    assert!(
        e.contains("dims (argument 2) must be a positive integer"),
        "{e}"
    );
    let e = error(
        &t.session,
        "SELECT ai_embed(t, t) FROM (VALUES ('a')) AS v(t)",
    );
    assert!(
        e.contains("the instruction (argument 2) must be a string literal"),
        "{e}"
    );
    let e = error(
        &t.session,
        "SELECT AI_EMBED('snowflake-arctic-embed-m', t) FROM (VALUES ('a')) AS v(t)",
    );
    assert!(
        e.contains("Snowflake's AI_EMBED('model', text) is not read"),
        "{e}"
    );
    let e = error(&t.session, "SELECT ai_embed('x', 'i', 8, 9)");
    assert!(
        e.contains("ai_embed takes (text [, 'instruction'] [, dims])"),
        "{e}"
    );
    let e = error(&t.session, "SELECT ai_similarity('x')");
    assert!(e.contains("takes two texts"), "{e}");
}
