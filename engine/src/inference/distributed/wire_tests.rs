//! Tests of what a worker lets in and how it shares itself: query turns of two
//! coordinators, the token, plans other than `WorkerTaskExec` stages, crafted
//! and random requests (the worker never panics and keeps serving).

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::prelude::{CsvReadOptions, SessionConfig, SessionContext};
use datafusion_distributed::{
    DistributedExt, DistributedLeafExec, NetworkCoalesceExec, SessionStateBuilderExt,
};
use datafusion_proto::physical_plan::{DefaultPhysicalProtoConverter, PhysicalExtensionCodec};

use super::message::AnsweredReply;
use super::message::{decode, encode};
use super::worker::answer;
use super::*;
use crate::error::{EngineError, Result};
use crate::inference::answer_cache::AnswerIdentity;
use crate::inference::backend::{
    AiCall, AiKind, AiRequest, Answer, Answered, Answerer, AskTyped, InferenceBackend,
    QueryBackend, QueryStart, test_call, test_requests,
};

/// Answers by length, and fails a question of an operator other than the one
/// its query started with: two coordinators' queries mixed on it show.
#[derive(Default)]
struct OneQueryAtATime {
    /// Operator ids of the started query.
    started: Mutex<Vec<String>>,
    /// How often it was cancelled.
    cancels: AtomicUsize,
}

impl InferenceBackend for OneQueryAtATime {
    fn name(&self) -> &str {
        "model"
    }
    fn begin(self: Arc<Self>, start: QueryStart) -> Result<Arc<dyn QueryBackend>> {
        *self.started.lock().unwrap() = start.calls.iter().map(|c| c.op_id.clone()).collect();
        Ok(Arc::new(OneQuery(self)))
    }
}

/// A query on [`OneQueryAtATime`].
struct OneQuery(Arc<OneQueryAtATime>);

impl QueryBackend for OneQuery {
    fn answer(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Answered> {
        if call.kind.is_decision() {
            let started = self.0.started.lock().unwrap().clone();
            if !started.contains(&call.op_id) {
                return Err(EngineError::Inference(format!(
                    "{} asked during the query of {started:?}",
                    call.op_id
                )));
            }
            // A batch takes a while, so that two coordinators overlap.
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(Answered::free(super::tests::answers_by_length(
            call, requests,
        )))
    }
    fn cancel(&self) {
        self.0.cancels.fetch_add(1, Ordering::SeqCst);
    }
}

fn identity() -> AnswerIdentity {
    AnswerIdentity {
        model: "tiny".into(),
        weights_sha256: "ab".repeat(32),
        tokenizer_sha256: "cd".repeat(32),
        dtype: "f32".into(),
        prompt_format: String::new(),
    }
}

fn filter(op: &str) -> AiCall {
    AiCall {
        op_id: op.into(),
        ..test_call(AiKind::Filter, "Is {0} even?", &[])
    }
}

fn texts(n: usize, salt: usize) -> Vec<(String, String)> {
    (0..n)
        .map(|i| (format!("{salt}-{i}"), "x".repeat(3 + i * 5 + salt)))
        .collect()
}

fn by_length(docs: &[(String, String)]) -> Vec<bool> {
    docs.iter().map(|(_, t)| t.len() % 2 == 0).collect()
}

fn answered_by_length(docs: &[(String, String)]) -> WorkerReply {
    WorkerReply::Answered(Box::new(AnsweredReply {
        answers: by_length(docs).into_iter().map(Answer::Bool).collect(),
        work: Default::default(),
        query_work: Default::default(),
    }))
}

fn task(query: u64, message: WorkerMessage) -> WorkerTask {
    WorkerTask {
        query: Some(query),
        message,
    }
}

fn failed(reply: &WorkerReply) -> &str {
    match reply {
        WorkerReply::Failed(e) => e,
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[test]
fn two_coordinators_queries_take_turns_and_cancel_only_their_own() {
    let backend = Arc::new(OneQueryAtATime::default());
    let served = Arc::new(ServedModel::new(
        backend.clone(),
        identity(),
        Default::default(),
    ));
    let docs = texts(4, 0);
    let wire = WireRequests::new(&test_requests(&docs));
    let decide = |q, op: &str| {
        answer(
            &served,
            task(q, WorkerMessage::Answer(filter(op), wire.clone())),
        )
    };
    let start_in_thread = |q: u64, op: &str| {
        let (served, op) = (served.clone(), op.to_string());
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(answer(
                &served,
                task(
                    q,
                    WorkerMessage::StartQuery {
                        calls: vec![filter(&op)],
                        reuse_earlier_kv: false,
                    },
                ),
            ));
        });
        rx
    };

    assert_eq!(
        answer(
            &served,
            task(
                1,
                WorkerMessage::StartQuery {
                    calls: vec![filter("a")],
                    reuse_earlier_kv: false,
                }
            )
        ),
        WorkerReply::Done
    );
    // B's start waits while A's query is served; B's questions are refused.
    let b_started = start_in_thread(2, "b");
    assert!(b_started.recv_timeout(Duration::from_millis(300)).is_err());
    assert!(failed(&decide(2, "b")).contains("not the query this worker serves"));
    assert_eq!(decide(1, "a"), answered_by_length(&docs));
    // A third coordinator cancels its waiting query: its start gives up, and
    // A's model work is not cancelled.
    let c_started = start_in_thread(3, "c");
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        answer(&served, task(3, WorkerMessage::Cancel)),
        WorkerReply::Done
    );
    let c = c_started.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(failed(&c).contains("cancelled while waiting"), "{c:?}");
    assert_eq!(backend.cancels.load(Ordering::SeqCst), 0);
    // A's own cancel reaches the model.
    answer(&served, task(1, WorkerMessage::Cancel));
    assert_eq!(backend.cancels.load(Ordering::SeqCst), 1);
    // A ends: B starts, and now A is the one refused.
    answer(&served, task(1, WorkerMessage::EndQuery));
    assert_eq!(
        b_started.recv_timeout(Duration::from_secs(10)).unwrap(),
        WorkerReply::Done
    );
    assert_eq!(decide(2, "b"), answered_by_length(&docs));
    assert!(failed(&decide(1, "a")).contains("not the query"));
    // A message of no query is refused.
    let none = WorkerTask::outside_query(WorkerMessage::WaitStopped);
    assert!(failed(&answer(&served, none)).contains("names no query"));
}

#[test]
fn a_silent_query_loses_the_worker_after_the_idle_timeout() {
    let served = Arc::new(
        ServedModel::new(
            Arc::new(OneQueryAtATime::default()),
            identity(),
            Default::default(),
        )
        .with_query_idle(Duration::from_millis(200)),
    );
    answer(
        &served,
        task(
            1,
            WorkerMessage::StartQuery {
                calls: vec![filter("a")],
                reuse_earlier_kv: false,
            },
        ),
    );
    let started = std::time::Instant::now();
    assert_eq!(
        answer(
            &served,
            task(
                2,
                WorkerMessage::StartQuery {
                    calls: vec![filter("b")],
                    reuse_earlier_kv: false,
                }
            )
        ),
        WorkerReply::Done
    );
    assert!(started.elapsed() >= Duration::from_millis(150));
    let docs = texts(2, 1);
    let wire = WireRequests::new(&test_requests(&docs));
    let late = answer(&served, task(1, WorkerMessage::Answer(filter("a"), wire)));
    assert!(failed(&late).contains("not the query"));
}

#[test]
fn malformed_calls_are_answered_with_errors_not_panics() {
    let served = ServedModel::new(
        Arc::new(OneQueryAtATime::default()),
        identity(),
        Default::default(),
    );
    answer(
        &served,
        task(
            9,
            WorkerMessage::StartQuery {
                calls: vec![],
                reuse_earlier_kv: false,
            },
        ),
    );
    let one = WireRequests {
        docs: vec![WireDoc {
            id: "1".into(),
            text: "t".into(),
        }],
        requests: vec![(0, None)],
    };
    let classify = AiCall {
        labels: vec![],
        ..test_call(AiKind::Classify, "Which is {0}?", &["a"])
    };
    let join = test_call(AiKind::Join, "Is {0} like {1}?", &[]);
    let described = AiCall {
        descriptions: vec!["x".into(); 3],
        ..test_call(AiKind::Classify, "Which is {0}?", &["a", "b"])
    };
    for (message, why) in [
        (
            WorkerMessage::Answer(classify, one.clone()),
            "with 0 label(s)",
        ),
        (
            WorkerMessage::Answer(join, one.clone()),
            "without a partner",
        ),
        (
            WorkerMessage::Answer(described, one),
            "3 label descriptions",
        ),
    ] {
        let reply = answer(&served, task(9, message));
        assert!(failed(&reply).contains(why), "{reply:?}");
    }
}

/// A coordinator's `RemoteWorker`s on one loopback worker.
fn start(backend: Arc<dyn InferenceBackend>, token: Option<&str>) -> LoopbackWorker {
    LoopbackWorker::start_with(
        ServedModel::new(backend, identity(), Default::default()),
        ServeOptions {
            token: token.map(String::from),
            tls: None,
        },
    )
    .unwrap()
}

#[test]
fn two_coordinators_at_once_on_one_worker_each_get_their_own_answers() {
    let server = start(Arc::new(OneQueryAtATime::default()), None);
    let addr = server.addr().to_string();
    let coordinator = |name: &'static str, salt: usize| {
        let addr = addr.clone();
        std::thread::spawn(move || -> std::result::Result<(), String> {
            let worker = Arc::new(RemoteWorker::connect(&addr).map_err(|e| e.to_string())?);
            for round in 0..3 {
                let op = format!("{name}-{round}");
                let query = worker
                    .clone()
                    .begin(QueryStart::one(&filter(&op)))
                    .map_err(|e| e.to_string())?;
                for batch in 0..4 {
                    let docs = texts(5 + batch, salt + batch);
                    let got = query
                        .decide(&filter(&op), &test_requests(&docs))
                        .map_err(|e| e.to_string())?;
                    if got != by_length(&docs) {
                        return Err(format!("{op}: wrong answers"));
                    }
                }
                drop(query);
            }
            Ok(())
        })
    };
    let (a, b) = (coordinator("a", 0), coordinator("b", 7));
    assert_eq!(a.join().unwrap(), Ok(()));
    assert_eq!(b.join().unwrap(), Ok(()));
}

#[test]
fn a_worker_with_a_token_refuses_calls_without_it() {
    let server = start(Arc::new(OneQueryAtATime::default()), Some("s3cret-token"));
    let addr = server.addr().to_string();
    let with = |token: Option<&str>| {
        RemoteWorker::connect_with(
            &addr,
            &ConnectOptions {
                token: token.map(String::from),
                tls_ca: None,
                ..Default::default()
            },
        )
    };
    for wrong in [None, Some("s3cret"), Some("s3cret-token2")] {
        let err = with(wrong).err().unwrap().to_string();
        assert!(
            err.contains("token") && err.contains(&addr),
            "{wrong:?}: {err}"
        );
    }
    let worker = Arc::new(with(Some("s3cret-token")).unwrap())
        .begin(QueryStart::one(&filter("a")))
        .unwrap();
    let docs = texts(3, 2);
    assert_eq!(
        worker.decide(&filter("a"), &test_requests(&docs)).unwrap(),
        by_length(&docs)
    );
}

/// A table whose scan is a prepared plan.
#[derive(Debug)]
struct PlanTable(Arc<dyn ExecutionPlan>);

#[async_trait::async_trait]
impl datafusion::datasource::TableProvider for PlanTable {
    fn schema(&self) -> datafusion::arrow::datatypes::SchemaRef {
        self.0.schema()
    }
    fn table_type(&self) -> datafusion::datasource::TableType {
        datafusion::datasource::TableType::Temporary
    }
    async fn scan(
        &self,
        _state: &dyn datafusion::catalog::Session,
        _projection: Option<&Vec<usize>>,
        _filters: &[datafusion::logical_expr::Expr],
        _limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        Ok(self.0.clone())
    }
}

/// A coordinator-like session whose every stage goes to the worker at
/// `addr`, running `leaf` in a two-task stage there as `RemoteWorker` runs
/// `WorkerTaskExec`s: the number of rows, or the error.
async fn run_on_worker(
    addr: &str,
    leaf: Arc<dyn ExecutionPlan>,
) -> std::result::Result<usize, String> {
    struct One(url::Url);
    impl datafusion_distributed::WorkerResolver for One {
        fn get_urls(&self) -> datafusion::error::Result<Vec<url::Url>> {
            Ok(vec![self.0.clone()])
        }
    }
    let url = worker_url(addr).unwrap();
    let state = datafusion::execution::SessionStateBuilder::new()
        .with_default_features()
        .with_physical_optimizer_rules(vec![])
        .with_config(SessionConfig::new().with_target_partitions(1))
        .with_distributed_worker_resolver(One(url))
        .with_distributed_user_codec(WorkerTaskCodec)
        .with_distributed_metrics_collection(false)
        .unwrap()
        .with_distributed_planner()
        .build();
    let ctx = SessionContext::from(state);
    let tasks = DistributedLeafExec::try_new(leaf.clone(), [leaf.clone(), leaf])
        .map_err(|e| e.to_string())?;
    let stage = NetworkCoalesceExec::try_new(Arc::new(tasks), 2, 1).map_err(|e| e.to_string())?;
    let plan = Arc::new(CoalescePartitionsExec::new(Arc::new(stage)));
    let batches = ctx
        .read_table(Arc::new(PlanTable(plan)))
        .map_err(|e| e.to_string())?
        .collect()
        .await
        .map_err(|e| format!("{e:?}"))?;
    Ok(batches.iter().map(|b| b.num_rows()).sum())
}

#[test]
fn file_scans_and_sinks_sent_to_a_worker_are_refused_reading_and_writing_nothing() {
    let server = start(Arc::new(OneQueryAtATime::default()), None);
    let addr = server.addr().to_string();
    let dir = tempfile::tempdir().unwrap();
    let canary = dir.path().join("canary.csv");
    std::fs::write(&canary, "secret\ncanary-7f3a\n").unwrap();
    let written = dir.path().join("written");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let local = SessionContext::new();
        local
            .register_csv("canary", canary.to_str().unwrap(), CsvReadOptions::new())
            .await
            .unwrap();
        let scan = local
            .sql("SELECT * FROM canary")
            .await
            .unwrap()
            .create_physical_plan()
            .await
            .unwrap();
        let err = run_on_worker(&addr, scan).await.unwrap_err();
        assert!(
            err.contains("plan node CsvScan is not served") && !err.contains("canary-7f3a"),
            "{err}"
        );
        let sink = local
            .sql(&format!(
                "COPY (SELECT 'canary-7f3a' AS a) TO '{}' STORED AS CSV",
                written.display()
            ))
            .await
            .unwrap()
            .create_physical_plan()
            .await
            .unwrap();
        let err = run_on_worker(&addr, sink).await.unwrap_err();
        assert!(err.contains("is not served"), "{err}");
    });
    assert!(!written.exists(), "the worker wrote {}", written.display());
    // The worker still serves aisql's own stages.
    let worker = Arc::new(RemoteWorker::connect(&addr).unwrap())
        .begin(QueryStart::one(&filter("a")))
        .unwrap();
    let docs = texts(2, 3);
    assert_eq!(
        worker.decide(&filter("a"), &test_requests(&docs)).unwrap(),
        by_length(&docs)
    );
}

/// Sends one raw gRPC request (`message` framed) to `addr`: the status code
/// and message the worker answers with before any data.
async fn raw_call(addr: &str, path: &str, framed: Vec<u8>) -> (String, String) {
    use http_body_util::Full;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let request = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(tonic::body::Body::new(Full::new(bytes::Bytes::from(
            framed,
        ))))
        .unwrap();
    let response = tower::ServiceExt::oneshot(channel, request).await.unwrap();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).to_string())
            .unwrap_or_default()
    };
    (header("grpc-status"), header("grpc-message"))
}

fn framed(message: &[u8]) -> Vec<u8> {
    let mut out = vec![0];
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// A length-delimited protobuf field.
fn field(tag: u32, bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    prost::encoding::bytes::encode(tag, &bytes.to_vec(), &mut out);
    out
}

/// A varint protobuf field.
fn number(tag: u32, v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    prost::encoding::uint64::encode(tag, &v, &mut out);
    out
}

fn task_key(task_number: u64) -> Vec<u8> {
    [field(1, &[7; 16]), number(2, 1), number(3, task_number)].concat()
}

/// An `ExecuteTaskRequest` for partitions `start..end` of task 0.
fn execute_task(start: u64, end: u64) -> Vec<u8> {
    [
        field(1, &task_key(0)),
        number(2, start),
        number(3, end),
        field(6, &[]),
    ]
    .concat()
}

/// A `CoordinatorToWorkerMsg` setting `plan` for task `task` of `count`.
fn set_plan(task: u64, count: u64, plan: &[u8]) -> Vec<u8> {
    let set = [
        field(1, &task_key(task)),
        number(2, count),
        field(3, plan),
        field(5, b"http://127.0.0.1:1/"),
    ]
    .concat();
    field(1, &set)
}

/// A WorkerTaskExec plan as the coordinator encodes it.
fn worker_task_plan() -> Vec<u8> {
    let plan: Arc<dyn ExecutionPlan> = Arc::new(WorkerTaskExec::new(WorkerTask::outside_query(
        WorkerMessage::Hello,
    )));
    datafusion_proto::bytes::physical_plan_to_bytes_with_extension_codec(plan, &WorkerTaskCodec)
        .unwrap()
        .to_vec()
}

#[test]
fn crafted_requests_are_refused_before_the_service_and_the_worker_keeps_serving() {
    let server = start(Arc::new(OneQueryAtATime::default()), None);
    let addr = server.addr().to_string();
    const EXECUTE: &str = "/worker.WorkerService/ExecuteTask";
    const CHANNEL: &str = "/worker.WorkerService/CoordinatorChannel";
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        // wire_bigrange: a partition range of 2^40 once allocated 2^40 streams.
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            (
                EXECUTE,
                framed(&execute_task(0, 1 << 40)),
                "partition range",
            ),
            (
                EXECUTE,
                framed(&execute_task(u64::MAX, 0)),
                "partition range",
            ),
            (
                CHANNEL,
                framed(&set_plan(0, u64::MAX, &worker_task_plan())),
                "task count",
            ),
            (
                CHANNEL,
                framed(&set_plan(1 << 50, 2, &worker_task_plan())),
                "task 1125899906842624",
            ),
            (
                CHANNEL,
                framed(&set_plan(0, 2, b"\xff\xff\xff")),
                "unreadable plan",
            ),
            (CHANNEL, framed(b"\x0a\xff\xff\xff\xff\x0f"), "unreadable"),
            (EXECUTE, vec![0, 0xff, 0xff, 0xff, 0xff], "limit"),
            (EXECUTE, vec![1, 0, 0, 0, 1, 0], "compressed"),
        ];
        for (path, body, why) in cases {
            let (status, message) = raw_call(&addr, path, body).await;
            assert_ne!(status, "0", "{why}: {message}");
            assert!(!status.is_empty(), "{why}: no status");
            let message = percent_decode(&message);
            assert!(message.contains(why), "{why}: {status} {message}");
        }
    });
    let worker = Arc::new(RemoteWorker::connect(&addr).unwrap())
        .begin(QueryStart::one(&filter("a")))
        .unwrap();
    let docs = texts(2, 4);
    assert_eq!(
        worker.decide(&filter("a"), &test_requests(&docs)).unwrap(),
        by_length(&docs)
    );
}

/// gRPC's percent-encoding of status messages, undone.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&text[i + 1..i + 3], 16)
        {
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).to_string()
}

/// A small deterministic generator for the fuzz-style test.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// `seed` edited a few times: bytes flipped, inserted, dropped, cut, or a huge
/// varint spliced in.
fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut out = seed.to_vec();
    for _ in 0..=rng.below(4) {
        let at = rng.below(out.len() + 1);
        match rng.below(6) {
            0 if !out.is_empty() => {
                let i = at.min(out.len() - 1);
                out[i] ^= 1 << rng.below(8);
            }
            1 => out.insert(at, rng.next() as u8),
            2 if at < out.len() => {
                out.remove(at);
            }
            3 => out.truncate(at),
            4 => {
                let huge = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
                out.splice(at..at, huge);
            }
            _ => {
                let digits = ["18446744073709551615", "4294967296", "-1", "1e400"];
                let d = digits[rng.below(digits.len())].as_bytes();
                out.splice(at..at, d.iter().copied());
            }
        }
    }
    out
}

#[test]
fn worker_decoding_never_panics_on_random_or_mutated_bytes() {
    let served = ServedModel::new(
        Arc::new(OneQueryAtATime::default()),
        identity(),
        Default::default(),
    );
    let ctx = SessionContext::new().task_ctx();
    let docs = texts(3, 5);
    let seeds: Vec<Vec<u8>> = vec![
        encode(&task(
            7,
            WorkerMessage::Answer(filter("a"), WireRequests::new(&test_requests(&docs))),
        )),
        encode(&task(
            7,
            WorkerMessage::Answer(
                test_call(AiKind::Classify, "Which is {0}?", &["x", "y"]),
                WireRequests::new(&test_requests(&docs)),
            ),
        )),
        encode(&task(
            7,
            WorkerMessage::StartQuery {
                calls: vec![filter("a")],
                reuse_earlier_kv: false,
            },
        )),
        encode(&WorkerTask::outside_query(WorkerMessage::Hello)),
        execute_task(0, 1),
        set_plan(0, 2, &worker_task_plan()),
        worker_task_plan(),
    ];
    let mut rng = Rng(0x5eed_a15c_0de5);
    let converter = DefaultPhysicalProtoConverter {};
    for i in 0..4000 {
        let input = if i % 10 == 0 {
            (0..rng.below(64)).map(|_| rng.next() as u8).collect()
        } else {
            let seed = &seeds[rng.below(seeds.len())];
            mutate(&mut rng, seed)
        };
        let _ = WorkerTaskCodec.try_decode(&input, &[], &ctx, &converter);
        let _ = check_request(GuardedMethod::ExecuteTask, &input);
        let _ = check_request(GuardedMethod::CoordinatorChannel, &input);
        if let Ok(mut t) = decode::<WorkerTask>(&input, "fuzz input") {
            // Whatever the task says, it is answered (or refused) in the one
            // served query, without a panic.
            answer(
                &served,
                task(
                    7,
                    WorkerMessage::StartQuery {
                        calls: vec![],
                        reuse_earlier_kv: false,
                    },
                ),
            );
            t.query = Some(7);
            let _ = answer(&served, t);
        }
    }
    // A leaf with inputs is refused too.
    let leaf: Arc<dyn ExecutionPlan> = Arc::new(WorkerTaskExec::new(WorkerTask::outside_query(
        WorkerMessage::Nothing,
    )));
    let err = WorkerTaskCodec
        .try_decode(
            &encode(&WorkerTask::outside_query(WorkerMessage::Hello)),
            &[leaf],
            &ctx,
            &converter,
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("leaf"), "{err}");
}

#[test]
fn a_decoded_plan_runs_only_if_it_is_a_worker_task() {
    let leaf: Arc<dyn ExecutionPlan> = Arc::new(WorkerTaskExec::new(WorkerTask::outside_query(
        WorkerMessage::Nothing,
    )));
    assert!(check_worker_plan(&leaf).is_ok());
    // A network stage decoded on the worker would connect to other hosts.
    let tasks = DistributedLeafExec::try_new(leaf.clone(), [leaf.clone(), leaf]).unwrap();
    let stage: Arc<dyn ExecutionPlan> =
        Arc::new(NetworkCoalesceExec::try_new(Arc::new(tasks), 2, 1).unwrap());
    let err = check_worker_plan(&stage).unwrap_err().to_string();
    assert!(
        err.contains("plan node NetworkCoalesceExec is not served"),
        "{err}"
    );
    let empty: Arc<dyn ExecutionPlan> = Arc::new(datafusion::physical_plan::empty::EmptyExec::new(
        reply_schema(),
    ));
    let err = check_worker_plan(&empty).unwrap_err().to_string();
    assert!(err.contains("EmptyExec"), "{err}");
}

#[test]
fn a_tls_worker_is_reached_over_https_with_its_ca_and_token_only() {
    let cert = include_bytes!("testdata/worker-cert.pem").to_vec();
    let key = include_bytes!("testdata/worker-key.pem").to_vec();
    let ca = include_bytes!("testdata/ca.pem").to_vec();
    let server = LoopbackWorker::start_with(
        ServedModel::new(
            Arc::new(OneQueryAtATime::default()),
            identity(),
            Default::default(),
        ),
        ServeOptions {
            token: Some("t0ken".into()),
            tls: Some((cert, key)),
        },
    )
    .unwrap();
    let https = format!("https://{}", server.addr());
    let with = |addr: &str, token: Option<&str>, ca: Option<&[u8]>| {
        RemoteWorker::connect_with(
            addr,
            &ConnectOptions {
                token: token.map(String::from),
                tls_ca: ca.map(<[u8]>::to_vec),
                ..Default::default()
            },
        )
    };
    let worker = Arc::new(with(&https, Some("t0ken"), Some(&ca)).unwrap())
        .begin(QueryStart::one(&filter("a")))
        .unwrap();
    let docs = texts(4, 6);
    assert_eq!(
        worker.decide(&filter("a"), &test_requests(&docs)).unwrap(),
        by_length(&docs)
    );
    let err = with(&https, Some("t0ken"), None).err().unwrap().to_string();
    assert!(err.contains("--tls-ca"), "{err}");
    let err = with(&https, None, Some(&ca)).err().unwrap().to_string();
    assert!(err.contains("token"), "{err}");
    // Plain HTTP/2 to a TLS worker gets nowhere.
    let plain = with(server.addr(), Some("t0ken"), None)
        .err()
        .unwrap()
        .to_string();
    assert!(plain.contains(server.addr()), "{plain}");
    // A CA that did not sign the worker's certificate is not trusted.
    let cert_as_ca = include_bytes!("testdata/worker-cert.pem");
    assert!(with(&https, Some("t0ken"), Some(cert_as_ca)).is_err());
}

#[test]
fn coordinators_listing_shared_workers_in_other_orders_do_not_wait_on_each_other() {
    let servers = [
        start(Arc::new(OneQueryAtATime::default()), None),
        start(Arc::new(OneQueryAtATime::default()), None),
    ];
    let addrs: Vec<String> = servers.iter().map(|s| s.addr().to_string()).collect();
    let started = std::time::Instant::now();
    let coordinator = |addrs: Vec<String>, name: &'static str| {
        std::thread::spawn(move || -> std::result::Result<(), String> {
            let workers = connect_workers(&addrs).map_err(|e| e.to_string())?;
            let sharded = Arc::new(
                crate::inference::shard::ShardedBackend::try_new(
                    workers
                        .into_iter()
                        .map(|w| Arc::new(w) as Arc<dyn InferenceBackend>)
                        .collect(),
                )
                .map_err(|e| e.to_string())?,
            );
            for round in 0..4 {
                let op = format!("{name}-{round}");
                let query = sharded
                    .clone()
                    .begin(QueryStart::one(&filter(&op)))
                    .map_err(|e| e.to_string())?;
                let docs = texts(6, round);
                let got = query
                    .decide(&filter(&op), &test_requests(&docs))
                    .map_err(|e| e.to_string())?;
                if got != by_length(&docs) {
                    return Err(format!("{op}: wrong answers"));
                }
                drop(query);
            }
            Ok(())
        })
    };
    let reversed: Vec<String> = addrs.iter().rev().cloned().collect();
    let (a, b) = (coordinator(addrs, "a"), coordinator(reversed, "b"));
    assert_eq!(a.join().unwrap(), Ok(()));
    assert_eq!(b.join().unwrap(), Ok(()));
    // Each holding one worker and waiting for the other would last until the
    // idle timeout (120 s) and then fail both.
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
}

/// Answers by length after a pause as long as a model's batch.
struct Slow(Duration);

impl Answerer for Slow {
    fn name(&self) -> &str {
        "model"
    }
    fn answer(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Vec<Answer>> {
        if call.kind.is_decision() {
            std::thread::sleep(self.0);
        }
        Ok(super::tests::answers_by_length(call, requests))
    }
}

/// A TCP relay to a worker that can be frozen: it then passes nothing either
/// way but keeps every connection open, as a stopped worker process does.
struct Relay {
    addr: String,
    frozen: Arc<AtomicBool>,
}

impl Relay {
    fn start(target: &str) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let frozen = Arc::new(AtomicBool::new(false));
        let (target, relay_frozen) = (target.to_string(), frozen.clone());
        std::thread::spawn(move || {
            for inbound in listener.incoming() {
                let (Ok(inbound), Ok(outbound)) = (inbound, std::net::TcpStream::connect(&target))
                else {
                    return;
                };
                let ways = [
                    (inbound.try_clone().unwrap(), outbound.try_clone().unwrap()),
                    (outbound, inbound),
                ];
                for (mut from, mut to) in ways {
                    let frozen = relay_frozen.clone();
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16 * 1024];
                        while let Ok(n @ 1..) = from.read(&mut buf) {
                            while frozen.load(Ordering::SeqCst) {
                                std::thread::sleep(Duration::from_millis(20));
                            }
                            if to.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                    });
                }
            }
        });
        Self { addr, frozen }
    }

    fn freeze(&self, frozen: bool) {
        self.frozen.store(frozen, Ordering::SeqCst);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        // Frozen copies would hold their threads until the process ends.
        self.freeze(false);
    }
}

#[test]
fn keep_alive_lets_a_long_batch_finish_and_a_worker_that_stops_answering_fails_the_call() {
    let server = start(Arc::new(Slow(Duration::from_millis(1500))), None);
    let relay = Relay::start(server.addr());
    let docs = texts(3, 1);
    let ask = |query: &Arc<dyn QueryBackend>| query.decide(&filter("a"), &test_requests(&docs));

    // Pings every 100 ms, each answered within 300 ms while the worker's model
    // spends 1.5 s on the batch.
    let quick_pings = ConnectOptions {
        keep_alive_interval: Duration::from_millis(100),
        keep_alive_timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let worker = Arc::new(RemoteWorker::connect_with(&relay.addr, &quick_pings).unwrap())
        .begin(QueryStart::one(&filter("a")))
        .unwrap();
    assert_eq!(ask(&worker).unwrap(), by_length(&docs));
    // Frozen, the connection stays open and only unanswered pings tell: the
    // call timeout (30 min by default) is far off.
    relay.freeze(true);
    let frozen_at = Instant::now();
    let lost = ask(&worker).unwrap_err().to_string();
    assert!(
        lost.contains(&relay.addr) && lost.contains("keep-alive pings within 0.3 s"),
        "{lost}"
    );
    assert!(frozen_at.elapsed() < Duration::from_secs(10), "{lost}");
    relay.freeze(false);
    // Its query ends without waiting for the lost connection, and the worker
    // serves the next coordinator's at once, not after its idle timeout.
    let ending = Instant::now();
    drop(worker);
    assert!(ending.elapsed() < Duration::from_secs(1));

    // Pings at their defaults: the call timeout is the bound.
    let bounded = ConnectOptions {
        call_timeout: Duration::from_secs(3),
        ..Default::default()
    };
    let connected = Arc::new(RemoteWorker::connect_with(&relay.addr, &bounded).unwrap());
    let starting = Instant::now();
    let worker = connected.begin(QueryStart::one(&filter("a"))).unwrap();
    assert!(starting.elapsed() < Duration::from_secs(30));
    assert_eq!(ask(&worker).unwrap(), by_length(&docs));
    relay.freeze(true);
    let frozen_at = Instant::now();
    let err = ask(&worker).unwrap_err().to_string();
    let waited = frozen_at.elapsed();
    assert!(
        err.contains(&relay.addr) && err.contains("no answer within 3 s (--worker-timeout-s)"),
        "{err}"
    );
    assert!(waited < Duration::from_secs(8), "{waited:?}: {err}");
    // Nothing more is sent to it for this query: ending it does not wait.
    let ending = Instant::now();
    drop(worker);
    assert!(ending.elapsed() < Duration::from_secs(1));
    eprintln!("keep-alive: {lost}\ncall timeout: {err}");
}
