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
//! [`ShardedBackend`](crate::shard::ShardedBackend)'s router.

use std::sync::{Arc, LazyLock};
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
use datafusion_distributed::{
    DistributedExt, DistributedLeafExec, NetworkCoalesceExec, SessionStateBuilderExt,
    WorkerResolver,
};
use url::Url;

use super::codec::WorkerTaskCodec;
use super::message::{
    PROTOCOL, WireDoc, WireRequests, WorkerHello, WorkerMessage, WorkerReply, decode,
};
use super::task::{REPLY_COLUMN, WorkerTaskExec, reply_schema};
use crate::backend::{AiCall, AiRequest, Doc, InferenceBackend, check_answer_count};
use crate::error::{EngineError, Result};

/// How long a worker may take to answer hello before it counts as unreachable.
const HELLO_TIMEOUT: Duration = Duration::from_secs(20);

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

/// `addr` as a worker URL: `HOST:PORT` or `http://HOST:PORT`.
pub fn worker_url(addr: &str) -> Result<Url> {
    let bad = |why: String| EngineError::Inference(format!("worker address {addr:?}: {why}"));
    let text = if addr.contains("://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    };
    let url = Url::parse(&text).map_err(|e| bad(e.to_string()))?;
    if url.scheme() != "http" {
        return Err(bad(format!(
            "scheme {:?}: workers speak plain http (gRPC) on a trusted network",
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

/// A table whose scan is the two-task stage asking one message.
#[derive(Debug)]
struct MessageTable {
    message: WorkerMessage,
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
        let ask: Arc<dyn ExecutionPlan> = Arc::new(WorkerTaskExec::new(self.message.clone()));
        let nothing = Arc::new(WorkerTaskExec::new(WorkerMessage::Nothing));
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
}

impl RemoteWorker {
    /// Connects to the worker at `addr` and says hello.
    pub fn connect(addr: &str) -> Result<Self> {
        let url = worker_url(addr)?;
        // No physical optimizer: it would take away the coalesce above the
        // stage, and a distributed plan must end in one partition.
        let state = SessionStateBuilder::new()
            .with_default_features()
            .with_physical_optimizer_rules(vec![])
            .with_config(SessionConfig::new().with_target_partitions(1))
            .with_distributed_worker_resolver(OneWorker(url.clone()))
            .with_distributed_user_codec(WorkerTaskCodec)
            .with_distributed_metrics_collection(false)
            .map_err(EngineError::from)?
            .with_distributed_planner()
            .build();
        let ctx = SessionContext::from(state);
        let reply = run_blocking(ask(ctx.clone(), WorkerMessage::Hello), Some(HELLO_TIMEOUT))
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

    /// Asks `message` and waits for the reply; a failure names the worker.
    fn call(&self, message: WorkerMessage) -> Result<WorkerReply> {
        match run_blocking(ask(self.ctx.clone(), message), None)
            .map_err(|e| worker_error(&self.url, e))?
        {
            WorkerReply::Failed(e) => Err(worker_error(&self.url, e)),
            reply => Ok(reply),
        }
    }

    /// A call whose reply carries nothing; a failure is logged, because the
    /// trait's method has no way to return it and the next question will fail
    /// the query anyway.
    fn notify(&self, message: WorkerMessage) {
        if let Err(e) = self.call(message) {
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
/// connection failure in a context holding the transport's own words.
fn error_text(e: &DataFusionError) -> String {
    let root = e.find_root().to_string();
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

/// Runs `fut` on the connection runtime and waits for it on this thread.
fn run_blocking(
    fut: impl Future<Output = DfResult<WorkerReply>> + Send + 'static,
    timeout: Option<Duration>,
) -> std::result::Result<WorkerReply, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    WIRE.spawn(async move {
        let outcome = match timeout {
            None => fut.await.map_err(|e| error_text(&e)),
            Some(t) => match tokio::time::timeout(t, fut).await {
                Ok(r) => r.map_err(|e| error_text(&e)),
                Err(_) => Err(format!("no answer within {} s", t.as_secs())),
            },
        };
        let _ = tx.send(outcome);
    });
    rx.recv()
        .map_err(|_| "the connection runtime stopped".to_string())?
}

/// Runs the stage asking `message` and picks its reply out of the two tasks'.
async fn ask(ctx: SessionContext, message: WorkerMessage) -> DfResult<WorkerReply> {
    let table = MessageTable {
        message,
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

    fn decide(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Vec<bool>> {
        let message = WorkerMessage::Decide(call.clone(), WireRequests::new(requests));
        match self.call(message)? {
            WorkerReply::Decided(answers) => {
                check_answer_count(call, self.url.as_str(), answers.len(), requests.len())?;
                Ok(answers)
            }
            other => Err(unexpected(&self.url, "decide", &other)),
        }
    }

    fn classify(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Vec<usize>> {
        let message = WorkerMessage::Classify(call.clone(), WireRequests::new(requests));
        match self.call(message)? {
            WorkerReply::Classified(answers) => {
                check_answer_count(call, self.url.as_str(), answers.len(), requests.len())?;
                if let Some(bad) = answers.iter().find(|&&a| a >= call.labels.len()) {
                    return Err(worker_error(
                        &self.url,
                        format!("{} label {bad} of {}", call.op_id, call.labels.len()),
                    ));
                }
                Ok(answers)
            }
            other => Err(unexpected(&self.url, "classify", &other)),
        }
    }

    fn measurements(&self) -> serde_json::Map<String, serde_json::Value> {
        match self.call(WorkerMessage::Measurements) {
            Ok(WorkerReply::Measurements(m)) => m,
            Ok(other) => {
                log::warn!("{}", unexpected(&self.url, "measurements", &other));
                Default::default()
            }
            Err(e) => {
                log::warn!("{e}");
                Default::default()
            }
        }
    }

    fn kv_capacity_tokens(&self) -> Option<usize> {
        self.hello.kv_capacity_tokens
    }

    fn reuses_work(&self) -> bool {
        self.hello.reuses_work
    }

    fn cancel(&self) {
        self.notify(WorkerMessage::Cancel);
    }

    fn wait_stopped(&self) {
        self.notify(WorkerMessage::WaitStopped);
    }

    fn start_query(&self, operators: &[AiCall]) {
        self.notify(WorkerMessage::StartQuery(operators.to_vec()));
    }

    fn partners_collected(&self, call: &AiCall, partners: &[Doc<'_>]) {
        let docs = partners
            .iter()
            .map(|d| WireDoc {
                id: d.id.to_string(),
                text: d.text.to_string(),
            })
            .collect();
        self.notify(WorkerMessage::PartnersCollected(call.clone(), docs));
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
        let worker = RemoteWorker::connect(addr).map_err(|e| match e {
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
    fn worker_addresses_are_host_and_port_over_plain_http() {
        assert_eq!(
            worker_url("127.0.0.1:7070").unwrap().as_str(),
            "http://127.0.0.1:7070/"
        );
        assert_eq!(worker_url("http://gpu-3:1").unwrap().port(), Some(1));
        for bad in ["127.0.0.1", "https://a:1", "a:1/x", "", ":80"] {
            let err = worker_url(bad).unwrap_err().to_string();
            assert!(err.contains(&format!("{bad:?}")), "{bad}: {err}");
        }
    }
}
