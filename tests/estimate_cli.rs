//! Estimates as a user asks for them: `--estimate` of query, sql and bench,
//! `EXPLAIN` without `ANALYZE`, `aisql model calibrate`, `ai_count_tokens`,
//! the estimate in run.json and report.md, and `--progress json`'s lines.

mod common;
use common::cli::{aisql, sql_data_table, stdout_json};

use std::path::Path;

use serde_json::Value;

/// `aisql query ID` over `root` with the oracle's simulation, plus `extra`:
/// (stdout, stderr).
fn simulated(root: &Path, sf: &str, id: &str, extra: &[&str], cache: &Path) -> (String, String) {
    let out = aisql()
        .args(["query", id, "--sf", sf, "--backend", "oracle", "--simulate"])
        .arg("--root")
        .arg(root)
        .args(extra)
        .env("AISQL_CACHE_DIR", cache)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    );
    assert!(out.status.success(), "{id} {extra:?}: {stderr}");
    (stdout, stderr)
}

/// The fresh tokens `aisql query` reports on stderr.
fn reported_fresh(stderr: &str) -> u64 {
    stderr
        .lines()
        .find_map(|l| l.strip_prefix("fresh tokens: "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no fresh tokens in {stderr}"))
}

#[test]
fn estimates_follow_the_simulated_run_and_ask_only_a_sample() {
    let tmp = tempfile::tempdir().unwrap();
    let (root, cache) = (tmp.path().join("quailb"), tmp.path().join("cache"));
    aisql_standin::generate(&root, 0.05).unwrap();
    for (id, within) in [
        ("IMDB-1", 0.0),
        ("IMDB-7", 0.15),
        ("FEV-1", 0.0),
        ("BIO-5", 0.15),
    ] {
        let (json, _) = simulated(
            &root,
            "0.05",
            id,
            &["--estimate", "--format", "json"],
            &cache,
        );
        let e: Value = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{id}: {e}: {json}"));
        let (_, stderr) = simulated(&root, "0.05", id, &["--format", "csv"], &cache);
        let actual = reported_fresh(&stderr);
        let u = |k: &str| e[k].as_u64().unwrap_or_else(|| panic!("{id}: {k} in {e}"));
        let (fresh, input, minimum) = (u("fresh_tokens"), u("input_tokens"), u("minimum_tokens"));
        assert!(
            0 < minimum && minimum <= fresh && fresh <= input,
            "{id}: {e}"
        );
        assert_eq!(u("decode_tokens"), 0, "{id}");
        let error = (fresh as f64 - actual as f64).abs() / actual as f64;
        assert!(
            error <= within,
            "{id}: estimated {fresh} fresh tokens, the run computed {actual}"
        );
        // Uncalibrated (an empty cache folder): tokens only.
        assert!(e["seconds"].is_null() && e["usd"].is_null(), "{id}: {e}");
        let ops = e["operators"].as_array().unwrap();
        assert!(!ops.is_empty(), "{id}");
        // The base sample of 48, grown for an uncertain decision to at most
        // 2 % of its questions.
        let bound = |op: &Value| 48.max(op["rows"].as_u64().unwrap() / 50);
        for op in ops {
            assert!(op["id"].is_string() && op["template"].is_string(), "{op}");
            assert!(op["sampled"].as_u64().unwrap() <= bound(op), "{op}");
        }
        assert!(
            e["sample_questions"].as_u64().unwrap() <= ops.iter().map(bound).sum::<u64>(),
            "{id}: {e}"
        );
        let summed: u64 = ops
            .iter()
            .map(|o| o["fresh_tokens"].as_u64().unwrap())
            .sum();
        assert_eq!(summed, fresh, "{id}: operators add up to the total");
    }
}

#[test]
fn a_hint_replaces_the_sample() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let query = "SELECT id FROM docs WHERE ai_filter('Is {0} about a phone?', body)";
    let run = |extra: &[&str]| -> Value {
        stdout_json(
            aisql()
                .args([
                    "sql",
                    query,
                    "--table",
                    &sql_data_table("docs"),
                    "--model",
                    "tiny",
                ])
                .args(["--estimate", "--format", "json"])
                .args(extra)
                .env("AISQL_CACHE_DIR", &cache),
        )
    };
    let sampled = run(&[]);
    let op = &sampled["operators"][0];
    assert_eq!(op["selectivity_from"], "sample", "{op}");
    assert_eq!(
        op["sampled"].as_u64().unwrap(),
        sampled["sample_questions"].as_u64().unwrap()
    );
    assert!(op["sampled"].as_u64().unwrap() > 0, "{op}");
    let hinted = run(&["--selectivity", "about a phone=0.25"]);
    let op = &hinted["operators"][0];
    assert_eq!(op["selectivity_from"], "hint", "{op}");
    assert_eq!(op["selectivity"].as_f64(), Some(0.25));
    assert_eq!(
        hinted["sample_questions"], 0,
        "a hint asks the model nothing"
    );
}

#[test]
fn calibration_gives_seconds_and_dollars() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let profile = stdout_json(
        aisql()
            .args(["model", "calibrate", "--model", "tiny", "--format", "json"])
            .env("AISQL_CACHE_DIR", &cache),
    );
    assert_eq!(profile["model"], "tiny");
    assert_eq!(profile["device"], "cpu");
    assert!(
        profile["seconds_per_token"].as_f64().unwrap() > 0.0,
        "{profile}"
    );
    assert!(cache.join("calibration/tiny-f32-cpu.json").is_file());
    let query = "SELECT id FROM docs WHERE ai_filter('Is {0} about a phone?', body)";
    let e = stdout_json(
        aisql()
            .args([
                "sql",
                query,
                "--table",
                &sql_data_table("docs"),
                "--model",
                "tiny",
            ])
            .args(["--estimate", "--format", "json", "--gpu-hour-usd", "7.2"])
            .env("AISQL_CACHE_DIR", &cache),
    );
    let seconds = e["seconds"].as_f64().unwrap();
    assert!(seconds > 0.0, "{e}");
    let usd = e["usd"].as_f64().unwrap();
    assert!((usd - seconds * 7.2 / 3600.0).abs() < 1e-12, "{e}");
    assert_eq!(e["calibrated"], true);
    // A profile of another model is not this one's.
    std::fs::write(
        cache.join("calibration/tiny-f32-cpu.json"),
        serde_json::to_vec(&serde_json::json!({"model": "other"})).unwrap(),
    )
    .unwrap();
    aisql()
        .args([
            "sql",
            query,
            "--table",
            &sql_data_table("docs"),
            "--model",
            "tiny",
            "--estimate",
        ])
        .env("AISQL_CACHE_DIR", &cache)
        .assert()
        .failure()
        .stderr(predicates::str::contains("tiny-f32-cpu.json"));
}

#[test]
fn explain_prints_the_plan_and_the_estimate_and_estimates_never_write() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let out = aisql()
        .args([
            "sql",
            "EXPLAIN SELECT id FROM docs WHERE ai_filter('Is {0} about a phone?', body)",
        ])
        .args(["--table", &sql_data_table("docs"), "--model", "tiny"])
        .env("AISQL_CACHE_DIR", &cache)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "AiExec: filter-1",
        "fresh_tokens",
        "minimum_tokens",
        "| total",
        "uncalibrated",
    ] {
        assert!(stdout.contains(needle), "{needle} missing in\n{stdout}");
    }
    let target = tmp.path().join("out.csv");
    aisql()
        .args([
            "sql",
            &format!("COPY (SELECT id FROM docs) TO '{}'", target.display()),
            "--table",
            &sql_data_table("docs"),
            "--model",
            "tiny",
            "--allow-writes",
            "--estimate",
        ])
        .env("AISQL_CACHE_DIR", &cache)
        .assert()
        .code(2)
        .stderr(predicates::str::contains("an estimate runs only queries"));
    assert!(!target.exists(), "an estimate wrote {}", target.display());
    // Nor through EXPLAIN, which shows the plan without running it.
    let explained = aisql()
        .args([
            "sql",
            &format!(
                "EXPLAIN COPY (SELECT id FROM docs) TO '{}'",
                target.display()
            ),
            "--table",
            &sql_data_table("docs"),
            "--model",
            "tiny",
            "--allow-writes",
        ])
        .env("AISQL_CACHE_DIR", &cache)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&explained.stderr);
    assert!(explained.status.success(), "{stderr}");
    assert!(stderr.contains("no estimate"), "{stderr}");
    assert!(String::from_utf8_lossy(&explained.stdout).contains("CopyTo"));
    assert!(!target.exists(), "EXPLAIN wrote {}", target.display());
}

#[test]
fn count_tokens_in_every_spelling() {
    let run = |query: &str| -> String {
        let out = aisql()
            .args([
                "sql",
                query,
                "--table",
                &sql_data_table("docs"),
                "--model",
                "tiny",
            ])
            .args(["--format", "csv"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{query}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let native = run("SELECT ai_count_tokens('Is {0} kind?', body) AS n FROM docs ORDER BY id");
    let snowflake = run(
        "SELECT AI_COUNT_TOKENS('ai_filter', PROMPT('Is {0} kind?', body)) AS n FROM docs ORDER BY id",
    );
    let bigquery =
        run("SELECT AI.COUNT_TOKENS(('Is ', body, ' kind?')) AS n FROM docs ORDER BY id");
    assert_eq!(native, snowflake);
    assert_eq!(native, bigquery);
    // A NULL document (an empty CSV field) counts NULL, printed as "".
    let parse = |text: &str| -> Vec<Option<u64>> {
        text.lines()
            .skip(1)
            .map(|l| (l != "\"\"").then(|| l.parse().unwrap()))
            .collect()
    };
    let counts = parse(&native);
    assert_eq!(counts.len(), 30);
    assert!(
        counts.iter().filter(|c| c.is_none()).count() < 5,
        "{counts:?}"
    );
    // A prompt is its text and more: the filter's instruction and cue.
    let alone = parse(&run(
        "SELECT ai_count_tokens(body) AS n FROM docs ORDER BY id",
    ));
    for (p, t) in counts.iter().zip(&alone) {
        match (p, t) {
            (Some(p), Some(t)) => assert!(p > t && *t > 0, "{counts:?} {alone:?}"),
            (p, t) => assert_eq!(p.is_none(), t.is_none(), "{counts:?} {alone:?}"),
        }
    }
}

#[test]
fn bench_records_each_estimate_beside_the_actual_figures() {
    let tmp = tempfile::tempdir().unwrap();
    let (root, cache, run) = (
        tmp.path().join("quailb"),
        tmp.path().join("cache"),
        tmp.path().join("run"),
    );
    aisql_standin::generate(&root, 0.002).unwrap();
    let bench = |extra: &[&str]| {
        let mut c = aisql();
        c.args([
            "bench",
            "--sf",
            "0.002",
            "--backend",
            "oracle",
            "--simulate",
        ])
        .args(["--queries", "IMDB-1,FEV-4"])
        .arg("--root")
        .arg(&root)
        .args(extra)
        .env("AISQL_CACHE_DIR", &cache);
        c
    };
    bench(&[]).arg("--output-dir").arg(&run).assert().success();
    let j: Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("run.json")).unwrap()).unwrap();
    for q in j["queries"].as_array().unwrap() {
        let e = &q["estimate"];
        assert!(e["fresh_tokens"].as_u64().is_some(), "{q}");
        assert!(q["measurements"]["fresh_tokens"].as_u64().is_some(), "{q}");
    }
    let report = std::fs::read_to_string(run.join("report.md")).unwrap();
    assert!(report.contains("## Estimates"), "{report}");
    assert!(report.contains("| IMDB-1 |"), "{report}");
    // Estimates alone: a table, no run folder.
    let only = tmp.path().join("estimate-only");
    let out = bench(&["--estimate"])
        .arg("--output-dir")
        .arg(&only)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("IMDB-1") && stdout.contains("FEV-4") && stdout.contains("total"),
        "{stdout}"
    );
    assert!(!only.exists(), "bench --estimate wrote {}", only.display());
}

#[test]
fn progress_json_counts_each_operator_up_to_the_estimate() {
    let tmp = tempfile::tempdir().unwrap();
    let (root, cache) = (tmp.path().join("quailb"), tmp.path().join("cache"));
    aisql_standin::generate(&root, 0.02).unwrap();
    let out = aisql()
        .args([
            "query", "IMDB-1", "--sf", "0.02", "--model", "tiny", "--format", "csv",
        ])
        .args(["--progress", "json", "--batch-rows", "16"])
        .arg("--root")
        .arg(&root)
        .env("AISQL_CACHE_DIR", &cache)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let lines: Vec<Value> = stderr
        .lines()
        .filter(|l| l.starts_with("{\"progress\""))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let last = lines
        .last()
        .unwrap_or_else(|| panic!("no progress lines in {stderr}"));
    assert_eq!(last["done"], true, "{last}");
    let op = &last["operators"][0];
    assert_eq!(op["id"], "filter-1");
    assert_eq!(op["rows_done"], op["rows_expected"], "{op}");
    assert!(op["fresh_tokens"].as_u64().unwrap() > 0, "{op}");
    let running: Vec<&Value> = lines.iter().filter(|l| l["done"] == false).collect();
    assert!(!running.is_empty(), "no line while the query ran: {stderr}");
    let done = |l: &Value| l["operators"][0]["rows_done"].as_u64().unwrap_or(0);
    assert!(running.windows(2).all(|w| done(w[0]) <= done(w[1])));
    // Without --progress, stderr (not a terminal) has none of it.
    let quiet = aisql()
        .args(["query", "IMDB-1", "--sf", "0.02", "--backend", "oracle"])
        .arg("--root")
        .arg(&root)
        .env("AISQL_CACHE_DIR", &cache)
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&quiet.stderr).contains("\"progress\""));
}

#[test]
fn bad_estimate_flags_are_usage_errors_naming_the_flag() {
    for (args, flag) in [
        (vec!["--estimate-sample", "0"], "--estimate-sample"),
        (vec!["--gpu-hour-usd=-1"], "--gpu-hour"),
        (vec!["--gpu-hour-usd", "lots"], "--gpu-hour"),
        (vec!["--progress", "loud"], "--progress"),
    ] {
        let out = aisql()
            .args(["sql", "SELECT 1", "--table", &sql_data_table("docs")])
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
    }
}
