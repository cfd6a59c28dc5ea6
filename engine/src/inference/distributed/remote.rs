//! The coordinator side: [`RemoteWorker`], an
//! [`InferenceBackend`] whose every call runs as a distributed DataFusion stage
//! on one `aisql worker`, and [`connect_workers`], which says hello to a list of
//! them and refuses a set that does not serve one model.
//!
//! Each call is one plan: `NetworkCoalesceExec` over a two-task stage of
//! [`WorkerTaskExec`]s (a `DistributedLeafExec`, so each task is sent only its
//! own). Task 0 carries the call, task 1 [`WorkerMessage::Nothing`]:
//! datafusion-distributed runs a one-task stage under a one-task consumer
//! locally, and this work must run where the model is. The session's worker
//! resolver knows only this worker's URL, so both tasks are routed there.
//! Which documents go to which worker is decided above, by
//! [`ShardedBackend`](crate::inference::shard::ShardedBackend)'s router.
//!
//! Every call carries the coordinator's query id (a fresh random one per
//! [`InferenceBackend::begin`]), and dropping the query's object (or the
//! worker) tells the worker the query is over, so a worker shared
//! by several coordinators serves their queries one after the other. Every gRPC
//! call carries the worker token ([`ConnectOptions`]); `https://` workers are
//! reached over TLS with the given CA.
//!
//! A query's budget ([`crate::limits::spend`]) is kept here, at the coordinator: it
//! is checked before each call and charged the worker's fresh tokens and the
//! call's time after it, so a remote worker overshoots by at most one call
//! (one batch's share), not one forward batch.
//!
//! A worker that stops answering without closing its connection (a stopped
//! process, a host gone from the network) is caught two ways: HTTP/2
//! keep-alive pings, which the worker's transport answers even while its model
//! computes, close a connection whose pings go unanswered; and every call but
//! a query's start waits at most the per-call timeout
//! ([`ConnectOptions::call_timeout`], `--worker-timeout-s`), the user's bound
//! on one batch. A query's start is bounded by keep-alive alone: it may wait
//! for another coordinator's whole query.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, LazyLock, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::array::{Array, BinaryArray};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::Session;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::SessionStateBuilder;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_distributed::grpc::{BoxCloneSyncChannel, create_worker_client};
use datafusion_distributed::{
    ChannelResolver, DistributedExt, DistributedLeafExec, NetworkCoalesceExec,
    SessionStateBuilderExt, WorkerChannel, WorkerResolver,
};
use url::Url;

use super::codec::WorkerTaskCodec;
use super::guard::TOKEN_HEADER;
use super::message::{
    PROTOCOL, QueryId, WireDoc, WireRequests, WorkerHello, WorkerMessage, WorkerReply, WorkerTask,
    decode,
};
use super::task::{REPLY_COLUMN, WorkerTaskExec, reply_schema};
use crate::error::{EngineError, Result};
use crate::inference::backend::{
    AiCall, AiRequest, Answer, Answered, Doc, InferenceBackend, QueryBackend, QueryStart,
    check_answers,
};
use crate::inference::work::Work;
use crate::limits::spend::Spend;

/// How long a worker may take to answer hello before it counts as unreachable.
const HELLO_TIMEOUT: Duration = Duration::from_secs(20);

/// The default bound on one call ([`ConnectOptions::call_timeout`]): longer
/// than a batch of 256 long documents takes a model on a GPU.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(1800);

/// A keep-alive ping is sent after this long without a frame from the worker.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);

/// A ping unanswered for this long closes the connection: generous, since a
/// worker's transport answers pings while its model computes, but may share
/// the CPU with it.
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// The runtime every worker connection lives on. Callers of the backend are
/// blocking threads; a process-wide runtime is never dropped inside one.
static WIRE: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("aisql-wire")
        .enable_all()
        .build()
        .expect("starting the worker connection runtime")
});

/// `addr` as a worker URL: `HOST:PORT` or `http://HOST:PORT` (plain), or
/// `https://HOST:PORT` (TLS).
pub fn worker_url(addr: &str) -> Result<Url> {
    let bad = |why: String| EngineError::Inference(format!("worker address {addr:?}: {why}"));
    let text = if addr.contains("://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    };
    let url = Url::parse(&text).map_err(|e| bad(e.to_string()))?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(bad(format!(
            "scheme {:?}: a worker is http:// (plain gRPC) or https:// (TLS)",
            url.scheme()
        )));
    }
    if url.host_str().is_none_or(str::is_empty) || url.port().is_none() {
        return Err(bad("give HOST:PORT".into()));
    }
    if url.path() != "/" && !url.path().is_empty() {
        return Err(bad(format!("unexpected path {:?}", url.path())));
    }
    Ok(url)
}

/// A worker resolver that knows one worker.
struct OneWorker(Url);

impl WorkerResolver for OneWorker {
    fn get_urls(&self) -> DfResult<Vec<Url>> {
        Ok(vec![self.0.clone()])
    }
}

/// How a coordinator reaches its workers.
#[derive(Clone)]
pub struct ConnectOptions {
    /// The shared worker token, sent on every call.
    pub token: Option<String>,
    /// PEM certificates of the CA that signed `https://` workers' certificates.
    pub tls_ca: Option<Vec<u8>>,
    /// The longest a call may wait for its answer, a batch's included (a
    /// query's start excepted), before the worker counts as hung.
    pub call_timeout: Duration,
    /// HTTP/2 keep-alive: a ping after this long without a frame ...
    pub keep_alive_interval: Duration,
    /// ... unanswered for this long closes the connection.
    pub keep_alive_timeout: Duration,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            token: None,
            tls_ca: None,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            keep_alive_interval: KEEP_ALIVE_INTERVAL,
            keep_alive_timeout: KEEP_ALIVE_TIMEOUT,
        }
    }
}

impl std::fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectOptions")
            .field("token", &self.token.as_ref().map(|_| ".."))
            .field("tls_ca", &self.tls_ca.is_some())
            .field("call_timeout", &self.call_timeout)
            .field("keep_alive_interval", &self.keep_alive_interval)
            .field("keep_alive_timeout", &self.keep_alive_timeout)
            .finish()
    }
}

/// The channel to one worker: TLS for `https://`, the token on every call.
/// Made on first use and kept (tonic reconnects it as needed).
struct WorkerChannels {
    /// The one worker.
    url: Url,
    /// Token and CA.
    options: ConnectOptions,
    /// The channel, once made.
    channel: tokio::sync::OnceCell<BoxCloneSyncChannel>,
}

impl WorkerChannels {
    async fn connect(&self) -> DfResult<BoxCloneSyncChannel> {
        let failed = |e: String| DataFusionError::Execution(e);
        let mut endpoint = tonic::transport::Endpoint::from_shared(self.url.to_string())
            .map_err(|e| failed(format!("worker URL {}: {e}", self.url)))?
            .connect_timeout(HELLO_TIMEOUT)
            .http2_keep_alive_interval(self.options.keep_alive_interval)
            .keep_alive_timeout(self.options.keep_alive_timeout);
        if self.url.scheme() == "https" {
            let Some(ca) = &self.options.tls_ca else {
                return Err(failed(format!(
                    "worker {} is https://: give the CA of its certificate (--tls-ca)",
                    self.url
                )));
            };
            let mut tls = tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(ca));
            if let Some(host) = self.url.host_str() {
                tls = tls.domain_name(host.trim_start_matches('[').trim_end_matches(']'));
            }
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|e| failed(format!("TLS for worker {}: {e}", self.url)))?;
        }
        let header = match &self.options.token {
            None => None,
            Some(t) => {
                let mut value = http::HeaderValue::from_str(t).map_err(|_| {
                    failed("the worker token holds characters a header cannot carry".into())
                })?;
                value.set_sensitive(true);
                Some(value)
            }
        };
        let channel = endpoint.connect().await.map_err(|e| {
            let source = std::error::Error::source(&e)
                .map(|s| format!(": {s}"))
                .unwrap_or_default();
            failed(format!("connecting to worker {}: {e}{source}", self.url))
        })?;
        let with_token = tower::ServiceExt::map_request(
            channel,
            move |mut request: http::Request<tonic::body::Body>| {
                if let Some(value) = &header {
                    request.headers_mut().insert(TOKEN_HEADER, value.clone());
                }
                request
            },
        );
        Ok(BoxCloneSyncChannel::new(with_token))
    }
}

#[async_trait]
impl ChannelResolver for WorkerChannels {
    async fn get_worker_client_for_url(&self, url: &Url) -> DfResult<Box<dyn WorkerChannel>> {
        if url != &self.url {
            return Err(DataFusionError::Internal(format!(
                "a stage routed to {url}, but this session reaches only {}",
                self.url
            )));
        }
        let channel = self.channel.get_or_try_init(|| self.connect()).await?;
        Ok(create_worker_client(channel.clone()))
    }
}

/// A fresh query id from the operating system's randomness; if that fails, a
/// per-process count mixed with the time (ids need only differ, not be secret).
fn new_query_id() -> QueryId {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    getrandom::u64().unwrap_or_else(|_| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |t| t.as_nanos() as u64);
        nanos
            ^ CALLS.fetch_add(1, Ordering::Relaxed).rotate_left(32)
            ^ u64::from(std::process::id())
    })
}

/// A table whose scan is the two-task stage asking one message.
#[derive(Debug)]
struct MessageTable {
    task: WorkerTask,
    schema: SchemaRef,
}

#[async_trait]
impl TableProvider for MessageTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        _projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let ask: Arc<dyn ExecutionPlan> = Arc::new(WorkerTaskExec::new(self.task.clone()));
        let nothing = Arc::new(WorkerTaskExec::new(WorkerTask::outside_query(
            WorkerMessage::Nothing,
        )));
        let tasks = DistributedLeafExec::try_new(ask.clone(), [ask, nothing])?;
        let stage = NetworkCoalesceExec::try_new(Arc::new(tasks), 2, 1)?;
        Ok(Arc::new(CoalescePartitionsExec::new(Arc::new(stage))))
    }
}

/// One `aisql worker`, as a backend.
pub struct RemoteWorker {
    /// Where it listens.
    url: Url,
    /// A distributed session that routes every stage to `url`.
    ctx: SessionContext,
    /// What it said it serves.
    hello: WorkerHello,
    /// The query this coordinator runs on it, between start and end.
    query: Mutex<Option<QueryId>>,
    /// Told when that query ends: the next query of this coordinator
    /// (another session's) waits for it, as the worker serves one at a time.
    query_ended: Condvar,
    /// See [`ConnectOptions::call_timeout`].
    call_timeout: Duration,
    /// See [`ConnectOptions::keep_alive_timeout`].
    keep_alive_timeout: Duration,
    /// A call found it hung or gone: until the next query's start, the
    /// messages that tidy up after a query are not sent, or sent without
    /// waiting (each would wait out the timeout again before the query's
    /// failure is reported).
    lost: AtomicBool,
}

impl RemoteWorker {
    /// Connects to the worker at `addr` (no token, plain or with no CA) and
    /// says hello.
    pub fn connect(addr: &str) -> Result<Self> {
        Self::connect_with(addr, &ConnectOptions::default())
    }

    /// Connects to the worker at `addr` as `options` say and says hello.
    pub fn connect_with(addr: &str, options: &ConnectOptions) -> Result<Self> {
        let url = worker_url(addr)?;
        // No physical optimizer: it would take away the coalesce above the
        // stage, and a distributed plan must end in one partition.
        let state = SessionStateBuilder::new()
            .with_default_features()
            .with_physical_optimizer_rules(vec![])
            .with_config(SessionConfig::new().with_target_partitions(1))
            .with_distributed_worker_resolver(OneWorker(url.clone()))
            .with_distributed_channel_resolver(WorkerChannels {
                url: url.clone(),
                options: options.clone(),
                channel: Default::default(),
            })
            .with_distributed_user_codec(WorkerTaskCodec)
            .with_distributed_metrics_collection(false)
            .map_err(EngineError::from)?
            .with_distributed_planner()
            .build();
        let ctx = SessionContext::from(state);
        let hello = WorkerTask::outside_query(WorkerMessage::Hello);
        let bound = if options.call_timeout < HELLO_TIMEOUT {
            (options.call_timeout, "--worker-timeout-s")
        } else {
            (HELLO_TIMEOUT, "to say hello")
        };
        let reply = run_blocking(
            ask(ctx.clone(), hello),
            Some(bound),
            options.keep_alive_timeout,
        )
        .map_err(|e| worker_error(&url, e))?;
        let WorkerReply::Hello(hello) = reply else {
            return Err(unexpected(&url, "hello", &reply));
        };
        if hello.protocol != PROTOCOL {
            return Err(worker_error(
                &url,
                format!(
                    "it speaks {}, this coordinator {PROTOCOL}: run the same aisql build",
                    hello.protocol
                ),
            ));
        }
        Ok(Self {
            url,
            ctx,
            hello: *hello,
            query: Mutex::new(None),
            query_ended: Condvar::new(),
            call_timeout: options.call_timeout,
            keep_alive_timeout: options.keep_alive_timeout,
            lost: AtomicBool::new(false),
        })
    }

    /// Its URL.
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// What it serves.
    pub fn hello(&self) -> &WorkerHello {
        &self.hello
    }

    /// The query started last, if it has not ended.
    fn query(&self) -> Option<QueryId> {
        *self.query.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Asks `message` of `query`, waiting at most the call timeout unless it
    /// starts a query (which waits its turn behind other coordinators').
    fn call_for(&self, query: Option<QueryId>, message: WorkerMessage) -> Result<WorkerReply> {
        let timeout = match message {
            WorkerMessage::StartQuery { .. } => None,
            _ => Some((self.call_timeout, "--worker-timeout-s")),
        };
        let task = WorkerTask { query, message };
        let reply = run_blocking(
            ask(self.ctx.clone(), task),
            timeout,
            self.keep_alive_timeout,
        )
        .map_err(|e| {
            self.lost.store(true, Ordering::Relaxed);
            worker_error(&self.url, e)
        })?;
        match reply {
            WorkerReply::Failed(e) => Err(worker_error(&self.url, e)),
            reply => Ok(reply),
        }
    }

    /// A call of `query` whose reply carries nothing; a failure is logged,
    /// because the trait's method has no way to return it and the next
    /// question will fail the query anyway.
    fn notify(&self, query: QueryId, message: WorkerMessage) {
        if let Err(e) = self.call_for(Some(query), message) {
            log::warn!("{e}");
        }
    }

    /// Whether `query`'s tidying messages should reach it: it is the query
    /// begun last, and no call of it found the worker hung or gone.
    fn reachable(&self, query: QueryId) -> bool {
        self.query() == Some(query) && !self.lost.load(Ordering::Relaxed)
    }

    /// Starts a query of `operators` on the worker once this coordinator's
    /// query before it has ended (the worker serves one at a time: a
    /// session's query waits for another session's), waiting while another
    /// coordinator's query holds it. Called off the async threads.
    fn start_query(&self, operators: &[AiCall], reuse_earlier_kv: bool) -> QueryId {
        let query = new_query_id();
        {
            let mut slot = self.query.lock().unwrap_or_else(|e| e.into_inner());
            while slot.is_some() {
                slot = self
                    .query_ended
                    .wait(slot)
                    .unwrap_or_else(|e| e.into_inner());
            }
            *slot = Some(query);
        }
        self.lost.store(false, Ordering::Relaxed);
        self.notify(
            query,
            WorkerMessage::StartQuery {
                calls: operators.to_vec(),
                reuse_earlier_kv,
            },
        );
        query
    }

    /// Ends the query begun last, if it has not ended.
    fn end_query(&self) {
        let ended = self.query.lock().unwrap_or_else(|e| e.into_inner()).take();
        if ended.is_none() {
            return;
        }
        self.query_ended.notify_one();
        if self.lost.load(Ordering::Relaxed) {
            // Sent without waiting: a worker that only lost this connection is
            // freed for other coordinators now, and a stopped one costs nothing.
            let task = WorkerTask {
                query: ended,
                message: WorkerMessage::EndQuery,
            };
            let ctx = self.ctx.clone();
            let bound = self.call_timeout;
            WIRE.spawn(async move {
                let _ = tokio::time::timeout(bound, ask(ctx, task)).await;
            });
        } else if let Err(e) = self.call_for(ended, WorkerMessage::EndQuery) {
            log::warn!("{e}");
        }
    }
}

/// An error of the worker at `url`.
fn worker_error(url: &Url, message: impl Into<String>) -> EngineError {
    EngineError::Worker {
        worker: url.to_string(),
        message: message.into(),
    }
}

/// A transport or plan error as one line: datafusion-distributed wraps a
/// connection failure in a context holding the transport's own words. A
/// connection closed for unanswered keep-alive pings (`keep_alive` long) is
/// said in the user's words.
fn error_text(e: &DataFusionError, keep_alive: Duration) -> String {
    let root = e.find_root();
    // hyper's keep-alive error is private; its text is what it shows.
    let unanswered = std::iter::successors(Some(root as &dyn std::error::Error), |e| e.source())
        .any(|e| e.to_string() == "keep-alive timed out");
    if unanswered {
        return format!(
            "no answer to HTTP/2 keep-alive pings within {} s, connection closed: the worker is stopped or unreachable",
            keep_alive.as_secs_f64()
        );
    }
    let root = root.to_string();
    let mut at = e;
    loop {
        match at {
            DataFusionError::Shared(inner) => at = inner.as_ref(),
            DataFusionError::Context(detail, _) if detail.len() < 400 => {
                return format!("{root} ({detail})");
            }
            _ => return root,
        }
    }
}

/// Runs `fut` on the connection runtime and waits for it on this thread, at
/// most `timeout` (the bound and what sets it, for the error), over channels
/// whose keep-alive pings wait `keep_alive` for their answer.
fn run_blocking(
    fut: impl Future<Output = DfResult<WorkerReply>> + Send + 'static,
    timeout: Option<(Duration, &'static str)>,
    keep_alive: Duration,
) -> std::result::Result<WorkerReply, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    WIRE.spawn(async move {
        let outcome = match timeout {
            None => fut.await.map_err(|e| error_text(&e, keep_alive)),
            Some((t, bound)) => match tokio::time::timeout(t, fut).await {
                Ok(r) => r.map_err(|e| error_text(&e, keep_alive)),
                Err(_) => Err(format!(
                    "no answer within {} s ({bound}): the worker is stopped, hung, or slower than that",
                    t.as_secs_f64()
                )),
            },
        };
        let _ = tx.send(outcome);
    });
    rx.recv()
        .map_err(|_| "the connection runtime stopped".to_string())?
}

/// Runs the stage asking `task` and picks its reply out of the two tasks'.
async fn ask(ctx: SessionContext, task: WorkerTask) -> DfResult<WorkerReply> {
    let table = MessageTable {
        task,
        schema: reply_schema(),
    };
    let batches = ctx.read_table(Arc::new(table))?.collect().await?;
    let mut replies = Vec::new();
    for batch in &batches {
        let column = batch
            .column_by_name(REPLY_COLUMN)
            .and_then(|c| c.as_any().downcast_ref::<BinaryArray>())
            .ok_or_else(|| DataFusionError::Execution("worker reply without its column".into()))?;
        for i in 0..column.len() {
            replies.push(decode::<WorkerReply>(column.value(i), "worker reply")?);
        }
    }
    if replies.len() != 2 {
        return Err(DataFusionError::Execution(format!(
            "worker stage returned {} replies, not 2",
            replies.len()
        )));
    }
    // Task 1 answers `Done`: the call's reply is the other one (or `Done` too).
    Ok(replies
        .into_iter()
        .find(|r| *r != WorkerReply::Done)
        .unwrap_or(WorkerReply::Done))
}

impl InferenceBackend for RemoteWorker {
    fn name(&self) -> &str {
        &self.hello.backend
    }

    fn begin(self: Arc<Self>, start: QueryStart) -> Result<Arc<dyn QueryBackend>> {
        let id = self.start_query(&start.calls, start.reuse_earlier_kv);
        Ok(Arc::new(RemoteQuery {
            worker: self,
            id,
            spend: start.spend,
            work: Mutex::default(),
        }))
    }

    fn kv_capacity_tokens(&self) -> Option<usize> {
        self.hello.kv_capacity_tokens
    }

    fn context_positions(&self) -> Option<usize> {
        self.hello.context_positions
    }

    fn reuses_work(&self) -> bool {
        self.hello.reuses_work
    }

    fn turn_order(&self) -> Option<String> {
        Some(self.url.to_string())
    }
}

/// One query on a remote worker: its id there, its budget meter (checked
/// before each call, charged after it: the worker's scheduler does not see
/// it) and the query's measurements the worker sent with its last answers.
struct RemoteQuery {
    worker: Arc<RemoteWorker>,
    id: QueryId,
    spend: Option<Arc<Spend>>,
    work: Mutex<Work>,
}

impl QueryBackend for RemoteQuery {
    /// With a budget, the coordinator checks it before the call and charges
    /// it the worker's fresh tokens and the call's time after: the worker
    /// stops at the end of a call, not between its forward batches.
    fn answer(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Answered> {
        let worker = &self.worker;
        if self.spend.as_ref().is_some_and(|s| s.reached().is_some()) {
            return Ok(Answered::free(vec![Answer::Unreached; requests.len()]));
        }
        let started = std::time::Instant::now();
        let message = WorkerMessage::Answer(call.clone(), WireRequests::new(requests));
        let reply = match worker.call_for(Some(self.id), message)? {
            WorkerReply::Answered(reply) => {
                check_answers(call, worker.url.as_str(), &reply.answers, requests.len())
                    .map_err(|e| worker_error(&worker.url, e.to_string()))?;
                *reply
            }
            other => return Err(unexpected(&worker.url, "answer", &other)),
        };
        if let Some(spend) = &self.spend {
            spend.charge(reply.work.fresh(), started.elapsed());
        }
        *self.work.lock().unwrap_or_else(|e| e.into_inner()) = reply.query_work;
        Ok(Answered {
            answers: reply.answers,
            work: reply.work,
        })
    }

    fn work(&self) -> Work {
        self.work.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn cancel(&self) {
        if self.worker.reachable(self.id) {
            self.worker.notify(self.id, WorkerMessage::Cancel);
        }
    }

    fn wait_stopped(&self) {
        if self.worker.reachable(self.id) {
            self.worker.notify(self.id, WorkerMessage::WaitStopped);
        }
    }

    fn partners_collected(&self, call: &AiCall, partners: &[Doc<'_>]) {
        let docs = partners
            .iter()
            .map(|d| WireDoc {
                id: d.id.to_string(),
                text: d.text.to_string(),
            })
            .collect();
        self.worker.notify(
            self.id,
            WorkerMessage::PartnersCollected(call.clone(), docs),
        );
    }
}

impl Drop for RemoteQuery {
    /// Frees the worker for other coordinators now, unless a later query
    /// has begun on it.
    fn drop(&mut self) {
        if self.worker.query() == Some(self.id) {
            self.worker.end_query();
        }
    }
}

impl Drop for RemoteWorker {
    fn drop(&mut self) {
        // Frees the worker for other coordinators now, not after its idle timeout.
        self.end_query();
    }
}

fn unexpected(url: &Url, what: &str, reply: &WorkerReply) -> EngineError {
    let shown: String = format!("{reply:?}").chars().take(80).collect();
    worker_error(url, format!("answered {what} with {shown}"))
}

/// Connects to every worker of `addrs` and checks that they serve one model
/// (name, weights, tokenizer and dtype): answers from two models must never be
/// mixed in one result.
pub fn connect_workers(addrs: &[String]) -> Result<Vec<RemoteWorker>> {
    connect_workers_with(addrs, &ConnectOptions::default())
}

/// [`connect_workers`], reaching them as `options` say.
pub fn connect_workers_with(
    addrs: &[String],
    options: &ConnectOptions,
) -> Result<Vec<RemoteWorker>> {
    if addrs.is_empty() {
        return Err(EngineError::Inference("--workers names no worker".into()));
    }
    let mut seen = std::collections::HashSet::new();
    let mut workers: Vec<RemoteWorker> = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        let url = worker_url(addr)?;
        if !seen.insert(url.clone()) {
            return Err(worker_error(&url, "listed twice in --workers"));
        }
        let worker = RemoteWorker::connect_with(addr, options).map_err(|e| match e {
            EngineError::Worker { worker, message } => EngineError::Worker {
                worker: format!("{i} ({worker})"),
                message,
            },
            e => e,
        })?;
        if let Some(first) = workers.first() {
            let (a, b) = (&first.hello.identity, &worker.hello.identity);
            let same = a.model == b.model
                && a.weights_sha256 == b.weights_sha256
                && a.tokenizer_sha256 == b.tokenizer_sha256
                && a.dtype == b.dtype;
            if !same {
                return Err(EngineError::Worker {
                    worker: format!("{i} ({})", worker.url),
                    message: format!(
                        "serves model {:?} ({}, weights {}), but worker 0 ({}) serves {:?} ({}, weights {}): every worker must serve the same model and dtype",
                        b.model,
                        b.dtype,
                        &b.weights_sha256[..b.weights_sha256.len().min(12)],
                        first.url,
                        a.model,
                        a.dtype,
                        &a.weights_sha256[..a.weights_sha256.len().min(12)],
                    ),
                });
            }
        }
        workers.push(worker);
    }
    Ok(workers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_addresses_are_host_and_port_over_http_or_https() {
        assert_eq!(
            worker_url("127.0.0.1:7070").unwrap().as_str(),
            "http://127.0.0.1:7070/"
        );
        assert_eq!(worker_url("http://gpu-3:1").unwrap().port(), Some(1));
        assert_eq!(worker_url("https://gpu-3:1").unwrap().scheme(), "https");
        for bad in ["127.0.0.1", "ftp://a:1", "a:1/x", "", ":80"] {
            let err = worker_url(bad).unwrap_err().to_string();
            assert!(err.contains(&format!("{bad:?}")), "{bad}: {err}");
        }
    }
}
