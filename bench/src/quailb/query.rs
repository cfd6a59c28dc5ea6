//! Running one QUAIL-B query end to end: tables registered, the plan consumed
//! into DataFusion and taken through the same AI rewrite as any SQL or
//! Substrait query, executed, and the rows plus per-operator answer tables
//! returned (SPEC §D.1's adapter contract).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use aisql_engine::data::row_sink::{MemoryRows, RowSink};
use aisql_engine::data::tables::{TablePaths, ai_batches, batch_text_bytes, read_table};
use aisql_engine::estimate::{Estimate, EstimatingBackend, Estimator, estimate_options};
use aisql_engine::exec::answers::AnswerTable;
use aisql_engine::inference::backend::{AiKind, InferenceBackend};
use aisql_engine::sql::options::QueryOptions;
use aisql_engine::sql::{Evaluation, SqlSession};
use aisql_engine::{EngineError, from_datafusion};
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::datasource::MemTable;
use datafusion::logical_expr::LogicalPlanBuilder;
use datafusion::prelude::SessionContext;

use crate::error::{BenchError, Result};
use crate::quailb::plan::{Operator, QueryPlan};

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
    pub measurements: aisql_engine::inference::work::Work,
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
    let (plan, _) = crate::quailb::consumer::analyze(&session, &query.substrait, false).await?;
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
        return Err(BenchError::Engine(EngineError::InvalidPlan(format!(
            "the plan produced {produced} columns, expected {names:?}"
        ))));
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
                    return Err(BenchError::Engine(EngineError::InvalidPlan(format!(
                        "{}: the plan's operator is a {kind:?}, DataFusion's a {:?}",
                        op.id(),
                        t.kind
                    ))));
                }
                t.aliases = aliases;
                t
            }
            None => AnswerTable::new(op.id(), kind, aliases, labels),
        };
        answers.push(table);
    }
    if let Some(extra) = recorded.first() {
        return Err(BenchError::Engine(EngineError::InvalidPlan(format!(
            "DataFusion's plan has an AI operator {} the QUAIL-B plan does not",
            extra.op_id
        ))));
    }
    Ok(QueryOutput {
        result_rows,
        answers,
        runtime_s: out.runtime_s,
        measurements: out.measurements,
        table_rows,
    })
}

/// Reads every table `query` scans and registers it with `ctx`, served in batches
/// of at most `batch_rows` rows and about `batch_text_bytes` bytes of document
/// text (the unit AI operators stream). Returns per table its row count and the
/// rows of its first batch when it has several.
pub fn register_tables(
    ctx: &SessionContext,
    query: &QueryPlan,
    paths: &TablePaths,
    batch_rows: usize,
    batch_text_bytes: usize,
) -> Result<BTreeMap<String, (usize, Option<usize>)>> {
    let mut out = BTreeMap::new();
    for table in query.tables() {
        let path = paths.get(&table).ok_or_else(|| {
            EngineError::Data(format!(
                "table {table} is needed by the plan but no file was given for it (known: {:?})",
                paths.keys().collect::<Vec<_>>()
            ))
        })?;
        let mut columns: Vec<String> = Vec::new();
        let mut text_columns: Vec<String> = Vec::new();
        for r in query.relations.iter().filter(|r| r.table == table) {
            if !text_columns.contains(&r.text_column) {
                text_columns.push(r.text_column.clone());
            }
            for c in &r.columns {
                if !columns.contains(c) {
                    columns.push(c.clone());
                }
            }
        }
        let batch = read_table(&table, path, &columns, &text_columns)?;
        let slices = ai_batches(&batch, &text_columns, batch_rows, batch_text_bytes);
        let first = (slices.len() > 1).then(|| slices[0].num_rows());
        out.insert(table.clone(), (batch.num_rows(), first));
        let mem = MemTable::try_new(batch.schema(), vec![slices]).map_err(from_datafusion)?;
        ctx.register_table(table.as_str(), Arc::new(mem))
            .map_err(from_datafusion)?;
    }
    Ok(out)
}

/// The estimate of `query` over `tables`, run on `backend` (from
/// [`Estimator::backend`]; cancel it to stop the estimate).
pub async fn estimate_query(
    estimator: &Estimator,
    backend: Arc<EstimatingBackend>,
    query: &QueryPlan,
    tables: &TablePaths,
    options: &QueryOptions,
) -> Result<Estimate> {
    let mut rows = aisql_engine::data::row_sink::CountedRows::default();
    let options = estimate_options(options);
    run_query_into(query, tables, backend.clone(), &options, &mut rows).await?;
    Ok(estimator.estimate(&backend))
}

/// Gives result batches the output names of the plan before `sink` sees them.
struct OutputColumns<'a> {
    schema: SchemaRef,
    sink: &'a mut dyn RowSink,
    rows: u64,
}

impl RowSink for OutputColumns<'_> {
    fn push(&mut self, batch: RecordBatch) -> aisql_engine::Result<()> {
        self.rows += batch.num_rows() as u64;
        let batch = RecordBatch::try_new(self.schema.clone(), batch.columns().to_vec())?;
        self.sink.push(batch)
    }

    fn keeps_rows_in_memory(&self) -> bool {
        self.sink.keeps_rows_in_memory()
    }
}
