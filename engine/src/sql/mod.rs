//! SQL with AI functions: a session that registers tables, reads the three
//! spellings ([`spelling`]), plans through DataFusion with the AI rewrite
//! ([`rewrite`]) and runs the AI operators with a backend.
//!
//! Any SQL DataFusion runs may surround the AI calls: aggregates, sorts,
//! limits, outer/semi/anti joins, subqueries, CTEs, unions, `CASE`.

mod bounded_functions;
pub mod consume;
pub mod count_tokens;
mod decorrelate;
#[cfg(test)]
mod embed_tests;
pub mod export;
pub mod key_fields;
#[cfg(test)]
mod limits_tests;
pub mod options;
pub mod overflow;
pub mod plan_file;
mod read_filters;
mod read_only;
pub mod recursion;
pub mod rewrite;
pub mod spelling;
pub mod tables;
pub mod text_scan;
pub mod vector_functions;
pub mod vector_search;

use std::sync::{Arc, Mutex};
use std::time::Instant;

use datafusion::arrow::array::AsArray;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::ParamValues;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::{SessionState, SessionStateBuilder};
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_substrait::logical_plan::consumer::SubstraitConsumer;

use crate::data::row_sink::{MemoryRows, RowSink};
use crate::error::{EngineError, Result, from_datafusion, without_panics};
use crate::exec::ai_functions::{NaiveEvaluator, register_ai_functions};
use crate::exec::answers::{AnswerRecorder, AnswerTable};
use crate::exec::coverage::QueryControls;
use crate::exec::logical::ai_nodes;
use crate::exec::physical::{AiQueryPlanner, AiRuntime};
use crate::inference::backend::{
    AiCall, InferenceBackend, QueryBackend, QueryStart, QueryWithoutCalls,
};
use crate::inference::memo::AnswerMemo;
use crate::limits::memory_guard::HeapBoundedPool;
use crate::sql::options::QueryOptions;

use decorrelate::AiDecorrelate;
pub use read_only::WritePolicy;
use read_only::check_writes;
use rewrite::{AiJoinPredicatePushdown, AiRewrite, RewriteContext};

/// How AI calls are evaluated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evaluation {
    /// As AI operators that batch their prompts (the engine).
    Operators,
    /// Row by row as scalar functions: the reference for differential tests.
    Naive,
}

/// A SQL session over registered tables and one backend.
pub struct SqlSession {
    ctx: SessionContext,
    backend: Arc<dyn InferenceBackend>,
    context: Arc<Mutex<RewriteContext>>,
    options: QueryOptions,
    /// The memory pool of `--memory-limit`, bounding each query's heap too.
    pool: Arc<HeapBoundedPool>,
    /// Per table, the rows of its first batch when it has several.
    first_batches: Mutex<std::collections::HashMap<String, usize>>,
    /// Which writing statements may run, and where they may write.
    writes: Mutex<WritePolicy>,
    /// How strictly CSV tables are read.
    csv: Mutex<text_scan::CsvReading>,
    /// Reaches the running query on the backend from other threads.
    canceller: QueryCanceller,
    /// Questions each AI operator is expected to ask (an estimate's), for
    /// the progress lines' totals.
    expected_rows: Mutex<std::collections::HashMap<String, u64>>,
    /// Held by the session's running statement: a session runs one at a
    /// time (its heap ceiling and canceller are its running query's), while
    /// other sessions on the same backend run theirs.
    one_statement: tokio::sync::Mutex<()>,
}

/// What one statement returns.
#[derive(Debug, Clone)]
pub struct SqlOutput {
    /// Result schema.
    pub schema: SchemaRef,
    /// Result rows ([`SqlSession::run_plan`]; empty when a sink took them).
    pub batches: Vec<RecordBatch>,
    /// Answer tables of the AI operators, in the order they run.
    pub answers: Vec<AnswerTable>,
    /// The AI operators, in the order they run.
    pub calls: Vec<AiCall>,
    /// Seconds from planning to the last row.
    pub runtime_s: f64,
    /// Engine measurements (fresh tokens and the like).
    pub measurements: crate::inference::work::Work,
}

impl SqlOutput {
    /// All rows in one batch.
    pub fn rows(&self) -> Result<RecordBatch> {
        Ok(datafusion::arrow::compute::concat_batches(
            &self.schema,
            &self.batches,
        )?)
    }
}

impl SqlSession {
    /// A session whose AI calls `evaluation` evaluates with `backend`.
    pub fn new(
        backend: Arc<dyn InferenceBackend>,
        options: QueryOptions,
        evaluation: Evaluation,
    ) -> Result<Self> {
        let pool = Arc::new(HeapBoundedPool::new(options.memory_limit));
        let runtime_env = RuntimeEnvBuilder::new()
            .with_memory_pool(pool.clone())
            .with_max_temp_directory_size(crate::limits::host_memory::default_spill_limit())
            .build_arc()?;
        let context = Arc::new(Mutex::new(RewriteContext::default()));
        let builder = SessionStateBuilder::new()
            .with_runtime_env(runtime_env)
            .with_config(
                SessionConfig::new()
                    .with_target_partitions(1)
                    .with_batch_size(options.batch_rows.max(1))
                    .with_coalesce_batches(false)
                    .with_information_schema(true),
            )
            .with_default_features()
            .with_query_planner(Arc::new(AiQueryPlanner::new(backend.clone())));
        let state = builder.build();
        let mut analyzers = state.analyzer().rules.clone();
        let mut optimizers = state.optimizers().to_vec();
        // Integer overflow fails, as in PostgreSQL and DuckDB: right after type
        // coercion (operands of one type), before the optimizer folds constants.
        let at = analyzers
            .iter()
            .position(|r| r.name() == "type_coercion")
            .map_or(analyzers.len(), |i| i + 1);
        analyzers.insert(at, Arc::new(overflow::CheckedArithmetic));
        // Both evaluations: DataFusion cannot run a subquery whose AI call
        // reads outer columns until it is a join, whoever evaluates the call.
        analyzers.push(Arc::new(AiDecorrelate::new(context.clone())));
        if evaluation == Evaluation::Operators {
            analyzers.push(Arc::new(AiRewrite::new(options.format, context.clone())));
            // Right after DataFusion's filter pushdown, which stops at an AI join.
            let at = optimizers
                .iter()
                .position(|r| r.name() == "push_down_filter")
                .map_or(optimizers.len(), |i| i + 1);
            optimizers.insert(at, Arc::new(AiJoinPredicatePushdown));
        }
        let builder = SessionStateBuilder::new_from_existing(state)
            .with_analyzer_rules(analyzers)
            .with_optimizer_rules(optimizers)
            .with_physical_optimizer_rule(Arc::new(recursion::RecursionLimit {
                max_iterations: options.max_recursion,
            }));
        let ctx = SessionContext::new_with_state(builder.build());
        let naive = (evaluation == Evaluation::Naive).then(|| NaiveEvaluator {
            backend: backend.clone(),
            format: options.format,
        });
        register_ai_functions(&ctx, naive, backend.embedding_dims());
        ctx.register_udf(datafusion::logical_expr::ScalarUDF::new_from_impl(
            count_tokens::CountTokens::new(options.format),
        ));
        bounded_functions::register(&ctx, options.memory_limit);
        vector_functions::register(&ctx);
        vector_search::register(&ctx);
        Ok(Self {
            ctx,
            backend,
            context,
            pool,
            first_batches: Mutex::default(),
            writes: Mutex::default(),
            csv: Mutex::default(),
            expected_rows: Mutex::new(options.expected_rows.clone()),
            canceller: QueryCanceller::default(),
            one_statement: tokio::sync::Mutex::new(()),
            options,
        })
    }

    /// Sets the questions each AI operator (by id) is expected to ask: the
    /// totals of the progress lines of the queries to come.
    pub fn set_expected_rows(&self, expected: std::collections::HashMap<String, u64>) {
        *self.expected_rows.lock().expect("expected rows lock") = expected;
    }

    /// This session, its running query reachable through `canceller` (and
    /// through [`Self::canceller`]).
    pub fn with_canceller(mut self, canceller: &QueryCanceller) -> Self {
        self.canceller = canceller.clone();
        self
    }

    /// A handle that stops this session's running query from another thread.
    pub fn canceller(&self) -> QueryCanceller {
        self.canceller.clone()
    }

    /// Sets which writing statements run (read-only by default).
    pub fn set_write_policy(&self, policy: WritePolicy) {
        *self.writes.lock().expect("write policy lock") = policy;
    }

    /// Refuses a plan that writes or changes state where the session's
    /// [`WritePolicy`] does not allow it, naming the statement; looks inside
    /// `EXPLAIN ANALYZE` and subqueries.
    pub fn check_writes(&self, plan: &LogicalPlan) -> Result<()> {
        let policy = self.writes.lock().expect("write policy lock").clone();
        check_writes(plan, &policy)
    }

    /// The DataFusion context (to register more tables or functions).
    pub fn context(&self) -> &SessionContext {
        &self.ctx
    }

    /// Marks `table`'s `id` column as unique, so its documents are keyed by id
    /// (the oracle answers by id; QUAIL-B tables have unique ids).
    pub fn set_unique_ids(&self, table: &str) {
        self.context
            .lock()
            .expect("rewrite context lock")
            .unique_id_tables
            .insert(table.to_string());
    }

    /// Hints that the AI filter with `template` keeps `fraction` of the rows it
    /// is asked about: a relation's AI filters run in the order of least
    /// expected cost, prompt size over the fraction dropped (0.5 without a hint).
    pub fn set_selectivity(&self, template: &str, fraction: f64) -> Result<()> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(EngineError::Sql(format!(
                "selectivity {fraction} of {:?} is not a fraction between 0 and 1",
                crate::inference::prompt::shorten(template, 48)
            )));
        }
        self.context
            .lock()
            .expect("rewrite context lock")
            .selectivity
            .insert(template.to_string(), fraction);
        Ok(())
    }

    /// Sets how strictly the CSV tables registered from now on are read
    /// ([`text_scan::CsvReading::Strict`] by default).
    pub fn set_csv_reading(&self, reading: text_scan::CsvReading) {
        *self.csv.lock().expect("csv reading lock") = reading;
    }

    /// Registers a table read from `path` (see [`tables::register`]); returns
    /// its row count.
    pub async fn register(&self, name: &str, path: &std::path::Path) -> Result<usize> {
        let csv = *self.csv.lock().expect("csv reading lock");
        let (rows, first) = tables::register(
            &self.ctx,
            name,
            path,
            csv,
            self.options.batch_rows,
            crate::data::tables::batch_text_bytes(self.backend.kv_capacity_tokens()),
        )
        .await?;
        self.note_first_batch(name, first);
        Ok(rows)
    }

    /// Registers the tables of a QUAIL-B dataset (ids unique) by name.
    pub async fn register_dataset(&self, tables: &crate::data::tables::TablePaths) -> Result<()> {
        for (name, path) in tables {
            self.register(name, path).await?;
            tables::check_unique_ids(&self.ctx, name).await?;
            self.set_unique_ids(name);
        }
        Ok(())
    }

    /// Serves the tables registered in `other` here too, with their batch sizes:
    /// a plan made by `other` runs in this session.
    pub async fn share_tables_from(&self, other: &SqlSession) -> Result<()> {
        let catalog = other.ctx.state().catalog_list().clone();
        for catalog_name in catalog.catalog_names() {
            let Some(c) = catalog.catalog(&catalog_name) else {
                continue;
            };
            for schema_name in c.schema_names() {
                let Some(schema) = c.schema(&schema_name) else {
                    continue;
                };
                if schema_name == "information_schema" {
                    continue;
                }
                for table in schema.table_names() {
                    if let Some(provider) = schema.table(&table).await? {
                        let reference = datafusion::common::TableReference::full(
                            catalog_name.as_str(),
                            schema_name.as_str(),
                            table.as_str(),
                        );
                        self.ctx.register_table(reference, provider)?;
                    }
                }
            }
        }
        let firsts = other.first_batches.lock().expect("batches lock").clone();
        self.first_batches
            .lock()
            .expect("batches lock")
            .extend(firsts);
        let unique = other
            .context
            .lock()
            .expect("rewrite context lock")
            .unique_id_tables
            .clone();
        self.context
            .lock()
            .expect("rewrite context lock")
            .unique_id_tables
            .extend(unique);
        Ok(())
    }

    /// Records how many rows the first batch of `table` holds (`None`: one
    /// batch), for the batch size of the queries that read it.
    pub fn note_first_batch(&self, table: &str, first: Option<usize>) {
        let mut firsts = self.first_batches.lock().expect("batches lock");
        match first {
            Some(first) => firsts.insert(table.to_string(), first),
            None => firsts.remove(table),
        };
    }

    /// Consumes a Substrait plan with a producer's own `consumer` (QUAIL-B's
    /// lives with the benchmark), made over `state` (this session's
    /// [`SessionContext::state`]), and runs the analyzer, whose AI rewrite makes
    /// the AI calls AI nodes. Read-only whatever the session allows.
    pub async fn analyze_substrait_with(
        &self,
        state: &SessionState,
        consumer: &impl SubstraitConsumer,
        plan: &datafusion_substrait::substrait::proto::Plan,
    ) -> Result<LogicalPlan> {
        let consumed = without_panics(consume::consume_plan(consumer, plan), consume_panic)
            .await?
            .map_err(plan_error)?;
        let consumed = read_filters::apply_read_filters(consumed)?;
        check_writes(&consumed, &WritePolicy::default())?;
        state
            .analyzer()
            .execute_and_check(consumed, state.config_options(), |_, _| {})
            .map_err(plan_error)
    }

    /// Runs the optimizer over an analyzed plan (from [`Self::analyze_substrait_with`]).
    pub fn optimize_analyzed(&self, plan: LogicalPlan) -> Result<LogicalPlan> {
        let state = self.ctx.state();
        state
            .optimizer()
            .optimize(plan, &state, |_, _| {})
            .map_err(sql_error)
    }

    /// DataFusion's filters coalesce their output up to the batch size: keep
    /// that at one input batch of the tables `plan` reads, so survivors of many
    /// batches never reach the next AI operator together, after their KV was
    /// evicted.
    fn set_batch_size(&self, plan: &LogicalPlan) -> Result<()> {
        let firsts = self.first_batches.lock().expect("batches lock");
        let mut size = self.options.batch_rows.max(1);
        let _ = plan.apply_with_subqueries(|p| {
            if let LogicalPlan::TableScan(scan) = p
                && let Some(&first) = firsts.get(scan.table_name.table())
            {
                size = size.min(first.max(1));
            }
            Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
        });
        self.ctx
            .state_ref()
            .write()
            .config_mut()
            .options_mut()
            .set("datafusion.execution.batch_size", &size.to_string())?;
        Ok(())
    }

    /// An error unless every model a Snowflake `AI_COMPLETE(model, ...)` or
    /// `AI_COUNT_TOKENS(function, model, ...)` names is the loaded one: its name as given, or its last path part (`qwen3-4b`
    /// for `Qwen/Qwen3-4B`), in any case.
    fn check_models(&self, named: &[(String, String)]) -> Result<()> {
        for (model, place) in named {
            let loaded = self.options.model.as_deref();
            let matches = loaded.is_some_and(|l| {
                l.eq_ignore_ascii_case(model)
                    || l.rsplit(['/', '\\'])
                        .next()
                        .is_some_and(|last| last.eq_ignore_ascii_case(model))
            });
            if !matches {
                return Err(EngineError::Sql(format!(
                    "{place} names model {model:?}, but the loaded model is {}; \
                     name that one (or use aisql's form, ai_complete(template, column) or \
                     ai_count_tokens(template, column), which needs none)",
                    loaded.map_or("none".to_string(), |l| format!("{l:?}"))
                )));
            }
        }
        Ok(())
    }

    /// Reads the keys of every `ai_extract` field declared `name FROM
    /// table.column` (and `ai_generate` type `FROM table.column`) and writes
    /// them into the statement ([`key_fields`]).
    async fn inline_key_fields(
        &self,
        statement: &mut datafusion::sql::parser::Statement,
    ) -> Result<()> {
        let columns = key_fields::key_columns(statement)?;
        let mut keys = std::collections::HashMap::new();
        for key in columns {
            let (table, column) = &key;
            let read = |e: datafusion::error::DataFusionError| {
                EngineError::Sql(format!(
                    "the field's keys {table}.{column} cannot be read: {e}"
                ))
            };
            let name = datafusion::prelude::ident(column.as_str());
            let batches = self
                .ctx
                .table(table.as_str())
                .await
                .map_err(read)?
                .filter(name.clone().is_not_null())
                .map_err(read)?
                .select(vec![
                    datafusion::prelude::cast(name, DataType::Utf8).alias("key"),
                ])
                .map_err(read)?
                .distinct()
                .map_err(read)?
                .limit(0, Some(key_fields::MAX_KEYS + 1))
                .map_err(read)?
                .collect()
                .await
                .map_err(read)?;
            let mut values = std::collections::BTreeSet::new();
            for batch in &batches {
                let column = datafusion::arrow::compute::cast(batch.column(0), &DataType::Utf8)
                    .map_err(|e| read(e.into()))?;
                let strings = column.as_string::<i32>();
                values.extend(strings.iter().flatten().map(str::to_string));
            }
            let checked = key_fields::checked_keys(&key, values)?;
            keys.insert(key, checked);
        }
        key_fields::inline(statement, &keys)
    }

    /// Plans one statement: spellings normalized, DataFusion's SQL planner, then
    /// the analyzer (with the AI rewrite) and optimizer.
    pub async fn plan(&self, sql: &str) -> Result<LogicalPlan> {
        self.plan_with_params(sql, None).await
    }

    /// Plans one statement whose placeholders (`$1`, `$2`, ...) take `params`,
    /// bound before the analyzer so the AI rewrite and the optimizer see values.
    pub async fn plan_with_params(
        &self,
        sql: &str,
        params: Option<ParamValues>,
    ) -> Result<LogicalPlan> {
        let plan = self.prepare(sql).await?;
        let plan = match params {
            Some(params) => plan.with_param_values(params).map_err(sql_error)?,
            None => plan,
        };
        self.ctx.state().optimize(&plan).map_err(sql_error)
    }

    /// One statement planned but not yet analyzed or optimized, its
    /// placeholders unbound: what a client preparing it learns its parameter
    /// and result types from. Spellings are normalized and writes checked, as
    /// for [`Self::plan`]; running it takes [`Self::plan_with_params`].
    pub async fn prepare(&self, sql: &str) -> Result<LogicalPlan> {
        let state = self.ctx.state();
        let mut statement = parse_one(sql, &state)?;
        let spelled = spelling::normalize(&mut statement)?;
        self.inline_key_fields(&mut statement).await?;
        self.check_models(&spelled.models)?;
        self.context.lock().expect("rewrite context lock").sites = spelled.sites;
        let plan = state
            .statement_to_plan(statement)
            .await
            .map_err(sql_error)?;
        self.check_writes(&plan)?;
        Ok(plan)
    }

    /// Plans a Substrait plan from any producer: DataFusion's consumer resolves
    /// the AI functions by name, then the same analyzer and optimizer run.
    pub async fn plan_substrait(
        &self,
        plan: &datafusion_substrait::substrait::proto::Plan,
    ) -> Result<LogicalPlan> {
        let state = self.ctx.state();
        let consumed = without_panics(consume::general_plan(&state, plan), consume_panic)
            .await?
            .map_err(sql_error)?;
        let consumed = read_filters::apply_read_filters(consumed)?;
        // A plan file is read-only whatever the session allows.
        check_writes(&consumed, &WritePolicy::default())?;
        state.optimize(&consumed).map_err(sql_error)
    }

    /// The plan of one statement as Substrait ([`export`]), AI calls as QUAIL-B
    /// extension functions (URN [`crate::exec::ai_functions::AI_URN`]), before the AI rewrite:
    /// any engine that knows the functions can run it.
    pub async fn to_substrait(
        &self,
        sql: &str,
    ) -> Result<datafusion_substrait::substrait::proto::Plan> {
        let state = self.ctx.state();
        let mut statement = parse_one(sql, &state)?;
        spelling::normalize(&mut statement)?;
        self.inline_key_fields(&mut statement).await?;
        let plan = state
            .statement_to_plan(statement)
            .await
            .map_err(sql_error)?;
        // The analyzer without the AI rewrite: types coerced, calls kept, and
        // arithmetic kept as operators (Substrait's own functions), not
        // aisql's checked ones, which other engines do not know.
        let mut analyzed = plan;
        for rule in state
            .analyzer()
            .rules
            .iter()
            .filter(|r| r.name() != "ai_rewrite" && r.name() != overflow::RULE_NAME)
        {
            analyzed = rule
                .analyze(analyzed, state.config_options())
                .map_err(sql_error)?;
        }
        // DataFusion's producer writes no outer column references: a plan with
        // correlated subqueries is written optimized, where they are joins (the
        // AI calls stay functions either way).
        match export::to_substrait_plan(&analyzed) {
            Ok(plan) => Ok(plan),
            Err(first) => {
                let optimized = state
                    .optimizer()
                    .optimize(analyzed, &state, |_, _| {})
                    .map_err(sql_error)?;
                export::to_substrait_plan(&optimized).map_err(|_| sql_error(first))
            }
        }
    }

    /// Runs one statement.
    pub async fn run(&self, sql: &str) -> Result<SqlOutput> {
        let started = Instant::now();
        let plan = self.plan(sql).await?;
        self.run_plan(plan, started).await
    }

    /// Runs an optimized plan (from [`Self::plan`]), its rows kept in memory.
    pub async fn run_plan(&self, plan: LogicalPlan, started: Instant) -> Result<SqlOutput> {
        let mut rows = MemoryRows::default();
        let mut out = self.run_plan_into(plan, started, &mut rows).await?;
        out.batches = rows.batches;
        Ok(out)
    }

    /// Runs an optimized plan, its rows going to `sink` as they arrive (the
    /// output's `batches` stay empty).
    pub async fn run_plan_into(
        &self,
        plan: LogicalPlan,
        started: Instant,
        sink: &mut dyn RowSink,
    ) -> Result<SqlOutput> {
        let _one_statement = self.one_statement.lock().await;
        self.check_writes(&plan)?;
        if matches!(plan, LogicalPlan::Ddl(_) | LogicalPlan::Statement(_)) {
            self.pool.start_query(self.backend.host_memory_allowance());
            // Session state changes (allowed by the write policy): the context
            // runs them, not the physical planner.
            let schema = Arc::new(plan.schema().as_arrow().clone());
            let batches = self
                .ctx
                .execute_logical_plan(plan)
                .await
                .map_err(sql_error)?
                .collect()
                .await
                .map_err(from_datafusion)?;
            for batch in batches {
                sink.ready().await?;
                sink.push(batch)?;
            }
            return Ok(SqlOutput {
                schema,
                batches: Vec::new(),
                answers: Vec::new(),
                calls: Vec::new(),
                runtime_s: started.elapsed().as_secs_f64(),
                measurements: Default::default(),
            });
        }
        let nodes = ai_nodes(&plan);
        let calls: Vec<AiCall> = nodes.iter().map(|n| n.spec.call.clone()).collect();
        let controls = Arc::new(QueryControls::new(
            self.options.budget,
            self.options.on_row_error,
        ));
        let spend = controls.start_query(&calls);
        let progress = Arc::new(crate::exec::progress::Progress::new(
            self.options.progress,
            self.options.progress_parent.clone(),
        ));
        progress.start_query(
            self.expected_rows
                .lock()
                .expect("expected rows lock")
                .clone(),
        );
        let start = QueryStart {
            calls: calls.clone(),
            spend,
            reuse_earlier_kv: self.options.reuse_earlier_kv,
        };
        let query: Arc<dyn QueryBackend> = if calls.is_empty() {
            // A plain statement never waits for the model.
            Arc::new(QueryWithoutCalls::new(self.backend.clone(), start))
        } else {
            // Beginning may wait (for the tiers another query holds through
            // its forward batch, for a worker's turn): off the async threads.
            let backend = self.backend.clone();
            tokio::task::spawn_blocking(move || backend.begin(start))
                .await
                .map_err(|e| EngineError::Inference(format!("beginning the query failed: {e}")))??
        };
        // The heap the query may add is measured from here: after the
        // backend began it, so that a model loaded for this first AI
        // statement ([`crate::inference::lazy`]) is the process's, not the
        // query's.
        self.pool.start_query(self.backend.host_memory_allowance());
        // Ends the query however this returns, after its measurements are taken.
        let mut ends = QueryEnd {
            running: &self.canceller.running,
            progress: &progress,
            query: query.clone(),
            finished: false,
        };
        *self.canceller.running.lock().expect("running query lock") = Some(query.clone());
        let runtime = Arc::new(AiRuntime {
            query: query.clone(),
            recorder: Arc::new(AnswerRecorder::default()),
            memo: Mutex::new(AnswerMemo::new(self.backend.reuses_work())),
            controls: controls.clone(),
            progress: progress.clone(),
        });
        self.set_batch_size(&plan)?;
        let schema = Arc::new(plan.schema().as_arrow().clone());
        // The query's own state: its runtime rides in its session config,
        // where its AI operators find it when they execute.
        let mut state = self.ctx.state();
        state.config_mut().set_extension(runtime.clone());
        let task = Arc::new(datafusion::execution::TaskContext::from(&state));
        without_panics(
            async {
                let physical = state.create_physical_plan(&plan).await?;
                let physical = crate::limits::heap_check::with_heap_checks(physical)?;
                crate::data::row_sink::stream_rows(physical, task, sink).await
            },
            |message| EngineError::Sql(format!("DataFusion failed on the query: {message}")),
        )
        .await?
        .map_err(from_datafusion)?;
        ends.finished = true;
        controls.finish()?;
        let mut measurements = query.work();
        measurements.merge(&controls.report());
        let mut recorded = runtime.recorder.take();
        let answers = nodes
            .iter()
            .map(|n| {
                let c = &n.spec.call;
                match recorded.iter().position(|t| t.op_id == c.op_id) {
                    Some(i) => recorded.swap_remove(i),
                    None => AnswerTable::new(
                        &c.op_id,
                        c.kind,
                        n.spec.docs.iter().map(|d| d.alias.clone()).collect(),
                        c.labels.clone(),
                    ),
                }
            })
            .collect();
        Ok(SqlOutput {
            schema,
            batches: Vec::new(),
            answers,
            calls,
            runtime_s: started.elapsed().as_secs_f64(),
            measurements,
        })
    }
}

/// Ends the running query when dropped: a query stopped before its rows
/// were all out (its future dropped, an error) is cancelled, the session lets
/// go of its query object (the backend's query ends with the last handle) and
/// the progress lines close.
struct QueryEnd<'a> {
    running: &'a Mutex<Option<Arc<dyn QueryBackend>>>,
    progress: &'a crate::exec::progress::Progress,
    query: Arc<dyn QueryBackend>,
    finished: bool,
}

impl Drop for QueryEnd<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.query.cancel();
        }
        self.progress.finish_query();
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
    }
}

/// Stops the query a session is running, from another thread (a deadline, a
/// Ctrl-C, a client's cancel request): a handle on the session's running
/// query, whichever it is when used. One made before the session
/// ([`SqlSession::with_canceller`]) reaches the queries of the session made
/// later, on another task.
#[derive(Clone, Default)]
pub struct QueryCanceller {
    running: Arc<Mutex<Option<Arc<dyn QueryBackend>>>>,
    /// The query [`Self::cancel`] stopped, until [`Self::wait_stopped`] has
    /// waited for it: an aborted task lets go of its query before its last
    /// forward batch ends.
    cancelled: Arc<Mutex<Option<Arc<dyn QueryBackend>>>>,
}

impl QueryCanceller {
    /// Asks the running query's model work to stop soon; nothing when no
    /// query runs.
    pub fn cancel(&self) {
        let running = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(query) = running {
            query.cancel();
            *self.cancelled.lock().unwrap_or_else(|e| e.into_inner()) = Some(query);
        }
    }

    /// Blocks until the cancelled query's model work has stopped (at most one
    /// forward batch). Call it off the async threads.
    pub fn wait_stopped(&self) {
        let cancelled = self
            .cancelled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(query) = cancelled {
            query.wait_stopped();
        }
    }
}

/// Rows as lines of text, cells joined by ` | `, NULL as `NULL`: how tests and
/// the fuzzer compare results.
pub fn row_lines(batches: &[RecordBatch]) -> Result<Vec<String>> {
    use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
    let options = FormatOptions::default().with_null("NULL");
    let mut lines = Vec::new();
    for batch in batches {
        let cells = batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        for row in 0..batch.num_rows() {
            let line: Vec<String> = cells.iter().map(|c| c.value(row).to_string()).collect();
            lines.push(line.join(" | "));
        }
    }
    Ok(lines)
}

/// Deepest nesting the SQL reader parses: parentheses, brackets and `CASE`
/// open a level, and each prefix operator in a row (`NOT NOT x`, `- -1`)
/// adds one. sqlparser has a recursion limit, but some of its rules retry
/// another reading when a deeper one fails, even for the limit: near it,
/// `NOT (NOT (...))` 40 deep took minutes, its time doubling per level. A
/// statement nesting deeper gets an error before parsing starts.
pub const MAX_PARSE_NESTING: usize = 100;

/// The parser's own recursion limit: several of its levels make one level of
/// [`MAX_PARSE_NESTING`], and with room for all of them its retries never
/// start. Parsing runs on threads with large stacks (see `STACK_BYTES` of the
/// command line).
const PARSER_RECURSION_LIMIT: usize = 10 * MAX_PARSE_NESTING;

/// The error for a statement nested too deeply for the parser.
fn too_deep(found: Option<usize>) -> EngineError {
    EngineError::Sql(format!(
        "the statement nests {}deeper than the parser's recursion limit ({MAX_PARSE_NESTING} \
         levels of parentheses, brackets, CASE and prefix operators such as NOT); flatten it \
         (IN (...) for long lists, a CTE for a deep subquery)",
        found.map_or(String::new(), |n| format!("{n} levels deep, "))
    ))
}

/// How deeply `tokens` nest, as [`MAX_PARSE_NESTING`] counts.
fn nesting(tokens: &[datafusion::sql::sqlparser::tokenizer::TokenWithSpan]) -> usize {
    use datafusion::sql::sqlparser::keywords::Keyword;
    use datafusion::sql::sqlparser::tokenizer::Token;
    let (mut open, mut prefix, mut deepest) = (0usize, 0usize, 0usize);
    for t in tokens {
        match &t.token {
            Token::Whitespace(_) => continue,
            Token::LParen | Token::LBracket => open += 1,
            Token::RParen | Token::RBracket => open = open.saturating_sub(1),
            Token::Word(w) if w.keyword == Keyword::CASE => open += 1,
            Token::Word(w) if w.keyword == Keyword::END => open = open.saturating_sub(1),
            _ => {}
        }
        let is_prefix = match &t.token {
            Token::Word(w) => w.keyword == Keyword::NOT,
            Token::Minus | Token::Plus | Token::Tilde | Token::ExclamationMark => true,
            _ => false,
        };
        prefix = if is_prefix { prefix + 1 } else { 0 };
        deepest = deepest.max(open + prefix);
    }
    deepest
}

/// The one statement of `sql`.
fn parse_one(
    sql: &str,
    state: &datafusion::execution::SessionState,
) -> Result<datafusion::sql::parser::Statement> {
    use datafusion::error::DataFusionError;
    use datafusion::sql::sqlparser::parser::ParserError;
    let dialect_name = state.config().options().sql_parser.dialect.to_string();
    let dialect = datafusion::sql::sqlparser::dialect::dialect_from_str(&dialect_name)
        .ok_or_else(|| EngineError::Sql(format!("unknown SQL dialect {dialect_name}")))?;
    let parse_error = |e: DataFusionError| match e {
        DataFusionError::SQL(e, _) if matches!(*e, ParserError::RecursionLimitExceeded) => {
            too_deep(None)
        }
        e => EngineError::Sql(e.to_string()),
    };
    let tokens = datafusion::sql::sqlparser::tokenizer::Tokenizer::new(dialect.as_ref(), sql)
        .tokenize_with_location()
        .map_err(|e| parse_error(DataFusionError::SQL(Box::new(e.into()), None)))?;
    let depth = nesting(&tokens);
    if depth > MAX_PARSE_NESTING {
        return Err(too_deep(Some(depth)));
    }
    let mut statements = datafusion::sql::parser::DFParserBuilder::new(tokens)
        .with_dialect(dialect.as_ref())
        .with_recursion_limit(PARSER_RECURSION_LIMIT)
        .build()
        .and_then(|mut parser| parser.parse_statements())
        .map_err(parse_error)?;
    match (statements.pop_front(), statements.len()) {
        (Some(s), 0) => Ok(s),
        (None, _) => Err(EngineError::Sql("no SQL statement given".into())),
        (Some(_), more) => Err(EngineError::Sql(format!(
            "{} statements given; aisql runs one at a time",
            more + 1
        ))),
    }
}

/// The prompt templates of the AI calls in `sql`, in any spelling (what an
/// oracle must load labels for), without planning it.
pub fn templates(sql: &str) -> Result<Vec<String>> {
    let state = SessionContext::new().state();
    let mut statement = parse_one(sql, &state)?;
    let mut t: Vec<String> = spelling::normalize(&mut statement)?
        .sites
        .into_keys()
        .collect();
    t.sort();
    Ok(t)
}

/// A plan DataFusion could not consume or analyze: an invalid plan.
/// The message is the innermost error's, without the analyzer rule's name.
/// The error of a Substrait consumer that panicked.
fn consume_panic(message: &str) -> EngineError {
    EngineError::InvalidPlan(format!("DataFusion could not consume the plan: {message}"))
}

/// A plan's error as the engine reports it: DataFusion's planning and
/// Substrait errors are invalid plans, named by their root cause. The error
/// of a caller's own (its consumer's, say) comes back whole, for the caller to
/// find.
pub fn plan_error(e: datafusion::error::DataFusionError) -> EngineError {
    use datafusion::error::DataFusionError;
    match from_datafusion(e) {
        EngineError::DataFusion(e) if matches!(e.find_root(), DataFusionError::External(_)) => {
            EngineError::DataFusion(e)
        }
        EngineError::DataFusion(e) => EngineError::InvalidPlan(match e.find_root() {
            DataFusionError::Plan(m) | DataFusionError::Substrait(m) => m.clone(),
            root => root.strip_backtrace(),
        }),
        other => other,
    }
}

/// A planning error as the engine reports it: SQL mistakes (unknown table or
/// column, types) are `sql:` errors.
fn sql_error(e: datafusion::error::DataFusionError) -> EngineError {
    match from_datafusion(e) {
        EngineError::DataFusion(e) => EngineError::Sql(e.strip_backtrace()),
        other => other,
    }
}
