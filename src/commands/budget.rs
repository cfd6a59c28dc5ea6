//! The cost flags a query obeys (`--max-fresh-tokens`, `--max-model-seconds`,
//! `--max-cost-usd`, `--on-budget`, `--on-row-error`, `--max-error-ratio`):
//! turned into the engine's budget and row-error policy, and refused as usage
//! errors where they cannot mean anything for the backend asked for.

use aisql_engine::estimate::DEFAULT_GPU_HOURLY_RATE_USD;
use aisql_engine::exec::coverage::OnRowError;
use aisql_engine::limits::spend::{Budget, BudgetLimits, OnBudget};

use super::UsageError;
use crate::config::{self, BackendSpec, CostConfig, Names, RowErrorChoice};

/// What a query may spend and what a failed row does.
#[derive(Debug, Clone, Copy)]
pub struct Controls {
    /// The budget of each query, if any limit is given.
    pub budget: Option<Budget>,
    /// What a row the model cannot answer does.
    pub on_row_error: OnRowError,
}

/// The controls `cost` asks for, for queries answered by `backend`. The
/// rules between the options are the typed configuration's
/// ([`CostConfig::validate`], [`config::check_spend`]), checked again here
/// for the callers that filled the fields themselves.
pub fn controls(cost: &CostConfig, backend: &BackendSpec) -> anyhow::Result<Controls> {
    cost.validate(Names::Flags)?;
    config::check_spend(cost, backend, Names::Flags)?;
    Ok(Controls {
        budget: budget(cost)?,
        on_row_error: on_row_error(cost),
    })
}

/// `--on-row-error` and `--max-error-ratio`: null alone allows any fraction,
/// the ratio alone implies null (fail with a ratio is refused by
/// [`CostConfig::validate`]).
fn on_row_error(cost: &CostConfig) -> OnRowError {
    match (cost.on_row_error, cost.max_error_ratio) {
        (Some(RowErrorChoice::Null), r) | (None, r @ Some(_)) => OnRowError::Null {
            max_ratio: r.unwrap_or(1.0),
        },
        (Some(RowErrorChoice::Fail), _) | (None, None) => OnRowError::Fail,
    }
}

/// The budget of `--max-fresh-tokens`, `--max-model-seconds` and
/// `--max-cost-usd`, if any is given.
fn budget(cost: &CostConfig) -> anyhow::Result<Option<Budget>> {
    if cost.max_fresh_tokens.is_none()
        && cost.max_model_seconds.is_none()
        && cost.max_cost_usd.is_none()
    {
        return Ok(None);
    }
    let rate = cost
        .gpu_hourly_rate_usd
        .unwrap_or(DEFAULT_GPU_HOURLY_RATE_USD);
    let limits = BudgetLimits {
        fresh_tokens: cost.max_fresh_tokens,
        model_seconds: cost.max_model_seconds,
        cost_usd: cost.max_cost_usd,
        gpu_hourly_rate_usd: rate,
    };
    let on_spent: OnBudget = cost.on_budget.unwrap_or(config::OnBudget::Fail);
    Ok(Some(
        Budget::new(limits, on_spent).map_err(|e| UsageError(e.to_string()))?,
    ))
}
