//! Running one QUAIL-B query end to end: tables registered, the plan consumed
//! into DataFusion and taken through the same AI rewrite as any SQL or
//! Substrait query, executed, and the rows plus per-operator answer tables
//! returned (SPEC §D.1's adapter contract).

use std::borrow::Cow;
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use aisql_engine::data::row_sink::{MemoryRows, RowSink};
use aisql_engine::data::tables::{TablePaths, ai_batches, batch_text_bytes, read_table};
use aisql_engine::estimate::{Estimate, EstimatingBackend, Estimator, estimate_options};
use aisql_engine::exec::answers::AnswerTable;
use aisql_engine::inference::backend::{AiKind, InferenceBackend};
use aisql_engine::sql::options::QueryOptions;
use aisql_engine::sql::{Evaluation, QueryCanceller, SqlSession};
use aisql_engine::{EngineError, from_datafusion};
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::datasource::{MemTable, provider_as_source};
use datafusion::error::DataFusionError;
use datafusion::logical_expr::{LogicalPlan, LogicalPlanBuilder, TableSource};

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
    /// Seconds of query execution (planning, execution, model work; not reading tables).
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
    run_query_with(query, paths, backend, options, &QueryCanceller::default()).await
}

/// [`run_query`], its query reachable through `canceller`.
pub async fn run_query_with(
    query: &QueryPlan,
    paths: &TablePaths,
    backend: Arc<dyn InferenceBackend>,
    options: &QueryOptions,
    canceller: &QueryCanceller,
) -> Result<(RecordBatch, QueryOutput)> {
    let schema = output_schema(query);
    let mut rows = MemoryRows::default();
    let out = run_query_into(query, paths, backend, options, canceller, &mut rows).await?;
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
/// `sink` as they arrive. The plan that runs is the one `query`'s view was
/// derived from (planned once, over the declared tables; in another prompt
/// format, planned anew in it), its scans given the tables read from `paths`,
/// and [`SqlSession`] runs it; `canceller` reaches its query from elsewhere.
pub async fn run_query_into(
    query: &QueryPlan,
    paths: &TablePaths,
    backend: Arc<dyn InferenceBackend>,
    options: &QueryOptions,
    canceller: &QueryCanceller,
    sink: &mut dyn RowSink,
) -> Result<QueryOutput> {
    let session = SqlSession::new(backend.clone(), options.clone(), Evaluation::Operators)?
        .with_canceller(canceller);
    let planning_started = Instant::now();
    let analyzed = query.analyzed_in(options.format)?;
    let planning = match &analyzed {
        Cow::Borrowed(_) => query.planning,
        Cow::Owned(_) => planning_started.elapsed(),
    };
    let served = serve_tables(
        analyzed.into_owned(),
        query,
        paths,
        options.batch_rows,
        batch_text_bytes(backend.kv_capacity_tokens()),
    )?;
    let mut table_rows = BTreeMap::new();
    for (table, (rows, first)) in served.tables {
        session.note_first_batch(&table, first);
        table_rows.insert(table, rows);
    }

    // The run's time counts its planning, though that came before reading.
    let started = Instant::now()
        .checked_sub(planning)
        .unwrap_or_else(Instant::now);
    let plan = served.plan;
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
                        "{}: the view's operator is a {kind:?}, its answers a {:?}'s",
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
            "answers of an AI operator {} that the view lacks",
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

/// An analyzed plan whose scans have their data.
struct Served {
    plan: LogicalPlan,
    /// Per table, its row count and the rows of its first batch when it has several.
    tables: BTreeMap<String, (usize, Option<usize>)>,
}

/// Reads every table `query` scans from `paths` and gives each scan of `plan`
/// (over the declared tables) its data in the scan's declared schema, served in
/// batches of at most `batch_rows` rows and about `batch_text_bytes` bytes of
/// document text (the unit AI operators stream).
fn serve_tables(
    plan: LogicalPlan,
    query: &QueryPlan,
    paths: &TablePaths,
    batch_rows: usize,
    batch_text_bytes: usize,
) -> Result<Served> {
    let mut read = BTreeMap::new();
    let mut tables = BTreeMap::new();
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
        tables.insert(table.clone(), (batch.num_rows(), first));
        read.insert(table, slices);
    }

    // One table read under two aliases may be declared wider by its second
    // read: each declared schema gets its own provider.
    let mut providers: HashMap<(String, SchemaRef), Arc<dyn TableSource>> = HashMap::new();
    plan.apply(|p| {
        if let LogicalPlan::TableScan(scan) = p {
            let table = scan.table_name.table().to_string();
            let schema = scan.source.schema();
            if let Entry::Vacant(slot) = providers.entry((table.clone(), schema.clone())) {
                let slices = read.get(&table).ok_or_else(|| {
                    DataFusionError::External(Box::new(EngineError::InvalidPlan(format!(
                        "the plan scans {table} but the view reads no such table"
                    ))))
                })?;
                // The batches were cut once, by the text they hold; each
                // declared schema takes the same cuts.
                let slices = slices
                    .iter()
                    .map(|slice| conform(slice, &schema, &table))
                    .collect::<datafusion::error::Result<Vec<_>>>()?;
                let provider = MemTable::try_new(schema, vec![slices])?;
                slot.insert(provider_as_source(Arc::new(provider)));
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .map_err(from_datafusion)?;
    let plan = plan
        .transform_up(|p| match p {
            LogicalPlan::TableScan(mut scan) => {
                let key = (scan.table_name.table().to_string(), scan.source.schema());
                scan.source = providers[&key].clone();
                Ok(Transformed::yes(LogicalPlan::TableScan(scan)))
            }
            p => Ok(Transformed::no(p)),
        })
        .map_err(from_datafusion)?
        .data;
    Ok(Served { plan, tables })
}

/// `batch`'s columns of `schema`, by name, cast to its types: a table as a
/// plan declared it.
fn conform(
    batch: &RecordBatch,
    schema: &SchemaRef,
    table: &str,
) -> datafusion::error::Result<RecordBatch> {
    let columns = schema
        .fields()
        .iter()
        .map(|f| {
            let column = batch.column_by_name(f.name()).ok_or_else(|| {
                DataFusionError::External(Box::new(EngineError::Data(format!(
                    "table {table} has no column {:?}",
                    f.name()
                ))))
            })?;
            Ok(cast(column, f.data_type())?)
        })
        .collect::<datafusion::error::Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// The estimate of `query` over `tables`, run on `backend` (from
/// [`Estimator::backend`]; `canceller` stops it).
pub async fn estimate_query(
    estimator: &Estimator,
    backend: Arc<EstimatingBackend>,
    query: &QueryPlan,
    tables: &TablePaths,
    options: &QueryOptions,
    canceller: &QueryCanceller,
) -> Result<Estimate> {
    let mut rows = aisql_engine::data::row_sink::CountedRows::default();
    let options = estimate_options(options);
    run_query_into(
        query,
        tables,
        backend.clone(),
        &options,
        canceller,
        &mut rows,
    )
    .await?;
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
        // Ids are served as views; the output's columns are plain strings.
        let columns = self
            .schema
            .fields()
            .iter()
            .zip(batch.columns())
            .map(|(f, c)| cast(c, f.data_type()))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let batch = RecordBatch::try_new(self.schema.clone(), columns)?;
        self.sink.push(batch)
    }

    fn keeps_rows_in_memory(&self) -> bool {
        self.sink.keeps_rows_in_memory()
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use aisql_engine::exec::logical::AiNode;
    use aisql_engine::inference::prompt::PromptFormat;
    use datafusion::arrow::array::{ArrayRef, AsArray, Int64Array, StringArray};

    use super::*;

    fn plan(id: &str) -> QueryPlan {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("quailb/plans");
        QueryPlan::from_file(&dir.join(format!("{id}.json"))).unwrap()
    }

    /// A reviews table as pyarrow writes one: nullable strings, the columns in
    /// another order than the plan's, and one the plan does not read.
    fn reviews(dir: &Path, columns: &[&str]) -> PathBuf {
        let all: Vec<(&str, ArrayRef)> = vec![
            ("stars", Arc::new(Int64Array::from(vec![1, 5, 3]))),
            (
                "body",
                Arc::new(StringArray::from(vec!["bad", "great", "fine"])),
            ),
            ("id", Arc::new(StringArray::from(vec!["r1", "r2", "r3"]))),
        ];
        let (fields, arrays): (Vec<_>, Vec<_>) = all
            .into_iter()
            .filter(|(n, _)| columns.contains(n))
            .map(|(n, a)| (Field::new(n, a.data_type().clone(), true), a))
            .unzip();
        let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).unwrap();
        let path = dir.join("reviews.parquet");
        aisql_engine::data::files::write_parquet(&path, &batch).unwrap();
        path
    }

    fn ai_nodes(plan: &LogicalPlan) -> Vec<AiNode> {
        let mut nodes = Vec::new();
        plan.apply(|p| {
            if let LogicalPlan::Extension(e) = p
                && let Some(node) = e.node.as_any().downcast_ref::<AiNode>()
            {
                nodes.push(node.clone());
            }
            Ok(TreeNodeRecursion::Continue)
        })
        .unwrap();
        nodes
    }

    #[test]
    fn a_run_in_the_plans_format_runs_the_plan_its_view_came_from() {
        let q = plan("IMDB-1");
        let Cow::Borrowed(analyzed) = q.analyzed_in(q.format).unwrap() else {
            panic!("IMDB-1 was planned again in its own format")
        };
        assert!(std::ptr::eq(analyzed, &q.analyzed));
        let ids: Vec<String> = ai_nodes(analyzed)
            .iter()
            .map(|n| n.spec.call.op_id.clone())
            .collect();
        let view: Vec<&str> = q.operators.iter().map(|o| o.id()).collect();
        assert_eq!(ids, view);
    }

    #[test]
    fn another_format_is_planned_anew_with_the_same_operators() {
        let q = plan("IMDB-15");
        assert_eq!(q.format, PromptFormat::RawV1);
        let chat = q.analyzed_in(PromptFormat::Qwen3ChatNonthinkingV1).unwrap();
        let Cow::Owned(chat) = chat else {
            panic!("another format reused the raw plan")
        };
        let (raw, chat) = (ai_nodes(&q.analyzed), ai_nodes(&chat));
        assert_eq!(raw.len(), chat.len());
        for (r, c) in raw.iter().zip(&chat) {
            assert_eq!(r.spec.call.op_id, c.spec.call.op_id);
            assert_eq!(r.spec.call.template, c.spec.call.template);
            assert_ne!(
                r.spec.call.pieces, c.spec.call.pieces,
                "{}",
                r.spec.call.op_id
            );
        }
    }

    #[test]
    fn each_scan_is_served_the_files_rows_in_its_declared_schema() {
        let dir = tempfile::tempdir().unwrap();
        let q = plan("IMDB-1");
        let paths: TablePaths = [(
            "reviews".to_string(),
            reviews(dir.path(), &["stars", "body", "id"]),
        )]
        .into();
        let served = serve_tables(q.analyzed.clone(), &q, &paths, 2, usize::MAX).unwrap();
        assert_eq!(served.tables["reviews"], (3, Some(2)));
        let mut scans = 0;
        served
            .plan
            .apply(|p| {
                if let LogicalPlan::TableScan(scan) = p {
                    scans += 1;
                    let schema = scan.source.schema();
                    let fields: Vec<(&str, &DataType, bool)> = schema
                        .fields()
                        .iter()
                        .map(|f| (f.name().as_str(), f.data_type(), f.is_nullable()))
                        .collect();
                    assert_eq!(
                        fields,
                        [
                            ("id", &DataType::Utf8View, false),
                            ("body", &DataType::Utf8View, false)
                        ]
                    );
                }
                Ok(TreeNodeRecursion::Continue)
            })
            .unwrap();
        assert_eq!(scans, 1);
        assert_eq!(served.plan.schema(), q.analyzed.schema());
    }

    #[test]
    fn a_table_without_a_declared_column_or_file_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let q = plan("IMDB-1");
        let paths: TablePaths =
            [("reviews".to_string(), reviews(dir.path(), &["id", "stars"]))].into();
        let e = serve_tables(q.analyzed.clone(), &q, &paths, 2, usize::MAX)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("reviews") && e.contains("\"body\""), "{e}");
        let e = serve_tables(q.analyzed.clone(), &q, &TablePaths::new(), 2, usize::MAX)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("table reviews is needed by the plan"), "{e}");
    }

    #[test]
    fn conform_casts_by_name_and_names_a_missing_column() {
        let batch = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("b", DataType::Utf8, true),
                Field::new("a", DataType::Utf8, true),
            ])),
            vec![
                Arc::new(StringArray::from(vec!["x"])),
                Arc::new(StringArray::from(vec!["y"])),
            ],
        )
        .unwrap();
        let want: SchemaRef = Arc::new(Schema::new(vec![Field::new(
            "a",
            DataType::Utf8View,
            false,
        )]));
        let got = conform(&batch, &want, "t").unwrap();
        assert_eq!(got.schema(), want);
        assert_eq!(got.column(0).as_string_view().value(0), "y");
        let want: SchemaRef = Arc::new(Schema::new(vec![Field::new("c", DataType::Utf8, false)]));
        let e = conform(&batch, &want, "t").unwrap_err().to_string();
        assert!(e.contains("table t has no column \"c\""), "{e}");
    }
}
