//! The heap bound of `--memory-limit` holds where the pool alone did not:
//! twenty chained AI self-joins whose answers are all TRUE, each join's
//! partner side the growing chain before it. The pool was charged for a
//! partner side only once it was all in memory, and nothing between two
//! reservations checked the heap: at a 2 GB limit such a plan reached 7 GB.
//! This test binary counts its heap with aisql's own metered allocator, as
//! the `aisql` binary does, so the bound is measured on the heap itself.

use std::sync::Arc;
use std::time::Duration;

use aisql_engine::inference::backend::{AiCall, AiRequest, Answer, Answerer};
use aisql_engine::limits::alloc_meter::{self, MeteredAlloc};
use aisql_engine::sql::options::QueryOptions;
use aisql_engine::sql::{Evaluation, SqlSession};

#[global_allocator]
static ALLOC: MeteredAlloc = MeteredAlloc::new();

/// Says TRUE to every question: every pair of a join matches.
struct AllTrue;

impl Answerer for AllTrue {
    fn name(&self) -> &str {
        "all-true"
    }

    fn answer(
        &self,
        _call: &AiCall,
        requests: &[AiRequest<'_>],
    ) -> aisql_engine::Result<Vec<Answer>> {
        Ok(vec![Answer::Bool(true); requests.len()])
    }
}

/// `SELECT count(*)` over `n` chained self-joins of `evidence`, each join's
/// `{0}` the new table's text, so that the chain so far is its partner side.
fn chained_ai_self_joins(n: usize) -> String {
    let mut sql = String::from("SELECT count(*) FROM evidence e1");
    for i in 2..=n {
        sql.push_str(&format!(
            " JOIN evidence e{i} ON ai_join('Does {{0}} support {{1}}?', e{i}.text, e{}.text)",
            i - 1
        ));
    }
    sql
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chained_ai_joins_that_all_match_fail_within_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("evidence.csv");
    let mut csv = String::from("id,text\n");
    for i in 0..40 {
        let text: String = (0..200)
            .map(|j| (b'a' + ((i * 7 + j) % 26) as u8) as char)
            .collect();
        csv.push_str(&format!("ev{i},{text}\n"));
    }
    std::fs::write(&table, csv).unwrap();
    let sql = chained_ai_self_joins(20);
    for limit in [256usize << 20, 1 << 30] {
        let options = QueryOptions {
            memory_limit: limit,
            ..QueryOptions::default()
        };
        let session = SqlSession::new(Arc::new(AllTrue), options, Evaluation::Operators).unwrap();
        session.register("evidence", &table).await.unwrap();
        aisql_engine::limits::host_memory::release_free_memory();
        let baseline = alloc_meter::live_bytes();
        alloc_meter::reset_peak();
        let result = tokio::time::timeout(Duration::from_secs(300), session.run(&sql))
            .await
            .expect("the query neither finished nor failed in 300 s");
        let grown = alloc_meter::peak_live_bytes().saturating_sub(baseline);
        let e = result
            .expect_err("40^20 rows cannot be counted within the limit")
            .to_string();
        // The partner side passes the bound first, and is named.
        assert!(
            e.contains("Resources exhausted") && e.contains("(partner side of the AI join)"),
            "{e}"
        );
        eprintln!(
            "20 chained AI self-joins at a {} MiB limit: the heap grew {} MiB ({e})",
            limit >> 20,
            grown >> 20
        );
        assert!(
            grown <= limit + limit / 4,
            "the heap grew {} MiB at a {} MiB limit: over 1.25 x the limit",
            grown >> 20,
            limit >> 20
        );
    }
}
