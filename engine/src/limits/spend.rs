//! What one query may spend on the model, and what it has spent: the budget of
//! `--max-fresh-tokens`, `--max-model-seconds` and `--max-cost-usd`.
//!
//! A query's [`Spend`] is shared by everything that runs its model work. Each
//! scheduler ([`crate::inference::scheduler::ScheduledBackend`]) checks it before every
//! forward batch (and a generation between two decode steps) and adds what the
//! batch computed right after, so the workers of one process (`--cpu-workers`,
//! `--gpu 0,1`) spend one budget between them; a coordinator checks its
//! remote `--workers` between calls ([`crate::inference::distributed::RemoteWorker`]).
//! Once a limit is reached no further batch starts: the questions left come
//! back as [`crate::inference::backend::Answer::Unreached`], and the AI operators fail the
//! query naming the budget or, with [`OnBudget::Partial`], leave out the rows
//! they could not answer ([`crate::exec::coverage`]). A batch that started under the
//! limit runs to its end, so a query passes its limit by at most one forward
//! batch (one group of generations) per worker.
//!
//! Model seconds are the wall time of the schedulers' forward batches, summed
//! over workers (GPU-seconds, what a bill counts); dollars are those seconds at
//! the GPU-hour price.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::error::{EngineError, Result};

/// The limits of one query's model work; at least one is set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetLimits {
    /// Most fresh tokens (positions the model computes, decoded ones included).
    pub fresh_tokens: Option<u64>,
    /// Most seconds of forward batches.
    pub model_seconds: Option<f64>,
    /// Most dollars of forward batches at [`Self::gpu_hourly_rate_usd`].
    pub cost_usd: Option<f64>,
    /// The price of one GPU-hour in USD.
    pub gpu_hourly_rate_usd: f64,
}

/// What a spent budget does to the query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnBudget {
    /// The query fails, naming the budget and what was left to do.
    #[default]
    Fail,
    /// The query returns the rows answered so far, with each AI operator's
    /// coverage; rows it could not answer are left out, never made up.
    Partial,
}

/// A query's budget: its limits and what reaching one does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Budget {
    /// The limits.
    pub limits: BudgetLimits,
    /// What reaching one of them does.
    pub on_spent: OnBudget,
}

impl Budget {
    /// A budget of `limits`; an error unless at least one limit is set, every
    /// limit is a finite number > 0, the price a finite number ≥ 0, and a
    /// dollar limit comes with a price above 0 (at $0 an hour it never stops).
    pub fn new(limits: BudgetLimits, on_spent: OnBudget) -> Result<Self> {
        let bad = |m: String| Err(EngineError::Setting(format!("budget: {m}")));
        if limits.fresh_tokens.is_none()
            && limits.model_seconds.is_none()
            && limits.cost_usd.is_none()
        {
            return bad("no limit is set".into());
        }
        if limits.fresh_tokens == Some(0) {
            return bad("--max-fresh-tokens must be at least 1".into());
        }
        for (flag, v) in [
            (Limit::ModelSeconds.flag(), limits.model_seconds),
            (Limit::CostUsd.flag(), limits.cost_usd),
        ] {
            if let Some(v) = v
                && !(v.is_finite() && v > 0.0)
            {
                return bad(format!("{flag} must be a number > 0, got {v}"));
            }
        }
        let rate = limits.gpu_hourly_rate_usd;
        if !(rate.is_finite() && rate >= 0.0) {
            return bad(format!(
                "the GPU-hour price must be a number ≥ 0, got {rate}"
            ));
        }
        if limits.cost_usd.is_some() && rate == 0.0 {
            return bad("--max-cost-usd needs a GPU-hour price above 0".into());
        }
        Ok(Self { limits, on_spent })
    }
}

/// One of a budget's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// `--max-fresh-tokens`.
    FreshTokens,
    /// `--max-model-seconds`.
    ModelSeconds,
    /// `--max-cost-usd`.
    CostUsd,
}

impl Limit {
    /// The flag that sets it.
    pub fn flag(self) -> &'static str {
        match self {
            Limit::FreshTokens => "--max-fresh-tokens",
            Limit::ModelSeconds => "--max-model-seconds",
            Limit::CostUsd => "--max-cost-usd",
        }
    }

    /// The name in the measurements' `budget` object.
    pub fn key(self) -> &'static str {
        match self {
            Limit::FreshTokens => "fresh_tokens",
            Limit::ModelSeconds => "model_seconds",
            Limit::CostUsd => "cost_usd",
        }
    }
}

/// What one query has spent against its [`BudgetLimits`], shared by every
/// scheduler and worker connection of the query.
#[derive(Debug)]
pub struct Spend {
    limits: BudgetLimits,
    fresh_tokens: AtomicU64,
    model_nanos: AtomicU64,
}

impl Spend {
    /// Nothing spent yet against `limits`.
    pub fn new(limits: BudgetLimits) -> Self {
        Self {
            limits,
            fresh_tokens: AtomicU64::new(0),
            model_nanos: AtomicU64::new(0),
        }
    }

    /// The limits.
    pub fn limits(&self) -> &BudgetLimits {
        &self.limits
    }

    /// Adds one forward batch's work: the fresh tokens it computed and its
    /// wall time.
    pub fn charge(&self, fresh_tokens: u64, elapsed: Duration) {
        self.fresh_tokens.fetch_add(fresh_tokens, Ordering::Relaxed);
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.model_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Fresh tokens spent.
    pub fn fresh_tokens(&self) -> u64 {
        self.fresh_tokens.load(Ordering::Relaxed)
    }

    /// Seconds of forward batches spent.
    pub fn model_seconds(&self) -> f64 {
        self.model_nanos.load(Ordering::Relaxed) as f64 / 1e9
    }

    /// Dollars spent: the model seconds at the GPU-hour price.
    pub fn cost_usd(&self) -> f64 {
        dollars(self.model_seconds(), self.limits.gpu_hourly_rate_usd)
    }

    /// The first limit reached, if any: no further forward batch may start.
    pub fn reached(&self) -> Option<Limit> {
        self.reached_with(0, Duration::ZERO)
    }

    /// The first limit reached once `fresh_tokens` more and `elapsed` more are
    /// counted: work in flight, not charged yet (a generation between two
    /// decode steps).
    pub fn reached_with(&self, fresh_tokens: u64, elapsed: Duration) -> Option<Limit> {
        let fresh = self.fresh_tokens().saturating_add(fresh_tokens);
        let seconds = self.model_seconds() + elapsed.as_secs_f64();
        let l = &self.limits;
        if l.fresh_tokens.is_some_and(|max| fresh >= max) {
            return Some(Limit::FreshTokens);
        }
        if l.model_seconds.is_some_and(|max| seconds >= max) {
            return Some(Limit::ModelSeconds);
        }
        if l.cost_usd
            .is_some_and(|max| dollars(seconds, l.gpu_hourly_rate_usd) >= max)
        {
            return Some(Limit::CostUsd);
        }
        None
    }

    /// (limit, spent) of `limit`, as numbers; `None` when it is not set.
    fn figures(&self, limit: Limit) -> Option<(f64, f64)> {
        let l = &self.limits;
        match limit {
            Limit::FreshTokens => l
                .fresh_tokens
                .map(|max| (max as f64, self.fresh_tokens() as f64)),
            Limit::ModelSeconds => l.model_seconds.map(|max| (max, self.model_seconds())),
            Limit::CostUsd => l.cost_usd.map(|max| (max, self.cost_usd())),
        }
    }

    /// "--max-fresh-tokens 5000 is spent: the model computed 5431 fresh
    /// tokens, 431 over the limit (...)", for the limit that was reached.
    pub fn describe(&self, limit: Limit) -> String {
        let (max, spent) = self.figures(limit).unwrap_or((0.0, 0.0));
        let over = (spent - max).max(0.0);
        let (spent, over, max) = match limit {
            Limit::FreshTokens => (
                format!("the model computed {spent} fresh tokens"),
                format!("{over}"),
                format!("{max}"),
            ),
            Limit::ModelSeconds => (
                format!("the model ran {spent:.3} s"),
                format!("{over:.3} s"),
                format!("{max}"),
            ),
            Limit::CostUsd => (
                format!(
                    "the model ran {:.3} s, ${spent:.6} at ${}/GPU-hour",
                    self.model_seconds(),
                    self.limits.gpu_hourly_rate_usd
                ),
                format!("${over:.6}"),
                format!("{max}"),
            ),
        };
        format!(
            "{} {max} is spent: {spent}, {over} over the limit (the forward batch that \
             reached it ran to its end)",
            limit.flag()
        )
    }

    /// The measurements' `budget` object, without the operators' coverage:
    /// `limit`, `spent` and `overshoot` by limit name, `exhausted` and, when
    /// it is, `reached` (the limit that stopped the model work).
    pub fn report(&self) -> serde_json::Map<String, serde_json::Value> {
        use serde_json::{Map, Value, json};
        let mut limit = Map::new();
        let mut overshoot = Map::new();
        for which in [Limit::FreshTokens, Limit::ModelSeconds, Limit::CostUsd] {
            if let Some((max, spent)) = self.figures(which) {
                let number = |v: f64| match which {
                    Limit::FreshTokens => Value::from(v as u64),
                    _ => Value::from(v),
                };
                limit.insert(which.key().into(), number(max));
                overshoot.insert(which.key().into(), number((spent - max).max(0.0)));
            }
        }
        let reached = self.reached();
        let mut m = Map::new();
        m.insert("limit".into(), limit.into());
        m.insert(
            "spent".into(),
            json!({
                "fresh_tokens": self.fresh_tokens(),
                "model_seconds": self.model_seconds(),
                "cost_usd": self.cost_usd(),
            }),
        );
        m.insert("overshoot".into(), overshoot.into());
        m.insert(
            "gpu_hourly_rate_usd".into(),
            self.limits.gpu_hourly_rate_usd.into(),
        );
        m.insert("exhausted".into(), reached.is_some().into());
        if let Some(r) = reached {
            m.insert("reached".into(), r.flag().into());
        }
        m
    }
}

/// Dollars of `seconds` at `rate` per GPU-hour.
fn dollars(seconds: f64, rate: f64) -> f64 {
    seconds * rate / 3600.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(fresh: Option<u64>, seconds: Option<f64>, usd: Option<f64>) -> BudgetLimits {
        BudgetLimits {
            fresh_tokens: fresh,
            model_seconds: seconds,
            cost_usd: usd,
            gpu_hourly_rate_usd: 3.6,
        }
    }

    #[test]
    fn a_budget_needs_a_limit_and_sane_numbers() {
        let ok = |l| Budget::new(l, OnBudget::Fail).is_ok();
        assert!(!ok(limits(None, None, None)));
        assert!(!ok(limits(Some(0), None, None)));
        assert!(!ok(limits(None, Some(-1.0), None)));
        assert!(!ok(limits(None, Some(f64::NAN), None)));
        assert!(!ok(limits(None, None, Some(0.0))));
        assert!(ok(limits(Some(1), None, None)));
        assert!(ok(limits(None, Some(0.5), Some(2.0))));
        let free = BudgetLimits {
            gpu_hourly_rate_usd: 0.0,
            ..limits(None, None, Some(1.0))
        };
        let e = Budget::new(free, OnBudget::Fail).unwrap_err().to_string();
        assert!(e.contains("--max-cost-usd"), "{e}");
    }

    #[test]
    fn each_limit_is_reached_at_its_own_figure() {
        let spend = Spend::new(limits(Some(100), None, None));
        spend.charge(99, Duration::from_secs(1000));
        assert_eq!(spend.reached(), None);
        // Work in flight counts before it is charged.
        assert_eq!(
            spend.reached_with(1, Duration::ZERO),
            Some(Limit::FreshTokens)
        );
        spend.charge(31, Duration::ZERO);
        assert_eq!(spend.reached(), Some(Limit::FreshTokens));
        let d = spend.describe(Limit::FreshTokens);
        assert!(
            d.contains("--max-fresh-tokens 100") && d.contains("130 fresh tokens, 30 over"),
            "{d}"
        );
        let r = spend.report();
        assert_eq!(r["overshoot"]["fresh_tokens"], 30);
        assert_eq!(r["exhausted"], true);

        let spend = Spend::new(limits(None, Some(2.0), None));
        spend.charge(1_000_000, Duration::from_millis(1999));
        assert_eq!(spend.reached(), None);
        spend.charge(0, Duration::from_millis(1));
        assert_eq!(spend.reached(), Some(Limit::ModelSeconds));

        // $3.60 an hour is $0.001 a second: $0.01 is ten seconds.
        let spend = Spend::new(limits(None, None, Some(0.01)));
        spend.charge(0, Duration::from_secs(9));
        assert_eq!(spend.reached(), None);
        assert!((spend.cost_usd() - 0.009).abs() < 1e-12);
        spend.charge(0, Duration::from_secs(1));
        assert_eq!(spend.reached(), Some(Limit::CostUsd));
        assert_eq!(spend.report()["reached"], "--max-cost-usd");
    }
}
