//! The engine's error type and its one mapping to and from `DataFusionError`.

use datafusion::error::DataFusionError;

/// Errors raised by the engine. Every variant names what and where.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The plan file could not be read or decoded.
    #[error("plan {path}: {message}")]
    PlanFile {
        /// Path of the plan file.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// The plan decodes but DataFusion cannot consume it, or an AI call in it
    /// is malformed.
    #[error("invalid plan: {0}")]
    InvalidPlan(String),
    /// A SQL query is malformed or uses an AI function wrongly; the message
    /// names the call and, where known, its line and column.
    #[error("sql: {0}")]
    Sql(String),
    /// A backend that answers from stored answers (reference labels, recorded
    /// answers) has none for a call or row: which call, and what is missing.
    #[error("no answer: {0}")]
    NoAnswer(String),
    /// A write the command may not make: over or into one of its inputs, or a
    /// writing statement in read-only SQL.
    #[error("refused: {0}")]
    WriteRefused(String),
    /// An output file cannot be written where it was asked for (its folder is
    /// missing); `what` is the flag and path as the user gave them.
    #[error("cannot write {what}: {message}")]
    Output {
        /// The output: `--output rows.csv`, or its path alone.
        what: String,
        /// Why.
        message: String,
    },
    /// An environment setting has a value aisql cannot use (which, and why).
    #[error("setting: {0}")]
    Setting(String),
    /// Input data is missing or malformed (table files, columns, nulls).
    #[error("data: {0}")]
    Data(String),
    /// The inference backend failed.
    #[error("inference: {0}")]
    Inference(String),
    /// The query's budget (`--max-fresh-tokens`, `--max-model-seconds`,
    /// `--max-cost-usd`) was spent before its AI operators were done: what
    /// was spent, by how much past the limit, and what each operator had
    /// answered.
    #[error("over budget: {0}")]
    OverBudget(String),
    /// A worker of `--workers` failed or could not be reached.
    #[error("worker {worker}: {message}")]
    Worker {
        /// Its index and address, as the user listed it.
        worker: String,
        /// What went wrong.
        message: String,
    },
    /// A model-crate error.
    #[error(transparent)]
    Model(#[from] aisql_models::ModelError),
    /// I/O error with the path it concerns.
    #[error("{path}: {cause}")]
    Io {
        /// The path being read or written.
        path: String,
        /// The underlying error (not chained as a source: the message already shows it).
        cause: std::io::Error,
    },
    /// An Arrow compute error.
    #[error(transparent)]
    Arrow(#[from] datafusion::arrow::error::ArrowError),
    /// An error inside DataFusion.
    #[error(transparent)]
    DataFusion(#[from] DataFusionError),
}

/// Engine result.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;

impl EngineError {
    /// An I/O error for `path`.
    pub fn io(path: impl AsRef<std::path::Path>, cause: std::io::Error) -> Self {
        EngineError::Io {
            path: path.as_ref().display().to_string(),
            cause,
        }
    }
}

impl From<EngineError> for DataFusionError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::DataFusion(e) => e,
            other => DataFusionError::External(Box::new(other)),
        }
    }
}

/// Recovers an `EngineError` that travelled through DataFusion as `External`.
pub fn from_datafusion(e: DataFusionError) -> EngineError {
    match e {
        DataFusionError::External(inner) => match inner.downcast::<EngineError>() {
            Ok(engine) => *engine,
            Err(other) => EngineError::DataFusion(DataFusionError::External(other)),
        },
        DataFusionError::Context(ctx, inner) => match from_datafusion(*inner) {
            EngineError::DataFusion(inner) => {
                EngineError::DataFusion(DataFusionError::Context(ctx, Box::new(inner)))
            }
            engine => engine,
        },
        DataFusionError::Shared(shared) => match std::sync::Arc::try_unwrap(shared) {
            Ok(e) => from_datafusion(e),
            Err(shared) => EngineError::DataFusion(DataFusionError::Shared(shared)),
        },
        other => EngineError::DataFusion(other),
    }
}

/// Runs `future`, turning a panic inside it into `on_panic(message)`:
/// DataFusion's consumer and operators panic on some inputs our checks let
/// through (fuzzing found a field reference into an empty schema).
pub async fn without_panics<T>(
    future: impl std::future::Future<Output = std::result::Result<T, DataFusionError>>,
    on_panic: impl FnOnce(&str) -> EngineError,
) -> Result<std::result::Result<T, DataFusionError>> {
    use futures::FutureExt;
    std::panic::AssertUnwindSafe(future)
        .catch_unwind()
        .await
        .map_err(|panic| on_panic(&crate::panic_hook::describe(panic.as_ref())))
}
