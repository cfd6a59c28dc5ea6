//! A result's rows reduced to a count and a hash that does not depend on their
//! order: what is kept of a result whose Parquet file would not fit the disk
//! ([`crate::data::row_sink::ParquetRows`]), and the one definition of a row's hash
//! (the benchmark's scorer finds repeated rows with it).
//!
//! A row's hash is XXH3-128 of its values in column order, each written as its
//! byte length (u64, little-endian) and its UTF-8 text, a null as the length
//! `u64::MAX` alone; a value that is not text is first cast to text by arrow
//! (`42`, `true`, `2024-01-31`). The rows' hash is the sum of their hashes
//! modulo 2^128: equal for two results with the same rows, each as often,
//! whatever their order — the hash of the sorted rows, without sorting
//! billions of them.

use datafusion::arrow::array::{Array, ArrayRef, LargeStringArray, StringArray, StringViewArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::record_batch::RecordBatch;

use crate::error::{EngineError, Result};

/// XXH3-128 of a row of text values (none null) in the encoding above; `buf`
/// is scratch space.
pub fn row_hash(values: &[&str], buf: &mut Vec<u8>) -> u128 {
    buf.clear();
    for v in values {
        push_value(buf, Some(v));
    }
    twox_hash::XxHash3_128::oneshot(buf)
}

fn push_value(buf: &mut Vec<u8>, value: Option<&str>) {
    match value {
        Some(v) => {
            buf.extend_from_slice(&(v.len() as u64).to_le_bytes());
            buf.extend_from_slice(v.as_bytes());
        }
        None => buf.extend_from_slice(&u64::MAX.to_le_bytes()),
    }
}

/// The count and order-free hash of the rows seen so far.
#[derive(Debug, Clone, Default)]
pub struct RowsDigest {
    rows: u64,
    sum: u128,
    scratch: Vec<u8>,
}

impl RowsDigest {
    /// Adds every row of `batch`.
    pub fn add_batch(&mut self, batch: &RecordBatch) -> Result<()> {
        let columns = batch
            .columns()
            .iter()
            .map(as_text)
            .collect::<Result<Vec<_>>>()?;
        let columns: Vec<TextValues<'_>> = columns.iter().map(TextValues::of).collect();
        for row in 0..batch.num_rows() {
            self.scratch.clear();
            for c in &columns {
                push_value(&mut self.scratch, c.value(row));
            }
            let hash = twox_hash::XxHash3_128::oneshot(&self.scratch);
            self.sum = self.sum.wrapping_add(hash);
        }
        self.rows += batch.num_rows() as u64;
        Ok(())
    }

    /// Rows added.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// The rows' hash, 32 hex digits.
    pub fn hash_hex(&self) -> String {
        format!("{:032x}", self.sum)
    }
}

/// What is kept of a result whose file would not fit the disk: written as
/// JSON next to where the file would have been ([`crate::data::files::summary_path`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RowsSummary {
    /// Why this file is here, for a reader who expected the rows.
    pub note: String,
    /// Rows of the result.
    pub rows: u64,
    /// Their order-free hash, 32 hex digits.
    pub rows_hash: String,
    /// How the hash is made.
    pub hash: String,
    /// The result's columns, in the order each row was hashed.
    pub columns: Vec<String>,
    /// Rows written before the disk ran low (the file was then removed).
    pub rows_before_disk_ran_low: u64,
    /// Free bytes on the disk at that moment.
    pub free_bytes: u64,
    /// The free bytes the file had to leave.
    pub reserve_bytes: u64,
}

/// [`RowsSummary::hash`]: this module's row hash, summed.
pub const ROWS_HASH: &str = "xxh3-128-sum-v1: the sum modulo 2^128 of each row's XXH3-128 over its values in column order, each as its byte length (u64 little-endian) and UTF-8 text, a null as the length 2^64-1 alone";

impl RowsSummary {
    /// The summary of `digest`, the rows of the file `path` would have been.
    pub fn new(
        path: &std::path::Path,
        schema: &datafusion::arrow::datatypes::Schema,
        digest: &RowsDigest,
        rows_before_disk_ran_low: u64,
        free_bytes: u64,
        reserve_bytes: u64,
    ) -> Self {
        Self {
            note: format!(
                "{} was not kept: after {rows_before_disk_ran_low} rows its disk had {free_bytes} bytes free, under the {reserve_bytes} bytes it must leave; this is the count and hash of all {} rows",
                path.display(),
                digest.rows()
            ),
            rows: digest.rows(),
            rows_hash: digest.hash_hex(),
            hash: ROWS_HASH.to_string(),
            columns: schema.fields().iter().map(|f| f.name().clone()).collect(),
            rows_before_disk_ran_low,
            free_bytes,
            reserve_bytes,
        }
    }
}

/// A column as text: string columns as they are, any other type cast by arrow.
fn as_text(column: &ArrayRef) -> Result<ArrayRef> {
    match column.data_type() {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => Ok(column.clone()),
        other => cast(column, &DataType::Utf8).map_err(|e| {
            EngineError::Data(format!(
                "a result column of type {other} cannot be hashed: {e}"
            ))
        }),
    }
}

/// The values of a text column, whichever of arrow's string layouts it has.
enum TextValues<'a> {
    Utf8(&'a StringArray),
    Large(&'a LargeStringArray),
    View(&'a StringViewArray),
}

impl<'a> TextValues<'a> {
    fn of(column: &'a ArrayRef) -> Self {
        let any = column.as_any();
        if let Some(a) = any.downcast_ref::<StringArray>() {
            TextValues::Utf8(a)
        } else if let Some(a) = any.downcast_ref::<LargeStringArray>() {
            TextValues::Large(a)
        } else {
            TextValues::View(
                any.downcast_ref::<StringViewArray>()
                    .expect("as_text returns a string column"),
            )
        }
    }

    fn value(&self, row: usize) -> Option<&'a str> {
        match self {
            TextValues::Utf8(a) => a.is_valid(row).then(|| a.value(row)),
            TextValues::Large(a) => a.is_valid(row).then(|| a.value(row)),
            TextValues::View(a) => a.is_valid(row).then(|| a.value(row)),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{Field, Schema};
    use std::sync::Arc;

    fn batch(ids: &[Option<&str>], counts: &[i64]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, true),
            Field::new("n", DataType::Int64, false),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(ids.to_vec())),
                Arc::new(Int64Array::from(counts.to_vec())),
            ],
        )
        .unwrap()
    }

    /// The digest of `batches` (also used by the row sink's tests).
    pub(crate) fn digest(batches: &[RecordBatch]) -> RowsDigest {
        let mut d = RowsDigest::default();
        for b in batches {
            d.add_batch(b).unwrap();
        }
        d
    }

    #[test]
    fn the_hash_ignores_row_order_and_batching() {
        let a = digest(&[batch(&[Some("x"), Some("y"), None], &[1, 2, 3])]);
        let b = digest(&[
            batch(&[None], &[3]),
            batch(&[Some("y"), Some("x")], &[2, 1]),
        ]);
        assert_eq!((a.rows(), a.hash_hex()), (b.rows(), b.hash_hex()));
        assert_eq!(a.hash_hex().len(), 32);
    }

    #[test]
    fn the_hash_tells_apart_other_rows_repeats_and_shifted_values() {
        let base = digest(&[batch(&[Some("ab"), Some("c")], &[1, 1])]).hash_hex();
        for other in [
            batch(&[Some("ab"), Some("c")], &[1, 2]),
            batch(&[Some("a"), Some("bc")], &[1, 1]),
            batch(&[Some("ab"), None], &[1, 1]),
            batch(&[Some("ab"), Some("")], &[1, 1]),
        ] {
            assert_ne!(digest(&[other]).hash_hex(), base);
        }
        // A row twice is not the row once.
        let twice = digest(&[batch(&[Some("ab"), Some("c"), Some("c")], &[1, 1, 1])]);
        assert_ne!(twice.hash_hex(), base);
    }

    #[test]
    fn a_text_row_hashes_as_row_hash_does() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Utf8, false),
            Field::new("b", DataType::Utf8View, false),
        ]));
        let b = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(vec!["r1"])),
                Arc::new(StringViewArray::from(vec!["POSITIVE"])),
            ],
        )
        .unwrap();
        let mut buf = Vec::new();
        let one = row_hash(&["r1", "POSITIVE"], &mut buf);
        assert_eq!(digest(&[b]).hash_hex(), format!("{one:032x}"));
    }
}
