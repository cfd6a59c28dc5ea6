//! Live progress of a query's AI operators: for each, the rows (questions)
//! done of those expected, fresh tokens, tokens per second and an ETA.
//!
//! On a terminal ([`ProgressMode::Terminal`]) each running operator is a line
//! updated in place (indicatif), under a parent's bar when one is given (the
//! benchmark's run bar); indicatif draws nothing when stderr is not a
//! terminal. [`ProgressMode::Json`] writes one JSON object per second to
//! stderr, and a last one when the query ends, for programs. The expected rows
//! come from the query's estimate when one was made; without it the lines
//! count up with no total.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProgressMode {
    /// Nothing.
    #[default]
    Hidden,
    /// Lines updated in place on stderr, when it is a terminal.
    Terminal,
    /// One JSON line per second on stderr.
    Json,
}

/// How often a JSON line is written.
const JSON_INTERVAL: Duration = Duration::from_secs(1);

/// One operator's progress.
#[derive(Debug)]
struct OperatorLine {
    id: String,
    rows_done: u64,
    rows_expected: Option<u64>,
    fresh_tokens: u64,
    started: Instant,
    bar: Option<ProgressBar>,
}

impl OperatorLine {
    fn tokens_per_s(&self) -> f64 {
        self.fresh_tokens as f64 / self.started.elapsed().as_secs_f64().max(1e-3)
    }

    /// Seconds left at the rate so far, when the expected rows are known.
    fn eta_s(&self) -> Option<f64> {
        let expected = self.rows_expected?;
        if self.rows_done == 0 {
            return None;
        }
        let per_row = self.started.elapsed().as_secs_f64() / self.rows_done as f64;
        Some(per_row * expected.saturating_sub(self.rows_done) as f64)
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "id": self.id,
            "rows_done": self.rows_done,
            "rows_expected": self.rows_expected,
            "fresh_tokens": self.fresh_tokens,
            "tokens_per_s": (self.tokens_per_s() * 10.0).round() / 10.0,
            "eta_s": self.eta_s().map(|s| (s * 10.0).round() / 10.0),
        })
    }
}

#[derive(Debug)]
struct Board {
    started: Instant,
    expected: HashMap<String, u64>,
    operators: Vec<OperatorLine>,
    /// Set once a JSON line could not be written: no more are tried.
    closed: bool,
}

/// The progress of one session's queries, one at a time.
pub struct Progress {
    mode: ProgressMode,
    /// Where terminal lines are drawn (under a parent's bar when given).
    lines: MultiProgress,
    board: Arc<Mutex<Board>>,
    /// Set to stop the JSON ticker of the running query.
    stop: Mutex<Arc<AtomicBool>>,
    ticker: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Progress")
            .field("mode", &self.mode)
            .finish()
    }
}

impl Progress {
    /// Progress shown as `mode`; terminal lines go under `parent` when given.
    pub fn new(mode: ProgressMode, parent: Option<MultiProgress>) -> Self {
        let lines =
            parent.unwrap_or_else(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr()));
        Self {
            mode,
            lines,
            board: Arc::new(Mutex::new(Board {
                started: Instant::now(),
                expected: HashMap::new(),
                operators: Vec::new(),
                closed: false,
            })),
            stop: Mutex::new(Arc::new(AtomicBool::new(true))),
            ticker: Mutex::new(None),
        }
    }

    /// A query starts; `expected` gives the questions each operator (by id)
    /// is expected to ask.
    pub fn start_query(&self, expected: HashMap<String, u64>) {
        self.finish_query();
        {
            let mut board = self.board.lock().expect("progress lock");
            board.started = Instant::now();
            board.expected = expected;
            board.operators.clear();
        }
        if self.mode != ProgressMode::Json {
            return;
        }
        let stop = Arc::new(AtomicBool::new(false));
        *self.stop.lock().expect("stop lock") = stop.clone();
        let board = self.board.clone();
        let ticker = std::thread::Builder::new()
            .name("aisql-progress".into())
            .spawn(move || {
                let mut next = Instant::now() + JSON_INTERVAL;
                while !stop.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(50));
                    if Instant::now() >= next {
                        write_json(&mut board.lock().expect("progress lock"), false);
                        next += JSON_INTERVAL;
                    }
                }
            })
            .ok();
        *self.ticker.lock().expect("ticker lock") = ticker;
    }

    /// Operator `op` starts asking the model: its line (and its clock, which
    /// tokens/s and the ETA are measured by) starts now, if not already.
    pub fn begin(&self, op: &str) {
        if self.mode != ProgressMode::Hidden {
            self.line(&mut self.board.lock().expect("progress lock"), op);
        }
    }

    /// `rows` more questions of operator `op` done, `fresh_tokens` more
    /// computed.
    pub fn advance(&self, op: &str, rows: u64, fresh_tokens: u64) {
        if self.mode == ProgressMode::Hidden {
            return;
        }
        let mut board = self.board.lock().expect("progress lock");
        let i = self.line(&mut board, op);
        let line = &mut board.operators[i];
        line.rows_done += rows;
        line.fresh_tokens += fresh_tokens;
        if let Some(bar) = &line.bar {
            if line.rows_expected.is_some_and(|n| line.rows_done > n) {
                // More than estimated: the total follows what was done.
                bar.set_length(line.rows_done);
            }
            bar.set_position(line.rows_done);
            bar.set_message(format!(
                "{} fresh tokens, {:.0} tokens/s",
                line.fresh_tokens,
                line.tokens_per_s()
            ));
        }
    }

    /// The index of `op`'s line on `board`, made (with its terminal bar)
    /// when it has none yet.
    fn line(&self, board: &mut Board, op: &str) -> usize {
        let expected = board.expected.get(op).copied();
        if let Some(i) = board.operators.iter().position(|o| o.id == op) {
            return i;
        }
        let bar = (self.mode == ProgressMode::Terminal).then(|| {
            let bar = self.lines.add(match expected {
                Some(n) => ProgressBar::new(n),
                None => ProgressBar::no_length(),
            });
            bar.set_style(
                ProgressStyle::with_template(
                    "{prefix:>12} [{bar:30}] {pos}/{len} rows {msg} eta {eta}",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            bar.set_prefix(op.to_string());
            bar
        });
        board.operators.push(OperatorLine {
            id: op.to_string(),
            rows_done: 0,
            rows_expected: expected,
            fresh_tokens: 0,
            started: Instant::now(),
            bar,
        });
        board.operators.len() - 1
    }

    /// The query is over: terminal lines cleared, the JSON ticker stopped and
    /// a last line written.
    pub fn finish_query(&self) {
        let ticker = self.ticker.lock().expect("ticker lock").take();
        if let Some(t) = ticker {
            self.stop
                .lock()
                .expect("stop lock")
                .store(true, Ordering::SeqCst);
            let _ = t.join();
            write_json(&mut self.board.lock().expect("progress lock"), true);
        }
        let mut board = self.board.lock().expect("progress lock");
        for line in &mut board.operators {
            if let Some(bar) = line.bar.take() {
                bar.finish_and_clear();
                self.lines.remove(&bar);
            }
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish_query();
    }
}

/// One JSON line of `board` on stderr, in one write: a reader splitting at
/// newlines never sees part of one, and a reader that went away ends the
/// lines (the command line ends at its next output, [`crate::console`]).
fn write_json(board: &mut Board, done: bool) {
    if board.closed {
        return;
    }
    let line = json_line(board, done);
    if crate::console::err(line.as_bytes()).is_err() {
        board.closed = true;
    }
}

/// The JSON line of `board`, newline included.
fn json_line(board: &Board, done: bool) -> String {
    let mut line = serde_json::json!({
        "progress": "aisql",
        "elapsed_s": (board.started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
        "done": done,
        "operators": board.operators.iter().map(OperatorLine::json).collect::<Vec<_>>(),
    })
    .to_string();
    line.push('\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_eta_run_from_when_the_operator_began_asking() {
        // Terminal lines draw nothing when stderr is not a terminal (tests).
        let progress = Progress::new(ProgressMode::Terminal, None);
        progress.start_query(HashMap::from([("filter-1".to_string(), 100)]));
        progress.begin("filter-1");
        std::thread::sleep(Duration::from_millis(50));
        progress.advance("filter-1", 50, 1000);
        {
            let board = progress.board.lock().unwrap();
            let line = &board.operators[0];
            assert_eq!((line.rows_done, line.rows_expected), (50, Some(100)));
            // 1000 tokens in at least 50 ms: at most 20k tokens/s.
            assert!(line.tokens_per_s() <= 20_000.0, "{}", line.tokens_per_s());
            let eta = line.eta_s().unwrap();
            assert!(eta >= 0.04, "half done after 50 ms: {eta}");
        }
        // More rows than estimated: the total follows.
        progress.advance("filter-1", 80, 0);
        assert_eq!(
            progress.board.lock().unwrap().operators[0].eta_s(),
            Some(0.0)
        );
        progress.finish_query();
        assert!(progress.board.lock().unwrap().operators[0].bar.is_none());
    }

    #[test]
    fn a_json_line_is_one_whole_line() {
        let progress = Progress::new(ProgressMode::Json, None);
        progress.start_query(HashMap::from([("join-1".to_string(), 10)]));
        progress.begin("join-1");
        progress.advance("join-1", 3, 70);
        let line = json_line(&progress.board.lock().unwrap(), false);
        assert_eq!(line.find('\n'), Some(line.len() - 1), "{line}");
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(value["operators"][0]["rows_done"], 3, "{line}");
        assert_eq!(value["done"], false);
    }
}
