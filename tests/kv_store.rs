//! The on-disk KV store (`--kv-store DIR`) from the command line: a second
//! process over the same documents reads their KV instead of computing it and
//! answers row for row as a run without the store; damaged blocks are
//! counted and computed again, never used; another model never matches; the
//! store stays within `--kv-store-size`; `aisql kv-store stats|verify|clear`
//! say what it holds; and the store's folder is under the write rule.

#![cfg(unix)]

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::Fails;
use common::cli::{aisql, aisql_process, table_arg};

struct Setup {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    cache: PathBuf,
    table: String,
}

fn setup() -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let docs = dir.join("docs.csv");
    let mut csv = String::from("id,body\n");
    for i in 0..40 {
        csv.push_str(&format!(
            "d{i},\"Review {i}: the film's pacing is {} and the score is {} over {} minutes. \
             The lead gives a {} performance, the camera work is {}, and the second act \
             spends a long stretch on a subplot about a {} that most viewers will {}. \
             By the end the story has {} its early promise.\"\n",
            ["slow", "brisk", "uneven", "steady"][i % 4],
            ["loud", "quiet", "lush"][i % 3],
            80 + i * 3,
            ["restrained", "showy", "warm", "cold", "tired"][i % 5],
            ["handheld", "static", "inventive"][i % 3],
            [
                "lighthouse",
                "bakery",
                "courtroom",
                "ferry",
                "garden",
                "mine",
                "choir"
            ][i % 7],
            ["forget", "admire", "skip"][i % 3],
            ["kept", "squandered"][i % 2]
        ));
    }
    std::fs::write(&docs, csv).unwrap();
    Setup {
        cache: dir.join("cache"),
        table: table_arg("docs", &docs),
        dir,
        _tmp: tmp,
    }
}

const Q1: &str =
    "SELECT id FROM docs WHERE ai_filter('Is the pacing praised? {0}', body) ORDER BY id";
const Q2: &str =
    "SELECT id FROM docs WHERE ai_filter('Is the music mentioned? {0}', body) ORDER BY id";

fn sql(s: &Setup, query: &str, store: Option<&Path>, extra: &[&str]) -> Command {
    let mut c = aisql_process();
    c.args(["sql", query, "--table", &s.table])
        .args(["--model", "tiny", "--cpu", "--format", "csv"])
        .args(extra)
        .env("AISQL_CACHE_DIR", &s.cache);
    if let Some(dir) = store {
        c.arg("--kv-store").arg(dir);
    }
    c
}

/// Rows on stdout and the stderr of a run that must succeed.
fn run(c: &mut Command) -> (String, String) {
    let out = c.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    (String::from_utf8(out.stdout).unwrap(), stderr)
}

/// A figure of the stderr report: the number after `label`.
fn figure(stderr: &str, label: &str) -> u64 {
    let at = stderr
        .find(label)
        .unwrap_or_else(|| panic!("no {label:?} in: {stderr}"));
    stderr[at + label.len()..]
        .split(|c: char| !c.is_ascii_digit())
        .find(|p| !p.is_empty())
        .unwrap()
        .parse()
        .unwrap()
}

fn fresh(stderr: &str) -> u64 {
    figure(stderr, "fresh tokens: ")
}

fn read(stderr: &str) -> u64 {
    figure(stderr, "KV store: ")
}

fn rejected(stderr: &str) -> u64 {
    match stderr.find("bytes written, ") {
        Some(_) => figure(stderr, "bytes written, "),
        None => 0,
    }
}

/// Runs `c`, which must fail with exit code 1, and returns its stderr.
fn fails(c: Command) -> String {
    assert_cmd::Command::from_std(c).fails()
}

/// Runs `c`, which must be refused as a usage error (exit code 2), and
/// returns its stderr.
fn refused(c: Command) -> String {
    let out = assert_cmd::Command::from_std(c)
        .assert()
        .code(2)
        .get_output()
        .stderr
        .clone();
    String::from_utf8_lossy(&out).into_owned()
}

fn blocks(store: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for id in std::fs::read_dir(store).unwrap().flatten() {
        if !id.path().is_dir() {
            continue;
        }
        for shard in std::fs::read_dir(id.path()).unwrap().flatten() {
            if shard.path().is_dir() {
                out.extend(
                    std::fs::read_dir(shard.path())
                        .unwrap()
                        .flatten()
                        .map(|f| f.path()),
                );
            }
        }
    }
    out
}

#[test]
fn a_second_process_reads_the_documents_kv_and_answers_the_same_rows() {
    let s = setup();
    let store = s.dir.join("kv");
    let (want1, alone1) = run(&mut sql(&s, Q1, None, &[]));
    let (want2, alone2) = run(&mut sql(&s, Q2, None, &[]));

    let (rows, first) = run(&mut sql(&s, Q1, Some(&store), &[]));
    assert_eq!(rows, want1);
    assert_eq!(fresh(&first), fresh(&alone1), "{first}");
    assert_eq!(read(&first), 0, "{first}");
    assert!(!blocks(&store).is_empty());

    // Another question over the same documents, in a new process: only
    // the question is computed.
    let (rows, second) = run(&mut sql(&s, Q2, Some(&store), &[]));
    assert_eq!(rows, want2);
    assert!(read(&second) > 0, "{second}");
    assert!(
        fresh(&second) * 4 < fresh(&alone2),
        "fresh tokens with the store {} against {} without: {second}",
        fresh(&second),
        fresh(&alone2)
    );
    assert_eq!(fresh(&second) + read(&second), fresh(&alone2), "{second}");

    // `kv-store verify` passes, and stats count the blocks.
    let verify = aisql()
        .args(["kv-store", "verify"])
        .arg(&store)
        .env("AISQL_CACHE_DIR", &s.cache)
        .assert()
        .success();
    let out = String::from_utf8_lossy(&verify.get_output().stdout).into_owned();
    assert!(out.contains("every block passed"), "{out}");
    let stats = aisql()
        .args(["kv-store", "stats", "--format", "json"])
        .arg(&store)
        .assert()
        .success();
    let stats: serde_json::Value = serde_json::from_slice(&stats.get_output().stdout).unwrap();
    assert_eq!(
        stats["identities"][0]["blocks"].as_u64().unwrap() as usize,
        blocks(&store).len()
    );
    assert_eq!(stats["bytes"], stats["recorded_bytes"]);
}

#[test]
fn damaged_blocks_are_counted_and_computed_never_used() {
    let s = setup();
    let store = s.dir.join("kv");
    let (want, alone) = run(&mut sql(&s, Q1, None, &[]));
    run(&mut sql(&s, Q1, Some(&store), &[]));
    let files = blocks(&store);
    // One flipped byte in each block, one block cut short.
    for (i, f) in files.iter().enumerate() {
        let mut bytes = std::fs::read(f).unwrap();
        if i == 0 {
            bytes.truncate(bytes.len() / 2);
        } else {
            let at = bytes.len() / 2 + i;
            bytes[at] ^= 0x01;
        }
        std::fs::write(f, bytes).unwrap();
    }
    let verify = aisql()
        .args(["kv-store", "verify"])
        .arg(&store)
        .env("AISQL_CACHE_DIR", &s.cache)
        .fails();
    assert!(
        verify.contains(&format!("{} block(s)", files.len())),
        "{verify}"
    );
    let (rows, again) = run(&mut sql(&s, Q1, Some(&store), &[]));
    assert_eq!(rows, want);
    assert_eq!(read(&again), 0, "{again}");
    assert_eq!(rejected(&again), files.len() as u64, "{again}");
    assert_eq!(fresh(&again), fresh(&alone));
    // Computed again, they were written again whole: the next run reads them.
    let (rows, third) = run(&mut sql(&s, Q1, Some(&store), &[]));
    assert_eq!(rows, want);
    assert!(read(&third) > 0 && rejected(&third) == 0, "{third}");

    // A store signed by another user (another cache folder, another key)
    // is computed again, never used.
    let other_cache = s.dir.join("other-cache");
    let mut c = sql(&s, Q1, Some(&store), &[]);
    c.env("AISQL_CACHE_DIR", &other_cache);
    let (rows, foreign) = run(&mut c);
    assert_eq!(rows, want);
    assert_eq!(read(&foreign), 0, "{foreign}");
    assert!(rejected(&foreign) > 0, "{foreign}");
}

#[test]
fn another_model_never_matches_and_the_store_keeps_its_bound() {
    let s = setup();
    let store = s.dir.join("kv");
    run(&mut sql(&s, Q1, Some(&store), &[]));
    let other = s.dir.join("tiny-seed1");
    aisql()
        .args(["model", "tiny", "--seed", "1", "--out"])
        .arg(&other)
        .assert()
        .success();
    let mut c = aisql_process();
    c.args(["sql", Q1, "--table", &s.table])
        .args(["--cpu", "--format", "csv", "--model"])
        .arg(&other)
        .arg("--kv-store")
        .arg(&store)
        .env("AISQL_CACHE_DIR", &s.cache);
    let (_, stderr) = run(&mut c);
    assert_eq!(read(&stderr), 0, "{stderr}");
    assert_eq!(rejected(&stderr), 0, "{stderr}");

    // A bound of a few blocks: the store never holds more.
    let small = s.dir.join("small");
    let one = std::fs::metadata(&blocks(&store)[0]).unwrap().len();
    let bound = one * 5;
    let (_, stderr) = run(&mut sql(
        &s,
        Q1,
        Some(&small),
        &["--kv-store-size", &bound.to_string()],
    ));
    let held: u64 = blocks(&small)
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum();
    assert!(
        held <= bound && held > 0,
        "{held} bytes held, bound {bound}: {stderr}"
    );

    // `clear` empties it; the store stays a store.
    let out = aisql()
        .args(["kv-store", "clear"])
        .arg(&small)
        .assert()
        .success();
    assert!(String::from_utf8_lossy(&out.get_output().stdout).contains("removed"));
    assert!(blocks(&small).is_empty());
}

#[test]
fn the_store_folder_is_checked_before_anything_is_written() {
    let s = setup();
    // Not a folder of other files.
    let busy = s.dir.join("busy");
    std::fs::create_dir(&busy).unwrap();
    std::fs::write(busy.join("notes.txt"), "mine").unwrap();
    let e = fails(sql(&s, Q1, Some(&busy), &[]));
    assert!(e.contains("not a KV store") && e.contains("busy"), "{e}");
    assert_eq!(
        std::fs::read_to_string(busy.join("notes.txt")).unwrap(),
        "mine"
    );
    // Not over an input: the table's folder holds docs.csv.
    let e = fails(sql(&s, Q1, Some(&s.dir), &[]));
    assert!(e.contains("--kv-store"), "{e}");
    // Not without a model, nor a size without a store.
    let e = refused(sql(
        &s,
        Q1,
        Some(&s.dir.join("kv")),
        &["--backend", "oracle"],
    ));
    assert!(e.contains("--kv-store"), "{e}");
    let e = refused(sql(&s, Q1, None, &["--kv-store-size", "1G"]));
    assert!(
        e.contains("--kv-store-size") && e.contains("--kv-store"),
        "{e}"
    );
    let e = aisql().args(["kv-store", "clear"]).arg(&busy).fails();
    assert!(e.contains("not an aisql KV store"), "{e}");
    assert!(busy.join("notes.txt").exists());
    assert!(!s.dir.join("kv").exists());
}

#[test]
fn two_processes_writing_one_store_at_once_leave_it_whole() {
    let s = setup();
    let store = s.dir.join("kv");
    let (want1, _) = run(&mut sql(&s, Q1, None, &[]));
    let (want2, _) = run(&mut sql(&s, Q2, None, &[]));
    // Both start with an empty store, so both compute and write the same
    // documents' blocks at the same time.
    let first = sql(&s, Q1, Some(&store), &[])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let second = sql(&s, Q2, Some(&store), &[])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    for (child, want) in [(first, &want1), (second, &want2)] {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(&String::from_utf8(out.stdout).unwrap(), want);
    }
    let verify = aisql()
        .args(["kv-store", "verify"])
        .arg(&store)
        .env("AISQL_CACHE_DIR", &s.cache)
        .assert()
        .success();
    let out = String::from_utf8_lossy(&verify.get_output().stdout).into_owned();
    assert!(out.contains("every block passed"), "{out}");
    // And a third process reads what they left.
    let (rows, third) = run(&mut sql(&s, Q1, Some(&store), &[]));
    assert_eq!(rows, want1);
    assert!(read(&third) > 0, "{third}");
    assert_eq!(rejected(&third), 0, "{third}");
}

#[test]
fn an_estimate_counts_as_fresh_only_what_the_store_does_not_hold() {
    let s = setup();
    let store = s.dir.join("kv");
    let estimate = |with_store: bool| -> u64 {
        let mut c = aisql_process();
        c.args(["sql", Q2, "--table", &s.table, "--model", "tiny", "--cpu"])
            .args(["--estimate", "--format", "json"])
            .env("AISQL_CACHE_DIR", &s.cache);
        if with_store {
            c.arg("--kv-store").arg(&store);
        }
        let (out, _) = run(&mut c);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["fresh_tokens"].as_u64().unwrap()
    };
    let before = estimate(false);
    run(&mut sql(&s, Q1, Some(&store), &[]));
    let after = estimate(true);
    let (_, second) = run(&mut sql(&s, Q2, Some(&store), &[]));
    assert!(
        after * 4 < before,
        "estimate {after} with the store, {before} without"
    );
    // A filter's positions do not depend on its answers: the estimate is
    // what the query then computes.
    assert_eq!(after, fresh(&second), "{second}");
}
