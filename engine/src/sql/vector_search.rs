//! `ai_search(table, column, query_vector, k [, method])`: a table function giving the
//! `k` rows of `table` whose vector in `column` is nearest `query_vector` by
//! cosine distance, with all the table's columns and a `distance` column
//! (`DOUBLE`, `cosine_distance(column, query_vector)`), nearest first, ties
//! in the table's scan order.
//!
//! The arguments are constants: the table's name and the column's as
//! strings, the query a list of numbers (`[0.1, 0.2, ...]`, `make_array`,
//! any constant expression), `k` a positive integer. A text query is not
//! embedded here: a table function's arguments are planned before any AI
//! operator runs, so it is an error pointing to `ORDER BY
//! cosine_distance(column, ai_embed('...')) LIMIT k`, which is the same
//! search done exactly. BigQuery's `VECTOR_SEARCH(TABLE t, 'column', (query),
//! top_k => k)` is not read (its `TABLE t` argument and its output, one
//! struct per base row, do not map onto this function).
//!
//! The search is `aisql_vector`'s, exact (flat) by default. A fifth
//! argument `'hnsw'` asks for the approximate graph search over a column of
//! [`FLAT_BELOW`] vectors or more (EXPLAIN says so): every distance it gives
//! is exact, but it may miss some of the nearest rows, and graphs built in
//! parallel may differ between runs. A graph is built on the first search of a
//! (table, column) and kept in the session for the next ones while the
//! column's vectors are the same (a 128-bit hash of them is compared on
//! every search: the table is read each time, the graph is not rebuilt).
//! Rows whose vector is NULL are skipped; a NULL component, a vector of the
//! wrong length, a non-finite component or a zero vector is an error naming
//! the row. An empty table gives no rows; `k` past the table's size gives
//! every row.

use std::collections::HashMap;
use std::fmt::Formatter;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, Float64Array, RecordBatch};
use datafusion::arrow::array::{RecordBatchOptions, new_empty_array};
use datafusion::arrow::compute::{cast, interleave};
use datafusion::arrow::datatypes::{DataType, Field, Float32Type, Schema, SchemaRef};
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DFSchema, ScalarValue, TableReference};
use datafusion::datasource::TableType;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::TaskContext;
use datafusion::execution::session_state::SessionState;
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PhysicalExpr, PlanProperties,
    SendableRecordBatchStream,
};
use datafusion::prelude::SessionContext;
use futures::FutureExt;

use crate::error::EngineError;
use aisql_vector::{FLAT_BELOW, Hit, HnswParams, Query, VectorIndex, Vectors};

/// The function's SQL name.
pub const NAME: &str = "ai_search";
/// The column of distances added to the table's.
pub const DISTANCE: &str = "distance";

/// Registers `ai_search` on `ctx`, with an index cache of its own.
pub fn register(ctx: &SessionContext) {
    ctx.register_udtf(NAME, Arc::new(AiSearch::default()));
}

fn sql_error(message: impl std::fmt::Display) -> DataFusionError {
    EngineError::Sql(format!("{NAME}: {message}")).into()
}

fn data_error(message: impl std::fmt::Display) -> DataFusionError {
    EngineError::Data(format!("{NAME}: {message}")).into()
}

/// Built graphs, by (table, column), with the hash of the vectors each was
/// built from.
type IndexCache = Arc<Mutex<HashMap<(String, String), (u128, Arc<VectorIndex>)>>>;

/// The table function.
#[derive(Debug, Default)]
pub struct AiSearch {
    cache: IndexCache,
}

impl TableFunctionImpl for AiSearch {
    fn call_with_args(&self, args: TableFunctionArgs) -> DfResult<Arc<dyn TableProvider>> {
        let (table, column, query, k, method) = match args.exprs() {
            [table, column, query, k] => (table, column, query, k, None),
            [table, column, query, k, method] => (table, column, query, k, Some(method)),
            other => {
                return Err(sql_error(format!(
                    "takes (table, column, query_vector, k [, 'exact' | 'hnsw']), not {} \
                     arguments",
                    other.len()
                )));
            }
        };
        let session = args.session();
        let state = session
            .as_any()
            .downcast_ref::<SessionState>()
            .ok_or_else(|| sql_error("needs a DataFusion session state"))?;

        let table_name = string_arg(state, table, "table")?;
        let table_ref = TableReference::from(table_name.as_str());
        let provider = state
            .schema_for_ref(table_ref.clone())
            .ok()
            .and_then(|schema| schema.table(table_ref.table()).now_or_never())
            .transpose()?
            .flatten()
            .ok_or_else(|| sql_error(format!("no table {table_name}")))?;
        let schema = provider.schema();

        let column_name = string_arg(state, column, "column")?;
        let column_index = schema
            .index_of(&column_name)
            .or_else(|_| {
                let lower = column_name.to_lowercase();
                let matches: Vec<usize> = (0..schema.fields().len())
                    .filter(|&i| schema.field(i).name().to_lowercase() == lower)
                    .collect();
                match matches.as_slice() {
                    [one] => Ok(*one),
                    _ => Err(()),
                }
            })
            .map_err(|()| sql_error(format!("{table_name} has no column {column_name}")))?;
        let field = schema.field(column_index);
        let fixed_dims = match field.data_type() {
            DataType::List(f) | DataType::LargeList(f) if f.data_type().is_numeric() => None,
            DataType::FixedSizeList(f, n) if f.data_type().is_numeric() => {
                Some(usize::try_from(*n).unwrap_or(0))
            }
            other => {
                return Err(sql_error(format!(
                    "column {column_name} of {table_name} is {other}, not a list of numbers"
                )));
            }
        };
        if schema.fields().iter().any(|f| f.name() == DISTANCE) {
            return Err(sql_error(format!(
                "{table_name} already has a column {DISTANCE}, the column ai_search adds"
            )));
        }

        let query = query_arg(state, query)?;
        if let Some(n) = fixed_dims
            && n != query.len()
        {
            return Err(sql_error(format!(
                "the query vector has {} components, column {column_name} {n}",
                query.len()
            )));
        }
        let query = Query::new(&query, query.len())
            .map_err(|e| sql_error(format!("the query vector: {e}")))?;
        let k = k_arg(state, k)?;
        let approximate = match method.map(|m| string_arg(state, m, "method")).transpose()? {
            None => false,
            Some(m) if m.eq_ignore_ascii_case("exact") => false,
            Some(m) if m.eq_ignore_ascii_case("hnsw") => true,
            Some(m) => {
                return Err(sql_error(format!(
                    "method must be 'exact' (the default) or 'hnsw' (approximate), not {m:?}"
                )));
            }
        };

        let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
        fields.push(Field::new(DISTANCE, DataType::Float64, false));
        Ok(Arc::new(SearchTable {
            search: Arc::new(Search {
                table: provider,
                table_name,
                column: column_name,
                column_index,
                query,
                k,
                approximate,
                cache: self.cache.clone(),
            }),
            schema: Arc::new(Schema::new(fields)),
        }))
    }
}

/// A constant argument's value.
fn constant(state: &SessionState, expr: &Expr, what: &str) -> DfResult<ScalarValue> {
    if let Expr::Literal(value, _) = expr {
        return Ok(value.clone());
    }
    if !expr.column_refs().is_empty() {
        return Err(sql_error(format!(
            "the {what} must be a constant, not {expr} (a column)"
        )));
    }
    let physical = state
        .create_physical_expr(expr.clone(), &DFSchema::empty())
        .map_err(|e| sql_error(format!("the {what} {expr}: {e}")))?;
    let one_row = RecordBatch::try_new_with_options(
        Arc::new(Schema::empty()),
        vec![],
        &RecordBatchOptions::new().with_row_count(Some(1)),
    )?;
    let array = physical.evaluate(&one_row)?.into_array(1)?;
    ScalarValue::try_from_array(&array, 0)
}

fn string_arg(state: &SessionState, expr: &Expr, what: &str) -> DfResult<String> {
    // A bare name (`ai_search(docs, ...)`) plans as a column reference.
    if let Expr::Column(c) = expr
        && c.relation.is_none()
    {
        return Ok(c.name.clone());
    }
    match constant(state, expr, what)? {
        ScalarValue::Utf8(Some(s))
        | ScalarValue::LargeUtf8(Some(s))
        | ScalarValue::Utf8View(Some(s)) => Ok(s),
        other => Err(sql_error(format!(
            "the {what} must be a name as a string, not {other}"
        ))),
    }
}

fn query_arg(state: &SessionState, expr: &Expr) -> DfResult<Vec<f32>> {
    let value = constant(state, expr, "query vector")?;
    let list = match value.data_type() {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
            return Err(sql_error(
                "a text query is not embedded by ai_search (its arguments are planned before \
                 any model runs): pass a vector, or search exactly with ORDER BY \
                 cosine_distance(column, ai_embed('...')) LIMIT k",
            ));
        }
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _)
            if f.data_type().is_numeric() || f.data_type() == &DataType::Null =>
        {
            cast(
                &value.to_array()?,
                &DataType::new_list(DataType::Float32, true),
            )?
        }
        other => {
            return Err(sql_error(format!(
                "the query vector must be a list of numbers, not {other}"
            )));
        }
    };
    if list.is_null(0) {
        return Err(sql_error("the query vector is NULL"));
    }
    let values = list.as_list::<i32>().value(0);
    let values = values.as_primitive::<Float32Type>();
    if let Some(i) = (0..values.len()).find(|&i| values.is_null(i)) {
        return Err(sql_error(format!(
            "the query vector's component {} is NULL",
            i + 1
        )));
    }
    if values.is_empty() {
        return Err(sql_error("the query vector is empty"));
    }
    Ok(values.values().to_vec())
}

fn k_arg(state: &SessionState, expr: &Expr) -> DfResult<usize> {
    let value = constant(state, expr, "k")?;
    let k = match &value {
        // A UInt64 past i64::MAX: as many rows as there are.
        ScalarValue::UInt64(Some(k)) => Some(i64::try_from(*k).unwrap_or(i64::MAX)),
        v if v.data_type().is_integer() && !v.is_null() => match v.cast_to(&DataType::Int64)? {
            ScalarValue::Int64(Some(k)) => Some(k),
            _ => None,
        },
        _ => None,
    };
    match k {
        Some(k) if k > 0 => Ok(usize::try_from(k).unwrap_or(usize::MAX)),
        Some(k) => Err(sql_error(format!("k must be at least 1, not {k}"))),
        None => Err(sql_error(format!(
            "k must be a positive integer, not {value}"
        ))),
    }
}

/// One planned search: what to read and what to look for.
#[derive(Debug)]
struct Search {
    table: Arc<dyn TableProvider>,
    table_name: String,
    column: String,
    column_index: usize,
    query: Query,
    k: usize,
    /// Search a graph (HNSW) over a large column: faster, and it may miss
    /// some of the nearest rows. Only when asked (`'hnsw'`): an answer that
    /// may differ from the exact one is never the default.
    approximate: bool,
    cache: IndexCache,
}

/// `ai_search(...)` in a `FROM`: the table's schema and `distance`.
#[derive(Debug)]
struct SearchTable {
    search: Arc<Search>,
    schema: SchemaRef,
}

#[async_trait]
impl TableProvider for SearchTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        // Every row and column is read: the distances need the vectors and
        // a projection or filter applies to the k rows found.
        let input = self.search.table.scan(state, None, &[], None).await?;
        let projection = projection.cloned();
        let schema = match &projection {
            Some(p) => Arc::new(self.schema.project(p)?),
            None => self.schema.clone(),
        };
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Ok(Arc::new(SearchExec {
            search: self.search.clone(),
            input,
            full_schema: self.schema.clone(),
            projection,
            schema,
            properties,
        }))
    }
}

/// The operator: reads its input whole, searches, gives the hits' rows.
#[derive(Debug)]
struct SearchExec {
    search: Arc<Search>,
    input: Arc<dyn ExecutionPlan>,
    full_schema: SchemaRef,
    projection: Option<Vec<usize>>,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
}

impl DisplayAs for SearchExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut Formatter) -> std::fmt::Result {
        match t {
            DisplayFormatType::TreeRender => Ok(()),
            DisplayFormatType::Default | DisplayFormatType::Verbose => write!(
                f,
                "AiSearchExec: table={}, column={}, k={}, search={}",
                self.search.table_name,
                self.search.column,
                self.search.k,
                if self.search.approximate {
                    "hnsw (approximate: may miss some of the nearest rows)"
                } else {
                    "exact"
                }
            ),
        }
    }
}

impl ExecutionPlan for SearchExec {
    fn name(&self) -> &'static str {
        "AiSearchExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return Err(DataFusionError::Internal(format!(
                "AiSearchExec has one child, given {}",
                children.len()
            )));
        }
        Ok(Arc::new(SearchExec {
            search: self.search.clone(),
            input: children.swap_remove(0),
            full_schema: self.full_schema.clone(),
            projection: self.projection.clone(),
            schema: self.schema.clone(),
            properties: self.properties.clone(),
        }))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "AiSearchExec has one partition, asked for {partition}"
            )));
        }
        let (search, input) = (self.search.clone(), self.input.clone());
        let (full_schema, projection) = (self.full_schema.clone(), self.projection.clone());
        let schema = self.schema.clone();
        let batch = async move {
            let batches = datafusion::physical_plan::collect(input, context).await?;
            let found = search.run(&batches, full_schema).await?;
            match &projection {
                Some(p) => Ok(found.project(p)?),
                None => Ok(found),
            }
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            schema,
            futures::stream::once(batch),
        )))
    }
}

impl Search {
    /// The hits' rows of `batches` with their distances, as one batch of
    /// `schema` (the table's columns and `distance`).
    async fn run(&self, batches: &[RecordBatch], schema: SchemaRef) -> DfResult<RecordBatch> {
        let vectors = self.vectors(batches)?;
        let hits = if vectors.is_empty() {
            Vec::new()
        } else {
            let index = self.index(vectors).await?;
            let (query, k) = (self.query.clone(), self.k);
            // The search is CPU work (a full scan when flat): off the async
            // threads.
            tokio::task::spawn_blocking(move || index.search(&query, k))
                .await
                .map_err(|e| data_error(format!("the search stopped: {e}")))?
        };
        rows_of(batches, &hits, schema)
    }

    /// The column's vectors in row order, NULL vectors left out, checked.
    fn vectors(&self, batches: &[RecordBatch]) -> DfResult<Vectors> {
        let mut vectors = Vectors::new(self.query.dims());
        let mut row = 0u64;
        let f32s = DataType::new_list(DataType::Float32, true);
        for batch in batches {
            let column = cast(batch.column(self.column_index), &f32s)?;
            let lists = column.as_list::<i32>();
            for i in 0..lists.len() {
                let this = row;
                row += 1;
                if lists.is_null(i) {
                    continue;
                }
                let values = lists.value(i);
                let values = values.as_primitive::<Float32Type>();
                let at = |m: &dyn std::fmt::Display| {
                    data_error(format!(
                        "{} row {}: column {}: {m}",
                        self.table_name,
                        this + 1,
                        self.column
                    ))
                };
                if let Some(j) = (0..values.len()).find(|&j| values.is_null(j)) {
                    return Err(at(&format!("component {} is NULL", j + 1)));
                }
                vectors.push(this, values.values()).map_err(|e| at(&e))?;
            }
        }
        Ok(vectors)
    }

    /// The index over `vectors`: flat unless asked to approximate over a
    /// large column; then the cached graph if it was built from the same
    /// vectors, else a new graph (kept).
    async fn index(&self, vectors: Vectors) -> DfResult<Arc<VectorIndex>> {
        if !self.approximate || vectors.len() < FLAT_BELOW {
            return Ok(Arc::new(VectorIndex::flat(vectors)));
        }
        let key = (self.table_name.clone(), self.column.clone());
        let hash = vectors.fingerprint();
        let cached = self
            .cache
            .lock()
            .map_err(|_| data_error("the index cache was poisoned"))?
            .get(&key)
            .filter(|(h, _)| *h == hash)
            .map(|(_, index)| index.clone());
        if let Some(index) = cached {
            return Ok(index);
        }
        let index = tokio::task::spawn_blocking(move || {
            Arc::new(VectorIndex::hnsw(vectors, HnswParams::default()))
        })
        .await
        .map_err(|e| data_error(format!("building the index stopped: {e}")))?;
        self.cache
            .lock()
            .map_err(|_| data_error("the index cache was poisoned"))?
            .insert(key, (hash, index.clone()));
        Ok(index)
    }
}

/// The rows `hits` name (rows counted across `batches`), in `hits`' order,
/// with their distances.
fn rows_of(batches: &[RecordBatch], hits: &[Hit], schema: SchemaRef) -> DfResult<RecordBatch> {
    let mut starts = Vec::with_capacity(batches.len());
    let mut total = 0u64;
    for b in batches {
        starts.push(total);
        total += b.num_rows() as u64;
    }
    let at: Vec<(usize, usize)> = hits
        .iter()
        .map(|h| {
            // The last batch starting at or before the row (starts[0] is 0).
            let b = starts.partition_point(|&s| s <= h.row).saturating_sub(1);
            (b, (h.row - starts[b]) as usize)
        })
        .collect();
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for (c, field) in schema
        .fields()
        .iter()
        .enumerate()
        .take(schema.fields().len() - 1)
    {
        if batches.is_empty() {
            columns.push(new_empty_array(field.data_type()));
            continue;
        }
        let arrays: Vec<&dyn Array> = batches.iter().map(|b| b.column(c).as_ref()).collect();
        columns.push(interleave(&arrays, &at)?);
    }
    columns.push(Arc::new(Float64Array::from_iter_values(
        hits.iter().map(|h| h.distance),
    )));
    Ok(RecordBatch::try_new(schema, columns)?)
}

#[cfg(test)]
#[path = "vector_search_tests.rs"]
mod tests;
