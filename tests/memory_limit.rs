//! A query over `--memory-limit` fails with the pool's error, its peak near
//! the limit, also under an address-space cap (`prlimit --as`): never an
//! allocation-failure abort. Twenty chained self-joins once held 9 GB at a
//! 2 GB limit; `repeat('x', 2000000000)` and `unnest` of a huge series
//! aborted. The measured peaks are printed for the notes (`--nocapture`).

use std::path::Path;
use std::process::{Command, Output};

/// The largest resident set of any child this process has waited for, bytes.
fn children_peak_rss() -> u64 {
    // SAFETY: getrusage writes one rusage into the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) } == 0;
    assert!(ok, "getrusage failed");
    usage.ru_maxrss as u64 * 1024
}

/// `aisql ARGS`, under `prlimit --as=CAP` where prlimit is installed.
fn aisql_capped(address_space: u64, args: &[&str]) -> Output {
    let bin = assert_cmd::cargo::cargo_bin("aisql");
    let prlimit = Path::new("/usr/bin/prlimit");
    let mut command = if prlimit.exists() {
        let mut c = Command::new(prlimit);
        c.arg(format!("--as={address_space}")).arg(bin);
        c
    } else {
        Command::new(bin)
    };
    command.args(args).output().unwrap()
}

/// A table of 4,000 rows in 5 groups of 800, each with 200 bytes of text.
fn write_table(path: &Path) {
    let mut csv = String::from("id,k,body\n");
    for i in 0..4000 {
        let body: String = (0..200)
            .map(|j| (b'a' + ((i * 7 + j) % 26) as u8) as char)
            .collect();
        csv.push_str(&format!("{i},{},{body}\n", i % 5));
    }
    std::fs::write(path, csv).unwrap();
}

/// `t1 JOIN t2 ON t1.k = t2.k JOIN t3 ON t2.k = t3.k ...`, every body kept.
fn chained_self_joins(n: usize) -> String {
    let mut sql = String::from("SELECT max(length(concat(");
    let bodies: Vec<String> = (1..=n).map(|i| format!("t{i}.body")).collect();
    sql.push_str(&bodies.join(", "));
    sql.push_str("))) FROM t t1");
    for i in 2..=n {
        sql.push_str(&format!(" JOIN t t{i} ON t{}.k = t{i}.k", i - 1));
    }
    sql
}

/// Exit 1 with the bound's message: no abort, no panic.
fn assert_clean_refusal(what: &str, out: &Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{what}: {stderr}");
    for needle in needles {
        assert!(stderr.contains(needle), "{what}: no {needle:?} in {stderr}");
    }
    for bad in ["memory allocation of", "panicked", "stack backtrace"] {
        assert!(!stderr.contains(bad), "{what}: {stderr}");
    }
}

#[test]
fn queries_over_the_memory_limit_fail_cleanly_near_it() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t.csv");
    write_table(&table);
    let table_arg = format!("t={}", table.display());
    let cap = 8u64 << 30;

    let out = aisql_capped(
        cap,
        &["sql", "SELECT count(*) FROM t", "--table", &table_arg],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let baseline = children_peak_rss();
    eprintln!("baseline peak RSS: {} MiB", baseline >> 20);

    // A 1.9 GB value at a 2 GB limit was copied until the address space ran out.
    let repeat = "SELECT length(repeat('x', 2000000000))";
    let unnest = "SELECT count(*) FROM (SELECT unnest(generate_series(1, 400000000)))";
    for (sql, limit) in [(repeat, "1G"), (repeat, "2G"), (unnest, "1G")] {
        let out = aisql_capped(cap, &["sql", sql, "--memory-limit", limit]);
        assert_clean_refusal(sql, &out, &["--memory-limit"]);
    }
    let limit = 1u64 << 30;
    let sql = chained_self_joins(20);
    let out = aisql_capped(
        cap,
        &["sql", &sql, "--table", &table_arg, "--memory-limit", "1G"],
    );
    assert_clean_refusal("20 chained self-joins", &out, &["Resources exhausted"]);
    let peak = children_peak_rss();
    eprintln!(
        "20 chained self-joins at --memory-limit 1G: peak RSS {} MiB (baseline {} MiB)",
        peak >> 20,
        baseline >> 20
    );
    assert!(
        peak <= limit + limit / 4 + baseline,
        "peak RSS {} MiB over 1.25 x the limit plus the baseline",
        peak >> 20
    );
}
