//! aisql writes only where it is told: runs over a read-only copy of the dataset,
//! the tables and the model leave every file and folder of them unchanged; a
//! cache entry damaged on disk (the tiny model, the stand-in corpus) is detected
//! by its seal and rebuilt, never used; and answers copied into the answer
//! cache folder of another model are skipped and counted, never used.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use sha2::{Digest, Sha256};

mod common;
use common::cli::aisql;

const SF: &str = "0.002";

/// Every file and folder under `dir`: size, modification time and (files) SHA-256.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (u64, SystemTime, String)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let meta = std::fs::metadata(&d).unwrap();
        out.insert(d.clone(), (0, meta.modified().unwrap(), String::new()));
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::metadata(&path).unwrap();
            if meta.is_dir() {
                stack.push(path);
            } else {
                let hash = hex::encode(Sha256::digest(std::fs::read(&path).unwrap()));
                out.insert(path, (meta.len(), meta.modified().unwrap(), hash));
            }
        }
    }
    out
}

/// Makes `dir` read-only (or writable again). Root ignores the bits, which is why
/// the test compares snapshots too.
fn set_read_only(dir: &Path, read_only: bool) {
    let mut stack = vec![dir.to_path_buf()];
    let mut all = Vec::new();
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path.clone());
            }
            all.push(path);
        }
        all.push(d);
    }
    for path in all {
        let mode = match (path.is_dir(), read_only) {
            (true, true) => 0o555,
            (true, false) => 0o755,
            (false, true) => 0o444,
            (false, false) => 0o644,
        };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
}

#[test]
fn runs_over_read_only_inputs_leave_them_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    let inputs = tmp.path().join("inputs");
    let root = inputs.join("quailb");
    aisql_standin::generate(&root, SF.parse().unwrap()).unwrap();
    let model = inputs.join("model");
    aisql()
        .arg("model")
        .arg("tiny")
        .arg("--out")
        .arg(&model)
        .assert()
        .success();
    let corpus = std::fs::read_dir(root.join("corpora"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let before = snapshot(&inputs);
    set_read_only(&inputs, true);
    let out = tmp.path().join("out");
    let runs: Vec<Vec<String>> = vec![
        vec!["bench".into(), "--queries".into(), "IMDB-1,FEV-1".into()],
        vec![
            "bench".into(),
            "--queries".into(),
            "IMDB-7".into(),
            "--backend".into(),
            "oracle".into(),
            "--simulate".into(),
        ],
    ];
    for (i, args) in runs.iter().enumerate() {
        aisql()
            .args(args)
            .args(["--sf", SF, "--model"])
            .arg(&model)
            .arg("--root")
            .arg(&root)
            .arg("--output-dir")
            .arg(out.join(format!("bench-{i}")))
            .assert()
            .success();
    }
    aisql()
        .args(["query", "IMDB-1", "--model"])
        .arg(&model)
        .arg("--tables")
        .arg(&corpus)
        .arg("--output-dir")
        .arg(out.join("query"))
        .assert()
        .success();
    set_read_only(&inputs, false);
    let after = snapshot(&inputs);
    assert_eq!(before.len(), after.len());
    for (path, was) in &before {
        assert_eq!(Some(was), after.get(path), "{} changed", path.display());
    }
}

/// Flips one byte in the middle of `path`.
fn damage(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let i = bytes.len() / 2;
    bytes[i] ^= 0x55;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_damaged_cache_entry_is_rebuilt_not_used() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let bench = |name: &str| {
        let out = aisql()
            .env("AISQL_CACHE_DIR", &cache)
            .args([
                "bench",
                "--sf",
                SF,
                "--queries",
                "IMDB-1",
                "--model",
                "tiny",
                "--output-dir",
            ])
            .arg(tmp.path().join(name))
            .assert()
            .success()
            .get_output()
            .stderr
            .clone();
        String::from_utf8_lossy(&out).into_owned()
    };
    bench("first");
    let weights = cache.join("models/tiny-qwen3-seed0/model.safetensors");
    let standin = cache.join("quailb-standin");
    let reviews = std::fs::read_dir(standin.join("corpora"))
        .unwrap()
        .map(|e| e.unwrap().path().join("reviews.parquet"))
        .find(|p| p.exists())
        .unwrap();
    damage(&weights);
    damage(&reviews);
    let err = bench("second");
    assert!(
        err.contains("tiny model") && err.contains("damaged") && err.contains("model.safetensors"),
        "{err}"
    );
    assert!(
        err.contains("reviews.parquet does not match its recorded SHA-256")
            && err.contains("generating"),
        "{err}"
    );
    let rows = |name: &str| {
        aisql_engine::data::files::read_parquet(&tmp.path().join(name).join("IMDB-1/rows.parquet"))
            .unwrap()
    };
    assert_eq!(rows("first"), rows("second"));
    // Rebuilt and sealed again: a third run uses the cache without a word.
    let err = bench("third");
    assert!(
        !err.contains("damaged") && !err.contains("generating"),
        "{err}"
    );
}

/// (answers held, records skipped) from the answer cache's opening line.
fn cache_opened(stderr: &str) -> (u64, u64) {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("answer cache /") || l.starts_with("answer cache \\"))
        .unwrap_or_else(|| panic!("no answer cache line in:\n{stderr}"));
    let numbers: Vec<u64> = line
        .split([' ', '('])
        .filter_map(|w| w.parse().ok())
        .collect();
    (numbers[0], numbers.get(1).copied().unwrap_or(0))
}

#[test]
fn answers_moved_from_another_models_cache_folder_are_skipped_and_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sql/data/docs.csv");
    let answers = tmp.path().join("answers");
    let model = |seed: &str| {
        let dir = tmp.path().join(format!("tiny-{seed}"));
        aisql()
            .args(["model", "tiny", "--seed", seed, "--out"])
            .arg(&dir)
            .assert()
            .success();
        dir
    };
    let (a, b) = (model("1"), model("2"));
    // (rows, stderr) of the query on `model`, with or without the cache.
    let run = |model: &Path, cached: bool| {
        let mut c = aisql();
        c.env("AISQL_CACHE_DIR", tmp.path().join("cache"))
            .env_remove("AISQL_ANSWER_CACHE")
            .args([
                "sql",
                "SELECT id FROM docs WHERE ai_filter('Is the review {0} kind?', body) ORDER BY id",
                "--cpu",
                "--format",
                "csv",
            ])
            .arg("--table")
            .arg(format!("docs={}", docs.display()))
            .arg("--model")
            .arg(model);
        if cached {
            c.arg("--answer-cache").arg(&answers);
        }
        let out = c.assert().success().get_output().clone();
        (
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    let folders = || -> Vec<PathBuf> {
        let mut f: Vec<PathBuf> = std::fs::read_dir(&answers)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        f.sort();
        f
    };
    let (rows_a, _) = run(&a, true);
    let a_folder = folders().remove(0);
    let (rows_b, _) = run(&b, false);
    // The two models disagree somewhere, or the test could not tell their
    // answers apart.
    assert_ne!(rows_a, rows_b, "pick seeds whose tiny models disagree");
    run(&b, true);
    let b_folder = folders().into_iter().find(|f| *f != a_folder).unwrap();
    let (a_log, b_log) = (a_folder.join("answers.v4"), b_folder.join("answers.v4"));
    std::fs::copy(&a_log, &b_log).unwrap();
    let (a_held, _) = cache_opened(&run(&a, true).1);
    assert!(a_held > 0);
    let (rows, stderr) = run(&b, true);
    assert_eq!(cache_opened(&stderr), (0, a_held), "{stderr}");
    assert!(stderr.contains("another model identity"), "{stderr}");
    assert_eq!(common::cache_counts(&stderr).0, 0, "{stderr}");
    assert_eq!(rows, rows_b);
}
