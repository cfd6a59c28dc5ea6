//! Physical AI operators: [`AiExec`] evaluates one [`AiNode`] by collecting its
//! input(s), asking the backend in batches grouped by anchor document, recording
//! the answer table, and emitting the surviving rows (filters), the TRUE pairs
//! (joins) or the rows with their label appended (classifications).
//!
//! Each distinct document (or pair) is asked once even when it occurs in many
//! input rows — after a join the same pair can repeat — so answer tables list
//! every evaluated tuple exactly once (SPEC §D.1). Joins with equality
//! conditions (FEV-10) only ask about pairs that satisfy them.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, RecordBatch, StringArray, UInt32Array,
};
use datafusion::arrow::compute::{concat_batches, filter_record_batch, take};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::catalog::Session;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::context::QueryPlanner;
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::{LogicalPlan, UserDefinedLogicalNode};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use datafusion::physical_planner::{DefaultPhysicalPlanner, ExtensionPlanner, PhysicalPlanner};
use indicatif::{ProgressBar, ProgressStyle};

use crate::answers::{AnswerRecorder, AnswerTable};
use crate::backend::{AiKind, AiRequest, Doc, InferenceBackend};
use crate::error::{EngineError, Result};
use crate::logical::{AiNode, AiSpec};

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

/// The physical AI operator.
#[derive(Debug)]
pub struct AiExec {
    spec: AiSpec,
    inputs: Vec<Arc<dyn ExecutionPlan>>,
    schema: SchemaRef,
    runtime: AiRuntime,
    cache: Arc<PlanProperties>,
}

impl AiExec {
    /// An operator over `inputs` producing `schema`.
    pub fn new(
        spec: AiSpec,
        inputs: Vec<Arc<dyn ExecutionPlan>>,
        schema: SchemaRef,
        runtime: AiRuntime,
    ) -> Self {
        let cache = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Self {
            spec,
            inputs,
            schema,
            runtime,
            cache,
        }
    }
}

impl DisplayAs for AiExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "AiExec: {} kind={:?} backend={}",
            self.spec.call.op_id,
            self.spec.call.kind,
            self.runtime.backend.name()
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

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(AiExec::new(
            self.spec.clone(),
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
        let spec = Arc::new(self.spec.clone());
        let schema = self.schema.clone();
        let runtime = self.runtime.clone();
        let memo = Arc::new(std::sync::Mutex::new(Memo::default()));
        // Runs one batch's model work off the async threads.
        let blocking = move |f: Box<dyn FnOnce() -> Result<RecordBatch> + Send>| async move {
            tokio::task::spawn_blocking(f)
                .await
                .map_err(|e| DataFusionError::External(Box::new(e)))?
                .map_err(DataFusionError::from)
        };
        if spec.call.kind != AiKind::Join {
            // One input streamed batch by batch: a chain of operators sees each
            // batch of documents in turn while their KV is still cached.
            let input = datafusion::physical_plan::execute_stream(self.inputs[0].clone(), context)?;
            let stream = input.and_then(move |batch| {
                let (spec, runtime, schema, memo) =
                    (spec.clone(), runtime.clone(), schema.clone(), memo.clone());
                blocking(Box::new(move || {
                    let mut memo = memo.lock().expect("memo lock");
                    match spec.slots.len() {
                        1 => one_document(&spec, &runtime, &mut memo, &batch, schema),
                        _ => pair_classify(&spec, &runtime, &mut memo, &batch, schema),
                    }
                }))
            });
            return Ok(Box::pin(RecordBatchStreamAdapter::new(
                self.schema.clone(),
                stream,
            )));
        }
        // Joins: collect the partner side, then stream the anchor side.
        let anchor_left = spec.slots[0].id_index < spec.left_width;
        let (anchor_plan, partner_plan) = if anchor_left {
            (self.inputs[0].clone(), self.inputs[1].clone())
        } else {
            (self.inputs[1].clone(), self.inputs[0].clone())
        };
        let partners = async move {
            let partner_schema = partner_plan.schema();
            let batches = datafusion::physical_plan::collect(partner_plan, context.clone()).await?;
            let partners = Arc::new(concat_batches(&partner_schema, &batches)?);
            // The partner side stays in memory for the whole join: charged to the
            // query's pool, so a side past `--memory-limit` fails naming this join.
            let reservation = MemoryConsumer::new(format!(
                "AiExec {} (partner side of the AI join)",
                spec.call.op_id
            ))
            .register(context.memory_pool());
            reservation.try_grow(partners.get_array_memory_size())?;
            let reservation = Arc::new(reservation);
            let anchors = datafusion::physical_plan::execute_stream(anchor_plan, context)?;
            Ok::<_, DataFusionError>(anchors.and_then(move |batch| {
                let (spec, runtime, schema, memo, partners) = (
                    spec.clone(),
                    runtime.clone(),
                    schema.clone(),
                    memo.clone(),
                    partners.clone(),
                );
                let _held = reservation.clone();
                blocking(Box::new(move || {
                    let mut memo = memo.lock().expect("memo lock");
                    join(&spec, &runtime, &mut memo, &batch, &partners, schema)
                }))
            }))
        };
        let stream = futures::stream::once(partners).try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            stream.boxed(),
        )))
    }
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
}

fn texts<'a>(batch: &'a RecordBatch, index: usize, what: &str) -> Result<Texts<'a>> {
    let col = batch.column(index);
    match col.data_type() {
        DataType::Utf8 => Ok(Texts::Plain(col.as_string::<i32>())),
        DataType::Utf8View => Ok(Texts::View(col.as_string_view())),
        other => Err(EngineError::Data(format!(
            "{what}: text column {index} is {other} (expected a string)"
        ))),
    }
}

fn strings<'a>(batch: &'a RecordBatch, index: usize, what: &str) -> Result<&'a StringArray> {
    let col = batch.column(index);
    if col.data_type() != &DataType::Utf8 {
        return Err(EngineError::Data(format!(
            "{what}: column {index} is {} (expected Utf8)",
            col.data_type()
        )));
    }
    Ok(col.as_string::<i32>())
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
        check_len(spec, answers.len(), chunk.len())?;
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
        check_len(spec, answers.len(), chunk.len())?;
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

fn check_len(spec: &AiSpec, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(EngineError::Inference(format!(
            "{}: backend returned {got} answers for {want} prompts",
            spec.call.op_id
        )));
    }
    Ok(())
}

/// Answers already given by one operator, keyed by the ids of the document (and
/// partner; "" for one-document prompts): input batches stream through an
/// operator one at a time, and a document or pair seen in an earlier batch is
/// neither asked nor recorded again.
#[derive(Debug, Default)]
struct Memo {
    answers: HashMap<(String, String), u16>,
}

/// Asks the backend about the requests not yet in `memo`, records them, and
/// stores their answers (bool as 0/1, or label index).
fn ask_new(
    spec: &AiSpec,
    runtime: &AiRuntime,
    memo: &mut Memo,
    requests: Vec<AiRequest<'_>>,
) -> Result<()> {
    let key = |r: &AiRequest<'_>| {
        (
            r.anchor.id.to_string(),
            r.partner.map_or(String::new(), |p| p.id.to_string()),
        )
    };
    let mut seen = std::collections::HashSet::new();
    let mut fresh: Vec<AiRequest<'_>> = requests
        .into_iter()
        .filter(|r| !memo.answers.contains_key(&key(r)) && seen.insert(key(r)))
        .collect();
    // Requests sharing an anchor document arrive together (stable: first-seen order within).
    let mut first: HashMap<&str, usize> = HashMap::new();
    for (i, r) in fresh.iter().enumerate() {
        first.entry(r.anchor.id).or_insert(i);
    }
    let order: Vec<usize> = fresh.iter().map(|r| first[r.anchor.id]).collect();
    let mut idx: Vec<usize> = (0..fresh.len()).collect();
    idx.sort_by_key(|&i| (order[i], i));
    fresh = idx.into_iter().map(|i| fresh[i]).collect();
    let mut aliases = vec![spec.slots[0].alias.clone()];
    if spec.slots.len() > 1 {
        aliases.push(spec.slots[1].alias.clone());
    }
    let mut table = AnswerTable::new(&spec.call.op_id, spec.call.kind, aliases);
    table.ids[0] = fresh.iter().map(|r| r.anchor.id.to_string()).collect();
    if spec.slots.len() > 1 {
        table.ids[1] = fresh
            .iter()
            .map(|r| r.partner.map_or(String::new(), |p| p.id.to_string()))
            .collect();
    }
    let codes: Vec<u16> = match spec.call.kind {
        AiKind::Classify => {
            let chosen = classify_all(spec, runtime, &fresh)?;
            table.labels = chosen
                .iter()
                .map(|&i| spec.call.labels[i].clone())
                .collect();
            chosen.into_iter().map(|i| i as u16).collect()
        }
        AiKind::Filter | AiKind::Join => {
            let answers = decide_all(spec, runtime, &fresh)?;
            table.answers = answers.clone();
            answers.into_iter().map(u16::from).collect()
        }
    };
    for (r, c) in fresh.iter().zip(codes) {
        memo.answers.insert(key(r), c);
    }
    runtime.recorder.record(table);
    Ok(())
}

/// Filters and one-document classifications, one input batch at a time.
fn one_document(
    spec: &AiSpec,
    runtime: &AiRuntime,
    memo: &mut Memo,
    batch: &RecordBatch,
    schema: SchemaRef,
) -> Result<RecordBatch> {
    let op = &spec.call.op_id;
    let slot = &spec.slots[0];
    let ids = strings(batch, slot.id_index, op)?;
    let texts = texts(batch, slot.text_index, op)?;
    let requests: Vec<AiRequest<'_>> = (0..batch.num_rows())
        .map(|i| AiRequest {
            anchor: Doc {
                id: ids.value(i),
                text: texts.value(i),
            },
            partner: None,
        })
        .collect();
    ask_new(spec, runtime, memo, requests)?;
    let code = |i: usize| memo.answers[&(ids.value(i).to_string(), String::new())];
    match spec.call.kind {
        AiKind::Filter => {
            let mask: BooleanArray = (0..batch.num_rows()).map(|i| Some(code(i) != 0)).collect();
            let out = filter_record_batch(batch, &mask)?;
            Ok(RecordBatch::try_new(schema, out.columns().to_vec())?)
        }
        _ => {
            let column = StringArray::from_iter_values(
                (0..batch.num_rows()).map(|i| spec.call.labels[code(i) as usize].as_str()),
            );
            append_column(batch, Arc::new(column), schema)
        }
    }
}

fn append_column(batch: &RecordBatch, column: ArrayRef, schema: SchemaRef) -> Result<RecordBatch> {
    let mut columns = batch.columns().to_vec();
    columns.push(column);
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// Joined-row classification: one label per distinct (anchor, partner) pair.
fn pair_classify(
    spec: &AiSpec,
    runtime: &AiRuntime,
    memo: &mut Memo,
    batch: &RecordBatch,
    schema: SchemaRef,
) -> Result<RecordBatch> {
    let op = &spec.call.op_id;
    let (s0, s1) = (&spec.slots[0], &spec.slots[1]);
    let (ids0, texts0) = (
        strings(batch, s0.id_index, op)?,
        texts(batch, s0.text_index, op)?,
    );
    let (ids1, texts1) = (
        strings(batch, s1.id_index, op)?,
        texts(batch, s1.text_index, op)?,
    );
    let requests: Vec<AiRequest<'_>> = (0..batch.num_rows())
        .map(|i| AiRequest {
            anchor: Doc {
                id: ids0.value(i),
                text: texts0.value(i),
            },
            partner: Some(Doc {
                id: ids1.value(i),
                text: texts1.value(i),
            }),
        })
        .collect();
    ask_new(spec, runtime, memo, requests)?;
    let column = StringArray::from_iter_values((0..batch.num_rows()).map(|i| {
        let c = memo.answers[&(ids0.value(i).to_string(), ids1.value(i).to_string())];
        spec.call.labels[c as usize].as_str()
    }));
    append_column(batch, Arc::new(column), schema)
}

/// AI join of one batch of anchor rows against all partner rows: every candidate
/// that meets the equalities is asked once (across batches, via `memo`); TRUE
/// pairs are emitted as left ‖ right rows.
fn join(
    spec: &AiSpec,
    runtime: &AiRuntime,
    memo: &mut Memo,
    anchor_batch: &RecordBatch,
    partner_batch: &RecordBatch,
    schema: SchemaRef,
) -> Result<RecordBatch> {
    let op = &spec.call.op_id;
    let lw = spec.left_width;
    let side = |index: usize| -> (bool, usize) {
        if index < lw {
            (true, index)
        } else {
            (false, index - lw)
        }
    };
    let (s0, s1) = (&spec.slots[0], &spec.slots[1]);
    let (anchor_left, a_id) = side(s0.id_index);
    let (_, a_text) = side(s0.text_index);
    let (_, p_id) = side(s1.id_index);
    let (_, p_text) = side(s1.text_index);
    let a_ids = strings(anchor_batch, a_id, op)?;
    let a_texts = texts(anchor_batch, a_text, op)?;
    let p_ids = strings(partner_batch, p_id, op)?;
    let p_texts = texts(partner_batch, p_text, op)?;

    // Partner rows per equality key (all partner rows when there is no equality).
    let a_keys: Vec<&StringArray> = spec
        .equalities
        .iter()
        .map(|&(c0, _)| strings(anchor_batch, side(c0).1, op))
        .collect::<Result<_>>()?;
    let p_keys: Vec<&StringArray> = spec
        .equalities
        .iter()
        .map(|&(_, c1)| strings(partner_batch, side(c1).1, op))
        .collect::<Result<_>>()?;
    let mut by_key: HashMap<Vec<&str>, Vec<u32>> = HashMap::new();
    if !p_keys.is_empty() {
        for r in 0..partner_batch.num_rows() {
            by_key
                .entry(p_keys.iter().map(|c| c.value(r)).collect())
                .or_default()
                .push(r as u32);
        }
    }
    let all_partners: Vec<u32> = (0..partner_batch.num_rows() as u32).collect();
    // Distinct documents by id on each side (a side may repeat an id: after a
    // join the same partner appears in many rows); pairs are indexed densely.
    let canon = |ids: &StringArray, rows: usize| -> (Vec<u32>, Vec<u32>) {
        let mut first: HashMap<&str, u32> = HashMap::new();
        let mut firsts = Vec::new();
        let of_row = (0..rows)
            .map(|i| {
                *first.entry(ids.value(i)).or_insert_with(|| {
                    firsts.push(i as u32);
                    (firsts.len() - 1) as u32
                })
            })
            .collect();
        (of_row, firsts)
    };
    let (a_of_row, a_first) = canon(a_ids, anchor_batch.num_rows());
    let (p_of_row, p_first) = canon(p_ids, partner_batch.num_rows());
    let np = p_first.len();
    const UNSEEN: u16 = u16::MAX;
    const ASKED: u16 = u16::MAX - 1;
    let mut pair_code = vec![UNSEEN; a_first.len() * np];
    let mut candidates: Vec<(u32, u32)> = Vec::new();
    let mut distinct: Vec<usize> = Vec::new();
    for (a, &a_canon) in a_of_row.iter().enumerate().take(anchor_batch.num_rows()) {
        let partners = if p_keys.is_empty() {
            &all_partners[..]
        } else {
            let k: Vec<&str> = a_keys.iter().map(|c| c.value(a)).collect();
            by_key.get(&k).map_or(&[][..], |v| &v[..])
        };
        for &p in partners {
            let pair = a_canon as usize * np + p_of_row[p as usize] as usize;
            if pair_code[pair] == UNSEEN {
                pair_code[pair] = ASKED;
                distinct.push(pair);
            }
            candidates.push((a as u32, p));
        }
    }
    let pair_ids = |pair: usize| -> (usize, usize) {
        (a_first[pair / np] as usize, p_first[pair % np] as usize)
    };
    let requests: Vec<AiRequest<'_>> = distinct
        .iter()
        .map(|&pair| {
            let (a, p) = pair_ids(pair);
            AiRequest {
                anchor: Doc {
                    id: a_ids.value(a),
                    text: a_texts.value(a),
                },
                partner: Some(Doc {
                    id: p_ids.value(p),
                    text: p_texts.value(p),
                }),
            }
        })
        .collect();
    ask_new(spec, runtime, memo, requests)?;
    for &pair in &distinct {
        let (a, p) = pair_ids(pair);
        pair_code[pair] = memo.answers[&(a_ids.value(a).to_string(), p_ids.value(p).to_string())];
    }
    let mut anchor_rows = Vec::new();
    let mut partner_rows = Vec::new();
    for &(a, p) in &candidates {
        let pair = a_of_row[a as usize] as usize * np + p_of_row[p as usize] as usize;
        if pair_code[pair] != 0 {
            anchor_rows.push(a);
            partner_rows.push(p);
        }
    }
    let (left, right, li, ri) = if anchor_left {
        (anchor_batch, partner_batch, anchor_rows, partner_rows)
    } else {
        (partner_batch, anchor_batch, partner_rows, anchor_rows)
    };
    let li = UInt32Array::from(li);
    let ri = UInt32Array::from(ri);
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for c in left.columns() {
        columns.push(take(c.as_ref(), &li, None)?);
    }
    for c in right.columns() {
        columns.push(take(c.as_ref(), &ri, None)?);
    }
    Ok(RecordBatch::try_new(schema, columns)?)
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
        _session: &dyn Session,
        _ctx: &PhysicalPlanningContext,
    ) -> DfResult<Option<Arc<dyn ExecutionPlan>>> {
        let Some(ai) = node.as_any().downcast_ref::<AiNode>() else {
            return Ok(None);
        };
        let schema = Arc::new(ai.schema.as_arrow().clone());
        Ok(Some(Arc::new(AiExec::new(
            ai.spec.clone(),
            physical_inputs.to_vec(),
            schema,
            self.runtime.clone(),
        ))))
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
