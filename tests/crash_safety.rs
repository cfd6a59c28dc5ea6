//! Crash safety: `aisql bench` killed with SIGKILL at ten moments spread over a run
//! (and four more surely mid-write, one per kind of output file) leaves no truncated or half-written file behind, and
//! `--resume` then finishes the run with results identical to an uninterrupted run.

#![cfg(unix)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::Value;

mod common;
use common::cli::aisql_process;

const QUERIES: &str = "IMDB-1,IMDB-2,FEV-1";

fn bench(root: &Path, cache: &Path, run: &Path, resume: bool) -> Command {
    let mut c = aisql_process();
    c.args(["bench", "--sf", "0.002", "--cpu", "--queries", QUERIES])
        .arg("--root")
        .arg(root)
        .arg(if resume { "--resume" } else { "--output-dir" })
        .arg(run)
        .env("AISQL_CACHE_DIR", cache)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c
}

fn run_json(run: &Path) -> Option<Value> {
    let text = std::fs::read_to_string(run.join("run.json")).ok()?;
    // run.json is written atomically: whenever it exists it must parse.
    Some(serde_json::from_str(&text).expect("run.json is never half-written"))
}

/// Every file run.json lists for a saved or complete query exists with the
/// SHA-256 recorded for it.
fn check_listed_files(run: &Path, j: &Value) {
    for q in j["queries"].as_array().unwrap() {
        let Some(hashes) = q["files"]["sha256"].as_object() else {
            continue;
        };
        for (path, want) in hashes {
            let bytes = std::fs::read(run.join(path))
                .unwrap_or_else(|e| panic!("{}: {path} listed but unreadable: {e}", q["id"]));
            let got = aisql_bench::layout::sha256_file(&run.join(path)).unwrap();
            assert_eq!(
                &got,
                want.as_str().unwrap(),
                "{}: {path} ({} bytes)",
                q["id"],
                bytes.len()
            );
        }
    }
}

/// What must be identical to an uninterrupted run, per query: status, files and
/// their hashes, and every metric that does not depend on the clock.
fn outcome(j: &Value) -> Vec<Value> {
    j["queries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| {
            let m = &q["metrics"];
            serde_json::json!({
                "id": q["id"], "status": q["status"], "files": q["files"],
                "accuracy": m["accuracy"], "fresh": m["fresh_tokens"],
                "input": m["input_tokens"], "minimum": m["minimum_tokens"],
                "assessment": q["assessment"],
            })
        })
        .collect()
}

/// Names of every file under `dir`.
fn walk_names(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
    }
    out
}

#[test]
fn sigkill_at_ten_moments_then_resume_gives_the_uninterrupted_result() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("quailb");
    aisql_standin::generate(&root, 0.002).unwrap();
    let cache = tmp.path().join("cache");

    // A first run generates the tiny model into the cache, so the timed reference
    // run below is as long as the runs that get killed.
    let warmup = tmp.path().join("warmup");
    assert!(
        bench(&root, &cache, &warmup, false)
            .status()
            .unwrap()
            .success()
    );
    let reference = tmp.path().join("reference");
    let start = Instant::now();
    assert!(
        bench(&root, &cache, &reference, false)
            .status()
            .unwrap()
            .success()
    );
    let full = start.elapsed();
    let want = outcome(&run_json(&reference).unwrap());

    // Ten kill moments spread over the run's length (a fixed pseudo-random draw).
    let mut interrupted = 0;
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for k in 0..10 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let at = full.mul_f64((k as f64 + (state % 1000) as f64 / 1000.0) / 10.0);
        let run = tmp.path().join(format!("run-{k}"));
        let mut child = bench(&root, &cache, &run, false).spawn().unwrap();
        std::thread::sleep(at);
        let _ = child.kill(); // SIGKILL; the run may already have finished
        child.wait().unwrap();
        let left = match run_json(&run) {
            Some(j) => {
                check_listed_files(&run, &j);
                interrupted += usize::from(j["status"] != "complete");
                let queries = j["queries"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|q| {
                        format!(
                            "{} {}",
                            q["id"].as_str().unwrap(),
                            q["status"].as_str().unwrap()
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                format!("run {}: {queries}", j["status"].as_str().unwrap())
            }
            None => {
                interrupted += 1;
                "no run.json yet".into()
            }
        };
        let temp_files = walk_names(&run)
            .iter()
            .filter(|n| aisql_engine::data::files::is_temp_name(n))
            .count();
        // Finish: resume when run.json exists, else start again in the same folder.
        for _ in 0..3 {
            let resume = run.join("run.json").exists();
            if bench(&root, &cache, &run, resume)
                .status()
                .unwrap()
                .success()
            {
                break;
            }
        }
        let j = run_json(&run).unwrap_or_else(|| panic!("kill {k} at {at:?}: no run.json"));
        assert_eq!(j["status"], "complete", "kill {k} at {at:?}");
        check_listed_files(&run, &j);
        let got = outcome(&j);
        let relative = |v: &Vec<Value>| serde_json::to_string(v).unwrap();
        assert_eq!(relative(&got), relative(&want), "kill {k} at {at:?}");
        eprintln!(
            "kill {k}: at {:.2} s of {:.2} s; left: {left}; temporary files left: {temp_files}; \
             resumed: identical to the uninterrupted run",
            at.as_secs_f64(),
            full.as_secs_f64()
        );
    }
    // And kills that surely land mid-write: each output file is held half-done
    // (written under its temporary name, not yet renamed) for a while, and the run
    // is killed as soon as one of the kind shows up.
    for (k, kind) in ["run.json", "rows.parquet", "report.md", ".svg"]
        .iter()
        .enumerate()
    {
        let run = tmp.path().join(format!("mid-write-{k}"));
        let mut child = bench(&root, &cache, &run, false)
            .env(aisql_engine::data::files::SLOW_PUBLISH_ENV, "300")
            .spawn()
            .unwrap();
        let t0 = Instant::now();
        let caught = loop {
            let half_done = walk_names(&run)
                .into_iter()
                .find(|n| aisql_engine::data::files::is_temp_name(n) && n.contains(kind));
            if half_done.is_some() || t0.elapsed() > full * 20 {
                break half_done;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        };
        let _ = child.kill();
        child.wait().unwrap();
        let caught = caught.unwrap_or_else(|| panic!("no half-written {kind} seen"));
        if let Some(j) = run_json(&run) {
            check_listed_files(&run, &j);
        }
        let resume = run.join("run.json").exists();
        assert!(
            bench(&root, &cache, &run, resume)
                .status()
                .unwrap()
                .success()
        );
        let j = run_json(&run).unwrap();
        assert_eq!(j["status"], "complete", "mid-write {kind}");
        check_listed_files(&run, &j);
        assert_eq!(outcome(&j), want, "mid-write {kind}");
        eprintln!(
            "kill mid-write of {caught} at {:.2} s; resumed: identical to the uninterrupted run",
            t0.elapsed().as_secs_f64()
        );
    }

    // The kills must really land inside runs, not after them.
    assert!(
        interrupted >= 5,
        "only {interrupted} of 10 kills interrupted a run ({full:?})"
    );
}
