//! The result types of a scored query, at the bottom of the bench crate: a query's
//! status, its metrics (throughput, tokens, cost) and its accuracy (agreement counts,
//! output quality, the good/bad assessment with its reasons), and the rounding they
//! are computed with. Pure data and arithmetic: `run_file` (run.json), `scoring`,
//! `reference`, `tokens` and the reports depend on this module, and it on none of
//! them, so those modules import no circle.

use serde::{Deserialize, Serialize};

/// Rounds to 6 decimals (SPEC §D.2).
pub fn r6(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

fn ratio(num: u64, den: u64) -> f64 {
    if den == 0 {
        0.0
    } else {
        r6(num as f64 / den as f64)
    }
}

fn harmonic(p: f64, r: f64) -> f64 {
    if p + r == 0.0 {
        0.0
    } else {
        r6(2.0 * p * r / (p + r))
    }
}

/// TRUE/FALSE agreement counts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BinaryCounts {
    /// Answers compared.
    pub evaluated: u64,
    /// Answers equal to the label.
    pub correct: u64,
    /// TRUE answered, TRUE labelled.
    pub tp: u64,
    /// FALSE answered, FALSE labelled.
    pub tn: u64,
    /// TRUE answered, FALSE labelled.
    pub fp: u64,
    /// FALSE answered, TRUE labelled.
    #[serde(rename = "fn")]
    pub fn_: u64,
    /// correct / evaluated.
    pub accuracy: f64,
    /// tp / (tp + fp).
    pub precision: f64,
    /// tp / (tp + fn).
    pub recall: f64,
    /// Harmonic mean of precision and recall.
    pub f1: f64,
}

impl BinaryCounts {
    pub(crate) fn add(&mut self, answer: bool, label: bool) {
        self.evaluated += 1;
        match (answer, label) {
            (true, true) => self.tp += 1,
            (false, false) => self.tn += 1,
            (true, false) => self.fp += 1,
            (false, true) => self.fn_ += 1,
        }
        self.correct = self.tp + self.tn;
    }

    pub(crate) fn merge(&mut self, o: &BinaryCounts) {
        self.evaluated += o.evaluated;
        self.tp += o.tp;
        self.tn += o.tn;
        self.fp += o.fp;
        self.fn_ += o.fn_;
        self.correct = self.tp + self.tn;
    }

    pub(crate) fn finish(mut self) -> Self {
        self.accuracy = ratio(self.correct, self.evaluated);
        self.precision = ratio(self.tp, self.tp + self.fp);
        self.recall = ratio(self.tp, self.tp + self.fn_);
        self.f1 = harmonic(self.precision, self.recall);
        self
    }
}

/// Classification agreement counts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LabelCounts {
    /// Labels equal to the reference.
    pub correct: u64,
    /// Labels compared.
    pub evaluated: u64,
    /// Joined rows without a reference label (excluded).
    pub unlabeled: u64,
    /// correct / evaluated (null when nothing was evaluated).
    pub accuracy: Option<f64>,
}

impl LabelCounts {
    pub(crate) fn merge(&mut self, o: &LabelCounts) {
        self.correct += o.correct;
        self.evaluated += o.evaluated;
        self.unlabeled += o.unlabeled;
    }

    pub(crate) fn finish(mut self) -> Self {
        self.accuracy =
            (self.evaluated > 0).then(|| r6(self.correct as f64 / self.evaluated as f64));
        self
    }
}

/// Agreement of one predicate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum PredicateScore {
    /// A filter.
    Filter {
        /// Predicate key of the label set.
        predicate_key: String,
        /// Operator id.
        operator_id: String,
        /// Alias filtered.
        alias: String,
        /// Counts.
        #[serde(flatten)]
        counts: BinaryCounts,
    },
    /// A join.
    Join {
        /// Predicate key.
        predicate_key: String,
        /// Operator id.
        operator_id: String,
        /// Counts.
        #[serde(flatten)]
        counts: BinaryCounts,
    },
    /// A classification.
    Classify {
        /// Predicate key.
        predicate_key: String,
        /// Operator id.
        operator_id: String,
        /// Counts.
        #[serde(flatten)]
        counts: LabelCounts,
    },
}

/// Output quality on distinct tuples.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OutputAccuracy {
    /// Distinct output tuples.
    pub predicted_rows: u64,
    /// Distinct reference tuples.
    pub expected_rows: u64,
    /// Tuples in both.
    pub matching_rows: u64,
    /// matched / predicted.
    pub precision: f64,
    /// matched / expected.
    pub recall: f64,
    /// Harmonic mean.
    pub f1: f64,
    /// predicted = expected = matched.
    pub exact_match: bool,
    /// predicted − matched.
    pub false_positive_rows: u64,
    /// expected − matched.
    pub false_negative_rows: u64,
}

/// Output quality from the three counts.
pub fn output_accuracy(predicted: u64, expected: u64, matching: u64) -> OutputAccuracy {
    let (precision, recall, f1) = if predicted == 0 && expected == 0 {
        (1.0, 1.0, 1.0)
    } else {
        let p = ratio(matching, predicted);
        let r = ratio(matching, expected);
        (p, r, harmonic(p, r))
    };
    OutputAccuracy {
        predicted_rows: predicted,
        expected_rows: expected,
        matching_rows: matching,
        precision,
        recall,
        f1,
        exact_match: predicted == expected && expected == matching,
        false_positive_rows: predicted - matching,
        false_negative_rows: expected - matching,
    }
}

/// Everything SPEC §D.2 records about accuracy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Accuracy {
    /// Reference collection.
    pub ground_truth_collection_id: String,
    /// Model of the reference labels.
    pub ground_truth_reference_model: String,
    /// Filter and join answers pooled.
    pub answer_accuracy: BinaryCounts,
    /// Classifications pooled.
    pub label_accuracy: LabelCounts,
    /// Output tuples; null when the rows were not saved (they did not fit the
    /// disk: only their count and hash were kept).
    pub output_accuracy: Option<OutputAccuracy>,
    /// Per operator.
    pub per_predicate: Vec<PredicateScore>,
    /// Σ over relations of table rows.
    pub input_document_rows: u64,
    /// Distinct (table, id).
    pub unique_input_documents: u64,
}

/// Why a query's output is not the reference (Genie-style assessment reasons).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Reason {
    /// The output has no rows; the reference has some.
    EmptyResult,
    /// Reference rows are missing from the output.
    ResultMissingRows,
    /// The output has rows the reference does not.
    ResultExtraRows,
    /// Expected columns are missing.
    ResultMissingColumns,
    /// The output has columns the reference does not.
    ResultExtraColumns,
    /// A row has the reference ids but another label.
    LabelMismatch,
    /// The reference is empty; the output is not.
    EmptyReference,
    /// The rows did not fit the disk: only their count and hash were kept, so
    /// they could not be compared with the reference.
    ResultNotSaved,
}

impl Reason {
    /// The reason as written in run.json.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::EmptyResult => "EMPTY_RESULT",
            Reason::ResultMissingRows => "RESULT_MISSING_ROWS",
            Reason::ResultExtraRows => "RESULT_EXTRA_ROWS",
            Reason::ResultMissingColumns => "RESULT_MISSING_COLUMNS",
            Reason::ResultExtraColumns => "RESULT_EXTRA_COLUMNS",
            Reason::LabelMismatch => "LABEL_MISMATCH",
            Reason::EmptyReference => "EMPTY_REFERENCE",
            Reason::ResultNotSaved => "RESULT_NOT_SAVED",
        }
    }
}

/// Verdict on a query's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Output rows equal the reference.
    Good,
    /// They differ.
    Bad,
}

/// Verdict and reasons.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assessment {
    /// good or bad.
    pub verdict: Verdict,
    /// Sorted reasons (empty when good).
    pub reasons: Vec<Reason>,
}

/// The output quality of `predicted` rows against `expected`, `matching` of them
/// in both, and the assessment from the row-level `reasons` found, to which the
/// empty-side reasons are added here.
pub(crate) fn judged(
    predicted: u64,
    expected: u64,
    matching: u64,
    mut reasons: Vec<Reason>,
) -> (OutputAccuracy, Assessment) {
    if expected == 0 && predicted > 0 {
        reasons.push(Reason::EmptyReference);
    }
    if predicted == 0 && expected > 0 {
        reasons.push(Reason::EmptyResult);
    }
    reasons.sort();
    reasons.dedup();
    let quality = output_accuracy(predicted, expected, matching);
    let verdict = if reasons.is_empty() && quality.exact_match {
        Verdict::Good
    } else {
        Verdict::Bad
    };
    (quality, Assessment { verdict, reasons })
}

/// State of one query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueryStatus {
    /// Not started.
    Pending,
    /// The engine is running it.
    Running,
    /// Outputs are saved; scoring comes next.
    Saved,
    /// Saved and scored.
    Complete,
    /// The engine failed (or the run was interrupted during it).
    Failed,
    /// Outputs are saved but scoring failed.
    ScoringFailed,
    /// The engine exceeded `--timeout-s`.
    Timeout,
    /// The query spent its budget (`--max-fresh-tokens`, `--max-model-seconds`,
    /// `--max-cost-usd`) before it was done, under `--on-budget fail`.
    OverBudget,
}

impl QueryStatus {
    /// The status as written in run.json.
    pub fn as_str(self) -> &'static str {
        match self {
            QueryStatus::Pending => "pending",
            QueryStatus::Running => "running",
            QueryStatus::Saved => "saved",
            QueryStatus::Complete => "complete",
            QueryStatus::Failed => "failed",
            QueryStatus::ScoringFailed => "scoring_failed",
            QueryStatus::Timeout => "timeout",
            QueryStatus::OverBudget => "over_budget",
        }
    }
}

/// Throughput of a query: documents per second without joins, pairs per second with.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Throughput {
    /// Σ input rows / runtime.
    #[serde(rename = "documents_per_second")]
    Documents(Option<f64>),
    /// Evaluated document pairs / runtime.
    #[serde(rename = "document_pairs_per_second")]
    Pairs(Option<f64>),
}

impl Throughput {
    /// The value, if known.
    pub fn value(self) -> Option<f64> {
        match self {
            Throughput::Documents(v) | Throughput::Pairs(v) => v,
        }
    }

    /// The unit as the report names it.
    pub fn unit(self) -> &'static str {
        match self {
            Throughput::Documents(_) => "documents/second",
            Throughput::Pairs(_) => "document pairs/second",
        }
    }
}

/// Metrics of a scored query (SPEC §D.2, §D.4, §D.5). Unknown values are `null`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueryMetrics {
    /// Query execution seconds.
    pub runtime_s: f64,
    /// Rows of each alias's table.
    pub input_rows: std::collections::BTreeMap<String, u64>,
    /// Output and predicate agreement with the reference.
    pub accuracy: Accuracy,
    /// runtime × GPUs × hourly rate.
    pub cost_usd: Option<f64>,
    /// Full prompt lengths (KV hits included).
    pub input_tokens: Option<u64>,
    /// Engine-reported positions run through the model.
    pub fresh_tokens: Option<u64>,
    /// Positions an unlimited prefix cache must compute.
    pub minimum_tokens: Option<u64>,
    /// fresh − minimum.
    pub regret_tokens: Option<i64>,
    /// True when the minimum was rescaled to engine-reported input tokens.
    pub regret_approximate: bool,
    /// Σ rows of the join answer tables (join queries).
    pub evaluated_document_pairs: Option<u64>,
    /// Input tokens / runtime.
    pub input_tokens_per_second: Option<f64>,
    /// Cost per million input tokens.
    pub cost_usd_per_million_input_tokens: Option<f64>,
    /// 100 × regret / fresh.
    pub kv_regret_percent: Option<f64>,
    /// Documents or pairs per second.
    #[serde(flatten)]
    pub throughput: Throughput,
}

/// Token metrics after applying the engine's measurements (SPEC §D.4).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenMetrics {
    /// Input tokens.
    pub input_tokens: Option<u64>,
    /// Fresh tokens (engine-reported).
    pub fresh_tokens: Option<u64>,
    /// Minimum tokens.
    pub minimum_tokens: Option<u64>,
    /// fresh − minimum.
    pub regret_tokens: Option<i64>,
    /// Minimum rescaled to reported input tokens.
    pub regret_approximate: bool,
    /// 100 × regret / fresh.
    pub kv_regret_percent: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quality_counts_are_rounded_and_harmonic() {
        let q = output_accuracy(3, 2, 1);
        assert_eq!(q.precision, 0.333333);
        assert_eq!(q.recall, 0.5);
        assert_eq!(q.f1, 0.4);
        assert_eq!(
            (q.false_positive_rows, q.false_negative_rows, q.exact_match),
            (2, 1, false)
        );
        let q = output_accuracy(0, 4, 0);
        assert_eq!((q.precision, q.recall, q.f1), (0.0, 0.0, 0.0));
    }

    #[test]
    fn the_empty_sides_are_reasons_and_only_an_exact_match_is_good() {
        let (q, a) = judged(0, 0, 0, vec![]);
        assert!(q.exact_match && a.verdict == Verdict::Good && a.reasons.is_empty());
        let (_, a) = judged(0, 3, 0, vec![Reason::ResultMissingRows]);
        assert_eq!(a.verdict, Verdict::Bad);
        assert_eq!(a.reasons, [Reason::EmptyResult, Reason::ResultMissingRows]);
        let (_, a) = judged(
            2,
            0,
            0,
            vec![Reason::ResultExtraRows, Reason::ResultExtraRows],
        );
        assert_eq!(a.reasons, [Reason::ResultExtraRows, Reason::EmptyReference]);
        // No reasons found, but the counts differ: still bad.
        assert_eq!(judged(2, 2, 1, vec![]).1.verdict, Verdict::Bad);
    }

    #[test]
    fn binary_counts_pool_and_round() {
        let mut a = BinaryCounts::default();
        for (answer, label) in [(true, true), (true, false), (false, false)] {
            a.add(answer, label);
        }
        let mut b = BinaryCounts::default();
        b.add(false, true);
        a.merge(&b);
        let a = a.finish();
        assert_eq!(
            (a.evaluated, a.correct, a.tp, a.tn, a.fp, a.fn_),
            (4, 2, 1, 1, 1, 1)
        );
        assert_eq!(
            (a.accuracy, a.precision, a.recall, a.f1),
            (0.5, 0.5, 0.5, 0.5)
        );
        let l = LabelCounts::default().finish();
        assert_eq!(l.accuracy, None);
    }
}
