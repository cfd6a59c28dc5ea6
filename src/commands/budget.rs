//! The cost flags a query obeys (`--max-fresh-tokens`, `--max-model-seconds`,
//! `--max-cost-usd`, `--on-budget`, `--on-row-error`, `--max-error-ratio`):
//! turned into the engine's budget and row-error policy, and refused as usage
//! errors where they cannot mean anything for the backend asked for.

use aisql_engine::estimate::DEFAULT_GPU_HOURLY_RATE_USD;
use aisql_engine::exec::coverage::OnRowError;
use aisql_engine::limits::spend::{Budget, BudgetLimits, OnBudget};

use super::UsageError;
use crate::config::{self, BackendKind, BackendSpec, CostConfig, RowErrorChoice};

/// What a query may spend and what a failed row does.
#[derive(Debug, Clone, Copy)]
pub struct Controls {
    /// The budget of each query, if any limit is given.
    pub budget: Option<Budget>,
    /// What a row the model cannot answer does.
    pub on_row_error: OnRowError,
}

/// The controls `cost` asks for, for queries answered by `backend`.
pub fn controls(cost: &CostConfig, backend: &BackendSpec) -> anyhow::Result<Controls> {
    Ok(Controls {
        budget: budget(cost, backend)?,
        on_row_error: on_row_error(cost)?,
    })
}

/// `--on-row-error` and `--max-error-ratio`: null alone allows any fraction,
/// the ratio alone implies null, and fail with a ratio is a contradiction.
fn on_row_error(cost: &CostConfig) -> anyhow::Result<OnRowError> {
    Ok(match (cost.on_row_error, cost.max_error_ratio) {
        (Some(RowErrorChoice::Fail), Some(r)) => {
            return Err(UsageError(format!(
                "--on-row-error fail and --max-error-ratio {r} contradict each other: the ratio \
                 is how many of an operator's rows may be NULL under --on-row-error null; give \
                 one of them"
            ))
            .into());
        }
        (Some(RowErrorChoice::Null), r) | (None, r @ Some(_)) => OnRowError::Null {
            max_ratio: r.unwrap_or(1.0),
        },
        (Some(RowErrorChoice::Fail) | None, None) => OnRowError::Fail,
    })
}

/// The budget of `--max-fresh-tokens`, `--max-model-seconds` and
/// `--max-cost-usd`, if any is given. A backend that runs no model has
/// nothing to spend: the plain oracle takes none, a simulation only fresh
/// tokens (it computes no forward passes, so it has no model seconds).
fn budget(cost: &CostConfig, backend: &BackendSpec) -> anyhow::Result<Option<Budget>> {
    let flags: Vec<&str> = [
        (cost.max_fresh_tokens.is_some(), "--max-fresh-tokens"),
        (cost.max_model_seconds.is_some(), "--max-model-seconds"),
        (cost.max_cost_usd.is_some(), "--max-cost-usd"),
    ]
    .into_iter()
    .filter_map(|(given, flag)| given.then_some(flag))
    .collect();
    let Some(&first) = flags.first() else {
        return Ok(None);
    };
    let usage = |m: String| anyhow::Error::from(UsageError(m));
    if backend.kind == BackendKind::Oracle && !backend.simulate {
        return Err(usage(format!(
            "{first}: --backend oracle answers from reference labels and runs no model, so a \
             query has nothing to spend; give --backend model, or --simulate to count the \
             fresh tokens the model would compute"
        )));
    }
    if backend.simulate
        && let Some(timed) = flags.iter().find(|f| **f != "--max-fresh-tokens")
    {
        return Err(usage(format!(
            "{timed}: --simulate runs no forward passes, so it has no model time to spend; \
             cap a simulation with --max-fresh-tokens"
        )));
    }
    let rate = cost
        .gpu_hourly_rate_usd
        .unwrap_or(DEFAULT_GPU_HOURLY_RATE_USD);
    if cost.max_cost_usd.is_some() && rate == 0.0 {
        return Err(usage(
            "--max-cost-usd with --gpu-hourly-rate-usd 0: at $0 an hour the model's time costs \
             nothing and the cap never stops it; give a price above 0 or --max-model-seconds"
                .into(),
        ));
    }
    let limits = BudgetLimits {
        fresh_tokens: cost.max_fresh_tokens,
        model_seconds: cost.max_model_seconds,
        cost_usd: cost.max_cost_usd,
        gpu_hourly_rate_usd: rate,
    };
    let on_spent: OnBudget = cost.on_budget.unwrap_or(config::OnBudget::Fail);
    Ok(Some(
        Budget::new(limits, on_spent).map_err(|e| usage(e.to_string()))?,
    ))
}
