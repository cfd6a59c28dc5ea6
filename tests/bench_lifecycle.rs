//! The benchmark run lifecycle through the library: resuming a crashed run does
//! nothing twice and loses nothing, a query over its timeout is recorded and the run
//! goes on (or stops with fail-fast), a row the model cannot answer is listed in
//! run.json under `--on-row-error null`, and a crafted output is assessed `bad`.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use aisql_bench::driver::{BenchOptions, rescore, run_bench};
use aisql_bench::layout::Dataset;
use aisql_bench::metrics::QueryStatus;
use aisql_bench::metrics::{Reason, Verdict};
use aisql_bench::plans::PlanSource;
use aisql_bench::quailb::oracle::OracleBackend;
use aisql_bench::run_file::{RunFile, RunStatus};
use aisql_engine::inference::backend::{
    AiCall, AiRequest, Answer, Answered, Answerer, InferenceBackend, QueryBackend, QueryStart,
};

/// The oracle, counting queries started and sleeping once in its first answer when asked.
struct TestBackend {
    oracle: OracleBackend,
    started: AtomicUsize,
    sleep_once: AtomicBool,
    sleep: Duration,
}

impl TestBackend {
    fn new(dataset: &Dataset, sleep: Option<Duration>) -> Arc<Self> {
        Arc::new(Self {
            oracle: OracleBackend::new(Arc::new(dataset.load_labels(None).unwrap())),
            started: AtomicUsize::new(0),
            sleep_once: AtomicBool::new(sleep.is_some()),
            sleep: sleep.unwrap_or_default(),
        })
    }

    fn nap(&self) {
        if self.sleep_once.swap(false, Ordering::SeqCst) {
            std::thread::sleep(self.sleep);
        }
    }
}

impl InferenceBackend for TestBackend {
    fn name(&self) -> &str {
        "test-oracle"
    }
    fn begin(self: Arc<Self>, _: QueryStart) -> aisql_engine::Result<Arc<dyn QueryBackend>> {
        self.started.fetch_add(1, Ordering::SeqCst);
        Ok(self)
    }
}

impl QueryBackend for TestBackend {
    fn answer(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> aisql_engine::Result<Answered> {
        self.nap();
        Ok(Answered::free(self.oracle.answer(call, requests)?))
    }
}

fn options(dir: &Path, resume: bool, timeout: Option<Duration>, fail_fast: bool) -> BenchOptions {
    BenchOptions {
        output_dir: dir.to_path_buf(),
        resume,
        timeout,
        fail_fast,
        gpu_count: 1,
        gpu_hourly_rate_usd: None,
        backend_metadata: serde_json::Map::new(),
        plans: PlanSource::Embedded.describe(),
        user_metadata: serde_json::Map::new(),
        format: Default::default(),
        progress: aisql_engine::exec::progress::ProgressMode::Hidden,
        batch_rows: 256,
        memory_limit: aisql_engine::limits::host_memory::default_memory_limit(),
        budget: None,
        on_row_error: Default::default(),
        reuse_earlier_kv: false,
        estimator: None,
    }
}

fn setup() -> (tempfile::TempDir, Dataset) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("quailb");
    aisql_standin::generate(&root, 0.002).unwrap();
    let dataset = Dataset::open(&root, 0.002, None).unwrap();
    // Opening checks manifests only; the runs below read every table.
    dataset.require_all_tables().unwrap();
    (tmp, dataset)
}

fn queries(ids: &[&str]) -> Vec<(String, aisql_bench::quailb::plan::QueryPlan)> {
    let ids: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
    PlanSource::Embedded
        .select(Some(&ids), Default::default())
        .unwrap()
}

const IDS: [&str; 5] = ["IMDB-1", "IMDB-2", "BIO-3", "FEV-10", "AGENT-3"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_after_a_crash_does_nothing_twice_and_loses_nothing() {
    let (tmp, dataset) = setup();
    let dir = tmp.path().join("run");
    let backend = TestBackend::new(&dataset, None);
    let first = run_bench(
        &options(&dir, false, None, false),
        &dataset,
        backend.clone(),
        queries(&IDS),
    )
    .await
    .unwrap();
    assert_eq!(first.status, RunStatus::Complete);
    assert_eq!(backend.started.load(Ordering::SeqCst), 5);

    // Simulate a crash: IMDB-2 was running, BIO-3 had saved outputs but no score,
    // FEV-10 and AGENT-3 never started; the run is still `running`.
    let mut crashed = first.clone();
    crashed.status = RunStatus::Running;
    crashed.finished_at = None;
    for q in &mut crashed.queries {
        match q.id.as_str() {
            "IMDB-2" => {
                q.status = QueryStatus::Running;
                q.metrics = None;
                q.assessment = None;
                q.files = None;
            }
            "BIO-3" => {
                q.status = QueryStatus::Saved;
                q.metrics = None;
                q.assessment = None;
            }
            "FEV-10" | "AGENT-3" => {
                *q = aisql_bench::run_file::QueryRecord::pending(&q.id, &q.definition_hash);
            }
            _ => {}
        }
    }
    crashed.write(&dir).unwrap();
    let imdb1_rows = std::fs::metadata(dir.join("IMDB-1/rows.parquet"))
        .unwrap()
        .modified()
        .unwrap();

    // A second, plain run into the same folder is refused.
    let again = run_bench(
        &options(&dir, false, None, false),
        &dataset,
        backend.clone(),
        queries(&IDS),
    )
    .await;
    assert!(again.unwrap_err().to_string().contains("not empty"));

    let backend = TestBackend::new(&dataset, None);
    let resumed = run_bench(
        &options(&dir, true, None, false),
        &dataset,
        backend.clone(),
        queries(&IDS),
    )
    .await
    .unwrap();
    // Only IMDB-2, FEV-10 and AGENT-3 ran again; BIO-3 was only rescored; IMDB-1 untouched.
    assert_eq!(backend.started.load(Ordering::SeqCst), 3);
    assert_eq!(resumed.status, RunStatus::Complete);
    assert_eq!(
        std::fs::metadata(dir.join("IMDB-1/rows.parquet"))
            .unwrap()
            .modified()
            .unwrap(),
        imdb1_rows
    );
    for (a, b) in first.queries.iter().zip(&resumed.queries) {
        assert_eq!(b.status, QueryStatus::Complete, "{}", b.id);
        let (ma, mb) = (a.metrics.as_ref().unwrap(), b.metrics.as_ref().unwrap());
        assert_eq!(ma.accuracy, mb.accuracy, "{}", a.id);
        assert_eq!(ma.minimum_tokens, mb.minimum_tokens, "{}", a.id);
    }
    let on_disk = RunFile::read(&dir).unwrap();
    assert_eq!(on_disk.status, RunStatus::Complete);
    assert!(on_disk.finished_at.is_some());
    assert_eq!(resumed.metadata["resumed"], 1);

    // A crafted output: IMDB-1 returns nothing → bad, EMPTY_RESULT after `report`.
    let rows = aisql_engine::data::files::read_parquet(&dir.join("IMDB-1/rows.parquet")).unwrap();
    aisql_engine::data::files::write_parquet(&dir.join("IMDB-1/rows.parquet"), &rows.slice(0, 0))
        .unwrap();
    // Not what the run wrote: refused, naming the file.
    let e = rescore(&dir, &dataset).unwrap_err().to_string();
    assert!(e.contains("IMDB-1/rows.parquet has sha256"), "{e}");
    // Recorded as the run's own (as if the engine had returned nothing), it is scored.
    let mut run = RunFile::read(&dir).unwrap();
    let files = run.query_mut("IMDB-1").unwrap().files.as_mut().unwrap();
    files.sha256.insert(
        "IMDB-1/rows.parquet".into(),
        aisql_bench::layout::sha256_file(&dir.join("IMDB-1/rows.parquet")).unwrap(),
    );
    run.write(&dir).unwrap();
    let rescored = rescore(&dir, &dataset).unwrap();
    let q = rescored.query("IMDB-1").unwrap();
    let a = q.assessment.as_ref().unwrap();
    assert_eq!(
        (a.verdict, a.reasons.as_slice()),
        (Verdict::Bad, &[Reason::EmptyResult][..])
    );
    assert_eq!(
        q.metrics
            .as_ref()
            .unwrap()
            .accuracy
            .output_accuracy
            .as_ref()
            .unwrap()
            .recall,
        0.0
    );
    assert!(
        std::fs::read_to_string(dir.join("report.md"))
            .unwrap()
            .contains("EMPTY_RESULT")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_over_its_timeout_is_recorded_and_the_run_goes_on() {
    let (tmp, dataset) = setup();
    let dir = tmp.path().join("run");
    let backend = TestBackend::new(&dataset, Some(Duration::from_secs(3)));
    let ids = ["IMDB-1", "IMDB-11", "FEV-1"];
    let run = run_bench(
        &options(&dir, false, Some(Duration::from_millis(700)), false),
        &dataset,
        backend.clone(),
        queries(&ids),
    )
    .await
    .unwrap();
    assert_eq!(run.status, RunStatus::Failed);
    let q = &run.queries[0];
    assert_eq!(q.status, QueryStatus::Timeout);
    assert!(
        q.error.as_deref().unwrap().starts_with("TimeoutError: "),
        "{:?}",
        q.error
    );
    assert!(q.metrics.is_none());
    for q in &run.queries[1..] {
        assert_eq!(q.status, QueryStatus::Complete, "{}: {:?}", q.id, q.error);
    }
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(report.contains("## Errors") && report.contains("- IMDB-1: TimeoutError"));
    assert!(report.contains("Status: failed"));
    let m = aisql_engine::data::files::read_parquet(&dir.join("measurements.parquet")).unwrap();
    assert_eq!(m.num_rows(), 2);

    // With fail-fast the run stops at the timeout; the rest stay pending.
    let dir = tmp.path().join("run-ff");
    let backend = TestBackend::new(&dataset, Some(Duration::from_secs(3)));
    let run = run_bench(
        &options(&dir, false, Some(Duration::from_millis(700)), true),
        &dataset,
        backend,
        queries(&ids),
    )
    .await
    .unwrap();
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(run.queries[0].status, QueryStatus::Timeout);
    assert!(
        run.queries[1..]
            .iter()
            .all(|q| q.status == QueryStatus::Pending)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_with_another_model_dtype_or_dataset_is_refused() {
    let (tmp, dataset) = setup();
    let dir = tmp.path().join("run");
    let with = |model: &str, dtype: &str| {
        let mut o = options(&dir, false, None, false);
        o.backend_metadata.insert("model".into(), model.into());
        o.backend_metadata.insert("dtype".into(), dtype.into());
        o
    };
    let backend = TestBackend::new(&dataset, None);
    run_bench(
        &with("tiny", "f32"),
        &dataset,
        backend.clone(),
        queries(&["IMDB-1"]),
    )
    .await
    .unwrap();
    for (model, dtype, differs) in [("tiny", "bf16", "dtype"), ("Qwen/Qwen3-4B", "f32", "model")] {
        let mut o = with(model, dtype);
        o.resume = true;
        let e = run_bench(&o, &dataset, backend.clone(), queries(&["IMDB-1"]))
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains(differs) && e.contains("resume"), "{e}");
    }
    // Another dataset (another scale factor, so another corpus).
    let other_root = tmp.path().join("other");
    aisql_standin::generate(&other_root, 0.001).unwrap();
    let other = Dataset::open(&other_root, 0.001, None).unwrap();
    let mut o = with("tiny", "f32");
    o.resume = true;
    let e = run_bench(&o, &other, backend.clone(), queries(&["IMDB-1"]))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("corpus") && e.contains(&dataset.corpus_id),
        "{e}"
    );
    // The same settings resume.
    let run = run_bench(&o, &dataset, backend, queries(&["IMDB-1"]))
        .await
        .unwrap();
    assert_eq!(run.metadata["resumed"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_reruns_a_kept_query_whose_files_are_damaged() {
    let (tmp, dataset) = setup();
    let dir = tmp.path().join("run");
    let ids = ["IMDB-1", "IMDB-2", "FEV-1"];
    let first = run_bench(
        &options(&dir, false, None, false),
        &dataset,
        TestBackend::new(&dataset, None),
        queries(&ids),
    )
    .await
    .unwrap();
    let files = first.query("IMDB-1").unwrap().files.clone().unwrap();
    assert_eq!(files.sha256.len(), files.paths().len(), "{files:?}");
    // Damage IMDB-1's rows (one byte) and delete IMDB-2's join answers.
    let rows = dir.join(&files.rows);
    let mut bytes = std::fs::read(&rows).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&rows, &bytes).unwrap();
    let joins = &first.query("IMDB-2").unwrap().files.as_ref().unwrap().joins;
    std::fs::remove_file(dir.join(&joins[0].path)).unwrap();

    let backend = TestBackend::new(&dataset, None);
    let resumed = run_bench(
        &options(&dir, true, None, false),
        &dataset,
        backend.clone(),
        queries(&ids),
    )
    .await
    .unwrap();
    // Both damaged queries ran again; FEV-1 was kept.
    assert_eq!(backend.started.load(Ordering::SeqCst), 2);
    assert_eq!(resumed.status, RunStatus::Complete);
    let again = resumed.query("IMDB-1").unwrap().files.clone().unwrap();
    assert_eq!(again.sha256, files.sha256, "the rerun wrote the same files");
    assert!(dir.join(&joins[0].path).exists());
}

/// The oracle, but the first row it is asked about fails, as a prompt past
/// the model's context does.
struct OneBadRow {
    oracle: OracleBackend,
    bad: std::sync::Mutex<Option<String>>,
}

impl Answerer for OneBadRow {
    fn name(&self) -> &str {
        "one-bad-row"
    }
    fn answer(
        &self,
        call: &AiCall,
        requests: &[AiRequest<'_>],
    ) -> aisql_engine::Result<Vec<Answer>> {
        let mut answers = self.oracle.answer(call, requests)?;
        let mut bad = self.bad.lock().unwrap();
        let bad = bad.get_or_insert_with(|| requests[0].anchor.id.to_string());
        for (a, r) in answers.iter_mut().zip(requests) {
            if r.anchor.id == bad.as_str() {
                *a = Answer::Failed(format!("{}: row {bad} is too long", call.op_id).into());
            }
        }
        Ok(answers)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_row_is_listed_in_run_json_or_fails_its_query() {
    let (tmp, dataset) = setup();
    let backend = || {
        Arc::new(OneBadRow {
            oracle: OracleBackend::new(Arc::new(dataset.load_labels(None).unwrap())),
            bad: Default::default(),
        })
    };
    let dir = tmp.path().join("null");
    let opts = BenchOptions {
        on_row_error: aisql_engine::exec::coverage::OnRowError::Null { max_ratio: 1.0 },
        ..options(&dir, false, None, false)
    };
    let run = run_bench(&opts, &dataset, backend(), queries(&["IMDB-1"]))
        .await
        .unwrap();
    let q = &run.queries[0];
    assert_eq!(q.status, QueryStatus::Complete, "{:?}", q.error);
    let errors = &q
        .measurements
        .as_ref()
        .unwrap()
        .row_errors
        .as_ref()
        .unwrap()
        .0;
    let op = &errors["operators"][0];
    assert_eq!(op["id"], "filter-1", "{errors}");
    assert_eq!(op["rows_failed"], 1, "{errors}");
    let reason = op["failures"][0]["reason"].as_str().unwrap();
    assert!(reason.starts_with("filter-1: row ") && reason.ends_with(" is too long"));
    // run.json on disk says the same.
    let written = RunFile::read(&dir).unwrap();
    assert_eq!(
        written.queries[0]
            .measurements
            .as_ref()
            .unwrap()
            .row_errors
            .as_ref()
            .unwrap()
            .0,
        *errors
    );

    // Under the default policy the query fails naming the row; the run goes on.
    let dir = tmp.path().join("fail");
    let run = run_bench(
        &options(&dir, false, None, false),
        &dataset,
        backend(),
        queries(&["IMDB-1", "FEV-1"]),
    )
    .await
    .unwrap();
    assert_eq!(run.queries[0].status, QueryStatus::Failed);
    let error = run.queries[0].error.as_deref().unwrap();
    assert!(error.contains("is too long"), "{error}");
    assert_eq!(run.queries[1].status, QueryStatus::Complete);
}
