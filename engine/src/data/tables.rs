//! Input tables: Parquet files read into memory and registered with DataFusion.
//!
//! QUAIL-B plans declare every column `NULLABILITY_REQUIRED`, while Parquet
//! written by pyarrow declares them nullable, and DataFusion's Substrait consumer
//! rejects that mismatch. So every table is checked for nulls in the columns a
//! plan reads (a null is a data error naming table, column and row) and then
//! presented with non-nullable fields. String columns are normalised to `Utf8`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Schema};

use crate::data::parquet_read::{ParquetReadError, read_batches};
use crate::error::{EngineError, Result};

/// Reads one Parquet table, requiring `columns` to exist, be strings and hold no
/// nulls, and the table to have rows. `text_columns` are served as `Utf8View`
/// (joins then copy views, not document texts), the other strings as `Utf8`.
pub fn read_table(
    table: &str,
    path: &Path,
    columns: &[String],
    text_columns: &[String],
) -> Result<RecordBatch> {
    let (schema, batches) = read_batches(path, 8192).map_err(|e| match e {
        ParquetReadError::Io(e) => EngineError::Data(format!(
            "table {table}: cannot open {}: {e}",
            path.display()
        )),
        ParquetReadError::Corrupt(e) => EngineError::Data(format!(
            "table {table}: {} is not a readable Parquet file: {e}",
            path.display()
        )),
    })?;
    for c in columns {
        if schema.field_with_name(c).is_err() {
            return Err(EngineError::Data(format!(
                "table {table} ({}) has no column {c:?}; it has {:?}",
                path.display(),
                schema.fields().iter().map(|f| f.name()).collect::<Vec<_>>()
            )));
        }
    }
    let batch = datafusion::arrow::compute::concat_batches(&schema, &batches)?;
    if batch.num_rows() == 0 {
        return Err(EngineError::Data(format!(
            "table {table} ({}) is empty",
            path.display()
        )));
    }
    // Plans key documents by id (QUAIL-B's rule): ids of any string type repeat nowhere.
    if let Some(ids) = batch.column_by_name("id")
        && matches!(
            ids.data_type(),
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
        )
    {
        let ids = cast(ids, &DataType::Utf8)?;
        let ids = ids.as_string::<i32>();
        let mut seen = std::collections::HashSet::with_capacity(ids.len());
        for (row, id) in ids.iter().enumerate() {
            if let Some(id) = id
                && !seen.insert(id)
            {
                return Err(EngineError::Data(format!(
                    "table {table} ({}): id {id:?} repeats in row {row}; ids must be unique",
                    path.display()
                )));
            }
        }
    }
    let mut fields = Vec::with_capacity(schema.fields().len());
    let mut arrays = Vec::with_capacity(schema.fields().len());
    for (field, array) in schema.fields().iter().zip(batch.columns()) {
        let needed = columns.iter().any(|c| c == field.name());
        let (field, array) = match field.data_type() {
            DataType::LargeUtf8 | DataType::Utf8View if needed => (
                Field::new(field.name(), DataType::Utf8, field.is_nullable()),
                cast(array, &DataType::Utf8)?,
            ),
            _ => (field.as_ref().clone(), array.clone()),
        };
        let (field, array) = if text_columns.iter().any(|c| c == field.name())
            && field.data_type() == &DataType::Utf8
        {
            (
                Field::new(field.name(), DataType::Utf8View, field.is_nullable()),
                cast(&array, &DataType::Utf8View)?,
            )
        } else {
            (field, array)
        };
        if needed {
            if !matches!(field.data_type(), DataType::Utf8 | DataType::Utf8View) {
                return Err(EngineError::Data(format!(
                    "table {table}: column {} is {} (expected a string)",
                    field.name(),
                    field.data_type()
                )));
            }
            if array.null_count() > 0 {
                let row = (0..array.len()).find(|&i| array.is_null(i)).unwrap_or(0);
                return Err(EngineError::Data(format!(
                    "table {table}: column {} is null in row {row} ({})",
                    field.name(),
                    path.display()
                )));
            }
        }
        let nullable = field.is_nullable() && array.null_count() > 0;
        fields.push(field.with_nullable(nullable));
        arrays.push(array);
    }
    Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)?)
}

/// Where each physical table's Parquet file is.
pub type TablePaths = BTreeMap<String, PathBuf>;

/// The tables in a folder of `<table>.parquet` files.
pub fn tables_in_dir(dir: &Path) -> Result<TablePaths> {
    let entries = std::fs::read_dir(dir).map_err(|e| EngineError::io(dir, e))?;
    let mut out = TablePaths::new();
    for entry in entries {
        let path = entry.map_err(|e| EngineError::io(dir, e))?.path();
        if path.extension().is_some_and(|e| e == "parquet")
            && let Some(stem) = path.file_stem().and_then(|s| s.to_str())
        {
            out.insert(stem.to_string(), path);
        }
    }
    Ok(out)
}

/// Bytes of document text per batch for a backend caching `kv_capacity_tokens`
/// positions of KV (none: unbounded). A batch should take about an eighth of the
/// KV cache (half a byte of text per cached position is an eighth at ~4 bytes per
/// token), so the documents of the batches in flight stay cached for chained
/// operators.
pub fn batch_text_bytes(kv_capacity_tokens: Option<usize>) -> usize {
    kv_capacity_tokens.map_or(usize::MAX, |tokens| tokens / 2)
}

/// `batch` cut into the batches AI operators stream: at most `batch_rows` rows
/// and about `batch_text_bytes` bytes of `text_columns` each (a batch holds at
/// least one row).
pub fn ai_batches(
    batch: &RecordBatch,
    text_columns: &[String],
    batch_rows: usize,
    batch_text_bytes: usize,
) -> Vec<RecordBatch> {
    let text_len = |row: usize| -> usize {
        text_columns
            .iter()
            .filter_map(|c| batch.column_by_name(c))
            .map(|a| match a.data_type() {
                DataType::Utf8View => a.as_string_view().value(row).len(),
                DataType::Utf8 => a.as_string::<i32>().value(row).len(),
                _ => 0,
            })
            .sum()
    };
    let mut slices: Vec<RecordBatch> = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for row in 0..batch.num_rows() {
        let len = text_len(row);
        if row > start && (row - start >= batch_rows.max(1) || bytes + len > batch_text_bytes) {
            slices.push(batch.slice(start, row - start));
            (start, bytes) = (row, 0);
        }
        bytes += len;
    }
    slices.push(batch.slice(start, batch.num_rows() - start));
    slices
}
