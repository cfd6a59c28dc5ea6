//! `aisql sql` as a user runs it: tables from files, the three output formats,
//! `--output` files, `--to-substrait` read back by `aisql query`, and every kind
//! of bad input answered with a clear error (position or name), exit code 2 for
//! usage and 1 otherwise, and no output file left behind.

mod common;

use std::path::PathBuf;

use assert_cmd::Command;
use common::cli::{aisql, sql_data_table, stdout_json, stdout_of_success};
use common::*;
use predicates::prelude::*;

/// `aisql sql QUERY` over the corpus tables with the tiny model, plus `extra`.
fn sql(query: &str, extra: &[&str]) -> Command {
    let mut c = aisql();
    c.args([
        "sql",
        query,
        "--table",
        &sql_data_table("docs"),
        "--table",
        &sql_data_table("topics"),
    ])
    .args(["--backend", "model", "--model", "tiny"])
    .args(extra);
    c
}

/// Runs a query that must fail with `code`, `needle` on stderr, no panic, and
/// no file (nor temporary file) where `--output` pointed.
fn fails(query: &str, extra: &[&str], code: i32, needle: &str) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("rows.csv");
    sql(query, extra)
        .args(["--output", out.to_str().unwrap()])
        .assert()
        .code(code)
        .stderr(predicate::str::contains(needle).and(predicate::str::contains("panicked").not()));
    let left: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(left.is_empty(), "{query}: left behind {left:?}");
}

#[test]
fn rows_are_printed_and_saved_in_each_format() {
    let dir = tempfile::tempdir().unwrap();
    let query = "SELECT id FROM docs WHERE year > 2018 AND ai_filter('Is the review {0} kind?', body) ORDER BY id";
    let csv = stdout_of_success(&mut sql(query, &["--format", "csv"]));
    // The generated tiny model says its answers are random, on stderr only.
    sql(query, &[])
        .assert()
        .success()
        .stderr(predicate::str::contains(
            "random weights: its answers are random",
        ));
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("id"));
    let ids: Vec<&str> = lines.collect();
    let json = sql(query, &["--format", "json"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let json: serde_json::Value = serde_json::from_slice(&json).unwrap();
    let json_ids: Vec<&str> = json
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(json_ids, ids);
    sql(query, &[])
        .assert()
        .success()
        .stdout(predicate::str::contains("| id"));
    for ext in ["parquet", "csv", "json"] {
        let out = dir.path().join(format!("rows.{ext}"));
        sql(query, &["--output", out.to_str().unwrap(), "--limit", "0"])
            .assert()
            .success();
        assert!(out.is_file(), "{ext}");
    }
    let saved = aisql_engine::data::files::read_parquet(&dir.path().join("rows.parquet")).unwrap();
    assert_eq!(saved.num_rows(), ids.len());
    assert_eq!(
        std::fs::read_to_string(dir.path().join("rows.csv")).unwrap(),
        csv
    );
}

#[test]
fn a_sql_query_written_as_substrait_runs_with_aisql_query() {
    written_as_substrait_runs_the_same(
        "SELECT r.id, a.id AS aspect FROM reviews r JOIN aspects a \
         ON ai_join('Does the review {0} discuss {1}?', r.body, a.aspect) \
         WHERE r.id <> 'rv1' ORDER BY r.id, aspect",
    );
}

/// Embeddings through a plan file: `--to-substrait` loads no model, so
/// `ai_similarity`'s embeddings (no dims) are written as lists, and `aisql
/// query` sizes them by the model it loads.
#[test]
fn a_query_with_embeddings_written_as_substrait_runs_with_aisql_query() {
    written_as_substrait_runs_the_same(
        "SELECT r.id, ai_similarity(r.body, 'a long film') AS s, \
         vector_l2_distance(ai_embed(r.body, 'Find reviews', 8), \
         ai_embed('a long film', 'Find reviews', 8)) AS d FROM reviews r ORDER BY r.id",
    );
}

/// Typed fields through a plan file: the struct's fields keep their types
/// (the arithmetic and comparisons below need them) in `aisql sql` and in
/// the Substrait plan `aisql query` runs.
#[test]
fn typed_fields_written_as_substrait_run_with_aisql_query() {
    written_as_substrait_runs_the_same(
        "SELECT id, f['year'] + 1 AS next_year, f['rating'] * 2 AS doubled, \
         f['released'] + INTERVAL '1 day' AS day_after, NOT f['sequel'] AS original, \
         f['genre'] IN ('drama', 'comedy', 'horror') AS known_genre, f['tone'] AS tone \
         FROM (SELECT id, ai_extract(body, ['year INT: Which year?', \
         'rating DOUBLE: Its rating out of ten?', 'released DATE: When was it released?', \
         'sequel BOOLEAN: Is it a sequel?', 'genre ENUM(drama, comedy, horror): Which genre?', \
         'tone: One word for the tone?'], 40) AS f FROM reviews) ORDER BY id",
    );
}

/// Typed completions in each spelling (`returns =>`, `ai_generate`,
/// BigQuery's `AI.GENERATE_BOOL`) have their SQL types, in `aisql sql` and
/// through a Substrait plan.
#[test]
fn typed_completions_written_as_substrait_run_with_aisql_query() {
    written_as_substrait_runs_the_same(
        "SELECT id, ai_complete('Which year is {0} about?', body, 24, returns => 'INT') + 1 AS y, \
         ai_generate('DATE', 'When was {0} written?', body, 12) + INTERVAL '1 day' AS d, \
         NOT AI.GENERATE_BOOL(('Is ', body, ' kind?')) AS unkind, \
         ai_generate('ENUM(drama, comedy)', 'The genre of {0}?', body) AS genre, \
         ai_generate('ENUM(drama, comedy) OR NULL', 'The genre of {0}?', body) AS maybe, \
         AI.GENERATE(('Facts of ', body), output_schema => 'year INT64, ok BOOL, \
         kind ENUM(film, food) OR NULL, at STRUCT<day DATE>').year AS fy, \
         ai_generate('JSON {\"type\":\"object\",\"properties\":{\"year\":{\"type\":\"integer\",\
         \"minimum\":1900,\"maximum\":2030},\"kind\":{\"enum\":[\"film\",\"food\"]}},\
         \"required\":[\"year\",\"kind\"],\"additionalProperties\":false}', \
         'Describe {0} as JSON.', body, 80) AS described \
         FROM reviews ORDER BY id",
    );
}

/// A typed field that cannot finish within `max_tokens` fails its row,
/// naming the field, or is NULL under `--on-row-error null`.
#[test]
fn a_typed_field_past_max_tokens_fails_its_row_or_is_null() {
    let query = "SELECT id, ai_extract(body, ['released DATE: When?'], 3)['released'] AS d \
                 FROM docs ORDER BY id LIMIT 3";
    fails(
        query,
        &[],
        1,
        "field released has no whole DATE answer within max_tokens 3",
    );
    let null_rows = [
        "--format",
        "csv",
        "--on-row-error",
        "null",
        "--max-error-ratio",
        "1",
    ];
    let out = stdout_of_success(&mut sql(query, &null_rows));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "id,d");
    assert!(
        lines.len() > 1 && lines[1..].iter().all(|l| l.ends_with(',')),
        "{out}"
    );
}

/// A field over a column's keys answers one of the keys for every row: the
/// keys are the column's distinct values without NULLs (duplicates are one
/// key), EXPLAIN shows them as the field's ENUM, and an empty key column,
/// a missing table and a malformed source are errors naming them.
#[test]
fn a_field_over_a_columns_keys_answers_one_of_the_keys() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.csv");
    std::fs::write(
        &keys,
        "id,name\n1,price\n2,quality\n3,\n4,price\n5,the delivery time\n",
    )
    .unwrap();
    let empty = dir.path().join("empty.csv");
    std::fs::write(&empty, "id,name\n1,\n").unwrap();
    let tables = [
        format!("keys={}", keys.display()),
        format!("nokeys={}", empty.display()),
    ];
    let extra = |more: &[&'static str]| -> Vec<String> {
        let mut v = vec![
            "--table".to_string(),
            tables[0].clone(),
            "--table".into(),
            tables[1].clone(),
        ];
        v.extend(more.iter().map(|s| s.to_string()));
        v
    };
    let run = |query: &str, more: &[&'static str]| {
        let args = extra(more);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        sql(query, &args)
    };
    let query = "SELECT id, ai_extract(body, ['topic FROM keys.name: Which topic is it about?', \
                 'year INT: Which year?'], 24)['topic'] AS topic FROM docs WHERE body IS NOT NULL \
                 ORDER BY id";
    let out = stdout_of_success(&mut run(query, &["--format", "csv"]));
    let rows: Vec<&str> = out.lines().skip(1).collect();
    assert!(rows.len() >= 25, "{out}");
    for row in &rows {
        let topic = row.split_once(',').unwrap().1;
        assert!(
            ["price", "quality", "the delivery time"].contains(&topic.trim_matches('"')),
            "{row}"
        );
    }
    // OR NULL: the same walk, ended where the model's best token leaves the
    // keys, so each answer is that row's key or NULL (no key here is the
    // start of another).
    let or_null = query.replace("keys.name:", "keys.name OR NULL:");
    let out = stdout_of_success(&mut run(&or_null, &["--format", "csv"]));
    let maybe: Vec<&str> = out.lines().skip(1).collect();
    assert_eq!(maybe.len(), rows.len(), "{out}");
    let mut nulls = 0;
    for (row, want) in maybe.iter().zip(&rows) {
        nulls += usize::from(row.ends_with(','));
        assert!(row.ends_with(',') || row == want, "{row} against {want}");
    }
    eprintln!("OR NULL: {nulls} of {} rows NULL", rows.len());
    // One keyed answer per row through ai_generate's type.
    let generated = "SELECT id, ai_generate('FROM keys.name', 'Which topic is {0} about?', body, \
                     24) AS topic FROM docs WHERE body IS NOT NULL ORDER BY id";
    let out = stdout_of_success(&mut run(generated, &["--format", "csv"]));
    let topics: Vec<&str> = out.lines().skip(1).collect();
    assert_eq!(topics.len(), rows.len(), "{out}");
    for row in topics {
        let topic = row.split_once(',').unwrap().1;
        assert!(
            ["price", "quality", "the delivery time"].contains(&topic.trim_matches('"')),
            "{row}"
        );
    }
    run(&format!("EXPLAIN {or_null}"), &[])
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "topic ENUM('price', 'quality', 'the delivery time') OR NULL",
        ));
    run(&format!("EXPLAIN {query}"), &[])
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "topic ENUM('price', 'quality', 'the delivery time')",
        ));
    let fails_with = |query: &str, needle: &str| {
        run(query, &[]).assert().code(1).stderr(
            predicate::str::contains(needle).and(predicate::str::contains("panicked").not()),
        );
    };
    fails_with(
        "SELECT ai_extract(body, ['topic FROM nokeys.name: Which?']) FROM docs",
        "the field's keys nokeys.name are empty",
    );
    fails_with(
        "SELECT ai_extract(body, ['topic FROM nowhere.name: Which?']) FROM docs",
        "the field's keys nowhere.name cannot be read",
    );
    fails_with(
        "SELECT ai_extract(body, ['topic FROM keys: Which?']) FROM docs",
        "must be 'name FROM table.column'",
    );
    fails_with(
        "SELECT ai_extract(body, ['year INT OR NULL: Which?']) FROM docs",
        "OR NULL follows a set of values",
    );
}

/// `OR NULL` follows the model's own greedy path while it stays inside the
/// keys: with the keys made of the rows' first free tokens, every answer is
/// NULL or a key that the row's free completion starts with, and rows do
/// answer keys (the random model's best tokens are rarely another table's
/// keys, so a key set it prefers is made from its own choices).
#[test]
fn an_or_null_key_answer_is_the_free_completion_while_it_stays_in_the_keys() {
    let template = "Which topic is {0} about?";
    let rows = |query: &str, extra: &[&str]| -> Vec<Option<String>> {
        stdout_json(&mut sql(query, &[&["--format", "json"], extra].concat()))
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["a"].as_str().map(str::to_string))
            .collect()
    };
    let over =
        |call: &str| format!("SELECT id, {call} AS a FROM docs WHERE body IS NOT NULL ORDER BY id");
    let firsts = rows(&over(&format!("ai_complete('{template}', body, 1)")), &[]);
    let keys: std::collections::BTreeSet<String> = firsts
        .iter()
        .flatten()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty() && t.chars().all(|c| c.is_ascii_alphanumeric()))
        .collect();
    assert!(keys.len() >= 3, "{firsts:?}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("firsts.csv");
    let csv: Vec<String> = keys.iter().map(|k| format!("{k}\n")).collect();
    std::fs::write(&file, format!("name\n{}", csv.concat())).unwrap();
    let table = format!("firsts={}", file.display());
    let extra = ["--table", table.as_str()];
    let free = rows(
        &over(&format!("ai_complete('{template}', body, 24)")),
        &extra,
    );
    let keyed = rows(
        &over(&format!(
            "ai_generate('FROM firsts.name OR NULL', '{template}', body, 24)"
        )),
        &extra,
    );
    assert_eq!(keyed.len(), free.len());
    let mut answered = 0;
    for (k, f) in keyed.iter().zip(&free) {
        let Some(k) = k else { continue };
        let f = f.as_deref().unwrap_or_default();
        assert!(keys.contains(k), "{k:?} is no key");
        assert!(
            f.trim_start().starts_with(k.as_str()),
            "{k:?} against {f:?}"
        );
        answered += 1;
    }
    eprintln!(
        "{answered} of {} rows answered one of {} keys",
        keyed.len(),
        keys.len()
    );
    assert!(answered > 0, "{keyed:?}");
}

/// `query` over the tiny corpus's reviews and aspects gives the same CSV run
/// by `aisql sql` and written by `--to-substrait` (binary and JSON), then run
/// by `aisql query`.
fn written_as_substrait_runs_the_same(query: &str) {
    let dir = tempfile::tempdir().unwrap();
    let tables = dir.path().join("tables");
    TinyCorpus::write(&tables);
    let reviews = format!("reviews={}", tables.join("reviews.parquet").display());
    let aspects = format!("aspects={}", tables.join("aspects.parquet").display());
    let run = |extra: &[&str]| {
        let mut c = aisql();
        c.args(["sql", query, "--table", &reviews, "--table", &aspects])
            .args(["--backend", "model", "--model", "tiny", "--format", "csv"])
            .args(["--limit", "1000000"])
            .args(extra);
        c
    };
    let want = run(&[]).assert().success().get_output().stdout.clone();
    for name in ["plan.substrait", "plan.json"] {
        let plan = dir.path().join(name);
        run(&["--to-substrait", plan.to_str().unwrap()])
            .assert()
            .success();
        let got = aisql()
            .args(["query", plan.to_str().unwrap(), "--tables"])
            .arg(&tables)
            .args(["--backend", "model", "--model", "tiny", "--format", "csv"])
            .args(["--limit", "1000000"])
            .assert()
            .success()
            .get_output()
            .stdout
            .clone();
        assert_eq!(
            String::from_utf8(got).unwrap(),
            String::from_utf8(want.clone()).unwrap(),
            "{name}"
        );
    }
}

#[test]
fn bad_sql_gets_a_clear_error() {
    // Spellings, arity, placeholders: with the call's line and column.
    fails(
        "SELECT id FROM docs WHERE AI.GUESS(body)",
        &[],
        1,
        "unknown AI function AI.GUESS at line 1, column 27",
    );
    fails(
        "SELECT id FROM docs WHERE ai_filtr('{0}?', body)",
        &[],
        1,
        "unknown AI function ai_filtr",
    );
    fails(
        "SELECT id FROM docs\nWHERE ai_join('{0} and {1}?', body)",
        &[],
        1,
        "ai_join takes (template, left document, right document), not 2 argument(s) at line 2",
    );
    fails(
        "SELECT id FROM docs WHERE ai_filter('Is it kind?', body)",
        &[],
        1,
        "the template has no {0} placeholder",
    );
    fails(
        "SELECT id FROM docs WHERE ai_filter('Is {0} like {1}?', body)",
        &[],
        1,
        "more placeholders than its 1 document(s)",
    );
    fails(
        "SELECT id, ai_classify('Tone of {0}?', body, ['good'], ['fine']) FROM docs",
        &[],
        1,
        "at least two labels",
    );
    // The new functions' arguments, with the call's place.
    fails(
        "SELECT id, ai_complete('Summarise {0}.', body, 0) FROM docs",
        &[],
        1,
        "ai_complete at line 1, column 12: max_tokens (argument 3) must be a positive integer",
    );
    fails(
        "SELECT id, ai_complete('Summarise {0}.', body, -4) FROM docs",
        &[],
        1,
        "max_tokens (argument 3) must be a positive integer of at most 131072, not -4",
    );
    fails(
        "SELECT id, ai_complete('Summarise {0}.', body, 100000) FROM docs",
        &[],
        1,
        "longer than the model's context of 40960 positions",
    );
    fails(
        "SELECT id, ai_score('Is {0} kind?', year) FROM docs",
        &[],
        1,
        "is Int64, not text",
    );
    fails(
        "SELECT id, ai_classify_scores('Tone of {0}?', body, ['good'], ['fine']) FROM docs",
        &[],
        1,
        "ai_classify_scores needs at least two labels",
    );
    fails(
        "SELECT id, AI_COMPLETE('qwen3-32b', PROMPT('Summarise {0}.', body)) FROM docs",
        &[],
        1,
        "AI_COMPLETE at line 1, column 12 names model \"qwen3-32b\", but the loaded model is \"tiny\"",
    );
    fails(
        "SELECT AI_COUNT_TOKENS('ai_filter', 'llama3-70b', PROMPT('Is {0} kind?', body)) FROM docs",
        &[],
        1,
        "AI_COUNT_TOKENS at line 1, column 8 names model \"llama3-70b\", but the loaded model is \"tiny\"",
    );
    fails(
        "SELECT id, AI.GENERATE(('Summarise ', body, ' and ', year, ' and ', lang)) FROM docs",
        &[],
        1,
        "AI.GENERATE at line 1, column 12: the prompt names 3 column(s)",
    );
    fails(
        "SELECT ai_extract(body, ['dish Which dish?']) FROM docs",
        &[],
        1,
        "ai_extract: the fields (argument 2) must be a list of 'name: question' strings",
    );
    fails(
        "SELECT ai_generate('VARCHAR', 'Year of {0}?', body) FROM docs",
        &[],
        1,
        "ai_generate: the type (argument 1) must be a string literal such as 'INT'",
    );
    fails(
        "SELECT ai_complete('Year of {0}?', body, returns => 'JSON {\"type\": \"bogus\"}') FROM docs",
        &[],
        1,
        "the JSON schema is not one llguidance reads",
    );
    fails(
        "SELECT ai_extract(body, ['r JSON {\"type\": \"object\"}: Which?']) FROM docs",
        &[],
        1,
        "a JSON answer is asked with ai_generate",
    );
    fails(
        "SELECT ai_complete('Year of {0}?', body, returns => 'INTEGR') FROM docs",
        &[],
        1,
        "\"INTEGR\" is not one",
    );
    fails(
        "SELECT ai_extract(body, ['genre ENUM(a, b, a): Which?']) FROM docs",
        &[],
        1,
        "field 1: \"genre ENUM(a, b, a)\": the ENUM value \"a\" comes twice",
    );
    fails(
        "SELECT ai_extract(body, ['year INT: Which?', 'YEAR DATE: When?']) FROM docs",
        &[],
        1,
        "field name \"YEAR\" comes twice",
    );
    fails(
        "SELECT ai_agg('Summarise.', ai_agg('Again.', body)) FROM docs",
        &[],
        1,
        "ai_agg at line 1, column 8: an AI aggregate inside another call's argument",
    );
    fails(
        "SELECT d.id FROM docs d JOIN topics t ON ai_agg('Summarise.', d.body) = t.name",
        &[],
        1,
        "an AI aggregate in a join condition is not supported",
    );
    fails(
        "SELECT ai_agg('Summarise {0}.', body) FROM docs",
        &[],
        1,
        "ai_agg at line 1, column 8: the instruction names no {0}",
    );
    fails(
        "SELECT ai_agg('Summarise.', year) FROM docs",
        &[],
        1,
        "is Int64, not text",
    );
    // Types and places: naming the call.
    fails(
        "SELECT id FROM docs WHERE ai_filter('Is {0} recent?', year)",
        &[],
        1,
        "is Int64, not text",
    );
    fails(
        "SELECT id FROM docs WHERE ai_filter('Is {0} long?', CASE WHEN ai_filter('Is {0} kind?', body) THEN body END)",
        &[],
        1,
        "inside another AI call's argument",
    );
    fails(
        "SELECT d.id FROM docs d LEFT JOIN topics t ON ai_filter('Is {0} long?', d.body)",
        &[],
        1,
        "in the ON of a Left JOIN",
    );
    // Names.
    fails("SELECT id FROM nope", &[], 1, "nope");
    fails(
        "SELECT nope FROM docs WHERE ai_filter('Is {0} kind?', body)",
        &[],
        1,
        "No field named nope",
    );
    fails(
        "SELECT id FROM docs; SELECT 1",
        &[],
        1,
        "2 statements given",
    );
    // Usage.
    fails("SELECT 1", &["--table", "docs"], 2, "expected NAME=PATH");
    let two = "SELECT id FROM docs WHERE ai_filter('Is {0} kind?', body) AND ai_filter('Is {0} long?', body)";
    fails(two, &["--selectivity", "kind"], 2, "expected TEXT=FRACTION");
    fails(
        two,
        &["--selectivity", "kind=2"],
        2,
        "not a fraction between 0 and 1",
    );
    fails(
        two,
        &["--selectivity", "short=0.2"],
        2,
        "no AI call's prompt contains \"short\"",
    );
    fails(
        two,
        &["--selectivity", "Is {0}=0.2"],
        2,
        "2 prompts contain",
    );
    let dir = tempfile::tempdir().unwrap();
    let txt = dir.path().join("rows.txt");
    sql("SELECT 1", &["--output", txt.to_str().unwrap()])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "name a .parquet, .csv or .json file",
        ));
    assert!(!txt.exists());
}

#[test]
fn the_limits_of_a_statement_are_errors_naming_them() {
    // Integer overflow, as in PostgreSQL and DuckDB.
    fails(
        "SELECT 9223372036854775807 + 1",
        &[],
        1,
        "Int64 overflow in 9223372036854775807 + 1",
    );
    fails(
        "SELECT CAST(2147483647 AS INT) + CAST(1 AS INT)",
        &[],
        1,
        "Int32 overflow in 2147483647 + 1",
    );
    fails(
        "SELECT year * 4611686018427387904 FROM docs",
        &[],
        1,
        "Int64 overflow in",
    );
    // Recursion past --max-recursion, naming the CTE.
    let endless = "WITH RECURSIVE walk(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM walk) \
                   SELECT count(*) FROM walk";
    fails(
        endless,
        &["--max-recursion", "50"],
        1,
        "recursive CTE walk passed --max-recursion 50 iterations",
    );
    let bounded = "WITH RECURSIVE walk(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM walk WHERE n < 40) \
                   SELECT count(*) AS c FROM walk";
    sql(bounded, &["--max-recursion", "50", "--format", "csv"])
        .assert()
        .success()
        .stdout("c\n40\n");
    // Nesting past the parser's limit.
    let deep = format!("SELECT {}1{}", "(".repeat(2000), ")".repeat(2000));
    fails(
        &deep,
        &[],
        1,
        "the statement nests 2000 levels deep, deeper than the parser's recursion limit (100",
    );
    // A generation is stopped between two decode steps, not at its end.
    fails(
        "SELECT id, ai_complete('Summarise the review {0}.', body, 4000) FROM docs",
        &["--timeout-s", "2"],
        1,
        "the query ran past --timeout-s 2",
    );
    // Usage.
    fails("SELECT 1", &["--timeout-s", "0"], 2, "--timeout-s");
    fails(
        "SELECT 1",
        &["--timeout-s", "soon"],
        2,
        "not a number of seconds",
    );
    fails("SELECT 1", &["--max-recursion", "0"], 2, "--max-recursion");
}

#[test]
fn a_statement_past_its_timeout_is_stopped() {
    // 10^12 pairs, none kept: hours of work, stopped after a second.
    let started = std::time::Instant::now();
    fails(
        "SELECT count(*) FROM generate_series(1, 1000000) a, generate_series(1, 1000000) b \
         WHERE a.value + b.value < 0",
        &["--timeout-s", "1"],
        1,
        "the query ran past --timeout-s 1 and was stopped",
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    // In time, it runs.
    sql(
        "SELECT count(*) AS c FROM generate_series(1, 10) a",
        &["--timeout-s", "60", "--format", "csv"],
    )
    .assert()
    .success()
    .stdout("c\n10\n");
}

#[test]
fn malformed_tables_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("broken.csv");
    std::fs::write(&csv, "id,body\nd1,fine\nd2,too,many,fields\n").unwrap();
    let parquet = dir.path().join("broken.parquet");
    std::fs::write(&parquet, b"PAR1 this is not parquet PAR1").unwrap();
    let unknown = dir.path().join("table.xlsx");
    std::fs::write(&unknown, b"x").unwrap();
    for (path, needle) in [
        (&csv, "not readable as CSV"),
        (&parquet, "not a readable Parquet file"),
        (&unknown, "unknown file type"),
    ] {
        let arg = format!("broken={}", path.display());
        fails(
            "SELECT * FROM broken",
            &["--table", &arg],
            1,
            &format!("table broken ({})", path.display()),
        );
        fails("SELECT * FROM broken", &["--table", &arg], 1, needle);
    }
}

#[test]
fn csv_and_json_print_every_row_and_the_table_cuts_what_eyes_cannot_read() {
    let query = "SELECT value, repeat('x', 300) AS long FROM generate_series(1, 120)";
    let run = |extra: &[&str]| {
        let out = aisql().args(["sql", query]).args(extra).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    let (csv, _) = run(&["--format", "csv"]);
    assert_eq!(csv.lines().count(), 121, "header and every row");
    assert!(csv.lines().nth(1).unwrap().ends_with(&"x".repeat(300)));
    let (json, _) = run(&["--format", "json"]);
    let rows: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 120);
    let (csv, stderr) = run(&["--format", "csv", "--limit", "7"]);
    assert_eq!(csv.lines().count(), 8);
    assert!(
        stderr.contains("120 rows") && stderr.contains("(7 shown)"),
        "{stderr}"
    );
    let (table, stderr) = run(&[]);
    assert!(stderr.contains("(50 shown)"), "{stderr}");
    assert!(
        table.contains(&format!("{}…", "x".repeat(200))),
        "long cells are cut"
    );
    assert!(!table.contains(&"x".repeat(201)));
}

/// `c` as a `std::process::Command`, whose streams can be set.
fn std_command(c: &Command) -> std::process::Command {
    let mut std = std::process::Command::new(c.get_program());
    std.args(c.get_args());
    std
}

/// A `Stdio` whose reader is already gone: every write to it fails with a
/// broken pipe (aisql, like any Rust program, ignores SIGPIPE).
fn closed_pipe() -> std::process::Stdio {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    writer.into()
}

/// Output whose reader went away (`aisql sql ... | head`, a closed stderr
/// under `--progress json`) ends the command quietly, with SIGPIPE's exit
/// code, never with a panic.
#[test]
fn a_closed_stdout_or_stderr_ends_the_command_quietly() {
    let ai = "SELECT id FROM docs WHERE ai_filter('Is the review {0} kind?', body) ORDER BY id";
    for (query, extra) in [
        ("SELECT 1", vec![]),
        (ai, vec!["--progress", "json"]),
        (ai, vec!["--format", "csv", "--limit", "1000"]),
    ] {
        // stdout closed: stderr says nothing of a panic.
        let out = std_command(&sql(query, &extra))
            .stdout(closed_pipe())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{query}: {stderr}");
        assert_eq!(out.status.code(), Some(141), "{query}: {stderr}");
        // stderr closed: nothing to read there, the exit code tells.
        let out = std_command(&sql(query, &extra))
            .stderr(closed_pipe())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(141), "{query} with stderr closed");
        assert!(!String::from_utf8_lossy(&out.stdout).contains("panicked"));
    }
}

/// A statement without AI calls never loads the model: over a model whose
/// configuration reads but whose weights are cut short, `SELECT 1` and a
/// plain query answer, and the first AI statement fails naming the weights.
#[test]
fn the_model_is_loaded_only_when_a_statement_needs_it() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    aisql()
        .args(["model", "tiny", "--out"])
        .arg(&model)
        .assert()
        .success();
    let weights = model.join("model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &bytes[..bytes.len() / 2]).unwrap();
    let docs = tmp.path().join("docs.csv");
    std::fs::write(&docs, "id,body\n1,a fine film\n2,a dull film\n").unwrap();
    let table = format!("docs={}", docs.display());
    let sql = |statement: &str| {
        let mut c = aisql();
        c.args([
            "sql",
            statement,
            "--table",
            &table,
            "--progress",
            "off",
            "--model",
        ])
        .arg(&model);
        c
    };
    sql("SELECT 1 AS one")
        .assert()
        .success()
        .stdout(predicate::str::contains("one"));
    sql("SELECT count(*) AS n, ai_count_tokens('a fine film') AS tokens FROM docs")
        .assert()
        .success()
        .stdout(predicate::str::contains("| 2 "));
    sql("SELECT id FROM docs WHERE ai_filter('Is {0} positive?', body)")
        .assert()
        .failure()
        .stderr(predicate::str::contains("model.safetensors"));
    // A model that is not there at all is an error at once, not at the
    // first AI statement.
    let mut missing = aisql();
    missing
        .args(["sql", "SELECT 1", "--table", &table, "--model"])
        .arg(tmp.path().join("nowhere"))
        .assert()
        .failure()
        .stderr(predicate::str::contains("nowhere"));
}

/// csv and json rows are printed as they come: a result larger than
/// `--memory-limit` reaches the pipe whole, where the table format (which
/// keeps the rows to lay them out) fails naming the result's rows; the text
/// is the same as a kept result's.
#[test]
fn csv_and_json_rows_are_printed_as_they_come() {
    let tmp = tempfile::tempdir().unwrap();
    let docs = tmp.path().join("docs.csv");
    let mut text = String::from("id,body\n");
    for i in 0..20_000 {
        text.push_str(&format!(
            "{i},review {i} {}\n",
            "plot actor scene ".repeat(14)
        ));
    }
    std::fs::write(&docs, text).unwrap();
    let table = format!("docs={}", docs.display());
    let sql = |statement: &str, extra: &[&str]| {
        let mut c = aisql();
        c.args(["sql", statement, "--table", &table, "--progress", "off"])
            .args(["--backend", "model", "--model", "tiny"])
            .args(extra);
        c
    };
    // About 250 bytes a body, 60 times over: 300 MB under a 128M limit.
    let big = "SELECT id, repeat(body, 60) AS body FROM docs";
    let limit = ["--memory-limit", "128M"];
    let out = sql(big, &[&limit[..], &["--format", "csv"]].concat())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("id,body"));
    let (mut rows, mut bytes) = (0u64, 0u64);
    for line in lines {
        let (_, body) = line.split_once(',').expect("id,body");
        rows += 1;
        bytes += body.len() as u64;
    }
    assert_eq!(rows, 20_000);
    assert!(bytes > 250_000_000, "{bytes} bytes");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("20000 rows in"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let kept = sql(big, &[&limit[..], &["--format", "table"]].concat())
        .output()
        .unwrap();
    assert!(!kept.status.success());
    assert!(String::from_utf8_lossy(&kept.stderr).contains("query result rows"));

    // The same text as a result printed from kept rows (--output keeps them).
    let small = "SELECT id, body FROM docs WHERE id < 3 ORDER BY id";
    let saved = tmp.path().join("small.json");
    sql(
        small,
        &["--format", "json", "--output", saved.to_str().unwrap()],
    )
    .assert()
    .success();
    let streamed = sql(small, &["--format", "json"]).output().unwrap();
    let streamed: serde_json::Value = serde_json::from_slice(&streamed.stdout).unwrap();
    let kept: serde_json::Value = serde_json::from_slice(&std::fs::read(&saved).unwrap()).unwrap();
    assert_eq!(streamed, kept);
    assert_eq!(streamed.as_array().unwrap().len(), 3);
    sql("SELECT id FROM docs WHERE id < 0", &["--format", "json"])
        .assert()
        .success()
        .stdout("[]\n");
    sql("SELECT id FROM docs WHERE id < 0", &["--format", "csv"])
        .assert()
        .success()
        .stdout("id\n");
}
