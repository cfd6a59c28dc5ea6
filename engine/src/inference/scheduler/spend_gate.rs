//! The spend gate: whether a forward batch may run, and what it cost the
//! query's spend budget (`--max-fresh-tokens`, `--max-model-seconds`,
//! `--max-cost-usd`, [`crate::limits::spend`]).
//!
//! Not the KV budget ([`super::kv_budget`]), which bounds the memory KV may
//! hold: the spend budget bounds the work the model does for one query. Every
//! forward batch of the scheduler goes through [`SpendGate::forward`], so a
//! cancelled query or a spent budget stops before the next batch, and each
//! batch is charged once, right after it ran.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use crate::error::{EngineError, Result};
use crate::inference::backend::{AiRequest, Answer};
use crate::limits::query_gate::Ticket;
use crate::limits::spend::Spend;

/// One query's spend meter, the gate of each of its forward batches.
#[derive(Default)]
pub(super) struct SpendGate {
    /// The query's spend meter, if it has a spend budget.
    meter: Option<Arc<Spend>>,
}

impl SpendGate {
    /// The gate of a query with `meter` (if it has a spend budget).
    pub(super) fn new(meter: Option<Arc<Spend>>) -> Self {
        Self { meter }
    }

    fn meter(&self) -> Option<Arc<Spend>> {
        self.meter.clone()
    }

    /// Whether the query's spend budget is spent.
    pub(super) fn spent(&self) -> bool {
        self.meter().is_some_and(|s| s.reached().is_some())
    }

    /// Runs one forward batch of `op_id`'s work: `work(stopped)` calls the
    /// model, where `stopped()` tells a generation to give up between two
    /// decode steps. The batch does not start once the query is cancelled
    /// (`stop`) or its spend budget is spent ([`EngineError::OverBudget`]);
    /// what it computed (the growth of `fresh_tokens()` while it ran, wall
    /// time) is charged after. The executor runs one batch at a time (the
    /// scheduler holds its KV lock), so that growth is this batch's alone,
    /// whatever other queries run on the backend.
    pub(super) fn forward<T>(
        &self,
        stop: &Ticket,
        op_id: &str,
        fresh_tokens: &dyn Fn() -> u64,
        work: impl FnOnce(&dyn Fn() -> bool) -> Result<T>,
    ) -> Result<T> {
        stop.check(op_id)?;
        let Some(spend) = self.meter() else {
            return work(&|| stop.check(op_id).is_err());
        };
        if let Some(limit) = spend.reached() {
            return Err(EngineError::OverBudget(spend.describe(limit)));
        }
        let started = Instant::now();
        let before = fresh_tokens();
        let uncharged = || fresh_tokens().saturating_sub(before);
        let stopped = || {
            stop.check(op_id).is_err()
                || spend.reached_with(uncharged(), started.elapsed()).is_some()
        };
        let out = work(&stopped);
        spend.charge(uncharged(), started.elapsed());
        out
    }

    /// `Ok` when `e` is model work the spent budget stopped (a batch refused
    /// before it started, a generation given up between decode steps) in a
    /// query not cancelled: the questions left are unreached. `Err(e)`
    /// otherwise.
    pub(super) fn stopped_by_spend(
        &self,
        stop: &Ticket,
        op_id: &str,
        e: EngineError,
    ) -> Result<()> {
        stop.check(op_id)?;
        let stopped = matches!(
            e,
            EngineError::OverBudget(_) | EngineError::Model(aisql_models::ModelError::Stopped)
        );
        if stopped && self.spent() {
            Ok(())
        } else {
            Err(e)
        }
    }

    /// `fitting` (indices of `requests`) cut into runs of about one forward
    /// batch (`batch_tokens` of document tokens, each anchor counted once)
    /// when the query has a spend budget: each run is answered before the
    /// next starts, so a spent budget loses at most one run's answers.
    /// Without one: one run.
    pub(super) fn runs(
        &self,
        requests: &[AiRequest<'_>],
        fitting: &[usize],
        anchors: &[Arc<Vec<u32>>],
        partners: &[Arc<Vec<u32>>],
        batch_tokens: usize,
    ) -> Vec<Vec<usize>> {
        if self.meter().is_none() {
            return vec![fitting.to_vec()];
        }
        let mut runs = Vec::new();
        let mut run = Vec::new();
        let mut tokens = 0;
        let mut seen: HashSet<&str> = HashSet::new();
        for &i in fitting {
            let mut cost = partners.get(i).map_or(0, |p| p.len());
            if seen.insert(requests[i].anchor.id) {
                cost += anchors[i].len();
            }
            if !run.is_empty() && tokens + cost > batch_tokens {
                runs.push(std::mem::take(&mut run));
                tokens = 0;
            }
            run.push(i);
            tokens += cost;
        }
        if !run.is_empty() {
            runs.push(run);
        }
        runs
    }
}

/// Fills `answers` up to `want` with [`Answer::Unreached`]: the requests a
/// spent budget stopped before.
pub(super) fn unreached_after(answers: &mut Vec<Answer>, want: usize) {
    if answers.len() < want {
        answers.resize(want, Answer::Unreached);
    }
}
