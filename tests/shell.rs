//! The SQL shell (`aisql sql` with no statement on a terminal) driven under a
//! pseudo-terminal as a user types: statements over several lines, the
//! backslash commands, Ctrl-C stopping a running statement and clearing the
//! prompt, `\q`, the history file; and without a terminal, the usage error.

mod common;

use std::path::{Path, PathBuf};

use common::cli::{aisql, aisql_process, mkfifo};
use predicates::prelude::*;
use rexpect::process::WaitStatus;
use rexpect::session::{Options, PtySession, spawn_with_options};

/// Longest wait for any expected output: the debug build loads the model and
/// plans in well under this.
const WAIT_MS: u64 = 60_000;

/// A `docs` table of `rows` rows (id, name, body) in `dir`, as `NAME=PATH`.
fn docs(dir: &Path, rows: usize) -> String {
    let names = ["alpha", "beta", "gamma"];
    let mut csv = String::from("id,name,body\n");
    for i in 1..=rows {
        csv.push_str(&format!(
            "{i},{},\"Review {i}: the food was fine, the service slow; we would come back.\"\n",
            names[(i - 1) % names.len()]
        ));
    }
    let path = dir.join("docs.csv");
    std::fs::write(&path, csv).unwrap();
    format!("docs={}", path.display())
}

/// The shell over `--table docs=...` with the tiny model, aisql's cache
/// (where its history goes) in `cache`.
fn shell(cache: &Path, table: &str, extra: &[&str]) -> PtySession {
    shell_said(cache, table, extra).0
}

/// [`shell`], and what it printed before its first prompt.
fn shell_said(cache: &Path, table: &str, extra: &[&str]) -> (PtySession, String) {
    let mut c = aisql_process();
    c.env("AISQL_CACHE_DIR", cache)
        .env("TERM", "xterm")
        .args([
            "sql",
            "--table",
            table,
            "--model",
            "tiny",
            "--progress",
            "off",
        ])
        .args(extra);
    let options = Options::new()
        .timeout_ms(Some(WAIT_MS))
        .strip_ansi_escape_codes(true);
    let mut p = spawn_with_options(c, options).unwrap();
    let said = p.exp_string("aisql> ").unwrap();
    (p, said)
}

/// Sends `bytes` to the shell as typed, whatever they are.
fn type_bytes(p: &PtySession, bytes: &[u8]) {
    use std::io::Write;
    let mut pty = p.process().get_file_handle().unwrap();
    pty.write_all(bytes).unwrap();
    pty.flush().unwrap();
}

/// Types `line` and Enter at a prompt.
fn type_line(p: &mut PtySession, line: &str) {
    p.send(line).unwrap();
    p.send("\r").unwrap();
    p.flush().unwrap();
}

/// `\q`: the shell ends with exit code 0.
fn quit(mut p: PtySession) {
    type_line(&mut p, "\\q");
    p.exp_eof().unwrap();
    assert!(
        matches!(p.process().wait().unwrap(), WaitStatus::Exited(_, 0)),
        "the shell did not exit 0"
    );
}

#[test]
fn statements_and_commands_run_at_the_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let table = docs(dir.path(), 3);
    let mut p = shell(&cache, &table, &[]);

    // A statement over three lines runs at its `;`, the `;` in a string
    // not ending it.
    type_line(&mut p, "SELECT id, upper(name) AS big,");
    p.exp_string("...> ").unwrap();
    type_line(&mut p, "  'x;y' AS s FROM docs");
    p.exp_string("...> ").unwrap();
    type_line(&mut p, "WHERE id <= 2 ORDER BY id;");
    p.exp_regex(r"\| 1 +\| ALPHA +\| x;y +\|").unwrap();
    p.exp_regex(r"\| 2 +\| BETA +\| x;y +\|").unwrap();
    p.exp_string("2 rows in").unwrap();
    p.exp_string("aisql> ").unwrap();

    // \d lists the --table; \d NAME gives its columns and types.
    type_line(&mut p, "\\d");
    p.exp_regex(r"\| docs +\| BASE TABLE +\|").unwrap();
    p.exp_string("aisql> ").unwrap();
    type_line(&mut p, "\\d docs");
    p.exp_regex(r"\| id +\| Int64 +\|").unwrap();
    p.exp_regex(r"\| name +\| Utf8").unwrap();
    p.exp_regex(r"\| body +\| Utf8").unwrap();
    p.exp_string("aisql> ").unwrap();
    type_line(&mut p, "\\d nowhere");
    p.exp_string("no table or view named nowhere").unwrap();

    // \format csv changes how the next result prints.
    type_line(&mut p, "\\format csv");
    p.exp_string("format: csv").unwrap();
    type_line(&mut p, "SELECT id, name FROM docs ORDER BY id LIMIT 2;");
    p.exp_regex(r"id,name\r?\n1,alpha\r?\n2,beta\r?\n").unwrap();

    // \timing prints each statement's time.
    type_line(&mut p, "\\timing");
    p.exp_string("timing on").unwrap();
    type_line(&mut p, "SELECT 6 * 7 AS answer;");
    p.exp_regex(r"answer\r?\n42\r?\n").unwrap();
    p.exp_regex(r"Time: [0-9.]+ ms").unwrap();

    // Errors are printed and the shell goes on.
    type_line(&mut p, "SELEC 1;");
    p.exp_string("error: ").unwrap();
    type_line(&mut p, "\\nonsense");
    p.exp_string("unknown command \\nonsense").unwrap();
    type_line(&mut p, "\\format xml");
    p.exp_string("name table, csv or json").unwrap();

    // Ctrl-C at the prompt drops the statement being typed: what follows
    // is a statement of its own.
    p.exp_string("aisql> ").unwrap();
    type_line(&mut p, "SELECT 1 AS dropped,");
    p.exp_string("...> ").unwrap();
    p.send_control('c').unwrap();
    p.exp_string("aisql> ").unwrap();
    type_line(&mut p, "SELECT 'kept' AS k;");
    p.exp_regex(r"k\r?\nkept\r?\n").unwrap();
    p.exp_string("aisql> ").unwrap();

    // The model answers in the shell too.
    type_line(
        &mut p,
        "SELECT id, ai_filter('Is the review {0} kind?', body) IS NOT NULL AS answered \
         FROM docs ORDER BY id;",
    );
    p.exp_regex(r"id,answered\r?\n1,true\r?\n2,true\r?\n3,true\r?\n")
        .unwrap();
    p.exp_string("AI operators:").unwrap();
    quit(p);

    // The history keeps the statements, a multi-line one whole.
    let history = std::fs::read_to_string(cache.join("sql_history")).unwrap();
    assert!(history.contains("upper(name) AS big"), "{history}");
    assert!(history.contains("SELECT 6 * 7 AS answer;"), "{history}");
}

#[test]
fn ctrl_c_stops_the_running_statement_and_the_shell_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let table = docs(dir.path(), 200);
    let mut p = shell(&cache, &table, &["--format", "csv"]);
    // 200 generations of up to 4,000 tokens each: minutes of model work.
    type_line(
        &mut p,
        "SELECT id, ai_complete('Summarise the review {0}.', body, 4000) AS s FROM docs;",
    );
    // Ctrl-C reaches the statement once the line is read and the terminal
    // gives signals again.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let sent = std::time::Instant::now();
    p.send_control('c').unwrap();
    p.exp_string("cancelled").unwrap();
    let stopped = sent.elapsed();
    p.exp_string("aisql> ").unwrap();
    // The model is free again: plain SQL and another AI call answer.
    type_line(&mut p, "SELECT 42 AS answer;");
    p.exp_regex(r"answer\r?\n42\r?\n").unwrap();
    p.exp_string("aisql> ").unwrap();
    type_line(
        &mut p,
        "SELECT id, ai_complete('Say {0}', name, 1) IS NULL AS missing FROM docs WHERE id = 1;",
    );
    p.exp_regex(r"id,missing\r?\n1,false\r?\n").unwrap();
    quit(p);
    assert!(
        stopped < std::time::Duration::from_secs(30),
        "the statement took {stopped:?} to stop"
    );
}

/// A history file that is not a regular file (a folder, a FIFO, a link to
/// `/dev/full`, whose reading never ends) is neither read nor written: one
/// warning, then the shell runs and Ctrl-D quits it as always.
#[test]
fn ctrl_d_quits_and_an_unusable_history_is_only_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let history = cache.join("sql_history");
    let table = docs(dir.path(), 3);
    std::fs::create_dir_all(&cache).unwrap();
    mkfifo(&dir.path().join("fifo"));
    let cases: [(&str, &dyn Fn()); 3] = [
        ("a folder", &|| std::fs::create_dir_all(&history).unwrap()),
        ("a FIFO", &|| {
            std::fs::rename(dir.path().join("fifo"), &history).unwrap()
        }),
        ("a link to /dev/full", &|| {
            std::os::unix::fs::symlink("/dev/full", &history).unwrap()
        }),
    ];
    for (what, make) in cases {
        make();
        let (mut p, said) = shell_said(&cache, &table, &[]);
        assert!(
            said.contains("cannot be used") && said.contains("statements are not saved"),
            "{what}: {said}"
        );
        type_line(&mut p, "SELECT 1 AS one;");
        p.exp_string("1 row in").unwrap();
        p.exp_string("aisql> ").unwrap();
        p.send_control('d').unwrap();
        let rest = p.exp_eof().unwrap();
        assert!(!rest.contains("warning"), "{what}: warned again: {rest}");
        assert!(
            matches!(p.process().wait().unwrap(), WaitStatus::Exited(_, 0)),
            "{what}: the shell did not exit 0"
        );
        let kind = std::fs::symlink_metadata(&history).unwrap().file_type();
        assert!(!kind.is_file(), "{what}: replaced by a file");
        if kind.is_dir() {
            std::fs::remove_dir(&history).unwrap();
        } else {
            std::fs::remove_file(&history).unwrap();
        }
    }
}

/// A line that is not UTF-8 is an error for that line (and the statement it
/// was part of); the shell goes on.
#[test]
fn a_line_that_is_not_utf8_is_an_error_and_the_shell_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let table = docs(dir.path(), 3);
    let mut p = shell(&cache, &table, &["--format", "csv"]);
    type_line(&mut p, "SELECT 1 AS lost,");
    p.exp_string("...> ").unwrap();
    type_bytes(&p, b"2 AS \xff\xfe bad;\r");
    p.exp_string("not valid UTF-8").unwrap();
    p.exp_string("aisql> ").unwrap();
    type_line(&mut p, "SELECT 'still here' AS s;");
    p.exp_regex(r"s\r?\nstill here\r?\n").unwrap();
    quit(p);
}

/// The flags that only one statement takes are usage errors naming the flag
/// when the shell would open, before any model loads.
#[test]
fn one_statement_flags_are_refused_by_the_shell() {
    let dir = tempfile::tempdir().unwrap();
    let table = docs(dir.path(), 3);
    let out: PathBuf = dir.path().join("rows.csv");
    let out = out.to_str().unwrap();
    for flags in [
        vec!["--output", out],
        vec!["--to-substrait", out],
        vec!["--estimate"],
        vec!["--selectivity", "kind=0.5"],
    ] {
        let mut c = aisql_process();
        c.env("AISQL_CACHE_DIR", dir.path().join("cache"))
            .args(["sql", "--table", &table])
            .args(&flags);
        let mut p = spawn_with_options(c, Options::new().timeout_ms(Some(WAIT_MS))).unwrap();
        let said = p.exp_eof().unwrap();
        assert!(
            said.contains(flags[0]) && said.contains("applies to one statement"),
            "{flags:?}: {said}"
        );
        assert!(
            matches!(p.process().wait().unwrap(), WaitStatus::Exited(_, 2)),
            "{flags:?}: not a usage error"
        );
    }
}

#[test]
fn without_a_terminal_a_statement_is_required() {
    let dir = tempfile::tempdir().unwrap();
    let table = docs(dir.path(), 3);
    aisql()
        .args(["sql", "--table", &table])
        .write_stdin("SELECT 1;\n")
        .assert()
        .code(2)
        .stderr(predicate::str::contains("give a SQL statement or -f FILE"));
}
