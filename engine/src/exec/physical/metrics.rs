//! An AI operator's metrics as `EXPLAIN ANALYZE` shows them: DataFusion's
//! baseline, the questions and work of its batches, and each worker's share.

use super::*;

/// An AI operator's metrics, shown by `EXPLAIN ANALYZE`.
#[derive(Debug)]
pub(super) struct AiMetrics {
    pub(super) baseline: BaselineMetrics,
    pub(super) input_rows: Count,
    pub(super) prompts: Count,
    pub(super) fresh_tokens: Count,
    /// Positions decoded by generating calls (part of `fresh_tokens`).
    pub(super) decode_tokens: Count,
    pub(super) model_time: Time,
    /// Rows the model could not answer, NULL under `--on-row-error null`
    /// (registered under that policy only).
    pub(super) rows_failed: Option<Count>,
    /// Rows left out because the budget was spent (registered with a budget).
    pub(super) rows_not_reached: Option<Count>,
    /// Where per-worker metrics are added once workers report.
    pub(super) set: ExecutionPlanMetricsSet,
    /// `workerN_fresh_tokens`, `workerN_questions`, `workerN_busy` and
    /// `workerN_kv_peak_bytes` of this operator, on several workers.
    pub(super) workers: std::sync::Mutex<Vec<WorkerMetrics>>,
}

/// One worker's share of an operator's work.
#[derive(Debug)]
pub(super) struct WorkerMetrics {
    fresh_tokens: Count,
    questions: Count,
    busy: Time,
    kv_peak_bytes: Gauge,
}

impl AiMetrics {
    pub(super) fn new(set: &ExecutionPlanMetricsSet, controls: &QueryControls) -> Self {
        let null_rows = matches!(controls.on_row_error(), OnRowError::Null { .. });
        Self {
            baseline: BaselineMetrics::new(set, 0),
            input_rows: MetricBuilder::new(set).counter("input_rows", 0),
            prompts: MetricBuilder::new(set).counter("model_calls", 0),
            fresh_tokens: MetricBuilder::new(set).counter("fresh_tokens", 0),
            decode_tokens: MetricBuilder::new(set).counter("decode_tokens", 0),
            model_time: MetricBuilder::new(set).subset_time("model_time", 0),
            rows_failed: null_rows.then(|| MetricBuilder::new(set).counter("rows_failed", 0)),
            rows_not_reached: controls
                .budget()
                .map(|_| MetricBuilder::new(set).counter("rows_not_reached", 0)),
            set: set.clone(),
            workers: Default::default(),
        }
    }

    /// Adds a batch's work to the totals and per worker.
    pub(super) fn add_work(&self, batch: &Work) {
        self.fresh_tokens.add(batch.fresh() as usize);
        self.decode_tokens.add(batch.decoded() as usize);
        let Some(Config(shares)) = &batch.workers else {
            return;
        };
        if shares.len() < 2 {
            return;
        }
        let mut workers = self.workers.lock().expect("worker metrics lock");
        while workers.len() < shares.len() {
            let i = workers.len();
            let b = || MetricBuilder::new(&self.set);
            workers.push(WorkerMetrics {
                fresh_tokens: b().counter(format!("worker{i}_fresh_tokens"), 0),
                questions: b().counter(format!("worker{i}_questions"), 0),
                busy: b().subset_time(format!("worker{i}_busy"), 0),
                kv_peak_bytes: b().gauge(format!("worker{i}_kv_peak_bytes"), 0),
            });
        }
        for (share, m) in shares.iter().zip(workers.iter()) {
            m.fresh_tokens.add(share.fresh_tokens.unwrap_or(0) as usize);
            m.questions.add(share.questions as usize);
            m.busy
                .add_duration(std::time::Duration::from_secs_f64(share.busy_s.max(0.0)));
            m.kv_peak_bytes
                .set_max(share.kv_peak_bytes.unwrap_or(0) as usize);
        }
    }
}
