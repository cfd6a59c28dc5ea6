//! `aisql query` from the command line. With `--answer-cache DIR`, a query
//! killed with SIGKILL while the tiny model answers is run again with the same
//! cache, finishes with the rows of an uninterrupted run, and asks the model
//! only what the killed run had not answered; bad uses are refused by name.
//! With `--output-dir` alone, rows.parquet is written as the rows arrive and
//! holds every row, while only the printed ones are kept.

#![cfg(unix)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::cli::{aisql_process, stderr_of_success};
use common::{Fails, cache_counts, log_bytes};

const QUERY: &str = "IMDB-1";

fn query(root: &Path, cache: &Path, rows: &Path, answers: Option<&Path>) -> Command {
    let mut c = aisql_process();
    c.args([
        "query",
        QUERY,
        "--sf",
        "0.01",
        "--cpu",
        "--batch-rows",
        "16",
    ])
    .arg("--root")
    .arg(root)
    .arg("--output")
    .arg(rows)
    .env("AISQL_CACHE_DIR", cache)
    .stdout(Stdio::null());
    if let Some(dir) = answers {
        c.arg("--answer-cache").arg(dir);
    }
    c
}

#[test]
fn a_killed_query_reruns_asking_the_model_only_what_was_missing() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("quailb");
    aisql_standin::generate(&root, 0.01).unwrap();
    let cache = tmp.path().join("cache");
    let answers = tmp.path().join("answers");

    // Uninterrupted, without a cache (this also generates the tiny model).
    let want = tmp.path().join("want.csv");
    stderr_of_success(&mut query(&root, &cache, &want, None));

    // Killed once some answers are on disk.
    let killed_rows = tmp.path().join("killed.csv");
    let mut child = query(&root, &cache, &killed_rows, Some(&answers))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the query ended ({status}) before it could be killed mid-run");
        }
        if log_bytes(&answers) > 0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no answer written"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!killed_rows.exists(), "a killed query left rows behind");

    // The rerun: same rows, part of the answers from the cache.
    let got = tmp.path().join("got.csv");
    let stderr = stderr_of_success(&mut query(&root, &cache, &got, Some(&answers)));
    let (reused, asked) = cache_counts(&stderr);
    assert!(reused > 0 && asked > 0, "reused {reused}, asked {asked}");
    assert_eq!(
        std::fs::read_to_string(&got).unwrap(),
        std::fs::read_to_string(&want).unwrap()
    );

    // Once more: nothing is asked, and every question of the query was either
    // reused or asked by the rerun.
    let again = tmp.path().join("again.csv");
    let stderr = stderr_of_success(&mut query(&root, &cache, &again, Some(&answers)));
    assert_eq!(cache_counts(&stderr), (reused + asked, 0));
    assert!(stderr.contains("fresh tokens: 0"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(&again).unwrap(),
        std::fs::read_to_string(&want).unwrap()
    );
}

#[test]
fn bad_uses_of_the_answer_cache_are_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("quailb");
    aisql_standin::generate(&root, 0.01).unwrap();
    let cache = tmp.path().join("cache");
    let rows = tmp.path().join("rows.csv");

    let e = query(&root, &cache, &rows, Some(&tmp.path().join("answers")))
        .args(["--backend", "oracle"])
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(e.status.code(), Some(1));
    let e = String::from_utf8_lossy(&e.stderr);
    assert!(
        e.contains("--answer-cache") && e.contains("--backend model"),
        "{e}"
    );

    let file = tmp.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let e = assert_cmd::Command::from_std(query(&root, &cache, &rows, Some(&file))).fails();
    assert!(e.contains("a-file") && e.contains("not a folder"), "{e}");
}

#[test]
fn output_dir_streams_every_row_while_printing_the_limit() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("quailb");
    aisql_standin::generate(&root, 0.01).unwrap();
    let cache = tmp.path().join("cache");
    let run = |extra: &[&str]| {
        let out = aisql_process()
            .args([
                "query",
                "IMDB-2",
                "--sf",
                "0.01",
                "--backend",
                "oracle",
                "--format",
                "csv",
            ])
            .arg("--root")
            .arg(&root)
            .args(extra)
            .env("AISQL_CACHE_DIR", &cache)
            .env_remove("AISQL_ROOT")
            .env_remove("AISQL_QUAILB_PLANS")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    let all = tmp.path().join("all.parquet");
    let (_, whole) = run(&["--output", all.to_str().unwrap()]);
    let dir = tmp.path().join("out");
    let (printed, streamed) = run(&["--limit", "3", "--output-dir", dir.to_str().unwrap()]);
    let want = aisql_engine::data::files::read_parquet(&all).unwrap();
    let got = aisql_engine::data::files::read_parquet(&dir.join("rows.parquet")).unwrap();
    assert!(
        want.num_rows() > 3,
        "IMDB-2 at sf 0.01 has {} rows",
        want.num_rows()
    );
    assert_eq!(got, want);
    // A header and three rows printed, the total counted.
    assert_eq!(printed.lines().count(), 4, "{printed}");
    let total = format!("{} rows in", want.num_rows());
    assert!(
        streamed.contains(&total) && streamed.contains("(3 shown)"),
        "{streamed}"
    );
    assert!(whole.contains(&total), "{whole}");
    assert!(dir.join("plan.substrait").exists());
    // Without --limit, csv carries every row, printed as they arrive.
    let (printed, _) = run(&["--output-dir", dir.to_str().unwrap()]);
    assert_eq!(printed.lines().count(), want.num_rows() + 1);
    // An earlier query's answer tables do not stay beside this one's outputs
    // (IMDB-2 writes joins-0.parquet only).
    for stale in ["classifications-0.parquet", "filters-7.parquet"] {
        std::fs::write(dir.join(stale), b"from another query").unwrap();
    }
    std::fs::write(dir.join("mine.txt"), b"not aisql's").unwrap();
    let (_, stderr) = run(&["--output-dir", dir.to_str().unwrap()]);
    assert!(
        stderr.contains("classifications-0.parquet, filters-7.parquet"),
        "{stderr}"
    );
    assert!(!dir.join("classifications-0.parquet").exists());
    assert!(!dir.join("filters-7.parquet").exists());
    assert!(dir.join("mine.txt").exists() && dir.join("joins-0.parquet").exists());
}

/// Past `--timeout-s` the query stops and fails naming the limit; what it had
/// streamed stays whole: the printed JSON is closed and rows.parquet holds the
/// rows printed before the deadline, with no temporary file beside it.
#[test]
fn a_query_past_its_timeout_keeps_the_rows_it_streamed_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("quailb");
    aisql_standin::generate(&root, 0.01).unwrap();
    let dir = tmp.path().join("out");
    let started = Instant::now();
    let out = aisql_process()
        .args([
            "query", "AGENT-1", "--sf", "0.01", "--cpu", "--model", "tiny",
        ])
        .args(["--batch-rows", "1", "--batch-tokens", "2048"])
        .args(["--format", "json", "--timeout-s", "2"])
        .arg("--root")
        .arg(&root)
        .arg("--output-dir")
        .arg(&dir)
        .env("AISQL_CACHE_DIR", tmp.path().join("cache"))
        .env_remove("AISQL_ROOT")
        .env_remove("AISQL_MODEL")
        .env_remove("AISQL_ANSWER_CACHE")
        .env_remove("AISQL_QUAILB_PLANS")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("ran past --timeout-s 2"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(300));
    let printed: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    let rows = aisql_engine::data::files::read_parquet(&dir.join("rows.parquet")).unwrap();
    assert_eq!(rows.num_rows(), printed.len());
    let kept = match printed.len() {
        1 => "1 row".to_string(),
        n => format!("{n} rows"),
    };
    assert!(
        stderr.contains(&format!(
            "holds the {kept} that arrived before the deadline"
        )),
        "{stderr}"
    );
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["rows.parquet"]);
}
