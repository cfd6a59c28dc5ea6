//! Running the `aisql` binary from a test: the command with the caller's own
//! settings cleared, and the steps CLI tests share (a run that must succeed, its
//! JSON, a table argument, a FIFO).

use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

/// Variables a developer may have set for their own use of aisql: each would
/// change what a test reads, which model answers, where answers are kept or
/// where a worker listens, so no test inherits them (a test that wants one sets
/// it after this).
const USER_SETTINGS: [&str; 7] = [
    "AISQL_ROOT",
    "AISQL_MODEL",
    "AISQL_ANSWER_CACHE",
    "AISQL_KV_STORE",
    "AISQL_QUAILB_PLANS",
    "AISQL_WORKER_LISTEN",
    "AISQL_WORKER_TOKEN",
];

/// The `aisql` binary as a plain process, for tests that spawn it or set its
/// streams.
pub fn aisql_process() -> Command {
    let mut c = Command::new(assert_cmd::cargo::cargo_bin("aisql"));
    for name in USER_SETTINGS {
        c.env_remove(name);
    }
    c
}

/// The `aisql` binary, to run to its end and assert on.
pub fn aisql() -> assert_cmd::Command {
    assert_cmd::Command::from_std(aisql_process())
}

/// Runs `c`, which must succeed, and returns its stderr.
pub fn stderr_of_success(c: &mut Command) -> String {
    let out = c.stderr(Stdio::piped()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    stderr
}

/// Runs `c`, which must succeed, and returns its stdout.
pub fn stdout_of_success(c: &mut assert_cmd::Command) -> String {
    String::from_utf8(c.assert().success().get_output().stdout.clone()).unwrap()
}

/// Runs `c`, which must succeed, and reads its stdout as JSON.
pub fn stdout_json(c: &mut assert_cmd::Command) -> Value {
    let out = c.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"))
}

/// A JSON file the test expects to be there and well formed.
pub fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A `--table NAME=PATH` value.
pub fn table_arg(name: &str, path: &Path) -> String {
    format!("{name}={}", path.display())
}

/// The `--table` value of `tests/sql/data/<table>.csv`, the SQL corpus's data.
pub fn sql_data_table(table: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/sql/data/{table}.csv"));
    table_arg(table, &path)
}

/// Makes a FIFO at `path`: an input whose read would block forever.
pub fn mkfifo(path: &Path) {
    let made = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(made.success(), "mkfifo {}", path.display());
}
