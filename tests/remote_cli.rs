//! `aisql worker` processes and `--workers` from the command line: two worker
//! processes on 127.0.0.1 answer a query with the rows of one process; one
//! killed mid-query fails it within seconds naming that worker, and the rerun
//! with the same `--answer-cache` (a fresh worker in its place) gives the same
//! rows asking only what was missing. An unreachable address, a worker serving
//! another model, and a non-loopback address from the environment are refused
//! by name. A worker with a token serves only coordinators that send it (from a
//! file or the environment), a TLS worker is reached at https:// with its CA,
//! and a worker on a network address refuses to start without token and TLS.
//! A worker stopped (SIGSTOP) before or during a query, its connection open,
//! fails the query within `--worker-timeout-s` naming it.

#![cfg(unix)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::cli::{aisql_process, stderr_of_success};
use common::server::{spawn_listening, stop};
use common::{cache_counts, log_bytes};

const QUERY: &str = "IMDB-1";

/// `aisql` with its cache folder (model files, identities) in `cache`.
fn aisql_with_cache(cache: &Path) -> Command {
    let mut c = aisql_process();
    c.env("AISQL_CACHE_DIR", cache);
    c
}

/// An `aisql worker` process on a free loopback port, killed when dropped.
struct Worker {
    child: Child,
    addr: String,
}

impl Worker {
    fn start(cache: &Path, extra: &[&str]) -> Self {
        let (child, _, addr) = spawn_listening(
            aisql_with_cache(cache)
                .args(["worker", "--listen", "127.0.0.1:0", "--cpu"])
                .args(extra)
                .stderr(Stdio::null()),
        );
        Self { child, addr }
    }

    /// Sends `signal` (`STOP`, `CONT`) to the worker process.
    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal}");
    }

    fn kill(&mut self) {
        stop(&mut self.child);
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill();
    }
}

struct Setup {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    cache: PathBuf,
    dir: PathBuf,
}

fn setup() -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("quailb");
    aisql_standin::generate(&root, 0.01).unwrap();
    Setup {
        root,
        cache: tmp.path().join("cache"),
        dir: tmp.path().to_path_buf(),
        _tmp: tmp,
    }
}

/// `aisql query IMDB-1` saving its rows to `rows`, on `workers` (else the CPU).
fn query(s: &Setup, rows: &Path, workers: Option<&[&Worker]>, answers: Option<&Path>) -> Command {
    let mut c = match workers {
        Some(w) => {
            let addrs: Vec<&str> = w.iter().map(|w| w.addr.as_str()).collect();
            query_at(s, rows, &addrs.join(","))
        }
        None => {
            let mut c = imdb_query(s, rows);
            c.arg("--cpu");
            c
        }
    };
    if let Some(dir) = answers {
        c.arg("--answer-cache").arg(dir);
    }
    c
}

/// `aisql query IMDB-1` saving its rows to `rows`, on the workers `addrs`
/// (comma-separated, as given to --workers).
fn query_at(s: &Setup, rows: &Path, addrs: &str) -> Command {
    let mut c = imdb_query(s, rows);
    c.args(["--workers", addrs]);
    c
}

/// `aisql query IMDB-1` over the test's root, saving its rows to `rows`.
fn imdb_query(s: &Setup, rows: &Path) -> Command {
    let mut c = aisql_with_cache(&s.cache);
    c.args(["query", QUERY, "--sf", "0.01", "--batch-rows", "8"])
        .arg("--root")
        .arg(&s.root)
        .arg("--output")
        .arg(rows)
        .stdout(Stdio::null());
    c
}

fn run(c: &mut Command) -> (bool, String) {
    let out = c.stderr(Stdio::piped()).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn two_worker_processes_answer_as_one_and_a_killed_one_is_named_and_made_up_for() {
    let s = setup();
    // One process (this also generates the tiny model the workers load).
    let want = s.dir.join("want.csv");
    stderr_of_success(&mut query(&s, &want, None, None));
    let want = std::fs::read_to_string(&want).unwrap();

    let a = Worker::start(&s.cache, &[]);
    let mut b = Worker::start(&s.cache, &[]);
    let got = s.dir.join("got.csv");
    let stderr = stderr_of_success(&mut query(&s, &got, Some(&[&a, &b]), None));
    assert_eq!(std::fs::read_to_string(&got).unwrap(), want);
    assert!(
        stderr.contains(&a.addr) && stderr.contains(&b.addr),
        "{stderr}"
    );

    // Worker b is killed once the query has answers on disk.
    let answers = s.dir.join("answers");
    let killed_rows = s.dir.join("killed.csv");
    let mut child = query(&s, &killed_rows, Some(&[&a, &b]), Some(&answers))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while log_bytes(&answers) == 0 {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the query ended ({status}) before a worker could be killed");
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no answer written"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    b.kill();
    let killed_at = Instant::now();
    let out = child.wait_with_output().unwrap();
    let failed_after = killed_at.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the query survived losing a worker");
    assert!(
        stderr.contains(&b.addr),
        "the error does not name {}: {stderr}",
        b.addr
    );
    assert!(
        failed_after < Duration::from_secs(20),
        "failed {failed_after:?} after the kill"
    );
    assert!(!killed_rows.exists(), "a failed query left rows behind");

    // A fresh worker in b's place; the cache makes up for what was answered.
    let c = Worker::start(&s.cache, &[]);
    let rerun = s.dir.join("rerun.csv");
    let stderr = stderr_of_success(&mut query(&s, &rerun, Some(&[&a, &c]), Some(&answers)));
    let (reused, asked) = cache_counts(&stderr);
    assert!(reused > 0 && asked > 0, "reused {reused}, asked {asked}");
    assert_eq!(std::fs::read_to_string(&rerun).unwrap(), want);
    eprintln!(
        "query failed {failed_after:?} after the kill; rerun: {reused} answers reused, {asked} asked"
    );
}

#[test]
fn a_stopped_worker_fails_the_query_within_the_timeout_naming_it() {
    const TIMEOUT_S: u64 = 5;
    // Keep-alive alone would take about 30 s: failing well before shows the
    // per-call timeout at work.
    const MARGIN: Duration = Duration::from_secs(12);
    let s = setup();
    // Generates the tiny model before the workers start.
    stderr_of_success(&mut query(&s, &s.dir.join("one.csv"), None, None));
    let timeout = TIMEOUT_S.to_string();
    let stopped_fails = |child: std::process::Child, stopped: &Worker, since: Instant| {
        let out = child.wait_with_output().unwrap();
        let failed_after = since.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains(&stopped.addr) && stderr.contains(&format!("within {TIMEOUT_S} s")),
            "the error does not name {} and the timeout: {stderr}",
            stopped.addr
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(
            failed_after < Duration::from_secs(TIMEOUT_S) + MARGIN,
            "failed {failed_after:?} after the stop"
        );
        failed_after
    };

    // Stopped mid-query, once answers come back.
    let a = Worker::start(&s.cache, &[]);
    let b = Worker::start(&s.cache, &[]);
    let answers = s.dir.join("answers");
    let rows = s.dir.join("stopped.csv");
    let mut child = query(&s, &rows, Some(&[&a, &b]), Some(&answers))
        .args(["--worker-timeout-s", &timeout])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while log_bytes(&answers) == 0 {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the query ended ({status}) before a worker could be stopped");
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no answer written"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    b.signal("STOP");
    let during = stopped_fails(child, &b, Instant::now());
    assert!(!rows.exists(), "a failed query left rows behind");
    b.signal("CONT");
    drop(b);

    // Stopped before the query: its hello goes unanswered.
    let c = Worker::start(&s.cache, &[]);
    c.signal("STOP");
    let since = Instant::now();
    let child = query(&s, &s.dir.join("never.csv"), Some(&[&a, &c]), None)
        .args(["--worker-timeout-s", &timeout])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let before = stopped_fails(child, &c, since);
    c.signal("CONT");
    eprintln!(
        "a stopped worker failed the query {during:?} after its stop (mid-query), {before:?} (before it)"
    );
}

#[test]
fn unreachable_mismatched_and_exposed_workers_are_refused_by_name() {
    let s = setup();
    // Generates the tiny model before the workers start.
    stderr_of_success(&mut query(&s, &s.dir.join("one.csv"), None, None));

    // Nobody listens on a port just closed.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let gone = closed.local_addr().unwrap().to_string();
    drop(closed);
    let started = Instant::now();
    let (ok, stderr) = run(aisql_with_cache(&s.cache)
        .args(["sql", "SELECT 1", "--sf", "0.01", "--workers", &gone])
        .arg("--root")
        .arg(&s.root));
    assert!(!ok);
    assert!(stderr.contains(&gone), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(30));

    // A worker of another model (other weights).
    let other = s.dir.join("other-tiny");
    stderr_of_success(
        aisql_with_cache(&s.cache)
            .args(["model", "tiny", "--seed", "7", "--out"])
            .arg(&other),
    );
    let a = Worker::start(&s.cache, &[]);
    let b = Worker::start(&s.cache, &["--model", other.to_str().unwrap()]);
    let rows = s.dir.join("mixed.csv");
    let (ok, stderr) = run(&mut query(&s, &rows, Some(&[&a, &b]), None));
    assert!(!ok);
    assert!(
        stderr.contains("worker 1") && stderr.contains(&b.addr),
        "{stderr}"
    );
    assert!(stderr.contains("same model and dtype"), "{stderr}");
    assert!(!rows.exists());

    // A non-loopback address that did not come from --listen.
    let out = aisql_with_cache(&s.cache)
        .args(["worker", "--cpu"])
        .env("AISQL_WORKER_LISTEN", "0.0.0.0:0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("not a loopback address") && stderr.contains("--listen"),
        "{stderr}"
    );
}

#[test]
fn token_and_tls_workers_serve_only_coordinators_that_have_them() {
    let s = setup();
    let want = s.dir.join("want.csv");
    stderr_of_success(&mut query(&s, &want, None, None));
    let want = std::fs::read_to_string(&want).unwrap();
    let token = s.dir.join("token");
    std::fs::write(&token, "s3cret-from-a-file\n").unwrap();
    let token_arg = token.to_str().unwrap();

    let w = Worker::start(&s.cache, &["--token-file", token_arg]);
    let rows = s.dir.join("rows.csv");
    let (ok, stderr) = run(&mut query_at(&s, &rows, &w.addr));
    assert!(!ok, "served without the token");
    assert!(
        stderr.contains("token") && stderr.contains(&w.addr),
        "{stderr}"
    );
    assert!(!rows.exists());
    stderr_of_success(query_at(&s, &rows, &w.addr).args(["--worker-token-file", token_arg]));
    assert_eq!(std::fs::read_to_string(&rows).unwrap(), want);
    let env_rows = s.dir.join("env.csv");
    stderr_of_success(
        query_at(&s, &env_rows, &w.addr).env("AISQL_WORKER_TOKEN", "s3cret-from-a-file"),
    );
    assert_eq!(std::fs::read_to_string(&env_rows).unwrap(), want);
    drop(w);

    // On loopback without a token a worker takes its owner's generated one,
    // in a file only the owner reads: the owner's coordinators find it, a
    // coordinator without it is refused.
    let w = Worker::start(&s.cache, &[]);
    let generated = s.cache.join("worker.token");
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&generated).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}");
    }
    let owner_rows = s.dir.join("owner.csv");
    stderr_of_success(&mut query_at(&s, &owner_rows, &w.addr));
    assert_eq!(std::fs::read_to_string(&owner_rows).unwrap(), want);
    let guess_rows = s.dir.join("guess.csv");
    let (ok, stderr) = run(query_at(&s, &guess_rows, &w.addr).env("AISQL_WORKER_TOKEN", "a-guess"));
    assert!(
        !ok,
        "a loopback worker served a coordinator without its token"
    );
    assert!(stderr.contains("token"), "{stderr}");
    drop(w);

    // TLS with the test CA's certificate for 127.0.0.1.
    let tls =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("engine/src/inference/distributed/testdata");
    let file = |name: &str| tls.join(name).to_str().unwrap().to_string();
    let (cert, key, ca) = (
        file("worker-cert.pem"),
        file("worker-key.pem"),
        file("ca.pem"),
    );
    let w = Worker::start(
        &s.cache,
        &[
            "--token-file",
            token_arg,
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
        ],
    );
    let https = format!("https://{}", w.addr);
    let tls_rows = s.dir.join("tls.csv");
    stderr_of_success(query_at(&s, &tls_rows, &https).args([
        "--worker-token-file",
        token_arg,
        "--tls-ca",
        &ca,
    ]));
    assert_eq!(std::fs::read_to_string(&tls_rows).unwrap(), want);
    let (ok, stderr) = run(
        query_at(&s, &s.dir.join("no-ca.csv"), &https).args(["--worker-token-file", token_arg])
    );
    assert!(!ok && stderr.contains("--tls-ca"), "{stderr}");
    drop(w);

    // A network address needs a token and TLS, or --insecure; a token file
    // must hold a token.
    let exposed = |extra: &[&str]| {
        let out = aisql_with_cache(&s.cache)
            .args(["worker", "--cpu", "--listen", "0.0.0.0:0"])
            .args(extra)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stderr) = exposed(&[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("a token") && stderr.contains("TLS") && stderr.contains("--insecure"),
        "{stderr}"
    );
    let (code, stderr) = exposed(&["--token-file", token_arg]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("needs TLS"), "{stderr}");
    let empty = s.dir.join("empty-token");
    std::fs::write(&empty, "\n").unwrap();
    let (code, stderr) = exposed(&["--token-file", empty.to_str().unwrap(), "--insecure"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("empty") && stderr.contains(empty.to_str().unwrap()),
        "{stderr}"
    );
}
