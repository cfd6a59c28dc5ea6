//! What a coordinator asks an `aisql worker` and what the worker answers: one
//! [`WorkerMessage`] per [`InferenceBackend`](crate::inference::backend::InferenceBackend)
//! call, carried inside a [`WorkerTaskExec`](super::WorkerTaskExec).
//!
//! Messages are JSON: they hold prompts and documents (text) and small answer
//! lists, and a readable wire format makes a mismatch between two aisql builds a
//! clear error instead of garbage. A request's documents are sent once each and
//! referenced by index, because a join anchor is paired with many partners.
//!
//! Every message that belongs to a query travels in a [`WorkerTask`] naming the
//! coordinator's query ([`QueryId`]): a worker shared by several coordinators
//! serves their queries one at a time and refuses a message of a query that is
//! not the one it serves (see [`super::worker`]).

use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};
use crate::inference::answer_cache::AnswerIdentity;
use crate::inference::backend::{AiCall, AiRequest, Answer, Doc};

/// The protocol version both sides must speak (v4: an answer may be
/// `Failed`, a row the model cannot answer, or `Unreached`; v5: answers come
/// with their work and the query's, and no message asks for measurements;
/// v6: a query's start says whether it may use the KV earlier queries left).
pub const PROTOCOL: &str = "aisql-worker-v6";

/// A coordinator's query, as its worker messages name it: random per query, so
/// two coordinators of one worker never name the same query.
pub type QueryId = u64;

/// What a [`WorkerTaskExec`](super::WorkerTaskExec) carries: a message and the
/// query it belongs to (`None` for [`WorkerMessage::Hello`] and
/// [`WorkerMessage::Nothing`], which belong to none).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerTask {
    /// The coordinator's query.
    pub query: Option<QueryId>,
    /// What it asks.
    pub message: WorkerMessage,
}

impl WorkerTask {
    /// `message`, outside any query.
    pub fn outside_query(message: WorkerMessage) -> Self {
        Self {
            query: None,
            message,
        }
    }
}

/// A document as sent: its row id and text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireDoc {
    /// Row id.
    pub id: String,
    /// Text the prompt embeds.
    pub text: String,
}

/// A batch of requests as sent: distinct documents, and per request the index
/// of its anchor and of its partner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireRequests {
    /// Each document of the batch once.
    pub docs: Vec<WireDoc>,
    /// `(anchor, partner)` indexes into `docs`, in the batch's order.
    pub requests: Vec<(u32, Option<u32>)>,
}

impl WireRequests {
    /// `requests` with each distinct document (same id and text) sent once.
    pub fn new<'a>(requests: &[AiRequest<'a>]) -> Self {
        let mut index: std::collections::HashMap<(&'a str, &'a str), u32> = Default::default();
        let mut docs = Vec::new();
        let mut place = |doc: Doc<'a>| -> u32 {
            *index.entry((doc.id, doc.text)).or_insert_with(|| {
                docs.push(WireDoc {
                    id: doc.id.to_string(),
                    text: doc.text.to_string(),
                });
                (docs.len() - 1) as u32
            })
        };
        let requests = requests
            .iter()
            .map(|r| (place(r.anchor), r.partner.map(&mut place)))
            .collect();
        Self { docs, requests }
    }

    /// The requests again, borrowing the documents; an index out of range is an
    /// error (a corrupted or foreign message).
    pub fn requests(&self) -> Result<Vec<AiRequest<'_>>> {
        let doc = |i: u32| -> Result<Doc<'_>> {
            let d = self.docs.get(i as usize).ok_or_else(|| {
                EngineError::Inference(format!(
                    "worker message names document {i} of {}",
                    self.docs.len()
                ))
            })?;
            Ok(Doc {
                id: &d.id,
                text: &d.text,
            })
        };
        self.requests
            .iter()
            .map(|&(a, p)| {
                Ok(AiRequest {
                    anchor: doc(a)?,
                    partner: p.map(doc).transpose()?,
                })
            })
            .collect()
    }
}

/// One call of the coordinator on a worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WorkerMessage {
    /// Who are you: answered with [`WorkerReply::Hello`].
    Hello,
    /// [`InferenceBackend::begin`](crate::inference::backend::InferenceBackend::begin):
    /// waits for the worker's turn, then begins the query on its backend.
    StartQuery {
        /// The query's AI operators, in the order they run.
        calls: Vec<AiCall>,
        /// [`QueryStart::reuse_earlier_kv`](crate::inference::backend::QueryStart::reuse_earlier_kv).
        reuse_earlier_kv: bool,
    },
    /// [`QueryBackend::partners_collected`](crate::inference::backend::QueryBackend::partners_collected).
    PartnersCollected(AiCall, Vec<WireDoc>),
    /// [`QueryBackend::answer`](crate::inference::backend::QueryBackend::answer):
    /// answered with [`WorkerReply::Answered`].
    Answer(AiCall, WireRequests),
    /// [`QueryBackend::cancel`](crate::inference::backend::QueryBackend::cancel).
    Cancel,
    /// [`QueryBackend::wait_stopped`](crate::inference::backend::QueryBackend::wait_stopped).
    WaitStopped,
    /// Nothing: the second task of a one-worker stage (see [`super::remote`]).
    Nothing,
    /// The coordinator's query is over (its query object dropped): the worker
    /// may serve the next one.
    EndQuery,
}

/// What a worker serves, as it tells a coordinator that says hello.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerHello {
    /// [`PROTOCOL`] of the worker's build.
    pub protocol: String,
    /// aisql version of the worker's build.
    pub version: String,
    /// Backend name (`model`).
    pub backend: String,
    /// The model it serves: name, weights and tokenizer hashes, dtype. Its
    /// `prompt_format` is the coordinator's to set: prompts arrive rendered.
    pub identity: AnswerIdentity,
    /// Device and model facts for run records (`device`, `dtype`, …).
    pub meta: crate::inference::backend_meta::BackendMeta,
    /// [`InferenceBackend::kv_capacity_tokens`](crate::inference::backend::InferenceBackend::kv_capacity_tokens).
    pub kv_capacity_tokens: Option<usize>,
    /// [`InferenceBackend::context_positions`](crate::inference::backend::InferenceBackend::context_positions).
    #[serde(default)]
    pub context_positions: Option<usize>,
    /// [`InferenceBackend::reuses_work`](crate::inference::backend::InferenceBackend::reuses_work).
    pub reuses_work: bool,
}

/// A worker's answer to one [`WorkerMessage`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WorkerReply {
    /// To [`WorkerMessage::Hello`].
    Hello(Box<WorkerHello>),
    /// Done, nothing to return.
    Done,
    /// To [`WorkerMessage::Answer`]: typed answers, in request order, with
    /// what they cost and the query's measurements so far on the worker.
    Answered(Box<AnsweredReply>),
    /// The worker's backend failed; its error, as text.
    Failed(String),
}

/// A worker's answers to one [`WorkerMessage::Answer`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AnsweredReply {
    /// One per request, in order.
    pub answers: Vec<Answer>,
    /// What this batch cost.
    pub work: crate::inference::work::Work,
    /// The query's measurements on the worker, this batch included.
    pub query_work: crate::inference::work::Work,
}

/// A [`WorkerTask`] read back from the bytes a
/// [`WorkerTaskExec`](super::WorkerTaskExec) travels as; bytes that are not
/// one are an error.
pub fn decode_task(bytes: &[u8]) -> Result<WorkerTask> {
    decode(bytes, "worker task")
}

/// `value` as message bytes.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("worker messages serialise")
}

/// A message read back from `bytes`; `what` names it in the error.
pub fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8], what: &str) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| {
        EngineError::Inference(format!(
            "unreadable {what} ({e}): are both sides the same aisql build ({PROTOCOL})?"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_are_sent_once_and_requests_come_back_equal() {
        let a = Doc { id: "1", text: "a" };
        let b = Doc { id: "2", text: "b" };
        let requests = [
            AiRequest {
                anchor: a,
                partner: Some(b),
            },
            AiRequest {
                anchor: a,
                partner: Some(a),
            },
            AiRequest {
                anchor: b,
                partner: None,
            },
        ];
        let wire = WireRequests::new(&requests);
        assert_eq!(wire.docs.len(), 2);
        let back: WireRequests = decode(&encode(&wire), "requests").unwrap();
        assert_eq!(back.requests().unwrap(), requests);
    }

    #[test]
    fn an_index_past_the_documents_is_an_error_not_a_panic() {
        let wire = WireRequests {
            docs: vec![],
            requests: vec![(0, None)],
        };
        let err = wire.requests().unwrap_err().to_string();
        assert!(err.contains("document 0 of 0"), "{err}");
        let err = decode::<WorkerMessage>(b"{\"Nope\":1}", "worker message")
            .unwrap_err()
            .to_string();
        assert!(err.contains("unreadable worker message"), "{err}");
    }
}
