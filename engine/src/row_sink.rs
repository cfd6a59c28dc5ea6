//! Where a query's result rows go as DataFusion produces them: kept in memory
//! ([`MemoryRows`], charged to the query's memory pool so that a result larger
//! than `--memory-limit` fails naming it), or written batch by batch into a
//! zstd Parquet file ([`ParquetRows`], with [`HeadRows`] keeping the first
//! rows to print) so that a result larger than memory
//! (IMDB-9 has 88 M rows at sf 0.1 and 100 times more at sf 1.0) never sits in
//! it.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{SyncSender, sync_channel};
use std::thread::JoinHandle;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::physical_plan::ExecutionPlan;
use futures::StreamExt;

use crate::error::{EngineError, Result};
use crate::output::{parquet_properties, publish, temp_path};

/// Takes a query's result rows, one batch at a time, in the order they arrive.
pub trait RowSink: Send {
    /// Takes the next batch.
    fn push(&mut self, batch: RecordBatch) -> Result<()>;

    /// True when the sink keeps the rows in memory, so that they count against
    /// the query's memory pool.
    fn keeps_rows_in_memory(&self) -> bool {
        false
    }
}

/// Runs `physical` and hands every batch to `sink`; a sink that keeps rows in
/// memory has them charged to the query's memory pool.
pub(crate) async fn stream_rows(
    physical: Arc<dyn ExecutionPlan>,
    task: Arc<TaskContext>,
    sink: &mut dyn RowSink,
) -> datafusion::error::Result<()> {
    let reservation = MemoryConsumer::new("query result rows").register(task.memory_pool());
    let mut stream = datafusion::physical_plan::execute_stream(physical, task)?;
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        if sink.keeps_rows_in_memory() {
            reservation.try_grow(batch.get_array_memory_size())?;
        }
        sink.push(batch)?;
    }
    Ok(())
}

/// Rows kept in memory, for printing or comparing.
#[derive(Debug, Default)]
pub struct MemoryRows {
    /// The batches in arrival order.
    pub batches: Vec<RecordBatch>,
}

impl RowSink for MemoryRows {
    fn push(&mut self, batch: RecordBatch) -> Result<()> {
        if batch.num_rows() > 0 {
            self.batches.push(batch);
        }
        Ok(())
    }

    fn keeps_rows_in_memory(&self) -> bool {
        true
    }
}

/// The first `limit` rows kept (to print them), every row counted, and every
/// batch handed on to `next` (a file written as the rows arrive): a result of
/// any size is saved while only its head is held.
#[derive(Debug)]
pub struct HeadRows<S> {
    limit: usize,
    head: Vec<RecordBatch>,
    kept: usize,
    total: u64,
    next: S,
}

impl<S: RowSink> HeadRows<S> {
    /// Keeps `limit` rows and hands everything to `next`.
    pub fn new(limit: usize, next: S) -> Self {
        Self {
            limit,
            head: Vec::new(),
            kept: 0,
            total: 0,
            next,
        }
    }

    /// The kept rows (at most `limit`, in arrival order), how many rows came in
    /// all, and the sink they were handed to.
    pub fn finish(self) -> (Vec<RecordBatch>, u64, S) {
        (self.head, self.total, self.next)
    }
}

impl<S: RowSink> RowSink for HeadRows<S> {
    fn push(&mut self, batch: RecordBatch) -> Result<()> {
        let room = self.limit - self.kept;
        if room > 0 && batch.num_rows() > 0 {
            let head = batch.slice(0, batch.num_rows().min(room));
            self.kept += head.num_rows();
            self.head.push(head);
        }
        self.total += batch.num_rows() as u64;
        self.next.push(batch)
    }
}

/// Rows written into a Parquet file as they arrive, under a temporary name
/// that [`ParquetRows::finish`] renames into place: a query that fails or is
/// stopped leaves no `rows.parquet`, and a dropped, unfinished writer removes
/// its temporary file. The encoding runs on a thread of its own, one batch
/// behind the query: dictionary-encoding every value is as much work as
/// making the rows (IMDB-9 writes 8.7 G rows at sf 1.0), and the two overlap.
pub struct ParquetRows {
    path: PathBuf,
    tmp: PathBuf,
    schema: SchemaRef,
    /// Batches on their way to the writer thread; `None` once finished.
    to_writer: Option<SyncSender<RecordBatch>>,
    /// The writer thread: it hands the unclosed writer back when the batches
    /// end, or the first error.
    writer: Option<JoinHandle<Result<ArrowWriter<File>>>>,
    rows: u64,
    /// Renamed into place: the temporary file is gone.
    published: bool,
}

impl std::fmt::Debug for ParquetRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParquetRows")
            .field("path", &self.path)
            .field("rows", &self.rows)
            .finish()
    }
}

/// Batches waiting for the writer thread: enough to keep it busy, few enough
/// to hold (a batch is at most a join's output chunk).
const QUEUED_BATCHES: usize = 2;

impl ParquetRows {
    /// A writer of `path` whose batches have `schema`; batches pushed later are
    /// given its column names (their types must match).
    pub fn create(path: &Path, schema: SchemaRef) -> Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| EngineError::io(dir, e))?;
        }
        let tmp = temp_path(path);
        let file = File::create(&tmp).map_err(|e| EngineError::io(&tmp, e))?;
        let failed =
            |e: &dyn std::fmt::Display| EngineError::Data(format!("{}: {e}", path.display()));
        let mut writer = ArrowWriter::try_new(file, schema.clone(), Some(parquet_properties()))
            .map_err(|e| failed(&e))?;
        let (to_writer, batches) = sync_channel::<RecordBatch>(QUEUED_BATCHES);
        let shown = path.to_path_buf();
        let thread = std::thread::Builder::new()
            .name("rows.parquet writer".into())
            .spawn(move || {
                for batch in batches {
                    writer
                        .write(&batch)
                        .map_err(|e| EngineError::Data(format!("{}: {e}", shown.display())))?;
                }
                Ok(writer)
            })
            .map_err(|e| EngineError::io(&tmp, e))?;
        Ok(Self {
            path: path.to_path_buf(),
            tmp,
            schema,
            to_writer: Some(to_writer),
            writer: Some(thread),
            rows: 0,
            published: false,
        })
    }

    /// Closes the file and renames it into place; returns the rows written.
    pub fn finish(mut self) -> Result<u64> {
        let writer = self.stop_writer()?;
        writer
            .close()
            .map_err(|e| EngineError::Data(format!("{}: {e}", self.path.display())))?;
        publish(&self.tmp, &self.path)?;
        self.published = true;
        Ok(self.rows)
    }

    fn stopped(&self) -> EngineError {
        EngineError::Data(format!(
            "{}: the writer stopped on an earlier error",
            self.path.display()
        ))
    }

    /// Ends the batches and waits for the writer thread: its writer, all
    /// batches written, or its error.
    fn stop_writer(&mut self) -> Result<ArrowWriter<File>> {
        self.to_writer = None;
        let Some(thread) = self.writer.take() else {
            return Err(self.stopped());
        };
        thread.join().unwrap_or_else(|panic| {
            Err(EngineError::Data(format!(
                "{}: the writer failed: {}",
                self.path.display(),
                crate::error::panic_message(panic.as_ref())
            )))
        })
    }
}

impl RowSink for ParquetRows {
    fn push(&mut self, batch: RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let batch =
            RecordBatch::try_new(self.schema.clone(), batch.columns().to_vec()).map_err(|e| {
                EngineError::Data(format!(
                    "{}: a result batch does not fit the output columns: {e}",
                    self.path.display()
                ))
            })?;
        let rows = batch.num_rows() as u64;
        let Some(to_writer) = &self.to_writer else {
            return Err(self.stopped());
        };
        if to_writer.send(batch).is_err() {
            // The writer thread stopped on an error: that error is the answer.
            return Err(match self.stop_writer() {
                Err(e) => e,
                Ok(_) => self.stopped(),
            });
        }
        self.rows += rows;
        Ok(())
    }
}

impl Drop for ParquetRows {
    fn drop(&mut self) {
        if self.writer.is_some() {
            let _ = self.stop_writer();
        }
        if !self.published {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    fn batch(values: &[&str]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Utf8, false)]));
        RecordBatch::try_new(schema, vec![Arc::new(StringArray::from(values.to_vec()))]).unwrap()
    }

    fn named(name: &str) -> SchemaRef {
        Arc::new(Schema::new(vec![Field::new(name, DataType::Utf8, false)]))
    }

    #[test]
    fn parquet_rows_appear_whole_and_renamed_only_when_finished() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rows.parquet");
        let mut sink = ParquetRows::create(&path, named("r")).unwrap();
        sink.push(batch(&["a", "b"])).unwrap();
        sink.push(batch(&[])).unwrap();
        sink.push(batch(&["c"])).unwrap();
        assert!(!path.exists(), "no rows.parquet before finish");
        assert_eq!(sink.finish().unwrap(), 3);
        let back = crate::output::read_parquet(&path).unwrap();
        assert_eq!(back.num_rows(), 3);
        assert_eq!(back.schema().field(0).name(), "r");
        assert!(!temp_path(&path).exists());
    }

    #[test]
    fn head_rows_keep_the_first_rows_and_hand_on_all_of_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rows.parquet");
        let mut sink = HeadRows::new(3, ParquetRows::create(&path, named("r")).unwrap());
        for b in [&["a", "b"][..], &[], &["c", "d"], &["e"]] {
            sink.push(batch(b)).unwrap();
        }
        let (head, total, parquet) = sink.finish();
        let kept: Vec<usize> = head.iter().map(RecordBatch::num_rows).collect();
        assert_eq!((kept, total), (vec![2, 1], 5));
        assert_eq!(parquet.finish().unwrap(), 5);
        assert_eq!(crate::output::read_parquet(&path).unwrap().num_rows(), 5);
    }

    #[test]
    fn an_unfinished_writer_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rows.parquet");
        let mut sink = ParquetRows::create(&path, named("r")).unwrap();
        sink.push(batch(&["a"])).unwrap();
        assert!(temp_path(&path).exists());
        drop(sink);
        assert!(!temp_path(&path).exists());
        assert!(!path.exists());
    }

    #[test]
    fn a_finish_that_fails_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rows.parquet");
        // A non-empty folder where the file should go: the rename fails.
        std::fs::create_dir_all(path.join("taken")).unwrap();
        let mut sink = ParquetRows::create(&path, named("r")).unwrap();
        sink.push(batch(&["a"])).unwrap();
        let err = sink.finish().unwrap_err().to_string();
        assert!(err.contains("rows.parquet"), "{err}");
        assert!(!temp_path(&path).exists());
        assert!(path.join("taken").exists());
    }

    #[test]
    fn a_batch_of_other_columns_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rows.parquet");
        let mut sink = ParquetRows::create(&path, named("r")).unwrap();
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        let ints = RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![1]))]).unwrap();
        let err = sink.push(ints).unwrap_err().to_string();
        assert!(err.contains("rows.parquet"), "{err}");
    }
}
