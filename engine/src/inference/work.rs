//! What a query's AI work measured: [`Work`], one typed struct whose fields are
//! the measurements (`fresh_tokens`, `kv_peak_bytes`, …) and whose field types
//! say how two workers' figures combine ([`Sum`], [`Max`], [`Config`]).
//!
//! A query on a backend reports its `Work` with each batch of answers and in
//! all ([`crate::inference::backend::QueryBackend`]);
//! a sharded backend and a coordinator of remote workers combine theirs with
//! [`Work::merge`]; the query adds its budget and row-error reports; run.json's
//! `measurements` object, the reply a remote worker sends, the AI operator's
//! DataFusion metrics, bench's scoring and the CLI's summary all read this one
//! struct. It serialises (serde) as the JSON object run.json has always held:
//! the field names are the keys, in this order, and a measurement a backend
//! does not report (`None`) is left out, not written as `null`.
//!
//! Adding a measurement is one line in `work_fields!`'s list (its name, type
//! and doc) and the code that sets and reads it: its merge and its
//! serialisation come with the type.

use serde::{Deserialize, Serialize};

/// How one measurement combines with the same measurement of another worker.
pub trait Merge {
    /// Combines `other` (a later worker's figure) into `self`.
    fn merge(&mut self, other: &Self);
}

/// A count or a duration: workers' figures add up.
#[derive(Debug, Clone, Copy, Default, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Sum<T>(pub T);

/// A high-water mark (a peak of memory): the largest worker's figure.
#[derive(Debug, Clone, Copy, Default, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Max<T>(pub T);

/// A setting, not a measurement of work (a budget, a batch size), or a report
/// of the query as a whole: every worker has the same, so the first one's is
/// kept.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Config<T>(pub T);

impl<T: Copy + std::ops::AddAssign> Merge for Sum<T> {
    fn merge(&mut self, other: &Self) {
        self.0 += other.0;
    }
}

impl<T: Copy + PartialOrd> Merge for Max<T> {
    fn merge(&mut self, other: &Self) {
        if other.0 > self.0 {
            self.0 = other.0;
        }
    }
}

impl<T> Merge for Config<T> {
    fn merge(&mut self, _: &Self) {}
}

/// A measurement only some backends report: one that a worker leaves out
/// takes the other's figure, as if it had not been there.
impl<T: Merge + Clone> Merge for Option<T> {
    fn merge(&mut self, other: &Self) {
        match (self.as_mut(), other) {
            (Some(mine), Some(theirs)) => mine.merge(theirs),
            (None, Some(theirs)) => *self = Some(theirs.clone()),
            (_, None) => {}
        }
    }
}

/// One worker's share of a sharded query (`workers` in the measurements), in
/// worker order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerShare {
    /// The worker's fresh tokens (`null` when its backend counts none).
    pub fresh_tokens: Option<u64>,
    /// Questions sent to it.
    pub questions: u64,
    /// Seconds it spent answering.
    pub busy_s: f64,
    /// Its KV peak (`null` when its backend keeps no KV).
    pub kv_peak_bytes: Option<u64>,
}

/// Declares [`Work`] from its list of measurements, each `Option<type>`
/// (absent: not reported), with [`Work::merge`] and [`Work::KEYS`] derived
/// from the same list, so a new measurement is one line.
macro_rules! work_fields {
    ($($(#[doc = $doc:literal])+ $name:ident: $ty:ty,)+) => {
        /// The measurements of a query's AI work so far (see the module doc).
        /// Field order is run.json's key order.
        #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
        #[serde(default)]
        pub struct Work {
            $(
                $(#[doc = $doc])+
                #[serde(skip_serializing_if = "Option::is_none")]
                pub $name: Option<$ty>,
            )+
        }

        impl Work {
            /// The measurements' names, as serialised, in order.
            pub const KEYS: &[&str] = &[$(stringify!($name)),+];

            /// Adds another worker's (or shard's) work to this: each field by
            /// its type's rule.
            pub fn merge(&mut self, other: &Work) {
                $(Merge::merge(&mut self.$name, &other.$name);)+
            }
        }
    };
}

work_fields! {
    /// Positions the model computed (prefill and decode), what the prefix
    /// cache did not save.
    fresh_tokens: Sum<u64>,
    /// Positions of answer labels scored.
    label_tokens: Sum<u64>,
    /// Positions generated (part of `fresh_tokens`).
    decode_tokens: Sum<u64>,
    /// Seconds spent generating them.
    decode_seconds: Sum<f64>,
    /// Token masks computed for typed answers (one per decoded token of a
    /// typed field).
    typed_masks: Sum<u64>,
    /// Seconds spent computing them (part of `decode_seconds`).
    typed_mask_seconds: Sum<f64>,
    /// Whether the prefix cache was on.
    prefix_cache: Config<bool>,
    /// Most KV bytes held on the device at once.
    kv_peak_bytes: Max<u64>,
    /// KV entries dropped to stay in the budget.
    kv_evictions: Sum<u64>,
    /// The host KV tier's budget.
    kv_host_budget_bytes: Config<u64>,
    /// Most KV bytes held in host memory at once.
    kv_host_peak_bytes: Max<u64>,
    /// KV entries moved from the device to the host.
    kv_offloads: Sum<u64>,
    /// Positions brought back from the host instead of recomputed.
    restored_tokens: Sum<u64>,
    /// Positions computed ahead for questions not yet asked.
    speculative_tokens: Sum<u64>,
    /// Questions looked ahead at.
    speculative_questions: Sum<u64>,
    /// Of those, the ones never asked.
    speculative_unused: Sum<u64>,
    /// KV bytes copied back from the host.
    kv_restored_bytes: Sum<u64>,
    /// KV bytes copied to the host.
    kv_offloaded_bytes: Sum<u64>,
    /// Seconds those copies take on the simulated link (simulation only).
    kv_transfer_seconds: Sum<f64>,
    /// The device KV budget.
    kv_budget_bytes: Config<u64>,
    /// Tokens per forward batch.
    batch_tokens: Config<u64>,
    /// Whether the query used the KV earlier queries left (reported only
    /// when it did).
    kv_kept_across_queries: Config<bool>,
    /// KV positions held when the query began: what earlier queries left it
    /// (reported only when it used them).
    kv_held_at_start_tokens: Sum<u64>,
    /// Positions read from the on-disk KV store instead of computed (with
    /// `--kv-store` only).
    kv_store_read_tokens: Sum<u64>,
    /// Bytes read from it.
    kv_store_read_bytes: Sum<u64>,
    /// Bytes written to it.
    kv_store_written_bytes: Sum<u64>,
    /// Blocks found there that failed their checks (damaged, cut short,
    /// another model's, another key's): computed instead, never used.
    kv_store_rejected: Sum<u64>,
    /// Each worker's share (sharded backends only).
    workers: Config<Vec<WorkerShare>>,
    /// The busiest worker's fresh tokens over the mean (sharded backends
    /// only): 1 is perfect balance.
    worker_fresh_max_over_mean: Max<f64>,
    /// Answers the persistent answer cache gave.
    answer_cache_reused: Sum<u64>,
    /// Questions it passed on to the model.
    answer_cache_asked: Sum<u64>,
    /// The query's budget report ([`crate::exec::coverage`]), with a budget.
    budget: Config<serde_json::Value>,
    /// The query's failed rows ([`crate::exec::coverage`]), under
    /// `--on-row-error null`.
    row_errors: Config<serde_json::Value>,
    /// The process's peak resident memory during the query (bench runs).
    peak_rss_bytes: Max<u64>,
    /// Prompt tokens, as engines that count them report (SPEC §D.4); aisql's
    /// backends report `fresh_tokens` instead.
    input_tokens: Sum<u64>,
    /// Document pairs a join evaluated, as other engines report (SPEC §D.4).
    evaluated_document_pairs: Sum<u64>,
}

impl Work {
    /// `fresh_tokens`, 0 when not reported.
    pub fn fresh(&self) -> u64 {
        self.fresh_tokens.map_or(0, |s| s.0)
    }

    /// `decode_tokens`, 0 when not reported.
    pub fn decoded(&self) -> u64 {
        self.decode_tokens.map_or(0, |s| s.0)
    }

    /// The JSON object run.json holds.
    pub fn to_json(&self) -> serde_json::Map<String, serde_json::Value> {
        match serde_json::to_value(self).expect("work serialises") {
            serde_json::Value::Object(m) => m,
            _ => unreachable!("a struct serialises as an object"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(fresh: u64, peak: u64, seconds: f64) -> Work {
        Work {
            fresh_tokens: Some(Sum(fresh)),
            decode_seconds: Some(Sum(seconds)),
            kv_peak_bytes: Some(Max(peak)),
            kv_budget_bytes: Some(Config(100)),
            prefix_cache: Some(Config(true)),
            kv_transfer_seconds: Some(Sum(0.5)),
            ..Work::default()
        }
    }

    #[test]
    fn merge_sums_counts_keeps_peaks_and_the_first_configuration() {
        let mut total = Work::default();
        total.merge(&worker(10, 5, 0.25));
        let mut second = worker(30, 9, 0.5);
        second.kv_budget_bytes = Some(Config(200));
        second.prefix_cache = Some(Config(false));
        total.merge(&second);
        assert_eq!(total.fresh_tokens, Some(Sum(40)));
        assert_eq!(total.kv_peak_bytes, Some(Max(9)));
        assert_eq!(total.decode_seconds, Some(Sum(0.75)));
        assert_eq!(total.kv_transfer_seconds, Some(Sum(1.0)));
        assert_eq!(total.kv_budget_bytes, Some(Config(100)));
        assert_eq!(total.prefix_cache, Some(Config(true)));
        // What neither reported stays unreported.
        assert_eq!(total.label_tokens, None);
        // A peak is the largest whichever worker comes first.
        let mut other = worker(1, 9, 0.0);
        other.merge(&worker(1, 5, 0.0));
        assert_eq!(other.kv_peak_bytes, Some(Max(9)));
    }

    #[test]
    fn a_measurement_one_worker_leaves_out_takes_the_others() {
        let mut total = Work::default();
        total.merge(&Work::default());
        assert_eq!(total, Work::default());
        let mut with = Work {
            answer_cache_reused: Some(Sum(3)),
            ..Work::default()
        };
        with.merge(&Work::default());
        total.merge(&with);
        assert_eq!(total.answer_cache_reused, Some(Sum(3)));
    }

    #[test]
    fn serialises_under_the_old_names_in_order_leaving_out_the_unreported() {
        let keys = [
            "fresh_tokens",
            "label_tokens",
            "decode_tokens",
            "decode_seconds",
            "typed_masks",
            "typed_mask_seconds",
            "prefix_cache",
            "kv_peak_bytes",
            "kv_evictions",
            "kv_host_budget_bytes",
            "kv_host_peak_bytes",
            "kv_offloads",
            "restored_tokens",
            "speculative_tokens",
            "speculative_questions",
            "speculative_unused",
            "kv_restored_bytes",
            "kv_offloaded_bytes",
            "kv_transfer_seconds",
            "kv_budget_bytes",
            "batch_tokens",
            "kv_kept_across_queries",
            "kv_held_at_start_tokens",
            "kv_store_read_tokens",
            "kv_store_read_bytes",
            "kv_store_written_bytes",
            "kv_store_rejected",
            "workers",
            "worker_fresh_max_over_mean",
            "answer_cache_reused",
            "answer_cache_asked",
            "budget",
            "row_errors",
            "peak_rss_bytes",
            "input_tokens",
            "evaluated_document_pairs",
        ];
        assert_eq!(Work::KEYS, keys);
        assert_eq!(serde_json::to_string(&Work::default()).unwrap(), "{}");
        let w = worker(7, 3, 0.0);
        assert_eq!(
            serde_json::to_string(&w).unwrap(),
            r#"{"fresh_tokens":7,"decode_seconds":0.0,"prefix_cache":true,"kv_peak_bytes":3,"kv_transfer_seconds":0.5,"kv_budget_bytes":100}"#
        );
        let shares = Work {
            workers: Some(Config(vec![WorkerShare {
                fresh_tokens: Some(4),
                questions: 2,
                busy_s: 0.5,
                kv_peak_bytes: None,
            }])),
            ..Work::default()
        };
        assert_eq!(
            serde_json::to_string(&shares).unwrap(),
            r#"{"workers":[{"fresh_tokens":4,"questions":2,"busy_s":0.5,"kv_peak_bytes":null}]}"#
        );
    }

    #[test]
    fn round_trips_through_json() {
        let mut w = worker(7, 3, 1.5);
        w.workers = Some(Config(vec![WorkerShare::default(); 2]));
        w.worker_fresh_max_over_mean = Some(Max(1.25));
        w.budget = Some(Config(serde_json::json!({"exhausted": false})));
        w.peak_rss_bytes = Some(Max(1 << 30));
        let text = serde_json::to_string(&w).unwrap();
        let back: Work = serde_json::from_str(&text).unwrap();
        assert_eq!(back, w);
        assert_eq!(serde_json::to_string(&back).unwrap(), text);
        assert_eq!(serde_json::Value::Object(w.to_json()).to_string(), text);
        // Keys of other engines or versions are read past, not refused.
        let other: Work = serde_json::from_str(r#"{"fresh_tokens":1,"model_calls":2}"#).unwrap();
        assert_eq!(other.fresh(), 1);
    }
}
