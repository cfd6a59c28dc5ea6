//! `aisql serve` with clients nobody here wrote: `psql` (PostgreSQL's own
//! client) and `psycopg` (PyPI): catalog look-ups, plain and AI queries,
//! EXPLAIN ANALYZE, parameters, concurrent connections, passwords, cancel
//! requests and the read-only rule.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use assert_cmd::cargo::CommandCargoExt;

/// A running `aisql serve`, stopped when dropped.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    /// Starts `aisql serve --listen 127.0.0.1:0 ARGS` and waits for its
    /// `listening on` line.
    fn start(args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut child = Command::cargo_bin("aisql")
            .unwrap()
            .args(["serve", "--listen", "127.0.0.1:0", "--progress", "off"])
            .args(args)
            .env_remove("AISQL_PASSWORD")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .strip_prefix("listening on ")
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("no listening line, got {line:?}"));
        let port = addr.rsplit(':').next().unwrap().parse().unwrap();
        Server { child, port }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A CSV of `rows` distinct documents (`id`, `body`), each body `words`
/// words long.
fn docs_csv(dir: &Path, rows: usize, words: usize) -> PathBuf {
    let path = dir.join(format!("docs_{rows}.csv"));
    let mut text = String::from("id,body\n");
    let vocabulary = [
        "good", "bad", "film", "plot", "great", "boring", "actor", "scene",
    ];
    for i in 0..rows {
        let body: Vec<&str> = (0..words)
            .map(|w| vocabulary[common::draw(&[&i.to_string(), &w.to_string()]) as usize % 8])
            .collect();
        text.push_str(&format!("{i},review {i}: {}\n", body.join(" ")));
    }
    std::fs::write(&path, text).unwrap();
    path
}

/// `psql -c SQL` against `server` (unaligned, tuples only unless `headers`).
fn psql(server: &Server, sql: &str, password: Option<&str>) -> std::process::Output {
    let mut cmd = Command::new("psql");
    cmd.args(["-X", "-h", "127.0.0.1", "-p", &server.port.to_string()])
        .args([
            "-U",
            "someone",
            "-d",
            "anything",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
        ])
        .args(["-c", sql])
        .env_remove("PGPASSWORD")
        .env("PGCONNECT_TIMEOUT", "20");
    if let Some(password) = password {
        cmd.env("PGPASSWORD", password);
    }
    cmd.output()
        .expect("psql (Debian: apt-get install postgresql-client)")
}

fn stdout(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// The rows `aisql sql --format json` prints for `sql` over `table`.
fn sql_json(table: &str, sql: &str) -> Vec<serde_json::Value> {
    let out = Command::cargo_bin("aisql")
        .unwrap()
        .args([
            "sql", sql, "--table", table, "--model", "tiny", "--format", "json",
        ])
        .args(["--progress", "off"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

const AI_QUERY: &str =
    "SELECT id FROM docs WHERE ai_filter('Is the review {0} positive?', body) ORDER BY id";

#[test]
fn psql_reads_the_catalog_and_runs_plain_ai_and_explain_analyze() {
    let dir = tempfile::tempdir().unwrap();
    let docs = docs_csv(dir.path(), 40, 12);
    let table = format!("docs={}", docs.display());
    let server = Server::start(&["--table", &table, "--model", "tiny"], &[]);

    let tables = stdout(&psql(&server, "\\d", None));
    assert!(tables.contains("docs"), "\\d lists the table: {tables}");
    let columns = stdout(&psql(&server, "\\d docs", None));
    assert!(
        columns.contains("id") && columns.contains("body"),
        "{columns}"
    );

    let plain = stdout(&psql(&server, "SELECT count(*), max(id) FROM docs", None));
    assert_eq!(plain.trim(), "40|39");

    // The same rows `aisql sql` gives for the same statement and model.
    let served: Vec<i64> = stdout(&psql(&server, AI_QUERY, None))
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    let expected: Vec<i64> = sql_json(&table, AI_QUERY)
        .iter()
        .map(|row| row["id"].as_i64().unwrap())
        .collect();
    assert_eq!(served, expected);
    assert!(
        !served.is_empty() && served.len() < 40,
        "a real filter: {served:?}"
    );

    let analyzed = stdout(&psql(&server, &format!("EXPLAIN ANALYZE {AI_QUERY}"), None));
    assert!(analyzed.contains("AiExec: filter"), "{analyzed}");
    assert!(analyzed.contains("fresh_tokens"), "{analyzed}");

    // Read-only: no file is written, no setting of the engine changes.
    let target = dir.path().join("copy.csv");
    let copy = psql(
        &server,
        &format!("COPY (SELECT * FROM docs) TO '{}'", target.display()),
        None,
    );
    assert!(!copy.status.success());
    assert!(!target.exists());
    let set = psql(&server, "SET datafusion.execution.batch_size = 1", None);
    assert!(!set.status.success());
    assert!(
        String::from_utf8_lossy(&set.stderr).contains("read-only"),
        "{}",
        String::from_utf8_lossy(&set.stderr)
    );
    let create = psql(
        &server,
        &format!(
            "CREATE EXTERNAL TABLE t STORED AS CSV LOCATION '{}'",
            docs.display()
        ),
        None,
    );
    assert!(!create.status.success());
}

#[test]
fn psql_needs_the_password_when_one_is_set() {
    let dir = tempfile::tempdir().unwrap();
    let docs = docs_csv(dir.path(), 5, 4);
    let table = format!("docs={}", docs.display());
    let server = Server::start(
        &["--table", &table, "--backend", "model", "--model", "tiny"],
        &[("AISQL_PASSWORD", "correct horse")],
    );
    let refused = psql(&server, "SELECT 1", Some("wrong"));
    assert!(!refused.status.success());
    let answered = stdout(&psql(
        &server,
        "SELECT count(*) FROM docs",
        Some("correct horse"),
    ));
    assert_eq!(answered.trim(), "5");
}

#[test]
fn psycopg_parameters_concurrent_connections_passwords_and_cancel() {
    let python = common::test_python("psycopg", "psycopg 3.3.9");
    let dir = tempfile::tempdir().unwrap();
    let small = docs_csv(dir.path(), 40, 12);
    // Long enough that a cancel arrives while the model is busy.
    let long = docs_csv(dir.path(), 6000, 120);
    let password = dir.path().join("password");
    std::fs::write(&password, "s3cret\n").unwrap();
    let server = Server::start(
        &[
            "--table",
            &format!("docs={}", small.display()),
            "--table",
            &format!("long_docs={}", long.display()),
            "--model",
            "tiny",
            "--password-file",
            password.to_str().unwrap(),
        ],
        &[],
    );
    let expected = sql_json(&format!("docs={}", small.display()), AI_QUERY);
    let expected: Vec<i64> = expected.iter().map(|r| r["id"].as_i64().unwrap()).collect();
    let script = dir.path().join("clients.py");
    std::fs::write(&script, PSYCOPG_CLIENTS).unwrap();
    let out = Command::new(python)
        .arg(&script)
        .arg(server.port.to_string())
        .arg(serde_json::to_string(&expected).unwrap())
        .output()
        .unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("all checks passed"), "{text}");
    eprintln!("{text}");
}

/// The psycopg side: argv = port, expected ids of AI_QUERY.
const PSYCOPG_CLIENTS: &str = r#"
import json, sys, threading, time
import psycopg

port = int(sys.argv[1])
expected = json.loads(sys.argv[2])
dsn = f"host=127.0.0.1 port={port} user=anyone dbname=whatever password=s3cret connect_timeout=20"

# A wrong password is refused.
try:
    psycopg.connect(dsn.replace("s3cret", "wrong"))
    raise SystemExit("a wrong password was accepted")
except psycopg.OperationalError as e:
    print("wrong password refused:", str(e).strip().splitlines()[-1])

# Parameters, from 4 connections at once: each gets its own rows.
results, errors = {}, []
def client(k):
    try:
        with psycopg.connect(dsn) as con:
            for i in range(3):
                wanted = k * 10 + i
                rows = con.execute("SELECT id, body FROM docs WHERE id = %s", (wanted,)).fetchall()
                assert [r[0] for r in rows] == [wanted], (k, wanted, rows)
            ids = [r[0] for r in con.execute(
                "SELECT id FROM docs WHERE ai_filter('Is the review {0} positive?', body) AND id >= %s ORDER BY id",
                (0,)).fetchall()]
            results[k] = ids
    except Exception as e:
        errors.append(f"client {k}: {e!r}")
threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
for t in threads: t.start()
for t in threads: t.join()
assert not errors, errors
for k in range(4):
    assert results[k] == expected, (k, results[k], expected)
print("4 connections: parameters and AI rows correct")

# A cancel during a long AI query stops it; the connection stays usable.
with psycopg.connect(dsn) as con:
    def cancel_later():
        time.sleep(3)
        global cancelled_at
        cancelled_at = time.monotonic()
        con.cancel()
    threading.Thread(target=cancel_later).start()
    started = time.monotonic()
    try:
        con.execute("SELECT count(*) FROM long_docs WHERE ai_filter('Is the review {0} positive?', body)").fetchall()
        raise SystemExit("the long query was not cancelled")
    except psycopg.errors.QueryCanceled:
        stopped = time.monotonic() - cancelled_at
        print(f"cancelled: error {stopped:.2f} s after the cancel request")
    con.rollback()
    assert con.execute("SELECT count(*) FROM docs").fetchone()[0] == 40
    again = [r[0] for r in con.execute(
        "SELECT id FROM docs WHERE ai_filter('Is the review {0} positive?', body) ORDER BY id").fetchall()]
    assert again == expected, again
    print(f"after the cancel: the next AI query answered in {time.monotonic() - cancelled_at:.2f} s")
print("all checks passed")
"#;

#[test]
fn tls_is_served_when_asked_and_a_network_address_needs_a_password() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let made = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", "/CN=localhost", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl (Debian: apt-get install openssl)");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let docs = docs_csv(dir.path(), 5, 4);
    let table = format!("docs={}", docs.display());
    let server = Server::start(
        &[
            "--table",
            &table,
            "--backend",
            "model",
            "--model",
            "tiny",
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
        &[],
    );
    let out = Command::new("psql")
        .arg(format!(
            "host=127.0.0.1 port={} user=u dbname=d sslmode=require",
            server.port
        ))
        .args(["-X", "-c", "\\conninfo", "-c", "SELECT count(*) FROM docs"])
        .output()
        .unwrap();
    let text = stdout(&out);
    assert!(text.contains("SSL connection"), "{text}");

    for (listen, wanted) in [
        ("0.0.0.0:0", "needs a password"),
        ("0.0.0.0:0", "needs TLS"),
    ] {
        let mut cmd = Command::cargo_bin("aisql").unwrap();
        cmd.args(["serve", "--listen", listen, "--table", &table]);
        if wanted == "needs TLS" {
            cmd.env("AISQL_PASSWORD", "pw");
        } else {
            cmd.env_remove("AISQL_PASSWORD");
        }
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(wanted) && err.contains("0.0.0.0"), "{err}");
    }
}

#[test]
fn a_flag_for_one_statement_is_a_usage_error() {
    let out = Command::cargo_bin("aisql")
        .unwrap()
        .args(["serve", "--estimate", "--table", "t=nowhere.csv"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--estimate"));
}
