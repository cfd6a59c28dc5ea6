//! What a query will cost, known before it runs: rows reaching each AI
//! operator, input, minimum, fresh and decode tokens, seconds and dollars.
//!
//! An estimate runs the query itself, over the real tables, with an
//! [`EstimatingBackend`] in place of the model: the model's scheduler over a
//! virtual KV ([`SimExecutor`]) counts what the model would compute, twice
//! (under the real KV budget: the fresh tokens; under an unlimited one: the
//! shared-prefix minimum), and the answers that decide which rows go on come
//! from a seeded sample asked of the backend that will run the query
//! ([`sample`]). Seconds come from the model's measured throughput profile
//! ([`calibration`]).

pub mod calibration;
pub mod sample;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use aisql_models::Tokenizer;
use datafusion::arrow::array::{ArrayRef, Float64Array, RecordBatch, StringArray, UInt64Array};

use crate::error::Result;
use crate::inference::backend::{
    AiCall, AiRequest, Answered, Doc, InferenceBackend, QueryBackend, QueryStart,
};
use crate::inference::scheduler::{ScheduledBackend, SchedulerConfig, SimExecutor};
use calibration::{Calibration, Work};
use sample::SampledAnswers;

/// The price of one GPU-hour in USD that estimates and `--max-cost-usd` use
/// without `--gpu-hourly-rate-usd`: an on-demand H200 in a public cloud
/// (late 2026 list prices run from about $3 to $10; this is the low end, so a
/// cost cap errs towards stopping early).
pub const DEFAULT_GPU_HOURLY_RATE_USD: f64 = 3.5;

/// The KV budget of the minimum's simulation: unlimited in practice.
const UNLIMITED_KV_BYTES: usize = usize::MAX / 4;

/// How an estimate simulates the model that will run the query.
#[derive(Debug, Clone)]
pub struct EstimateConfig {
    /// The scheduler's knobs as the query would run (KV budget, batch tokens,
    /// prefix cache, look-ahead).
    pub scheduler: SchedulerConfig,
    /// KV bytes per cached position of the model.
    pub kv_bytes_per_token: usize,
    /// The model's context in positions.
    pub max_positions: usize,
    /// Questions per AI operator asked of the real backend.
    pub sample: usize,
    /// Fractions of TRUE by prompt template (`--selectivity`).
    pub hints: HashMap<String, f64>,
}

/// What estimates of queries run with one backend share: how to simulate
/// its model, and how to price the work.
#[derive(Debug, Clone)]
pub struct Estimator {
    /// How the model is simulated and the sample taken.
    pub config: EstimateConfig,
    /// The throughput profile looked for (`tiny f32 on cpu`).
    pub profile: String,
    /// That profile, when it was measured.
    pub calibration: Option<Calibration>,
    /// The price of one GPU-hour in USD.
    pub gpu_hourly_rate_usd: f64,
}

impl Estimator {
    /// A fresh estimating backend over `real`, for one query.
    pub fn backend(&self, real: Arc<dyn InferenceBackend>) -> Result<Arc<EstimatingBackend>> {
        Ok(Arc::new(EstimatingBackend::new(real, &self.config)?))
    }

    /// The figures of the query `backend` ran.
    pub fn estimate(&self, backend: &EstimatingBackend) -> Estimate {
        backend.estimate(
            &self.profile,
            self.calibration.as_ref(),
            self.gpu_hourly_rate_usd,
        )
    }
}

/// The options a query's estimate runs with: the query's, without its
/// budget (an estimate computes nothing a budget could stop).
pub fn estimate_options(
    options: &crate::sql::options::QueryOptions,
) -> crate::sql::options::QueryOptions {
    crate::sql::options::QueryOptions {
        budget: None,
        ..options.clone()
    }
}

/// Counters of one simulation, read before and after each call.
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    fresh: u64,
    decoded: u64,
    input: u64,
    attended_prefill: u64,
    attended_decode: u64,
    scored: u64,
}

impl Counts {
    fn of(sim: &ScheduledBackend<SimExecutor>) -> Self {
        let e = sim.executor();
        use crate::inference::scheduler::Executor as _;
        Self {
            fresh: e.fresh_tokens(),
            decoded: e.decode_tokens(),
            input: e.input_tokens(),
            attended_prefill: e.attended_prefill(),
            attended_decode: e.attended_decode(),
            scored: e.scored_positions(),
        }
    }

    fn add(&mut self, more: Self) {
        self.fresh += more.fresh;
        self.decoded += more.decoded;
        self.input += more.input;
        self.attended_prefill += more.attended_prefill;
        self.attended_decode += more.attended_decode;
        self.scored += more.scored;
    }

    fn since(self, before: Self) -> Self {
        Self {
            fresh: self.fresh - before.fresh,
            decoded: self.decoded - before.decoded,
            input: self.input - before.input,
            attended_prefill: self.attended_prefill - before.attended_prefill,
            attended_decode: self.attended_decode - before.attended_decode,
            scored: self.scored - before.scored,
        }
    }
}

/// One AI operator's simulated work so far.
#[derive(Debug, Clone, Default)]
struct Tally {
    call: Option<AiCall>,
    questions: u64,
    work: Counts,
    minimum: u64,
}

/// The backend an estimate runs the query on: see the module docs.
pub struct EstimatingBackend {
    sampled: Arc<SampledAnswers>,
    sim: Arc<ScheduledBackend<SimExecutor>>,
    minimum: Arc<ScheduledBackend<SimExecutor>>,
    /// Per operator id, in the order they run.
    tallies: Mutex<Vec<(String, Tally)>>,
}

impl EstimatingBackend {
    /// An estimate of what `real` would do, as `config` describes it.
    pub fn new(real: Arc<dyn InferenceBackend>, config: &EstimateConfig) -> Result<Self> {
        let store = real.kv_store();
        let sampled = Arc::new(SampledAnswers::new(
            real,
            config.sample,
            config.hints.clone(),
        ));
        let exec = || {
            SimExecutor::answering(
                sampled.clone(),
                config.kv_bytes_per_token,
                config.max_positions,
            )
        };
        // The fresh tokens count only what the query's store does not hold;
        // the minimum is the query's own, from nothing.
        let mut sim =
            ScheduledBackend::new(exec(), Tokenizer::vendored()?, config.scheduler.clone());
        if let Some(store) = store {
            sim = sim.with_kv_store(store);
        }
        let sim = Arc::new(sim);
        let unlimited = SchedulerConfig {
            prefix_cache: true,
            lookahead: true,
            kv_budget_bytes: UNLIMITED_KV_BYTES,
            host_kv_budget_bytes: 0,
            ..config.scheduler.clone()
        };
        Ok(Self {
            minimum: Arc::new(ScheduledBackend::sharing_tokens(exec(), &sim, unlimited)),
            sim,
            sampled,
            tallies: Mutex::new(Vec::new()),
        })
    }

    /// The figures of the query run so far, priced by `calibration` (seconds
    /// and dollars only with one; `profile` names the one looked for) at
    /// `gpu_hourly_rate_usd`.
    pub fn estimate(
        &self,
        profile: &str,
        calibration: Option<&Calibration>,
        gpu_hourly_rate_usd: f64,
    ) -> Estimate {
        let stats = self.sampled.stats();
        let tallies = self.tallies.lock().expect("tallies lock");
        let price = |work: &Counts| -> (Option<f64>, Option<f64>) {
            let seconds = calibration.map(|c| {
                c.seconds(&Work {
                    prefill_tokens: work.fresh - work.decoded,
                    attended: work.attended_prefill,
                    decoded: work.decoded,
                    scored: work.scored,
                })
            });
            (seconds, seconds.map(|s| s / 3600.0 * gpu_hourly_rate_usd))
        };
        let operators: Vec<OperatorEstimate> = tallies
            .iter()
            .map(|(id, t)| {
                let (seconds, usd) = price(&t.work);
                let call = t.call.as_ref().expect("a tally has its call");
                let s = stats.get(id).cloned().unwrap_or_default();
                // An operator that asked nothing decided nothing.
                let decides = call.kind.is_decision() && t.questions > 0;
                OperatorEstimate {
                    id: id.clone(),
                    kind: call.kind.name().into(),
                    template: call.template.clone(),
                    rows: t.questions,
                    input_tokens: t.work.input,
                    minimum_tokens: t.minimum,
                    fresh_tokens: t.work.fresh,
                    decode_tokens: t.work.decoded,
                    seconds,
                    usd,
                    sampled: s.asked as u64,
                    selectivity: decides.then(|| s.selectivity()),
                    selectivity_interval: decides.then(|| s.interval()).flatten(),
                    selectivity_from: if !decides {
                        "-"
                    } else if s.hint.is_some() {
                        "hint"
                    } else if s.asked > 0 {
                        "sample"
                    } else {
                        "default"
                    }
                    .into(),
                }
            })
            .collect();
        let total = Counts::of(&self.sim);
        let (seconds, usd) = price(&total);
        let real = self.sampled.real_work();
        Estimate {
            fresh_tokens: total.fresh,
            input_tokens: total.input,
            minimum_tokens: Counts::of(&self.minimum).fresh,
            decode_tokens: total.decoded,
            seconds,
            usd,
            profile: profile.to_string(),
            calibrated: calibration.is_some(),
            gpu_hourly_rate_usd,
            sample_questions: stats.values().map(|s| s.asked as u64).sum(),
            sample_fresh_tokens: real.fresh(),
            operators,
        }
    }

    fn tally(&self, call: &AiCall, questions: usize, work: Counts, minimum: u64) {
        let mut tallies = self.tallies.lock().expect("tallies lock");
        let at = match tallies.iter().position(|(id, _)| *id == call.op_id) {
            Some(i) => i,
            None => {
                tallies.push((call.op_id.clone(), Tally::default()));
                tallies.len() - 1
            }
        };
        let t = &mut tallies[at].1;
        t.call.get_or_insert_with(|| call.clone());
        t.questions += questions as u64;
        t.work.add(work);
        t.minimum += minimum;
    }
}

impl InferenceBackend for EstimatingBackend {
    fn name(&self) -> &str {
        "estimate"
    }

    /// Begins the query on the real backend (for the sample) and on both
    /// simulations; every operator gets a tally, in the order they run: one
    /// whose questions the query's memo answers (another operator asked
    /// them) asks nothing.
    fn begin(self: Arc<Self>, start: QueryStart) -> Result<Arc<dyn QueryBackend>> {
        self.sampled.begin_real(start.clone())?;
        let sim = self.sim.clone().begin(start.clone())?;
        let minimum = self.minimum.clone().begin(QueryStart {
            spend: None,
            ..start.clone()
        })?;
        *self.tallies.lock().expect("tallies lock") = start
            .calls
            .iter()
            .map(|c| {
                let tally = Tally {
                    call: Some(c.clone()),
                    ..Tally::default()
                };
                (c.op_id.clone(), tally)
            })
            .collect();
        Ok(Arc::new(EstimatingQuery {
            estimate: self,
            sim,
            minimum,
        }))
    }

    fn kv_capacity_tokens(&self) -> Option<usize> {
        self.sampled
            .real()
            .kv_capacity_tokens()
            .or_else(|| self.sim.kv_capacity_tokens())
    }

    fn context_positions(&self) -> Option<usize> {
        self.sim.context_positions()
    }

    fn embedding_dims(&self) -> Option<u32> {
        self.sampled.real().embedding_dims()
    }

    fn host_memory_allowance(&self) -> usize {
        self.sampled.real().host_memory_allowance()
    }

    fn reuses_work(&self) -> bool {
        self.sim.reuses_work()
    }

    fn turn_order(&self) -> Option<String> {
        self.sampled.real().turn_order()
    }
}

/// One estimated query: its queries on both simulations (the sample's is
/// the [`SampledAnswers`]'s, ended with this).
struct EstimatingQuery {
    estimate: Arc<EstimatingBackend>,
    sim: Arc<dyn QueryBackend>,
    minimum: Arc<dyn QueryBackend>,
}

impl QueryBackend for EstimatingQuery {
    /// The sampled answers, after both simulations counted the call's work.
    fn answer(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Answered> {
        let e = &self.estimate;
        let (before, min_before) = (Counts::of(&e.sim), Counts::of(&e.minimum).fresh);
        e.sampled.note_query_fresh(before.fresh);
        let answered = self.sim.answer(call, requests)?;
        self.minimum.answer(call, requests)?;
        let work = Counts::of(&e.sim).since(before);
        let minimum = Counts::of(&e.minimum).fresh - min_before;
        e.tally(call, requests.len(), work, minimum);
        Ok(answered)
    }

    fn work(&self) -> crate::inference::work::Work {
        self.sim.work()
    }

    fn cancel(&self) {
        self.sim.cancel();
        self.minimum.cancel();
        if let Some(real) = self.estimate.sampled.real_query() {
            real.cancel();
        }
    }

    fn wait_stopped(&self) {
        self.sim.wait_stopped();
        self.minimum.wait_stopped();
        if let Some(real) = self.estimate.sampled.real_query() {
            real.wait_stopped();
        }
    }

    fn partners_collected(&self, call: &AiCall, partners: &[Doc<'_>]) {
        self.sim.partners_collected(call, partners);
        self.minimum.partners_collected(call, partners);
    }
}

impl Drop for EstimatingQuery {
    fn drop(&mut self) {
        self.estimate.sampled.end_real();
    }
}

/// One AI operator's estimate.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OperatorEstimate {
    /// Operator id (`filter-1`).
    pub id: String,
    /// Question kind (`filter`, `join`, …).
    pub kind: String,
    /// Prompt template.
    pub template: String,
    /// Questions expected to reach it: its rows (pairs for a join), each
    /// distinct question once.
    pub rows: u64,
    /// Prompt positions of those questions, each in full.
    pub input_tokens: u64,
    /// What an unlimited shared-prefix cache computes for them.
    pub minimum_tokens: u64,
    /// What the scheduler computes under the query's KV budget (decoded
    /// positions included).
    pub fresh_tokens: u64,
    /// Decoded positions (generating calls, `max_tokens` as the bound).
    pub decode_tokens: u64,
    /// Seconds on the calibrated model and device; `None` uncalibrated.
    pub seconds: Option<f64>,
    /// Dollars of those seconds.
    pub usd: Option<f64>,
    /// Questions of the sample the backend answered.
    pub sampled: u64,
    /// Fraction of TRUE answers assumed (decisions only).
    pub selectivity: Option<f64>,
    /// Where it came from: `sample`, `hint`, `default` (one half), `-`.
    pub selectivity_from: String,
    /// The 95 % interval of a sampled selectivity: a small sample of a
    /// selective filter leaves the rows after it uncertain.
    pub selectivity_interval: Option<(f64, f64)>,
}

/// A query's estimate: totals and per AI operator.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Estimate {
    /// Positions the scheduler computes under the query's KV budget.
    pub fresh_tokens: u64,
    /// Prompt positions of every question, each in full.
    pub input_tokens: u64,
    /// The shared-prefix lower bound.
    pub minimum_tokens: u64,
    /// Decoded positions.
    pub decode_tokens: u64,
    /// Seconds on the calibrated model and device; `None` when uncalibrated.
    pub seconds: Option<f64>,
    /// Dollars: seconds × the GPU-hour price.
    pub usd: Option<f64>,
    /// The throughput profile priced with, or looked for (`tiny f32 on cpu`).
    pub profile: String,
    /// Whether that profile was found (seconds and dollars come from it).
    pub calibrated: bool,
    /// The price of one GPU-hour used.
    pub gpu_hourly_rate_usd: f64,
    /// Questions the backend answered for the sample.
    pub sample_questions: u64,
    /// Fresh tokens the backend computed for the sample.
    pub sample_fresh_tokens: u64,
    /// Per AI operator, in the order they run.
    pub operators: Vec<OperatorEstimate>,
}

impl Estimate {
    /// The estimate as one JSON object (`--estimate --format json`).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("an estimate serialises")
    }

    /// The figures as a table, one row per operator and a total.
    pub fn to_batch(&self) -> Result<RecordBatch> {
        let mut ids: Vec<String> = self.operators.iter().map(|o| o.id.clone()).collect();
        ids.push("total".into());
        let col = |f: &dyn Fn(&OperatorEstimate) -> u64, total: u64| -> ArrayRef {
            let mut v: Vec<u64> = self.operators.iter().map(f).collect();
            v.push(total);
            Arc::new(UInt64Array::from(v))
        };
        // Seconds to the hundredth, dollars to the millionth: a table for eyes
        // (the JSON keeps every digit).
        let opt = |f: &dyn Fn(&OperatorEstimate) -> Option<f64>,
                   total: Option<f64>,
                   scale: f64|
         -> ArrayRef {
            let mut v: Vec<Option<f64>> = self.operators.iter().map(f).collect();
            v.push(total);
            let v: Vec<Option<f64>> = v
                .into_iter()
                .map(|x| x.map(|x| (x * scale).round() / scale))
                .collect();
            Arc::new(Float64Array::from(v))
        };
        let mut selectivity: Vec<Option<String>> = self
            .operators
            .iter()
            .map(|o| {
                o.selectivity.map(|s| match o.selectivity_interval {
                    Some((lo, hi)) => {
                        format!("{s:.3} ({}, 95 %: {lo:.3}–{hi:.3})", o.selectivity_from)
                    }
                    None => format!("{s:.3} ({})", o.selectivity_from),
                })
            })
            .collect();
        selectivity.push(None);
        let rows: u64 = self.operators.iter().map(|o| o.rows).sum();
        Ok(RecordBatch::try_from_iter(vec![
            ("operator", Arc::new(StringArray::from(ids)) as ArrayRef),
            ("rows", col(&|o| o.rows, rows)),
            ("input_tokens", col(&|o| o.input_tokens, self.input_tokens)),
            (
                "minimum_tokens",
                col(&|o| o.minimum_tokens, self.minimum_tokens),
            ),
            ("fresh_tokens", col(&|o| o.fresh_tokens, self.fresh_tokens)),
            (
                "decode_tokens",
                col(&|o| o.decode_tokens, self.decode_tokens),
            ),
            ("seconds", opt(&|o| o.seconds, self.seconds, 1e2)),
            ("usd", opt(&|o| o.usd, self.usd, 1e6)),
            (
                "selectivity",
                Arc::new(StringArray::from(selectivity)) as ArrayRef,
            ),
        ])?)
    }

    /// The estimate as text: the table, then where seconds came from and what
    /// the sample cost.
    pub fn render(&self) -> Result<String> {
        let table = datafusion::arrow::util::pretty::pretty_format_batches(&[self.to_batch()?])?;
        let pricing = if self.calibrated {
            format!(
                "seconds from the throughput profile of {}; dollars at ${}/GPU-hour",
                self.profile, self.gpu_hourly_rate_usd
            )
        } else {
            format!(
                "uncalibrated: no throughput profile of {} (`aisql model calibrate` with \
                 that model, dtype and device measures one), so tokens only",
                self.profile
            )
        };
        Ok(format!(
            "{table}\n{pricing}\nsample: {} questions asked of the backend, {} fresh tokens",
            self.sample_questions, self.sample_fresh_tokens
        ))
    }
}
