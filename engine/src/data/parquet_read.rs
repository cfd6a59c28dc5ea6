//! Reading Parquet files that nobody vetted (tables, label sets, a run folder's
//! outputs). The parquet crate panics on some corrupt files instead of returning
//! an error (fuzzing found six such places in its decoders and footer reader), so
//! every read of a file here runs under `catch_unwind`, and a panic becomes an
//! error naming the file like any other corruption. Its Thrift headers are
//! scanned first ([`crate::data::parquet_headers`]), and dictionaries checked, so that
//! no header or page can make the reader loop for hours or reserve gigabytes.
//! Only regular files are opened ([`crate::data::input_file`]).

use bytes::Bytes;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use datafusion::parquet::column::page::Page;
use datafusion::parquet::file::reader::{FileReader, SerializedFileReader};

/// Why a Parquet file could not be read.
#[derive(Debug)]
pub enum ParquetReadError {
    /// The file could not be opened.
    Io(std::io::Error),
    /// The file is not readable Parquet (the reader's message).
    Corrupt(String),
}

impl std::fmt::Display for ParquetReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParquetReadError::Io(e) => write!(f, "{e}"),
            ParquetReadError::Corrupt(m) => write!(f, "{m}"),
        }
    }
}

fn guarded<T>(read: impl FnOnce() -> Result<T, ParquetReadError>) -> Result<T, ParquetReadError> {
    catch_unwind(AssertUnwindSafe(read)).unwrap_or_else(|panic| {
        Err(ParquetReadError::Corrupt(format!(
            "corrupt Parquet data (the reader failed: {})",
            crate::panic_hook::describe(panic.as_ref())
        )))
    })
}

/// The schema and every row group of `path`, in batches of `batch_size` rows.
pub fn read_batches(
    path: &Path,
    batch_size: usize,
) -> Result<(SchemaRef, Vec<RecordBatch>), ParquetReadError> {
    // Read from memory, not the file: on a corrupt page header the reader's skip
    // over a file never ends (parquet 59.3.2; a fuzz regression input), over
    // bytes it stops at the end. The tables are held in memory anyway.
    let bytes = Bytes::from(crate::data::input_file::read(path).map_err(ParquetReadError::Io)?);
    let stream = batch_stream(bytes, batch_size, Strings::AsWritten)?;
    let schema = stream.schema();
    Ok((schema, stream.collect::<Result<Vec<_>, _>>()?))
}

/// The batches of a Parquet file, decoded one at a time as they are asked for
/// ([`stream_batches`]); a reader panic is an error like any other corruption.
pub struct BatchStream {
    schema: SchemaRef,
    reader: datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReader,
}

impl BatchStream {
    /// The file's schema.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
}

impl Iterator for BatchStream {
    type Item = Result<RecordBatch, ParquetReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        let reader = &mut self.reader;
        match guarded(|| Ok(reader.next())) {
            Ok(None) => None,
            Ok(Some(batch)) => Some(batch.map_err(|e| ParquetReadError::Corrupt(e.to_string()))),
            Err(e) => Some(Err(e)),
        }
    }
}

/// The batches of `path`, `batch_size` rows each, decoded as they are asked
/// for: a result file of billions of rows is read with one batch in memory.
/// The file is mapped, not read (its pages are the kernel's to drop), and its
/// headers and dictionaries are checked first as in [`read_batches`]. The file
/// must not be truncated while it is read.
pub fn stream_batches(path: &Path, batch_size: usize) -> Result<BatchStream, ParquetReadError> {
    batch_stream(map_file(path)?, batch_size, Strings::AsWritten)
}

/// One run of a file's row groups, read on its own ([`stream_dictionary_parts`]).
pub struct BatchPart {
    /// The index, in the whole file, of the part's first row.
    pub first_row: u64,
    /// The part's rows.
    pub batches: BatchStream,
}

/// The batches of `path` as [`stream_batches`] reads them, but with every
/// string column read as a dictionary (`Dictionary(Int32, Utf8)`: the keys of
/// its dictionary-encoded pages, the dictionary shared by the batches of a
/// column chunk), and split into at most `parts` runs of whole row groups with
/// about equal rows, to be read side by side. A reader that looks values up
/// does so once per dictionary value, not once per row (IMDB-9's 8.7 G result
/// rows at sf 1.0 repeat a few hundred thousand ids). The file is mapped and
/// checked once for all parts; there is always at least one part.
pub fn stream_dictionary_parts(
    path: &Path,
    batch_size: usize,
    parts: usize,
) -> Result<Vec<BatchPart>, ParquetReadError> {
    batch_parts(map_file(path)?, batch_size, Strings::AsDictionaries, parts)
}

/// `path` mapped into memory (its pages are the kernel's to drop).
fn map_file(path: &Path) -> Result<Bytes, ParquetReadError> {
    let file = crate::data::input_file::open(path).map_err(ParquetReadError::Io)?;
    // SAFETY: the mapping is read-only and lives inside the returned Bytes; a
    // file truncated by another process while mapped is the documented misuse.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(ParquetReadError::Io)?;
    Ok(Bytes::from_owner(map))
}

/// How a streamed reader hands out string columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Strings {
    AsWritten,
    AsDictionaries,
}

/// The checked, guarded reader of a Parquet file's `bytes`.
fn batch_stream(
    bytes: Bytes,
    batch_size: usize,
    strings: Strings,
) -> Result<BatchStream, ParquetReadError> {
    let mut parts = batch_parts(bytes, batch_size, strings, 1)?;
    Ok(parts.swap_remove(0).batches)
}

/// The checked, guarded readers of up to `parts` runs of the row groups of a
/// Parquet file's `bytes` (at least one).
fn batch_parts(
    bytes: Bytes,
    batch_size: usize,
    strings: Strings,
    parts: usize,
) -> Result<Vec<BatchPart>, ParquetReadError> {
    let corrupt = |e: &dyn std::fmt::Display| ParquetReadError::Corrupt(e.to_string());
    guarded(|| {
        check_dictionaries(&bytes)?;
        // The footer is parsed once; a dictionary schema only re-derives the
        // Arrow view of it.
        let mut metadata = ArrowReaderMetadata::load(&bytes, ArrowReaderOptions::new())
            .map_err(|e| corrupt(&e))?;
        if strings == Strings::AsDictionaries {
            let fields: Vec<Field> = metadata
                .schema()
                .fields()
                .iter()
                .map(|f| match f.data_type() {
                    DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8 => {
                        f.as_ref().clone().with_data_type(DataType::Dictionary(
                            Box::new(DataType::Int32),
                            Box::new(DataType::Utf8),
                        ))
                    }
                    _ => f.as_ref().clone(),
                })
                .collect();
            let options = ArrowReaderOptions::new().with_schema(Arc::new(Schema::new(fields)));
            metadata = ArrowReaderMetadata::try_new(metadata.metadata().clone(), options)
                .map_err(|e| corrupt(&e))?;
        }
        let group_rows = metadata
            .metadata()
            .row_groups()
            .iter()
            .map(|g| u64::try_from(g.num_rows()))
            .collect::<Result<Vec<u64>, _>>()
            .map_err(|_| corrupt(&"a row group records a negative row count"))?;
        split_row_groups(&group_rows, parts)
            .into_iter()
            .map(|(groups, first_row)| {
                let builder = ParquetRecordBatchReaderBuilder::new_with_metadata(
                    bytes.clone(),
                    metadata.clone(),
                );
                let schema = builder.schema().clone();
                let reader = builder
                    .with_row_groups(groups.collect())
                    .with_batch_size(batch_size.max(1))
                    .build()
                    .map_err(|e| corrupt(&e))?;
                Ok(BatchPart {
                    first_row,
                    batches: BatchStream { schema, reader },
                })
            })
            .collect()
    })
}

/// Splits row groups of `group_rows` rows into at most `parts` consecutive
/// runs of about equal rows, each with the index of its first row; at least
/// one run, even of no row groups.
fn split_row_groups(group_rows: &[u64], parts: usize) -> Vec<(std::ops::Range<usize>, u64)> {
    let parts = parts.clamp(1, group_rows.len().max(1)) as u128;
    let total: u128 = group_rows.iter().map(|&n| u128::from(n)).sum();
    let mut runs = Vec::new();
    let (mut start, mut first_row, mut rows) = (0, 0u64, 0u64);
    for (g, &n) in group_rows.iter().enumerate() {
        let cut = runs.len() as u128 + 1;
        // A group whose middle lies past the current run's share of the rows
        // starts the next run.
        if g > start
            && cut < parts
            && (2 * u128::from(rows) + u128::from(n)) * parts >= 2 * total * cut
        {
            runs.push((start..g, first_row));
            (start, first_row) = (g, rows);
        }
        rows += n;
    }
    runs.push((start..group_rows.len(), first_row));
    runs
}

/// Refuses dictionary pages that claim more values than they have bytes: the
/// decoder reserves offsets for the claimed count before reading any (a 2 KB file
/// from the fuzzer asked for 7 GB). Every dictionary value takes at least a byte.
/// Only page headers and dictionary pages are read; data pages are skipped.
fn check_dictionaries(bytes: &Bytes) -> Result<(), ParquetReadError> {
    let corrupt = |e: &dyn std::fmt::Display| ParquetReadError::Corrupt(e.to_string());
    crate::data::parquet_headers::check_footer(bytes).map_err(|e| corrupt(&e))?;
    let reader = SerializedFileReader::new(bytes.clone()).map_err(|e| corrupt(&e))?;
    for g in 0..reader.num_row_groups() {
        let group = reader.get_row_group(g).map_err(|e| corrupt(&e))?;
        for c in 0..group.num_columns() {
            let chunk = group.metadata().column(c);
            let (start, len) = chunk.byte_range();
            crate::data::parquet_headers::check_pages(bytes, start, len)
                .map_err(|e| corrupt(&format!("row group {g}, column {c}: {e}")))?;
            let mut pages = group.get_column_page_reader(c).map_err(|e| corrupt(&e))?;
            while let Some(meta) = pages.peek_next_page().map_err(|e| corrupt(&e))? {
                if !meta.is_dict {
                    pages.skip_next_page().map_err(|e| corrupt(&e))?;
                    continue;
                }
                if let Some(Page::DictionaryPage {
                    buf, num_values, ..
                }) = pages.get_next_page().map_err(|e| corrupt(&e))?
                    && num_values as usize > buf.len()
                {
                    return Err(ParquetReadError::Corrupt(format!(
                        "row group {g}, column {c}: a dictionary page claims {num_values} values \
                         in {} bytes",
                        buf.len()
                    )));
                }
            }
        }
    }
    Ok(())
}

/// The row count recorded in `path`'s footer. Only the footer is read: this runs
/// for every table each time a dataset is opened.
pub fn footer_rows(path: &Path) -> Result<u64, ParquetReadError> {
    let tail = footer_tail(path).map_err(ParquetReadError::Io)?;
    let file = File::open(path).map_err(ParquetReadError::Io)?;
    guarded(|| {
        crate::data::parquet_headers::check_footer(&tail).map_err(ParquetReadError::Corrupt)?;
        let reader = SerializedFileReader::new(file)
            .map_err(|e| ParquetReadError::Corrupt(e.to_string()))?;
        let rows = reader.metadata().file_metadata().num_rows();
        u64::try_from(rows)
            .map_err(|_| ParquetReadError::Corrupt(format!("the footer records {rows} rows")))
    })
}

/// The footer of `path` with its 8-byte trailer (length and magic), as far as the
/// file holds them: what [`crate::data::parquet_headers::check_footer`] scans.
fn footer_tail(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut file = crate::data::input_file::open(path)?;
    let size = file.metadata()?.len();
    let read_last = |file: &mut File, n: u64| -> std::io::Result<Vec<u8>> {
        let n = n.min(size);
        file.seek(SeekFrom::Start(size - n))?;
        let mut buf = vec![0; n as usize];
        file.read_exact(&mut buf)?;
        Ok(buf)
    };
    let trailer = read_last(&mut file, 8)?;
    if trailer.len() < 8 {
        return Ok(trailer);
    }
    let len = u32::from_le_bytes(trailer[..4].try_into().expect("4 bytes"));
    read_last(&mut file, u64::from(len) + 8)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file found by the parquet fuzz target: the reader panics on it
    /// (`assertion failed: num_bits <= size_of::<T>() * 8` in parquet 59.3.2).
    #[test]
    fn a_file_the_reader_panics_on_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut any = false;
        let cases = std::fs::read_dir(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../fuzz/regressions/parquet"
        ))
        .unwrap();
        for case in cases {
            let case = case.unwrap().path();
            let path = dir.path().join("t.parquet");
            std::fs::copy(&case, &path).unwrap();
            match read_batches(&path, 1024) {
                Err(ParquetReadError::Corrupt(_)) => {}
                other => panic!("{}: {other:?}", case.display()),
            }
            let plain = stream_batches(&path, 1024)
                .and_then(|s| s.collect::<Result<Vec<_>, _>>().map(|_| ()));
            let parts = stream_dictionary_parts(&path, 1024, 2).and_then(|parts| {
                parts
                    .into_iter()
                    .flat_map(|p| p.batches)
                    .collect::<Result<Vec<_>, _>>()
                    .map(|_| ())
            });
            for streamed in [plain, parts] {
                assert!(
                    matches!(streamed, Err(ParquetReadError::Corrupt(_))),
                    "{}: streamed {streamed:?}",
                    case.display()
                );
            }
            let _ = footer_rows(&path);
            any = true;
        }
        assert!(any, "the regression inputs are in fuzz/regressions/parquet");
    }

    #[test]
    fn row_groups_split_into_runs_of_about_equal_rows() {
        let runs = |rows: &[u64], parts| {
            split_row_groups(rows, parts)
                .into_iter()
                .map(|(r, first)| (r.start, r.end, first))
                .collect::<Vec<_>>()
        };
        assert_eq!(runs(&[10, 10, 10, 10], 2), [(0, 2, 0), (2, 4, 20)]);
        assert_eq!(runs(&[10, 10, 10, 10], 1), [(0, 4, 0)]);
        // More parts than row groups: one run per group.
        assert_eq!(runs(&[5, 7], 8), [(0, 1, 0), (1, 2, 5)]);
        // Uneven groups: the cut follows the rows, not the group count.
        assert_eq!(runs(&[30, 5, 5, 5, 5], 2), [(0, 1, 0), (1, 5, 30)]);
        assert_eq!(runs(&[5, 5, 5, 5, 30], 2), [(0, 4, 0), (4, 5, 20)]);
        assert_eq!(runs(&[100, 1, 1], 3), [(0, 1, 0), (1, 2, 100), (2, 3, 101)]);
        // No row groups, or no parts asked: still one (empty) run.
        assert_eq!(runs(&[], 4), [(0, 0, 0)]);
        assert_eq!(runs(&[3], 0), [(0, 1, 0)]);
    }

    #[test]
    fn a_file_read_in_parts_gives_every_row_once_with_its_index() {
        use datafusion::arrow::array::{Int64Array, StringArray};
        use datafusion::parquet::arrow::ArrowWriter;
        use datafusion::parquet::file::properties::WriterProperties;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let schema = Arc::new(Schema::new(vec![
            Field::new("n", DataType::Int64, false),
            Field::new("s", DataType::Utf8, false),
        ]));
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(7))
            .build();
        let mut writer =
            ArrowWriter::try_new(File::create(&path).unwrap(), schema.clone(), Some(props))
                .unwrap();
        let n: Vec<i64> = (0..50).collect();
        let s: Vec<String> = n.iter().map(|i| format!("v{}", i % 3)).collect();
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(n)),
                Arc::new(StringArray::from(s)),
            ],
        )
        .unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        for asked in [1, 2, 3, 100] {
            let parts = stream_dictionary_parts(&path, 4, asked).unwrap();
            assert!(!parts.is_empty() && parts.len() <= asked.max(1));
            let mut next = 0i64;
            for part in parts {
                assert_eq!(part.first_row, next as u64, "{asked} parts");
                for batch in part.batches {
                    let batch = batch.unwrap();
                    assert!(matches!(
                        batch.column(1).data_type(),
                        DataType::Dictionary(..)
                    ));
                    let n = batch
                        .column(0)
                        .as_any()
                        .downcast_ref::<Int64Array>()
                        .unwrap();
                    for v in n.values() {
                        assert_eq!(*v, next);
                        next += 1;
                    }
                }
            }
            assert_eq!(next, 50, "{asked} parts");
        }
    }
}
