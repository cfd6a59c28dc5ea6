//! Physical AI operators: [`AiExec`] evaluates one [`AiNode`] by collecting its
//! input(s), asking the backend in batches grouped by anchor document, recording
//! the answer table, and emitting the surviving rows (filters), the TRUE pairs
//! (joins) or the rows with their label appended (classifications).
//!
//! Each distinct question is asked once per query even when it occurs in many
//! input rows or operators — after a join the same pair can repeat, a chain of
//! joins can ask one prompt twice — through the query's one memo
//! ([`crate::memo`]); answer tables list every tuple an operator evaluated
//! exactly once (SPEC §D.1). Joins with equality
//! conditions (FEV-10) only ask about pairs that satisfy them.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, RecordBatch, StringArray, UInt32Array, new_null_array,
};
use datafusion::arrow::compute::{cast, concat_batches, filter_record_batch, take};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::catalog::Session;
use datafusion::common::JoinType;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::context::QueryPlanner;
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::{LogicalPlan, UserDefinedLogicalNode};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder, MetricsSet, Time,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use datafusion::physical_planner::{DefaultPhysicalPlanner, ExtensionPlanner, PhysicalPlanner};
use indicatif::{ProgressBar, ProgressStyle};

use crate::answers::{AnswerRecorder, AnswerTable};
use crate::backend::{AiKind, AiRequest, Doc, InferenceBackend, check_answer_count};
use crate::error::{EngineError, Result};
use crate::logical::{AiNode, AiShape, AiSpec};
use crate::memo::{AnswerMemo, MemoKey};

/// Requests per backend call. One input batch is asked in one call, so the
/// backend knows every document that batch still needs (it keeps their KV while
/// it evicts); it splits the work into forward passes by tokens itself.
const REQUESTS_PER_CALL: usize = usize::MAX;
/// Operators with fewer prompts than this show no progress bar.
const PROGRESS_MIN_PROMPTS: usize = 4096;

/// Shared by every AI operator of one query.
#[derive(Clone)]
pub struct AiRuntime {
    /// Who answers.
    pub backend: Arc<dyn InferenceBackend>,
    /// Where answers are recorded.
    pub recorder: Arc<AnswerRecorder>,
    /// The query's answers so far, shared by its operators.
    pub memo: Arc<std::sync::Mutex<AnswerMemo>>,
    /// Show a progress bar on stderr for long operators.
    pub progress: bool,
}

impl fmt::Debug for AiRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AiRuntime")
            .field("backend", &self.backend.name())
            .finish()
    }
}

/// Where an AI operator's columns sit in its input (left ‖ right for joins),
/// resolved from the node's named columns when the physical plan is built.
#[derive(Debug, Clone)]
struct Layout {
    /// (id, text) per document, `{0}` first.
    docs: Vec<(usize, usize)>,
    /// Equalities: ({0}-side, {1}-side) indices.
    equalities: Vec<(usize, usize)>,
    /// Fields of the left input (joins; all fields otherwise).
    left_width: usize,
    /// The join's residual condition over left ‖ right rows, and that schema.
    residual: Option<(Arc<dyn PhysicalExpr>, SchemaRef)>,
}

impl Layout {
    fn of(node: &AiNode, session: &dyn Session) -> DfResult<Self> {
        let combined = AiNode::input_schema(node.spec.shape, &node.inputs)?;
        let docs = node
            .spec
            .docs
            .iter()
            .map(|d| {
                Ok((
                    combined.index_of_column(&d.id)?,
                    combined.index_of_column(&d.text)?,
                ))
            })
            .collect::<DfResult<Vec<_>>>()?;
        let equalities = node
            .spec
            .equalities
            .iter()
            .map(|(a, b)| Ok((combined.index_of_column(a)?, combined.index_of_column(b)?)))
            .collect::<DfResult<Vec<_>>>()?;
        let left_width = node.inputs[0].schema().fields().len();
        if let AiShape::Join(t) = node.spec.shape {
            if matches!(t, JoinType::LeftMark | JoinType::RightMark) {
                return Err(DataFusionError::NotImplemented(format!(
                    "{}: an AI join of type {t}",
                    node.spec.call.op_id
                )));
            }
            let anchor_left = docs[0].0 < left_width;
            let sides_ok = docs.iter().enumerate().all(|(i, &(id, text))| {
                let left = (i == 0) == anchor_left;
                (id < left_width) == left && (text < left_width) == left
            }) && equalities
                .iter()
                .all(|&(a, b)| (a < left_width) == anchor_left && (b < left_width) != anchor_left);
            if !sides_ok {
                return Err(DataFusionError::Plan(format!(
                    "{}: an AI join needs its {{0}} document from one input and its {{1}} document from the other",
                    node.spec.call.op_id
                )));
            }
        }
        let residual = match &node.spec.residual {
            Some(r) => Some((
                session.create_physical_expr(r.clone(), &combined)?,
                Arc::new(combined.as_arrow().clone()),
            )),
            None => None,
        };
        Ok(Self {
            docs,
            equalities,
            left_width,
            residual,
        })
    }
}

/// An AI operator's metrics, shown by `EXPLAIN ANALYZE`.
#[derive(Debug)]
struct AiMetrics {
    baseline: BaselineMetrics,
    input_rows: Count,
    prompts: Count,
    fresh_tokens: Count,
    model_time: Time,
    /// Where per-worker metrics are added once workers report.
    set: ExecutionPlanMetricsSet,
    /// `workerN_fresh_tokens`, `workerN_questions`, `workerN_busy` and
    /// `workerN_kv_peak_bytes` of this operator, on several workers.
    workers: std::sync::Mutex<Vec<WorkerMetrics>>,
}

/// One worker's share of an operator's work.
#[derive(Debug)]
struct WorkerMetrics {
    fresh_tokens: Count,
    questions: Count,
    busy: Time,
    kv_peak_bytes: Gauge,
}

impl AiMetrics {
    fn new(set: &ExecutionPlanMetricsSet) -> Self {
        Self {
            baseline: BaselineMetrics::new(set, 0),
            input_rows: MetricBuilder::new(set).counter("input_rows", 0),
            prompts: MetricBuilder::new(set).counter("model_calls", 0),
            fresh_tokens: MetricBuilder::new(set).counter("fresh_tokens", 0),
            model_time: MetricBuilder::new(set).subset_time("model_time", 0),
            set: set.clone(),
            workers: Default::default(),
        }
    }

    /// Adds the work between `before` and `after` to the totals and per worker.
    fn add_work(&self, before: &WorkSoFar, after: &WorkSoFar) {
        self.fresh_tokens
            .add(after.fresh_tokens.saturating_sub(before.fresh_tokens) as usize);
        if after.workers.len() < 2 {
            return;
        }
        let mut workers = self.workers.lock().expect("worker metrics lock");
        while workers.len() < after.workers.len() {
            let i = workers.len();
            let b = || MetricBuilder::new(&self.set);
            workers.push(WorkerMetrics {
                fresh_tokens: b().counter(format!("worker{i}_fresh_tokens"), 0),
                questions: b().counter(format!("worker{i}_questions"), 0),
                busy: b().subset_time(format!("worker{i}_busy"), 0),
                kv_peak_bytes: b().gauge(format!("worker{i}_kv_peak_bytes"), 0),
            });
        }
        let zero = WorkerWork::default();
        for (i, now) in after.workers.iter().enumerate() {
            let was = before.workers.get(i).unwrap_or(&zero);
            let m = &workers[i];
            m.fresh_tokens
                .add(now.fresh_tokens.saturating_sub(was.fresh_tokens) as usize);
            m.questions
                .add(now.questions.saturating_sub(was.questions) as usize);
            m.busy.add_duration(std::time::Duration::from_nanos(
                now.busy_nanos.saturating_sub(was.busy_nanos),
            ));
            m.kv_peak_bytes.set_max(now.kv_peak_bytes as usize);
        }
    }
}

/// A worker's figures so far in the query, from the backend's `workers`
/// measurement.
#[derive(Debug, Clone, Copy, Default)]
struct WorkerWork {
    fresh_tokens: u64,
    questions: u64,
    busy_nanos: u64,
    kv_peak_bytes: u64,
}

/// The backend's fresh tokens so far in the query, in all and per worker.
#[derive(Debug, Clone, Default)]
struct WorkSoFar {
    fresh_tokens: u64,
    workers: Vec<WorkerWork>,
}

impl WorkSoFar {
    fn of(runtime: &AiRuntime) -> Self {
        let m = runtime.backend.measurements();
        let u = |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
        let workers = m
            .get("workers")
            .and_then(|w| w.as_array())
            .map(|ws| {
                ws.iter()
                    .map(|w| WorkerWork {
                        fresh_tokens: u(w, "fresh_tokens"),
                        questions: u(w, "questions"),
                        busy_nanos: (w.get("busy_s").and_then(|x| x.as_f64()).unwrap_or(0.0) * 1e9)
                            as u64,
                        kv_peak_bytes: u(w, "kv_peak_bytes"),
                    })
                    .collect()
            })
            .unwrap_or_default();
        Self {
            fresh_tokens: m.get("fresh_tokens").and_then(|v| v.as_u64()).unwrap_or(0),
            workers,
        }
    }
}

/// What one operator's batches share while it runs.
struct OpState {
    spec: AiSpec,
    layout: Layout,
    runtime: AiRuntime,
    metrics: AiMetrics,
    schema: SchemaRef,
    /// Tuples already in this operator's answer table.
    recorded: std::sync::Mutex<HashSet<(String, String)>>,
}

/// The physical AI operator.
#[derive(Debug)]
pub struct AiExec {
    spec: AiSpec,
    layout: Layout,
    inputs: Vec<Arc<dyn ExecutionPlan>>,
    schema: SchemaRef,
    runtime: AiRuntime,
    metrics: ExecutionPlanMetricsSet,
    cache: Arc<PlanProperties>,
}

impl AiExec {
    /// The operator of `node` over its physical `inputs`.
    pub fn try_new(
        node: &AiNode,
        inputs: Vec<Arc<dyn ExecutionPlan>>,
        runtime: AiRuntime,
        session: &dyn Session,
    ) -> DfResult<Self> {
        let layout = Layout::of(node, session)?;
        Ok(Self::with_layout(
            node.spec.clone(),
            layout,
            inputs,
            Arc::new(node.schema.as_arrow().clone()),
            runtime,
        ))
    }

    fn with_layout(
        spec: AiSpec,
        layout: Layout,
        inputs: Vec<Arc<dyn ExecutionPlan>>,
        schema: SchemaRef,
        runtime: AiRuntime,
    ) -> Self {
        let cache = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Self {
            spec,
            layout,
            inputs,
            schema,
            runtime,
            metrics: ExecutionPlanMetricsSet::new(),
            cache,
        }
    }
}

impl DisplayAs for AiExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "AiExec: {} kind={:?} shape={:?} backend={} prompt_tokens≈{}+documents",
            self.spec.call.op_id,
            self.spec.call.kind,
            self.spec.shape,
            self.runtime.backend.name(),
            self.spec.estimated_prompt_tokens()
        )
    }
}

impl ExecutionPlan for AiExec {
    fn name(&self) -> &'static str {
        "AiExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.cache
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        self.inputs.iter().collect()
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(AiExec::with_layout(
            self.spec.clone(),
            self.layout.clone(),
            children,
            self.schema.clone(),
            self.runtime.clone(),
        )))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        use futures::{StreamExt, TryStreamExt};
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "AiExec has one partition, asked for {partition}"
            )));
        }
        let state = Arc::new(OpState {
            spec: self.spec.clone(),
            layout: self.layout.clone(),
            runtime: self.runtime.clone(),
            metrics: AiMetrics::new(&self.metrics),
            schema: self.schema.clone(),
            recorded: std::sync::Mutex::new(HashSet::new()),
        });
        let AiShape::Join(join_type) = self.spec.shape else {
            // One input streamed batch by batch: a chain of operators sees each
            // batch of documents in turn while their KV is still cached, and a
            // LIMIT above stops the model work once it has its rows.
            let input = datafusion::physical_plan::execute_stream(self.inputs[0].clone(), context)?;
            let stream = input.and_then(move |batch| {
                let state = state.clone();
                blocking(move || one_input(&state, &batch))
            });
            return Ok(Box::pin(RecordBatchStreamAdapter::new(
                self.schema.clone(),
                stream,
            )));
        };
        // Joins: collect the partner side, then stream the anchor side.
        let anchor_left = self.layout.docs[0].0 < self.layout.left_width;
        let (anchor_plan, partner_plan) = if anchor_left {
            (self.inputs[0].clone(), self.inputs[1].clone())
        } else {
            (self.inputs[1].clone(), self.inputs[0].clone())
        };
        let sides = JoinSides {
            join_type,
            anchor_left,
        };
        let partners = async move {
            let partner_schema = partner_plan.schema();
            let batches = datafusion::physical_plan::collect(partner_plan, context.clone()).await?;
            let partners = Arc::new(compact_views(concat_batches(&partner_schema, &batches)?)?);
            // The partner side stays in memory for the whole join: charged to the
            // query's pool, so a side past `--memory-limit` fails naming this join.
            let reservation = MemoryConsumer::new(format!(
                "AiExec {} (partner side of the AI join)",
                state.spec.call.op_id
            ))
            .register(context.memory_pool());
            reservation.try_grow(partners.get_array_memory_size())?;
            report_partners(&state, &partners)?;
            let reservation = Arc::new(reservation);
            let matched = Arc::new(std::sync::Mutex::new(vec![false; partners.num_rows()]));
            let anchors = datafusion::physical_plan::execute_stream(anchor_plan, context)?;
            let (tail_state, tail_partners, tail_matched) =
                (state.clone(), partners.clone(), matched.clone());
            let anchor_schema = anchors.schema();
            let per_batch = anchors.and_then(move |batch| {
                let (state, partners, matched) = (state.clone(), partners.clone(), matched.clone());
                let _held = reservation.clone();
                blocking(move || {
                    join_batch(
                        &state,
                        sides,
                        &batch,
                        &partners,
                        &mut matched.lock().expect("matched lock"),
                    )
                })
            });
            // Partner rows the join type keeps whether or not they matched.
            let tail = futures::stream::once(async move {
                let matched = tail_matched.lock().expect("matched lock");
                unmatched_partners(&tail_state, sides, anchor_schema, &tail_partners, &matched)
            })
            .try_filter(|b| futures::future::ready(b.num_rows() > 0));
            Ok::<_, DataFusionError>(per_batch.chain(tail))
        };
        let stream = futures::stream::once(partners).try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            stream.boxed(),
        )))
    }
}

/// Runs one batch's model work off the async threads.
async fn blocking(
    f: impl FnOnce() -> Result<RecordBatch> + Send + 'static,
) -> DfResult<RecordBatch> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| DataFusionError::External(Box::new(e)))?
        .map_err(DataFusionError::from)
}

/// A text column: plain `Utf8`, or `Utf8View` (how tables are registered, so
/// that joins copy 16-byte views instead of document texts).
enum Texts<'a> {
    Plain(&'a StringArray),
    View(&'a datafusion::arrow::array::StringViewArray),
}

impl<'a> Texts<'a> {
    fn value(&self, i: usize) -> &'a str {
        match self {
            Texts::Plain(a) => a.value(i),
            Texts::View(a) => a.value(i),
        }
    }

    fn is_null(&self, i: usize) -> bool {
        match self {
            Texts::Plain(a) => a.is_null(i),
            Texts::View(a) => a.is_null(i),
        }
    }
}

fn texts<'a>(batch: &'a RecordBatch, index: usize, what: &str) -> Result<Texts<'a>> {
    let col = batch.column(index);
    match col.data_type() {
        DataType::Utf8 => Ok(Texts::Plain(col.as_string::<i32>())),
        DataType::LargeUtf8 => Err(EngineError::Data(format!(
            "{what}: text column {index} is LargeUtf8; cast it to VARCHAR"
        ))),
        DataType::Utf8View => Ok(Texts::View(col.as_string_view())),
        other => Err(EngineError::Data(format!(
            "{what}: text column {index} is {other} (expected a string)"
        ))),
    }
}

/// A column of ids as strings, whatever its type (a table's ids may be numbers).
fn id_strings(batch: &RecordBatch, index: usize) -> Result<StringArray> {
    let col = batch.column(index);
    let col = if col.data_type() == &DataType::Utf8 {
        col.clone()
    } else {
        cast(col, &DataType::Utf8)?
    };
    Ok(col.as_string::<i32>().clone())
}

fn progress_bar(runtime: &AiRuntime, op_id: &str, total: usize) -> ProgressBar {
    if !runtime.progress || total < PROGRESS_MIN_PROMPTS {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix:>12} [{bar:30}] {pos}/{len} prompts {per_sec} eta {eta}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    bar.set_prefix(op_id.to_string());
    bar
}

/// Decisions for `requests`, asked in chunks.
fn decide_all(spec: &AiSpec, runtime: &AiRuntime, requests: &[AiRequest<'_>]) -> Result<Vec<bool>> {
    let bar = progress_bar(runtime, &spec.call.op_id, requests.len());
    let mut out = Vec::with_capacity(requests.len());
    for chunk in requests.chunks(REQUESTS_PER_CALL) {
        let answers = runtime.backend.decide(&spec.call, chunk)?;
        check_answer_count(&spec.call, "the backend", answers.len(), chunk.len())?;
        out.extend(answers);
        bar.inc(chunk.len() as u64);
    }
    bar.finish_and_clear();
    Ok(out)
}

/// Label indices for `requests`, asked in chunks.
fn classify_all(
    spec: &AiSpec,
    runtime: &AiRuntime,
    requests: &[AiRequest<'_>],
) -> Result<Vec<usize>> {
    let bar = progress_bar(runtime, &spec.call.op_id, requests.len());
    let mut out = Vec::with_capacity(requests.len());
    for chunk in requests.chunks(REQUESTS_PER_CALL) {
        let answers = runtime.backend.classify(&spec.call, chunk)?;
        check_answer_count(&spec.call, "the backend", answers.len(), chunk.len())?;
        if let Some(bad) = answers.iter().find(|&&i| i >= spec.call.labels.len()) {
            return Err(EngineError::Inference(format!(
                "{}: backend chose label {bad} of {}",
                spec.call.op_id,
                spec.call.labels.len()
            )));
        }
        out.extend(answers);
        bar.inc(chunk.len() as u64);
    }
    bar.finish_and_clear();
    Ok(out)
}

/// Answers to `requests`, in order: from the query's memo where any operator
/// asked the question before, else from the backend (requests sharing an anchor
/// document asked together). Tuples this operator has not recorded yet go into
/// its answer table, each once.
fn answer(state: &OpState, requests: &[AiRequest<'_>]) -> Result<Vec<u16>> {
    let spec = &state.spec;
    let call = &spec.call;
    let (keys, mut ask) = {
        let mut memo = state.runtime.memo.lock().expect("memo lock");
        let keys: Vec<MemoKey> = memo.keys(call, requests);
        let mut seen = HashSet::new();
        let ask: Vec<usize> = (0..requests.len())
            .filter(|&i| memo.get(&keys[i]).is_none() && seen.insert(&keys[i]))
            .collect();
        (keys, ask)
    };
    if !ask.is_empty() {
        // Requests sharing an anchor document arrive together (stable: first-seen order within).
        let mut first: HashMap<&str, usize> = HashMap::new();
        for (n, &i) in ask.iter().enumerate() {
            first.entry(requests[i].anchor.id).or_insert(n);
        }
        ask.sort_by_key(|&i| first[requests[i].anchor.id]);
        let asked: Vec<AiRequest<'_>> = ask.iter().map(|&i| requests[i]).collect();
        let work_before = WorkSoFar::of(&state.runtime);
        let timer = state.metrics.model_time.timer();
        let codes: Vec<u16> = match call.kind {
            AiKind::Classify => classify_all(spec, &state.runtime, &asked)?
                .into_iter()
                .map(|i| i as u16)
                .collect(),
            AiKind::Filter | AiKind::Join => decide_all(spec, &state.runtime, &asked)?
                .into_iter()
                .map(u16::from)
                .collect(),
        };
        timer.done();
        state.metrics.prompts.add(asked.len());
        state
            .metrics
            .add_work(&work_before, &WorkSoFar::of(&state.runtime));
        let mut memo = state.runtime.memo.lock().expect("memo lock");
        for (&i, c) in ask.iter().zip(codes) {
            memo.insert(keys[i].clone(), c);
        }
    }
    let answers: Vec<u16> = {
        let memo = state.runtime.memo.lock().expect("memo lock");
        keys.iter()
            .map(|k| memo.get(k).expect("every question answered"))
            .collect()
    };
    let aliases = spec.docs.iter().map(|d| d.alias.clone()).collect();
    let mut table = AnswerTable::new(&call.op_id, call.kind, aliases);
    let mut recorded = state.recorded.lock().expect("recorded lock");
    for (r, &code) in requests.iter().zip(&answers) {
        let partner = r.partner.map_or(String::new(), |p| p.id.to_string());
        if !recorded.insert((r.anchor.id.to_string(), partner.clone())) {
            continue;
        }
        table.ids[0].push(r.anchor.id.to_string());
        if spec.docs.len() > 1 {
            table.ids[1].push(partner);
        }
        match call.kind {
            AiKind::Classify => table.labels.push(call.labels[code as usize].clone()),
            _ => table.answers.push(code != 0),
        }
    }
    if !table.is_empty() {
        state.runtime.recorder.record(table);
    }
    Ok(answers)
}

/// The documents of `docs` ((id, text) column pairs) in each row of `batch`,
/// `None` where one of them is NULL.
struct RowDocs<'a> {
    ids: Vec<StringArray>,
    texts: Vec<Texts<'a>>,
}

impl<'a> RowDocs<'a> {
    fn new(batch: &'a RecordBatch, docs: &[(usize, usize)], op: &str) -> Result<Self> {
        Ok(Self {
            ids: docs
                .iter()
                .map(|&(id, _)| id_strings(batch, id))
                .collect::<Result<_>>()?,
            texts: docs
                .iter()
                .map(|&(_, text)| texts(batch, text, op))
                .collect::<Result<_>>()?,
        })
    }

    fn doc(&self, slot: usize, row: usize) -> Option<Doc<'_>> {
        let (ids, texts) = (&self.ids[slot], &self.texts[slot]);
        (ids.is_valid(row) && !texts.is_null(row)).then(|| Doc {
            id: ids.value(row),
            text: texts.value(row),
        })
    }
}

/// Filters, classifications and AI predicates over one input, one batch at a time.
fn one_input(state: &OpState, batch: &RecordBatch) -> Result<RecordBatch> {
    let spec = &state.spec;
    state.metrics.input_rows.add(batch.num_rows());
    let docs = RowDocs::new(batch, &state.layout.docs, &spec.call.op_id)?;
    let two = spec.docs.len() > 1;
    let request = |row: usize| -> Option<AiRequest<'_>> {
        let anchor = docs.doc(0, row)?;
        let partner = if two { Some(docs.doc(1, row)?) } else { None };
        Some(AiRequest { anchor, partner })
    };
    let requests: Vec<Option<AiRequest<'_>>> = (0..batch.num_rows()).map(request).collect();
    let asked: Vec<AiRequest<'_>> = requests.iter().flatten().copied().collect();
    let mut answers = answer(state, &asked)?.into_iter();
    let codes: Vec<Option<u16>> = requests
        .iter()
        .map(|r| r.as_ref().and_then(|_| answers.next()))
        .collect();
    let out = match (spec.shape, spec.call.kind) {
        (AiShape::Filter, _) => {
            let mask: BooleanArray = codes.iter().map(|c| Some(*c == Some(1))).collect();
            let kept = filter_record_batch(batch, &mask)?;
            RecordBatch::try_new(state.schema.clone(), kept.columns().to_vec())?
        }
        (_, AiKind::Classify) => {
            let labels: StringArray = codes
                .iter()
                .map(|c| c.map(|c| spec.call.labels[c as usize].as_str()))
                .collect();
            append_column(batch, Arc::new(labels), state.schema.clone())?
        }
        _ => {
            let values: BooleanArray = codes.iter().map(|c| c.map(|c| c != 0)).collect();
            append_column(batch, Arc::new(values), state.schema.clone())?
        }
    };
    state.metrics.baseline.record_output(out.num_rows());
    Ok(out)
}

fn append_column(batch: &RecordBatch, column: ArrayRef, schema: SchemaRef) -> Result<RecordBatch> {
    let mut columns = batch.columns().to_vec();
    columns.push(column);
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// Which input an AI join streams (the anchor's) and what its type keeps.
#[derive(Debug, Clone, Copy)]
struct JoinSides {
    join_type: JoinType,
    anchor_left: bool,
}

impl JoinSides {
    /// Whether unmatched rows of the left (`left = true`) or right input are kept
    /// with NULLs on the other side.
    fn keeps_unmatched(self, left: bool) -> bool {
        matches!(
            (self.join_type, left),
            (JoinType::Full, _) | (JoinType::Left, true) | (JoinType::Right, false)
        )
    }

    /// `Some(true)` when the output is the matched rows of one input only
    /// (semi), `Some(false)` its unmatched rows (anti), for that input.
    fn semi(self, left: bool) -> Option<bool> {
        match (self.join_type, left) {
            (JoinType::LeftSemi, true) | (JoinType::RightSemi, false) => Some(true),
            (JoinType::LeftAnti, true) | (JoinType::RightAnti, false) => Some(false),
            _ => None,
        }
    }

    fn one_sided(self) -> bool {
        self.semi(true).is_some() || self.semi(false).is_some()
    }
}

/// One output row of a join: (left row, right row); `None` pads with NULLs.
type JoinRow = (Option<u32>, Option<u32>);

/// Output rows as (left row, right row) indices into the two inputs; `None`
/// makes that side NULL. One-sided outputs (semi, anti) use only their side.
fn assemble(
    schema: SchemaRef,
    sides: JoinSides,
    left: &RecordBatch,
    right: &RecordBatch,
    rows: &[JoinRow],
) -> Result<RecordBatch> {
    let side = |batch: &RecordBatch, pick: &dyn Fn(&JoinRow) -> Option<u32>| {
        let indices = UInt32Array::from(rows.iter().map(pick).collect::<Vec<_>>());
        batch
            .columns()
            .iter()
            .map(|c| {
                if indices.null_count() == indices.len() {
                    Ok(new_null_array(c.data_type(), indices.len()))
                } else {
                    take(c.as_ref(), &indices, None)
                }
            })
            .collect::<std::result::Result<Vec<_>, _>>()
    };
    let mut columns = Vec::with_capacity(schema.fields().len());
    if !sides.one_sided() || sides.semi(true).is_some() {
        columns.extend(side(left, &|r| r.0)?);
    }
    if !sides.one_sided() || sides.semi(false).is_some() {
        columns.extend(side(right, &|r| r.1)?);
    }
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// `batch` with its string and binary view columns holding only the bytes their
/// rows use. Rows taken from a large batch keep referencing all of its text, so
/// a partner side gathered from many such batches would keep, and be charged
/// for, the same text buffers once per batch (IMDB-9's join-2 at sf 1.0: 12 GB
/// counted for a few hundred MB of reviews).
fn compact_views(batch: RecordBatch) -> DfResult<RecordBatch> {
    use datafusion::arrow::array::AsArray;
    let columns: Vec<ArrayRef> = batch
        .columns()
        .iter()
        .map(|c| match c.data_type() {
            DataType::Utf8View => Arc::new(c.as_string_view().gc()) as ArrayRef,
            DataType::BinaryView => Arc::new(c.as_binary_view().gc()) as ArrayRef,
            _ => c.clone(),
        })
        .collect();
    Ok(RecordBatch::try_new(batch.schema(), columns)?)
}

/// The distinct (anchor document, partner document) pairs among `candidates`
/// (row pairs), as the rows that first show each, and for every candidate the
/// index of its pair. Documents are told apart by id, as the answer memo does.
fn distinct_pairs(
    anchors: &RowDocs<'_>,
    partners: &RowDocs<'_>,
    candidates: &[(u32, u32)],
) -> (Vec<u32>, Vec<(u32, u32)>) {
    // Each row's document as a small number: equal ids, equal numbers.
    fn numbered(
        docs: &RowDocs<'_>,
        rows: usize,
        used: impl Iterator<Item = u32>,
    ) -> (Vec<u32>, u32) {
        let mut by_id: HashMap<&str, u32> = HashMap::new();
        let mut out = vec![u32::MAX; rows];
        for r in used {
            if out[r as usize] != u32::MAX {
                continue;
            }
            let id = docs.doc(0, r as usize).expect("a candidate's document").id;
            let next = by_id.len() as u32;
            out[r as usize] = *by_id.entry(id).or_insert(next);
        }
        let count = by_id.len() as u32;
        (out, count)
    }
    let rows = |c: &dyn Fn(&(u32, u32)) -> u32| {
        candidates.iter().map(c).max().map_or(0, |m| m as usize + 1)
    };
    let (a_doc, a_count) = numbered(anchors, rows(&|c| c.0), candidates.iter().map(|c| c.0));
    let (p_doc, p_count) = numbered(partners, rows(&|c| c.1), candidates.iter().map(|c| c.1));
    // A table of pair indexes when it is small, else a map.
    let cells = (a_count as usize).saturating_mul(p_count as usize);
    let mut table = if cells <= 1 << 20 {
        vec![u32::MAX; cells]
    } else {
        Vec::new()
    };
    let mut map: HashMap<(u32, u32), u32> = HashMap::new();
    let mut distinct = Vec::new();
    let pair_of = candidates
        .iter()
        .map(|&(a, p)| {
            let (da, dp) = (a_doc[a as usize], p_doc[p as usize]);
            let fresh = distinct.len() as u32;
            let slot = if table.is_empty() {
                map.entry((da, dp)).or_insert(fresh)
            } else {
                let cell = &mut table[da as usize * p_count as usize + dp as usize];
                if *cell == u32::MAX {
                    *cell = fresh;
                }
                cell
            };
            if *slot == fresh {
                distinct.push((a, p));
            }
            *slot
        })
        .collect();
    (pair_of, distinct)
}

/// Tells the backend a join's partner documents (distinct by id) when every
/// anchor meets every one of them: no equality, no residual condition.
fn report_partners(state: &OpState, partner_batch: &RecordBatch) -> Result<()> {
    if !state.spec.equalities.is_empty() || state.spec.residual.is_some() {
        return Ok(());
    }
    let op = &state.spec.call.op_id;
    let lw = state.layout.left_width;
    let (id, text) = state.layout.docs[1];
    let local = |index: usize| if index < lw { index } else { index - lw };
    let partners = RowDocs::new(partner_batch, &[(local(id), local(text))], op)?;
    let mut seen = HashSet::new();
    let docs: Vec<Doc<'_>> = (0..partner_batch.num_rows())
        .filter_map(|row| partners.doc(0, row))
        .filter(|d| seen.insert(d.id))
        .collect();
    state
        .runtime
        .backend
        .partners_collected(&state.spec.call, &docs);
    Ok(())
}

/// AI join of one batch of anchor rows against all partner rows: every candidate
/// that meets the equalities is asked once (across batches, via the memo); the
/// TRUE pairs and, as the join type says, unmatched anchor rows are emitted.
/// Matched partner rows are marked in `matched` for [`unmatched_partners`].
fn join_batch(
    state: &OpState,
    sides: JoinSides,
    anchor_batch: &RecordBatch,
    partner_batch: &RecordBatch,
    matched: &mut [bool],
) -> Result<RecordBatch> {
    let op = &state.spec.call.op_id;
    state.metrics.input_rows.add(anchor_batch.num_rows());
    let lw = state.layout.left_width;
    let local = |index: usize| if index < lw { index } else { index - lw };
    let (a_doc, p_doc) = (state.layout.docs[0], state.layout.docs[1]);
    let anchors = RowDocs::new(anchor_batch, &[(local(a_doc.0), local(a_doc.1))], op)?;
    let partners = RowDocs::new(partner_batch, &[(local(p_doc.0), local(p_doc.1))], op)?;

    // Partner rows per equality key (all partner rows when there is no
    // equality); a NULL key matches nothing.
    let key_columns = |batch: &RecordBatch, pick: &dyn Fn(&(usize, usize)) -> usize| {
        state
            .layout
            .equalities
            .iter()
            .map(|e| id_strings(batch, local(pick(e))))
            .collect::<Result<Vec<_>>>()
    };
    let a_keys = key_columns(anchor_batch, &|e| e.0)?;
    let p_keys = key_columns(partner_batch, &|e| e.1)?;
    let key = |cols: &[StringArray], row: usize| -> Option<Vec<String>> {
        cols.iter()
            .map(|c| c.is_valid(row).then(|| c.value(row).to_string()))
            .collect()
    };
    let mut by_key: HashMap<Vec<String>, Vec<u32>> = HashMap::new();
    if !p_keys.is_empty() {
        for r in 0..partner_batch.num_rows() {
            if let Some(k) = key(&p_keys, r) {
                by_key.entry(k).or_default().push(r as u32);
            }
        }
    }
    let all_partners: Vec<u32> = (0..partner_batch.num_rows() as u32).collect();
    let mut candidates: Vec<(u32, u32)> = Vec::new();
    for a in 0..anchor_batch.num_rows() {
        if anchors.doc(0, a).is_none() {
            continue;
        }
        let rows = if p_keys.is_empty() {
            &all_partners[..]
        } else {
            match key(&a_keys, a).and_then(|k| by_key.get(&k)) {
                Some(v) => &v[..],
                None => &[][..],
            }
        };
        for &p in rows {
            if partners.doc(0, p as usize).is_some() {
                candidates.push((a as u32, p));
            }
        }
    }
    if let Some((residual, combined)) = &state.layout.residual {
        let keep = residual_mask(
            residual,
            combined.clone(),
            sides.anchor_left,
            anchor_batch,
            partner_batch,
            &candidates,
        )?;
        let mut i = 0;
        candidates.retain(|_| {
            i += 1;
            keep[i - 1]
        });
    }
    // Each distinct pair of documents is asked once: rows made by an earlier
    // join repeat their documents (IMDB-9's join-3 sees each review in
    // thousands of rows), and a request costs far more than an index.
    let (pair_of, distinct) = distinct_pairs(&anchors, &partners, &candidates);
    let requests: Vec<AiRequest<'_>> = distinct
        .iter()
        .map(|&(a, p)| AiRequest {
            anchor: anchors.doc(0, a as usize).expect("a candidate's anchor"),
            partner: partners.doc(0, p as usize),
        })
        .collect();
    let answers = answer(state, &requests)?;
    let mut anchor_matched = vec![false; anchor_batch.num_rows()];
    let mut pairs: Vec<(u32, u32)> = Vec::new();
    for (&(a, p), &pair) in candidates.iter().zip(&pair_of) {
        if answers[pair as usize] != 0 {
            pairs.push((a, p));
            anchor_matched[a as usize] = true;
            matched[p as usize] = true;
        }
    }
    // Rows as (anchor, partner), then placed as (left, right).
    let mut rows: Vec<JoinRow> = match sides.semi(sides.anchor_left) {
        Some(want) => (0..anchor_batch.num_rows() as u32)
            .filter(|&a| anchor_matched[a as usize] == want)
            .map(|a| (Some(a), None))
            .collect(),
        None if sides.one_sided() => Vec::new(),
        None => pairs.iter().map(|&(a, p)| (Some(a), Some(p))).collect(),
    };
    if sides.keeps_unmatched(sides.anchor_left) {
        rows.extend(
            (0..anchor_batch.num_rows() as u32)
                .filter(|&a| !anchor_matched[a as usize])
                .map(|a| (Some(a), None)),
        );
    }
    let out = if sides.anchor_left {
        assemble(
            state.schema.clone(),
            sides,
            anchor_batch,
            partner_batch,
            &rows,
        )?
    } else {
        let rows: Vec<_> = rows.into_iter().map(|(a, p)| (p, a)).collect();
        assemble(
            state.schema.clone(),
            sides,
            partner_batch,
            anchor_batch,
            &rows,
        )?
    };
    state.metrics.baseline.record_output(out.num_rows());
    Ok(out)
}

/// Which candidate (anchor row, partner row) pairs meet the residual condition
/// (NULL counts as not met), evaluated on the pairs as left ‖ right rows.
fn residual_mask(
    residual: &Arc<dyn PhysicalExpr>,
    combined: SchemaRef,
    anchor_left: bool,
    anchor_batch: &RecordBatch,
    partner_batch: &RecordBatch,
    candidates: &[(u32, u32)],
) -> Result<Vec<bool>> {
    if candidates.is_empty() {
        return Ok(Vec::new());
    }
    let a = UInt32Array::from_iter_values(candidates.iter().map(|c| c.0));
    let p = UInt32Array::from_iter_values(candidates.iter().map(|c| c.1));
    let pick = |batch: &RecordBatch, idx: &UInt32Array| {
        batch
            .columns()
            .iter()
            .map(|c| take(c.as_ref(), idx, None))
            .collect::<std::result::Result<Vec<_>, _>>()
    };
    let (mut columns, right) = if anchor_left {
        (pick(anchor_batch, &a)?, pick(partner_batch, &p)?)
    } else {
        (pick(partner_batch, &p)?, pick(anchor_batch, &a)?)
    };
    columns.extend(right);
    let pairs = RecordBatch::try_new_with_options(
        combined,
        columns,
        &datafusion::arrow::array::RecordBatchOptions::new().with_row_count(Some(candidates.len())),
    )?;
    let value = residual
        .evaluate(&pairs)
        .and_then(|v| v.into_array(pairs.num_rows()))
        .map_err(EngineError::DataFusion)?;
    let mask = value.as_boolean_opt().ok_or_else(|| {
        EngineError::Data(format!(
            "a join condition evaluated to {}, not a boolean",
            value.data_type()
        ))
    })?;
    Ok((0..mask.len())
        .map(|i| mask.is_valid(i) && mask.value(i))
        .collect())
}

/// After the last anchor batch: the partner rows the join type keeps by their
/// match state (unmatched rows of an outer side, semi or anti on the partner side).
fn unmatched_partners(
    state: &OpState,
    sides: JoinSides,
    anchor_schema: SchemaRef,
    partner_batch: &RecordBatch,
    matched: &[bool],
) -> DfResult<RecordBatch> {
    let partner_left = !sides.anchor_left;
    let want = match sides.semi(partner_left) {
        Some(want) => want,
        None if sides.keeps_unmatched(partner_left) => false,
        None => return Ok(RecordBatch::new_empty(state.schema.clone())),
    };
    let partner_rows =
        (0..partner_batch.num_rows() as u32).filter(|&p| matched[p as usize] == want);
    let no_anchors = RecordBatch::new_empty(anchor_schema);
    let out = if partner_left {
        let rows: Vec<_> = partner_rows.map(|p| (Some(p), None)).collect();
        assemble(
            state.schema.clone(),
            sides,
            partner_batch,
            &no_anchors,
            &rows,
        )?
    } else {
        let rows: Vec<_> = partner_rows.map(|p| (None, Some(p))).collect();
        assemble(
            state.schema.clone(),
            sides,
            &no_anchors,
            partner_batch,
            &rows,
        )?
    };
    state.metrics.baseline.record_output(out.num_rows());
    Ok(out)
}
/// Lowers [`AiNode`]s to [`AiExec`].
#[derive(Debug)]
pub struct AiExtensionPlanner {
    runtime: AiRuntime,
}

#[async_trait]
impl ExtensionPlanner for AiExtensionPlanner {
    async fn plan_extension(
        &self,
        _planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        _logical_inputs: &[&LogicalPlan],
        physical_inputs: &[Arc<dyn ExecutionPlan>],
        session: &dyn Session,
        _ctx: &PhysicalPlanningContext,
    ) -> DfResult<Option<Arc<dyn ExecutionPlan>>> {
        let Some(ai) = node.as_any().downcast_ref::<AiNode>() else {
            return Ok(None);
        };
        Ok(Some(Arc::new(AiExec::try_new(
            ai,
            physical_inputs.to_vec(),
            self.runtime.clone(),
            session,
        )?)))
    }
}

/// The query planner that knows AI operators.
#[derive(Debug)]
pub struct AiQueryPlanner {
    planner: Arc<AiExtensionPlanner>,
}

impl AiQueryPlanner {
    /// A planner whose AI operators share `runtime`.
    pub fn new(runtime: AiRuntime) -> Self {
        Self {
            planner: Arc::new(AiExtensionPlanner { runtime }),
        }
    }
}

#[async_trait]
impl QueryPlanner for AiQueryPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session: &dyn Session,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        DefaultPhysicalPlanner::with_extension_planners(vec![self.planner.clone()])
            .create_physical_plan(logical_plan, session)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::StringViewArray;
    use datafusion::arrow::datatypes::{Field, Schema};

    #[test]
    fn a_partner_side_made_of_slices_keeps_only_its_own_text() {
        let text: Vec<String> = (0..1000).map(|i| format!("{i:0>200}")).collect();
        let column: ArrayRef = Arc::new(StringViewArray::from_iter_values(&text));
        let schema = Arc::new(Schema::new(vec![Field::new(
            "t",
            DataType::Utf8View,
            false,
        )]));
        let whole = RecordBatch::try_new(schema.clone(), vec![column]).unwrap();
        // One row from each of 50 slices: every piece still points at all the text.
        let pieces: Vec<RecordBatch> = (0..50).map(|i| whole.slice(i * 20, 1)).collect();
        let joined = concat_batches(&schema, &pieces).unwrap();
        let compact = compact_views(joined.clone()).unwrap();
        assert_eq!(compact.num_rows(), 50);
        let values = |b: &RecordBatch| -> Vec<String> {
            use datafusion::arrow::array::AsArray;
            let a = b.column(0).as_string_view();
            (0..a.len()).map(|i| a.value(i).to_string()).collect()
        };
        assert_eq!(values(&compact), values(&joined));
        assert!(
            compact.get_array_memory_size() * 20 < joined.get_array_memory_size(),
            "{} bytes compacted from {}",
            compact.get_array_memory_size(),
            joined.get_array_memory_size()
        );
    }
}
