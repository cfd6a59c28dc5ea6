//! What an `aisql worker` lets in: a tower layer ([`GuardLayer`]) in front of
//! datafusion-distributed's gRPC worker service, and the check of every plan
//! the service decodes ([`check_worker_plan`]).
//!
//! The worker service would run any DataFusion plan it is sent: a file scan
//! reads what the worker can read, a sink writes where it can write, and sizes
//! and ranges in a request (partitions, tasks, work-unit feeds) are trusted up
//! to allocating them. So before the service sees a request, the guard:
//! - checks the shared token ([`TOKEN_HEADER`]) in constant time, when the
//!   worker has one;
//! - reads the request's first gRPC message and checks it, without building
//!   any plan: a plan is only extension nodes (aisql's `WorkerTaskExec` and
//!   datafusion-distributed's own nodes; every built-in DataFusion node,
//!   scans and sinks included, is refused by its name), task counts and
//!   indexes, partition ranges and feeds are within what an aisql coordinator
//!   sends ([`MAX_TASKS`], [`MAX_PARTITIONS`]).
//!
//! After decoding, [`check_worker_plan`] (a worker plan rewrite handler) makes
//! sure the plan is a `WorkerTaskExec`, so the extension nodes
//! datafusion-distributed decodes (network stages that would connect to other
//! hosts) do not run either.

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::protobuf::PhysicalPlanNode;
use datafusion_proto::protobuf::physical_plan_node::PhysicalPlanType;
use futures::future::BoxFuture;
use http_body::Frame;
use http_body_util::BodyExt;
use prost::Message;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tonic::Status;
use tonic::body::Body;

use super::task::WorkerTaskExec;

/// The gRPC metadata header that carries the shared worker token.
pub const TOKEN_HEADER: &str = "x-aisql-worker-token";

/// Most tasks a stage sent to a worker may have: aisql's stages have two.
pub const MAX_TASKS: u64 = 16;

/// Most partitions one request may ask of a task: aisql's tasks have one.
pub const MAX_PARTITIONS: u64 = 16;

/// Most plan nodes a request's plan may have: aisql's have one or two.
const MAX_PLAN_NODES: usize = 16;

/// Largest gRPC message the worker reads: a batch of documents and questions
/// is well under it.
pub const MAX_MESSAGE_BYTES: usize = 256 << 20;

/// Largest first message of an `ExecuteTask` call (a task key and a range).
const MAX_EXECUTE_REQUEST_BYTES: usize = 64 << 10;

const COORDINATOR_CHANNEL: &str = "/worker.WorkerService/CoordinatorChannel";
const EXECUTE_TASK: &str = "/worker.WorkerService/ExecuteTask";

/// The worker service's methods whose first message the guard checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuardedMethod {
    /// `CoordinatorChannel`: its first message sets a task's plan.
    CoordinatorChannel,
    /// `ExecuteTask`: runs partitions of a task whose plan is set.
    ExecuteTask,
}

/// datafusion-distributed's `worker.proto` messages, as far as the guard reads
/// them (field numbers as there); fields it does not check are bytes.
mod wire {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CoordinatorToWorkerMsg {
        #[prost(oneof = "Inner", tags = "1, 2, 3")]
        pub inner: Option<Inner>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Inner {
        #[prost(message, tag = "1")]
        SetPlanRequest(SetPlanRequest),
        #[prost(bytes = "vec", tag = "2")]
        WorkUnitBatch(Vec<u8>),
        #[prost(bool, tag = "3")]
        WorkUnitEos(bool),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SetPlanRequest {
        #[prost(message, optional, tag = "1")]
        pub task_key: Option<TaskKey>,
        #[prost(uint64, tag = "2")]
        pub task_count: u64,
        #[prost(bytes = "vec", tag = "3")]
        pub plan_proto: Vec<u8>,
        #[prost(bytes = "vec", repeated, tag = "4")]
        pub work_unit_feed_declarations: Vec<Vec<u8>>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TaskKey {
        #[prost(bytes = "vec", tag = "1")]
        pub query_id: Vec<u8>,
        #[prost(uint64, tag = "2")]
        pub stage_id: u64,
        #[prost(uint64, tag = "3")]
        pub task_number: u64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ExecuteTaskRequest {
        #[prost(message, optional, tag = "1")]
        pub task_key: Option<TaskKey>,
        #[prost(uint64, tag = "2")]
        pub target_partition_start: u64,
        #[prost(uint64, tag = "3")]
        pub target_partition_end: u64,
        #[prost(oneof = "ProducerHead", tags = "6, 7, 8")]
        pub producer_head: Option<ProducerHead>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum ProducerHead {
        #[prost(bytes = "vec", tag = "6")]
        None(Vec<u8>),
        #[prost(bytes = "vec", tag = "7")]
        Broadcast(Vec<u8>),
        #[prost(bytes = "vec", tag = "8")]
        Repartition(Vec<u8>),
    }
}

/// A task as a request names it: query id, stage, task number.
type TaskKey = (Vec<u8>, u64, u64);

/// The task a request message of `method` names, if it reads as one.
fn task_key_of(method: GuardedMethod, message: &[u8]) -> Option<TaskKey> {
    let key = match method {
        GuardedMethod::CoordinatorChannel => {
            match wire::CoordinatorToWorkerMsg::decode(message).ok()?.inner? {
                wire::Inner::SetPlanRequest(set) => set.task_key?,
                _ => return None,
            }
        }
        GuardedMethod::ExecuteTask => wire::ExecuteTaskRequest::decode(message).ok()?.task_key?,
    };
    Some((key.query_id, key.stage_id, key.task_number))
}

/// Most plans (set or refused) remembered for the task requests that follow.
const MAX_SEEN: usize = 1024;

/// How long a task request waits for its plan to be set or refused before it
/// goes on to the service (which waits for the plan itself, as long).
const PLAN_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The tasks whose plan came through the guard, and why a refused one was
/// refused: datafusion-distributed's coordinator does not read the refusal of
/// a plan, only the failure of the task's execution, so that failure repeats
/// the reason (naming the node).
#[derive(Default, Debug)]
struct Seen(std::collections::VecDeque<(TaskKey, Option<String>)>);

impl Seen {
    fn remember(&mut self, key: TaskKey, refused: Option<String>) {
        if self.0.len() >= MAX_SEEN {
            self.0.pop_front();
        }
        self.0.push_back((key, refused));
    }

    /// `None`: not seen; `Some(None)`: set; `Some(Some(why))`: refused.
    fn verdict(&self, key: &TaskKey) -> Option<Option<String>> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, w)| w.clone())
    }
}

/// Checks one request message of `method` (the gRPC message, without its
/// five-byte frame header): `Err` says why it is refused. Builds no plan.
pub fn check_request(method: GuardedMethod, message: &[u8]) -> Result<(), String> {
    match method {
        GuardedMethod::CoordinatorChannel => {
            let msg = wire::CoordinatorToWorkerMsg::decode(message)
                .map_err(|e| format!("unreadable coordinator message: {e}"))?;
            let Some(wire::Inner::SetPlanRequest(set)) = msg.inner else {
                return Err("the first coordinator message must set a plan".into());
            };
            let key = set.task_key.ok_or("the plan request names no task")?;
            if set.task_count == 0 || set.task_count > MAX_TASKS {
                return Err(format!(
                    "task count {} is outside 1..={MAX_TASKS}",
                    set.task_count
                ));
            }
            if key.task_number >= set.task_count {
                return Err(format!(
                    "task {} of a {}-task stage",
                    key.task_number, set.task_count
                ));
            }
            if !set.work_unit_feed_declarations.is_empty() {
                return Err("work-unit feeds are not served by an aisql worker".into());
            }
            check_plan_proto(&set.plan_proto)
        }
        GuardedMethod::ExecuteTask => {
            let req = wire::ExecuteTaskRequest::decode(message)
                .map_err(|e| format!("unreadable task request: {e}"))?;
            let key = req.task_key.ok_or("the task request names no task")?;
            if key.task_number >= MAX_TASKS {
                return Err(format!(
                    "task {} is past the {MAX_TASKS} tasks a stage may have",
                    key.task_number
                ));
            }
            let (start, end) = (req.target_partition_start, req.target_partition_end);
            if start >= end || end - start > MAX_PARTITIONS {
                return Err(format!(
                    "partition range {start}..{end} is empty or longer than {MAX_PARTITIONS}"
                ));
            }
            match req.producer_head {
                Some(wire::ProducerHead::None(_)) => Ok(()),
                Some(_) => Err("a broadcast or repartition head is not served".into()),
                None => Err("the task request has no producer head".into()),
            }
        }
    }
}

/// Checks an encoded plan without decoding it into operators: every node must
/// be an extension node (aisql's or datafusion-distributed's), so no
/// built-in DataFusion operator (a file scan, a sink, …) is even built.
fn check_plan_proto(bytes: &[u8]) -> Result<(), String> {
    let plan = PhysicalPlanNode::decode(bytes).map_err(|e| format!("unreadable plan ({e})"))?;
    let mut stack = vec![&plan];
    let mut seen = 0usize;
    while let Some(node) = stack.pop() {
        seen += 1;
        if seen > MAX_PLAN_NODES {
            return Err(format!("the plan has more than {MAX_PLAN_NODES} nodes"));
        }
        match &node.physical_plan_type {
            Some(PhysicalPlanType::Extension(ext)) => stack.extend(ext.inputs.iter()),
            Some(other) => {
                return Err(format!(
                    "plan node {} is not served: an aisql worker runs only WorkerTaskExec stages",
                    node_name(other)
                ));
            }
            None => return Err("a plan node without a kind".into()),
        }
    }
    Ok(())
}

/// The protobuf variant's name (`CsvScan`, `ParquetSink`, …) of a plan node.
fn node_name(node: &PhysicalPlanType) -> String {
    let shown = format!("{node:?}");
    shown
        .split(|c: char| !c.is_alphanumeric() && c != '_')
        .next()
        .unwrap_or("?")
        .to_string()
}

/// The decoded plan of a task must be one [`WorkerTaskExec`] (possibly under
/// datafusion-distributed's sampler): anything else is refused naming it,
/// before it runs.
pub fn check_worker_plan(plan: &Arc<dyn ExecutionPlan>) -> DfResult<()> {
    let mut at = plan;
    loop {
        if at.downcast_ref::<WorkerTaskExec>().is_some() {
            return Ok(());
        }
        let children = at.children();
        // The sampler datafusion-distributed may put above a stage's plan.
        if at.name() == "SamplerExec" && children.len() == 1 {
            at = children[0];
            continue;
        }
        return Err(DataFusionError::Plan(format!(
            "plan node {} is not served: an aisql worker runs only WorkerTaskExec stages",
            at.name()
        )));
    }
}

/// The token a worker requires, kept as its SHA-256 so that comparing it takes
/// the same time whatever the guess.
#[derive(Clone)]
pub struct TokenDigest([u8; 32]);

impl TokenDigest {
    /// The digest of `token`.
    pub fn of(token: &[u8]) -> Self {
        Self(Sha256::digest(token).into())
    }

    /// Whether `given` is the token, in constant time.
    fn admits(&self, given: &[u8]) -> bool {
        let given: [u8; 32] = Sha256::digest(given).into();
        self.0.ct_eq(&given).into()
    }
}

impl std::fmt::Debug for TokenDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenDigest(..)")
    }
}

/// The guard as a tower layer for tonic's server.
#[derive(Clone, Debug, Default)]
pub struct GuardLayer {
    /// The token every call must carry; `None`: no token asked.
    token: Option<TokenDigest>,
    /// Tasks whose plan was set or refused.
    seen: Arc<std::sync::Mutex<Seen>>,
}

impl GuardLayer {
    /// A guard asking `token` (if any) of every call.
    pub fn new(token: Option<TokenDigest>) -> Self {
        Self {
            token,
            seen: Default::default(),
        }
    }
}

impl<S> tower::Layer<S> for GuardLayer {
    type Service = Guard<S>;

    fn layer(&self, inner: S) -> Guard<S> {
        Guard {
            inner,
            token: self.token.clone(),
            seen: self.seen.clone(),
        }
    }
}

/// The guard in front of service `S`.
#[derive(Clone, Debug)]
pub struct Guard<S> {
    /// The worker service.
    inner: S,
    /// The token every call must carry.
    token: Option<TokenDigest>,
    /// Tasks whose plan was set or refused.
    seen: Arc<std::sync::Mutex<Seen>>,
}

impl<S> tower::Service<http::Request<Body>> for Guard<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        // The ready service answers this call; a clone waits for the next one.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let token = self.token.clone();
        let seen = self.seen.clone();
        Box::pin(async move {
            match admit(request, token.as_ref(), &seen).await {
                Ok(request) => inner.call(request).await,
                Err(status) => Ok(status.into_http()),
            }
        })
    }
}

/// The request, its first message read and checked, or the status refusing it.
async fn admit(
    request: http::Request<Body>,
    token: Option<&TokenDigest>,
    seen: &std::sync::Mutex<Seen>,
) -> Result<http::Request<Body>, Status> {
    if let Some(token) = token {
        let given = request
            .headers()
            .get(TOKEN_HEADER)
            .map(|v| v.as_bytes())
            .unwrap_or_default();
        if !token.admits(given) {
            return Err(Status::unauthenticated(format!(
                "this aisql worker needs its token (header {TOKEN_HEADER}; the coordinator's --worker-token-file or AISQL_WORKER_TOKEN): missing or wrong"
            )));
        }
    }
    let (method, limit) = match request.uri().path() {
        COORDINATOR_CHANNEL => (GuardedMethod::CoordinatorChannel, MAX_MESSAGE_BYTES),
        EXECUTE_TASK => (GuardedMethod::ExecuteTask, MAX_EXECUTE_REQUEST_BYTES),
        _ => return Ok(request),
    };
    let (parts, mut body) = request.into_parts();
    let mut read = BytesMut::new();
    let length = loop {
        if read.len() >= 5 {
            if read[0] != 0 {
                return Err(Status::invalid_argument(
                    "compressed messages are not served by an aisql worker",
                ));
            }
            let length = u32::from_be_bytes([read[1], read[2], read[3], read[4]]) as usize;
            if length > limit {
                return Err(Status::resource_exhausted(format!(
                    "a {length}-byte message is over this worker's {limit}-byte limit"
                )));
            }
            if read.len() >= 5 + length {
                break length;
            }
        }
        match body.frame().await {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(mut data) => {
                    // At most one message plus a frame of data held here.
                    while data.has_remaining() {
                        let chunk = data.chunk();
                        read.extend_from_slice(chunk);
                        let n = chunk.len();
                        data.advance(n);
                    }
                }
                Err(_) => return Err(Status::invalid_argument("the request ended early")),
            },
            Some(Err(status)) => return Err(status),
            None => return Err(Status::invalid_argument("the request ended early")),
        }
    };
    let message = &read[5..5 + length];
    let key = task_key_of(method, message);
    let seen_lock = || seen.lock().unwrap_or_else(|e| e.into_inner());
    let checked = check_request(method, message);
    match method {
        GuardedMethod::CoordinatorChannel => {
            if let Some(key) = key {
                seen_lock().remember(key, checked.clone().err());
            }
        }
        GuardedMethod::ExecuteTask => {
            checked.clone().map_err(Status::permission_denied)?;
            // The plan's request may still be on its way: wait for its verdict.
            if let Some(key) = key {
                let started = std::time::Instant::now();
                loop {
                    let verdict = seen_lock().verdict(&key);
                    match verdict {
                        Some(Some(why)) => return Err(Status::permission_denied(why)),
                        Some(None) => break,
                        None if started.elapsed() >= PLAN_WAIT => break,
                        None => tokio::time::sleep(std::time::Duration::from_millis(5)).await,
                    }
                }
            }
        }
    }
    checked.map_err(Status::permission_denied)?;
    let body = Body::new(Prefixed {
        prefix: Some(read.freeze()),
        rest: body,
    });
    Ok(http::Request::from_parts(parts, body))
}

/// A request body given back: the bytes the guard read, then the rest.
struct Prefixed {
    /// What was read; `None` once handed on.
    prefix: Option<Bytes>,
    /// The body after it.
    rest: Body,
}

impl http_body::Body for Prefixed {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if let Some(prefix) = self.prefix.take() {
            return Poll::Ready(Some(Ok(Frame::data(prefix))));
        }
        std::pin::Pin::new(&mut self.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_none() && self.rest.is_end_stream()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_compared_whole() {
        let t = TokenDigest::of(b"s3cret");
        assert!(t.admits(b"s3cret"));
        for wrong in [&b""[..], b"s3cre", b"s3cret ", b"S3cret"] {
            assert!(!t.admits(wrong), "{wrong:?}");
        }
    }

    #[test]
    fn task_requests_out_of_range_are_refused_before_the_service() {
        let key = || {
            Some(wire::TaskKey {
                query_id: vec![0; 16],
                stage_id: 1,
                task_number: 0,
            })
        };
        let req = |start, end, head| wire::ExecuteTaskRequest {
            task_key: key(),
            target_partition_start: start,
            target_partition_end: end,
            producer_head: head,
        };
        let none = || Some(wire::ProducerHead::None(vec![]));
        let ok = req(0, 1, none()).encode_to_vec();
        assert_eq!(check_request(GuardedMethod::ExecuteTask, &ok), Ok(()));
        for (bad, why) in [
            (req(0, 1 << 40, none()), "partition range"),
            (req(5, 2, none()), "partition range"),
            (req(3, 3, none()), "partition range"),
            (
                req(0, 1, Some(wire::ProducerHead::Broadcast(vec![8, 255]))),
                "broadcast",
            ),
            (req(0, 1, None), "producer head"),
        ] {
            let err = check_request(GuardedMethod::ExecuteTask, &bad.encode_to_vec()).unwrap_err();
            assert!(err.contains(why), "{err}");
        }
        let plan = |task_count, task_number, feeds: Vec<Vec<u8>>| {
            wire::CoordinatorToWorkerMsg {
                inner: Some(wire::Inner::SetPlanRequest(wire::SetPlanRequest {
                    task_key: Some(wire::TaskKey {
                        query_id: vec![0; 16],
                        stage_id: 1,
                        task_number,
                    }),
                    task_count,
                    plan_proto: vec![],
                    work_unit_feed_declarations: feeds,
                })),
            }
            .encode_to_vec()
        };
        for (bad, why) in [
            (plan(u64::MAX, 0, vec![]), "task count"),
            (plan(0, 0, vec![]), "task count"),
            (plan(2, 7, vec![]), "task 7 of a 2-task stage"),
            (plan(2, 0, vec![vec![16, 255, 255, 255, 255, 15]]), "feeds"),
        ] {
            let err = check_request(GuardedMethod::CoordinatorChannel, &bad).unwrap_err();
            assert!(err.contains(why), "{err}");
        }
    }
}
