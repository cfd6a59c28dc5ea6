//! Tables for SQL: a Parquet, CSV or JSON-lines file, or a folder of such files,
//! read whole into memory and registered under a name.
//!
//! Reading eagerly makes a malformed file an error that names it before any
//! model runs. Only regular files are read ([`crate::data::input_file`]). Parquet goes
//! through the guarded reader ([`crate::data::parquet_read`]); CSV and JSON lines
//! through DataFusion's readers, after a scan that refuses malformed CSV and
//! sizes past the limits naming the line ([`super::text_scan`]). Large strings
//! become `Utf8`, the type the AI operators read.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::datasource::MemTable;
use datafusion::prelude::{CsvReadOptions, JsonReadOptions, SessionContext};

use super::text_scan::{self, CsvReading, ScanError};
use crate::data::parquet_read::{ParquetReadError, read_batches};
use crate::error::{EngineError, Result};

/// A file format tables are read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Parquet,
    Csv,
    JsonLines,
}

fn format_of(path: &Path) -> Option<Format> {
    match path.extension()?.to_str()?.to_ascii_lowercase().as_str() {
        "parquet" => Some(Format::Parquet),
        "csv" => Some(Format::Csv),
        "json" | "jsonl" | "ndjson" => Some(Format::JsonLines),
        _ => None,
    }
}

fn data_error(name: &str, path: &Path, message: impl std::fmt::Display) -> EngineError {
    EngineError::Data(format!("table {name} ({}): {message}", path.display()))
}

/// The files of a table: `path` itself, or the data files of a folder (sorted).
/// Each is a regular file, or a link to one ([`crate::data::input_file`]).
fn files(name: &str, path: &Path) -> Result<(Vec<PathBuf>, Format)> {
    let meta = std::fs::metadata(path).map_err(|e| data_error(name, path, e))?;
    if !meta.is_dir() {
        crate::data::input_file::regular_file(path).map_err(|e| data_error(name, path, e))?;
        let format = format_of(path).ok_or_else(|| {
            data_error(
                name,
                path,
                "unknown file type; use .parquet, .csv, or .json/.jsonl (JSON lines)",
            )
        })?;
        return Ok((vec![path.to_path_buf()], format));
    }
    let mut found: Vec<PathBuf> = Vec::new();
    for entry in std::fs::read_dir(path).map_err(|e| data_error(name, path, e))? {
        let file = entry.map_err(|e| data_error(name, path, e))?.path();
        if format_of(&file).is_some() {
            crate::data::input_file::regular_file(&file).map_err(|e| data_error(name, &file, e))?;
            found.push(file);
        }
    }
    found.sort();
    let Some(first) = found.first() else {
        return Err(data_error(
            name,
            path,
            "the folder holds no .parquet, .csv or .json files",
        ));
    };
    let format = format_of(first).expect("filtered");
    if let Some(other) = found.iter().find(|p| format_of(p) != Some(format)) {
        return Err(data_error(
            name,
            path,
            format!(
                "the folder mixes file types ({} and {})",
                first.display(),
                other.display()
            ),
        ));
    }
    Ok((found, format))
}

/// Reads the table at `path` (its CSV as strictly as `csv` says) and registers
/// it as `name`, served in the batches AI operators stream
/// ([`crate::data::tables::ai_batches`]: `batch_rows` rows and about
/// `batch_text_bytes` bytes of its longest text column at most). Returns its row
/// count and the rows of its first batch when it has several.
pub async fn register(
    ctx: &SessionContext,
    name: &str,
    path: &Path,
    csv: CsvReading,
    batch_rows: usize,
    batch_text_bytes: usize,
) -> Result<(usize, Option<usize>)> {
    let (paths, format) = files(name, path)?;
    let mut schema: Option<SchemaRef> = None;
    let mut batches = Vec::new();
    for file in &paths {
        let (file_schema, file_batches) = read_file(ctx, name, file, format, csv).await?;
        match &schema {
            None => schema = Some(file_schema),
            Some(s) if s.fields() == file_schema.fields() => {}
            Some(s) => {
                return Err(data_error(
                    name,
                    file,
                    format!(
                        "its columns {:?} differ from the first file's {:?}",
                        names(&file_schema),
                        names(s)
                    ),
                ));
            }
        }
        batches.extend(file_batches);
    }
    let schema = schema.expect("at least one file");
    let (schema, batches) = plain_strings(schema, batches)?;
    let whole = datafusion::arrow::compute::concat_batches(&schema, &batches)?;
    let slices = crate::data::tables::ai_batches(
        &whole,
        &longest_text_column(&whole).into_iter().collect::<Vec<_>>(),
        batch_rows,
        batch_text_bytes,
    );
    let first = (slices.len() > 1).then(|| slices[0].num_rows());
    let table = MemTable::try_new(schema, vec![slices])?;
    ctx.register_table(name, Arc::new(table))?;
    Ok((whole.num_rows(), first))
}

/// Refuses table `name` when its `id` column repeats a value, naming the id:
/// its documents are keyed by id within a query ([`crate::inference::memo`]), so one id
/// must name one text.
pub async fn check_unique_ids(ctx: &SessionContext, name: &str) -> Result<()> {
    use datafusion::functions_aggregate::expr_fn::count;
    use datafusion::prelude::{col, lit};
    let table = ctx.table(name).await?;
    if table.schema().field_with_unqualified_name("id").is_err() {
        return Ok(());
    }
    let repeated = table
        .filter(col("id").is_not_null())?
        .aggregate(vec![col("id")], vec![count(lit(1)).alias("n")])?
        .filter(col("n").gt(lit(1)))?
        .limit(0, Some(1))?
        .collect()
        .await?;
    if let Some(batch) = repeated.iter().find(|b| b.num_rows() > 0) {
        let id = datafusion::arrow::util::display::array_value_to_string(batch.column(0), 0)?;
        return Err(EngineError::Data(format!(
            "table {name}: id {id:?} repeats; the ids of a QUAIL-B table must be unique"
        )));
    }
    Ok(())
}

/// The string column holding the most bytes: a table's documents, as far as
/// batching by text size is concerned.
fn longest_text_column(batch: &RecordBatch) -> Option<String> {
    batch
        .schema()
        .fields()
        .iter()
        .zip(batch.columns())
        .filter_map(|(f, c)| {
            let bytes = match c.data_type() {
                DataType::Utf8 => c.as_string::<i32>().values().len(),
                DataType::Utf8View => c.as_string_view().total_buffer_bytes_used(),
                _ => return None,
            };
            Some((bytes, f.name().clone()))
        })
        .max()
        .map(|(_, name)| name)
}

fn names(schema: &Schema) -> Vec<&String> {
    schema.fields().iter().map(|f| f.name()).collect()
}

async fn read_file(
    ctx: &SessionContext,
    name: &str,
    file: &Path,
    format: Format,
    csv: CsvReading,
) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let location = file
        .to_str()
        .ok_or_else(|| data_error(name, file, "the path is not UTF-8"))?;
    let frame = match format {
        Format::Parquet => {
            return read_batches(file, 8192).map_err(|e| match e {
                ParquetReadError::Io(e) => data_error(name, file, e),
                ParquetReadError::Corrupt(e) => {
                    data_error(name, file, format!("not a readable Parquet file: {e}"))
                }
            });
        }
        Format::Csv => {
            let shape =
                text_scan::scan_csv(file, csv).map_err(|e| scan_error(name, file, format, e))?;
            let ext = file.extension().and_then(|e| e.to_str()).unwrap_or("csv");
            let options = CsvReadOptions::new()
                .file_extension(ext)
                .newlines_in_values(shape.quoted_line_breaks)
                .truncated_rows(csv == CsvReading::Lenient);
            ctx.read_csv(location, options).await
        }
        Format::JsonLines => {
            text_scan::scan_json_lines(file).map_err(|e| scan_error(name, file, format, e))?;
            let ext = file.extension().and_then(|e| e.to_str()).unwrap_or("json");
            ctx.read_json(location, JsonReadOptions::default().file_extension(ext))
                .await
        }
    };
    let failed = |e: datafusion::error::DataFusionError| match format {
        // The reader counts lines from its batch; find the line in the file.
        Format::JsonLines => match text_scan::json_error_line(file) {
            Some(problem) => data_error(name, file, format!("{}: {problem}", unreadable(format))),
            None => data_error(
                name,
                file,
                format!("{}: {}", unreadable(format), e.strip_backtrace()),
            ),
        },
        _ => data_error(
            name,
            file,
            format!("{}: {}", unreadable(format), e.strip_backtrace()),
        ),
    };
    let frame = frame.map_err(failed)?;
    let schema = Arc::new(frame.schema().as_arrow().clone());
    let batches = frame.collect().await.map_err(failed)?;
    Ok((schema, batches))
}

fn unreadable(format: Format) -> &'static str {
    match format {
        Format::Csv => "not readable as CSV",
        _ => "not readable as JSON lines",
    }
}

fn scan_error(name: &str, file: &Path, format: Format, e: ScanError) -> EngineError {
    match e {
        ScanError::Io(e) => data_error(name, file, e),
        ScanError::Problem(p) => data_error(name, file, format!("{}: {p}", unreadable(format))),
    }
}

/// `LargeUtf8` columns as `Utf8`.
fn plain_strings(
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    if !schema
        .fields()
        .iter()
        .any(|f| f.data_type() == &DataType::LargeUtf8)
    {
        return Ok((schema, batches));
    }
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| {
            let t = if f.data_type() == &DataType::LargeUtf8 {
                DataType::Utf8
            } else {
                f.data_type().clone()
            };
            Field::new(f.name(), t, f.is_nullable())
        })
        .collect();
    let schema = Arc::new(Schema::new(fields));
    let batches = batches
        .into_iter()
        .map(|b| {
            let columns = b
                .columns()
                .iter()
                .zip(schema.fields())
                .map(|(c, f)| cast(c, f.data_type()))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            Ok(RecordBatch::try_new(schema.clone(), columns)?)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((schema, batches))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_repeated_id_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = SessionContext::new();
        for (name, rows) in [
            ("ok", "id,text\na,x\nb,y\n"),
            ("twice", "id,text\na,x\nb,y\na,z\n"),
        ] {
            let path = dir.path().join(format!("{name}.csv"));
            std::fs::write(&path, rows).unwrap();
            register(&ctx, name, &path, CsvReading::Strict, 8, 1 << 20)
                .await
                .unwrap();
        }
        check_unique_ids(&ctx, "ok").await.unwrap();
        let e = check_unique_ids(&ctx, "twice")
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("table twice: id \"a\" repeats"), "{e}");
    }

    async fn read(path: &Path, csv: CsvReading) -> Result<usize> {
        let ctx = SessionContext::new();
        Ok(register(&ctx, "t", path, csv, 8, 1 << 20).await?.0)
    }

    #[tokio::test]
    async fn a_ragged_csv_row_names_file_and_line_unless_read_leniently() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.csv");
        std::fs::write(&path, "id,text\na,x\nb\nc,z\n").unwrap();
        let e = read(&path, CsvReading::Strict)
            .await
            .unwrap_err()
            .to_string();
        let want = format!(
            "table t ({}): not readable as CSV: line 3: 1 field, the header (line 1) has 2",
            path.display()
        );
        assert!(e.contains(&want), "{e}");
        assert_eq!(read(&path, CsvReading::Lenient).await.unwrap(), 3);
    }

    #[tokio::test]
    async fn a_quote_left_open_is_refused_not_merged() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.csv");
        std::fs::write(&path, "id,text\na,\"open\nb,y\nc,z\n").unwrap();
        let e = read(&path, CsvReading::Strict)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2: a quoted field opens here"), "{e}");
        // What DataFusion makes of it: one row holding the rest of the file.
        assert_eq!(read(&path, CsvReading::Lenient).await.unwrap(), 1);
    }

    #[tokio::test]
    async fn quoted_line_breaks_stay_inside_their_row() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.csv");
        std::fs::write(&path, "id,text\r\na,\"x\r\ny, \"\"z\"\"\"\r\nb,w\r\n").unwrap();
        let ctx = SessionContext::new();
        register(&ctx, "t", &path, CsvReading::Strict, 8, 1 << 20)
            .await
            .unwrap();
        let batches = ctx
            .sql("SELECT text FROM t WHERE id = 'a'")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let text = datafusion::arrow::util::display::array_value_to_string(batches[0].column(0), 0)
            .unwrap();
        assert_eq!(text, "x\r\ny, \"z\"");
    }

    #[tokio::test]
    async fn a_json_error_names_its_own_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.json");
        std::fs::write(&path, "{\"id\": \"a\"}\n{\"id\": }\n{\"id\": \"c\"}\n").unwrap();
        let e = read(&path, CsvReading::Strict)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("({}): ", path.display())), "{e}");
        assert!(
            e.contains("not readable as JSON lines: line 2: expected value (column 8)"),
            "{e}"
        );
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn a_table_file_that_is_not_a_regular_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("t");
        std::fs::create_dir(&folder).unwrap();
        std::fs::write(folder.join("a.csv"), "id\na\n").unwrap();
        let fifo = folder.join("b.csv");
        assert!(
            std::process::Command::new("mkfifo")
                .arg(&fifo)
                .status()
                .unwrap()
                .success()
        );
        let e = read(&folder, CsvReading::Strict)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!(
                "({}): a FIFO (named pipe), not a regular file",
                fifo.display()
            )),
            "{e}"
        );
        let e = read(&fifo, CsvReading::Strict)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("a FIFO (named pipe)"), "{e}");
        let zero = dir.path().join("zero.csv");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let e = read(&zero, CsvReading::Strict)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("a symbolic link to a character device (/dev/zero)"),
            "{e}"
        );
    }
}
