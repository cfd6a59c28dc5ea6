//! Reading one file of a layout root: a JSON manifest, a Parquet footer's row
//! count, and the check that a name taken from a manifest stays inside the root.
//! Errors name the file.

use std::path::{Path, PathBuf};

use aisql_engine::data::parquet_read::{ParquetReadError, footer_rows};

use crate::error::{BenchError, Result};
use crate::layout::TableEntry;

pub(super) fn io(path: &Path, e: impl std::fmt::Display) -> BenchError {
    BenchError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

pub(super) fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let s =
        aisql_engine::data::input_file::read_to_string(path).map_err(|e| BenchError::Manifest {
            path: path.to_path_buf(),
            message: format!("cannot read: {e}"),
        })?;
    serde_json::from_str(&s).map_err(|e| BenchError::Manifest {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// Row count from a Parquet footer (errors name the file: truncated, not Parquet).
pub fn parquet_rows(path: &Path) -> Result<u64> {
    footer_rows(path).map_err(|e| parquet_error(path, e))
}

pub(super) fn parquet_error(path: &Path, e: ParquetReadError) -> BenchError {
    match e {
        ParquetReadError::Io(e) => io(path, e),
        ParquetReadError::Corrupt(message) => BenchError::Parquet {
            path: path.to_path_buf(),
            message,
        },
    }
}

/// A table's file name in its corpus folder (the manifest's `file`, else
/// `<table>.parquet`); `manifest` names the manifest in errors.
pub(super) fn table_file(table: &str, e: &TableEntry, manifest: &str) -> Result<String> {
    let bad = |message: String| BenchError::Manifest {
        path: PathBuf::from(manifest),
        message,
    };
    plain_name("table", table).map_err(bad)?;
    let file = e.file.clone().unwrap_or_else(|| format!("{table}.parquet"));
    plain_name(&format!("file of table {table}"), &file).map_err(bad)?;
    Ok(file)
}

/// Checks that a name read from a manifest (or given for one) is a single plain path
/// component, so that a folder cannot make aisql read or write outside its root:
/// not empty, not `.` or `..`, and without a slash, a backslash or a NUL.
pub fn plain_name(what: &str, name: &str) -> std::result::Result<(), String> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\\', '\0']) {
        return Err(format!(
            "{what} {name:?} is not a plain file or folder name (it would name a path outside the data root)"
        ));
    }
    Ok(())
}
