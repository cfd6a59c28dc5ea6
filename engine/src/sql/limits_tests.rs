//! The limits of one statement, through [`SqlSession`]: integer overflow is an
//! error naming the type and values, a recursive CTE stops at its iteration
//! limit naming the CTE, and a statement nested past the parser's limit gets
//! an error saying so, quickly.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Evaluation, MAX_PARSE_NESTING, SqlSession, row_lines};
use crate::error::Result;
use crate::inference::backend::NoAnswers;
use crate::sql::options::QueryOptions;

/// Runs `sql` in a fresh session allowing `max_recursion` iterations, on a
/// thread with the deep stack the command line plans on; returns its rows.
fn run(sql: &str, max_recursion: usize) -> Result<Vec<String>> {
    let sql = sql.to_string();
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let session = SqlSession::new(
                    Arc::new(NoAnswers),
                    QueryOptions {
                        max_recursion,
                        ..Default::default()
                    },
                    Evaluation::Operators,
                )?;
                let out = session.run(&sql).await?;
                row_lines(&out.batches)
            })
        })
        .expect("thread")
        .join()
        .expect("no panic")
}

fn error(sql: &str) -> String {
    match run(sql, 100) {
        Ok(rows) => panic!("{sql} gave {rows:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn integer_overflow_is_an_error_naming_type_and_values() {
    for (sql, message) in [
        (
            "SELECT 9223372036854775807 + 1",
            "Int64 overflow in 9223372036854775807 + 1",
        ),
        (
            "SELECT -9223372036854775807 - 2",
            "Int64 overflow in (-9223372036854775807) - 2",
        ),
        (
            "SELECT 4611686018427387904 * 2",
            "Int64 overflow in 4611686018427387904 * 2",
        ),
        (
            "SELECT -(-9223372036854775807 - 1)",
            "Int64 overflow in -(-9223372036854775808)",
        ),
        (
            "SELECT CAST(2147483647 AS INT) + CAST(1 AS INT)",
            "Int32 overflow in 2147483647 + 1",
        ),
        (
            "SELECT CAST(0 AS INT UNSIGNED) - CAST(1 AS INT UNSIGNED)",
            "UInt32 overflow in 0 - 1",
        ),
        // Columns: the first row that overflows is named.
        (
            "SELECT x * 4611686018427387904 FROM (VALUES (1), (3), (5)) AS v(x)",
            "Int64 overflow in 3 * 4611686018427387904",
        ),
        (
            "SELECT count(*) FROM (VALUES (CAST(2147483600 AS INT))) AS v(x) WHERE x + CAST(100 AS INT) > 0",
            "Int32 overflow in 2147483600 + 100",
        ),
        // Through a subquery the optimizer folds into constants.
        (
            "SELECT n + 1 FROM (SELECT 9223372036854775807 AS n)",
            "Int64 overflow in 9223372036854775807 + 1",
        ),
    ] {
        let e = error(sql);
        assert!(e.contains(message), "{sql}: {e}");
    }
}

#[test]
fn arithmetic_in_range_is_unchanged() {
    assert_eq!(
        run(
            "SELECT 9223372036854775806 + 1, -9223372036854775807 - 1, 3 * -4, -(5), \
             CAST(2147483646 AS INT) + CAST(1 AS INT), 2147483647 + 1, 1.5 * 2, \
             CAST(NULL AS BIGINT) + 1",
            100
        )
        .unwrap(),
        [
            "9223372036854775807 | -9223372036854775808 | -12 | -5 | 2147483647 | 2147483648 | 3.0 | NULL"
        ]
    );
    // Columns keep the names the operators give them.
    let names = std::thread::spawn(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let session = SqlSession::new(
                Arc::new(NoAnswers),
                QueryOptions::default(),
                Evaluation::Operators,
            )
            .unwrap();
            let plan = session
                .plan("SELECT x + 1, x - 2 * x, -x FROM (VALUES (1)) AS v(x)")
                .await
                .unwrap();
            plan.schema()
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect::<Vec<_>>()
        })
    })
    .join()
    .unwrap();
    assert_eq!(names, ["v.x + Int64(1)", "v.x - Int64(2) * v.x", "(- v.x)"]);
}

#[test]
fn a_recursive_cte_stops_at_its_iteration_limit() {
    let endless = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) \
                   SELECT count(*) FROM r";
    let e = run(endless, 50).unwrap_err().to_string();
    assert!(
        e.contains("recursive CTE r passed --max-recursion 50 iterations"),
        "{e}"
    );
    // A recursion that ends within the limit runs whole, up to the limit itself.
    let bounded = |n: usize| {
        format!(
            "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < {n}) SELECT count(*) FROM r"
        )
    };
    assert_eq!(run(&bounded(40), 50).unwrap(), ["40"]);
    assert_eq!(run(&bounded(51), 50).unwrap(), ["51"]);
    assert!(run(&bounded(52), 50).is_err());
    // Each recursive CTE counts its own iterations.
    let two = "WITH RECURSIVE a(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM a WHERE n < 30), \
               b(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM b WHERE n < 40) \
               SELECT count(*) FROM a, b";
    assert_eq!(run(two, 40).unwrap(), ["1200"]);
}

#[test]
fn a_statement_nested_past_the_parser_limit_is_refused_quickly() {
    let limit = format!("({MAX_PARSE_NESTING}");
    for sql in [
        format!("SELECT {}1{}", "(".repeat(2000), ")".repeat(2000)),
        format!(
            "SELECT {}1{}",
            "CASE WHEN true THEN ".repeat(200),
            " END".repeat(200)
        ),
        format!("SELECT {}true", "NOT ".repeat(500)),
        format!(
            "SELECT {}true{}",
            "NOT (".repeat(MAX_PARSE_NESTING + 1),
            ")".repeat(MAX_PARSE_NESTING + 1)
        ),
    ] {
        let e = error(&sql);
        assert!(
            e.contains("nests") && e.contains("parser's recursion limit") && e.contains(&limit),
            "{e}"
        );
    }
    // Up to the limit, even the shapes sqlparser reads in exponential time
    // once its own recursion limit is near (NOT (NOT (...))) parse at once.
    let started = Instant::now();
    let depth = MAX_PARSE_NESTING;
    for sql in [
        format!("SELECT {}true{}", "NOT (".repeat(depth), ")".repeat(depth)),
        format!("SELECT {}1{}", "(".repeat(depth), ")".repeat(depth)),
        format!(
            "SELECT {}1{}",
            "CASE WHEN true THEN ".repeat(depth),
            " END".repeat(depth)
        ),
        format!("SELECT {}1{}", "abs(".repeat(depth), ")".repeat(depth)),
        format!("SELECT {}1", "- ".repeat(depth)),
    ] {
        let rows = run(&sql, 100).unwrap_or_else(|e| panic!("{}: {e}", &sql[..40]));
        assert_eq!(rows.len(), 1);
    }
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
}
