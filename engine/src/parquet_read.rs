//! Reading Parquet files that nobody vetted (tables, label sets, a run folder's
//! outputs). The parquet crate panics on some corrupt files instead of returning
//! an error (fuzzing found six such places in its decoders and footer reader), so
//! every read of a file here runs under `catch_unwind`, and a panic becomes an
//! error naming the file like any other corruption. Its Thrift headers are
//! scanned first ([`crate::parquet_headers`]), and dictionaries checked, so that
//! no header or page can make the reader loop for hours or reserve gigabytes.

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
            crate::error::panic_message(panic.as_ref())
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
    let bytes = Bytes::from(std::fs::read(path).map_err(ParquetReadError::Io)?);
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

/// As [`stream_batches`], with every string column read as a dictionary
/// (`Dictionary(Int32, Utf8)`): the keys of its dictionary-encoded pages, the
/// dictionary shared by the batches of a column chunk. A reader that looks
/// values up does so once per dictionary value, not once per row (IMDB-9's
/// 8.7 G result rows at sf 1.0 repeat a few hundred thousand ids).
pub fn stream_dictionary_batches(
    path: &Path,
    batch_size: usize,
) -> Result<BatchStream, ParquetReadError> {
    batch_stream(map_file(path)?, batch_size, Strings::AsDictionaries)
}

/// `path` mapped into memory (its pages are the kernel's to drop).
fn map_file(path: &Path) -> Result<Bytes, ParquetReadError> {
    let file = File::open(path).map_err(ParquetReadError::Io)?;
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
        let builder = ParquetRecordBatchReaderBuilder::new_with_metadata(bytes, metadata);
        let schema = builder.schema().clone();
        let reader = builder
            .with_batch_size(batch_size.max(1))
            .build()
            .map_err(|e| corrupt(&e))?;
        Ok(BatchStream { schema, reader })
    })
}

/// Refuses dictionary pages that claim more values than they have bytes: the
/// decoder reserves offsets for the claimed count before reading any (a 2 KB file
/// from the fuzzer asked for 7 GB). Every dictionary value takes at least a byte.
/// Only page headers and dictionary pages are read; data pages are skipped.
fn check_dictionaries(bytes: &Bytes) -> Result<(), ParquetReadError> {
    let corrupt = |e: &dyn std::fmt::Display| ParquetReadError::Corrupt(e.to_string());
    crate::parquet_headers::check_footer(bytes).map_err(|e| corrupt(&e))?;
    let reader = SerializedFileReader::new(bytes.clone()).map_err(|e| corrupt(&e))?;
    for g in 0..reader.num_row_groups() {
        let group = reader.get_row_group(g).map_err(|e| corrupt(&e))?;
        for c in 0..group.num_columns() {
            let chunk = group.metadata().column(c);
            let (start, len) = chunk.byte_range();
            crate::parquet_headers::check_pages(bytes, start, len)
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
        crate::parquet_headers::check_footer(&tail).map_err(ParquetReadError::Corrupt)?;
        let reader = SerializedFileReader::new(file)
            .map_err(|e| ParquetReadError::Corrupt(e.to_string()))?;
        let rows = reader.metadata().file_metadata().num_rows();
        u64::try_from(rows)
            .map_err(|_| ParquetReadError::Corrupt(format!("the footer records {rows} rows")))
    })
}

/// The footer of `path` with its 8-byte trailer (length and magic), as far as the
/// file holds them: what [`crate::parquet_headers::check_footer`] scans.
fn footer_tail(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut file = File::open(path)?;
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
            for stream in [stream_batches, stream_dictionary_batches] {
                let streamed =
                    stream(&path, 1024).and_then(|s| s.collect::<Result<Vec<_>, _>>().map(|_| ()));
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
}
