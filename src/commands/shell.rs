//! The SQL shell: `aisql sql` with no statement on a terminal. One
//! [`Connection`] (tables and model loaded once) answers statement after
//! statement, typed over as many lines as they need, with line editing and a
//! history kept in aisql's cache folder, and a few psql-like backslash
//! commands. Ctrl-C stops the running statement, not the shell.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use aisql_engine::{errln, outln};
use clap::ValueEnum;
use datafusion::arrow::array::RecordBatch;
use rustyline::error::ReadlineError;
use rustyline::{Config, DefaultEditor};

use super::UsageError;
use super::connect::Connection;
use crate::cli::{ConnectArgs, RowFormat, RowOutputArgs, SqlArgs};

/// Whether `aisql sql` without a statement opens the shell: someone types
/// and reads. Otherwise (a pipe, a script) it stays a usage error, so a
/// script that forgot its statement fails instead of waiting for input.
pub fn on_terminal() -> bool {
    std::io::stdin().is_terminal() && std::io::stdout().is_terminal()
}

const PROMPT: &str = "aisql> ";
/// Shown while a statement has no `;` yet.
const CONTINUATION: &str = "  ...> ";
/// Statements kept in the history file.
const HISTORY_ENTRIES: usize = 1000;

const HELP: &str = "\
SQL statements end with ';' and may span lines. Commands:
  \\d              list the tables and views
  \\d NAME         the columns of NAME and their types
  \\format FORMAT  print following results as table, csv or json
  \\timing         print each statement's time (on|off, or toggle)
  \\?              this help
  \\q              quit (Ctrl-D too)
Ctrl-C stops a running statement; at the prompt it clears the line.";

/// The shell's history file, in aisql's cache folder (the one rule of
/// `cache_dir`), so that `AISQL_CACHE_DIR` moves it with the rest.
fn history_path() -> PathBuf {
    aisql_engine::data::cache_dir::cache_dir().join("sql_history")
}

/// `aisql sql` on a terminal without a statement.
pub fn run(args: SqlArgs) -> anyhow::Result<()> {
    // Usage errors before any table or model is opened.
    let one_statement = [
        (args.rows.output.is_some(), "--output"),
        (args.to_substrait.is_some(), "--to-substrait"),
        (args.cost.estimate, "--estimate"),
        (!args.selectivity.is_empty(), "--selectivity"),
    ];
    if let Some((_, flag)) = one_statement.iter().find(|(given, _)| *given) {
        return Err(UsageError(format!(
            "{flag} applies to one statement: give a SQL statement or -f FILE with it \
             (the shell, aisql sql without a statement, takes none)"
        ))
        .into());
    }
    let config = ConnectArgs {
        data: args.data,
        backend: args.backend,
        limits: args.limits,
        cost: args.cost,
    }
    .config(args.allow_writes)?;
    let runtime = super::runtime()?;
    let connection = runtime.block_on(Connection::open(&config))?;
    let mut shell = Shell {
        runtime,
        connection,
        rows: args.rows,
        timing: false,
    };
    let config = Config::builder()
        .max_history_size(HISTORY_ENTRIES)?
        .history_ignore_dups(true)?
        .auto_add_history(false)
        .build();
    let mut editor = DefaultEditor::with_config(config)?;
    let history = load_history(&mut editor, history_path())?;
    errln!("aisql shell: statements end with ';'. \\? for help, \\q to quit.")?;
    let outcome = shell.read_eval(&mut editor);
    if let Some(history) = history {
        save_history(&mut editor, &history);
    }
    outcome
}

/// Why the history file at `path` cannot be used, if it cannot: only a
/// regular file (or none yet) is read and written, never what a symbolic
/// link, a FIFO or a device there leads to (reading `/dev/full` or
/// `/dev/zero` never ends).
fn unusable_history(path: &Path) -> Option<String> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => Some(e.to_string()),
        Ok(m) if m.file_type().is_symlink() => Some("it is a symbolic link".into()),
        Ok(m) if !m.is_file() => Some("it is not a regular file".into()),
        Ok(_) => None,
    }
}

/// Reads the history at `path` into `editor`: the path to save it to at the
/// end, or `None` (after one warning) when it cannot be used. A history
/// costs only itself: the shell goes on without one.
fn load_history(editor: &mut DefaultEditor, path: PathBuf) -> anyhow::Result<Option<PathBuf>> {
    let why = match unusable_history(&path) {
        Some(why) => why,
        None => match editor.load_history(&path) {
            Ok(()) => return Ok(Some(path)),
            Err(ReadlineError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Some(path));
            }
            Err(e) => e.to_string(),
        },
    };
    errln!(
        "warning: the shell's history {} cannot be used ({why}); statements are not saved",
        path.display()
    )?;
    Ok(None)
}

/// Writes the history; a history that cannot be written costs only the
/// history, so it is a warning.
fn save_history(editor: &mut DefaultEditor, path: &Path) {
    let saved = match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(dir) => std::fs::create_dir_all(dir).map_err(ReadlineError::Io),
        None => Ok(()),
    }
    .and_then(|()| match unusable_history(path) {
        Some(why) => Err(ReadlineError::Io(std::io::Error::other(why))),
        None => editor.save_history(path),
    });
    if let Err(e) = saved {
        let _ = errln!(
            "warning: the shell's history could not be written to {}: {e}",
            path.display()
        );
    }
}

struct Shell {
    runtime: tokio::runtime::Runtime,
    connection: Connection,
    /// How results print: `--format` and `--limit`, then `\format`.
    rows: RowOutputArgs,
    timing: bool,
}

/// What the shell does after a backslash command.
enum Next {
    Read,
    Quit,
}

impl Shell {
    /// Reads lines until `\q` or Ctrl-D, running each statement as its `;`
    /// comes.
    fn read_eval(&mut self, editor: &mut DefaultEditor) -> anyhow::Result<()> {
        let mut buffer = String::new();
        loop {
            let prompt = if buffer.is_empty() {
                PROMPT
            } else {
                CONTINUATION
            };
            let line = match editor.readline(prompt) {
                Ok(line) => line,
                // As in psql: Ctrl-C at the prompt drops what was typed.
                Err(ReadlineError::Interrupted) => {
                    buffer.clear();
                    continue;
                }
                Err(ReadlineError::Eof) => {
                    outln!()?;
                    return Ok(());
                }
                // Bytes that are not UTF-8 (a terminal set to another
                // encoding, a stray key): that line is lost, not the shell.
                Err(ReadlineError::Io(e)) if e.kind() == std::io::ErrorKind::InvalidData => {
                    errln!(
                        "\nerror: the line typed is not valid UTF-8; it and the statement \
                         it was part of are dropped"
                    )?;
                    buffer.clear();
                    continue;
                }
                Err(e) => return Err(anyhow::Error::from(e).context("reading the shell's input")),
            };
            if buffer.is_empty() && line.trim_start().starts_with('\\') {
                let _ = editor.add_history_entry(line.trim());
                match self.command(line.trim())? {
                    Next::Read => continue,
                    Next::Quit => return Ok(()),
                }
            }
            buffer.push_str(&line);
            buffer.push('\n');
            let (statements, rest) = split_statements(&buffer);
            if !statements.is_empty() {
                let typed = buffer[..buffer.len() - rest.len()].trim();
                let _ = editor.add_history_entry(typed);
            }
            buffer = if is_blank(&rest) { String::new() } else { rest };
            for statement in statements {
                self.execute(&statement)?;
            }
        }
    }

    /// Runs one statement; Ctrl-C while it runs stops it (and its model
    /// work) and the shell goes on. An error only when the shell's output
    /// cannot be written.
    fn execute(&self, sql: &str) -> anyhow::Result<()> {
        let started = Instant::now();
        let connection = &self.connection;
        let outcome = self.runtime.block_on(async {
            tokio::select! {
                out = connection.run(connection.session(), sql) => Some(out),
                () = interrupted() => None,
            }
        });
        match outcome {
            // On a line of its own, after the terminal's ^C and any progress line.
            None => errln!("\ncancelled")?,
            Some(Err(e)) => errln!("error: {e:#}")?,
            Some(Ok(out)) => match super::sql::print_output(&out, &self.rows) {
                Err(e) if aisql_engine::console::pipe_closed() => return Err(e),
                Err(e) => errln!("error: {e:#}")?,
                Ok(()) => {}
            },
        }
        if self.timing {
            errln!("Time: {:.3} ms", started.elapsed().as_secs_f64() * 1e3)?;
        }
        Ok(())
    }

    /// Runs a backslash command; an error only when the shell's output
    /// cannot be written.
    fn command(&mut self, line: &str) -> anyhow::Result<Next> {
        let line = line.trim_end_matches(';').trim();
        let (name, arg) = match line.split_once(char::is_whitespace) {
            Some((name, arg)) => (name, arg.trim()),
            None => (line, ""),
        };
        let done = match (name, arg) {
            ("\\q" | "\\quit", "") => return Ok(Next::Quit),
            ("\\?" | "\\help", "") => outln!("{HELP}").map_err(Into::into),
            ("\\d", "") => self.list_tables(),
            ("\\d", table) => self.describe(table),
            ("\\timing", on) => self.set_timing(on),
            ("\\format", "") => {
                outln!("format: {}", format_name(self.rows.format)).map_err(Into::into)
            }
            ("\\format", format) => match RowFormat::from_str(format, true) {
                Ok(f) => {
                    self.rows.format = f;
                    outln!("format: {}", format_name(f)).map_err(Into::into)
                }
                Err(_) => Err(anyhow::anyhow!(
                    "\\format {format}: name table, csv or json"
                )),
            },
            ("\\q" | "\\quit" | "\\?" | "\\help", _) => {
                Err(anyhow::anyhow!("{name} takes no argument"))
            }
            _ => Err(anyhow::anyhow!(
                "unknown command {name} (\\? lists the commands)"
            )),
        };
        match done {
            Err(e) if aisql_engine::console::pipe_closed() => Err(e),
            Err(e) => {
                errln!("error: {e:#}")?;
                Ok(Next::Read)
            }
            Ok(()) => Ok(Next::Read),
        }
    }

    fn set_timing(&mut self, arg: &str) -> anyhow::Result<()> {
        self.timing = match arg {
            "" => !self.timing,
            "on" => true,
            "off" => false,
            _ => anyhow::bail!("\\timing {arg}: give on, off or nothing (toggle)"),
        };
        outln!("timing {}", if self.timing { "on" } else { "off" })?;
        Ok(())
    }

    /// `\d`: every table and view but the information schema's.
    fn list_tables(&self) -> anyhow::Result<()> {
        let rows = self.catalog(
            "SELECT table_name AS name, table_type AS type FROM information_schema.tables \
             WHERE table_schema <> 'information_schema' ORDER BY table_name",
        )?;
        if rows.num_rows() == 0 {
            outln!("no tables")?;
            return Ok(());
        }
        self.print_catalog(&rows)
    }

    /// `\d NAME`: its columns and types, in order.
    fn describe(&self, name: &str) -> anyhow::Result<()> {
        // A quoted name is exact; an unquoted one as SQL reads it (lowercase)
        // when it is not a table's exact name.
        let (exact, folded) = match name.strip_prefix('"').and_then(|n| n.strip_suffix('"')) {
            Some(quoted) => (quoted.to_string(), None),
            None => (name.to_string(), Some(name.to_lowercase())),
        };
        for candidate in std::iter::once(exact).chain(folded) {
            let rows = self.catalog(&format!(
                "SELECT column_name AS column, data_type AS type, is_nullable AS nullable \
                 FROM information_schema.columns WHERE table_name = '{}' \
                 ORDER BY ordinal_position",
                candidate.replace('\'', "''")
            ))?;
            if rows.num_rows() > 0 {
                return self.print_catalog(&rows);
            }
        }
        anyhow::bail!("no table or view named {name} (\\d lists them)")
    }

    /// The rows of a query of the information schema (no model involved).
    fn catalog(&self, sql: &str) -> anyhow::Result<RecordBatch> {
        let session = self.connection.session();
        let out = self.runtime.block_on(session.run(sql))?;
        Ok(out.rows()?)
    }

    fn print_catalog(&self, rows: &RecordBatch) -> anyhow::Result<()> {
        aisql_engine::console::out(&super::rows::render(rows, self.rows.format)?)?;
        Ok(())
    }
}

/// Completes on Ctrl-C. Where the signal cannot be watched it never does:
/// statements then run to their end, as without the shell.
async fn interrupted() {
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}

fn format_name(format: RowFormat) -> String {
    format
        .to_possible_value()
        .map(|v| v.get_name().to_string())
        .unwrap_or_default()
}

/// Where the scanner of [`split_statements`] is.
#[derive(Clone, Copy, PartialEq)]
enum Scan {
    Code,
    /// In a '...' string (`''` is a quote inside it: two toggles).
    Text,
    /// In a "..." identifier.
    Identifier,
    /// After `--`, to the end of the line.
    LineComment,
    /// In `/* ... */`, nested as in PostgreSQL.
    BlockComment(usize),
}

/// Splits `text` at each `;` outside strings, quoted identifiers and
/// comments: the statements completed (each without its `;`; those with no
/// code dropped), and the text after the last such `;`, still being typed.
pub fn split_statements(text: &str) -> (Vec<String>, String) {
    let mut statements = Vec::new();
    let mut start = 0;
    let mut has_code = false;
    scan(text, |i, c, state| {
        if state == Scan::Code && c == ';' {
            if has_code {
                statements.push(text[start..i].trim().to_string());
            }
            start = i + 1;
            has_code = false;
        } else if !c.is_whitespace() {
            has_code = true;
        }
    });
    (statements, text[start..].to_string())
}

/// Whether `text` holds no code: only whitespace and closed comments.
fn is_blank(text: &str) -> bool {
    let mut code = false;
    let end = scan(text, |_, c, _| code |= !c.is_whitespace());
    !code && !matches!(end, Scan::BlockComment(_))
}

/// Walks `text`, calling `code` with each character outside comments (a
/// string's or quoted identifier's characters and quotes included), its byte
/// offset and the state before it; gives the state at the end.
fn scan(text: &str, mut code: impl FnMut(usize, char, Scan)) -> Scan {
    let mut state = Scan::Code;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let next = chars.peek().map(|&(_, n)| n);
        state = match (state, c) {
            (Scan::Code, '-') if next == Some('-') => {
                chars.next();
                Scan::LineComment
            }
            (Scan::Code, '/') if next == Some('*') => {
                chars.next();
                Scan::BlockComment(1)
            }
            (Scan::LineComment, '\n') => Scan::Code,
            (Scan::LineComment, _) => Scan::LineComment,
            (Scan::BlockComment(depth), '*') if next == Some('/') => {
                chars.next();
                match depth {
                    1 => Scan::Code,
                    _ => Scan::BlockComment(depth - 1),
                }
            }
            (Scan::BlockComment(depth), '/') if next == Some('*') => {
                chars.next();
                Scan::BlockComment(depth + 1)
            }
            (Scan::BlockComment(depth), _) => Scan::BlockComment(depth),
            (state, c) => {
                code(i, c, state);
                match (state, c) {
                    (Scan::Code, '\'') => Scan::Text,
                    (Scan::Code, '"') => Scan::Identifier,
                    (Scan::Text, '\'') | (Scan::Identifier, '"') => Scan::Code,
                    (state, _) => state,
                }
            }
        };
    }
    state
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(text: &str) -> (Vec<String>, String) {
        split_statements(text)
    }

    #[test]
    fn a_statement_ends_at_a_semicolon_outside_quotes_and_comments() {
        assert_eq!(split("SELECT 1"), (vec![], "SELECT 1".into()));
        assert_eq!(split("SELECT 1;\n"), (vec!["SELECT 1".into()], "\n".into()));
        assert_eq!(
            split("SELECT\n  2 ;"),
            (vec!["SELECT\n  2".into()], String::new())
        );
        // Two on one line, and the start of a third kept for the next line.
        assert_eq!(
            split("SELECT 1; SELECT 2; SELECT"),
            (vec!["SELECT 1".into(), "SELECT 2".into()], " SELECT".into())
        );
        // Not in a string (with its doubled quote), an identifier or comments.
        let text = "SELECT 'a;''b', \"c;d\" -- e;\n/* f; /* g; */ h; */ FROM t";
        assert_eq!(split(text), (vec![], text.into()));
        assert_eq!(
            split(&format!("{text};")),
            (vec![text.into()], String::new())
        );
        // A string left open runs on: the `;` is in it.
        assert_eq!(split("SELECT 'a;\n").0, Vec::<String>::new());
        // Blank statements are dropped.
        assert_eq!(split(";  ; -- x\n;"), (vec![], String::new()));
    }

    #[test]
    fn only_whitespace_and_closed_comments_are_blank() {
        assert!(is_blank("  \n"));
        assert!(is_blank("-- a comment"));
        assert!(is_blank("/* a /* nested */ comment */ -- and more\n"));
        assert!(!is_blank("/* open"));
        assert!(!is_blank("/* a */ SELECT"));
        assert!(!is_blank("- 1"));
    }
}
