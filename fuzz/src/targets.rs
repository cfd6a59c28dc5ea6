//! The fuzz targets: each hands one input to the product's own code the way a
//! user's file would reach it, and checks the promises that hold whatever the
//! input (an error is a fine answer; a panic, a hang, a read outside the dataset
//! root or a changed document is not).
//!
//! A [`Fixture`] holds what the targets run against: a small stand-in QUAIL-B
//! dataset, its reference labels behind the oracle backend, a finished run folder
//! to resume, and the vendored tokenizer.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use aisql_bench::driver::{BenchOptions, run_bench};
use aisql_bench::layout::Dataset;
use aisql_bench::plans::PlanSource;
use aisql_bench::quailb::explain::explain;
use aisql_bench::quailb::oracle::OracleBackend;
use aisql_bench::quailb::plan::QueryPlan;
use aisql_bench::quailb::query::run_query;
use aisql_engine::data::tables::read_table;
use aisql_engine::inference::answer_cache::AnswerIdentity;
use aisql_engine::inference::backend::ContentHashBackend;
use aisql_engine::inference::distributed::{
    GuardedMethod, ServedModel, WireDoc, WireRequests, WorkerMessage, WorkerReply, WorkerTask,
    WorkerTaskCodec, WorkerTaskExec, answer, check_request, decode_task,
};
use aisql_engine::inference::prompt::{PromptFormat, classify_pieces, filter_pieces, join_pieces};
use aisql_engine::sql::options::QueryOptions;
use aisql_engine::sql::plan_file::{decode_plan, encode_plan};
use aisql_engine::sql::{Evaluation, SqlSession};
use aisql_models::Tokenizer;
use datafusion::arrow::array::{ArrayRef, BinaryArray, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::prelude::{CsvReadOptions, SessionContext};
use datafusion_proto::physical_plan::{DefaultPhysicalProtoConverter, PhysicalExtensionCodec};

/// Scale factor of the fixture's stand-in dataset: every table has rows, and a
/// query runs in milliseconds.
pub const FIXTURE_SF: f64 = 0.002;

/// Separates the fields of a prompt input (template, document, partner, labels).
pub const FIELD_SEPARATOR: u8 = 0xff;

/// What a fuzz target feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    /// A Substrait plan, binary or ProtoJSON: decoded, read, explained,
    /// round-tripped, consumed into DataFusion and run on the oracle.
    Substrait,
    /// A Parquet table file read as a plan's table.
    Parquet,
    /// A CSV table file read through DataFusion's CSV reader.
    Csv,
    /// One JSON file of the QUAIL-B layout (corpus, collection or label-set
    /// manifest): the dataset opened, checked and its labels loaded.
    Manifest,
    /// One label set's `labels.parquet`: the labels loaded and validated.
    Labels,
    /// A run folder's `run.json`, resumed.
    Resume,
    /// Hostile document and template text: prompt pieces, rendering,
    /// tokenization and a Parquet round trip of the text.
    Prompt,
    /// A SQL statement: planned and run through the AI operators, and, where
    /// the result does not depend on row order, row by row too; both must give
    /// the same rows.
    Sql,
    /// What reaches an `aisql worker` from the network: a first byte choosing
    /// how the rest is read, as a `WorkerTaskExec`'s message (decoded by
    /// `WorkerTaskCodec` and answered by a served model in a query of its
    /// own), or as the first gRPC message of an `ExecuteTask` or
    /// `CoordinatorChannel` call (checked by the worker's guard).
    WorkerCodec,
}

impl Target {
    /// Every target.
    pub const ALL: [Target; 9] = [
        Target::Substrait,
        Target::Parquet,
        Target::Csv,
        Target::Manifest,
        Target::Labels,
        Target::Resume,
        Target::Prompt,
        Target::Sql,
        Target::WorkerCodec,
    ];

    /// The target's command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Target::Substrait => "substrait",
            Target::Parquet => "parquet",
            Target::Csv => "csv",
            Target::Manifest => "manifest",
            Target::Labels => "labels",
            Target::Resume => "resume",
            Target::Prompt => "prompt",
            Target::Sql => "sql",
            Target::WorkerCodec => "worker_codec",
        }
    }

    /// The target named `name`.
    pub fn from_name(name: &str) -> Option<Target> {
        Target::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Longest input worth generating.
    pub fn max_len(self) -> usize {
        match self {
            Target::Prompt => 256 << 10,
            Target::Sql => 64 << 10,
            _ => 2 << 20,
        }
    }
}

/// What the targets run against. Built once per fuzz run.
pub struct Fixture {
    _tmp: tempfile::TempDir,
    /// The stand-in dataset (read-only to the targets).
    dataset: Dataset,
    /// A copy of the dataset's root whose files the manifest and label targets
    /// replace one at a time.
    scratch_root: PathBuf,
    /// JSON files of the layout, relative to the root.
    layout_json: Vec<PathBuf>,
    /// `labels.parquet` files, relative to the root.
    label_files: Vec<PathBuf>,
    oracle: Arc<OracleBackend>,
    /// A finished run of [`RESUME_QUERIES`], copied before each resume.
    finished_run: PathBuf,
    /// Where a target writes its input files.
    work: PathBuf,
    tokenizer: Tokenizer,
    runtime: tokio::runtime::Runtime,
    /// The SQL corpus's tables, with the AI operators and row by row.
    sql_operators: SqlSession,
    sql_naive: SqlSession,
    /// The model an `aisql worker` serves, for the worker target.
    served: ServedModel,
}

/// The SQL corpus of the differential test (`tests/sql/`), its tables and
/// queries: the SQL target's tables and seeds.
const SQL_TABLES: [(&str, &str); 4] = [
    ("docs", include_str!("../../tests/sql/data/docs.csv")),
    ("topics", include_str!("../../tests/sql/data/topics.csv")),
    ("claims", include_str!("../../tests/sql/data/claims.csv")),
    (
        "evidence",
        include_str!("../../tests/sql/data/evidence.csv"),
    ),
];
const SQL_CORPUS: [&str; 7] = [
    include_str!("../../tests/sql/aggregates.sql"),
    include_str!("../../tests/sql/classify.sql"),
    include_str!("../../tests/sql/composition.sql"),
    include_str!("../../tests/sql/filters.sql"),
    include_str!("../../tests/sql/joins.sql"),
    include_str!("../../tests/sql/order_limit.sql"),
    include_str!("../../tests/sql/subqueries.sql"),
];

/// Words after which a query's rows may depend on row order or on chance, so
/// two plans of it need not agree.
const ORDER_DEPENDENT: [&str; 14] = [
    "limit",
    "offset",
    "fetch",
    "random",
    "now(",
    "uuid",
    "_agg",
    "first_value",
    "last_value",
    "nth_value",
    "row_number",
    "rank",
    "lead(",
    "lag(",
];

/// The queries of the run the resume target resumes.
pub const RESUME_QUERIES: [&str; 2] = ["IMDB-1", "FEV-1"];

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

impl Fixture {
    /// Generates the stand-in dataset and a finished run in a temporary folder.
    pub fn new() -> Result<Fixture, String> {
        let tmp = tempfile::tempdir().map_err(err)?;
        let root = tmp.path().join("quailb");
        aisql_standin::generate(&root, FIXTURE_SF).map_err(err)?;
        let dataset = Dataset::open(&root, FIXTURE_SF, None).map_err(err)?;
        let labels = dataset.load_labels(None).map_err(err)?;
        let oracle = Arc::new(OracleBackend::new(Arc::new(labels)));
        let scratch_root = tmp.path().join("scratch-root");
        copy_tree(&root, &scratch_root)?;
        let mut layout_json = Vec::new();
        let mut label_files = Vec::new();
        for file in files_under(&root)? {
            let rel = file.strip_prefix(&root).map_err(err)?.to_path_buf();
            match file.extension().and_then(|e| e.to_str()) {
                Some("json") => layout_json.push(rel),
                Some("parquet") if rel.starts_with("label_sets") => label_files.push(rel),
                _ => {}
            }
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(err)?;
        let finished_run = tmp.path().join("finished-run");
        let work = tmp.path().join("work");
        std::fs::create_dir_all(&work).map_err(err)?;
        let sql_tables = tmp.path().join("sql-tables");
        std::fs::create_dir_all(&sql_tables).map_err(err)?;
        for (name, csv) in SQL_TABLES {
            std::fs::write(sql_tables.join(format!("{name}.csv")), csv).map_err(err)?;
        }
        let session = |evaluation| {
            runtime.block_on(async {
                let s = SqlSession::new(
                    Arc::new(ContentHashBackend::default()),
                    QueryOptions {
                        batch_rows: 7,
                        memory_limit: 1 << 30,
                        ..Default::default()
                    },
                    evaluation,
                )
                .map_err(err)?;
                for (name, _) in SQL_TABLES {
                    s.register(name, &sql_tables.join(format!("{name}.csv")))
                        .await
                        .map_err(err)?;
                }
                Ok::<_, String>(s)
            })
        };
        let sql_operators = session(Evaluation::Operators)?;
        let sql_naive = session(Evaluation::Naive)?;
        let served = ServedModel::new(
            Arc::new(ContentHashBackend::default()),
            AnswerIdentity {
                model: "content-hash".into(),
                weights_sha256: "0".repeat(64),
                tokenizer_sha256: "0".repeat(64),
                dtype: "f32".into(),
                prompt_format: String::new(),
            },
            Default::default(),
        );
        let fixture = Fixture {
            served,
            sql_operators,
            sql_naive,
            dataset,
            scratch_root,
            layout_json,
            label_files,
            oracle,
            finished_run,
            work,
            tokenizer: Tokenizer::vendored().map_err(err)?,
            runtime,
            _tmp: tmp,
        };
        let run = fixture.runtime.block_on(run_bench(
            &fixture.bench_options(&fixture.finished_run, false),
            &fixture.dataset,
            fixture.oracle.clone(),
            resume_queries()?,
        ));
        run.map_err(err)?;
        Ok(fixture)
    }

    fn bench_options(&self, dir: &Path, resume: bool) -> BenchOptions {
        BenchOptions {
            output_dir: dir.to_path_buf(),
            resume,
            timeout: None,
            fail_fast: false,
            gpu_count: 1,
            gpu_hourly_rate_usd: None,
            backend_metadata: Default::default(),
            plans: PlanSource::Embedded.describe(),
            user_metadata: Default::default(),
            format: PromptFormat::default(),
            progress: aisql_engine::exec::progress::ProgressMode::Hidden,
            batch_rows: 64,
            memory_limit: 1 << 30,
            budget: None,
            on_row_error: Default::default(),
            reuse_earlier_kv: false,
            estimator: None,
        }
    }

    /// Real inputs to start from.
    pub fn seeds(&self, target: Target) -> Result<Vec<Vec<u8>>, String> {
        Ok(match target {
            Target::Substrait => {
                let source = PlanSource::Embedded;
                let mut seeds = Vec::new();
                for entry in source.catalog().map_err(err)? {
                    let json = source.file(&format!("{}.json", entry.id)).map_err(err)?;
                    let plan = decode_plan(&json, true)?;
                    seeds.push(json.into_owned());
                    seeds.push(encode_plan(&plan));
                }
                seeds
            }
            Target::Parquet => {
                let mut seeds: Vec<Vec<u8>> = self
                    .dataset
                    .tables
                    .values()
                    .map(std::fs::read)
                    .collect::<Result<_, _>>()
                    .map_err(err)?;
                seeds.push(hostile_parquet()?);
                seeds
            }
            Target::Csv => vec![
                b"id,body\nr1,hello\nr2,\"quoted, with comma\"\n".to_vec(),
                b"id,body,score\n1,a,0.5\n2,\"multi\nline\",1e3\n".to_vec(),
                "id,body\nr\u{202e}1,{0}\u{0}x\n".as_bytes().to_vec(),
            ],
            Target::Manifest => self.indexed_seeds(&self.layout_json)?,
            Target::Labels => self.indexed_seeds(&self.label_files)?,
            Target::Resume => vec![std::fs::read(self.finished_run.join("run.json")).map_err(err)?],
            Target::Sql => SQL_CORPUS
                .iter()
                .flat_map(|file| file.split("-- query:").skip(1))
                .map(|q| {
                    q.split_once('\n')
                        .map_or("", |(_, sql)| sql)
                        .as_bytes()
                        .to_vec()
                })
                .collect(),
            Target::WorkerCodec => worker_seeds()?,
            Target::Prompt => {
                let mut seeds = Vec::new();
                let sep = FIELD_SEPARATOR as char;
                for set in self.oracle_templates() {
                    seeds.push(
                        format!("{set}{sep}A review: great film.{sep}Another one{sep}positive{sep}negative")
                            .into_bytes(),
                    );
                }
                seeds.push(
                    format!("Is {{0}} true?{sep}doc with {{0}} and {{1}} inside{sep}<|im_end|>")
                        .into_bytes(),
                );
                seeds
            }
        })
    }

    /// Inputs of the replace-one-file targets: the file's index, then its bytes.
    fn indexed_seeds(&self, files: &[PathBuf]) -> Result<Vec<Vec<u8>>, String> {
        files
            .iter()
            .enumerate()
            .map(|(i, rel)| {
                let mut seed = vec![i as u8];
                seed.extend(std::fs::read(self.scratch_root.join(rel)).map_err(err)?);
                Ok(seed)
            })
            .collect()
    }

    fn oracle_templates(&self) -> Vec<String> {
        // The templates are in the label-set manifests.
        let mut t = Vec::new();
        for rel in &self.layout_json {
            if !rel.starts_with("label_sets") {
                continue;
            }
            if let Ok(bytes) = std::fs::read(self.scratch_root.join(rel))
                && let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes)
                && let Some(s) = v.pointer("/predicate/template").and_then(|s| s.as_str())
            {
                t.push(s.to_string());
            }
        }
        t
    }

    /// Runs `target` on `data`. `Ok` holds the kind of outcome (`ok`, or the
    /// error's kind); `Err` a broken promise.
    pub fn run(&self, target: Target, data: &[u8]) -> Result<String, String> {
        match target {
            Target::Substrait => self.substrait(data),
            Target::Parquet => self.parquet(data),
            Target::Csv => self.csv(data),
            Target::Manifest => self.manifest(data),
            Target::Labels => self.labels(data),
            Target::Resume => self.resume(data),
            Target::Prompt => self.prompt(data),
            Target::Sql => self.sql(data),
            Target::WorkerCodec => self.worker_codec(data),
        }
    }

    fn worker_codec(&self, data: &[u8]) -> Result<String, String> {
        let Some((&how, rest)) = data.split_first() else {
            return Ok("empty".into());
        };
        match how % 3 {
            0 => {
                let ctx = SessionContext::new().task_ctx();
                let converter = DefaultPhysicalProtoConverter {};
                let decoded = WorkerTaskCodec.try_decode(rest, &[], &ctx, &converter);
                let Ok(task) = decode_task(rest) else {
                    return Ok(format!("task refused ({})", decoded.is_err()));
                };
                if decoded.is_err() {
                    return Err("the codec refused a task its message decoding reads".into());
                }
                // The task is answered inside a query of its own, which then
                // ends, so that the next input's query is not kept waiting.
                let query = task.query;
                if let Some(q) = query {
                    answer(
                        &self.served,
                        WorkerTask {
                            query: Some(q),
                            message: WorkerMessage::StartQuery {
                                calls: vec![],
                                reuse_earlier_kv: false,
                            },
                        },
                    );
                }
                let reply = answer(&self.served, task);
                if let Some(q) = query {
                    answer(
                        &self.served,
                        WorkerTask {
                            query: Some(q),
                            message: WorkerMessage::EndQuery,
                        },
                    );
                }
                Ok(match reply {
                    WorkerReply::Failed(e) => format!("failed: {}", kind(&e)),
                    other => format!("{other:?}").chars().take(12).collect(),
                })
            }
            n => {
                let method = match n {
                    1 => GuardedMethod::ExecuteTask,
                    _ => GuardedMethod::CoordinatorChannel,
                };
                Ok(match check_request(method, rest) {
                    Ok(()) => "admitted".into(),
                    Err(e) => format!("refused: {}", kind(&e)),
                })
            }
        }
    }

    fn substrait(&self, data: &[u8]) -> Result<String, String> {
        let json = data.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
        let plan = match decode_plan(data, json) {
            Ok(p) => p,
            Err(e) => return Ok(kind(&e)),
        };
        let query = match QueryPlan::from_substrait(plan) {
            Ok(q) => q,
            Err(e) => return Ok(kind(&e)),
        };
        let shown = explain(&query);
        let _ = query.definition_hash("raw-v1");
        // An accepted plan survives its own binary encoding unchanged.
        let again = decode_plan(&encode_plan(&query.substrait), false)
            .map_err(|e| format!("an accepted plan does not decode after encoding: {e}"))?;
        let again = QueryPlan::from_substrait(again)
            .map_err(|e| format!("an accepted plan is refused after a round trip: {e}"))?;
        if explain(&again) != shown {
            return Err("an accepted plan explains differently after a round trip".into());
        }
        let options = QueryOptions {
            batch_rows: 64,
            memory_limit: 1 << 30,
            ..Default::default()
        };
        let out = self.runtime.block_on(run_query(
            &query,
            &self.dataset.tables,
            self.oracle.clone(),
            &options,
        ));
        Ok(match out {
            Ok(_) => "ran".into(),
            Err(e) => kind(&e),
        })
    }

    fn sql(&self, data: &[u8]) -> Result<String, String> {
        // As the aisql command runs it: on a thread with a deep stack.
        std::thread::scope(|scope| {
            std::thread::Builder::new()
                .stack_size(256 << 20)
                .spawn_scoped(scope, || self.sql_on_this_thread(data))
                .map_err(err)?
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }

    fn sql_on_this_thread(&self, data: &[u8]) -> Result<String, String> {
        let text = String::from_utf8_lossy(data);
        self.runtime.block_on(async {
            let got = match self.sql_operators.run(&text).await {
                Ok(out) => out,
                Err(e) => return Ok(kind(&e)),
            };
            let lower = text.to_lowercase();
            if ORDER_DEPENDENT.iter().any(|w| lower.contains(w)) {
                return Ok("ran".into());
            }
            let want = match self.sql_naive.run(&text).await {
                Ok(out) => out,
                Err(e) => return Ok(format!("row by row: {}", kind(&e))),
            };
            let rows = |b: &[datafusion::arrow::array::RecordBatch]| -> Result<Vec<String>, String> {
                let mut lines = aisql_engine::sql::row_lines(b).map_err(err)?;
                lines.sort();
                Ok(lines)
            };
            let (got, want) = (rows(&got.batches)?, rows(&want.batches)?);
            if got != want {
                return Err(format!(
                    "the AI operators and row-by-row evaluation disagree on {text:?}: {} rows vs {}{}",
                    got.len(),
                    want.len(),
                    if got.len() + want.len() < 40 {
                        format!("\n  operators: {got:?}\n  row by row: {want:?}")
                    } else {
                        String::new()
                    }
                ));
            }
            Ok("ran, same rows".into())
        })
    }

    fn parquet(&self, data: &[u8]) -> Result<String, String> {
        let path = self.work.join("table.parquet");
        std::fs::write(&path, data).map_err(err)?;
        let cols = ["id".to_string(), "body".to_string()];
        Ok(match read_table("reviews", &path, &cols, &cols[1..]) {
            Ok(b) => format!("read {} columns", b.num_columns()),
            Err(e) => kind(&e),
        })
    }

    fn csv(&self, data: &[u8]) -> Result<String, String> {
        use aisql_engine::sql::text_scan::{CsvReading, scan_csv};
        let path = self.work.join("table.csv");
        std::fs::write(&path, data).map_err(err)?;
        let scanned = scan_csv(&path, CsvReading::Strict);
        let lenient = scan_csv(&path, CsvReading::Lenient);
        if scanned.is_ok() && lenient.is_err() {
            return Err("the lenient scan refused a file the strict scan passed".into());
        }
        let out = self.runtime.block_on(async {
            let ctx = SessionContext::new();
            ctx.read_csv(
                path.to_str().expect("utf-8 temp path"),
                CsvReadOptions::new(),
            )
            .await?
            .collect()
            .await
        });
        // A file the strict scan passes is read as the records it counted: no
        // quote merges rows behind the scan's back.
        if let (Ok(shape), Ok(batches)) = (&scanned, &out) {
            let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
            if rows as u64 != shape.records.saturating_sub(1) {
                return Err(format!(
                    "the scan counted {} records (a header and rows), DataFusion read {rows} rows",
                    shape.records
                ));
            }
        }
        Ok(match out {
            Ok(b) => format!("read {} batches", b.len().min(2)),
            Err(e) => kind(&e),
        })
    }

    /// Writes `data[1..]` over the scratch root's file `files[data[0]]`, runs
    /// `check`, and puts the file back.
    fn with_replaced(
        &self,
        files: &[PathBuf],
        data: &[u8],
        check: impl FnOnce(&Path) -> Result<String, String>,
    ) -> Result<String, String> {
        let Some((&index, content)) = data.split_first() else {
            return Ok("empty".into());
        };
        let rel = &files[index as usize % files.len()];
        let path = self.scratch_root.join(rel);
        let original = std::fs::read(&path).map_err(err)?;
        struct Restore<'a>(&'a Path, Vec<u8>);
        impl Drop for Restore<'_> {
            fn drop(&mut self) {
                let _ = std::fs::write(self.0, &self.1);
            }
        }
        let _restore = Restore(&path, original);
        std::fs::write(&path, content).map_err(err)?;
        check(&self.scratch_root)
    }

    fn manifest(&self, data: &[u8]) -> Result<String, String> {
        self.with_replaced(&self.layout_json, data, |root| {
            let ds = match Dataset::open(root, FIXTURE_SF, None) {
                Ok(d) => d,
                Err(e) => return Ok(kind(&e)),
            };
            // Whatever the manifests say, the dataset's files stay under its root.
            let root = root.canonicalize().map_err(err)?;
            for (table, path) in &ds.tables {
                if let Ok(p) = path.canonicalize()
                    && !p.starts_with(&root)
                {
                    return Err(format!(
                        "manifest made table {table} resolve outside the root: {}",
                        p.display()
                    ));
                }
            }
            let _ = aisql_bench::resolve::stale_reason(&ds);
            if let Err(e) = ds.require_all_tables() {
                return Ok(kind(&e));
            }
            Ok(match ds.load_labels(None) {
                Ok(store) => format!("labels {}", store.sets().count().min(1)),
                Err(e) => kind(&e),
            })
        })
    }

    fn labels(&self, data: &[u8]) -> Result<String, String> {
        self.with_replaced(&self.label_files, data, |root| {
            let ds = Dataset::open(root, FIXTURE_SF, None).map_err(|e| {
                format!("replacing a labels.parquet broke opening the dataset's manifests: {e}")
            })?;
            Ok(match ds.load_labels(None) {
                Ok(_) => "loaded".into(),
                Err(e) => kind(&e),
            })
        })
    }

    fn resume(&self, data: &[u8]) -> Result<String, String> {
        let dir = self.work.join("run");
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(err)?;
        }
        copy_tree(&self.finished_run, &dir)?;
        std::fs::write(dir.join("run.json"), data).map_err(err)?;
        let out = self.runtime.block_on(run_bench(
            &self.bench_options(&dir, true),
            &self.dataset,
            self.oracle.clone(),
            resume_queries()?,
        ));
        Ok(match out {
            Ok(run) => format!("resumed {:?}", run.status),
            Err(e) => kind(&e),
        })
    }

    fn prompt(&self, data: &[u8]) -> Result<String, String> {
        let fields: Vec<String> = data
            .split(|&b| b == FIELD_SEPARATOR)
            .map(|f| String::from_utf8_lossy(f).into_owned())
            .collect();
        let field = |i: usize| fields.get(i).map(String::as_str).unwrap_or("");
        let (template, doc, partner) = (field(0), field(1), field(2));
        let labels: Vec<String> = fields.iter().skip(3).cloned().collect();
        let mut outcome = String::from("pieces ");
        for format in [PromptFormat::RawV1, PromptFormat::Qwen3ChatNonthinkingV1] {
            let pieces = [
                filter_pieces(format, template),
                Ok(join_pieces(format, template)),
                classify_pieces(format, template, &labels, &labels),
            ];
            for p in pieces {
                let p = match p {
                    Ok(p) => p,
                    Err(_) => {
                        outcome.push('e');
                        continue;
                    }
                };
                let partner = p.pair.then_some(partner);
                let prompt = p.render(doc, partner);
                // The document sits in the prompt verbatim, right after the preamble:
                // nothing in it is read as a placeholder.
                if prompt.get(p.preamble.len()..p.preamble.len() + doc.len()) != Some(doc) {
                    return Err("the document is not verbatim in its prompt".into());
                }
            }
        }
        // A document is text: its tokens decode back to it exactly (as the model
        // reads it: Unicode NFC, like the reference tokenizer; a coverage-guided
        // run found that the exact bytes are not what comes back), and none of
        // them is a control token (a document cannot end the user's turn).
        let ids = self.tokenizer.encode_document(doc).map_err(err)?;
        let back = self.tokenizer.decode(&ids).map_err(err)?;
        if back != self.tokenizer.normalized(doc).map_err(err)? {
            return Err(format!(
                "a document does not survive tokenization: {:?} came back as {:?}",
                shorten(doc),
                shorten(&back)
            ));
        }
        if let Some(id) = ids.iter().find(|&&id| self.tokenizer.is_special(id)) {
            return Err(format!(
                "document text {:?} was tokenized into control token {id}",
                shorten(doc)
            ));
        }
        // The same text through a Parquet table: a string column reads back equal,
        // a binary column with the raw bytes is read or refused with a clear error.
        let path = self.work.join("prompt.parquet");
        std::fs::write(&path, two_column_parquet(doc, data)?).map_err(err)?;
        let cols = ["id".to_string(), "body".to_string()];
        let batch = read_table("t", &path, &cols, &cols[1..])
            .map_err(|e| format!("a valid table with this text was refused: {e}"))?;
        let read = batch
            .column(1)
            .as_any()
            .downcast_ref::<datafusion::arrow::array::StringViewArray>()
            .map(|a| a.value(0).to_string());
        if read.as_deref() != Some(doc) {
            return Err("the document read from Parquet differs from the one written".into());
        }
        let cols = ["id".to_string(), "raw".to_string()];
        outcome.push_str(match read_table("t", &path, &cols, &cols[1..]) {
            Ok(_) => " raw read",
            Err(_) => " raw refused",
        });
        Ok(outcome)
    }
}

/// A protobuf field: length-delimited `bytes`, or the varint `number`.
fn pb_field(tag: u64, bytes: Option<&[u8]>, number: u64) -> Vec<u8> {
    let tag = u32::try_from(tag).expect("small field numbers");
    let mut out = Vec::new();
    match bytes {
        Some(b) => prost::encoding::bytes::encode(tag, &b.to_vec(), &mut out),
        None => prost::encoding::uint64::encode(tag, &number, &mut out),
    }
    out
}

/// Seeds of the worker target: tasks of every kind as a coordinator encodes
/// them, and the first messages of the worker service's calls as
/// datafusion-distributed's coordinator sends them (field numbers of its
/// `worker.proto`), each after its selector byte.
fn worker_seeds() -> Result<Vec<Vec<u8>>, String> {
    use aisql_engine::inference::backend::{AiCall, AiKind};
    let call = |kind: AiKind, labels: &[&str]| AiCall {
        op_id: "op-1".into(),
        kind,
        template: "Is {0} like {1}?".into(),
        tables: vec!["t".into(), "u".into()],
        columns: vec!["text".into(), "text".into()],
        pieces: join_pieces(PromptFormat::default(), "Is {0} like {1}?"),
        labels: labels.iter().map(|s| s.to_string()).collect(),
        max_tokens: if kind.generates() { 8 } else { 0 },
        descriptions: Vec::new(),
        relations: Vec::new(),
    };
    let docs = WireRequests {
        docs: vec![
            WireDoc {
                id: "1".into(),
                text: "a film".into(),
            },
            WireDoc {
                id: "2".into(),
                text: "a book".into(),
            },
        ],
        requests: vec![(0, Some(1)), (1, Some(0))],
    };
    let tasks = [
        WorkerMessage::Hello,
        WorkerMessage::StartQuery {
            calls: vec![call(AiKind::Filter, &[])],
            reuse_earlier_kv: false,
        },
        WorkerMessage::Answer(call(AiKind::Join, &[]), docs.clone()),
        WorkerMessage::Answer(call(AiKind::Classify, &["x", "y"]), docs.clone()),
        WorkerMessage::Answer(call(AiKind::Score, &[]), docs.clone()),
        WorkerMessage::Answer(call(AiKind::ClassifyScores, &["x", "y"]), docs.clone()),
        WorkerMessage::Answer(call(AiKind::Complete, &[]), docs.clone()),
        WorkerMessage::PartnersCollected(call(AiKind::Join, &[]), docs.docs.clone()),
        WorkerMessage::Cancel,
        WorkerMessage::EndQuery,
    ];
    let mut seeds: Vec<Vec<u8>> = tasks
        .into_iter()
        .map(|message| {
            let task = WorkerTask {
                query: Some(7),
                message,
            };
            let mut seed = vec![0];
            seed.extend(serde_json::to_vec(&task).expect("tasks serialise"));
            seed
        })
        .collect();
    let key = [
        pb_field(1, Some(&[7; 16]), 0),
        pb_field(2, None, 1),
        pb_field(3, None, 0),
    ]
    .concat();
    let execute = [
        pb_field(1, Some(&key), 0),
        pb_field(2, None, 0),
        pb_field(3, None, 1),
        pb_field(6, Some(&[]), 0),
    ]
    .concat();
    seeds.push([vec![1], execute].concat());
    let leaf: Arc<dyn datafusion::physical_plan::ExecutionPlan> =
        Arc::new(WorkerTaskExec::new(WorkerTask {
            query: None,
            message: WorkerMessage::Hello,
        }));
    let plan = datafusion_proto::bytes::physical_plan_to_bytes_with_extension_codec(
        leaf,
        &WorkerTaskCodec,
    )
    .map_err(err)?;
    let set = [
        pb_field(1, Some(&key), 0),
        pb_field(2, None, 2),
        pb_field(3, Some(&plan), 0),
        pb_field(5, Some(b"http://127.0.0.1:1/"), 0),
    ]
    .concat();
    seeds.push([vec![2], pb_field(1, Some(&set), 0)].concat());
    Ok(seeds)
}

fn shorten(s: &str) -> String {
    s.chars().take(60).collect()
}

/// The kind of an error: its words without the numbers, names and quoted parts
/// that vary from input to input (the outcome classes that steer the corpus).
pub fn kind(e: &dyn std::fmt::Display) -> String {
    let text = e.to_string();
    let mut out = String::new();
    let mut quoted = false;
    for c in text.chars() {
        if c == '"' {
            quoted = !quoted;
            continue;
        }
        if !quoted && (c.is_ascii_alphabetic() || c == ' ' || c == ':') {
            out.push(c);
        }
        if out.len() >= 72 {
            break;
        }
    }
    out
}

fn resume_queries() -> Result<Vec<(String, QueryPlan)>, String> {
    let ids: Vec<String> = RESUME_QUERIES.iter().map(|s| s.to_string()).collect();
    PlanSource::Embedded
        .select(Some(&ids), Default::default())
        .map_err(err)
}

fn files_under(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).map_err(err)? {
            let path = entry.map_err(err)?.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

fn copy_tree(from: &Path, to: &Path) -> Result<(), String> {
    for file in files_under(from)? {
        let target = to.join(file.strip_prefix(from).map_err(err)?);
        std::fs::create_dir_all(target.parent().expect("file has a parent")).map_err(err)?;
        std::fs::copy(&file, &target).map_err(err)?;
    }
    Ok(())
}

/// A table `(id, body, raw)`: `body` the text, `raw` the input's raw bytes in a
/// binary column (invalid UTF-8 included).
fn two_column_parquet(text: &str, raw: &[u8]) -> Result<Vec<u8>, String> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("body", DataType::Utf8, false),
        Field::new("raw", DataType::Binary, false),
    ]));
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(vec!["r1"])),
        Arc::new(StringArray::from(vec![text])),
        Arc::new(BinaryArray::from(vec![raw])),
    ];
    parquet_bytes(schema, columns)
}

/// A reviews-shaped table of hostile cells, as a Parquet seed.
fn hostile_parquet() -> Result<Vec<u8>, String> {
    let bodies: Vec<&str> = crate::mutate::HOSTILE.to_vec();
    let ids: Vec<String> = (0..bodies.len()).map(|i| format!("r{i}")).collect();
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, true),
        Field::new("body", DataType::Utf8, true),
    ]));
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(ids)),
        Arc::new(StringArray::from(bodies)),
    ];
    parquet_bytes(schema, columns)
}

/// One batch of `columns` as a Parquet file's bytes.
fn parquet_bytes(schema: Arc<Schema>, columns: Vec<ArrayRef>) -> Result<Vec<u8>, String> {
    let batch = RecordBatch::try_new(schema.clone(), columns).map_err(err)?;
    let mut buf = Vec::new();
    let mut w = ArrowWriter::try_new(&mut buf, schema, None).map_err(err)?;
    w.write(&batch).map_err(err)?;
    w.close().map_err(err)?;
    Ok(buf)
}
