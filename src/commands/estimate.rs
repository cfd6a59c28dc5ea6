//! Estimates on the command line (`--estimate` of query, sql and bench, and
//! `EXPLAIN` in `aisql sql`): the estimating backend over the backend the query
//! would run on, the throughput profile it is priced with, and the printing.

use std::collections::HashMap;
use std::sync::Arc;

use aisql_engine::errln;
use aisql_engine::estimate::calibration::Calibration;
use aisql_engine::estimate::{DEFAULT_GPU_HOURLY_RATE_USD, Estimate, EstimateConfig, Estimator};
use aisql_engine::inference::backend::InferenceBackend;
use aisql_engine::inference::scheduler::{QWEN3_4B_KV_BYTES_PER_TOKEN, QWEN3_4B_MAX_POSITIONS};
use aisql_engine::outln;

use aisql_engine::inference::backend_meta::BackendMeta;

use crate::cli::RowFormat;
use crate::config::{BackendKind, BackendSpec, CostConfig};

/// The estimator of queries run with `real` (built from `args`, described by
/// `meta`), with `hints` as selectivities by template.
pub fn estimator(
    args: &BackendSpec,
    cost: &CostConfig,
    real: &Arc<dyn InferenceBackend>,
    meta: &BackendMeta,
    hints: HashMap<String, f64>,
) -> anyhow::Result<Estimator> {
    // The oracle stands for the simulated deployment (as --simulate does);
    // a model for itself: its KV budget, context and KV bytes per position.
    let mut scheduler = args.scheduler.simulated_config();
    let (mut kv_bytes_per_token, mut max_positions) =
        (QWEN3_4B_KV_BYTES_PER_TOKEN, QWEN3_4B_MAX_POSITIONS);
    if args.kind == BackendKind::Model {
        if let Some(budget) = meta.kv_budget_bytes {
            scheduler.kv_budget_bytes = budget;
            if let Some(cap) = real.kv_capacity_tokens().filter(|&c| c > 0) {
                kv_bytes_per_token = (budget / cap).max(1);
            }
        }
        scheduler.host_kv_budget_bytes = meta.kv_host_budget_bytes.unwrap_or(0);
        max_positions = real.context_positions().unwrap_or(max_positions);
    }
    let (dtype, device) = profile_key(args, meta);
    Ok(Estimator {
        config: EstimateConfig {
            scheduler,
            kv_bytes_per_token,
            max_positions,
            sample: cost.estimate_sample,
            hints,
        },
        profile: format!("{} {dtype} on {device}", args.model.name),
        calibration: Calibration::load(&args.model.name, &dtype, &device)?,
        gpu_hourly_rate_usd: cost
            .gpu_hourly_rate_usd
            .unwrap_or(DEFAULT_GPU_HOURLY_RATE_USD),
    })
}

/// The dtype and device of the throughput profile an estimate is priced
/// with: those the backend loaded (described by `meta`), else those the flags
/// name (the oracle loads no model).
pub fn profile_key(args: &BackendSpec, meta: &BackendMeta) -> (String, String) {
    let device = match meta.device() {
        "" => match args.model.gpu.as_deref() {
            Some([n, ..]) => format!("cuda:{n}"),
            _ => "cpu".to_string(),
        },
        d => d.to_string(),
    };
    let dtype = match (meta.dtype(), args.model.dtype.as_deref()) {
        ("", Some(d)) => d.to_string(),
        ("", None) if device == "cpu" => "f32".to_string(),
        ("", None) => "bf16".to_string(),
        (d, _) => d.to_string(),
    };
    (dtype, device)
}

/// Prints `estimate`: one JSON object for `--format json`, else the table.
pub fn print(estimate: &Estimate, format: RowFormat) -> anyhow::Result<()> {
    match format {
        RowFormat::Json => outln!("{}", serde_json::to_string_pretty(&estimate.to_json())?)?,
        RowFormat::Table => outln!("{}", estimate.render()?)?,
        RowFormat::Csv => {
            aisql_engine::console::out(&super::rows::render(&estimate.to_batch()?, format)?)?;
        }
    }
    Ok(())
}

/// Several queries' estimates as one table: a line per query and the total.
pub fn render_queries(estimates: &[(String, Estimate)]) -> anyhow::Result<String> {
    use aisql_engine::estimate::OperatorEstimate;
    // Each query as one "operator" line of a combined estimate.
    let lines: Vec<OperatorEstimate> = estimates
        .iter()
        .map(|(id, e)| OperatorEstimate {
            id: id.clone(),
            kind: "query".into(),
            template: String::new(),
            rows: e.operators.iter().map(|o| o.rows).sum(),
            input_tokens: e.input_tokens,
            minimum_tokens: e.minimum_tokens,
            fresh_tokens: e.fresh_tokens,
            decode_tokens: e.decode_tokens,
            seconds: e.seconds,
            usd: e.usd,
            sampled: e.sample_questions,
            selectivity: None,
            selectivity_from: "-".into(),
            selectivity_interval: None,
        })
        .collect();
    let sum = |f: &dyn Fn(&Estimate) -> u64| estimates.iter().map(|(_, e)| f(e)).sum::<u64>();
    let total_of = |f: &dyn Fn(&Estimate) -> Option<f64>| {
        estimates.iter().map(|(_, e)| f(e)).sum::<Option<f64>>()
    };
    let Some((_, first)) = estimates.first() else {
        return Ok("no queries".into());
    };
    let combined = Estimate {
        fresh_tokens: sum(&|e| e.fresh_tokens),
        input_tokens: sum(&|e| e.input_tokens),
        minimum_tokens: sum(&|e| e.minimum_tokens),
        decode_tokens: sum(&|e| e.decode_tokens),
        seconds: total_of(&|e| e.seconds),
        usd: total_of(&|e| e.usd),
        profile: first.profile.clone(),
        calibrated: first.calibrated,
        gpu_hourly_rate_usd: first.gpu_hourly_rate_usd,
        sample_questions: sum(&|e| e.sample_questions),
        sample_fresh_tokens: sum(&|e| e.sample_fresh_tokens),
        operators: lines,
    };
    Ok(combined.render()?)
}

/// Whether a query's progress lines want an estimate made first (their rows'
/// totals and ETA): a model backend whose progress will be seen, when the
/// query is not an estimate itself.
pub fn progress_wants_estimate(args: &BackendSpec, cost: &CostConfig) -> bool {
    args.kind == BackendKind::Model && cost.progress_shown() && !cost.estimate
}

/// The rows (questions) the progress lines' `estimate` expects of each AI
/// operator, by id; says on stderr what its sample computed, positions the
/// query then finds in the KV cache and so does not count as its own fresh
/// tokens.
pub fn progress_expected_rows(estimate: &Estimate) -> std::io::Result<HashMap<String, u64>> {
    errln!(
        "progress estimate: {} fresh tokens computed for a sample of {} questions (the query reuses their KV)",
        estimate.sample_fresh_tokens,
        estimate.sample_questions
    )?;
    Ok(expected_rows(estimate))
}

/// The rows (questions) `estimate` expects of each AI operator, by id.
pub fn expected_rows(estimate: &Estimate) -> HashMap<String, u64> {
    estimate
        .operators
        .iter()
        .map(|o| (o.id.clone(), o.rows))
        .collect()
}
