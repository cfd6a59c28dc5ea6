//! Running one QUAIL-B query end to end: tables registered, the plan consumed
//! into DataFusion and taken through the same AI rewrite as any SQL or
//! Substrait query, executed, and the rows plus per-operator answer tables
//! returned (SPEC §D.1's adapter contract).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::logical_expr::LogicalPlanBuilder;

use crate::answers::AnswerTable;
use crate::backend::{AiKind, InferenceBackend};
use crate::coverage::OnRowError;
use crate::error::{EngineError, Result, from_datafusion};
use crate::plan::{Operator, QueryPlan};
use crate::prompt::PromptFormat;
use crate::row_sink::{MemoryRows, RowSink};
use crate::spend::Budget;
use crate::sql::{Evaluation, SqlSession};
use crate::tables::{TablePaths, batch_text_bytes, register_tables};

/// How a query runs.
#[derive(Debug, Clone)]
pub struct QueryOptions {
    /// Prompt layout.
    pub format: PromptFormat,
    /// How the AI operators' progress shows on stderr.
    pub progress: crate::progress::ProgressMode,
    /// Terminal progress lines go under this parent's bars (the benchmark's
    /// run bar).
    pub progress_parent: Option<indicatif::MultiProgress>,
    /// Questions each AI operator (by id) is expected to ask, from an
    /// estimate: the totals of the progress lines.
    pub expected_rows: std::collections::HashMap<String, u64>,
    /// Rows per batch streamed through the AI operators: a chain of operators
    /// handles one batch of documents at a time, so their KV stays cached.
    pub batch_rows: usize,
    /// Bytes DataFusion's operators may hold (its memory pool): the AI joins'
    /// partner sides, hash tables, sorts and the result rows. Past it a query
    /// fails with an error naming the operators holding the most.
    pub memory_limit: usize,
    /// Iterations a recursive CTE may run; past them the query fails naming it.
    pub max_recursion: usize,
    /// The model the backend answers with, as the user named it (`--model`):
    /// a Snowflake `AI_COMPLETE(model, ...)` must name this one. `None`: no
    /// model is named (any such call is refused).
    pub model: Option<String>,
    /// What each query may spend on the model, and what spending it does
    /// ([`crate::spend`]); `None`: no limit.
    pub budget: Option<Budget>,
    /// What a row the model cannot answer does ([`crate::coverage`]).
    pub on_row_error: OnRowError,
}

impl Default for QueryOptions {
    fn default() -> Self {
        Self {
            format: PromptFormat::default(),
            progress: Default::default(),
            progress_parent: None,
            expected_rows: Default::default(),
            batch_rows: 256,
            memory_limit: crate::host_memory::default_memory_limit(),
            max_recursion: crate::sql::recursion::DEFAULT_MAX_RECURSION,
            model: None,
            budget: None,
            on_row_error: OnRowError::Fail,
        }
    }
}

/// What a query returns besides its rows (SPEC §D.1): the rows went to the
/// [`RowSink`] it ran with.
#[derive(Debug, Clone)]
pub struct QueryOutput {
    /// Result rows handed to the sink.
    pub result_rows: u64,
    /// Answer tables of every AI operator, in post-order.
    pub answers: Vec<AnswerTable>,
    /// Seconds of query execution (consumption, planning, execution, model work).
    pub runtime_s: f64,
    /// Engine measurements (fresh tokens and the like).
    pub measurements: crate::work::Work,
    /// Rows per physical table read.
    pub table_rows: BTreeMap<String, usize>,
}

/// [`run_query_into`] with the rows kept in memory and returned in one batch
/// (one string column per selected alias or label column).
pub async fn run_query(
    query: &QueryPlan,
    paths: &TablePaths,
    backend: Arc<dyn InferenceBackend>,
    options: &QueryOptions,
) -> Result<(RecordBatch, QueryOutput)> {
    let schema = output_schema(query);
    let mut rows = MemoryRows::default();
    let out = run_query_into(query, paths, backend, options, &mut rows).await?;
    let rows = datafusion::arrow::compute::concat_batches(&schema, &rows.batches)?;
    Ok((rows, out))
}

/// The result columns of `query`: one non-null string column per output name.
pub fn output_schema(query: &QueryPlan) -> SchemaRef {
    Arc::new(Schema::new(
        query
            .output_names()
            .iter()
            .map(|n| Field::new(n, DataType::Utf8, false))
            .collect::<Vec<_>>(),
    ))
}

/// Runs `query` over the tables in `paths` with `backend`, its rows going to
/// `sink` as they arrive: DataFusion consumes the plan over those tables, the AI
/// rewrite that every plan goes through makes its AI calls AI operators (the
/// plan `query` was derived from, over the declared tables), and [`SqlSession`]
/// runs it.
pub async fn run_query_into(
    query: &QueryPlan,
    paths: &TablePaths,
    backend: Arc<dyn InferenceBackend>,
    options: &QueryOptions,
    sink: &mut dyn RowSink,
) -> Result<QueryOutput> {
    let session = SqlSession::new(backend.clone(), options.clone(), Evaluation::Operators)?;
    let registered = register_tables(
        session.context(),
        query,
        paths,
        options.batch_rows,
        batch_text_bytes(backend.kv_capacity_tokens()),
    )?;
    let mut table_rows = BTreeMap::new();
    for (table, (rows, first)) in registered {
        session.set_unique_ids(&table);
        session.note_first_batch(&table, first);
        table_rows.insert(table, rows);
    }

    let started = Instant::now();
    let (plan, _) = session.analyze_quailb(&query.substrait, false).await?;
    // Scan rows have unique ids, so rows that keep every relation's id are
    // distinct already; only a projection dropping a relation needs DISTINCT.
    let all_ids = query.relations.iter().all(|r| {
        query
            .select
            .iter()
            .any(|s| s.alias == r.alias && s.column == "id")
    });
    let plan = if all_ids {
        plan
    } else {
        LogicalPlanBuilder::from(plan)
            .distinct()
            .and_then(|b| b.build())
            .map_err(from_datafusion)?
    };
    let plan = session.optimize_analyzed(plan)?;
    let names = query.output_names();
    let produced = plan.schema().fields().len();
    if produced != names.len() {
        return Err(EngineError::InvalidPlan(format!(
            "the plan produced {produced} columns, expected {names:?}"
        )));
    }
    let mut named = OutputColumns {
        schema: output_schema(query),
        sink,
        rows: 0,
    };
    let out = session.run_plan_into(plan, started, &mut named).await?;
    let result_rows = named.rows;

    let mut recorded = out.answers;
    let mut answers = Vec::new();
    for op in &query.operators {
        let (kind, aliases, labels) = match op {
            Operator::Filter { alias, .. } => (AiKind::Filter, vec![alias.clone()], Vec::new()),
            Operator::Join { aliases, .. } => (AiKind::Join, aliases.to_vec(), Vec::new()),
            Operator::Classify {
                alias,
                partner,
                labels,
                ..
            } => {
                let mut a = vec![alias.clone()];
                a.extend(partner.clone());
                (AiKind::Classify, a, labels.clone())
            }
            Operator::InList { .. } => continue,
        };
        let table = match recorded.iter().position(|t| t.op_id == op.id()) {
            Some(i) => {
                let mut t = recorded.swap_remove(i);
                if t.kind != kind {
                    return Err(EngineError::InvalidPlan(format!(
                        "{}: the plan's operator is a {kind:?}, DataFusion's a {:?}",
                        op.id(),
                        t.kind
                    )));
                }
                t.aliases = aliases;
                t
            }
            None => AnswerTable::new(op.id(), kind, aliases, labels),
        };
        answers.push(table);
    }
    if let Some(extra) = recorded.first() {
        return Err(EngineError::InvalidPlan(format!(
            "DataFusion's plan has an AI operator {} the QUAIL-B plan does not",
            extra.op_id
        )));
    }
    Ok(QueryOutput {
        result_rows,
        answers,
        runtime_s: out.runtime_s,
        measurements: out.measurements,
        table_rows,
    })
}

/// The error of a Substrait consumer that panicked.
pub(crate) fn consume_panic(message: &str) -> EngineError {
    EngineError::InvalidPlan(format!("DataFusion could not consume the plan: {message}"))
}

/// Gives result batches the output names of the plan before `sink` sees them.
struct OutputColumns<'a> {
    schema: SchemaRef,
    sink: &'a mut dyn RowSink,
    rows: u64,
}

impl RowSink for OutputColumns<'_> {
    fn push(&mut self, batch: RecordBatch) -> Result<()> {
        self.rows += batch.num_rows() as u64;
        let batch = RecordBatch::try_new(self.schema.clone(), batch.columns().to_vec())?;
        self.sink.push(batch)
    }

    fn keeps_rows_in_memory(&self) -> bool {
        self.sink.keeps_rows_in_memory()
    }
}
