//! `aisql bench` end to end on the stand-in corpus with the oracle backend: all 43
//! queries complete and good, the documented files and fields exist, `bench report`
//! reproduces the metrics and `bench compare` of a run with itself shows no change.
//!
//! The main run uses the stand-in at sf 0.01 (about a minute in the dev profile,
//! most of it IMDB-9/10, whose results have ~800k rows); the refusal test uses sf 0.002.

use std::path::Path;

mod common;
use common::Fails;
use common::cli::{aisql, read_json};
use serde_json::Value;

#[test]
fn oracle_bench_over_all_43_queries_is_good_and_reproducible() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("quailb");
    aisql_standin::generate(&root, 0.01).unwrap();
    let run = tmp.path().join("run");
    aisql()
        .args([
            "bench",
            "--sf",
            "0.01",
            "--backend",
            "oracle",
            "--gpu-hourly-rate-usd",
            "2.5",
        ])
        .args(["--metadata", "purpose=e2e", "--metadata", "batch=3"])
        .arg("--root")
        .arg(&root)
        .arg("--output-dir")
        .arg(&run)
        .assert()
        .success();

    let j = read_json(&run.join("run.json"));
    assert_eq!(j["schema_version"], 2);
    assert_eq!(j["status"], "complete");
    for key in [
        "quail_b_version",
        "scale_factor",
        "corpus_id",
        "collection_id",
        "reference_model",
        "gpu_count",
        "gpu_hourly_rate_usd",
        "started_at",
        "finished_at",
    ] {
        assert!(!j[key].is_null(), "run.json lacks {key}");
    }
    let meta = &j["metadata"];
    assert_eq!(meta["purpose"], "e2e");
    assert_eq!(meta["batch"], 3);
    for key in [
        "aisql_version",
        "backend",
        "prompt_format",
        "plans",
        "threads",
    ] {
        assert!(meta.get(key).is_some(), "metadata lacks {key}");
    }
    assert_eq!(meta["backend"], "oracle");
    assert!(
        meta["plans"].as_str().unwrap().starts_with("embedded"),
        "{}",
        meta["plans"]
    );
    // The oracle runs no model: run.json records none.
    for key in ["model", "dtype", "device", "kv_budget_bytes"] {
        assert!(meta.get(key).is_none(), "an oracle run records {key}");
    }
    let queries = j["queries"].as_array().unwrap();
    assert_eq!(queries.len(), 43);
    assert_eq!(queries[0]["id"], "IMDB-1");
    assert_eq!(queries[42]["id"], "AGENT-5");
    for q in queries {
        let id = q["id"].as_str().unwrap();
        assert_eq!(q["status"], "complete", "{id}: {}", q["error"]);
        assert_eq!(q["assessment"]["verdict"], "good", "{id}");
        assert_eq!(q["definition_hash"].as_str().unwrap().len(), 64);
        let m = &q["metrics"];
        let out = &m["accuracy"]["output_accuracy"];
        assert_eq!(out["precision"], 1.0, "{id}");
        assert_eq!(out["recall"], 1.0, "{id}");
        assert_eq!(out["exact_match"], true, "{id}");
        let answers = &m["accuracy"]["answer_accuracy"];
        assert_eq!(
            answers["evaluated"], answers["correct"],
            "{id}: the oracle agrees with the labels"
        );
        // The oracle reports no fresh tokens, so (SPEC §D.3) there are no prompt
        // pieces: input, minimum and regret are unavailable (null), never numbers.
        for key in [
            "fresh_tokens",
            "input_tokens",
            "minimum_tokens",
            "regret_tokens",
            "kv_regret_percent",
        ] {
            assert!(m[key].is_null(), "{id}: {key} = {}", m[key]);
        }
        assert!(q["files"].get("prompt_pieces").is_none(), "{id}");
        assert!(!run.join(id).join("prompt_pieces.json").exists(), "{id}");
        assert!(m["cost_usd"].as_f64().unwrap() >= 0.0);
        let joins = !q["files"]["joins"].as_array().unwrap().is_empty();
        let key = if joins {
            "document_pairs_per_second"
        } else {
            "documents_per_second"
        };
        assert!(m.get(key).is_some(), "{id}: {key}");
        for f in ["plan", "rows"] {
            assert!(
                run.join(q["files"][f].as_str().unwrap()).exists(),
                "{id}: {f}"
            );
        }
    }

    // measurements.parquet: one row per complete query, the documented columns.
    let batch = aisql_engine::data::files::read_parquet(&run.join("measurements.parquet")).unwrap();
    assert_eq!(batch.num_rows(), 43);
    let names: Vec<String> = batch
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(
        names,
        [
            "query",
            "runtime_s",
            "input_tokens",
            "input_tokens_per_second",
            "fresh_tokens",
            "minimum_tokens",
            "regret_tokens",
            "regret_approximate",
            "evaluated_document_pairs",
            "input_rows",
            "answers_evaluated",
            "answers_correct",
            "labels_evaluated",
            "labels_correct",
            "predicted_rows",
            "expected_rows",
            "matching_rows",
            "cost_usd",
            "cost_usd_per_million_input_tokens",
            "kv_regret_percent",
        ]
    );
    assert_eq!(
        batch.column(4).null_count(),
        43,
        "fresh tokens unknown: null"
    );

    // report.md sections and charts.
    let report = std::fs::read_to_string(run.join("report.md")).unwrap();
    for s in [
        "# QUAIL-B results",
        "Status: complete",
        "Scale factor: 0.01",
        "## Query results",
        "| Query | Status | Seconds | $/query | Throughput | Unit | Input tokens/s | $/million input tokens | KV regret (%) |",
        "## Accuracy",
        "## Assessment",
        "## Input rows and token counts",
        "## Configuration",
        "```json",
        "document pairs/second",
        "unavailable",
        "(runtime.svg)",
    ] {
        assert!(report.contains(s), "report.md lacks {s:?}");
    }
    assert!(!report.contains("## Errors"));
    for svg in ["runtime.svg", "tokens.svg", "throughput.svg"] {
        assert!(
            std::fs::read_to_string(run.join(svg))
                .unwrap()
                .starts_with("<svg"),
            "{svg}"
        );
    }

    // `bench report` rescores the saved outputs to the same metrics.
    aisql()
        .args(["bench", "report"])
        .arg(&run)
        .arg("--root")
        .arg(&root)
        .assert()
        .success();
    let again = read_json(&run.join("run.json"));
    for (a, b) in queries.iter().zip(again["queries"].as_array().unwrap()) {
        assert_eq!(a["metrics"], b["metrics"], "{}", a["id"]);
        assert_eq!(a["assessment"], b["assessment"]);
    }

    // `bench compare` of a run with itself: no change anywhere, p = 1.
    let cmp = tmp.path().join("compare.json");
    let out = aisql()
        .args(["bench", "compare"])
        .arg(&run)
        .arg(&run)
        .arg("--root")
        .arg(&root)
        .arg("--json")
        .arg(&cmp)
        .assert()
        .success();
    assert!(String::from_utf8_lossy(&out.get_output().stdout).contains("# QUAIL-B comparison"));
    let c = read_json(&cmp);
    let (mut predicates, mut paired) = (0, 0);
    for q in c["queries"].as_array().unwrap() {
        assert_eq!(q["runtime_ratio"], 1.0);
        assert!(q["input_tokens_delta"].is_null());
        assert!(q["minimum_tokens_delta"].is_null());
        assert!(q["fresh_tokens_delta"].is_null());
        assert_eq!(q["precision_delta"], 0.0);
        assert_eq!(q["recall_delta"], 0.0);
        for p in q["predicates"].as_array().unwrap() {
            predicates += 1;
            assert_eq!(p["a_correct_b_wrong"], 0);
            assert_eq!(p["a_wrong_b_correct"], 0);
            assert_eq!(p["p_value"], 1.0);
            paired += p["paired"].as_u64().unwrap();
        }
    }
    assert!(
        predicates > 40 && paired > 1000,
        "{predicates} predicates, {paired} answers compared"
    );
}

#[test]
fn simulated_fresh_tokens_give_prompt_pieces_minimum_and_regret() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("quailb");
    aisql_standin::generate(&root, 0.002).unwrap();
    let run = tmp.path().join("run");
    aisql()
        .args([
            "bench",
            "--sf",
            "0.002",
            "--backend",
            "oracle",
            "--simulate",
        ])
        .args(["--queries", "IMDB-1,IMDB-7,FEV-8"])
        .arg("--root")
        .arg(&root)
        .arg("--output-dir")
        .arg(&run)
        .assert()
        .success();
    let j = read_json(&run.join("run.json"));
    assert_eq!(j["metadata"]["simulation"], true);
    for q in j["queries"].as_array().unwrap() {
        let id = q["id"].as_str().unwrap();
        let m = &q["metrics"];
        let (fresh, input, minimum) = (
            m["fresh_tokens"].as_u64().unwrap(),
            m["input_tokens"].as_u64().unwrap(),
            m["minimum_tokens"].as_u64().unwrap(),
        );
        assert!(
            0 < minimum && minimum <= fresh && fresh <= input,
            "{id}: {m}"
        );
        assert_eq!(
            m["regret_tokens"].as_u64().unwrap(),
            fresh - minimum,
            "{id}"
        );
        assert!(m["kv_regret_percent"].as_f64().is_some(), "{id}");
        let pieces = read_json(&run.join(q["files"]["prompt_pieces"].as_str().unwrap()));
        assert_eq!(pieces["tokenizer"], "Qwen/Qwen3-32B");
        assert!(!pieces["preamble"].as_array().unwrap().is_empty());
        // The host tier's counts are recorded (0 where nothing was evicted).
        assert!(q["measurements"]["restored_tokens"].is_u64(), "{id}");
    }
    // report.md's token section has regret and restored tokens per query.
    let report = std::fs::read_to_string(run.join("report.md")).unwrap();
    assert!(
        report.contains(
            "| Minimum tokens | Recomputed KV tokens | KV regret (%) | Restored KV tokens | \
             Speculative tokens | Unused speculative questions | Result rows | Peak RSS (GiB) |"
        ),
        "{report}"
    );
    let tokens = report
        .split("## Input rows and token counts")
        .nth(1)
        .expect("a token section");
    let imdb7 = tokens
        .lines()
        .find(|l| l.starts_with("| IMDB-7 |"))
        .expect("IMDB-7's token row");
    let cells: Vec<&str> = imdb7.split('|').map(str::trim).collect();
    // | id | rows | input | fresh | minimum | recomputed | regret | restored | speculative |
    // unused | result rows | peak |
    assert_eq!(cells[8], "0", "restored tokens: {imdb7}");
    // IMDB-7 reads each table under one name: nothing to ask ahead.
    assert_eq!((cells[9], cells[10]), ("0", "0"), "speculative: {imdb7}");
    let queries = j["queries"].as_array().unwrap();
    let q7 = queries.iter().find(|q| q["id"] == "IMDB-7").unwrap();
    assert_eq!(
        cells[11],
        q7["metrics"]["accuracy"]["output_accuracy"]["predicted_rows"].to_string(),
        "result rows: {imdb7}"
    );
    let peak = &q7["measurements"]["peak_rss_bytes"];
    if let Some(bytes) = peak.as_u64() {
        assert!(bytes > 1 << 20, "{peak}");
        assert!(cells[12].parse::<f64>().unwrap() > 0.0, "peak RSS: {imdb7}");
    }
}

#[test]
fn a_non_empty_output_folder_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("quailb");
    aisql_standin::generate(&root, 0.002).unwrap();
    let run = tmp.path().join("run");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::write(run.join("keep.txt"), "mine").unwrap();
    aisql()
        .args([
            "bench",
            "--sf",
            "0.002",
            "--backend",
            "oracle",
            "--queries",
            "IMDB-1",
        ])
        .arg("--root")
        .arg(&root)
        .arg("--output-dir")
        .arg(&run)
        .assert()
        .failure()
        .stderr(predicates::str::contains("not empty"));
    assert_eq!(
        std::fs::read_to_string(run.join("keep.txt")).unwrap(),
        "mine"
    );
    assert!(!run.join("run.json").exists());
    // An unknown query id is a usage error naming the catalog.
    aisql()
        .args([
            "bench",
            "--sf",
            "0.002",
            "--backend",
            "oracle",
            "--queries",
            "NOPE-1",
        ])
        .arg("--root")
        .arg(&root)
        .arg("--output-dir")
        .arg(tmp.path().join("run2"))
        .assert()
        .failure()
        .stderr(predicates::str::contains("unknown query"));
}

/// `bench report` and `bench compare` score only what the run wrote: an output
/// file changed or removed since is refused, naming it and both hashes.
#[test]
fn report_and_compare_refuse_outputs_changed_since_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("quailb");
    aisql_standin::generate(&root, 0.002).unwrap();
    let run = tmp.path().join("run");
    aisql()
        .args(["bench", "--sf", "0.002", "--backend", "oracle"])
        .args(["--queries", "IMDB-1,FEV-1"])
        .arg("--root")
        .arg(&root)
        .arg("--output-dir")
        .arg(&run)
        .assert()
        .success();
    let copy = tmp.path().join("copy");
    std::fs::create_dir_all(&copy).unwrap();
    for entry in walk(&run) {
        let to = copy.join(entry.strip_prefix(&run).unwrap());
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(&entry, &to).unwrap();
    }
    let report = |dir: &Path| {
        aisql()
            .args(["bench", "report"])
            .arg(dir)
            .arg("--root")
            .arg(&root)
            .fails()
    };
    let compare = |a: &Path, b: &Path| {
        aisql()
            .args(["bench", "compare"])
            .arg(a)
            .arg(b)
            .arg("--root")
            .arg(&root)
            .fails()
    };
    // Intact, both commands run.
    aisql()
        .args(["bench", "report"])
        .arg(&copy)
        .arg("--root")
        .arg(&root)
        .assert()
        .success();
    aisql()
        .args(["bench", "compare"])
        .arg(&run)
        .arg(&copy)
        .arg("--root")
        .arg(&root)
        .assert()
        .success();

    // One byte of the run's first filter answers changed.
    let j = read_json(&run.join("run.json"));
    let files = &j["queries"][0]["files"];
    let filters = files["filters"][0]["path"].as_str().unwrap().to_string();
    assert!(filters.ends_with("filters-0.parquet"), "{filters}");
    let recorded = files["sha256"][&filters].as_str().unwrap().to_string();
    let path = copy.join(&filters);
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();
    let now = aisql_bench::layout::sha256_file(&path).unwrap();
    let before = std::fs::read(copy.join("run.json")).unwrap();
    for err in [report(&copy), compare(&run, &copy), compare(&copy, &run)] {
        assert!(
            err.contains(&format!("{filters} has sha256 {now}")),
            "{err}"
        );
        assert!(
            err.contains(&format!("run.json recorded {recorded}")),
            "{err}"
        );
        assert!(err.contains(&copy.display().to_string()), "{err}");
    }
    // Refused before anything was rewritten.
    assert_eq!(std::fs::read(copy.join("run.json")).unwrap(), before);

    // A removed file is named too.
    std::fs::remove_file(&path).unwrap();
    let err = report(&copy);
    assert!(err.contains(&format!("{filters} is missing")), "{err}");
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// SIGTERM (a scheduler's or service manager's stop) is handled like Ctrl-C: the
/// query in flight is recorded as interrupted, run.json stays consistent, the exit
/// code is 1, and `--resume` finishes the run.
#[cfg(unix)]
#[test]
fn sigterm_leaves_a_consistent_run_that_resume_finishes() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("quailb");
    aisql_standin::generate(&root, 0.01).unwrap();
    let run = tmp.path().join("run");
    let bin = assert_cmd::cargo::cargo_bin("aisql");
    let child = std::process::Command::new(&bin)
        .args([
            "bench",
            "--sf",
            "0.01",
            "--queries",
            "IMDB-1,FEV-1",
            "--cpu",
        ])
        .arg("--root")
        .arg(&root)
        .arg("--output-dir")
        .arg(&run)
        .env_remove("AISQL_ROOT")
        .env_remove("AISQL_MODEL")
        .env("AISQL_CACHE_DIR", tmp.path().join("cache"))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the model is working on IMDB-1.
    let running = (0..1200).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(100));
        std::fs::read_to_string(run.join("run.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .is_some_and(|j| j["queries"][0]["status"] == "running")
    });
    assert!(running, "IMDB-1 never started");
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--resume"), "{stderr}");
    let j = read_json(&run.join("run.json"));
    assert_eq!(j["status"], "failed");
    let q = &j["queries"][0];
    assert!(
        q["error"].as_str().unwrap().starts_with("Interrupted"),
        "{}",
        q["error"]
    );
    assert_eq!(j["queries"][1]["status"], "pending");
    aisql()
        .args(["bench", "--cpu", "--resume"])
        .arg(&run)
        .arg("--root")
        .arg(&root)
        .env("AISQL_CACHE_DIR", tmp.path().join("cache"))
        .assert()
        .success();
    let j = read_json(&run.join("run.json"));
    assert_eq!(j["status"], "complete");
    assert_eq!(j["metadata"]["resumed"], 1);
}

#[test]
fn outputs_inside_the_inputs_are_refused_before_anything_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("quailb");
    aisql_standin::generate(&root, 0.002).unwrap();
    let inside = root.join("corpora").join("run");
    let err = aisql()
        .args([
            "bench",
            "--sf",
            "0.002",
            "--backend",
            "oracle",
            "--queries",
            "IMDB-1",
        ])
        .arg("--root")
        .arg(&root)
        .arg("--output-dir")
        .arg(&inside)
        .fails();
    assert!(err.contains("inside the data root"), "{err}");
    assert!(!inside.exists());
    let err = aisql()
        .args(["query", "IMDB-1", "--sf", "0.002", "--backend", "oracle"])
        .arg("--root")
        .arg(&root)
        .arg("--output-dir")
        .arg(root.join("x/../out"))
        .fails();
    assert!(err.contains("inside the data root"), "{err}");
    assert!(!root.join("out").exists());
    // A comparison is never written into the runs it compares.
    let err = aisql()
        .args(["bench", "compare"])
        .arg(tmp.path().join("a"))
        .arg(tmp.path().join("b"))
        .arg("--json")
        .arg(tmp.path().join("b").join("run.json"))
        .fails();
    assert!(err.contains("inside the compared run"), "{err}");
}

#[test]
fn a_result_that_would_not_fit_the_disk_is_kept_as_a_count_and_hash() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("quailb");
    aisql_standin::generate(&root, 0.002).unwrap();
    let bench = |dir: &Path, reserve: Option<&str>| {
        let mut c = aisql();
        c.args(["bench", "--sf", "0.002", "--backend", "oracle"])
            .args(["--queries", "IMDB-1,IMDB-2"])
            .arg("--root")
            .arg(&root)
            .arg("--output-dir")
            .arg(dir);
        if let Some(r) = reserve {
            c.env(aisql_engine::data::row_sink::DISK_RESERVE_ENV, r);
        }
        c.assert()
    };
    let saved = tmp.path().join("saved");
    bench(&saved, None).success();
    // No disk has 2^64-1 bytes free: every result is summarised.
    let summarised = tmp.path().join("summarised");
    bench(&summarised, Some(&u64::MAX.to_string())).success();

    let j = read_json(&summarised.join("run.json"));
    for q in j["queries"].as_array().unwrap() {
        let id = q["id"].as_str().unwrap();
        assert_eq!(q["status"], "complete", "{id}: {}", q["error"]);
        let files = &q["files"];
        assert_eq!(files["rows"], format!("{id}/rows.summary.json"));
        assert!(!summarised.join(id).join("rows.parquet").exists(), "{id}");
        let summary = read_json(&summarised.join(id).join("rows.summary.json"));
        assert_eq!(files["rows_summary"], summary, "{id}");
        // The hash is the one of the rows a run with room saved.
        let rows =
            aisql_engine::data::files::read_parquet(&saved.join(id).join("rows.parquet")).unwrap();
        let mut digest = aisql_engine::data::row_digest::RowsDigest::default();
        digest.add_batch(&rows).unwrap();
        assert_eq!(summary["rows"], digest.rows(), "{id}");
        assert_eq!(summary["rows_hash"], digest.hash_hex(), "{id}");
        // Not compared, so never good; the count alone shows no missing or extra rows.
        assert_eq!(q["assessment"]["verdict"], "bad", "{id}");
        assert_eq!(
            q["assessment"]["reasons"],
            serde_json::json!(["RESULT_NOT_SAVED"]),
            "{id}"
        );
        assert!(
            q["metrics"]["accuracy"]["output_accuracy"].is_null(),
            "{id}"
        );
        assert!(
            !q["metrics"]["accuracy"]["answer_accuracy"].is_null(),
            "{id}"
        );
    }
    let report = std::fs::read_to_string(summarised.join("report.md")).unwrap();
    assert!(report.contains("## Results kept as a summary"), "{report}");
    assert!(report.contains("| IMDB-2 |"), "{report}");
    // Rescoring reads the summary as the run did.
    aisql()
        .args(["bench", "report"])
        .arg(&summarised)
        .assert()
        .success();
    assert_eq!(
        read_json(&summarised.join("run.json"))["queries"],
        j["queries"]
    );
    // A reserve that is not a number is refused, naming the setting.
    bench(&tmp.path().join("bad"), Some("lots"))
        .failure()
        .stderr(predicates::str::contains("AISQL_DISK_RESERVE_BYTES"));
}
