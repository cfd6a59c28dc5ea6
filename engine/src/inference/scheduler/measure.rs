//! A query's measurements: what the executor computed for it (fresh, label
//! and decoded tokens), what its KV tiers and look-ahead did, and the
//! scheduler's settings.

use super::{Executor, ScheduledBackend, ScheduledQuery};
use crate::inference::work::{Config, Max, Sum, Work};

impl<E: Executor> ScheduledBackend<E> {
    /// What the executor has computed so far, in all queries: a batch's work
    /// is what these grew by while it ran, and only this query's batches run
    /// between its begin and its end.
    pub(super) fn computed(&self) -> Computed {
        Computed {
            fresh: self.exec.fresh_tokens(),
            label: self.exec.label_tokens(),
            decode: self.exec.decode_tokens(),
            decode_seconds: self.exec.decode_seconds(),
            typed_masks: self.exec.typed_masks(),
        }
    }

    /// The query's measurements: what the executor computed for its calls,
    /// what the KV tiers did since it began, the look-ahead's counters and
    /// the scheduler's settings. (Locks in [`Self::run`]'s order: the query's
    /// state, then the tiers.)
    pub(super) fn query_work(&self, query: &ScheduledQuery<E>) -> Work {
        let state = query.state.lock().expect("query state lock");
        let keep = state.reuse_earlier_kv;
        let stored = self.store.is_some();
        let kv = self
            .kv
            .lock()
            .expect("scheduler KV lock")
            .counters()
            .since(&query.tiers_start);
        let ahead = &state.lookahead;
        let transfer = self.exec.simulated_link_bytes_per_second().map(|link| {
            let moved = (kv.offloaded_bytes + kv.restored_bytes) as f64;
            Sum(moved / link)
        });
        Work {
            kv_peak_bytes: Some(Max(kv.peak_bytes as u64)),
            kv_evictions: Some(Sum(kv.evictions)),
            kv_host_budget_bytes: Some(Config(self.config.host_kv_budget_bytes as u64)),
            kv_host_peak_bytes: Some(Max(kv.host_peak_bytes as u64)),
            kv_offloads: Some(Sum(kv.offloads)),
            restored_tokens: Some(Sum(kv.restored_tokens)),
            speculative_tokens: Some(Sum(ahead.tokens)),
            speculative_questions: Some(Sum(ahead.questions)),
            speculative_unused: Some(Sum(ahead.unused() as u64)),
            kv_restored_bytes: Some(Sum(kv.restored_bytes)),
            kv_offloaded_bytes: Some(Sum(kv.offloaded_bytes)),
            kv_transfer_seconds: transfer,
            kv_budget_bytes: Some(Config(self.config.kv_budget_bytes as u64)),
            batch_tokens: Some(Config(self.config.batch_tokens as u64)),
            prefix_cache: Some(Config(self.config.prefix_cache)),
            kv_kept_across_queries: keep.then_some(Config(true)),
            kv_held_at_start_tokens: keep.then_some(Sum(query.held_at_start_tokens)),
            kv_store_read_tokens: stored.then_some(Sum(kv.stored_read_tokens)),
            kv_store_read_bytes: stored.then_some(Sum(kv.stored_read_bytes)),
            kv_store_written_bytes: stored.then_some(Sum(kv.stored_written_bytes)),
            kv_store_rejected: stored.then_some(Sum(kv.stored_rejected)),
            ..query.work.lock().expect("query work lock").clone()
        }
    }
}

/// The executor's running counts ([`ScheduledBackend::computed`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Computed {
    fresh: u64,
    label: u64,
    decode: u64,
    decode_seconds: f64,
    typed_masks: (u64, f64),
}

impl Computed {
    /// What was computed between `start` and these counts, as [`Work`].
    pub(super) fn since(&self, start: &Computed) -> Work {
        Work {
            fresh_tokens: Some(Sum(self.fresh - start.fresh)),
            label_tokens: Some(Sum(self.label - start.label)),
            decode_tokens: Some(Sum(self.decode - start.decode)),
            decode_seconds: Some(Sum(self.decode_seconds - start.decode_seconds)),
            typed_masks: Some(Sum(self.typed_masks.0 - start.typed_masks.0)).filter(|n| n.0 > 0),
            typed_mask_seconds: Some(Sum(self.typed_masks.1 - start.typed_masks.1))
                .filter(|_| self.typed_masks.0 > start.typed_masks.0),
            ..Work::default()
        }
    }
}
