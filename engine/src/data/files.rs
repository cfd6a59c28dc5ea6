//! Output files written whole or not at all: every file aisql writes goes to a
//! temporary name beside it ([`temp_path`]) and appears by one rename
//! ([`publish`]), so a reader, or a crash mid-write, never sees half a file.
//! Parquet outputs are zstd level 3 ([`parquet_properties`]).

use std::fs::File;
use std::path::{Path, PathBuf};

use datafusion::arrow::array::RecordBatch;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::basic::{Compression, ZstdLevel};
use datafusion::parquet::file::properties::WriterProperties;

use crate::error::{EngineError, Result};

/// The temporary name an output file is written under before its rename:
/// `.<name>.tmp` in the same folder (so the rename never crosses file systems).
pub fn temp_path(path: &Path) -> PathBuf {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    path.with_file_name(format!(".{name}.tmp"))
}

/// True for a name [`temp_path`] gives: what an interrupted atomic write leaves.
pub fn is_temp_name(name: &str) -> bool {
    name.starts_with('.') && name.ends_with(".tmp")
}

/// Refuses the output file `path` (`flag` names it: `--output`) when the folder
/// it would go in does not exist or is not a folder. Checked before any work:
/// the write itself would fail only at the end.
pub fn check_output_folder(path: &Path, flag: &str) -> Result<()> {
    match folder_problem(path) {
        Some(message) => Err(EngineError::Output {
            what: format!("{flag} {}", path.display()),
            message,
        }),
        None => Ok(()),
    }
}

/// Why the folder of the output file `path` cannot take it, if it cannot.
fn folder_problem(path: &Path) -> Option<String> {
    let folder = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    match std::fs::metadata(folder) {
        Ok(meta) if meta.is_dir() => None,
        Ok(_) => Some(format!("{} is not a folder", folder.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Some(format!("folder {} does not exist", folder.display()))
        }
        Err(e) => Some(format!("folder {}: {e}", folder.display())),
    }
}

/// The error of creating `tmp`, the temporary file of output `path`: the
/// missing folder when that is why, naming the user's path, not the temporary
/// name; else the error on `tmp`.
pub fn temp_error(path: &Path, tmp: &Path, e: std::io::Error) -> EngineError {
    match folder_problem(path) {
        Some(message) => EngineError::Output {
            what: path.display().to_string(),
            message,
        },
        None => EngineError::io(tmp, e),
    }
}

/// Writes `bytes` to `path` through [`temp_path`] and a rename, so a reader, or a
/// crash mid-write, never sees a half-written file.
pub fn write_file_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = temp_path(path);
    std::fs::write(&tmp, bytes).map_err(|e| temp_error(path, &tmp, e))?;
    publish(&tmp, path)
}

/// Fault injection for crash tests: milliseconds to wait between writing a
/// temporary file and renaming it into place, so that a test can kill aisql while
/// an output file is half-done. Unset in normal use.
pub const SLOW_PUBLISH_ENV: &str = "AISQL_FAULT_SLOW_PUBLISH_MS";

/// Renames the finished temporary file `tmp` to `path`: the one step that makes
/// an output file appear, whole.
pub fn publish(tmp: &Path, path: &Path) -> Result<()> {
    if let Some(ms) = std::env::var(SLOW_PUBLISH_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
    {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    std::fs::rename(tmp, path).map_err(|e| EngineError::io(path, e))
}

/// How every output Parquet file is written: zstd level 3.
pub fn parquet_properties() -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::ZSTD(
            ZstdLevel::try_new(3).expect("valid zstd level"),
        ))
        .build()
}

/// Writes `batch` as a zstd Parquet file, atomically (temp file then rename).
pub fn write_parquet(path: &Path, batch: &RecordBatch) -> Result<()> {
    let tmp = temp_path(path);
    let file = File::create(&tmp).map_err(|e| temp_error(path, &tmp, e))?;
    let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(parquet_properties()))
        .map_err(|e| EngineError::Data(format!("{}: {e}", path.display())))?;
    writer
        .write(batch)
        .and_then(|_| writer.close().map(|_| ()))
        .map_err(|e| EngineError::Data(format!("{}: {e}", path.display())))?;
    publish(&tmp, path)
}

/// Where the summary of a result file goes when the file would not fit the
/// disk: `rows.parquet` -> `rows.summary.json`.
pub fn summary_path(rows_path: &Path) -> PathBuf {
    rows_path.with_extension("summary.json")
}

/// Reads a Parquet file written by [`write_parquet`] (or the harness) back.
pub fn read_parquet(path: &Path) -> Result<RecordBatch> {
    use crate::data::parquet_read::{ParquetReadError, read_batches};
    let (schema, batches) = read_batches(path, 8192).map_err(|e| match e {
        ParquetReadError::Io(e) => EngineError::io(path, e),
        ParquetReadError::Corrupt(e) => EngineError::Data(format!("{}: {e}", path.display())),
    })?;
    Ok(datafusion::arrow::compute::concat_batches(
        &schema, &batches,
    )?)
}
