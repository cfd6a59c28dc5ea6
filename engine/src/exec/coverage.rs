//! What a query's AI operators do with rows that get no answer, and the
//! ledger of how many did.
//!
//! Two kinds of row get none. A row the model cannot answer (its prompt is
//! longer than the model's context, its generated tokens are not text) comes
//! back as [`Answer::Failed`]: `--on-row-error fail` fails the query naming it,
//! `null` makes that row's AI value NULL (a filter or join drops it, as SQL
//! drops a NULL condition), up to `--max-error-ratio` of an operator's rows. A
//! row the model did not get to because the query's budget was spent comes
//! back as [`Answer::Unreached`]: the query fails naming the budget, or with
//! `--on-budget partial` the row is left out — never given a made-up value.
//!
//! [`QueryControls`] holds both policies for a session and, per query, the
//! budget meter and each operator's rows answered, failed and not reached:
//! what the measurements (`budget`, `row_errors`), run.json and the CLI
//! summary report.

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use crate::error::{EngineError, Result};
use crate::inference::backend::{AiCall, Answer};
use crate::inference::work::{Config, Work};
use crate::limits::spend::{Budget, OnBudget, Spend};

/// What a row the model cannot answer does.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum OnRowError {
    /// The query fails, naming the row.
    #[default]
    Fail,
    /// That row's AI value is NULL; the query fails once more than
    /// `max_ratio` of an operator's rows failed (1: never).
    Null {
        /// The largest fraction of an operator's rows that may fail.
        max_ratio: f64,
    },
}

/// Failed rows listed by name and reason per operator; the rest are counted.
pub const LISTED_FAILURES: usize = 5;

/// One AI operator's rows so far in the query.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OperatorRows {
    /// Operator id.
    pub op_id: String,
    /// Rows (for a join: document pairs) the model answered.
    pub answered: u64,
    /// Rows the model could not answer (NULL under `--on-row-error null`).
    pub failed: u64,
    /// Rows left out because the budget was spent first.
    pub unreached: u64,
    /// The first [`LISTED_FAILURES`] failed rows: (row, reason).
    pub first_failures: Vec<(String, String)>,
}

impl OperatorRows {
    fn new(op_id: &str) -> Self {
        Self {
            op_id: op_id.to_string(),
            ..Self::default()
        }
    }
}

/// How many of a batch's answers were failed rows and unreached rows, once
/// [`QueryControls::settle`] let them stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Settled {
    /// Failed rows, NULL from here on.
    pub failed: usize,
    /// Unreached rows, left out from here on.
    pub unreached: usize,
}

/// The running query's meter and ledger.
#[derive(Debug, Default)]
struct QueryLedger {
    spend: Option<Arc<Spend>>,
    operators: Vec<OperatorRows>,
}

impl QueryLedger {
    fn operator(&mut self, op_id: &str) -> &mut OperatorRows {
        match self.operators.iter().position(|o| o.op_id == op_id) {
            Some(i) => &mut self.operators[i],
            None => {
                self.operators.push(OperatorRows::new(op_id));
                self.operators.last_mut().expect("just pushed")
            }
        }
    }
}

/// A session's budget and row-error policy, and the running query's ledger,
/// shared by its AI operators.
#[derive(Debug, Default)]
pub struct QueryControls {
    budget: Option<Budget>,
    on_row_error: OnRowError,
    query: Mutex<QueryLedger>,
}

impl QueryControls {
    /// Controls with `budget` per query (none: unlimited) and `on_row_error`.
    pub fn new(budget: Option<Budget>, on_row_error: OnRowError) -> Self {
        Self {
            budget,
            on_row_error,
            query: Mutex::default(),
        }
    }

    /// The budget of each query.
    pub fn budget(&self) -> Option<&Budget> {
        self.budget.as_ref()
    }

    /// What a failed row does.
    pub fn on_row_error(&self) -> OnRowError {
        self.on_row_error
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, QueryLedger> {
        self.query.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a query with AI operators `calls` (post-order): a fresh ledger,
    /// and a fresh meter when there is a budget, returned for the backend
    /// ([`crate::inference::backend::QueryStart::spend`]).
    pub fn start_query(&self, calls: &[AiCall]) -> Option<Arc<Spend>> {
        let spend = self.budget.map(|b| Arc::new(Spend::new(b.limits)));
        let mut ledger = self.ledger();
        ledger.spend = spend.clone();
        ledger.operators = calls.iter().map(|c| OperatorRows::new(&c.op_id)).collect();
        spend
    }

    /// Counts one batch of `op_id`'s answers and applies the policies: a
    /// failed row fails the query with its reason unless `--on-row-error null`
    /// (then it is listed and stays [`Answer::Failed`], NULL for the operator);
    /// an unreached row fails the query naming the budget unless
    /// `--on-budget partial` (then it stays [`Answer::Unreached`], left out).
    /// `row(i)` names answer `i`'s row for the list of failed rows.
    pub fn settle(
        &self,
        op_id: &str,
        answers: &[Answer],
        row: impl Fn(usize) -> String,
    ) -> Result<Settled> {
        let mut ledger = self.ledger();
        let mut settled = Settled::default();
        let on_row_error = self.on_row_error;
        let op = ledger.operator(op_id);
        for (i, a) in answers.iter().enumerate() {
            match a {
                Answer::Failed(reason) => {
                    if on_row_error == OnRowError::Fail {
                        return Err(EngineError::Inference(reason.to_string()));
                    }
                    op.failed += 1;
                    settled.failed += 1;
                    if op.first_failures.len() < LISTED_FAILURES {
                        op.first_failures.push((row(i), reason.to_string()));
                    }
                }
                Answer::Unreached => {
                    op.unreached += 1;
                    settled.unreached += 1;
                }
                _ => op.answered += 1,
            }
        }
        let partial = self.budget.is_some_and(|b| b.on_spent == OnBudget::Partial);
        if settled.unreached > 0 && !partial {
            return Err(EngineError::OverBudget(budget_message(&ledger)));
        }
        Ok(settled)
    }

    /// Ends the query: an error when an operator's failed rows are more than
    /// `--max-error-ratio` of its rows, naming the first of them.
    pub fn finish(&self) -> Result<()> {
        let OnRowError::Null { max_ratio } = self.on_row_error else {
            return Ok(());
        };
        let ledger = self.ledger();
        for op in &ledger.operators {
            let rows = op.answered + op.failed;
            if op.failed as f64 > max_ratio * rows as f64 {
                let first: Vec<String> = op
                    .first_failures
                    .iter()
                    .map(|(_, reason)| reason.clone())
                    .collect();
                return Err(EngineError::Inference(format!(
                    "{}: {} of its {rows} rows failed, more than --max-error-ratio {max_ratio} \
                     allows; the first: {}",
                    op.op_id,
                    op.failed,
                    first.join("; ")
                )));
            }
        }
        Ok(())
    }

    /// Each operator's rows in the running (or last) query, in post-order.
    pub fn operators(&self) -> Vec<OperatorRows> {
        self.ledger().operators.clone()
    }

    /// The query's `budget` object (with a budget) and `row_errors` object
    /// (under `--on-row-error null`) for its measurements.
    pub fn report(&self) -> Work {
        let ledger = self.ledger();
        let mut m = Work::default();
        if let (Some(budget), Some(spend)) = (&self.budget, &ledger.spend) {
            let mut b = spend.report();
            b.insert(
                "on_budget".into(),
                match budget.on_spent {
                    OnBudget::Fail => "fail",
                    OnBudget::Partial => "partial",
                }
                .into(),
            );
            b.insert(
                "operators".into(),
                ledger
                    .operators
                    .iter()
                    .map(|o| {
                        json!({
                            "id": o.op_id,
                            "answered_rows": o.answered,
                            "unreached_rows": o.unreached,
                        })
                    })
                    .collect(),
            );
            m.budget = Some(Config(b.into()));
        }
        if let OnRowError::Null { max_ratio } = self.on_row_error {
            let operators: Vec<Value> = ledger
                .operators
                .iter()
                .map(|o| {
                    json!({
                        "id": o.op_id,
                        "rows": o.answered + o.failed,
                        "rows_failed": o.failed,
                        "failures": o.first_failures.iter().map(|(row, reason)| {
                            json!({"row": row, "reason": reason})
                        }).collect::<Vec<_>>(),
                    })
                })
                .collect();
            m.row_errors = Some(Config(json!({
                "on_row_error": "null",
                "max_error_ratio": max_ratio,
                "operators": operators,
            })));
        }
        m
    }
}

/// The error of a spent budget: which limit, what was spent, and each
/// operator's rows answered and not reached.
fn budget_message(ledger: &QueryLedger) -> String {
    let spent = match &ledger.spend {
        Some(spend) => match spend.reached() {
            Some(limit) => spend.describe(limit),
            None => "the budget is spent".into(),
        },
        None => "the model's budget was spent elsewhere".into(),
    };
    let operators: Vec<String> = ledger
        .operators
        .iter()
        .map(|o| match (o.answered + o.failed, o.unreached) {
            (0, 0) => format!("{} had not started", o.op_id),
            (done, 0) => format!("{} had answered {done} rows", o.op_id),
            (done, left) => format!(
                "{} had answered {done} of its rows, {left} not reached",
                o.op_id
            ),
        })
        .collect();
    format!(
        "{spent}; {}; --on-budget partial returns the rows answered so far",
        operators.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inference::backend::{AiKind, test_call};
    use crate::limits::spend::BudgetLimits;

    fn budget(on_spent: OnBudget) -> Budget {
        let limits = BudgetLimits {
            fresh_tokens: Some(10),
            model_seconds: None,
            cost_usd: None,
            gpu_hourly_rate_usd: 3.5,
        };
        Budget::new(limits, on_spent).unwrap()
    }

    fn calls() -> Vec<AiCall> {
        let mut filter = test_call(AiKind::Filter, "Is {0} kind?", &[]);
        filter.op_id = "filter-1".into();
        let mut join = test_call(AiKind::Join, "Does {0} cite {1}?", &[]);
        join.op_id = "join-1".into();
        vec![filter, join]
    }

    fn failed(row: &str) -> Answer {
        Answer::Failed(format!("filter-1: the prompt for row {row} is too long").into())
    }

    #[test]
    fn a_failed_row_fails_the_query_unless_null_is_asked() {
        let answers = [Answer::Bool(true), failed("r2")];
        let strict = QueryControls::new(None, OnRowError::Fail);
        strict.start_query(&calls());
        let e = strict
            .settle("filter-1", &answers, |i| format!("r{i}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("row r2 is too long"), "{e}");

        let lenient = QueryControls::new(None, OnRowError::Null { max_ratio: 0.5 });
        lenient.start_query(&calls());
        let s = lenient
            .settle("filter-1", &answers, |i| format!("r{}", i + 1))
            .unwrap();
        assert_eq!(
            s,
            Settled {
                failed: 1,
                unreached: 0
            }
        );
        // One of two rows is not more than half of them.
        lenient.finish().unwrap();
        let report = lenient.report().row_errors.unwrap().0;
        let op = &report["operators"][0];
        assert_eq!(
            (op["rows"].as_u64(), op["rows_failed"].as_u64()),
            (Some(2), Some(1))
        );
        assert_eq!(op["failures"][0]["row"], "r2");
        // A third row failing makes two of three: past the ratio.
        lenient
            .settle("filter-1", &[failed("r3")], |_| "r3".into())
            .unwrap();
        let e = lenient.finish().unwrap_err().to_string();
        assert!(
            e.contains("filter-1: 2 of its 3 rows failed")
                && e.contains("--max-error-ratio 0.5")
                && e.contains("row r2 is too long"),
            "{e}"
        );
    }

    #[test]
    fn an_unreached_row_fails_naming_the_budget_unless_partial() {
        let strict = QueryControls::new(Some(budget(OnBudget::Fail)), OnRowError::Fail);
        let spend = strict.start_query(&calls()).expect("a meter");
        spend.charge(12, std::time::Duration::ZERO);
        let answers = [Answer::Bool(false), Answer::Bool(true), Answer::Unreached];
        let e = strict
            .settle("filter-1", &answers, |i| i.to_string())
            .unwrap_err();
        assert!(matches!(e, EngineError::OverBudget(_)), "{e}");
        let e = e.to_string();
        assert!(
            e.contains("--max-fresh-tokens 10 is spent")
                && e.contains("12 fresh tokens, 2 over")
                && e.contains("filter-1 had answered 2 of its rows, 1 not reached")
                && e.contains("join-1 had not started"),
            "{e}"
        );

        let partial = QueryControls::new(Some(budget(OnBudget::Partial)), OnRowError::Fail);
        let spend = partial.start_query(&calls()).expect("a meter");
        spend.charge(10, std::time::Duration::ZERO);
        let s = partial
            .settle("filter-1", &answers, |i| i.to_string())
            .unwrap();
        assert_eq!(
            s,
            Settled {
                failed: 0,
                unreached: 1
            }
        );
        let b = &partial.report().budget.unwrap().0;
        assert_eq!(b["exhausted"], true);
        assert_eq!(b["on_budget"], "partial");
        assert_eq!(b["operators"][0]["answered_rows"], 2);
        assert_eq!(b["operators"][0]["unreached_rows"], 1);
        assert_eq!(b["operators"][1]["answered_rows"], 0);
        // A new query starts from nothing.
        partial.start_query(&calls());
        assert_eq!(partial.operators()[0], OperatorRows::new("filter-1"));
    }
}
