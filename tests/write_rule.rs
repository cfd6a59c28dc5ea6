//! The one write rule, as a hostile user tries it: no command writes over or
//! into what it reads (table files and folders, the SQL file, the plan file, the
//! data root, the model folder), however the path is spelled; a model command
//! never writes into a model's folder, nor over a model without `--force`; SQL is read-only
//! unless `--allow-writes`, and even then never writes into an input or opens
//! files the command line did not name. Every refusal leaves the input's bytes
//! as they were.

mod common;

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use common::Fails;
use common::cli::aisql;

/// Every file under `dir` with its bytes, sorted by path.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let bytes = std::fs::read(&p).unwrap();
                files.push((p, bytes));
            }
        }
    }
    files.sort();
    files
}

/// The first file named `name` under `dir`.
fn find(dir: &Path, name: &str) -> PathBuf {
    snapshot(dir)
        .into_iter()
        .map(|(p, _)| p)
        .find(|p| p.file_name().is_some_and(|n| n == name))
        .unwrap_or_else(|| panic!("no {name} under {}", dir.display()))
}

/// A folder with a CSV table, a Parquet table, a folder table and a SQL file.
struct Inputs {
    dir: tempfile::TempDir,
}

impl Inputs {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::write(p.join("t.csv"), "a,b\n1,x\n2,y\n").unwrap();
        std::fs::create_dir(p.join("folder")).unwrap();
        std::fs::write(p.join("folder/part.csv"), "a,b\n3,z\n").unwrap();
        std::fs::write(p.join("q.sql"), "SELECT a, b FROM t ORDER BY a").unwrap();
        aisql()
            .args(["sql", "SELECT 7 AS a, 'w' AS b", "--table"])
            .arg(format!("t={}", p.join("t.csv").display()))
            .arg("--output")
            .arg(p.join("t.parquet"))
            .assert()
            .success();
        Self { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn table(&self, name: &str, file: &str) -> String {
        format!("{name}={}", self.path(file).display())
    }

    /// `aisql sql` over the tables and `extra`.
    fn sql(&self, extra: &[&str]) -> Command {
        let mut c = aisql();
        c.arg("sql")
            .args(["--table", &self.table("t", "t.csv")])
            .args(["--table", &self.table("p", "t.parquet")])
            .args(["--table", &self.table("f", "folder")])
            .args(extra);
        c
    }
}

#[test]
fn sql_outputs_never_overwrite_its_inputs() {
    let inputs = Inputs::new();
    let before = snapshot(inputs.dir.path());
    let q = inputs.path("q.sql");
    let q = q.to_str().unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink(inputs.path("t.csv"), inputs.path("link.csv")).unwrap();
    let mut cases: Vec<(&str, String)> = vec![
        ("--output", "t.csv".into()),
        ("--output", "t.parquet".into()),
        ("--output", "q.sql".into()),
        ("--output", "folder/part.csv".into()),
        ("--output", "folder/new.csv".into()),
        ("--output", "folder/../t.csv".into()),
        ("--to-substrait", "t.csv".into()),
        ("--to-substrait", "q.sql".into()),
        ("--to-substrait", "folder/plan.json".into()),
        ("--answer-cache", "folder/answers".into()),
        ("--answer-cache", ".".into()),
    ];
    #[cfg(unix)]
    cases.push(("--output", "link.csv".into()));
    for (flag, target) in &cases {
        let target = inputs.path(target);
        let err = inputs
            .sql(&["-f", q, flag, target.to_str().unwrap()])
            .fails();
        assert!(
            err.contains("never writes over or into what it reads"),
            "{flag} {target:?}: {err}"
        );
        assert!(err.contains(flag), "{err}");
    }
    let mut after = snapshot(inputs.dir.path());
    after.retain(|(p, _)| !p.ends_with("link.csv"));
    assert_eq!(after, before, "an input changed");
    // Beside the inputs is fine.
    let out = inputs.path("out.csv");
    inputs
        .sql(&["-f", q, "--output", out.to_str().unwrap()])
        .assert()
        .success();
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "a,b\n1,x\n2,y\n");
}

#[test]
fn sql_is_read_only_unless_writes_are_allowed() {
    let inputs = Inputs::new();
    let before = snapshot(inputs.dir.path());
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("copied.csv");
    let t = target.display();
    let statements = [
        format!("COPY (SELECT a FROM t) TO '{t}'"),
        format!(
            "COPY t TO '{}' STORED AS CSV",
            outside.path().join("dir/").display()
        ),
        format!("EXPLAIN ANALYZE COPY (SELECT a FROM t) TO '{t}'"),
        "INSERT INTO t VALUES (3, 'z')".into(),
        "DELETE FROM p".into(),
        "UPDATE t SET b = 'q'".into(),
        "CREATE VIEW v AS SELECT a FROM t".into(),
        "CREATE TABLE m AS SELECT a FROM t".into(),
        "DROP TABLE t".into(),
        "SET datafusion.execution.batch_size = 1".into(),
    ];
    for statement in &statements {
        let err = inputs.sql(&[statement]).fails();
        assert!(
            err.contains("read-only") && err.contains("--allow-writes"),
            "{statement}: {err}"
        );
    }
    assert!(std::fs::read_dir(outside.path()).unwrap().next().is_none());
    // Files the command line did not name are never opened, writes allowed or not.
    for allow in [false, true] {
        let mut extra =
            vec!["CREATE EXTERNAL TABLE leak (line VARCHAR) STORED AS CSV LOCATION '/etc/passwd'"];
        if allow {
            extra.push("--allow-writes");
        }
        let err = inputs.sql(&extra).fails();
        assert!(err.contains("may not open files"), "{err}");
        let err = inputs.sql(&["SELECT * FROM '/etc/passwd'"]).fails();
        assert!(!err.contains("root:"), "{err}");
    }
    // With --allow-writes: a COPY outside the inputs writes its rows...
    inputs
        .sql(&[
            &format!("COPY (SELECT a, b FROM t ORDER BY a) TO '{t}'"),
            "--allow-writes",
        ])
        .assert()
        .success();
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "a,b\n1,x\n2,y\n");
    // ... and an INSERT changes aisql's in-memory copy of a table, never its file
    // (checked with every other input below) ...
    let out = inputs
        .sql(&["INSERT INTO t VALUES (3, 'z')", "--allow-writes"])
        .assert()
        .success();
    assert!(String::from_utf8_lossy(&out.get_output().stdout).contains('1'));
    // ... but a COPY over or into an input is refused.
    for statement in [
        format!(
            "COPY (SELECT 9 AS a) TO '{}'",
            inputs.path("t.csv").display()
        ),
        format!(
            "COPY (SELECT 9 AS a) TO '{}'",
            inputs.path("t.parquet").display()
        ),
        format!(
            "COPY (SELECT 9 AS a) TO '{}' STORED AS CSV",
            inputs.path("folder").display()
        ),
        format!(
            "COPY (SELECT 9 AS a) TO '{}' STORED AS CSV",
            inputs.dir.path().display()
        ),
    ] {
        let err = inputs.sql(&[&statement, "--allow-writes"]).fails();
        assert!(
            err.contains("never writes over or into"),
            "{statement}: {err}"
        );
    }
    assert_eq!(snapshot(inputs.dir.path()), before, "an input changed");
}

#[test]
fn a_data_root_plan_file_and_model_folder_are_never_written() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("quailb");
    aisql_standin::generate(&root, 0.002).unwrap();
    let model = tmp.path().join("model");
    aisql()
        .args(["model", "tiny", "--out"])
        .arg(&model)
        .assert()
        .success();
    let reviews = find(&root, "reviews.parquet");
    let manifest = find(&root, "manifest.json");
    let before_root = snapshot(&root);
    let before_model = snapshot(&model);
    let sf = ["--sf", "0.002"];
    let on_root = |args: &[&str]| {
        let mut c = aisql();
        c.args(args).args(sf).arg("--root").arg(&root);
        c
    };
    let path = |p: &Path| p.to_str().unwrap().to_string();
    // A plan written beside the root, to run with `query`.
    let plan = tmp.path().join("plan.json");
    on_root(&[
        "sql",
        "SELECT id FROM reviews LIMIT 3",
        "--to-substrait",
        &path(&plan),
    ])
    .assert()
    .success();
    let plan_bytes = std::fs::read(&plan).unwrap();
    let refused = |mut c: Command, what: &str| {
        let err = c.fails();
        assert!(
            err.contains("never writes over or into what it reads"),
            "{what}: {err}"
        );
    };
    refused(
        on_root(&["sql", "SELECT 1 AS a", "--output", &path(&reviews)]),
        "sql --output over a root table",
    );
    refused(
        on_root(&["sql", "SELECT 1 AS a", "--to-substrait", &path(&manifest)]),
        "sql --to-substrait over a manifest",
    );
    refused(
        on_root(&[
            "sql",
            "SELECT 1 AS a",
            "--answer-cache",
            &path(&root.join("answers")),
        ]),
        "--answer-cache inside the root",
    );
    refused(
        on_root(&[
            "query",
            "IMDB-1",
            "--backend",
            "oracle",
            "--output",
            &path(&root.join("x.csv")),
        ]),
        "query --output into the root's top folder",
    );
    refused(
        on_root(&[
            "query",
            "IMDB-1",
            "--backend",
            "oracle",
            "--output-dir",
            &path(&root),
        ]),
        "query --output-dir the root",
    );
    refused(
        on_root(&[
            "query",
            &path(&plan),
            "--backend",
            "oracle",
            "--output",
            &path(&plan),
        ]),
        "query --output over its plan",
    );
    refused(
        on_root(&[
            "bench",
            "--backend",
            "oracle",
            "--queries",
            "IMDB-1",
            "--output-dir",
            &path(&root.join("run")),
        ]),
        "bench --output-dir in the root's top folder",
    );
    // Your own tables folder is an input like a root.
    let tables = tmp.path().join("tables");
    std::fs::create_dir(&tables).unwrap();
    std::fs::copy(&reviews, tables.join("reviews.parquet")).unwrap();
    let mut c = aisql();
    c.args([
        "query",
        &path(&plan),
        "--output",
        &path(&tables.join("x.csv")),
    ])
    .arg("--tables")
    .arg(&tables);
    refused(c, "query --output into the --tables folder");
    assert_eq!(std::fs::read_dir(&tables).unwrap().count(), 1);
    // The model folder (tiny, generated above) is an input too.
    let on_model = |args: &[&str]| {
        let mut c = aisql();
        c.args(args)
            .args(sf)
            .arg("--root")
            .arg(&root)
            .arg("--model")
            .arg(&model);
        c
    };
    refused(
        on_model(&[
            "sql",
            "SELECT 1 AS a",
            "--answer-cache",
            &path(&model.join("answers")),
        ]),
        "--answer-cache inside the model folder",
    );
    refused(
        on_model(&[
            "sql",
            "SELECT 1 AS a",
            "--output",
            &path(&model.join("config.json")),
        ]),
        "--output over the model's config",
    );
    // A comparison is never written into the root it scores against.
    let run = tmp.path().join("run");
    on_root(&[
        "bench",
        "--backend",
        "oracle",
        "--queries",
        "IMDB-1",
        "--output-dir",
        &path(&run),
    ])
    .assert()
    .success();
    let mut compare = aisql();
    compare
        .args(["bench", "compare", &path(&run), &path(&run), "--json"])
        .arg(root.join("cmp.json"))
        .arg("--root")
        .arg(&root);
    refused(compare, "bench compare --json into the root");
    assert_eq!(snapshot(&root), before_root, "the data root changed");
    assert_eq!(snapshot(&model), before_model, "the model folder changed");
    assert_eq!(
        std::fs::read(&plan).unwrap(),
        plan_bytes,
        "the plan changed"
    );
}

/// A CLI run refused as a usage error (exit code 2), giving its stderr.
fn usage_error(c: &mut Command) -> String {
    let out = c.assert().code(2).get_output().stderr.clone();
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn model_commands_never_write_into_or_over_a_model() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    let tiny = |out: &Path, seed: &str, force: bool| {
        let mut c = aisql();
        c.args(["model", "tiny", "--seed", seed, "--out"]).arg(out);
        if force {
            c.arg("--force");
        }
        c
    };
    tiny(&model, "1", false).assert().success();
    let seed_1 = snapshot(&model);

    // A GGUF written into the model's own folder, however spelled.
    for out in [
        model.join("model.gguf"),
        tmp.path().join("model/../model/sub/x.gguf"),
    ] {
        let err = aisql()
            .args(["model", "gguf", "--type", "f32", "--model"])
            .arg(&model)
            .arg("--out")
            .arg(&out)
            .fails();
        assert!(
            err.contains("--out") && err.contains("never writes over or into what it reads"),
            "{err}"
        );
    }
    assert_eq!(snapshot(&model), seed_1, "the model folder changed");

    // Another model over it: refused without --force, and the model is kept.
    let err = usage_error(&mut tiny(&model, "2", false));
    assert!(
        err.contains("holds a model already") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(snapshot(&model), seed_1, "the model folder changed");
    // A folder holding anything else is refused even with --force.
    let other = tmp.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("notes.txt"), "mine").unwrap();
    for force in [false, true] {
        usage_error(&mut tiny(&other, "2", force));
    }
    assert_eq!(
        std::fs::read_to_string(other.join("notes.txt")).unwrap(),
        "mine"
    );
    assert_eq!(std::fs::read_dir(&other).unwrap().count(), 1);
    // With --force the model is replaced, and a link among its files is
    // removed, never written through.
    #[cfg(unix)]
    {
        let outside = tmp.path().join("outside.json");
        std::fs::write(&outside, "keep").unwrap();
        std::fs::remove_file(model.join("tokenizer.json")).unwrap();
        std::os::unix::fs::symlink(&outside, model.join("tokenizer.json")).unwrap();
        tiny(&model, "2", true).assert().success();
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep");
        assert!(!model.join("tokenizer.json").is_symlink());
    }
    #[cfg(not(unix))]
    tiny(&model, "2", true).assert().success();
    let fresh = tmp.path().join("seed-2");
    tiny(&fresh, "2", false).assert().success();
    let names = |s: Vec<(PathBuf, Vec<u8>)>| -> Vec<(std::ffi::OsString, Vec<u8>)> {
        s.into_iter()
            .map(|(p, b)| (p.file_name().unwrap().to_owned(), b))
            .collect()
    };
    assert_eq!(names(snapshot(&model)), names(snapshot(&fresh)));
    assert_ne!(snapshot(&model), seed_1);
}
