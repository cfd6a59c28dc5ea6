//! Errors of the QUAIL-B crate. Every variant names the table, predicate or path
//! involved, and the counts where counts disagree.

use std::path::PathBuf;

/// Result with [`BenchError`].
pub type Result<T, E = BenchError> = std::result::Result<T, E>;

/// What can go wrong reading, generating or fetching QUAIL-B data.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A file could not be read or written.
    #[error("{}: {message}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// What failed.
        message: String,
    },
    /// A Parquet file is unreadable (truncated, not Parquet, wrong columns).
    #[error("parquet file {}: {message}", path.display())]
    Parquet {
        /// The file.
        path: PathBuf,
        /// What failed.
        message: String,
    },
    /// A manifest is missing, unparsable or inconsistent.
    #[error("manifest {}: {message}", path.display())]
    Manifest {
        /// The manifest.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A table named by the corpus manifest (or required by QUAIL-B) has no file.
    #[error("table {table}: file {} is missing", path.display())]
    MissingTable {
        /// Table name.
        table: String,
        /// Expected file.
        path: PathBuf,
    },
    /// A table's row count differs from its manifest.
    #[error("table {table}: manifest says {expected} rows, {} has {found}", path.display())]
    RowCount {
        /// Table name.
        table: String,
        /// The Parquet file.
        path: PathBuf,
        /// Rows in the manifest.
        expected: u64,
        /// Rows in the file.
        found: u64,
    },
    /// A label set's row count differs from its manifest.
    #[error(
        "predicate {predicate} (label set {label_set_id}): manifest says {expected} labels, files hold {found}"
    )]
    LabelCount {
        /// Predicate key.
        predicate: String,
        /// Label-set id.
        label_set_id: String,
        /// Rows in the manifest.
        expected: u64,
        /// Rows found.
        found: u64,
    },
    /// A label row is invalid (wrong key or id, duplicate pair, unknown label, null id).
    #[error("predicate {predicate}: {message}")]
    Labels {
        /// Predicate key.
        predicate: String,
        /// What is wrong.
        message: String,
    },
    /// No corpus with the requested scale factor under a root.
    #[error("no QUAIL-B corpus with scale factor {sf} under {} (found: {available})", root.display())]
    NoCorpus {
        /// Layout root searched.
        root: PathBuf,
        /// Requested scale factor.
        sf: f64,
        /// Scale factors (and ids) found there.
        available: String,
    },
    /// No usable collection (missing, incomplete, ambiguous, other corpus).
    #[error("collection: {0}")]
    Collection(String),
    /// A scale factor the operation does not support.
    #[error("scale factor: {0}")]
    ScaleFactor(String),
    /// A file's hash differs from its manifest.
    #[error("{}: sha256 {found} differs from the manifest's {expected}", path.display())]
    Hash {
        /// The file.
        path: PathBuf,
        /// Hash in the manifest.
        expected: String,
        /// Hash of the file.
        found: String,
    },
    /// Downloading from the object store failed.
    #[error("fetch {path}: {message}")]
    Fetch {
        /// Object path (relative to the layout root).
        path: String,
        /// What failed.
        message: String,
    },
    /// The QUAIL-B plans (embedded, or a `--plans` folder) are missing a file or
    /// hold one that does not parse.
    #[error("QUAIL-B plans ({source_name}): {message}")]
    Plans {
        /// Where the plans come from (`embedded`, or the folder).
        source_name: String,
        /// What is wrong.
        message: String,
    },
    /// A plan argument is neither a readable file nor a query id of the catalog.
    #[error("plan {arg:?}: {message}")]
    PlanArg {
        /// The argument as given.
        arg: String,
        /// Why it could not be used.
        message: String,
    },
    /// A run folder or its run.json cannot be used (missing, another corpus,
    /// another schema, a plan that changed).
    #[error("run {}: {message}", dir.display())]
    Run {
        /// The run folder.
        dir: std::path::PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The plan is valid Substrait but not of QUAIL-B's shape (SPEC §A): it
    /// may still run as a general query, without answer tables and scoring.
    #[error("not a QUAIL-B plan: {0}")]
    NotQuailb(String),
    /// A saved query could not be scored (a missing label or answer table, an
    /// unreadable output).
    #[error("scoring: {0}")]
    Scoring(String),
    /// Token counting for the token metrics failed.
    #[error("token metrics: {0}")]
    Tokens(String),
    /// The tokenizer failed.
    #[error(transparent)]
    Model(#[from] aisql_models::ModelError),
    /// Arrow could not build or convert a batch (reports, measurements).
    #[error("arrow: {0}")]
    Arrow(#[from] datafusion::arrow::error::ArrowError),
    /// A blocking task (writing outputs, scoring) panicked or was cancelled.
    #[error("background task: {0}")]
    Task(String),
    /// The stand-in generator failed.
    #[error("stand-in generation: {0}")]
    Generate(String),
    /// A table a query needs has no entry in the corpus manifest.
    #[error("table {table} is not in the corpus manifest {}", path.display())]
    TableNotInManifest {
        /// Table name.
        table: String,
        /// The corpus manifest.
        path: PathBuf,
    },
    /// An engine error (plans, data, inference).
    #[error(transparent)]
    Engine(aisql_engine::EngineError),
}

/// An engine error, or this crate's own that travelled through the engine (the
/// QUAIL-B consumer's, raised inside DataFusion's planning), taken back out.
impl From<aisql_engine::EngineError> for BenchError {
    fn from(e: aisql_engine::EngineError) -> Self {
        match e {
            aisql_engine::EngineError::DataFusion(e) => carried(e)
                .unwrap_or_else(|e| BenchError::Engine(aisql_engine::EngineError::DataFusion(e))),
            other => BenchError::Engine(other),
        }
    }
}

/// The `BenchError` inside a DataFusion error, under any contexts DataFusion
/// added (they say nothing the error does not); the error as it was otherwise.
fn carried(
    e: datafusion::error::DataFusionError,
) -> std::result::Result<BenchError, datafusion::error::DataFusionError> {
    use datafusion::error::DataFusionError;
    match e {
        DataFusionError::External(inner) => inner
            .downcast::<BenchError>()
            .map(|bench| *bench)
            .map_err(DataFusionError::External),
        DataFusionError::Context(context, inner) => {
            carried(*inner).map_err(|inner| DataFusionError::Context(context, Box::new(inner)))
        }
        other => Err(other),
    }
}

/// The generator's errors, under the variants of the same text they had when it
/// was part of this crate.
impl From<aisql_standin::StandinError> for BenchError {
    fn from(e: aisql_standin::StandinError) -> Self {
        use aisql_standin::StandinError as S;
        match e {
            S::Io { path, message } => BenchError::Io { path, message },
            S::ScaleFactor(m) => BenchError::ScaleFactor(m),
            S::Generate(m) => BenchError::Generate(m),
            S::Engine(e) => BenchError::Engine(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aisql_engine::EngineError;
    use datafusion::error::DataFusionError;

    #[test]
    fn a_bench_error_comes_back_out_of_the_engine_under_any_context() {
        let through = |e: DataFusionError| BenchError::from(EngineError::DataFusion(e));
        let raised = || DataFusionError::External(Box::new(BenchError::NotQuailb("m".into())));
        assert!(matches!(through(raised()), BenchError::NotQuailb(m) if m == "m"));
        let wrapped = DataFusionError::Context(
            "outer".into(),
            Box::new(DataFusionError::Context("inner".into(), Box::new(raised()))),
        );
        assert!(matches!(through(wrapped), BenchError::NotQuailb(m) if m == "m"));
        // Anyone else's error stays the engine's, its contexts kept.
        let other = DataFusionError::Context(
            "ctx".into(),
            Box::new(DataFusionError::External("io".into())),
        );
        match through(other) {
            BenchError::Engine(EngineError::DataFusion(DataFusionError::Context(c, inner))) => {
                assert_eq!(c, "ctx");
                assert!(matches!(*inner, DataFusionError::External(_)));
            }
            e => panic!("not the engine's: {e:?}"),
        }
    }
}
