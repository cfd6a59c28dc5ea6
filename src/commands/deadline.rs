//! `--timeout-s` of `aisql query` and `aisql sql`: the query runs as a task,
//! raced against a timer on the command's thread, as `aisql bench` bounds each
//! query. Past the deadline the backend is told to stop (the model after the
//! forward batch in flight), the task is aborted (DataFusion stops at its next
//! batch) and the command fails at once: a worker thread still inside one
//! long computation (a nested-loop join over a large batch) is not waited for.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aisql_engine::EngineError;
use aisql_engine::data::row_sink::RowSink;
use aisql_engine::sql::QueryCanceller;
use datafusion::arrow::array::RecordBatch;
use tokio::runtime::Runtime;

/// A query that ran past `--timeout-s`.
#[derive(Debug)]
pub struct TimedOut {
    /// The limit.
    pub limit: Duration,
    /// Seconds from the deadline until the model's work stopped.
    pub model_stopped_after_s: f64,
}

impl std::fmt::Display for TimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the query ran past --timeout-s {} and was stopped (its model work {:.3} s after the deadline)",
            self.limit.as_secs_f64(),
            self.model_stopped_after_s
        )
    }
}

impl std::error::Error for TimedOut {}

/// Whether `err` is a [`TimedOut`].
pub fn timed_out(err: &anyhow::Error) -> bool {
    err.downcast_ref::<TimedOut>().is_some()
}

/// Runs `work` on `rt` to its end or until `limit` passes; then stops the
/// query `canceller` reaches, aborts `work`, shuts `rt` down without waiting
/// for it and fails with [`TimedOut`].
pub fn run<T: Send + 'static>(
    rt: Runtime,
    limit: Option<Duration>,
    canceller: &QueryCanceller,
    work: impl Future<Output = anyhow::Result<T>> + Send + 'static,
) -> anyhow::Result<T> {
    let Some(limit) = limit else {
        return rt.block_on(work);
    };
    let done = rt.block_on(async {
        let task = tokio::spawn(work);
        let abort = task.abort_handle();
        tokio::select! {
            done = task => return done.unwrap_or_else(|e| Err(task_failed(e))),
            _ = tokio::time::sleep(limit) => {}
        }
        let deadline = Instant::now();
        canceller.cancel();
        abort.abort();
        // The forward batch in flight runs to its end on a blocking thread.
        let waiting = canceller.clone();
        let _ = tokio::task::spawn_blocking(move || waiting.wait_stopped()).await;
        Err(TimedOut {
            limit,
            model_stopped_after_s: deadline.elapsed().as_secs_f64(),
        }
        .into())
    });
    if done.as_ref().is_err_and(timed_out) {
        rt.shutdown_background();
    }
    done
}

/// A query task that panicked or was cancelled.
fn task_failed(e: tokio::task::JoinError) -> anyhow::Error {
    match e.try_into_panic() {
        Ok(panic) => anyhow::anyhow!(
            "internal error (a bug in aisql; RUST_BACKTRACE=1 shows where): {}",
            aisql_engine::panic_hook::describe(panic.as_ref())
        ),
        Err(e) => anyhow::anyhow!("the query's task ended: {e}"),
    }
}

/// A row sink shared by the query's task and the command: past the deadline
/// the command [`Shared::take`]s it back with the rows pushed so far, and the
/// task, if it still runs, can push no more.
pub struct Shared<S>(Arc<Mutex<Option<S>>>);

impl<S> Shared<S> {
    /// Shares `sink`.
    pub fn new(sink: S) -> Self {
        Self(Arc::new(Mutex::new(Some(sink))))
    }

    /// Another handle on the same sink.
    pub fn handle(&self) -> Self {
        Self(self.0.clone())
    }

    /// Runs `f` on the sink, unless it was taken.
    pub fn with<R>(&self, f: impl FnOnce(&mut S) -> R) -> anyhow::Result<R> {
        let mut sink = self.0.lock().map_err(|_| {
            anyhow::anyhow!("the query's rows were lost (a panic while saving them)")
        })?;
        let sink = sink
            .as_mut()
            .ok_or_else(|| anyhow::anyhow!("the query was stopped; its rows are closed"))?;
        Ok(f(sink))
    }

    /// The sink, taken from every handle.
    pub fn take(&self) -> anyhow::Result<S> {
        self.0
            .lock()
            .map_err(|_| anyhow::anyhow!("the query's rows were lost (a panic while saving them)"))?
            .take()
            .ok_or_else(|| anyhow::anyhow!("the query's rows were taken twice (a bug in aisql)"))
    }
}

impl<S: RowSink> RowSink for Shared<S> {
    fn push(&mut self, batch: RecordBatch) -> aisql_engine::Result<()> {
        let mut sink = self
            .0
            .lock()
            .map_err(|_| EngineError::Data("the row sink was poisoned by a panic".into()))?;
        match sink.as_mut() {
            Some(sink) => sink.push(batch),
            None => Err(EngineError::Data(
                "the query was stopped; its rows are closed".into(),
            )),
        }
    }

    fn keeps_rows_in_memory(&self) -> bool {
        self.0
            .lock()
            .ok()
            .and_then(|s| s.as_ref().map(|s| s.keeps_rows_in_memory()))
            .unwrap_or(false)
    }
}
