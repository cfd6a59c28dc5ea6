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
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{LogicalPlan, UserDefinedLogicalNode};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use datafusion::physical_planner::{DefaultPhysicalPlanner, ExtensionPlanner, PhysicalPlanner};
use datafusion::execution::context::QueryPlanner;
use datafusion::catalog::Session;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use indicatif::{ProgressBar, ProgressStyle};

use crate::answers::{AnswerRecorder, AnswerTable};
use crate::backend::{AiKind, AiRequest, Doc, InferenceBackend};
use crate::error::{EngineError, Result};
use crate::logical::{AiNode, AiSpec};

/// Requests per backend call: large enough to batch well, small enough to show
/// progress and bound memory.
const REQUESTS_PER_CALL: usize = 4096;

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
    pub fn new(spec: AiSpec, inputs: Vec<Arc<dyn ExecutionPlan>>, schema: SchemaRef, runtime: AiRuntime) -> Self {
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

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> DfResult<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(AiExec::new(
            self.spec.clone(),
            children,
            self.schema.clone(),
            self.runtime.clone(),
        )))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> DfResult<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "AiExec has one partition, asked for {partition}"
            )));
        }
        let inputs = self.inputs.clone();
        let spec = self.spec.clone();
        let schema = self.schema.clone();
        let runtime = self.runtime.clone();
        let work = async move {
            let mut collected = Vec::with_capacity(inputs.len());
            for input in inputs {
                let input_schema = input.schema();
                let batches = datafusion::physical_plan::collect(input, context.clone()).await?;
                collected.push(concat_batches(&input_schema, &batches)?);
            }
            let out_schema = schema.clone();
            tokio::task::spawn_blocking(move || evaluate(&spec, &runtime, &collected, out_schema))
                .await
                .map_err(|e| DataFusionError::External(Box::new(e)))?
                .map_err(DataFusionError::from)
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            futures::stream::once(work),
        )))
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

/// Row index of the first occurrence of each distinct value, per row.
fn canonical_rows(ids: &StringArray) -> (Vec<u32>, bool) {
    let mut first: HashMap<&str, u32> = HashMap::with_capacity(ids.len());
    let mut unique = true;
    let canon = (0..ids.len())
        .map(|i| {
            let id = ids.value(i);
            *first
                .entry(id)
                .and_modify(|_| unique = false)
                .or_insert(i as u32)
        })
        .collect();
    (canon, unique)
}

fn progress_bar(runtime: &AiRuntime, op_id: &str, total: usize) -> ProgressBar {
    if !runtime.progress || total < REQUESTS_PER_CALL {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total as u64);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>12} [{bar:30}] {pos}/{len} prompts {per_sec} eta {eta}")
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
fn classify_all(spec: &AiSpec, runtime: &AiRuntime, requests: &[AiRequest<'_>]) -> Result<Vec<usize>> {
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

fn evaluate(spec: &AiSpec, runtime: &AiRuntime, inputs: &[RecordBatch], schema: SchemaRef) -> Result<RecordBatch> {
    match (spec.call.kind, spec.slots.len()) {
        (AiKind::Filter, 1) | (AiKind::Classify, 1) => one_document(spec, runtime, &inputs[0], schema),
        (AiKind::Classify, 2) => pair_classify(spec, runtime, &inputs[0], schema),
        (AiKind::Join, 2) => join(spec, runtime, &inputs[0], &inputs[1], schema),
        _ => Err(EngineError::InvalidPlan(format!(
            "{}: unexpected operator shape",
            spec.call.op_id
        ))),
    }
}

/// Filters and one-document classifications.
fn one_document(spec: &AiSpec, runtime: &AiRuntime, batch: &RecordBatch, schema: SchemaRef) -> Result<RecordBatch> {
    let op = &spec.call.op_id;
    let slot = &spec.slots[0];
    let ids = strings(batch, slot.id_index, op)?;
    let texts = strings(batch, slot.text_index, op)?;
    let (canon, _) = canonical_rows(ids);
    let distinct: Vec<u32> = canon
        .iter()
        .enumerate()
        .filter(|(i, c)| **c as usize == *i)
        .map(|(i, _)| i as u32)
        .collect();
    let requests: Vec<AiRequest<'_>> = distinct
        .iter()
        .map(|&i| AiRequest {
            anchor: Doc {
                id: ids.value(i as usize),
                text: texts.value(i as usize),
            },
            partner: None,
        })
        .collect();
    let mut position = vec![u32::MAX; batch.num_rows()];
    for (k, &i) in distinct.iter().enumerate() {
        position[i as usize] = k as u32;
    }
    let mut table = AnswerTable::new(op, spec.call.kind, vec![slot.alias.clone()]);
    table.ids[0] = requests.iter().map(|r| r.anchor.id.to_string()).collect();
    match spec.call.kind {
        AiKind::Filter => {
            let answers = decide_all(spec, runtime, &requests)?;
            let mask: BooleanArray = canon
                .iter()
                .map(|&c| Some(answers[position[c as usize] as usize]))
                .collect();
            table.answers = answers;
            runtime.recorder.record(table);
            let out = filter_record_batch(batch, &mask)?;
            Ok(RecordBatch::try_new(schema, out.columns().to_vec())?)
        }
        _ => {
            let chosen = classify_all(spec, runtime, &requests)?;
            let labels: Vec<&str> = chosen.iter().map(|&i| spec.call.labels[i].as_str()).collect();
            let column = StringArray::from_iter_values(
                canon.iter().map(|&c| labels[position[c as usize] as usize]),
            );
            table.labels = labels.iter().map(|s| s.to_string()).collect();
            runtime.recorder.record(table);
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
fn pair_classify(spec: &AiSpec, runtime: &AiRuntime, batch: &RecordBatch, schema: SchemaRef) -> Result<RecordBatch> {
    let op = &spec.call.op_id;
    let (s0, s1) = (&spec.slots[0], &spec.slots[1]);
    let (ids0, texts0) = (strings(batch, s0.id_index, op)?, strings(batch, s0.text_index, op)?);
    let (ids1, texts1) = (strings(batch, s1.id_index, op)?, strings(batch, s1.text_index, op)?);
    let mut pair_index: HashMap<(&str, &str), u32> = HashMap::new();
    let mut firsts = Vec::new();
    let row_pair: Vec<u32> = (0..batch.num_rows())
        .map(|i| {
            *pair_index.entry((ids0.value(i), ids1.value(i))).or_insert_with(|| {
                firsts.push(i);
                (firsts.len() - 1) as u32
            })
        })
        .collect();
    // Group by anchor so one anchor's KV serves all its partners.
    let mut order: Vec<usize> = (0..firsts.len()).collect();
    order.sort_by_key(|&k| (ids0.value(firsts[k]), firsts[k]));
    let requests: Vec<AiRequest<'_>> = order
        .iter()
        .map(|&k| {
            let i = firsts[k];
            AiRequest {
                anchor: Doc {
                    id: ids0.value(i),
                    text: texts0.value(i),
                },
                partner: Some(Doc {
                    id: ids1.value(i),
                    text: texts1.value(i),
                }),
            }
        })
        .collect();
    let chosen = classify_all(spec, runtime, &requests)?;
    let mut label_of_pair = vec![0usize; firsts.len()];
    for (pos, &k) in order.iter().enumerate() {
        label_of_pair[k] = chosen[pos];
    }
    let mut table = AnswerTable::new(op, AiKind::Classify, vec![s0.alias.clone(), s1.alias.clone()]);
    table.ids[0] = requests.iter().map(|r| r.anchor.id.to_string()).collect();
    table.ids[1] = requests
        .iter()
        .map(|r| r.partner.expect("pair").id.to_string())
        .collect();
    table.labels = chosen.iter().map(|&i| spec.call.labels[i].clone()).collect();
    runtime.recorder.record(table);
    let column = StringArray::from_iter_values(
        row_pair
            .iter()
            .map(|&p| spec.call.labels[label_of_pair[p as usize]].as_str()),
    );
    append_column(batch, Arc::new(column), schema)
}

/// AI join: every (anchor, partner) candidate that meets the equalities is asked
/// once; TRUE pairs are emitted as left ‖ right rows.
fn join(spec: &AiSpec, runtime: &AiRuntime, left: &RecordBatch, right: &RecordBatch, schema: SchemaRef) -> Result<RecordBatch> {
    let op = &spec.call.op_id;
    let lw = spec.left_width;
    let side = |index: usize| -> (bool, usize) {
        if index < lw { (true, index) } else { (false, index - lw) }
    };
    let (s0, s1) = (&spec.slots[0], &spec.slots[1]);
    let (anchor_left, a_id) = side(s0.id_index);
    let (_, a_text) = side(s0.text_index);
    let (partner_left, p_id) = side(s1.id_index);
    let (_, p_text) = side(s1.text_index);
    if anchor_left == partner_left {
        return Err(EngineError::InvalidPlan(format!(
            "{op}: both documents come from one join input"
        )));
    }
    let (anchor_batch, partner_batch) = if anchor_left { (left, right) } else { (right, left) };
    let a_ids = strings(anchor_batch, a_id, op)?;
    let a_texts = strings(anchor_batch, a_text, op)?;
    let p_ids = strings(partner_batch, p_id, op)?;
    let p_texts = strings(partner_batch, p_text, op)?;

    // Partner rows per equality key (all partner rows when there is no equality).
    let eq: Vec<(usize, usize)> = spec
        .equalities
        .iter()
        .map(|&(c0, c1)| (side(c0).1, side(c1).1))
        .collect();
    let eq_cols = |batch: &RecordBatch, which: &dyn Fn(&(usize, usize)) -> usize| -> Result<Vec<StringArray>> {
        eq.iter()
            .map(|e| strings(batch, which(e), op).cloned())
            .collect()
    };
    let a_keys = eq_cols(anchor_batch, &|e| e.0)?;
    let p_keys = eq_cols(partner_batch, &|e| e.1)?;
    let key = |cols: &[StringArray], row: usize| -> Vec<String> {
        cols.iter().map(|c| c.value(row).to_string()).collect()
    };
    let mut by_key: HashMap<Vec<String>, Vec<u32>> = HashMap::new();
    if !eq.is_empty() {
        for r in 0..partner_batch.num_rows() {
            by_key.entry(key(&p_keys, r)).or_default().push(r as u32);
        }
    }
    let all_partners: Vec<u32> = (0..partner_batch.num_rows() as u32).collect();

    let (a_canon, a_unique) = canonical_rows(a_ids);
    let (p_canon, p_unique) = canonical_rows(p_ids);
    // Candidates grouped by anchor row; distinct pairs numbered in first-seen order.
    let mut candidates: Vec<(u32, u32, u32)> = Vec::new(); // (anchor row, partner row, pair)
    let mut pair_index: HashMap<(u32, u32), u32> = HashMap::new();
    let mut pairs: Vec<(u32, u32)> = Vec::new();
    for a in 0..anchor_batch.num_rows() {
        let partners = if eq.is_empty() {
            &all_partners[..]
        } else {
            by_key.get(&key(&a_keys, a)).map_or(&[][..], |v| &v[..])
        };
        for &p in partners {
            let k = (a_canon[a], p_canon[p as usize]);
            let pair = if a_unique && p_unique {
                pairs.push(k);
                (pairs.len() - 1) as u32
            } else {
                *pair_index.entry(k).or_insert_with(|| {
                    pairs.push(k);
                    (pairs.len() - 1) as u32
                })
            };
            candidates.push((a as u32, p, pair));
        }
    }
    let mut order: Vec<usize> = (0..pairs.len()).collect();
    order.sort_by_key(|&k| pairs[k].0);
    let requests: Vec<AiRequest<'_>> = order
        .iter()
        .map(|&k| {
            let (a, p) = (pairs[k].0 as usize, pairs[k].1 as usize);
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
    let answers = decide_all(spec, runtime, &requests)?;
    let mut answer_of_pair = vec![false; pairs.len()];
    for (pos, &k) in order.iter().enumerate() {
        answer_of_pair[k] = answers[pos];
    }
    let mut table = AnswerTable::new(op, AiKind::Join, vec![s0.alias.clone(), s1.alias.clone()]);
    table.ids[0] = requests.iter().map(|r| r.anchor.id.to_string()).collect();
    table.ids[1] = requests
        .iter()
        .map(|r| r.partner.expect("pair").id.to_string())
        .collect();
    table.answers = answers;
    runtime.recorder.record(table);

    let mut left_rows = Vec::new();
    let mut right_rows = Vec::new();
    for &(a, p, pair) in &candidates {
        if answer_of_pair[pair as usize] {
            let (l, r) = if anchor_left { (a, p) } else { (p, a) };
            left_rows.push(l);
            right_rows.push(r);
        }
    }
    let li = UInt32Array::from(left_rows);
    let ri = UInt32Array::from(right_rows);
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
