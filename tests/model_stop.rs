//! A query past its `--timeout-s` stops its model work within about one forward
//! batch of the deadline, and the run records how long after the deadline that was.

mod common;
use common::cli::aisql;

#[test]
fn a_timed_out_query_says_when_its_model_work_stopped() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    aisql()
        .env("AISQL_CACHE_DIR", tmp.path().join("cache"))
        .args([
            "bench",
            "--sf",
            "0.01",
            "--queries",
            "AGENT-1",
            "--model",
            "tiny",
        ])
        .args(["--timeout-s", "1", "--batch-tokens", "2048", "--output-dir"])
        .arg(&run)
        .assert()
        .code(1);
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("run.json")).unwrap()).unwrap();
    let query = &record["queries"][0];
    assert_eq!(query["status"], "timeout", "{query}");
    let error = query["error"].as_str().unwrap();
    let stopped: f64 = error
        .split("stopped ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no stop time in {error:?}"));
    eprintln!("AGENT-1, 2,048-token batches: model work stopped {stopped:.3} s after the deadline");
    assert!(stopped >= 0.0);
}
