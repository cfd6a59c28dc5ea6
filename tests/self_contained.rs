//! The repository stands on its own: no file names the reference shelf that sits
//! beside the repository on developers' machines, and the binary finds the QUAIL-B
//! plans (built into it) from any folder, by query id.

use std::path::{Path, PathBuf};

use assert_cmd::Command;

mod common;
use common::Fails;
use common::cli::aisql;

/// Paths a file of the repository must not name. Built at run time so this file
/// does not name them itself.
fn forbidden() -> Vec<String> {
    let shelf = ["shared", "quailb"].join("/");
    vec![
        ["..", "shared"].join("/"),
        shelf,
        ["shared", "research"].join("/"),
    ]
}

/// Folders that are build outputs or caches, not the repository's files.
const SKIPPED: [&str; 7] = [
    "artifacts",
    ".git",
    "target",
    ".cuda",
    ".gpu-carry",
    "benchmark_results",
    "node_modules",
];

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if path.is_dir() {
            if !SKIPPED.iter().any(|s| name == *s) {
                walk(&path, out);
            }
        } else {
            out.push(path);
        }
    }
}

#[test]
fn no_file_of_the_repository_names_the_reference_shelf() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    walk(root, &mut files);
    assert!(files.len() > 100, "walked {} files", files.len());
    let needles = forbidden();
    let mut hits = Vec::new();
    for file in &files {
        let bytes = std::fs::read(file).unwrap();
        for needle in &needles {
            if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                hits.push(format!("{} names {needle}", file.display()));
            }
        }
    }
    assert!(hits.is_empty(), "{}", hits.join("\n"));
}

fn aisql_in(dir: &Path) -> Command {
    let mut c = aisql();
    c.current_dir(dir);
    c
}

#[test]
fn explain_by_query_id_works_from_any_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let out = aisql_in(tmp.path())
        .args(["explain", "IMDB-7"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("Scan reviews"), "{text}");
    // A plan path still works, and wins over an id.
    let path = aisql_bench::plans::repository_plans_dir().join("FEV-8.json");
    aisql_in(tmp.path())
        .arg("explain")
        .arg(&path)
        .assert()
        .success();
}

#[test]
fn unknown_ids_and_overriding_folders_give_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let err = aisql_in(tmp.path()).args(["explain", "IMDB-77"]).fails();
    assert!(
        err.contains("IMDB-77") && err.contains("no such file") && err.contains("IMDB-7,"),
        "{err}"
    );
    // --plans DIR overrides the built-in plans: a folder without IMDB-7 has no IMDB-7.
    let plans = tmp.path().join("plans");
    std::fs::create_dir(&plans).unwrap();
    std::fs::copy(
        aisql_bench::plans::repository_plans_dir().join("catalog.json"),
        plans.join("catalog.json"),
    )
    .unwrap();
    let err = aisql_in(tmp.path())
        .args(["explain", "IMDB-7", "--plans"])
        .arg(&plans)
        .fails();
    assert!(
        err.contains("IMDB-7.json") && err.contains("plans"),
        "{err}"
    );
    // So does the environment variable.
    let err = aisql_in(tmp.path())
        .env("AISQL_QUAILB_PLANS", &plans)
        .args(["explain", "IMDB-7"])
        .fails();
    assert!(err.contains("IMDB-7.json"), "{err}");
}
