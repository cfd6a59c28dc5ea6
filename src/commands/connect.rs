//! Opening SQL sessions over the tables and the model a command names — one
//! rule for `aisql sql`, its shell, `aisql serve` and the Python package — and
//! running statements on a long-lived [`Connection`]: one at a time on the
//! one model, each stopped with its model work when it is dropped.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aisql_bench::layout::Dataset;
use aisql_bench::resolve::resolve;
use aisql_engine::data::row_sink::ChannelRows;
use aisql_engine::data::write_guard::WriteGuard;
use aisql_engine::inference::backend::InferenceBackend;
use aisql_engine::sql::options::QueryOptions;
use aisql_engine::sql::text_scan::CsvReading;
use aisql_engine::sql::{Evaluation, SqlOutput, SqlSession, WritePolicy};
use datafusion::logical_expr::LogicalPlan;

use super::UsageError;
use super::budget::Controls;
use crate::config::{BackendSpec, EngineConfig, QueryConfig, TablesConfig};

/// The options every statement of `aisql query`, `aisql sql` and a
/// connection runs with: prompt format, batch rows, memory and recursion
/// limits, the model's name, progress lines, budget and row-error policy.
pub fn query_options(
    backend: &BackendSpec,
    query: &QueryConfig,
    controls: Controls,
) -> anyhow::Result<QueryOptions> {
    Ok(QueryOptions {
        format: backend.prompt_format.parse()?,
        progress: query.cost.progress,
        progress_parent: None,
        expected_rows: Default::default(),
        batch_rows: query.batch_rows,
        memory_limit: query.memory_limit(),
        max_recursion: query.max_recursion,
        model: backend.model_name(),
        budget: controls.budget,
        on_row_error: controls.on_row_error,
        reuse_earlier_kv: query.keep_kv.unwrap_or(true),
    })
}

/// What a refused write tells the user of `aisql sql` and its shell.
pub const HOW_TO_ALLOW_WRITES: &str =
    "run it with --allow-writes to let statements write or change the session";

/// The tables a command names and the QUAIL-B dataset it reads, if any.
pub struct Sources {
    /// `--table NAME=PATH`, in order.
    pub tables: Vec<(String, PathBuf)>,
    /// The dataset, when `--root` names one or no table is given (the usual
    /// look-up order; not for the Python package, see `default_dataset`).
    pub dataset: Option<Dataset>,
    lenient_csv: bool,
}

impl Sources {
    /// The sources `args` name; the dataset is found (or refused) here,
    /// before any table is read.
    pub fn from_config(args: &TablesConfig) -> anyhow::Result<Self> {
        let tables = args.tables.clone();
        let dataset = if args.root.is_some() || (tables.is_empty() && args.default_dataset) {
            Some(resolve(
                args.root.as_deref(),
                args.sf,
                args.collection.as_deref(),
            )?)
        } else {
            None
        };
        Ok(Self {
            tables,
            dataset,
            lenient_csv: args.lenient_csv,
        })
    }

    /// Adds what these sources read to `guard`: each table's path and the
    /// dataset's root.
    pub fn add_inputs(&self, guard: &mut WriteGuard) {
        for (name, path) in &self.tables {
            guard.add(path, format!("the --table {name}"));
        }
        if let Some(dataset) = &self.dataset {
            super::paths::add_dataset(guard, dataset);
        }
    }

    /// Registers the tables in `session`; a `--table` replaces the dataset's
    /// table of that name.
    pub async fn register(&self, session: &SqlSession) -> anyhow::Result<()> {
        if self.lenient_csv {
            session.set_csv_reading(CsvReading::Lenient);
        }
        if let Some(dataset) = &self.dataset {
            let mut dataset_tables = dataset.require_all_tables()?;
            dataset_tables.retain(|name, _| !self.tables.iter().any(|(n, _)| n == name));
            session.register_dataset(&dataset_tables).await?;
        }
        for (name, path) in &self.tables {
            session.register(name, path).await?;
        }
        Ok(())
    }
}

/// One model and one set of tables that many statements, from one or many
/// sessions, run on at once. Each statement is a query of its own on the
/// backend, with its own answers, measurements, budget and stop; their model
/// work takes turns call by call, and a statement without AI calls never
/// waits for it.
pub struct Connection {
    backend: Arc<dyn InferenceBackend>,
    /// The session the tables were registered in; others share them.
    base: SqlSession,
    options: QueryOptions,
    /// Where statements may write: tables registered later join its inputs.
    policy: std::sync::Mutex<WritePolicy>,
    timeout: Option<Duration>,
}

impl Connection {
    /// Opens the tables and loads the model `config` names. Statements may
    /// write (under the one write rule) only when `config.allow_writes`; a
    /// refused one says [`HOW_TO_ALLOW_WRITES`].
    pub async fn open(config: &EngineConfig) -> anyhow::Result<Self> {
        Self::open_with(config, config.allow_writes, Some(HOW_TO_ALLOW_WRITES)).await
    }

    /// Opens a connection whose statements never write (`aisql serve`),
    /// whatever `config.allow_writes` says.
    pub async fn open_read_only(config: &EngineConfig) -> anyhow::Result<Self> {
        Self::open_with(config, false, None).await
    }

    async fn open_with(
        args: &EngineConfig,
        allow_writes: bool,
        how_to_allow: Option<&str>,
    ) -> anyhow::Result<Self> {
        if args.query.cost.estimate {
            return Err(UsageError(
                "--estimate estimates one statement without running it: give it to aisql sql \
                 or aisql query with that statement"
                    .into(),
            )
            .into());
        }
        let controls = super::budget::controls(&args.query.cost, &args.backend)?;
        let sources = Sources::from_config(&args.tables)?;
        let mut guard = WriteGuard::new();
        sources.add_inputs(&mut guard);
        super::paths::add_backend_files(&mut guard, &args.backend);
        super::paths::check_stores(&guard, &args.backend)?;
        let options = query_options(&args.backend, &args.query, controls)?;
        // Any statement may come: the oracle loads every label set.
        let backend =
            super::backend::build_for_sessions(&args.backend, sources.dataset.as_ref(), None)?;
        let policy = WritePolicy {
            allow_writes,
            guard,
            how_to_allow: how_to_allow.map(str::to_string),
        };
        let base = SqlSession::new(backend.clone(), options.clone(), Evaluation::Operators)?;
        base.set_write_policy(policy.clone());
        sources.register(&base).await?;
        Ok(Self {
            backend,
            base,
            options,
            policy: std::sync::Mutex::new(policy),
            timeout: args.query.timeout,
        })
    }

    /// The model's backend.
    pub fn backend(&self) -> &Arc<dyn InferenceBackend> {
        &self.backend
    }

    /// The session the tables were registered in.
    pub fn session(&self) -> &SqlSession {
        &self.base
    }

    /// A new session over the same tables and model, with a catalog of its
    /// own (a view one session creates is not another's).
    pub async fn new_session(&self) -> anyhow::Result<SqlSession> {
        let session = SqlSession::new(
            self.backend.clone(),
            self.options.clone(),
            Evaluation::Operators,
        )?;
        session.set_write_policy(self.write_policy()?);
        session.share_tables_from(&self.base).await?;
        Ok(session)
    }

    /// Registers the file or folder `path` as table `name` of the
    /// connection's session, replacing a table of that name; like every
    /// input, no statement may write over or into it.
    pub async fn register(&self, name: &str, path: &std::path::Path) -> anyhow::Result<()> {
        {
            let mut policy = self
                .policy
                .lock()
                .map_err(|_| anyhow::anyhow!("the write policy was poisoned by a panic"))?;
            policy.guard.add(path, format!("the table {name}"));
            self.base.set_write_policy(policy.clone());
        }
        self.base.context().deregister_table(name)?;
        self.base.register(name, path).await?;
        Ok(())
    }

    fn write_policy(&self) -> anyhow::Result<WritePolicy> {
        Ok(self
            .policy
            .lock()
            .map_err(|_| anyhow::anyhow!("the write policy was poisoned by a panic"))?
            .clone())
    }

    /// Runs `sql` on `session`. Dropping the returned
    /// future (a cancel, Ctrl-C) stops the statement: DataFusion at once, the
    /// model after its forward batch in flight. Past `--timeout-s` it stops
    /// the same way and fails naming the limit.
    pub async fn run(&self, session: &SqlSession, sql: &str) -> anyhow::Result<SqlOutput> {
        let started = Instant::now();
        self.within_limits(async { session.run(sql).await }, started, None)
            .await
    }

    /// Runs a plan `session` made, as [`Self::run`].
    pub async fn run_plan(
        &self,
        session: &SqlSession,
        plan: LogicalPlan,
    ) -> anyhow::Result<SqlOutput> {
        let started = Instant::now();
        self.within_limits(
            async { session.run_plan(plan, started).await },
            started,
            None,
        )
        .await
    }

    /// Starts `plan` on `session` as a task of its own, its rows going to
    /// `rows` as they come (a server streaming them to its client), under
    /// `--timeout-s` and `statement_timeout` (a server session's own limit),
    /// whichever comes first. The task ends when the statement
    /// does, or soon after the reader of `rows` goes away: the statement is
    /// then dropped, which stops its model work after the forward batch in
    /// flight.
    pub fn spawn_into(
        self: &Arc<Self>,
        session: Arc<SqlSession>,
        plan: LogicalPlan,
        statement_timeout: Option<Duration>,
        mut rows: ChannelRows,
    ) -> tokio::task::JoinHandle<anyhow::Result<SqlOutput>> {
        let connection = self.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let reader_gone = rows.reader_gone();
            let work = connection.within_limits(
                session.run_plan_into(plan, started, &mut rows),
                started,
                statement_timeout,
            );
            tokio::select! {
                out = work => out,
                () = reader_gone => {
                    anyhow::bail!("the reader of the rows went away; the statement was stopped")
                }
            }
        })
    }

    async fn within_limits(
        &self,
        work: impl Future<Output = aisql_engine::Result<SqlOutput>>,
        started: Instant,
        statement_timeout: Option<Duration>,
    ) -> anyhow::Result<SqlOutput> {
        // A statement dropped or timed out before its last row drops its
        // query, which stops its model work after the forward batch in
        // flight (`SqlSession::run_plan_into`).
        // The sooner of the command's limit and the session's.
        let limit = [
            self.timeout.map(|t| (t, "--timeout-s")),
            statement_timeout.map(|t| (t, "statement_timeout")),
        ]
        .into_iter()
        .flatten()
        .min_by_key(|(t, _)| *t);
        let out = match limit {
            None => work.await,
            Some((limit, name)) => {
                let left = limit.saturating_sub(started.elapsed());
                tokio::time::timeout(left, work).await.map_err(|_| {
                    let limit = match name {
                        "--timeout-s" => format!("--timeout-s {}", limit.as_secs_f64()),
                        _ => format!("{name} = {} ms", limit.as_millis()),
                    };
                    anyhow::anyhow!("the statement ran past {limit} and was stopped")
                })?
            }
        };
        Ok(out?)
    }
}
