//! Where a query's result rows go as DataFusion produces them: kept in memory
//! ([`MemoryRows`], charged to the query's memory pool so that a result larger
//! than `--memory-limit` fails naming it), or written batch by batch into a
//! zstd Parquet file ([`ParquetRows`], with [`HeadRows`] keeping the first
//! rows to print) so that a result larger than memory
//! (IMDB-9 has 88 M rows at sf 0.1 and 100 times more at sf 1.0) never sits in
//! it. A result that would not fit the disk either is kept as a summary: its
//! row count and order-free hash ([`crate::data::row_digest`]).

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

use crate::data::files::{parquet_properties, publish, summary_path, temp_path, write_file_atomic};
use crate::data::row_digest::{RowsDigest, RowsSummary};
use crate::error::{EngineError, Result};

/// Takes a query's result rows, one batch at a time, in the order they arrive.
pub trait RowSink: Send {
    /// Waits until the sink can take another batch: a sink that hands rows
    /// to a reader (a server's client) makes the query wait for it, so that
    /// a slow reader holds a bounded number of batches, not the result.
    /// Most sinks can always take one.
    fn ready(&mut self) -> futures::future::BoxFuture<'_, Result<()>> {
        Box::pin(async { Ok(()) })
    }

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
        sink.ready().await?;
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

/// Rows handed to a reader through a channel of `capacity` batches (a
/// server's client): the query waits while the reader is that far behind,
/// and fails once the reader is gone, so that nobody computes rows no one
/// will read.
#[derive(Debug)]
pub struct ChannelRows {
    sender: tokio::sync::mpsc::Sender<RecordBatch>,
    permit: Option<tokio::sync::mpsc::OwnedPermit<RecordBatch>>,
}

impl ChannelRows {
    /// The sink and the reader's end.
    pub fn channel(capacity: usize) -> (Self, tokio::sync::mpsc::Receiver<RecordBatch>) {
        let (sender, receiver) = tokio::sync::mpsc::channel(capacity.max(1));
        (
            Self {
                sender,
                permit: None,
            },
            receiver,
        )
    }

    /// A future that is ready once the reader's end is dropped (it holds
    /// the channel open as a sender would, until it is dropped itself).
    pub fn reader_gone(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let sender = self.sender.clone();
        async move { sender.closed().await }
    }

    fn gone() -> EngineError {
        EngineError::Data("the reader of the query's rows went away".into())
    }
}

impl RowSink for ChannelRows {
    fn ready(&mut self) -> futures::future::BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            if self.permit.is_none() {
                let permit = self
                    .sender
                    .clone()
                    .reserve_owned()
                    .await
                    .map_err(|_| Self::gone())?;
                self.permit = Some(permit);
            }
            Ok(())
        })
    }

    fn push(&mut self, batch: RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        match self.permit.take() {
            Some(permit) => {
                permit.send(batch);
                Ok(())
            }
            // A caller that did not wait for room: the batch goes only if
            // there is some.
            None => self.sender.try_send(batch).map_err(|e| match e {
                tokio::sync::mpsc::error::TrySendError::Full(_) => EngineError::Data(
                    "the reader of the query's rows is behind: wait for ready() before push()"
                        .into(),
                ),
                tokio::sync::mpsc::error::TrySendError::Closed(_) => Self::gone(),
            }),
        }
    }
}

/// Rows counted and dropped: a run whose rows nobody reads (an estimate).
#[derive(Debug, Default)]
pub struct CountedRows {
    /// Rows seen.
    pub rows: u64,
}

impl RowSink for CountedRows {
    fn push(&mut self, batch: RecordBatch) -> Result<()> {
        self.rows += batch.num_rows() as u64;
        Ok(())
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
///
/// Before each batch the disk's free space is checked: once it falls under
/// the reserve ([`DISK_RESERVE_ENV`], default [`DEFAULT_DISK_RESERVE`]), the
/// file is closed, and the rows from then on are only counted and hashed. At
/// [`ParquetRows::finish`] the closed file's rows are hashed too, the file is
/// removed (a result cut short must not pass for the result), and a summary
/// takes its place ([`summary_path`]): what [`SavedRows::Summary`] returns.
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
    /// Free bytes the file must leave on its disk.
    reserve: u64,
    /// The free bytes of the disk holding a path (`None`: not known).
    free_space: FreeSpace,
    /// Set once the disk ran low: the file is closed, later rows are hashed.
    overflow: Option<Overflow>,
}

/// Reads the free bytes of the file system that holds a path.
pub type FreeSpace = Box<dyn Fn(&Path) -> Option<u64> + Send>;

/// Where the rows went once the disk ran low.
#[derive(Debug)]
struct Overflow {
    /// Rows in the closed file.
    file_rows: u64,
    /// Free bytes when it was closed.
    free_bytes: u64,
    /// The rows after it.
    digest: RowsDigest,
}

/// What [`ParquetRows::finish`] kept of the rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SavedRows {
    /// The file holds every row (how many).
    File(u64),
    /// The disk ran low: the summary file holds the count and hash.
    Summary(RowsSummary),
}

impl SavedRows {
    /// Rows of the result.
    pub fn rows(&self) -> u64 {
        match self {
            SavedRows::File(rows) => *rows,
            SavedRows::Summary(s) => s.rows,
        }
    }
}

/// Environment variable: the free disk space, in bytes, that a result file
/// leaves (past it the result is summarised instead).
pub const DISK_RESERVE_ENV: &str = "AISQL_DISK_RESERVE_BYTES";

/// The free disk space a result file leaves by default: room for its last row
/// group and footer, and for the run's other small files.
pub const DEFAULT_DISK_RESERVE: u64 = 1 << 30;

/// The reserve [`DISK_RESERVE_ENV`] asks for, else the default; a value that is
/// not a number of bytes is an error naming it.
pub fn disk_reserve() -> Result<u64> {
    match std::env::var(DISK_RESERVE_ENV) {
        Err(_) => Ok(DEFAULT_DISK_RESERVE),
        Ok(v) => v.trim().parse().map_err(|_| {
            EngineError::Setting(format!(
                "{DISK_RESERVE_ENV}={v:?}: expected a number of bytes"
            ))
        }),
    }
}

/// The free bytes of the file system holding `path`, as an unprivileged user
/// may use them.
#[cfg(unix)]
pub fn free_disk_space(path: &Path) -> Option<u64> {
    let s = rustix::fs::statvfs(path).ok()?;
    Some(s.f_bavail.saturating_mul(s.f_frsize))
}

/// Free space is not known here: the file is written until the disk refuses.
#[cfg(not(unix))]
pub fn free_disk_space(_path: &Path) -> Option<u64> {
    None
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
    /// given its column names (their types must match). It leaves
    /// [`disk_reserve`] bytes free on the disk.
    pub fn create(path: &Path, schema: SchemaRef) -> Result<Self> {
        Self::with_reserve(path, schema, disk_reserve()?, Box::new(free_disk_space))
    }

    /// As [`ParquetRows::create`], leaving `reserve` bytes free as `free_space`
    /// reports them.
    pub fn with_reserve(
        path: &Path,
        schema: SchemaRef,
        reserve: u64,
        free_space: FreeSpace,
    ) -> Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| EngineError::io(dir, e))?;
        }
        let tmp = temp_path(path);
        let file = File::create(&tmp).map_err(|e| crate::data::files::temp_error(path, &tmp, e))?;
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
            reserve,
            free_space,
            overflow: None,
        })
    }

    /// Closes the file and renames it into place, or, when the disk ran low,
    /// hashes its rows, removes it and writes the summary in its place.
    pub fn finish(mut self) -> Result<SavedRows> {
        let saved = match self.overflow.take() {
            None => {
                let writer = self.stop_writer()?;
                writer.close().map_err(|e| self.failed(&e))?;
                publish(&self.tmp, &self.path)?;
                self.published = true;
                SavedRows::File(self.rows)
            }
            Some(overflow) => {
                let summary = self.summarise(overflow)?;
                std::fs::remove_file(&self.tmp).map_err(|e| EngineError::io(&self.tmp, e))?;
                self.published = true;
                let text = serde_json::to_string_pretty(&summary).expect("a summary serialises");
                write_file_atomic(&summary_path(&self.path), (text + "\n").as_bytes())?;
                SavedRows::Summary(summary)
            }
        };
        // An earlier run's file of the other kind would contradict this one.
        let stale = match saved {
            SavedRows::File(_) => summary_path(&self.path),
            SavedRows::Summary(_) => self.path.clone(),
        };
        match std::fs::remove_file(&stale) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(EngineError::io(&stale, e));
            }
            _ => {}
        }
        Ok(saved)
    }

    /// The disk ran low (`free_bytes` left): closes the file as it is, to be
    /// hashed at the end; later rows are hashed as they come.
    fn close_for_summary(&mut self, free_bytes: u64) -> Result<()> {
        let writer = self.stop_writer()?;
        writer.close().map_err(|e| self.failed(&e))?;
        self.overflow = Some(Overflow {
            file_rows: self.rows,
            free_bytes,
            digest: RowsDigest::default(),
        });
        Ok(())
    }

    /// The summary of every row: the closed file's, read back, and the later
    /// ones already hashed.
    fn summarise(&self, overflow: Overflow) -> Result<RowsSummary> {
        let Overflow {
            file_rows,
            free_bytes,
            mut digest,
        } = overflow;
        let unreadable =
            |e: &dyn std::fmt::Display| EngineError::Data(format!("{}: {e}", self.tmp.display()));
        let batches = crate::data::parquet_read::stream_batches(&self.tmp, 8192)
            .map_err(|e| unreadable(&e))?;
        for batch in batches {
            digest.add_batch(&batch.map_err(|e| unreadable(&e))?)?;
        }
        if digest.rows() != self.rows {
            return Err(EngineError::Data(format!(
                "{}: {} rows read back, {} written",
                self.tmp.display(),
                digest.rows(),
                self.rows
            )));
        }
        Ok(RowsSummary::new(
            &self.path,
            &self.schema,
            &digest,
            file_rows,
            free_bytes,
            self.reserve,
        ))
    }

    fn failed(&self, e: &dyn std::fmt::Display) -> EngineError {
        EngineError::Data(format!("{}: {e}", self.path.display()))
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
                crate::panic_hook::describe(panic.as_ref())
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
        if self.overflow.is_none()
            && let Some(free) = (self.free_space)(folder_of(&self.tmp))
            && free < self.reserve
        {
            self.close_for_summary(free)?;
        }
        if let Some(overflow) = &mut self.overflow {
            overflow.digest.add_batch(&batch)?;
            self.rows += rows;
            return Ok(());
        }
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

/// The folder holding `path` (`.` for a bare file name).
fn folder_of(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
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

    #[tokio::test]
    async fn channel_rows_wait_for_their_reader_and_fail_once_it_is_gone() {
        let (mut sink, mut reader) = ChannelRows::channel(1);
        sink.ready().await.unwrap();
        sink.push(batch(&["a"])).unwrap();
        // The one slot is taken: the next batch waits for the reader.
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(50), sink.ready());
        assert!(
            waiting.await.is_err(),
            "ready() while the reader is a batch behind"
        );
        assert_eq!(reader.recv().await.unwrap().num_rows(), 1);
        sink.ready().await.unwrap();
        // Empty batches are not sent, and keep the room they were given.
        sink.push(batch(&[])).unwrap();
        sink.push(batch(&["b", "c"])).unwrap();
        assert_eq!(reader.recv().await.unwrap().num_rows(), 2);
        // Without waiting: refused while full, never blocking.
        sink.push(batch(&["d"])).unwrap();
        let full = sink.push(batch(&["e"])).unwrap_err().to_string();
        assert!(full.contains("behind"), "{full}");
        let gone = sink.reader_gone();
        drop(reader);
        tokio::time::timeout(std::time::Duration::from_secs(5), gone)
            .await
            .expect("reader_gone() after the reader was dropped");
        let err = sink.ready().await.unwrap_err().to_string();
        assert!(err.contains("went away"), "{err}");
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
        assert_eq!(sink.finish().unwrap(), SavedRows::File(3));
        let back = crate::data::files::read_parquet(&path).unwrap();
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
        assert_eq!(parquet.finish().unwrap(), SavedRows::File(5));
        assert_eq!(
            crate::data::files::read_parquet(&path).unwrap().num_rows(),
            5
        );
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

    /// A disk with `free` bytes for the first `calls` checks, and none after.
    fn filling_disk(calls: usize, free: u64) -> FreeSpace {
        let checked = std::sync::atomic::AtomicUsize::new(0);
        Box::new(move |_| {
            let n = checked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Some(if n < calls { free } else { 0 })
        })
    }

    #[test]
    fn rows_past_the_disk_reserve_are_kept_as_a_count_and_hash() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rows.parquet");
        // An earlier run's file: it must not pass for this result.
        std::fs::write(&path, b"stale").unwrap();
        let mut sink =
            ParquetRows::with_reserve(&path, named("r"), 50, filling_disk(2, 100)).unwrap();
        for b in [&["a", "b"][..], &["c"], &["d", "e"], &["f"]] {
            sink.push(batch(b)).unwrap();
        }
        let SavedRows::Summary(summary) = sink.finish().unwrap() else {
            panic!("the disk ran low after two batches")
        };
        let all = crate::data::row_digest::tests::digest(&[batch(&["f", "e", "d", "c", "b", "a"])]);
        assert_eq!(summary.rows, 6);
        assert_eq!(summary.rows_hash, all.hash_hex());
        assert_eq!(
            (
                summary.rows_before_disk_ran_low,
                summary.free_bytes,
                summary.reserve_bytes
            ),
            (3, 0, 50)
        );
        assert_eq!(summary.columns, vec!["r".to_string()]);
        assert!(!path.exists(), "no rows.parquet, not even the stale one");
        assert!(!temp_path(&path).exists());
        let written: RowsSummary =
            serde_json::from_slice(&std::fs::read(summary_path(&path)).unwrap()).unwrap();
        assert_eq!(written, summary);
        assert!(
            written.note.contains("rows.parquet was not kept"),
            "{}",
            written.note
        );
    }

    #[test]
    fn rows_that_fit_replace_an_earlier_summary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rows.parquet");
        std::fs::write(summary_path(&path), b"{}").unwrap();
        let mut sink =
            ParquetRows::with_reserve(&path, named("r"), 50, filling_disk(usize::MAX, 100))
                .unwrap();
        sink.push(batch(&["a"])).unwrap();
        assert_eq!(sink.finish().unwrap(), SavedRows::File(1));
        assert!(path.exists());
        assert!(!summary_path(&path).exists());
    }

    #[test]
    fn a_disk_low_from_the_start_keeps_only_the_summary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rows.parquet");
        let mut sink =
            ParquetRows::with_reserve(&path, named("r"), 50, filling_disk(0, 0)).unwrap();
        sink.push(batch(&["a", "b"])).unwrap();
        let saved = sink.finish().unwrap();
        assert_eq!(saved.rows(), 2);
        assert!(matches!(saved, SavedRows::Summary(s) if s.rows_before_disk_ran_low == 0));
        assert!(!path.exists());
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
