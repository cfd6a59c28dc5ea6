//! The worker side: one model on one device ([`ServedModel`]) behind
//! datafusion-distributed's gRPC worker service ([`serve`]), answering the
//! [`WorkerMessage`]s of the [`WorkerTaskExec`](super::WorkerTaskExec)s it is
//! sent, behind the [`guard`](super::guard) (token, plan and range checks).
//!
//! Several coordinators may share a worker. Its model holds one query's state
//! at a time (the scheduler's KV, cache and counters, reset by a query's
//! start), so the worker serves their queries one at a time, in arrival order
//! ([`QueryTurns`]): a query's start waits until the query being served ends
//! ([`WorkerMessage::EndQuery`]) or has been idle for the idle timeout (a
//! coordinator that died); a message of a query other than the one served is
//! refused, and one coordinator's cancel never reaches another's query.

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use datafusion::error::DataFusionError;
use datafusion::execution::SessionState;
use datafusion_distributed::{
    DistributedExt, Worker, WorkerPlanRewriteEvent, WorkerPlanRewriteEventResponse,
    WorkerQueryContext, WorkerSessionBuilder,
};

use super::codec::WorkerTaskCodec;
use super::guard::{GuardLayer, MAX_MESSAGE_BYTES, TokenDigest, check_worker_plan};
use super::message::{
    AnsweredReply, PROTOCOL, QueryId, WorkerHello, WorkerMessage, WorkerReply, WorkerTask,
};
use crate::error::{EngineError, Result};
use crate::inference::answer_cache::AnswerIdentity;
use crate::inference::backend::{
    AiCall, AiRequest, Doc, InferenceBackend, QueryBackend, QueryStart,
};

/// How long a served query may go without a message before another
/// coordinator's query may take the worker over.
pub const DEFAULT_QUERY_IDLE: Duration = Duration::from_secs(120);

/// Most cancelled-while-waiting queries remembered (a bound, not a limit on
/// coordinators: each entry is dropped when its query's start returns).
const MAX_CANCELLED: usize = 1024;

/// The model a worker serves and what it tells coordinators about it.
pub struct ServedModel {
    /// The backend every query begins on.
    backend: Arc<dyn InferenceBackend>,
    /// The served query's object on `backend`, from its start to its end (or
    /// until a waiting query takes the worker from an idle one).
    query: Mutex<Option<(QueryId, Arc<dyn QueryBackend>)>>,
    /// The answer to [`WorkerMessage::Hello`].
    hello: WorkerHello,
    /// Whose query the backend serves now.
    turns: QueryTurns,
}

impl ServedModel {
    /// Serves `backend`, a model of `identity`; `meta` describes its device.
    pub fn new(
        backend: Arc<dyn InferenceBackend>,
        identity: AnswerIdentity,
        meta: crate::inference::backend_meta::BackendMeta,
    ) -> Self {
        let hello = WorkerHello {
            protocol: PROTOCOL.to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            backend: backend.name().to_string(),
            identity,
            meta,
            kv_capacity_tokens: backend.kv_capacity_tokens(),
            context_positions: backend.context_positions(),
            reuses_work: backend.reuses_work(),
        };
        Self {
            backend,
            query: Mutex::new(None),
            hello,
            turns: QueryTurns::new(DEFAULT_QUERY_IDLE),
        }
    }

    /// The served query's object.
    fn query_lock(&self) -> std::sync::MutexGuard<'_, Option<(QueryId, Arc<dyn QueryBackend>)>> {
        self.query.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The object of `query`, if it is the one begun here.
    fn query_of(&self, query: QueryId) -> Option<Arc<dyn QueryBackend>> {
        match &*self.query_lock() {
            Some((id, q)) if *id == query => Some(q.clone()),
            _ => None,
        }
    }

    /// The same, with `idle` as the time after which a silent query loses
    /// the worker to a waiting one.
    pub fn with_query_idle(mut self, idle: Duration) -> Self {
        self.turns = QueryTurns::new(idle);
        self
    }

    /// What this worker says to a coordinator's hello.
    pub fn hello(&self) -> &WorkerHello {
        &self.hello
    }
}

/// The query being served and the queries waiting for it.
struct QueryTurns {
    /// The served query and the cancelled waiting ones.
    state: Mutex<TurnState>,
    /// Signalled when the served query ends or a waiting one is cancelled.
    changed: Condvar,
    /// See [`DEFAULT_QUERY_IDLE`].
    idle: Duration,
}

#[derive(Default)]
struct TurnState {
    /// The query the backend serves now.
    served: Option<Served>,
    /// Waiting queries their coordinator cancelled: their start gives up.
    cancelled: HashSet<QueryId>,
}

struct Served {
    /// Its id.
    query: QueryId,
    /// Its messages being answered now: it is not idle while any is.
    in_flight: usize,
    /// When its last message was answered.
    last: Instant,
}

impl QueryTurns {
    fn new(idle: Duration) -> Self {
        Self {
            state: Mutex::default(),
            changed: Condvar::new(),
            idle,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TurnState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes `query` the served one, waiting for the served query to end or
    /// idle out; `Err` if its coordinator cancels it while it waits.
    fn start(&self, query: QueryId) -> Result<()> {
        let mut state = self.lock();
        loop {
            if state.cancelled.remove(&query) {
                return Err(EngineError::Inference(format!(
                    "query {query:016x} was cancelled while waiting for this worker"
                )));
            }
            let wait = match &state.served {
                None => None,
                Some(s) if s.query == query => None,
                Some(s) if s.in_flight == 0 && s.last.elapsed() >= self.idle => {
                    log::warn!(
                        "query {:016x} sent nothing for {} s: serving query {query:016x} instead",
                        s.query,
                        self.idle.as_secs()
                    );
                    None
                }
                Some(s) if s.in_flight == 0 => Some(self.idle.saturating_sub(s.last.elapsed())),
                Some(_) => Some(self.idle),
            };
            match wait {
                None => {
                    state.served = Some(Served {
                        query,
                        in_flight: 1,
                        last: Instant::now(),
                    });
                    return Ok(());
                }
                Some(wait) => {
                    let wait = wait.max(Duration::from_millis(10));
                    state = self
                        .changed
                        .wait_timeout(state, wait)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        }
    }

    /// Enters a message of `query`: `Err` unless it is the served query.
    fn enter(&self, query: QueryId) -> Result<()> {
        let mut state = self.lock();
        match &mut state.served {
            Some(s) if s.query == query => {
                s.in_flight += 1;
                Ok(())
            }
            _ => Err(EngineError::Inference(format!(
                "query {query:016x} is not the query this worker serves now (another coordinator's query runs, or this one sent nothing for {} s)",
                self.idle.as_secs()
            ))),
        }
    }

    /// Leaves a message of `query` entered by [`Self::enter`] or [`Self::start`].
    fn leave(&self, query: QueryId) {
        let mut state = self.lock();
        if let Some(s) = &mut state.served
            && s.query == query
        {
            s.in_flight = s.in_flight.saturating_sub(1);
            s.last = Instant::now();
        }
    }

    /// Whether `query` is the served one.
    fn serves(&self, query: QueryId) -> bool {
        self.lock()
            .served
            .as_ref()
            .is_some_and(|s| s.query == query)
    }

    /// Cancels `query` if it waits to start (its start returns an error).
    fn cancel_waiting(&self, query: QueryId) {
        let mut state = self.lock();
        if state.served.as_ref().is_some_and(|s| s.query == query) {
            return;
        }
        if state.cancelled.len() >= MAX_CANCELLED {
            state.cancelled.clear();
        }
        state.cancelled.insert(query);
        self.changed.notify_all();
    }

    /// Ends `query`: the next waiting query may start.
    fn end(&self, query: QueryId) {
        let mut state = self.lock();
        state.cancelled.remove(&query);
        if state.served.as_ref().is_some_and(|s| s.query == query) {
            state.served = None;
            self.changed.notify_all();
        }
    }
}

/// Checks a call and its requests as sent: a message from a foreign or broken
/// coordinator is an error, never a panic deeper in the model code.
fn check_call(call: &AiCall, requests: Option<&[AiRequest<'_>]>) -> Result<()> {
    let bad = |why: String| EngineError::Inference(format!("operator {:?}: {why}", call.op_id));
    if call.kind.has_labels() && call.labels.len() < 2 {
        return Err(bad(format!(
            "a {} call with {} label(s)",
            call.kind.name(),
            call.labels.len()
        )));
    }
    if call.kind.generates() != (call.max_tokens > 0) {
        return Err(bad(format!(
            "a {} call with max_tokens {}",
            call.kind.name(),
            call.max_tokens
        )));
    }
    if !call.descriptions.is_empty() && call.descriptions.len() != call.labels.len() {
        return Err(bad(format!(
            "{} label descriptions for {} labels",
            call.descriptions.len(),
            call.labels.len()
        )));
    }
    for r in requests.unwrap_or_default() {
        match (call.kind.describe().documents(), r.partner.is_some()) {
            (Some(2), false) => {
                return Err(bad(format!(
                    "a {} question without a partner",
                    call.kind.name()
                )));
            }
            (Some(1), true) => {
                return Err(bad(format!(
                    "a {} question with a partner",
                    call.kind.name()
                )));
            }
            (_, pair) if pair != call.pieces.pair => {
                return Err(bad(format!(
                    "a question {} a partner for a prompt {} one",
                    if pair { "with" } else { "without" },
                    if call.pieces.pair { "with" } else { "without" }
                )));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Answers `task` with the served backend; its errors become
/// [`WorkerReply::Failed`], so they reach the coordinator as text.
pub fn answer(served: &ServedModel, task: WorkerTask) -> WorkerReply {
    let WorkerTask { query, message } = task;
    let reply = match (query, message) {
        (_, WorkerMessage::Hello) => Ok(WorkerReply::Hello(Box::new(served.hello.clone()))),
        (_, WorkerMessage::Nothing) => Ok(WorkerReply::Done),
        (None, other) => Err(EngineError::Inference(format!(
            "{} names no query",
            message_name(&other)
        ))),
        (
            Some(q),
            WorkerMessage::StartQuery {
                calls: operators,
                reuse_earlier_kv,
            },
        ) => {
            match operators.iter().try_for_each(|c| check_call(c, None)) {
                Err(e) => Err(e),
                Ok(()) => served.turns.start(q).and_then(|()| {
                    // The query before, if it went idle, ends here.
                    served.query_lock().take();
                    let begun = served.backend.clone().begin(QueryStart {
                        calls: operators,
                        spend: None,
                        reuse_earlier_kv,
                    });
                    let reply = begun.map(|query| {
                        *served.query_lock() = Some((q, query));
                        WorkerReply::Done
                    });
                    served.turns.leave(q);
                    reply
                }),
            }
        }
        (Some(q), WorkerMessage::EndQuery) => {
            let ended = {
                let mut query = served.query_lock();
                match &*query {
                    Some((id, _)) if *id == q => query.take(),
                    _ => None,
                }
            };
            drop(ended);
            served.turns.end(q);
            Ok(WorkerReply::Done)
        }
        (Some(q), WorkerMessage::Cancel) => {
            // Only the served query's work is the backend's to stop; a query
            // still waiting gives up its turn instead.
            match served.query_of(q) {
                Some(query) if served.turns.serves(q) => query.cancel(),
                _ => served.turns.cancel_waiting(q),
            }
            Ok(WorkerReply::Done)
        }
        (Some(q), WorkerMessage::WaitStopped) if !served.turns.serves(q) => Ok(WorkerReply::Done),
        (Some(q), message) => served.turns.enter(q).and_then(|()| {
            let reply = match served.query_of(q) {
                Some(query) => answer_in_turn(query.as_ref(), message),
                None => Err(EngineError::Inference(format!(
                    "query {q:016x} has not started on this worker"
                ))),
            };
            served.turns.leave(q);
            reply
        }),
    };
    reply.unwrap_or_else(|e| WorkerReply::Failed(e.to_string()))
}

/// Answers a message of the served query.
fn answer_in_turn(query: &dyn QueryBackend, message: WorkerMessage) -> Result<WorkerReply> {
    match message {
        WorkerMessage::PartnersCollected(call, partners) => {
            check_call(&call, None)?;
            let docs: Vec<Doc<'_>> = partners
                .iter()
                .map(|d| Doc {
                    id: &d.id,
                    text: &d.text,
                })
                .collect();
            query.partners_collected(&call, &docs);
            Ok(WorkerReply::Done)
        }
        WorkerMessage::Answer(call, wire) => {
            let requests = wire.requests()?;
            check_call(&call, Some(&requests))?;
            let answered = query.answer(&call, &requests)?;
            Ok(WorkerReply::Answered(Box::new(AnsweredReply {
                answers: answered.answers,
                work: answered.work,
                query_work: query.work(),
            })))
        }
        WorkerMessage::WaitStopped => {
            query.wait_stopped();
            Ok(WorkerReply::Done)
        }
        other => Err(EngineError::Inference(format!(
            "{} is not answered here",
            message_name(&other)
        ))),
    }
}

/// A message's kind, for errors.
fn message_name(message: &WorkerMessage) -> &'static str {
    match message {
        WorkerMessage::Hello => "Hello",
        WorkerMessage::StartQuery { .. } => "StartQuery",
        WorkerMessage::PartnersCollected(..) => "PartnersCollected",
        WorkerMessage::Answer(..) => "Answer",
        WorkerMessage::Cancel => "Cancel",
        WorkerMessage::WaitStopped => "WaitStopped",
        WorkerMessage::Nothing => "Nothing",
        WorkerMessage::EndQuery => "EndQuery",
    }
}

/// Sessions of the worker service: aisql's codec, the served model as a
/// session extension for [`WorkerTaskExec`](super::WorkerTaskExec) to find, and
/// the check that a decoded plan is a `WorkerTaskExec` stage before it runs.
#[derive(Clone)]
struct WorkerSessions {
    served: Arc<ServedModel>,
}

#[async_trait]
impl WorkerSessionBuilder for WorkerSessions {
    async fn build_session_state(
        &self,
        ctx: WorkerQueryContext,
    ) -> std::result::Result<SessionState, DataFusionError> {
        let mut builder = ctx.builder;
        builder
            .config()
            .get_or_insert_default()
            .set_extension(self.served.clone());
        Ok(builder
            .with_distributed_user_codec(WorkerTaskCodec)
            .with_distributed_worker_plan_rewrite_handler(|ev: WorkerPlanRewriteEvent<'_>| {
                check_worker_plan(&ev.plan)?;
                Ok(WorkerPlanRewriteEventResponse::new(ev.plan))
            })
            .build())
    }
}

/// Who may use a worker, and how they reach it.
#[derive(Clone, Default)]
pub struct ServeOptions {
    /// The token every call must carry; `None`: none asked (loopback, or
    /// `--insecure`).
    pub token: Option<String>,
    /// PEM certificate chain and private key: serve TLS instead of plain
    /// HTTP/2.
    pub tls: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for ServeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeOptions")
            .field("token", &self.token.as_ref().map(|_| ".."))
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// Serves `served` on `listener` until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    served: ServedModel,
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let addr = listener
        .local_addr()
        .map_err(|e| EngineError::Inference(format!("worker socket: {e}")))?;
    let failed =
        |e: tonic::transport::Error| EngineError::Inference(format!("worker on {addr}: {e}"));
    let worker = Worker::from_session_builder(WorkerSessions {
        served: Arc::new(served),
    });
    let mut server = tonic::transport::Server::builder();
    if let Some((cert, key)) = &options.tls {
        let identity = tonic::transport::Identity::from_pem(cert, key);
        server = server
            .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
            .map_err(failed)?;
    }
    let guard = GuardLayer::new(
        options
            .token
            .as_deref()
            .map(|t| TokenDigest::of(t.as_bytes())),
    );
    server
        .layer(guard)
        .add_service(
            worker
                .into_worker_server()
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
        )
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener),
            shutdown,
        )
        .await
        .map_err(failed)
}

/// A worker serving on a free loopback port from its own runtime, in this
/// process: a cluster for tests and benchmarks that behaves as separate
/// processes do, through the same gRPC service. Dropping it stops it.
pub struct LoopbackWorker {
    /// `127.0.0.1:PORT`.
    addr: String,
    /// The worker's runtime; `None` once stopped.
    runtime: Option<tokio::runtime::Runtime>,
}

impl LoopbackWorker {
    /// Starts serving `served` to anyone on loopback.
    pub fn start(served: ServedModel) -> Result<Self> {
        Self::start_with(served, ServeOptions::default())
    }

    /// Starts serving `served` as `options` say.
    pub fn start_with(served: ServedModel, options: ServeOptions) -> Result<Self> {
        let io = |e: std::io::Error| EngineError::Inference(format!("loopback worker: {e}"));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("aisql-loopback-worker")
            .enable_all()
            .build()
            .map_err(io)?;
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .map_err(io)?;
        let addr = listener.local_addr().map_err(io)?.to_string();
        runtime.spawn(serve(listener, served, options, std::future::pending()));
        Ok(Self {
            addr,
            runtime: Some(runtime),
        })
    }

    /// Where it listens, for `--workers` / [`connect_workers`](super::connect_workers).
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Stops serving now, as a killed worker process would: connections drop.
    pub fn stop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl Drop for LoopbackWorker {
    fn drop(&mut self) {
        self.stop();
    }
}
