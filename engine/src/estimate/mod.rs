//! What a query will cost, known before it runs: rows reaching each AI
//! operator, input, minimum, fresh and decode tokens, seconds and dollars.

/// The price of one GPU-hour in USD that estimates and `--max-cost-usd` use
/// without `--gpu-hourly-rate-usd`: an on-demand H200 in a public cloud
/// (late 2026 list prices run from about $3 to $10; this is the low end, so a
/// cost cap errs towards stopping early).
pub const DEFAULT_GPU_HOURLY_RATE_USD: f64 = 3.5;
