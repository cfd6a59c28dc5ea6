//! `aisql._aisql`, the native half of the Python package: `connect` fills in
//! an [`aisql::EngineConfig`] from its keyword arguments, each set through
//! the table of [`aisql::config::OPTIONS`] (the value parsers the flags use)
//! and the whole checked by [`aisql::EngineConfig::validate`], its messages
//! naming keywords, and opens it with [`aisql::connect`]; `register` adds
//! tables (paths, or Arrow data through the PyCapsule interface), and `sql`
//! returns a lazy [`Relation`] whose rows cross back to Python as Arrow
//! without copies.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock, mpsc};
use std::time::Duration;

use aisql::commands::connect::Connection as EngineConnection;
use aisql::config::{ConfigBuilder, Names, OptionValue, UsageError};
use aisql_engine::sql::SqlOutput;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::display::array_value_to_string;
use datafusion::datasource::MemTable;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyString};
use pyo3_arrow::PyTable;
use tokio::runtime::Runtime;

create_exception!(
    _aisql,
    Error,
    PyException,
    "An error from aisql: a statement, a table or a model that failed, with the engine's message."
);

/// How often a waiting call looks for Ctrl-C: short enough to feel at once,
/// long enough to cost nothing.
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// The one runtime every connection's statements run on (its threads have the
/// stack DataFusion's recursive planning needs).
fn runtime() -> PyResult<&'static Runtime> {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    if let Some(rt) = RUNTIME.get() {
        return Ok(rt);
    }
    let rt = aisql::commands::runtime().map_err(engine_error)?;
    Ok(RUNTIME.get_or_init(|| rt))
}

/// The engine's error with its whole chain of causes (`{:#}`).
fn engine_error(e: impl std::fmt::Display) -> PyErr {
    Error::new_err(format!("{e:#}"))
}

/// Runs `work` on the runtime while this thread, without the GIL, waits for it
/// and looks for signals: a KeyboardInterrupt (or any signal handler's error)
/// drops the work, which stops the statement and its model work, and is raised
/// once the work is gone, so the connection is free for the next statement.
fn run_interruptible<T: Send + 'static>(
    py: Python<'_>,
    work: impl Future<Output = T> + Send + 'static,
) -> PyResult<T> {
    let rt = runtime()?;
    let (tx, mut rx) = mpsc::channel();
    let task = rt.spawn(async move {
        // The receiver only goes away on an interrupt, when nobody wants it.
        let _ = tx.send(work.await);
    });
    loop {
        // The receiver moves to the GIL-free wait and back (it is not Sync).
        let (got, back) = py.detach(move || (rx.recv_timeout(SIGNAL_POLL), rx));
        rx = back;
        match got {
            Ok(out) => return Ok(out),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(Error::new_err(
                    "the statement's task ended without a result",
                ));
            }
        }
        if let Err(interrupt) = py.check_signals() {
            task.abort();
            // The sender drops with the work: then it has stopped.
            let _ = py.detach(move || rx.recv());
            return Err(interrupt);
        }
    }
}

/// A keyword argument's value as the option table reads it: `True` / `False`
/// for a switch, a list or tuple item by item, paths through `os.fspath`,
/// the rest through `str` (so `timeout_s=5` reads as `--timeout-s 5` does).
fn option_value(value: &Bound<'_, PyAny>) -> PyResult<OptionValue> {
    if let Ok(b) = value.cast::<pyo3::types::PyBool>() {
        return Ok(OptionValue::Bool(b.is_true()));
    }
    if value.is_instance_of::<pyo3::types::PyList>()
        || value.is_instance_of::<pyo3::types::PyTuple>()
    {
        let items = value
            .try_iter()?
            .map(|item| value_text(&item?))
            .collect::<PyResult<_>>()?;
        return Ok(OptionValue::List(items));
    }
    Ok(OptionValue::Text(value_text(value)?))
}

/// A value as text: paths through `os.fspath`, the rest through `str`.
fn value_text(value: &Bound<'_, PyAny>) -> PyResult<String> {
    if !value.is_instance_of::<PyString>()
        && let Ok(path) = value.extract::<PathBuf>()
    {
        return Ok(path.to_string_lossy().into_owned());
    }
    Ok(value.str()?.to_string())
}

/// A value the configuration refused: Python's `ValueError`.
fn usage_error(e: UsageError) -> PyErr {
    PyValueError::new_err(e.0)
}

/// Sets keyword `key` to `value` (`None`: the default, as if not given); an
/// unknown keyword is a `TypeError` naming it and listing the known ones.
fn set_keyword(config: &mut ConfigBuilder, key: &str, value: &Bound<'_, PyAny>) -> PyResult<()> {
    if !aisql::config::option_names().any(|name| name == key) {
        // The flags with no keyword of their own say which one to use.
        let instead = match key {
            "gpu" | "cpu" => " (use device=)",
            "table" => " (use tables=)",
            _ => "",
        };
        let mut known: Vec<&str> = aisql::config::option_names().collect();
        known.extend(["device", "tables", "allow_writes"]);
        known.sort_unstable();
        return Err(PyTypeError::new_err(format!(
            "connect() got an unexpected keyword argument '{key}'{instead}; the keywords are {}",
            known.join(", ")
        )));
    }
    if value.is_none() {
        return Ok(());
    }
    config
        .set(Names::Keywords, key, &option_value(value)?)
        .map_err(usage_error)
}

/// The settings the environment gives, as the command line reads them from
/// its variables (a keyword argument overrides each).
const ENVIRONMENT: &[(&str, &str)] = &[
    ("AISQL_MODEL", "model"),
    ("AISQL_ROOT", "root"),
    ("AISQL_ANSWER_CACHE", "answer_cache"),
    ("AISQL_CUDA_KERNELS", "cuda_kernels"),
];

/// `device=`: `"cpu"` is the default, `"cuda"` / `"cuda:N"` is GPU N.
fn device_gpus(device: &str) -> PyResult<Option<Vec<usize>>> {
    match device.trim() {
        "cpu" => Ok(None),
        "cuda" => Ok(Some(vec![0])),
        d => match d.strip_prefix("cuda:").map(|n| n.parse::<usize>()) {
            Some(Ok(n)) => Ok(Some(vec![n])),
            _ => Err(PyValueError::new_err(format!(
                "device={device:?}: expected \"cpu\", \"cuda\" or \"cuda:N\""
            ))),
        },
    }
}

/// One table for `register` or `tables=`: a path, or Arrow data (anything
/// with `__arrow_c_stream__`, a pandas DataFrame through pyarrow).
enum TableSource {
    Path(PathBuf),
    Arrow(PyTable),
}

impl TableSource {
    fn extract(name: &str, data: &Bound<'_, PyAny>) -> PyResult<Self> {
        let py = data.py();
        if let Ok(path) = data.extract::<PathBuf>() {
            return Ok(Self::Path(path));
        }
        // A pandas frame: without its index, as a table of its columns.
        let is_pandas = match py.import("sys")?.getattr("modules")?.get_item("pandas") {
            Ok(pandas) => data.is_instance(&pandas.getattr("DataFrame")?)?,
            Err(_) => false,
        };
        let data = if is_pandas {
            let from_pandas = py
                .import("pyarrow")?
                .getattr("Table")?
                .getattr("from_pandas")?;
            let kwargs = PyDict::new(py);
            kwargs.set_item("preserve_index", false)?;
            from_pandas.call((data,), Some(&kwargs))?
        } else {
            data.clone()
        };
        if !data.hasattr("__arrow_c_stream__")? {
            return Err(PyTypeError::new_err(format!(
                "table {name:?}: expected a path, a pandas DataFrame or Arrow data \
                 (an object with __arrow_c_stream__, e.g. a pyarrow.Table), got {}",
                data.get_type().name()?
            )));
        }
        Ok(Self::Arrow(data.extract::<PyTable>().map_err(|e| {
            Error::new_err(format!("table {name:?}: reading its Arrow stream: {e}"))
        })?))
    }
}

/// A connection: tables and a model that statements run on, one at a time.
#[pyclass(frozen, module = "aisql")]
struct Connection {
    inner: Arc<EngineConnection>,
}

#[pymethods]
impl Connection {
    /// Registers `data` as table `name`, replacing one of that name: a path
    /// (a .parquet, .csv or .json file or a folder of them, as `--table`), a
    /// pandas DataFrame, or Arrow data such as a pyarrow.Table (kept in memory).
    fn register(&self, py: Python<'_>, name: &str, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let source = TableSource::extract(name, data)?;
        self.add_table(py, name, source)
    }

    /// Runs nothing yet: the statement runs on the result's first use.
    fn sql(slf: Bound<'_, Self>, query: String) -> Relation {
        Relation {
            connection: slf.unbind(),
            sql: query,
            out: OnceLock::new(),
        }
    }

    /// Runs `statement` at once (a `CREATE VIEW`, a `COPY`, ...) and returns
    /// its result.
    fn execute(slf: Bound<'_, Self>, statement: String) -> PyResult<Relation> {
        let relation = Self::sql(slf.clone(), statement);
        relation.output(slf.py())?;
        Ok(relation)
    }
}

impl Connection {
    fn add_table(&self, py: Python<'_>, name: &str, source: TableSource) -> PyResult<()> {
        let conn = self.inner.clone();
        let name = name.to_string();
        match source {
            TableSource::Path(path) => run_interruptible(py, async move {
                conn.register(&name, &path).await.map_err(engine_error)
            })?,
            TableSource::Arrow(table) => {
                let (batches, schema) = table.into_inner();
                let (schema, batches) = utf8_strings(schema, batches).map_err(engine_error)?;
                let mem = MemTable::try_new(schema, vec![batches]).map_err(engine_error)?;
                let ctx = conn.session().context();
                ctx.deregister_table(name.as_str()).map_err(engine_error)?;
                ctx.register_table(name.as_str(), Arc::new(mem))
                    .map_err(engine_error)?;
                Ok(())
            }
        }
    }
}

/// The table with its `LargeUtf8` columns as `Utf8`: pandas' strings come
/// through pyarrow as `large_string`, and the AI functions read `Utf8` (only
/// those columns are copied).
fn utf8_strings(
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
) -> Result<(SchemaRef, Vec<RecordBatch>), ArrowError> {
    let large = |f: &Field| f.data_type() == &DataType::LargeUtf8;
    if !schema.fields().iter().any(|f| large(f)) {
        return Ok((schema, batches));
    }
    let fields = schema.fields().iter().map(|f| {
        let f = f.as_ref().clone();
        if large(&f) {
            f.with_data_type(DataType::Utf8)
        } else {
            f
        }
    });
    let utf8 = Arc::new(Schema::new_with_metadata(
        fields.collect::<Vec<_>>(),
        schema.metadata().clone(),
    ));
    let batches = batches
        .into_iter()
        .map(|batch| {
            let columns = batch
                .columns()
                .iter()
                .zip(utf8.fields())
                .map(|(c, f)| cast(c, f.data_type()))
                .collect::<Result<Vec<_>, _>>()?;
            RecordBatch::try_new(utf8.clone(), columns)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((utf8, batches))
}

/// Opens a connection: `model` (`tiny`, a folder or a Hugging Face id),
/// `device` (`cpu`, `cuda:N`), tables (`tables={name: path or data}`, or a
/// QUAIL-B `root`/`sf`), and any option of `aisql sql` by its flag's name as
/// a keyword (`backend="oracle"`, `max_fresh_tokens=1000`, `timeout_s=5`,
/// `simulate=True`, ...; see `aisql::config::OPTIONS`).
#[pyfunction]
#[pyo3(signature = (model=None, device=None, root=None, sf=None, answer_cache=None,
                    tables=None, allow_writes=false, **options))]
#[allow(clippy::too_many_arguments)]
fn connect(
    py: Python<'_>,
    model: Option<&Bound<'_, PyAny>>,
    device: Option<&str>,
    root: Option<&Bound<'_, PyAny>>,
    sf: Option<&Bound<'_, PyAny>>,
    answer_cache: Option<&Bound<'_, PyAny>>,
    tables: Option<&Bound<'_, PyDict>>,
    allow_writes: bool,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<Connection> {
    let mut config = ConfigBuilder::default();
    for (var, key) in ENVIRONMENT {
        if let Some(value) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            let value = OptionValue::Text(value.to_string_lossy().into_owned());
            config
                .set(Names::Keywords, key, &value)
                .map_err(|e| PyValueError::new_err(format!("{var}: {e}")))?;
        }
    }
    let none = py.None().into_bound(py);
    for (key, value) in [
        ("model", model),
        ("root", root),
        ("sf", sf),
        ("answer_cache", answer_cache),
    ] {
        set_keyword(&mut config, key, value.unwrap_or(&none))?;
    }
    if let Some(device) = device {
        config.config.backend.model.gpu = device_gpus(device)?;
    }
    let mut in_memory = Vec::new();
    for (name, data) in tables.iter().flat_map(|t| t.iter()) {
        let name: String = name.extract()?;
        if name.trim().is_empty() {
            return Err(PyValueError::new_err("tables: a table's name is empty"));
        }
        match TableSource::extract(&name, &data)? {
            TableSource::Path(path) => config.config.tables.tables.push((name.trim().into(), path)),
            arrow => in_memory.push((name, arrow)),
        }
    }
    for (key, value) in options.iter().flat_map(|o| o.iter()) {
        set_keyword(&mut config, &key.extract::<String>()?, &value)?;
    }
    // No root and no sf: the tables are the ones given, not a QUAIL-B
    // dataset found on disk (register adds more).
    config.config.tables.default_dataset = sf.is_some_and(|s| !s.is_none());
    config.config.allow_writes = allow_writes;
    let config = config.build(Names::Keywords).map_err(usage_error)?;
    let inner = run_interruptible(py, async move { aisql::connect(&config).await })?
        .map_err(engine_error)?;
    let connection = Connection {
        inner: Arc::new(inner),
    };
    for (name, source) in in_memory {
        connection.add_table(py, &name, source)?;
    }
    Ok(connection)
}

/// A statement's finished run.
struct Output {
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
    runtime_s: f64,
    ai_operators: usize,
    measurements: aisql_engine::inference::work::Work,
}

impl From<SqlOutput> for Output {
    fn from(out: SqlOutput) -> Self {
        Self {
            schema: out.schema,
            batches: out.batches,
            runtime_s: out.runtime_s,
            ai_operators: out.calls.len(),
            measurements: out.measurements,
        }
    }
}

/// A statement's result, run on first use (then kept): `to_arrow()`,
/// `to_pandas()`, `metrics`, or Arrow's `__arrow_c_stream__`.
#[pyclass(frozen, module = "aisql")]
struct Relation {
    connection: Py<Connection>,
    sql: String,
    out: OnceLock<Output>,
}

impl Relation {
    fn output(&self, py: Python<'_>) -> PyResult<&Output> {
        if let Some(out) = self.out.get() {
            return Ok(out);
        }
        let out = self.run(py, self.sql.clone())?;
        Ok(self.out.get_or_init(|| out))
    }

    fn run(&self, py: Python<'_>, sql: String) -> PyResult<Output> {
        let conn = self.connection.get().inner.clone();
        run_interruptible(py, async move { conn.run(conn.session(), &sql).await })?
            .map(Output::from)
            .map_err(engine_error)
    }

    fn table(&self, py: Python<'_>) -> PyResult<PyTable> {
        let out = self.output(py)?;
        PyTable::try_new(out.batches.clone(), out.schema.clone())
    }
}

#[pymethods]
impl Relation {
    /// The rows as a pyarrow.Table (the Arrow buffers are shared, not copied).
    fn to_arrow<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.table(py)?.into_pyarrow(py)
    }

    /// The rows as a pandas DataFrame (through pyarrow).
    fn to_pandas<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.to_arrow(py)?.call_method0("to_pandas")
    }

    /// The Arrow PyCapsule stream of the rows (`pyarrow.table(result)`,
    /// `polars.from_arrow(result)`, ...).
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyCapsule>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        Bound::new(py, self.table(py)?)?.call_method1("__arrow_c_stream__", (requested_schema,))
    }

    /// The statement's plans (`EXPLAIN`), or with `analyze=True` its plan with
    /// what each operator did (`EXPLAIN ANALYZE`, which runs it).
    #[pyo3(signature = (analyze=false))]
    fn explain(&self, py: Python<'_>, analyze: bool) -> PyResult<String> {
        let verb = if analyze {
            "EXPLAIN ANALYZE"
        } else {
            "EXPLAIN"
        };
        let out = self.run(py, format!("{verb} {}", self.sql))?;
        let mut text = String::new();
        for batch in &out.batches {
            for row in 0..batch.num_rows() {
                let cells = batch
                    .columns()
                    .iter()
                    .map(|c| array_value_to_string(c, row))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(engine_error)?;
                text.push_str(&cells.join(":\n"));
                text.push_str("\n\n");
            }
        }
        Ok(text.trim_end().to_string())
    }

    /// What the run cost: `rows`, `seconds`, `ai_operators`, and the engine's
    /// measurements (fresh tokens, model calls, ...).
    #[getter]
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let out = self.output(py)?;
        let mut all = out.measurements.to_json();
        let rows: usize = out.batches.iter().map(RecordBatch::num_rows).sum();
        all.insert("rows".into(), rows.into());
        all.insert("seconds".into(), out.runtime_s.into());
        all.insert("ai_operators".into(), out.ai_operators.into());
        let json = serde_json::Value::Object(all).to_string();
        py.import("json")?
            .call_method1("loads", (json,))?
            .cast_into::<PyDict>()
            .map_err(Into::into)
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self
            .output(py)?
            .batches
            .iter()
            .map(RecordBatch::num_rows)
            .sum())
    }

    fn __repr__(&self) -> String {
        format!("<aisql.Relation {:?}>", self.sql)
    }
}

#[pymodule]
fn _aisql(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(connect, m)?)?;
    m.add_class::<Connection>()?;
    m.add_class::<Relation>()?;
    m.add("Error", m.py().get_type::<Error>())?;
    Ok(())
}
