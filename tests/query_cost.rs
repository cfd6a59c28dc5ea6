//! What a query may cost and what one bad row does, as a user runs them:
//! `--max-fresh-tokens`, `--max-model-seconds`, `--max-cost-usd` stop the model
//! within one forward batch of the limit and fail naming the budget, or with
//! `--on-budget partial` return a subset of the full result with each AI
//! operator's coverage; `--on-row-error null` makes a row longer than the
//! model's context NULL and leaves every other row's answer as it was;
//! `--max-error-ratio` bounds how many may be; `aisql bench` records a query
//! over budget as `over_budget` and goes on; and every bad value of these flags
//! is a usage error (exit 2) naming the flag.

use std::path::{Path, PathBuf};

mod common;
use common::cli::aisql;

/// Scale factor of the stand-in corpus the budget tests run on (IMDB-1 has 100
/// reviews, about 32,000 simulated fresh tokens).
const SF: &str = "0.002";

/// Tokens per forward batch in the budget tests: the most a budget may be
/// overshot by, per worker.
const BATCH_TOKENS: u64 = 1024;

/// A stand-in QUAIL-B corpus at [`SF`] under `dir`.
fn corpus(dir: &Path) -> PathBuf {
    let root = dir.join("quailb");
    aisql()
        .args(["data", "generate", "--sf", SF, "--root"])
        .arg(&root)
        .assert()
        .success();
    root
}

/// A run's stdout lines (csv rows, header included) and stderr.
struct Run {
    rows: Vec<String>,
    stderr: String,
}

impl Run {
    /// The data rows, sorted (csv order aside).
    fn sorted(&self) -> Vec<String> {
        let mut rows = self.rows[1..].to_vec();
        rows.sort();
        rows
    }

    /// The number after `prefix` on stderr (`fresh tokens: `, `computed `).
    fn number_after(&self, prefix: &str) -> u64 {
        let at = self
            .stderr
            .find(prefix)
            .unwrap_or_else(|| panic!("no {prefix:?} in:\n{}", self.stderr));
        self.stderr[at + prefix.len()..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no number after {prefix:?} in:\n{}", self.stderr))
    }
}

/// Runs `aisql ARGS --format csv`, expecting exit code `code`.
fn run<S: AsRef<std::ffi::OsStr> + std::fmt::Debug>(args: &[S], code: i32) -> Run {
    let out = aisql()
        .args(args)
        .args(["--format", "csv"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "{args:?}:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    Run {
        rows: String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect(),
        stderr,
    }
}

/// `partial` is a strict, non-empty subset of `full` (as multisets of rows).
fn assert_strict_subset(partial: &Run, full: &Run) {
    let (mut left, whole) = (full.sorted(), partial.sorted());
    assert!(!whole.is_empty(), "no rows at all:\n{}", partial.stderr);
    for row in &whole {
        let at = left
            .iter()
            .position(|r| r == row)
            .unwrap_or_else(|| panic!("{row:?} is not a row of the full result"));
        left.remove(at);
    }
    assert!(!left.is_empty(), "the partial result is the whole result");
}

/// The limit, then the fresh tokens the budget stopped at: at or past the
/// limit, by less than `batches` forward batches.
fn assert_stopped_near(limit: u64, spent: u64, batches: u64) {
    assert!(
        limit <= spent && spent < limit + batches * BATCH_TOKENS,
        "stopped at {spent} fresh tokens for a limit of {limit}"
    );
}

#[test]
fn a_fresh_token_budget_stops_within_a_forward_batch_and_fails_or_returns_a_subset() {
    let tmp = tempfile::tempdir().unwrap();
    let root = corpus(tmp.path());
    let root = root.to_str().unwrap();
    let batch = BATCH_TOKENS.to_string();
    let base = [
        "query",
        "IMDB-1",
        "--backend",
        "oracle",
        "--simulate",
        "--root",
        root,
        "--sf",
        SF,
        "--batch-tokens",
        &batch,
    ];
    let full = run(&base, 0);
    let fresh = full.number_after("fresh tokens: ");
    let half = fresh / 2;
    let limit = half.to_string();
    let capped: Vec<&str> = base
        .iter()
        .copied()
        .chain(["--max-fresh-tokens", &limit])
        .collect();

    // By default the query fails naming the budget and what was done.
    let failed = run(&capped, 1);
    let e = &failed.stderr;
    assert!(
        e.contains(&format!("over budget: --max-fresh-tokens {half} is spent")),
        "{e}"
    );
    assert!(
        e.contains("filter-1 had answered") && e.contains("not reached"),
        "{e}"
    );
    assert_stopped_near(half, failed.number_after("the model computed "), 1);

    // Partial: the rows answered before the budget ran out, coverage stated.
    let partial_args: Vec<&str> = capped
        .iter()
        .copied()
        .chain(["--on-budget", "partial"])
        .collect();
    let partial = run(&partial_args, 0);
    assert_strict_subset(&partial, &full);
    let e = &partial.stderr;
    assert!(e.contains("budget spent (--max-fresh-tokens"), "{e}");
    let answered = partial.number_after("filter-1: ");
    let unreached = partial.number_after(&format!("filter-1: {answered} rows answered, "));
    assert!(answered > 0 && unreached > 0, "{e}");
    assert_eq!(answered + unreached, 100, "{e}");
    assert_stopped_near(half, partial.number_after("fresh tokens: "), 1);

    // The same budget with room to spare changes nothing.
    let roomy = (fresh * 2).to_string();
    let within: Vec<&str> = base
        .iter()
        .copied()
        .chain(["--max-fresh-tokens", &roomy, "--on-budget", "partial"])
        .collect();
    let within = run(&within, 0);
    assert_eq!(within.sorted(), full.sorted());
    assert!(
        within
            .stderr
            .contains(&format!("budget: spent {fresh} fresh tokens")),
        "{}",
        within.stderr
    );
}

#[test]
fn workers_in_one_process_spend_one_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let root = corpus(tmp.path());
    let root = root.to_str().unwrap();
    let batch = BATCH_TOKENS.to_string();
    // A chain of three filters over two simulated devices, 16 rows at a time
    // through the chain.
    let base = [
        "query",
        "IMDB-7",
        "--batch-rows",
        "16",
        "--backend",
        "oracle",
        "--simulate",
        "--cpu-workers",
        "2",
        "--root",
        root,
        "--sf",
        SF,
        "--batch-tokens",
        &batch,
    ];
    let full = run(&base, 0);
    let half = full.number_after("fresh tokens: ") / 2;
    let limit = half.to_string();
    let args: Vec<&str> = base
        .iter()
        .copied()
        .chain(["--max-fresh-tokens", &limit, "--on-budget", "partial"])
        .collect();
    let partial = run(&args, 0);
    assert_strict_subset(&partial, &full);
    // Each worker may finish the batch it started.
    assert_stopped_near(half, partial.number_after("fresh tokens: "), 2);
    assert!(partial.stderr.contains("filter-2: "), "{}", partial.stderr);
}

#[test]
fn outer_joins_never_report_a_row_the_budget_left_unasked_as_unmatched() {
    let tmp = tempfile::tempdir().unwrap();
    let root = corpus(tmp.path());
    let root = root.to_str().unwrap();
    for join in ["LEFT", "RIGHT", "FULL"] {
        let sql = format!(
            "SELECT c.id AS c, e.id AS e FROM claims c {join} JOIN evidence e ON \
             ai_join('Does the Wikipedia passage in DOCUMENT {{1}} support the claim in \
             DOCUMENT {{0}}?', c.claim, e.text)"
        );
        let base = [
            "sql",
            sql.as_str(),
            "--backend",
            "oracle",
            "--simulate",
            "--root",
            root,
            "--sf",
            SF,
            "--batch-tokens",
            "512",
        ];
        let full = run(&base, 0);
        // Unmatched rows on the kept side(s): what a budget must not invent.
        assert!(
            full.rows
                .iter()
                .any(|r| r.starts_with(',') || r.ends_with(',')),
            "{join}: {:?}",
            full.rows
        );
        let third = (full.number_after("fresh tokens: ") / 3).to_string();
        let args: Vec<&str> = base
            .iter()
            .copied()
            .chain(["--max-fresh-tokens", &third, "--on-budget", "partial"])
            .collect();
        let partial = run(&args, 0);
        assert_strict_subset(&partial, &full);
        assert!(partial.stderr.contains("not reached"), "{}", partial.stderr);
    }
}

#[test]
fn the_model_backend_stops_on_tokens_and_on_seconds_across_cpu_workers() {
    let tmp = tempfile::tempdir().unwrap();
    let root = corpus(tmp.path());
    let root = root.to_str().unwrap();
    let batch = BATCH_TOKENS.to_string();
    let base = [
        "query",
        "IMDB-1",
        "--model",
        "tiny",
        "--cpu-workers",
        "2",
        "--root",
        root,
        "--sf",
        SF,
        "--batch-tokens",
        &batch,
    ];
    let full = run(&base, 0);
    let half = full.number_after("fresh tokens: ") / 2;
    let limit = half.to_string();
    let args: Vec<&str> = base
        .iter()
        .copied()
        .chain(["--max-fresh-tokens", &limit, "--on-budget", "partial"])
        .collect();
    let partial = run(&args, 0);
    assert_strict_subset(&partial, &full);
    assert_stopped_near(half, partial.number_after("fresh tokens: "), 2);
    // A millisecond of model time is less than the dozens of forward batches
    // this query needs.
    let args: Vec<&str> = base
        .iter()
        .copied()
        .chain(["--max-model-seconds", "0.001"])
        .collect();
    let e = run(&args, 1).stderr;
    assert!(
        e.contains("over budget: --max-model-seconds 0.001 is spent: the model ran"),
        "{e}"
    );
    // Dollars are seconds at the GPU-hour price: $3600 an hour is $1 a second.
    let args: Vec<&str> = base
        .iter()
        .copied()
        .chain(["--max-cost-usd", "0.001", "--gpu-hourly-rate-usd", "3600"])
        .collect();
    let e = run(&args, 1).stderr;
    assert!(
        e.contains("over budget: --max-cost-usd 0.001 is spent") && e.contains("$3600/GPU-hour"),
        "{e}"
    );
}

/// A query over budget is recorded as such, and the run goes on.
#[test]
fn bench_records_a_query_over_budget_and_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let root = corpus(tmp.path());
    let dir = tmp.path().join("run");
    // IMDB-1 needs about 32,000 fresh tokens, FEV-1 about 600.
    aisql()
        .args(["bench", "--sf", SF, "--backend", "oracle", "--simulate"])
        .args(["--queries", "IMDB-1,FEV-1", "--max-fresh-tokens", "5000"])
        .arg("--root")
        .arg(&root)
        .arg("--output-dir")
        .arg(&dir)
        .assert()
        .code(1);
    let run: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("run.json")).unwrap()).unwrap();
    assert_eq!(run["metadata"]["budget"]["max_fresh_tokens"], 5000);
    let queries = run["queries"].as_array().unwrap();
    assert_eq!(queries[0]["id"], "IMDB-1");
    assert_eq!(queries[0]["status"], "over_budget", "{}", queries[0]);
    let error = queries[0]["error"].as_str().unwrap();
    assert!(
        error.contains("--max-fresh-tokens 5000 is spent"),
        "{error}"
    );
    assert_eq!(queries[1]["status"], "complete", "{}", queries[1]);
    let budget = &queries[1]["measurements"]["budget"];
    assert_eq!(budget["exhausted"], false, "{budget}");
    assert_eq!(budget["operators"][0]["unreached_rows"], 0, "{budget}");
    let spent = budget["spent"]["fresh_tokens"].as_u64().unwrap();
    assert_eq!(
        Some(spent),
        queries[1]["measurements"]["fresh_tokens"].as_u64()
    );
}

/// `docs.csv` with `rows` (id, text) under `dir`.
fn csv_table(dir: &Path, name: &str, rows: &[(&str, String)]) -> String {
    let path = dir.join(format!("{name}.csv"));
    let mut text = String::from("id,body\n");
    for (id, body) in rows {
        text.push_str(&format!("{id},{body}\n"));
    }
    std::fs::write(&path, text).unwrap();
    format!("docs={}", path.display())
}

#[test]
fn a_row_longer_than_the_context_is_null_and_the_others_keep_their_answers() {
    let tmp = tempfile::tempdir().unwrap();
    // About 45,000 tokens: over the tiny model's 40,960 positions.
    let long = format!("endless {}", "word ".repeat(45_000));
    let mut rows: Vec<(&str, String)> = [
        "A warm and funny film.",
        "Dull and far too long.",
        "I loved the music.",
        "The plot made no sense.",
    ]
    .iter()
    .enumerate()
    .map(|(i, t)| (["d1", "d2", "d4", "d5"][i], t.to_string()))
    .collect();
    let short = csv_table(tmp.path(), "short", &rows);
    rows.insert(2, ("d3", long));
    let with_long = csv_table(tmp.path(), "docs", &rows);
    let query = "SELECT id, ai_filter('Is {0} kind?', body) AS kind, \
                 ai_classify('Tone of {0}?', body, ['pos', 'neg'], ['Good', 'Bad']) AS tone, \
                 ai_complete('Summarise {0}', body, 3) AS gist FROM docs ORDER BY id";
    let sql = |table: &str, extra: &[&str]| -> Vec<String> {
        let mut a = vec!["sql", query, "--table", table];
        a.extend_from_slice(extra);
        a.into_iter().map(String::from).collect()
    };
    let without = run(&sql(&short, &[]), 0);

    // By default the long row fails the query, named by its start and size.
    let e = run(&sql(&with_long, &[]), 1).stderr;
    assert!(
        e.contains("the prompt for row endless word word")
            && e.contains("max_position_embeddings")
            && e.contains("--on-row-error null"),
        "{e}"
    );

    let nulls = run(&sql(&with_long, &["--on-row-error", "null"]), 0);
    let mut expected = without.rows.clone();
    expected.insert(3, "d3,,,".into());
    assert_eq!(nulls.rows, expected, "{}", nulls.stderr);
    for op in ["filter-1", "classify-1", "complete-1"] {
        assert!(
            nulls
                .stderr
                .contains(&format!("{op}: 1 of 5 rows failed, their values are NULL")),
            "{op}: {}",
            nulls.stderr
        );
    }

    // A filter drops the row as SQL drops a NULL condition.
    let filtered = "SELECT id FROM docs WHERE ai_filter('Is {0} kind?', body) ORDER BY id";
    let kept = |table: &str, extra: &[&str]| {
        let mut a = vec!["sql", filtered, "--table", table];
        a.extend_from_slice(extra);
        run(&a, 0).rows
    };
    assert_eq!(
        kept(&with_long, &["--on-row-error", "null"]),
        kept(&short, &[])
    );

    // One row in five is a fifth: over a tenth, within a fifth.
    let e = run(&sql(&with_long, &["--max-error-ratio", "0.1"]), 1).stderr;
    assert!(
        e.contains("1 of its 5 rows failed, more than --max-error-ratio 0.1 allows")
            && e.contains("row endless word word"),
        "{e}"
    );
    let within = run(&sql(&with_long, &["--max-error-ratio", "0.2"]), 0);
    assert_eq!(within.rows, expected);
}

#[test]
fn an_ai_agg_group_with_a_row_no_prompt_holds_is_null_and_the_others_keep_theirs() {
    let tmp = tempfile::tempdir().unwrap();
    let table = |name: &str, long: bool| {
        let path = tmp.path().join(format!("{name}.csv"));
        let mut text = String::from("id,grp,body\nd1,A,A warm film.\nd2,A,Too loud.\n");
        if long {
            text.push_str(&format!("d3,B,endless {}\n", "word ".repeat(45_000)));
        }
        text.push_str("d4,B,I loved the music.\nd5,C,The plot made no sense.\n");
        std::fs::write(&path, text).unwrap();
        format!("docs={}", path.display())
    };
    let (with_long, without) = (table("docs", true), table("short", false));
    let query = "SELECT grp, ai_agg('Summarise the reviews.', body, 4) AS gist FROM docs \
                 GROUP BY grp ORDER BY grp";
    let e = run(&["sql", query, "--table", &with_long], 1).stderr;
    assert!(
        e.contains("ai_agg: a row of 225008 bytes (endless word"),
        "{e}"
    );
    let nulls = run(
        &[
            "sql",
            query,
            "--table",
            &with_long,
            "--on-row-error",
            "null",
        ],
        0,
    );
    let others = run(&["sql", query, "--table", &without], 0);
    assert_eq!(nulls.rows.len(), 4, "{:?}", nulls.rows);
    assert_eq!(nulls.rows[2], "B,");
    // A and C are asked the same prompts either way.
    for i in [1, 3] {
        assert_eq!(nulls.rows[i], others.rows[i]);
    }
    assert!(
        nulls.stderr.contains("agg-1: 1 of 3 rows failed"),
        "{}",
        nulls.stderr
    );
}

#[test]
fn bad_cost_flags_are_usage_errors_naming_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (&["--max-fresh-tokens", "0"], "--max-fresh-tokens"),
        (&["--max-fresh-tokens", "-5"], "--max-fresh-tokens"),
        (&["--max-fresh-tokens", "lots"], "--max-fresh-tokens"),
        (&["--max-model-seconds", "0"], "--max-model-seconds"),
        (&["--max-model-seconds", "-1"], "--max-model-seconds"),
        (&["--max-model-seconds", "nan"], "--max-model-seconds"),
        (&["--max-cost-usd", "abc"], "--max-cost-usd"),
        (&["--max-cost-usd", "-0.5"], "--max-cost-usd"),
        (&["--gpu-hourly-rate-usd", "-3"], "--gpu-hourly-rate-usd"),
        (&["--on-budget", "partial"], "--max-fresh-tokens"),
        (
            &["--max-fresh-tokens", "9", "--on-budget", "some"],
            "--on-budget",
        ),
        (&["--on-row-error", "maybe"], "--on-row-error"),
        (&["--max-error-ratio", "2"], "--max-error-ratio"),
        (&["--max-error-ratio", "-0.1"], "--max-error-ratio"),
        (
            &["--on-row-error", "fail", "--max-error-ratio", "0.5"],
            "--on-row-error fail and --max-error-ratio",
        ),
        (
            &["--max-cost-usd", "1", "--gpu-hourly-rate-usd", "0"],
            "--max-cost-usd with --gpu-hourly-rate-usd 0",
        ),
        // Nothing to spend: the plain oracle runs no model, a simulation no
        // forward passes to time.
        (
            &["--backend", "oracle", "--max-fresh-tokens", "100"],
            "--max-fresh-tokens: --backend oracle",
        ),
        (
            &[
                "--backend",
                "oracle",
                "--simulate",
                "--max-model-seconds",
                "1",
            ],
            "--max-model-seconds: --simulate",
        ),
    ];
    for (flags, needle) in cases {
        for command in [&["query", "IMDB-1"][..], &["sql", "SELECT 1"], &["bench"]] {
            let out = aisql().args(command).args(*flags).output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(
                out.status.code(),
                Some(2),
                "{command:?} {flags:?}: {stderr}"
            );
            assert!(
                stderr.contains(needle),
                "{command:?} {flags:?}: no {needle:?} in {stderr}"
            );
        }
    }
}
