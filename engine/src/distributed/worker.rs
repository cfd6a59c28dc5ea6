//! The worker side: one model on one device ([`ServedModel`]) behind
//! datafusion-distributed's gRPC worker service ([`serve`]), answering the
//! [`WorkerMessage`]s of the [`WorkerTaskExec`](super::WorkerTaskExec)s it is
//! sent.

use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::error::DataFusionError;
use datafusion::execution::SessionState;
use datafusion_distributed::{DistributedExt, Worker, WorkerQueryContext, WorkerSessionBuilder};

use super::codec::WorkerTaskCodec;
use super::message::{PROTOCOL, WorkerHello, WorkerMessage, WorkerReply};
use crate::answer_cache::AnswerIdentity;
use crate::backend::{Doc, InferenceBackend};
use crate::error::{EngineError, Result};

/// The model a worker serves and what it tells coordinators about it.
pub struct ServedModel {
    /// The backend every message is answered by.
    backend: Arc<dyn InferenceBackend>,
    /// The answer to [`WorkerMessage::Hello`].
    hello: WorkerHello,
}

impl ServedModel {
    /// Serves `backend`, a model of `identity`; `meta` describes its device.
    pub fn new(
        backend: Arc<dyn InferenceBackend>,
        identity: AnswerIdentity,
        meta: serde_json::Map<String, serde_json::Value>,
    ) -> Self {
        let hello = WorkerHello {
            protocol: PROTOCOL.to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            backend: backend.name().to_string(),
            identity,
            meta,
            kv_capacity_tokens: backend.kv_capacity_tokens(),
            reuses_work: backend.reuses_work(),
        };
        Self { backend, hello }
    }

    /// What this worker says to a coordinator's hello.
    pub fn hello(&self) -> &WorkerHello {
        &self.hello
    }
}

/// Answers `message` with the served backend; its errors become
/// [`WorkerReply::Failed`], so they reach the coordinator as text.
pub fn answer(served: &ServedModel, message: WorkerMessage) -> WorkerReply {
    let backend = served.backend.as_ref();
    let reply = match message {
        WorkerMessage::Hello => Ok(WorkerReply::Hello(Box::new(served.hello.clone()))),
        WorkerMessage::StartQuery(operators) => {
            backend.start_query(&operators);
            Ok(WorkerReply::Done)
        }
        WorkerMessage::PartnersCollected(call, partners) => {
            let docs: Vec<Doc<'_>> = partners
                .iter()
                .map(|d| Doc {
                    id: &d.id,
                    text: &d.text,
                })
                .collect();
            backend.partners_collected(&call, &docs);
            Ok(WorkerReply::Done)
        }
        WorkerMessage::Decide(call, wire) => wire
            .requests()
            .and_then(|r| backend.decide(&call, &r))
            .map(WorkerReply::Decided),
        WorkerMessage::Classify(call, wire) => wire
            .requests()
            .and_then(|r| backend.classify(&call, &r))
            .map(WorkerReply::Classified),
        WorkerMessage::Measurements => Ok(WorkerReply::Measurements(backend.measurements())),
        WorkerMessage::Cancel => {
            backend.cancel();
            Ok(WorkerReply::Done)
        }
        WorkerMessage::WaitStopped => {
            backend.wait_stopped();
            Ok(WorkerReply::Done)
        }
        WorkerMessage::Nothing => Ok(WorkerReply::Done),
    };
    reply.unwrap_or_else(|e| WorkerReply::Failed(e.to_string()))
}

/// Sessions of the worker service: aisql's codec, and the served model as a
/// session extension for [`WorkerTaskExec`](super::WorkerTaskExec) to find.
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
        Ok(builder.with_distributed_user_codec(WorkerTaskCodec).build())
    }
}

/// Serves `served` on `listener` until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    served: ServedModel,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let addr = listener
        .local_addr()
        .map_err(|e| EngineError::Inference(format!("worker socket: {e}")))?;
    let worker = Worker::from_session_builder(WorkerSessions {
        served: Arc::new(served),
    });
    tonic::transport::Server::builder()
        .add_service(worker.into_worker_server())
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener),
            shutdown,
        )
        .await
        .map_err(|e| EngineError::Inference(format!("worker on {addr}: {e}")))
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
    /// Starts serving `served`.
    pub fn start(served: ServedModel) -> Result<Self> {
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
        runtime.spawn(serve(listener, served, std::future::pending()));
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
