//! Many statements on one engine (`aisql::connect`, the connection that
//! `aisql serve`, the shell and Python share), on the tiny model:
//! - a document's KV outlives the query that computed it: a second question
//!   over the same documents computes little more than its question, and its
//!   answers are those of a connection that keeps nothing;
//! - sessions run their AI statements at once, each getting the rows it
//!   would get alone, the documents' KV computed once for all of them;
//! - a statement without AI calls runs while an AI statement of another
//!   session is still running.

use std::path::Path;
use std::sync::Arc;

use aisql::EngineConfig;
use datafusion::arrow::util::pretty::pretty_format_batches;

/// `n` reviews of 120 words, each different: about ten times as long as a
/// question, as the reviews of IMDB are (a second question can save no more
/// than the documents' share of the first one's tokens).
fn reviews(dir: &Path, n: usize) -> std::path::PathBuf {
    let words = [
        "good", "bad", "film", "plot", "great", "boring", "actor", "scene",
    ];
    let mut text = String::from("id,body\n");
    for i in 0..n {
        let body: Vec<&str> = (0..120)
            .map(|w| words[(i * 7 + w * w * 3 + i / 5) % 8])
            .collect();
        text.push_str(&format!("{i},review {i}: {}\n", body.join(" ")));
    }
    let path = dir.join("reviews.csv");
    std::fs::write(&path, text).unwrap();
    path
}

fn config(table: &Path, keep_kv: bool) -> EngineConfig {
    let mut config = EngineConfig::default();
    config.tables.tables = vec![("docs".into(), table.to_path_buf())];
    config.tables.default_dataset = false;
    config.query.keep_kv = Some(keep_kv);
    config
}

const QUESTIONS: [&str; 4] = [
    "Is the review {0} positive?",
    "Does the review {0} mention the plot?",
    "Is the reviewer of {0} angry?",
    "Would the author of {0} watch it again?",
];

fn statement(question: &str) -> String {
    format!("SELECT id, ai_filter('{question}', body) AS yes FROM docs ORDER BY id")
}

/// (rows as text, fresh tokens) of `sql` on a session of `connection`.
async fn run(connection: &aisql::Connection, sql: &str) -> (String, u64) {
    let session = connection.new_session().await.unwrap();
    let out = connection.run(&session, sql).await.unwrap();
    let rows = pretty_format_batches(&out.batches).unwrap().to_string();
    let fresh = out.measurements.fresh_tokens.map_or(0, |f| f.0);
    (rows, fresh)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_later_question_reuses_the_documents_kv_and_answers_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let table = reviews(dir.path(), 120);
    let keeping = aisql::connect(&config(&table, true)).await.unwrap();
    let (_, first) = run(&keeping, &statement(QUESTIONS[0])).await;
    let (rows, second) = run(&keeping, &statement(QUESTIONS[1])).await;
    eprintln!("fresh tokens: first question {first}, second {second}");
    assert!(
        second * 100 <= first * 15,
        "the second question computed {second} fresh tokens, the first {first}"
    );
    let alone = aisql::connect(&config(&table, false)).await.unwrap();
    let (want, second_alone) = run(&alone, &statement(QUESTIONS[1])).await;
    assert_eq!(rows, want);
    assert!(second_alone > first * 9 / 10, "{second_alone} vs {first}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sessions_at_once_get_their_own_rows_and_share_the_documents_kv() {
    let dir = tempfile::tempdir().unwrap();
    let table = reviews(dir.path(), 120);
    // Each question alone, on a connection that keeps nothing.
    let mut alone = Vec::new();
    for q in QUESTIONS {
        let connection = aisql::connect(&config(&table, false)).await.unwrap();
        alone.push(run(&connection, &statement(q)).await);
    }
    let shared = Arc::new(aisql::connect(&config(&table, true)).await.unwrap());
    let tasks: Vec<_> = QUESTIONS
        .iter()
        .map(|q| {
            let shared = shared.clone();
            let sql = statement(q);
            tokio::spawn(async move { run(&shared, &sql).await })
        })
        .collect();
    let mut together = 0;
    for (task, (want, _)) in tasks.into_iter().zip(&alone) {
        let (rows, fresh) = task.await.unwrap();
        assert_eq!(&rows, want);
        together += fresh;
    }
    let one = alone[0].1;
    eprintln!("fresh tokens: four sessions at once {together}, one question alone {one}");
    assert!(
        together * 10 <= one * 13,
        "{together} fresh tokens for four, {one} for one"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plain_sql_runs_while_another_session_asks_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let table = reviews(dir.path(), 2000);
    let connection = Arc::new(aisql::connect(&config(&table, true)).await.unwrap());
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let ai = {
        let connection = connection.clone();
        tokio::spawn(async move {
            let session = connection.new_session().await.unwrap();
            started_tx.send(()).unwrap();
            let sql =
                "SELECT count(*) FROM docs WHERE ai_filter('Is the review {0} positive?', body)";
            connection.run(&session, sql).await.unwrap();
        })
    };
    started_rx.await.unwrap();
    // Let the AI statement reach the model.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let (rows, _) = run(&connection, "SELECT count(*) AS n FROM docs").await;
    assert!(rows.contains("2000"), "{rows}");
    assert!(
        !ai.is_finished(),
        "the AI statement ended before the plain one could show it did not wait"
    );
    ai.await.unwrap();
}
