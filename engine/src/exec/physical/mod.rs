//! Physical AI operators: [`AiExec`] evaluates one [`AiNode`] by collecting its
//! input(s), asking the backend in batches grouped by anchor document, recording
//! the answer table, and emitting the surviving rows (filters), the TRUE pairs
//! (joins) or the rows with their label appended (classifications).
//!
//! Each distinct question is asked once per query even when it occurs in many
//! input rows or operators — after a join the same pair can repeat, a chain of
//! joins can ask one prompt twice — through the query's one memo
//! ([`crate::inference::memo`]); answer tables list every tuple an operator evaluated
//! exactly once (SPEC §D.1). Joins with equality
//! conditions (FEV-10) only ask about pairs that satisfy them. A join's row
//! work (candidates, document pairs, output chunks) is in `join.rs`.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use async_trait::async_trait;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, StringArray};
use datafusion::arrow::compute::{cast, concat_batches, filter_record_batch};
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
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder, MetricsSet, Time,
};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties, RecordBatchStream,
};
use datafusion::physical_planner::{DefaultPhysicalPlanner, ExtensionPlanner, PhysicalPlanner};
use futures::Stream;
use futures::future::BoxFuture;
use futures::stream::BoxStream;

use crate::error::{EngineError, Result};
use crate::exec::ai_aggregate::{AggCalls, DEFAULT_CONTEXT_POSITIONS, reduce_groups};
use crate::exec::answers::{AnswerRecorder, AnswerTable, answer_array};
use crate::exec::coverage::{OnRowError, QueryControls};
use crate::exec::logical::{AiNode, AiShape, AiSpec};
use crate::inference::backend::{
    AiCall, AiRequest, Answer, Answered, Doc, InferenceBackend, QueryBackend, check_answers,
};
use crate::inference::memo::{AnswerMemo, MemoKey};
use crate::inference::prompt::Excerpt;
use crate::inference::work::{Config, Work};

mod ask;
mod join;
mod metrics;
mod planner;
mod rows;
mod runtime;

use ask::{answer, answer_call, settle, settle_rows};
use join::{
    JoinSides, PartnerMarks, compact_views, join_batch, report_partners, unmatched_partners,
};
use metrics::AiMetrics;
pub use planner::{AiExtensionPlanner, AiQueryPlanner};
use rows::{RowDocs, id_strings, one_input};
pub use runtime::AiRuntime;

/// Requests per backend call. One input batch is asked in one call, so the
/// backend knows every document that batch still needs (it keeps their KV while
/// it evicts); it splits the work into forward passes by tokens itself.
const REQUESTS_PER_CALL: usize = usize::MAX;

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
        if matches!(node.spec.shape, AiShape::Join(_)) {
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

/// What one operator's batches share while it runs (one per
/// [`AiExec::execute`]).
struct OpState {
    /// What is asked and what the answers do ([`AiExec::spec`]).
    spec: AiSpec,
    /// Where the documents sit in the input batches.
    layout: Layout,
    /// The backend of the plan (its context, for `ai_agg`'s packing).
    backend: Arc<dyn InferenceBackend>,
    /// The query's backend, answer recorder, memo and controls.
    runtime: Arc<AiRuntime>,
    /// This execution's metrics, registered in the operator's set.
    metrics: AiMetrics,
    /// The operator's output schema.
    schema: SchemaRef,
    /// Questions already in this operator's answer table, by memo key (one
    /// per document pair: compact, as the memo's).
    recorded: std::sync::Mutex<HashSet<MemoKey>>,
}

/// The physical AI operator: evaluates one [`AiNode`] over its input (or, for
/// a join, its two inputs), asking the query's backend about each row's
/// documents a batch at a time, and emits what the node's [`AiShape`] makes
/// of the answers.
///
/// One partition; output as it is answered ([`EmissionType::Incremental`]),
/// through [`AiExecStream`].
#[derive(Debug)]
pub struct AiExec {
    /// What is asked (the call, its documents' columns, a join's equalities
    /// and residual condition) and what the answers do (the shape).
    spec: AiSpec,
    /// The spec's columns as indices into the input batches (left ‖ right for
    /// a join), resolved once when the plan is built.
    layout: Layout,
    /// The input; a join's left and right inputs, in that order.
    inputs: Vec<Arc<dyn ExecutionPlan>>,
    /// The output schema: the input's (filters), the input's with the answer
    /// appended (projections, aggregates), or the join's.
    schema: SchemaRef,
    /// Who answers: the backend each query begins on (its queries' own
    /// state comes with the task context, [`AiRuntime::of`]).
    backend: Arc<dyn InferenceBackend>,
    /// Execution metrics: DataFusion's baseline (output rows, batches and
    /// bytes) and the AI work ([`AiMetrics`]).
    metrics: ExecutionPlanMetricsSet,
    /// Plan properties: one partition, no ordering claimed, incremental,
    /// bounded.
    cache: Arc<PlanProperties>,
}

impl AiExec {
    /// The operator of `node` over its physical `inputs`.
    pub fn try_new(
        node: &AiNode,
        inputs: Vec<Arc<dyn ExecutionPlan>>,
        backend: Arc<dyn InferenceBackend>,
        session: &dyn Session,
    ) -> DfResult<Self> {
        let layout = Layout::of(node, session)?;
        Ok(Self::with_layout(
            node.spec.clone(),
            layout,
            inputs,
            Arc::new(node.schema.as_arrow().clone()),
            backend,
        ))
    }

    fn with_layout(
        spec: AiSpec,
        layout: Layout,
        inputs: Vec<Arc<dyn ExecutionPlan>>,
        schema: SchemaRef,
        backend: Arc<dyn InferenceBackend>,
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
            backend,
            metrics: ExecutionPlanMetricsSet::new(),
            cache,
        }
    }
}

impl DisplayAs for AiExec {
    /// `Default` is the one line `EXPLAIN` has always printed (tests and
    /// users read it); `Verbose` adds what the operator reads and asks;
    /// `TreeRender` gives the same facts as `key=value` lines for the boxes.
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let spec = &self.spec;
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => {
                write!(
                    f,
                    "AiExec: {} kind={:?} shape={:?} backend={} prompt_tokens≈{}+documents",
                    spec.call.op_id,
                    spec.call.kind,
                    spec.shape,
                    self.backend.name(),
                    spec.estimated_prompt_tokens()
                )?;
                if t == DisplayFormatType::Verbose {
                    self.fmt_details(f)?;
                }
                Ok(())
            }
            DisplayFormatType::TreeRender => {
                writeln!(f, "op={}", spec.call.op_id)?;
                writeln!(f, "kind={:?}", spec.call.kind)?;
                writeln!(f, "shape={:?}", spec.shape)?;
                let docs: Vec<String> = spec.docs.iter().map(|d| d.text.to_string()).collect();
                writeln!(f, "documents={}", docs.join(", "))?;
                write!(f, "backend={}", self.backend.name())
            }
        }
    }
}

impl AiExec {
    /// What `EXPLAIN VERBOSE` adds to the one line: the template, each
    /// document's (id, text) columns, a join's equalities and residual
    /// condition, the labels and the answer length.
    fn fmt_details(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let spec = &self.spec;
        write!(f, ", template={:?}", spec.call.template)?;
        let docs: Vec<String> = spec
            .docs
            .iter()
            .map(|d| format!("{}=({}, {})", d.alias, d.id, d.text))
            .collect();
        write!(f, ", documents=[{}]", docs.join(", "))?;
        if !spec.equalities.is_empty() {
            let on: Vec<String> = spec
                .equalities
                .iter()
                .map(|(a, b)| format!("{a} = {b}"))
                .collect();
            write!(f, ", equalities=[{}]", on.join(", "))?;
        }
        if let Some(residual) = &spec.residual {
            write!(f, ", residual={residual}")?;
        }
        if !spec.call.labels.is_empty() {
            write!(f, ", labels={:?}", spec.call.shown_labels())?;
        }
        if spec.call.max_tokens > 0 {
            write!(f, ", max_tokens={}", spec.call.max_tokens)?;
        }
        Ok(())
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

    /// `false` for every input, though a one-input operator emits its rows in
    /// their input order: DataFusion's sort pushdown would otherwise move a
    /// `SortExec` from above this operator to below it (it keeps `FilterExec`
    /// out of that by its type, which an extension cannot be), sorting rows a
    /// filter drops and changing the batches of documents the model is asked.
    /// A join emits its pairs anchor-major, then the rows kept unmatched, in
    /// neither input's order.
    fn maintains_input_order(&self) -> Vec<bool> {
        vec![false; self.inputs.len()]
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
            self.backend.clone(),
        )))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "AiExec has one partition, asked for {partition}"
            )));
        }
        let runtime = AiRuntime::of(&context)?;
        let state = Arc::new(OpState {
            spec: self.spec.clone(),
            layout: self.layout.clone(),
            backend: self.backend.clone(),
            metrics: AiMetrics::new(&self.metrics, &runtime.controls),
            runtime,
            schema: self.schema.clone(),
            recorded: std::sync::Mutex::new(HashSet::new()),
        });
        let output = match self.spec.shape {
            AiShape::Join(join_type) => Output::Join(self.join_output(join_type, &state, context)),
            // One input streamed batch by batch: a chain of operators sees each
            // batch of documents in turn while their KV is still cached, and a
            // LIMIT above stops the model work once it has its rows.
            _ => Output::OneInput {
                input: datafusion::physical_plan::execute_stream(self.inputs[0].clone(), context)?,
                answering: None,
            },
        };
        Ok(Box::pin(AiExecStream {
            schema: self.schema.clone(),
            output,
            state,
        }))
    }
}

impl AiExec {
    /// A join's output: collect the partner side, then stream the anchor
    /// side a batch at a time, then the partner rows the join type keeps for
    /// their match state.
    fn join_output(
        &self,
        join_type: datafusion::common::JoinType,
        state: &Arc<OpState>,
        context: Arc<TaskContext>,
    ) -> BoxStream<'static, DfResult<RecordBatch>> {
        use futures::{StreamExt, TryStreamExt};
        let state = state.clone();
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
            // The partner side stays in memory for the whole join: charged to the
            // query's pool batch by batch as it is read (a chain of joins makes
            // it grow combinatorially), so a side past `--memory-limit` fails
            // naming this join before it is all in memory.
            let reservation = MemoryConsumer::new(format!(
                "AiExec {} (partner side of the AI join)",
                state.spec.call.op_id
            ))
            .register(context.memory_pool());
            let mut read =
                datafusion::physical_plan::execute_stream(partner_plan, context.clone())?;
            let mut batches = Vec::new();
            while let Some(batch) = read.next().await {
                let batch = batch?;
                reservation.try_grow(batch.get_array_memory_size())?;
                batches.push(batch);
            }
            drop(read);
            // Joining the pieces copies them before they are dropped.
            reservation.try_grow(reservation.size())?;
            let partners = Arc::new(compact_views(concat_batches(&partner_schema, &batches)?)?);
            drop(batches);
            reservation.try_resize(partners.get_array_memory_size())?;
            report_partners(&state, &partners)?;
            let reservation = Arc::new(reservation);
            let marks = Arc::new(std::sync::Mutex::new(PartnerMarks::new(
                partners.num_rows(),
            )));
            let chunk_bytes = match context.memory_pool().memory_limit() {
                datafusion::execution::memory_pool::MemoryLimit::Finite(limit) => limit / 8,
                _ => usize::MAX,
            };
            let anchors = datafusion::physical_plan::execute_stream(anchor_plan, context)?;
            let (tail_state, tail_partners, tail_marks) =
                (state.clone(), partners.clone(), marks.clone());
            let anchor_schema = anchors.schema();
            let per_batch = anchors
                .and_then(move |batch| {
                    let (state, partners, marks) = (state.clone(), partners.clone(), marks.clone());
                    let _held = reservation.clone();
                    blocking(move || {
                        join_batch(
                            state,
                            sides,
                            batch,
                            partners,
                            &mut marks.lock().expect("partner marks lock"),
                            chunk_bytes,
                        )
                    })
                })
                // An anchor batch's rows are assembled a chunk at a time as they
                // are read, never its whole product at once.
                .map_ok(|output| futures::stream::iter(output).map_err(DataFusionError::from))
                .try_flatten();
            // Partner rows the join type keeps whether or not they matched.
            let tail = futures::stream::once(async move {
                let marks = tail_marks.lock().expect("partner marks lock");
                unmatched_partners(&tail_state, sides, anchor_schema, &tail_partners, &marks)
            })
            .try_filter(|b| futures::future::ready(b.num_rows() > 0));
            Ok::<_, DataFusionError>(per_batch.chain(tail))
        };
        futures::stream::once(partners).try_flatten().boxed()
    }
}

/// Where an [`AiExecStream`]'s batches come from.
enum Output {
    /// One input (filters, projections, aggregates): each input batch is
    /// answered off the async threads as it arrives, and the next one is
    /// read only once that batch is out, so a consumer that stops reading (a
    /// LIMIT above, a cancelled query) stops the model work.
    OneInput {
        /// The input's batches.
        input: SendableRecordBatchStream,
        /// The batch being answered, if any.
        answering: Option<BoxFuture<'static, DfResult<RecordBatch>>>,
    },
    /// A join ([`AiExec::join_output`]): partner side collected, anchor
    /// batches streamed in output chunks, then the partner rows kept for their
    /// match state.
    Join(BoxStream<'static, DfResult<RecordBatch>>),
}

/// The batches of one [`AiExec::execute`], each recorded in the operator's
/// baseline metrics (rows, batches, bytes) as it is emitted. Dropping it stops
/// the operator: no batch after the one being answered is read or asked.
struct AiExecStream {
    /// The operator's output schema.
    schema: SchemaRef,
    /// Where the batches come from.
    output: Output,
    /// What the batches share; its metrics record the output.
    state: Arc<OpState>,
}

impl AiExecStream {
    fn poll_output(&mut self, cx: &mut Context<'_>) -> Poll<Option<DfResult<RecordBatch>>> {
        use futures::StreamExt;
        let Self { output, state, .. } = self;
        match output {
            Output::Join(batches) => batches.poll_next_unpin(cx),
            Output::OneInput { input, answering } => loop {
                if let Some(answer) = answering {
                    let out = ready!(answer.as_mut().poll(cx));
                    *answering = None;
                    return Poll::Ready(Some(out));
                }
                match ready!(input.poll_next_unpin(cx)) {
                    Some(Ok(batch)) => {
                        let state = state.clone();
                        *answering = Some(Box::pin(blocking(move || one_input(&state, &batch))));
                    }
                    // An input error passes through; the end is the end.
                    other => return Poll::Ready(other),
                }
            },
        }
    }
}

impl Stream for AiExecStream {
    type Item = DfResult<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let poll = self.poll_output(cx);
        self.state.metrics.baseline.record_poll(poll)
    }
}

impl RecordBatchStream for AiExecStream {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
}

/// Runs one batch's model work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> DfResult<T> {
    // Tokio panics when the OS refuses a thread (a process or address-space
    // limit): that is an error of this query, not a crash.
    let task = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        tokio::task::spawn_blocking(f)
    }))
    .map_err(|panic| {
        DataFusionError::Execution(format!(
            "could not start a thread for model work: {}; the machine's thread or memory \
             limit is reached (fewer --cpu-workers or a smaller --memory-limit leave more)",
            crate::panic_hook::describe(panic.as_ref())
        ))
    })?;
    task.await
        .map_err(|e| DataFusionError::External(Box::new(e)))?
        .map_err(DataFusionError::from)
}

#[cfg(test)]
mod tests {
    //! [`AiExec`] run through a SQL session over in-memory tables, answered by
    //! the content-hash backend (the same answer for the same prompt, however
    //! it is asked): each shape against row-by-row evaluation, a LIMIT above
    //! it, cancellation, an empty input, its metrics and its display.

    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;
    use std::time::Duration;

    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{Field, Schema};
    use datafusion::common::utils::memory::get_record_batch_memory_size;
    use datafusion::datasource::MemTable;
    use futures::{FutureExt, StreamExt, TryStreamExt};

    use super::*;
    use crate::inference::backend::{Answerer, ContentHashBackend, QueryStart};
    use crate::sql::options::QueryOptions;
    use crate::sql::{Evaluation, SqlSession, row_lines};

    const FILTER: &str =
        "SELECT id FROM docs WHERE ai_filter('Is the review {0} about food?', body)";
    const CLASSIFY: &str = "SELECT id, ai_classify('Which topic fits {0}?', body, \
                            ['price', 'quality', 'service'], ['', '', '']) AS topic FROM docs";
    const SCORE: &str = "SELECT id, ai_score('Is the review {0} positive?', body) AS s FROM docs";
    const AGGREGATE: &str = "SELECT ai_agg('Summarise the reviews above.', body) AS s FROM docs";
    const JOIN: &str = "SELECT d.id, t.id AS topic FROM docs d JOIN topics t \
                        ON ai_join('Does the review {0} discuss the aspect {1}?', d.body, t.description)";
    const LEFT_JOIN: &str = "SELECT d.id, t.id AS topic FROM docs d LEFT JOIN topics t \
                             ON ai_join('Does the review {0} discuss the aspect {1}?', d.body, t.description)";

    /// Rows per batch of `docs`: its ten rows come in four batches.
    const DOCS_BATCH: usize = 3;

    const REVIEWS: [&str; 10] = [
        "The soup was cold and the waiter rude.",
        "Great pasta, fair prices, will come back.",
        "Service was slow but the dessert made up for it.",
        "Overpriced for what you get.",
        "The curry was the best I have had in years.",
        "Loud music, could not hear my friends.",
        "Friendly staff and a cosy room.",
        "The bread was stale.",
        "Cheap lunch menu, good value.",
        "We waited an hour for a table.",
    ];

    /// [`ContentHashBackend`]'s answers with its calls counted. Gated, each
    /// call says it started, then waits until the test drops the gate's
    /// sender.
    #[derive(Default)]
    struct Counting {
        answers: ContentHashBackend,
        calls: AtomicUsize,
        gate: Option<Gate>,
    }

    /// Where a call says it started, and what it waits on.
    type Gate = (
        std::sync::Mutex<mpsc::Sender<()>>,
        std::sync::Mutex<mpsc::Receiver<()>>,
    );

    impl Counting {
        fn calls(&self) -> usize {
            self.calls.load(Ordering::SeqCst)
        }
    }

    impl Answerer for Counting {
        fn name(&self) -> &str {
            "counting"
        }

        fn context_positions(&self) -> Option<usize> {
            Answerer::context_positions(&self.answers)
        }

        fn answer(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Vec<Answer>> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if let Some((started, open)) = &self.gate {
                let _ = started.lock().unwrap().send(());
                let _ = open.lock().unwrap().recv();
            }
            self.answers.answer(call, requests)
        }
    }

    fn table(schema: SchemaRef, rows: Vec<Vec<ArrayRef>>) -> Arc<MemTable> {
        let batches = rows
            .into_iter()
            .map(|columns| RecordBatch::try_new(schema.clone(), columns).unwrap())
            .collect();
        Arc::new(MemTable::try_new(schema, vec![batches]).unwrap())
    }

    /// `docs` (id, body: ten reviews in batches of [`DOCS_BATCH`]), `topics`
    /// (id, description: three aspects) and `empty_docs` (the schema of
    /// `docs`, one batch of no rows).
    fn session(backend: Arc<dyn InferenceBackend>, evaluation: Evaluation) -> SqlSession {
        let s = SqlSession::new(backend, QueryOptions::default(), evaluation).unwrap();
        let docs = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("body", DataType::Utf8, false),
        ]));
        let chunks = (0..REVIEWS.len())
            .step_by(DOCS_BATCH)
            .map(|start| {
                let rows = start..(start + DOCS_BATCH).min(REVIEWS.len());
                vec![
                    Arc::new(Int64Array::from_iter_values(rows.clone().map(|i| i as i64)))
                        as ArrayRef,
                    Arc::new(StringArray::from_iter_values(rows.map(|i| REVIEWS[i]))),
                ]
            })
            .collect();
        let ctx = s.context();
        ctx.register_table("docs", table(docs.clone(), chunks))
            .unwrap();
        let empty = RecordBatch::new_empty(docs.clone());
        ctx.register_table("empty_docs", table(docs, vec![empty.columns().to_vec()]))
            .unwrap();
        let topics = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, false),
            Field::new("description", DataType::Utf8, false),
        ]));
        let aspects = [("t1", "food"), ("t2", "price"), ("t3", "service")];
        ctx.register_table(
            "topics",
            table(
                topics,
                vec![vec![
                    Arc::new(StringArray::from_iter_values(aspects.iter().map(|a| a.0))),
                    Arc::new(StringArray::from_iter_values(aspects.iter().map(|a| a.1))),
                ]],
            ),
        )
        .unwrap();
        s
    }

    async fn physical(session: &SqlSession, sql: &str) -> Arc<dyn ExecutionPlan> {
        let plan = session.plan(sql).await.unwrap();
        session
            .context()
            .state()
            .create_physical_plan(&plan)
            .await
            .unwrap()
    }

    /// The topmost [`AiExec`] of `plan`.
    fn ai_node(plan: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
        if plan.is::<AiExec>() {
            return Some(plan.clone());
        }
        plan.children().into_iter().find_map(ai_node)
    }

    fn ai_exec(plan: &Arc<dyn ExecutionPlan>) -> &AiExec {
        let mut at = plan;
        loop {
            if let Some(ai) = at.downcast_ref::<AiExec>() {
                return ai;
            }
            at = at.children().into_iter().next().expect("an AiExec");
        }
    }

    /// A task context carrying a query begun on the backend of `node` (an
    /// [`AiExec`] or a plan above one), as a query run by the session has.
    fn query_task(session: &SqlSession, node: &Arc<dyn ExecutionPlan>) -> Arc<TaskContext> {
        let options = QueryOptions::default();
        let runtime = Arc::new(AiRuntime {
            query: ai_exec(node)
                .backend
                .clone()
                .begin(QueryStart::default())
                .unwrap(),
            recorder: Arc::default(),
            memo: std::sync::Mutex::new(AnswerMemo::new(true)),
            controls: Arc::new(QueryControls::new(options.budget, options.on_row_error)),
            progress: Arc::new(crate::exec::progress::Progress::new(options.progress, None)),
        });
        let mut state = session.context().state();
        state.config_mut().set_extension(runtime);
        Arc::new(TaskContext::from(&state))
    }

    /// The rows of running `node` alone, its batches as emitted.
    async fn run_node(session: &SqlSession, node: &Arc<dyn ExecutionPlan>) -> Vec<RecordBatch> {
        let stream = node.execute(0, query_task(session, node)).unwrap();
        assert_eq!(stream.schema(), node.schema());
        stream.try_collect().await.unwrap()
    }

    fn sorted_lines(batches: &[RecordBatch]) -> Vec<String> {
        let mut lines = row_lines(batches).unwrap();
        lines.sort();
        lines
    }

    fn metric(node: &Arc<dyn ExecutionPlan>, name: &str) -> usize {
        node.metrics()
            .unwrap()
            .sum(|m| m.value().name() == name)
            .map_or(0, |v| v.as_usize())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_shape_gives_the_rows_of_row_by_row_evaluation() {
        for (sql, shape) in [
            (FILTER, "Filter"),
            (CLASSIFY, "Project"),
            (SCORE, "Project"),
            (AGGREGATE, "Aggregate"),
            (JOIN, "Join(Inner)"),
            (LEFT_JOIN, "Join(Left)"),
        ] {
            let backend = Arc::new(Counting::default());
            let ops = session(backend.clone(), Evaluation::Operators);
            let plan = physical(&ops, sql).await;
            assert_eq!(format!("{:?}", ai_exec(&plan).spec.shape), shape, "{sql}");
            let got = ops.run(sql).await.unwrap().batches;
            let naive = session(Arc::new(ContentHashBackend::default()), Evaluation::Naive);
            let want = naive.run(sql).await.unwrap().batches;
            assert_eq!(sorted_lines(&got), sorted_lines(&want), "{sql}");
            assert!(!row_lines(&got).unwrap().is_empty(), "{sql}");
            assert!(backend.calls() > 0, "{sql}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_filter_keeps_some_rows_and_one_input_keeps_its_order() {
        let ops = session(
            Arc::new(ContentHashBackend::default()),
            Evaluation::Operators,
        );
        let kept = row_lines(&ops.run(FILTER).await.unwrap().batches).unwrap();
        assert!(
            !kept.is_empty() && kept.len() < REVIEWS.len(),
            "a real filter: {kept:?}"
        );
        // Rows come out in their input order (no ORDER BY).
        let ids: Vec<i64> = kept.iter().map(|l| l.parse().unwrap()).collect();
        assert!(ids.is_sorted(), "{ids:?}");
        let classified = row_lines(&ops.run(CLASSIFY).await.unwrap().batches).unwrap();
        let ids: Vec<String> = classified
            .iter()
            .map(|l| l.split(" | ").next().unwrap().to_string())
            .collect();
        let want: Vec<String> = (0..REVIEWS.len()).map(|i| i.to_string()).collect();
        assert_eq!(ids, want);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_sort_above_stays_above() {
        // `maintains_input_order` is false: the sort is not pushed below the
        // operator, so the model is asked about the input's batches.
        let ops = session(
            Arc::new(ContentHashBackend::default()),
            Evaluation::Operators,
        );
        let plan = physical(&ops, &format!("{CLASSIFY} ORDER BY id DESC")).await;
        let text = datafusion::physical_plan::displayable(plan.as_ref())
            .indent(false)
            .to_string();
        let at = |what: &str| {
            text.find(what)
                .unwrap_or_else(|| panic!("{what} in {text}"))
        };
        assert!(at("SortExec") < at("AiExec"), "{text}");
        assert_eq!(ai_exec(&plan).maintains_input_order(), vec![false]);
        let join = physical(&ops, JOIN).await;
        assert_eq!(ai_exec(&join).maintains_input_order(), vec![false, false]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_limit_above_stops_asking_once_it_has_its_rows() {
        // A projection passes the LIMIT down to its input (one row out per
        // row in): the scan stops at four rows, in batches of three and one,
        // and only those four are asked.
        let backend = Arc::new(Counting::default());
        let ops = session(backend.clone(), Evaluation::Operators);
        let rows = ops
            .run(&format!("{CLASSIFY} LIMIT 4"))
            .await
            .unwrap()
            .batches;
        assert_eq!(row_lines(&rows).unwrap().len(), 4);
        assert_eq!(backend.calls(), 2);
        assert_eq!(backend.answers.prompts(), 4);
        // A filter cannot know how many rows it keeps: it reads its input a
        // batch at a time and stops once the LIMIT has its row.
        let all = row_lines(&ops.run(FILTER).await.unwrap().batches).unwrap();
        let first: usize = all[0].parse().unwrap();
        let backend = Arc::new(Counting::default());
        let ops = session(backend.clone(), Evaluation::Operators);
        let rows = ops.run(&format!("{FILTER} LIMIT 1")).await.unwrap().batches;
        assert_eq!(row_lines(&rows).unwrap(), [first.to_string()]);
        let batches = REVIEWS.len().div_ceil(DOCS_BATCH);
        assert!(first / DOCS_BATCH + 1 < batches, "kept row {first}");
        assert_eq!(backend.calls(), first / DOCS_BATCH + 1);
        // Without a LIMIT, every batch.
        let backend = Arc::new(Counting::default());
        let ops = session(backend.clone(), Evaluation::Operators);
        ops.run(FILTER).await.unwrap();
        assert_eq!(backend.calls(), batches);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dropping_the_stream_stops_the_model_work() {
        let (started_tx, started) = mpsc::channel();
        let (open, open_rx) = mpsc::channel::<()>();
        let backend = Arc::new(Counting {
            gate: Some((
                std::sync::Mutex::new(started_tx),
                std::sync::Mutex::new(open_rx),
            )),
            ..Default::default()
        });
        let ops = session(backend.clone(), Evaluation::Operators);
        let plan = physical(&ops, CLASSIFY).await;
        let node = ai_node(&plan).unwrap();
        let mut stream = node.execute(0, query_task(&ops, &node)).unwrap();
        // The first poll starts the first batch's call, which waits at the gate.
        assert!(stream.next().now_or_never().is_none());
        started.recv_timeout(Duration::from_secs(10)).unwrap();
        drop(stream);
        drop(open);
        // The call under way finishes; no other batch is asked.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(backend.calls(), 1);
        assert!(started.try_recv().is_err());
        assert_eq!(metric(&node, "output_rows"), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_empty_input_asks_nothing_and_gives_no_rows() {
        for sql in [
            FILTER,
            CLASSIFY,
            SCORE,
            AGGREGATE,
            JOIN,
            LEFT_JOIN,
            "SELECT t.id, d.id FROM topics t JOIN docs d \
             ON ai_join('Does the review {1} discuss the aspect {0}?', t.description, d.body)",
        ] {
            let sql = sql
                .replace("FROM docs", "FROM empty_docs")
                .replace("JOIN docs", "JOIN empty_docs");
            let backend = Arc::new(Counting::default());
            let ops = session(backend.clone(), Evaluation::Operators);
            let plan = physical(&ops, &sql).await;
            let node = ai_node(&plan).unwrap();
            let batches = run_node(&ops, &node).await;
            let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
            if sql == AGGREGATE.replace("FROM docs", "FROM empty_docs") {
                // An aggregate without GROUP BY has one group, of no rows:
                // one row out, its answer NULL, nothing asked.
                assert_eq!(rows, 1, "{sql}");
                let batch = batches.iter().find(|b| b.num_rows() == 1).unwrap();
                assert!(batch.column(batch.num_columns() - 1).is_null(0), "{sql}");
            } else {
                assert_eq!(rows, 0, "{sql}");
            }
            assert!(batches.iter().all(|b| b.schema() == node.schema()), "{sql}");
            assert_eq!(backend.calls(), 0, "{sql}");
            assert_eq!(metric(&node, "output_rows"), rows, "{sql}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn metrics_count_every_emitted_row_batch_and_byte() {
        for sql in [FILTER, CLASSIFY, AGGREGATE, JOIN, LEFT_JOIN] {
            let ops = session(
                Arc::new(ContentHashBackend::default()),
                Evaluation::Operators,
            );
            let plan = physical(&ops, sql).await;
            let node = ai_node(&plan).unwrap();
            let batches = run_node(&ops, &node).await;
            let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
            let bytes: usize = batches.iter().map(get_record_batch_memory_size).sum();
            assert!(rows > 0 && bytes > 0, "{sql}");
            assert_eq!(metric(&node, "output_rows"), rows, "{sql}");
            assert_eq!(metric(&node, "output_batches"), batches.len(), "{sql}");
            assert_eq!(metric(&node, "output_bytes"), bytes, "{sql}");
            assert!(metric(&node, "input_rows") > 0, "{sql}");
            assert!(metric(&node, "model_calls") > 0, "{sql}");
        }
    }

    /// `exec` shown in format `t`.
    struct Shown<'a>(&'a AiExec, DisplayFormatType);

    impl fmt::Display for Shown<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            self.0.fmt_as(self.1, f)
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn display_honours_the_format() {
        let ops = session(
            Arc::new(ContentHashBackend::default()),
            Evaluation::Operators,
        );
        let plan = physical(&ops, CLASSIFY).await;
        let ai = ai_exec(&plan);
        let line = format!(
            "AiExec: {} kind=Classify shape=Project backend=content-hash prompt_tokens≈{}+documents",
            ai.spec.call.op_id,
            ai.spec.estimated_prompt_tokens()
        );
        // EXPLAIN's one line, unchanged.
        assert_eq!(Shown(ai, DisplayFormatType::Default).to_string(), line);
        let indented = datafusion::physical_plan::displayable(plan.as_ref())
            .indent(false)
            .to_string();
        assert!(indented.contains(&format!("{line}\n")), "{indented}");
        // Verbose: the same line, then what the operator reads and asks.
        let verbose = Shown(ai, DisplayFormatType::Verbose).to_string();
        let details = verbose.strip_prefix(&line).expect("the one line first");
        assert_eq!(
            details,
            ", template=\"Which topic fits {0}?\", documents=[docs=(docs.body, docs.body)], \
             labels=[\"price\", \"quality\", \"service\"]"
        );
        // Tree: key=value lines.
        let tree = Shown(ai, DisplayFormatType::TreeRender).to_string();
        assert_eq!(
            tree,
            format!(
                "op={}\nkind=Classify\nshape=Project\ndocuments=docs.body\nbackend=content-hash",
                ai.spec.call.op_id
            )
        );
        // A join's residual condition, in verbose only.
        let sql = "SELECT d.id, t.id FROM docs d JOIN topics t ON length(t.description) > d.id \
                   AND ai_join('Does the review {0} discuss the aspect {1}?', d.body, t.description)";
        let plan = physical(&ops, sql).await;
        let ai = ai_exec(&plan);
        let default = Shown(ai, DisplayFormatType::Default).to_string();
        assert!(!default.contains("residual"), "{default}");
        let verbose = Shown(ai, DisplayFormatType::Verbose).to_string();
        assert!(verbose.starts_with(&default), "{verbose}");
        assert!(verbose.contains("documents=[d=("), "{verbose}");
        assert!(verbose.contains(", residual="), "{verbose}");
    }
}
