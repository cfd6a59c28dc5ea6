//! A check of a CSV or JSON-lines table file before DataFusion reads it: one
//! pass over its bytes, linear and without allocation per row, that finds the
//! first problem and names its line (1-based).
//!
//! DataFusion's CSV reader takes a quote left open as a value that runs to the
//! end of the file, silently merging every row after it into one field, and
//! reports a row of the wrong width by its record number, not its line. Neither
//! reader bounds the width of a table or the size of a value: a header of
//! 100 000 columns or a single 200 MB field keeps it busy for minutes. So a
//! file is refused, naming its line, when it passes one of the limits below or,
//! in [`CsvReading::Strict`] (the default), when its CSV is malformed.
//!
//! The CSV is DataFusion's default dialect, which this scan follows byte by byte
//! (csv-core's state machine): `,` between fields, a field in `"` quotes may hold
//! `,`, line breaks and `""` (a quote), a record ends at `\n`, `\r` or `\r\n`,
//! and a blank line is no record. The first record is the header.

use std::collections::HashSet;
use std::io::Read;
use std::path::Path;

/// The most columns a table may have: fields of a CSV record, keys of a JSON
/// object, distinct top-level keys of a JSON-lines file.
pub const MAX_COLUMNS: usize = 10_000;

/// The most bytes of one value: a CSV field (with its quotes).
pub const MAX_FIELD_BYTES: u64 = 64 << 20;

/// The most bytes of one record: a CSV row (all the lines a quoted field makes
/// it span) or a line of JSON lines.
pub const MAX_RECORD_BYTES: u64 = 64 << 20;

/// How strictly a CSV table is read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CsvReading {
    /// A malformed file is an error naming its line: a quote that opens a field
    /// and never closes, a closing quote followed by more text, a row with more
    /// or fewer fields than the header.
    #[default]
    Strict,
    /// As DataFusion's reader takes it: a row's missing fields are nulls, a quote
    /// left open runs to the end of the file, text after a closing quote joins
    /// the field. A row with more fields than the header is still an error, and
    /// the limits hold.
    Lenient,
}

/// The first problem of a file, at a 1-based line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The line it is on (where the record or field it concerns begins).
    pub line: u64,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

/// Why a file did not pass: it could not be read, or it has a problem.
#[derive(Debug)]
pub enum ScanError {
    /// Reading failed.
    Io(std::io::Error),
    /// The first problem found.
    Problem(Problem),
}

impl std::fmt::Display for ScanError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScanError::Io(e) => write!(f, "{e}"),
            ScanError::Problem(p) => write!(f, "{p}"),
        }
    }
}

impl From<Problem> for ScanError {
    fn from(p: Problem) -> Self {
        ScanError::Problem(p)
    }
}

/// What the scan of a well-formed CSV file found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CsvShape {
    /// Fields of the header (0 for an empty file).
    pub columns: usize,
    /// Records, the header included.
    pub records: u64,
    /// Whether a quoted field holds a line break (DataFusion must then not
    /// split the file at line breaks).
    pub quoted_line_breaks: bool,
}

const CHUNK: usize = 1 << 20;

/// Feeds the bytes of `path` to `feed` a chunk at a time.
fn each_chunk(
    path: &Path,
    mut feed: impl FnMut(&[u8]) -> Result<(), Problem>,
) -> Result<(), ScanError> {
    let mut file = crate::data::input_file::open(path).map_err(ScanError::Io)?;
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(ScanError::Io(e)),
        };
        feed(&buf[..n])?;
    }
}

/// Scans the CSV file at `path` ([`CsvScan`]).
pub fn scan_csv(path: &Path, reading: CsvReading) -> Result<CsvShape, ScanError> {
    let mut scan = CsvScan::new(reading);
    each_chunk(path, |chunk| scan.feed(chunk))?;
    Ok(scan.finish()?)
}

/// Scans the JSON-lines file at `path` ([`JsonLinesScan`]).
pub fn scan_json_lines(path: &Path) -> Result<(), ScanError> {
    let mut scan = JsonLinesScan::default();
    each_chunk(path, |chunk| scan.feed(chunk))?;
    Ok(scan.finish()?)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Csv {
    /// Between records (blank lines are skipped).
    StartRecord,
    /// At the first byte of a field.
    StartField,
    /// In an unquoted field.
    InField,
    /// In a quoted field.
    InQuoted,
    /// Right after a quote in a quoted field: it closes the field, or, doubled,
    /// stands for a quote.
    QuoteInQuoted,
}

/// Counts line breaks: `\n`, `\r` and `\r\n` each end one line.
#[derive(Debug, Clone, Copy)]
struct Lines {
    /// The line of the next byte.
    line: u64,
    after_cr: bool,
}

impl Lines {
    fn new() -> Self {
        Lines {
            line: 1,
            after_cr: false,
        }
    }

    /// Takes the line break `b` (`\n` or `\r`).
    fn brk(&mut self, b: u8) {
        if b == b'\n' && self.after_cr {
            self.after_cr = false;
        } else {
            self.line += 1;
            self.after_cr = b == b'\r';
        }
    }
}

/// The CSV check, fed a chunk at a time: the first problem, or the file's shape.
#[derive(Debug)]
pub struct CsvScan {
    strict: bool,
    state: Csv,
    lines: Lines,
    /// Offset of the next byte.
    pos: u64,
    record_start: u64,
    record_line: u64,
    field_start: u64,
    field_line: u64,
    fields: usize,
    /// Fields of the header and its line.
    header: Option<(usize, u64)>,
    records: u64,
    quoted_line_breaks: bool,
}

impl CsvScan {
    /// A scan at the start of a file.
    pub fn new(reading: CsvReading) -> Self {
        CsvScan {
            strict: reading == CsvReading::Strict,
            state: Csv::StartRecord,
            lines: Lines::new(),
            pos: 0,
            record_start: 0,
            record_line: 1,
            field_start: 0,
            field_line: 1,
            fields: 0,
            header: None,
            records: 0,
            quoted_line_breaks: false,
        }
    }

    /// Takes the next bytes of the file.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<(), Problem> {
        let base = self.pos;
        let mut i = 0;
        while i < chunk.len() {
            // Inside a field most bytes change nothing: skip them in a tight loop.
            let quoted = match self.state {
                Csv::InField => Some(false),
                Csv::InQuoted => Some(true),
                _ => None,
            };
            if let Some(quoted) = quoted {
                let start = i;
                while i < chunk.len() && !special(chunk[i], quoted) {
                    i += 1;
                }
                if i > start {
                    self.lines.after_cr = false;
                }
                if i == chunk.len() {
                    break;
                }
            }
            self.step(chunk[i], base + i as u64)?;
            i += 1;
        }
        self.pos = base + chunk.len() as u64;
        self.check_sizes()
    }

    /// Ends the file: its shape, or the problem it ends with.
    pub fn finish(mut self) -> Result<CsvShape, Problem> {
        match self.state {
            Csv::StartRecord => {}
            Csv::InQuoted if self.strict => {
                return Err(Problem {
                    line: self.field_line,
                    message: "a quoted field opens here and is never closed (the rest of the \
                              file would be read as one value)"
                        .into(),
                });
            }
            _ => {
                self.end_field(self.pos)?;
                self.end_record(self.pos)?;
            }
        }
        Ok(CsvShape {
            columns: self.header.map_or(0, |(n, _)| n),
            records: self.records,
            quoted_line_breaks: self.quoted_line_breaks,
        })
    }

    fn step(&mut self, b: u8, at: u64) -> Result<(), Problem> {
        let brk = b == b'\n' || b == b'\r';
        match self.state {
            Csv::StartRecord => {
                if !brk {
                    self.record_start = at;
                    self.record_line = self.lines.line;
                    self.fields = 0;
                    self.state = Csv::StartField;
                    return self.step(b, at);
                }
            }
            Csv::StartField => {
                self.field_start = at;
                self.field_line = self.lines.line;
                match b {
                    b'"' => self.state = Csv::InQuoted,
                    b',' => self.end_field(at)?,
                    _ if brk => self.end_row(at)?,
                    _ => self.state = Csv::InField,
                }
            }
            Csv::InField => match b {
                b',' => {
                    self.end_field(at)?;
                    self.state = Csv::StartField;
                }
                _ if brk => self.end_row(at)?,
                _ => {}
            },
            Csv::InQuoted => match b {
                b'"' => self.state = Csv::QuoteInQuoted,
                _ if brk => self.quoted_line_breaks = true,
                _ => {}
            },
            Csv::QuoteInQuoted => match b {
                b'"' => self.state = Csv::InQuoted,
                b',' => {
                    self.end_field(at)?;
                    self.state = Csv::StartField;
                }
                _ if brk => self.end_row(at)?,
                _ if self.strict => {
                    return Err(Problem {
                        line: self.lines.line,
                        message: format!(
                            "{} follows the closing quote of the field that opens on line {} \
                             (a quote inside a quoted field is written twice: \"\")",
                            shown_byte(b),
                            self.field_line
                        ),
                    });
                }
                _ => self.state = Csv::InField,
            },
        }
        if brk {
            self.lines.brk(b);
        } else {
            self.lines.after_cr = false;
        }
        Ok(())
    }

    /// A line break ends the field and the record.
    fn end_row(&mut self, at: u64) -> Result<(), Problem> {
        self.end_field(at)?;
        self.end_record(at)?;
        self.state = Csv::StartRecord;
        Ok(())
    }

    fn end_field(&mut self, at: u64) -> Result<(), Problem> {
        self.fields += 1;
        if self.fields > MAX_COLUMNS {
            return Err(Problem {
                line: self.record_line,
                message: format!(
                    "more than {MAX_COLUMNS} fields; a table has at most {MAX_COLUMNS} columns"
                ),
            });
        }
        if at - self.field_start > MAX_FIELD_BYTES {
            return Err(self.field_too_long());
        }
        Ok(())
    }

    fn end_record(&mut self, at: u64) -> Result<(), Problem> {
        if at - self.record_start > MAX_RECORD_BYTES {
            return Err(self.record_too_long());
        }
        self.records += 1;
        match self.header {
            None => self.header = Some((self.fields, self.record_line)),
            Some((columns, line)) if self.fields != columns => {
                if self.strict || self.fields > columns {
                    let hint = if self.fields < columns {
                        " (lenient CSV reading takes the missing fields as nulls)"
                    } else {
                        ""
                    };
                    return Err(Problem {
                        line: self.record_line,
                        message: format!(
                            "{} field{}, the header (line {line}) has {columns}{hint}",
                            self.fields,
                            if self.fields == 1 { "" } else { "s" }
                        ),
                    });
                }
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// The field or record in progress passed a limit (checked after each chunk,
    /// so a huge value is refused once the limit is read, not at its end).
    fn check_sizes(&self) -> Result<(), Problem> {
        let in_field = matches!(
            self.state,
            Csv::InField | Csv::InQuoted | Csv::QuoteInQuoted
        );
        if in_field && self.pos - self.field_start > MAX_FIELD_BYTES {
            return Err(self.field_too_long());
        }
        if self.state != Csv::StartRecord && self.pos - self.record_start > MAX_RECORD_BYTES {
            return Err(self.record_too_long());
        }
        Ok(())
    }

    fn field_too_long(&self) -> Problem {
        Problem {
            line: self.field_line,
            message: format!(
                "a field longer than {} MiB, the limit on a value",
                MAX_FIELD_BYTES >> 20
            ),
        }
    }

    fn record_too_long(&self) -> Problem {
        Problem {
            line: self.record_line,
            message: format!(
                "a row longer than {} MiB, the limit on a row",
                MAX_RECORD_BYTES >> 20
            ),
        }
    }
}

/// A byte that may change the state inside a field.
#[inline]
fn special(b: u8, quoted: bool) -> bool {
    b == b'\n' || b == b'\r' || b == if quoted { b'"' } else { b',' }
}

/// A byte as the user would read it in a message.
fn shown_byte(b: u8) -> String {
    if b.is_ascii_graphic() || b == b' ' {
        format!("{:?}", b as char)
    } else {
        format!("byte 0x{b:02x}")
    }
}

/// The JSON-lines check, fed a chunk at a time: every line at most
/// [`MAX_RECORD_BYTES`], every object at most [`MAX_COLUMNS`] keys, and the
/// top-level keys of the whole file at most [`MAX_COLUMNS`] distinct names
/// (its columns). It follows strings and nesting only; whether each line is
/// valid JSON is left to the reader (see [`json_error_line`]).
#[derive(Debug, Default)]
pub struct JsonLinesScan {
    /// Offset of the next byte.
    pos: u64,
    /// Offset where the current line begins.
    line_start: u64,
    /// The current line, 0-based (`line + 1` in messages).
    line: u64,
    in_string: bool,
    escaped: bool,
    /// Per open object or array: `Some(keys so far)` for an object.
    open: Vec<Option<usize>>,
    /// The next string in the innermost object is a key.
    expect_key: bool,
    /// Hash of the top-level key being read.
    key: Option<u64>,
    keys: HashSet<u64>,
}

impl JsonLinesScan {
    /// Takes the next bytes of the file.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<(), Problem> {
        let base = self.pos;
        let mut i = 0;
        while i < chunk.len() {
            let b = chunk[i];
            let at = base + i as u64;
            i += 1;
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'"' {
                    self.in_string = false;
                    if let Some(hash) = self.key.take() {
                        self.keys.insert(hash);
                        if self.keys.len() > MAX_COLUMNS {
                            return Err(self.problem(format!(
                                "more than {MAX_COLUMNS} distinct top-level keys so far; a \
                                 table has at most {MAX_COLUMNS} columns"
                            )));
                        }
                    }
                    continue;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'\n' {
                    // Not JSON; the reader names it. The line ends regardless.
                    self.end_line(at)?;
                    continue;
                }
                if let Some(hash) = &mut self.key {
                    *hash = (*hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
                }
                continue;
            }
            match b {
                b'"' => {
                    self.in_string = true;
                    if self.expect_key {
                        self.expect_key = false;
                        if let Some(Some(keys)) = self.open.last_mut() {
                            *keys += 1;
                            if *keys > MAX_COLUMNS {
                                return Err(self.problem(format!(
                                    "an object with more than {MAX_COLUMNS} keys; a table has \
                                     at most {MAX_COLUMNS} columns"
                                )));
                            }
                        }
                        if self.open.len() == 1 {
                            self.key = Some(0xcbf2_9ce4_8422_2325);
                        }
                    }
                }
                b'{' => {
                    self.open.push(Some(0));
                    self.expect_key = true;
                }
                b'[' => {
                    self.open.push(None);
                    self.expect_key = false;
                }
                b'}' | b']' => {
                    self.open.pop();
                    self.expect_key = false;
                }
                b',' => self.expect_key = matches!(self.open.last(), Some(Some(_))),
                b':' => self.expect_key = false,
                b'\n' => self.end_line(at)?,
                _ => {}
            }
        }
        self.pos = base + chunk.len() as u64;
        if self.pos - self.line_start > MAX_RECORD_BYTES {
            return Err(self.line_too_long());
        }
        Ok(())
    }

    /// Ends the file.
    pub fn finish(self) -> Result<(), Problem> {
        if self.pos - self.line_start > MAX_RECORD_BYTES {
            return Err(self.line_too_long());
        }
        Ok(())
    }

    fn end_line(&mut self, at: u64) -> Result<(), Problem> {
        if at - self.line_start > MAX_RECORD_BYTES {
            return Err(self.line_too_long());
        }
        self.line += 1;
        self.line_start = at + 1;
        self.in_string = false;
        self.escaped = false;
        self.open.clear();
        self.expect_key = false;
        self.key = None;
        Ok(())
    }

    fn problem(&self, message: String) -> Problem {
        Problem {
            line: self.line + 1,
            message,
        }
    }

    fn line_too_long(&self) -> Problem {
        self.problem(format!(
            "a line longer than {} MiB, the limit on a row",
            MAX_RECORD_BYTES >> 20
        ))
    }
}

/// The first line of the JSON-lines file at `path` that is not valid JSON or
/// not an object, with the parser's reason: where a reader's error (which
/// counts lines from its own batch) happened. `None` when every line parses.
pub fn json_error_line(path: &Path) -> Option<Problem> {
    use std::io::BufRead;
    let file = crate::data::input_file::open(path).ok()?;
    let mut reader = std::io::BufReader::new(file);
    let mut line = Vec::new();
    for number in 1u64.. {
        line.clear();
        if reader.read_until(b'\n', &mut line).ok()? == 0 {
            return None;
        }
        let text = line.trim_ascii();
        if text.is_empty() {
            continue;
        }
        let problem = |message: String| {
            Some(Problem {
                line: number,
                message,
            })
        };
        if text[0] != b'{' {
            return problem(format!(
                "not a JSON object (each line of JSON lines is one object; this one starts with {})",
                shown_byte(text[0])
            ));
        }
        let values =
            serde_json::Deserializer::from_slice(text).into_iter::<serde::de::IgnoredAny>();
        for value in values {
            if let Err(e) = value {
                // serde_json counts from the line's start; say the column only.
                let reason = e.to_string();
                let suffix = format!(" at line {} column {}", e.line(), e.column());
                let reason = reason.strip_suffix(&suffix).unwrap_or(&reason);
                return problem(format!("{reason} (column {})", e.column()));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csv(text: &str, reading: CsvReading) -> Result<CsvShape, Problem> {
        let mut scan = CsvScan::new(reading);
        // Byte by byte as well as whole: the state carries across chunks.
        let mut bytewise = CsvScan::new(reading);
        let whole = scan.feed(text.as_bytes()).and_then(|_| scan.finish());
        let split = text
            .as_bytes()
            .iter()
            .try_for_each(|b| bytewise.feed(std::slice::from_ref(b)))
            .and_then(|_| bytewise.finish());
        assert_eq!(whole, split, "{text:?}");
        whole
    }

    fn strict(text: &str) -> Result<CsvShape, Problem> {
        csv(text, CsvReading::Strict)
    }

    #[test]
    fn well_formed_csv_passes_with_its_shape() {
        let shape = strict("id,text\r\n1,\"a, \"\"quoted\"\"\nvalue\"\r\n\n2,b\n3,\n").unwrap();
        assert_eq!(
            shape,
            CsvShape {
                columns: 2,
                records: 4,
                quoted_line_breaks: true
            }
        );
        // A quote inside an unquoted field is text; no final line break is fine.
        let shape = strict("a,b\n5\" screen,x").unwrap();
        assert_eq!((shape.records, shape.quoted_line_breaks), (2, false));
        assert_eq!(strict("").unwrap(), CsvShape::default());
    }

    #[test]
    fn a_quote_left_open_names_the_line_it_opens_on() {
        let p = strict("id,text\n1,a\n2,\"open\n3,c\n4,d\n").unwrap_err();
        assert_eq!(p.line, 3, "{p}");
        assert!(p.message.contains("never closed"), "{p}");
        // Read leniently it swallows the rest, as DataFusion would read it.
        let shape = csv("id,text\n1,a\n2,\"open\n3,c\n4,d\n", CsvReading::Lenient).unwrap();
        assert_eq!(shape.records, 3);
    }

    #[test]
    fn text_after_a_closing_quote_is_named() {
        let p = strict("a,b\n1,\"x\"y\n").unwrap_err();
        assert_eq!(p.line, 2);
        assert!(
            p.message.starts_with("'y' follows the closing quote"),
            "{p}"
        );
        csv("a,b\n1,\"x\"y\n", CsvReading::Lenient).unwrap();
    }

    #[test]
    fn a_ragged_row_names_its_line_and_the_header() {
        let p = strict("a,b\n1,2\r\n\r\n3,4,5\n").unwrap_err();
        assert_eq!(
            p,
            Problem {
                line: 4,
                message: "3 fields, the header (line 1) has 2".into()
            }
        );
        let p = strict("a,b,c\n1,\"two\nlines\",3\n4\n").unwrap_err();
        assert_eq!(p.line, 4, "{p}");
        assert!(
            p.message
                .starts_with("1 field, the header (line 1) has 3 (lenient"),
            "{p}"
        );
        // Lenient: a short row is fine, a long one is not.
        csv("a,b,c\n4\n", CsvReading::Lenient).unwrap();
        let p = csv("a,b\n1,2,3\n", CsvReading::Lenient).unwrap_err();
        assert_eq!(p.line, 2);
    }

    #[test]
    fn too_many_columns_are_refused_on_the_header() {
        let header = vec!["c"; MAX_COLUMNS + 1].join(",");
        let p = strict(&format!("{header}\n")).unwrap_err();
        assert_eq!(p.line, 1);
        assert!(p.message.contains("more than 10000 fields"), "{p}");
        let header = vec!["c"; MAX_COLUMNS].join(",");
        assert_eq!(strict(&header).unwrap().columns, MAX_COLUMNS);
    }

    #[test]
    fn a_huge_field_is_refused_before_its_end() {
        let mut scan = CsvScan::new(CsvReading::Strict);
        scan.feed(b"a,b\n1,\"").unwrap();
        let chunk = vec![b'x'; 1 << 20];
        let mut fed = 0u64;
        let p = loop {
            match scan.feed(&chunk) {
                Ok(()) => fed += chunk.len() as u64,
                Err(p) => break p,
            }
            assert!(fed <= MAX_FIELD_BYTES, "no limit");
        };
        assert_eq!(p.line, 2);
        assert!(p.message.contains("longer than 64 MiB"), "{p}");
    }

    fn json(text: &str) -> Result<(), Problem> {
        let mut scan = JsonLinesScan::default();
        scan.feed(text.as_bytes())?;
        scan.finish()
    }

    #[test]
    fn json_lines_limits_name_the_line() {
        json("{\"a\": \"x,}{\\\"\", \"b\": [1, {\"c\": 2}]}\n\n{\"a\": 1}").unwrap();
        let wide: Vec<String> = (0..=MAX_COLUMNS).map(|i| format!("\"k{i}\": 1")).collect();
        let p = json(&format!("{{\"a\": 1}}\n{{{}}}\n", wide.join(", "))).unwrap_err();
        assert_eq!(p.line, 2);
        assert!(p.message.contains("more than 10000"), "{p}");
        // Nested keys are not columns; distinct top-level keys across lines are.
        let nested = format!(
            "{{\"a\": {{\"k\": 1, \"j\": [{}]}}}}\n",
            "{\"x\":1},".repeat(20_000)
        );
        json(&format!("{}{{}}", nested)).unwrap();
        let spread: String = (0..=MAX_COLUMNS)
            .map(|i| format!("{{\"k{i}\": 1}}\n"))
            .collect();
        let p = json(&spread).unwrap_err();
        assert_eq!(p.line, MAX_COLUMNS as u64 + 1);
        assert!(p.message.contains("distinct top-level keys"), "{p}");
    }

    #[test]
    fn a_huge_json_line_is_refused() {
        let mut scan = JsonLinesScan::default();
        scan.feed(b"{\"a\": 1}\n{\"a\": \"").unwrap();
        let chunk = vec![b'x'; 1 << 20];
        let p = loop {
            if let Err(p) = scan.feed(&chunk) {
                break p;
            }
        };
        assert_eq!(p.line, 2);
        assert!(p.message.contains("longer than 64 MiB"), "{p}");
    }

    #[test]
    fn the_json_error_line_is_the_lines_own_number() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.json");
        std::fs::write(&path, "{\"a\": 1}\n\n{\"a\": 2,}\n{\"a\": 3}\n").unwrap();
        let p = json_error_line(&path).unwrap();
        assert_eq!(p.line, 3, "{p}");
        assert_eq!(p.message, "key must be a string (column 9)");
        std::fs::write(&path, "{\"a\": 1}\n[1]\n").unwrap();
        let p = json_error_line(&path).unwrap();
        assert_eq!(p.line, 2);
        assert!(p.message.starts_with("not a JSON object"), "{p}");
        std::fs::write(&path, "{\"a\": 1}\n{\"a\": 2}\n").unwrap();
        assert_eq!(json_error_line(&path), None);
    }
}
