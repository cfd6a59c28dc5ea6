//! Running one target for a while: generate, run, classify, keep, report.
//!
//! Every input is written to `<artifacts>/<target>/current-input` before it runs,
//! so an input that kills the process outright (stack overflow, allocation
//! refused, hang past the limit) is on disk afterwards. Panics are caught and
//! their inputs saved as `crash-<sha>`; broken promises as `violation-<sha>`.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use sha2::{Digest, Sha256};

use crate::alloc;
use crate::mutate::Mutator;
use crate::targets::{Fixture, Target};

/// Corpus entries kept at most (the seeds plus inputs of new outcome kinds).
const MAX_CORPUS: usize = 4096;

/// An input that broke a promise.
#[derive(Debug, Clone)]
pub struct Finding {
    /// `panic` or `violation`.
    pub kind: &'static str,
    /// The panic message or the broken promise.
    pub message: String,
    /// Where the input was saved.
    pub input: PathBuf,
}

/// What a fuzz run did.
#[derive(Debug, Clone)]
pub struct Report {
    /// The target.
    pub target: Target,
    /// Seconds spent.
    pub seconds: f64,
    /// Inputs run (seeds included).
    pub executions: u64,
    /// Corpus size at the end.
    pub corpus: usize,
    /// Distinct outcome kinds seen.
    pub outcome_kinds: usize,
    /// Slowest single input, seconds.
    pub slowest_s: f64,
    /// Largest single allocation, bytes (0 unless [`alloc::FUZZ_ALLOC`] is the
    /// global allocator).
    pub largest_allocation: usize,
    /// Panics and broken promises.
    pub findings: Vec<Finding>,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {:.0} s, {} executions ({:.1}/s), corpus {}, {} outcome kinds, slowest {:.2} s, \
             largest allocation {:.1} MiB, {} findings",
            self.target.name(),
            self.seconds,
            self.executions,
            self.executions as f64 / self.seconds.max(1e-9),
            self.corpus,
            self.outcome_kinds,
            self.slowest_s,
            self.largest_allocation as f64 / (1 << 20) as f64,
            self.findings.len()
        )
    }
}

/// Milliseconds since `EPOCH` at which the running input started; 0 when idle.
static RUNNING_SINCE_MS: AtomicU64 = AtomicU64::new(0);
static EPOCH: OnceLock<Instant> = OnceLock::new();
/// Location and message of the last panic (the hook's copy).
static LAST_PANIC: Mutex<String> = Mutex::new(String::new());
/// Where the running input is written (the current target's `current-input`).
static CURRENT_INPUT: Mutex<PathBuf> = Mutex::new(PathBuf::new());

fn now_ms() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// Starts the hang watchdog once per process: an input running longer than
/// `limit` is saved as `hang-<ms>` next to `current` and the process exits with
/// status 3 (nothing else can stop a hung call).
fn watchdog(limit: Duration) {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(Duration::from_millis(100));
                let since = RUNNING_SINCE_MS.load(Ordering::SeqCst);
                if since != 0 && now_ms().saturating_sub(since) > limit.as_millis() as u64 {
                    let path = CURRENT_INPUT.lock().map(|p| p.clone()).unwrap_or_default();
                    let saved = path.with_file_name(format!("hang-{}", now_ms()));
                    let _ = std::fs::copy(&path, &saved);
                    eprintln!(
                        "fuzz: an input ran over {} s: saved as {}",
                        limit.as_secs(),
                        saved.display()
                    );
                    std::process::exit(3);
                }
            }
        });
    });
}

fn save(dir: &Path, prefix: &str, data: &[u8]) -> PathBuf {
    let hash = hex::encode(&Sha256::digest(data)[..8]);
    let path = dir.join(format!("{prefix}-{hash}"));
    let _ = std::fs::write(&path, data);
    path
}

/// Fuzzes `target` for `duration`: the seeds first, then mutants. Inputs that
/// break a promise are saved under `artifacts/<target>/`.
pub fn fuzz(
    fixture: &Fixture,
    target: Target,
    duration: Duration,
    seed: u64,
    artifacts: &Path,
    hang_limit: Duration,
) -> Result<Report, String> {
    let dir = artifacts.join(target.name());
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let current_path = dir.join("current-input");
    *CURRENT_INPUT.lock().map_err(|e| e.to_string())? = current_path.clone();
    watchdog(hang_limit);
    let previous_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|info| {
        if let Ok(mut last) = LAST_PANIC.lock() {
            *last = info.to_string();
        }
    }));

    alloc::reset_largest();
    let started = Instant::now();
    let mut corpus = fixture.seeds(target)?;
    let seeds = corpus.len();
    let mut kinds = std::collections::HashSet::new();
    let mut findings: Vec<Finding> = Vec::new();
    let mut seen_messages = std::collections::HashSet::new();
    let mut mutator = Mutator::new(ChaCha8Rng::seed_from_u64(seed), target.max_len());
    let mut executions = 0u64;
    let mut slowest = 0f64;
    let mut next = 0usize;
    while next < seeds || started.elapsed() < duration {
        // The watchdog also covers generating the input: a mutation that never
        // ends is a fuzzer bug worth seeing (the saved input is the previous one).
        RUNNING_SINCE_MS.store(now_ms(), Ordering::SeqCst);
        let input = if next < seeds {
            corpus[next].clone()
        } else {
            let a = mutator.below(corpus.len());
            let b = mutator.below(corpus.len());
            mutator.mutate(&corpus[a], &corpus[b])
        };
        next += 1;
        std::fs::write(&current_path, &input)
            .map_err(|e| format!("{}: {e}", current_path.display()))?;
        let t0 = Instant::now();
        RUNNING_SINCE_MS.store(now_ms(), Ordering::SeqCst);
        let outcome = catch_unwind(AssertUnwindSafe(|| fixture.run(target, &input)));
        RUNNING_SINCE_MS.store(0, Ordering::SeqCst);
        slowest = slowest.max(t0.elapsed().as_secs_f64());
        executions += 1;
        let (kind, finding) = match outcome {
            Ok(Ok(kind)) => (kind, None),
            Ok(Err(broken)) => (format!("violation {broken}"), Some(("violation", broken))),
            Err(_) => {
                let message = LAST_PANIC.lock().map(|m| m.clone()).unwrap_or_default();
                (format!("panic {message}"), Some(("panic", message)))
            }
        };
        // One saved input per kind of finding: a broken promise that quotes the
        // input would otherwise save every input that breaks it.
        if let Some((what, message)) = finding
            && seen_messages.insert(crate::targets::kind(&message))
        {
            let input_path = save(
                &dir,
                if what == "panic" {
                    "crash"
                } else {
                    "violation"
                },
                &input,
            );
            eprintln!(
                "fuzz {}: {what}: {message}\n  input: {}",
                target.name(),
                input_path.display()
            );
            findings.push(Finding {
                kind: what,
                message,
                input: input_path,
            });
        }
        if kinds.insert(kind) && next > seeds && corpus.len() < MAX_CORPUS {
            corpus.push(input);
        }
    }
    std::panic::set_hook(previous_hook);
    let _ = std::fs::remove_file(&current_path);
    Ok(Report {
        target,
        seconds: started.elapsed().as_secs_f64(),
        executions,
        corpus: corpus.len(),
        outcome_kinds: kinds.len(),
        slowest_s: slowest,
        largest_allocation: alloc::largest_allocation(),
        findings,
    })
}

/// Replays saved inputs (regression files) through `target`: the first panic or
/// broken promise, named with its file.
pub fn replay(fixture: &Fixture, target: Target, files: &[PathBuf]) -> Result<usize, String> {
    for file in files {
        let data = std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?;
        match catch_unwind(AssertUnwindSafe(|| fixture.run(target, &data))) {
            Ok(Ok(_)) => {}
            Ok(Err(broken)) => return Err(format!("{}: {broken}", file.display())),
            Err(_) => return Err(format!("{}: panicked", file.display())),
        }
    }
    Ok(files.len())
}
