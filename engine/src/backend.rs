//! The inference-backend trait the AI operators call, and the oracle backend
//! that answers from a collection's reference labels.
//!
//! Operators call a backend once per batch of requests, never per row. A batch
//! belongs to one operator ([`AiCall`]) and its requests are ordered so that those
//! sharing an anchor document are adjacent — the order a model backend needs to
//! reuse the document's KV for every partner or question.

use std::sync::Arc;

use crate::error::{EngineError, Result};
use crate::labels::LabelStore;
use crate::prompt::PromptPieces;

/// What kind of question an operator asks, or a predicate of a label set
/// answers (`"filter"`, `"join"`, `"classify"` in manifests).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum AiKind {
    /// `ai_filter`: TRUE/FALSE about one document.
    Filter,
    /// `ai_join`: TRUE/FALSE about a pair.
    Join,
    /// `ai_classify`: one label for a document or a pair.
    Classify,
}

/// One AI operator as the backend sees it (and as it is sent to a worker).
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct AiCall {
    /// Operator id (`filter-1`, `join-2`, `classify-1`).
    pub op_id: String,
    /// Question kind.
    pub kind: AiKind,
    /// Prompt template as written in the plan.
    pub template: String,
    /// Tables of the `{0}` (and `{1}`) documents.
    pub tables: Vec<String>,
    /// Text columns of the `{0}` (and `{1}`) documents.
    pub columns: Vec<String>,
    /// Rendered fixed pieces of the operator's prompts.
    pub pieces: PromptPieces,
    /// Classification labels (tie-break order).
    pub labels: Vec<String>,
    /// One description per label ("" = none).
    pub descriptions: Vec<String>,
    /// Relations (aliases, as the plan names them) of the `{0}` (and `{1}`)
    /// documents; empty when not known. One table read under two names is read
    /// twice, which a scheduler may plan around.
    pub relations: Vec<String>,
}

/// A document in a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Doc<'a> {
    /// Row id.
    pub id: &'a str,
    /// Text the prompt embeds.
    pub text: &'a str,
}

/// One prompt to answer: the anchor (`{0}`) document and, for two-document
/// operators, the partner (`{1}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AiRequest<'a> {
    /// The `{0}` document.
    pub anchor: Doc<'a>,
    /// The `{1}` document.
    pub partner: Option<Doc<'a>>,
}

/// Answers AI questions in batches.
pub trait InferenceBackend: Send + Sync {
    /// Short name recorded in results (`oracle`, `model`, …).
    fn name(&self) -> &str;

    /// TRUE/FALSE answers for a filter or join, one per request, in order.
    fn decide(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Vec<bool>>;

    /// Chosen label index (into `call.labels`) per request, in order.
    fn classify(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Vec<usize>>;

    /// Engine measurements for the query so far (e.g. `fresh_tokens`), reset by
    /// [`InferenceBackend::start_query`]. Keys follow SPEC §D.1.
    fn measurements(&self) -> serde_json::Map<String, serde_json::Value> {
        serde_json::Map::new()
    }

    /// How many positions of KV the backend can hold, if it caches KV: input
    /// batches are cut so that one batch of documents fits in a fraction of it.
    fn kv_capacity_tokens(&self) -> Option<usize> {
        None
    }

    /// Host memory the backend may add while a query runs, beyond the query's
    /// `--memory-limit`: a model's KV cache on the host and a forward batch's
    /// working memory. The query's heap bound ([`crate::memory_guard`]) leaves
    /// it this much room; 0 for backends that hold nothing per query.
    fn host_memory_allowance(&self) -> usize {
        0
    }

    /// Whether the backend reuses work between prompts (document KV, answers to
    /// a question asked again). When it does not (`--prefix-cache off`), every
    /// operator's every question is computed from its first token: the baseline
    /// input tokens measure. The query's answer memo then only spares an
    /// operator asking itself twice.
    fn reuses_work(&self) -> bool {
        false
    }

    /// Asks work in flight to stop soon (a timed-out or interrupted query); calls
    /// after this may fail with a "cancelled" error until the next query starts.
    fn cancel(&self) {}

    /// Blocks until no model work of a cancelled query is running any more (at
    /// most one forward batch after [`Self::cancel`]). Call it off the async
    /// threads.
    fn wait_stopped(&self) {}

    /// Called before a query runs with its AI operators in the order they run
    /// (post-order of the plan): a backend may plan around them.
    fn start_query(&self, _operators: &[AiCall]) {}

    /// Called when the query started by [`Self::start_query`] is over (its rows
    /// and measurements taken, or it failed): a backend shared with other
    /// coordinators (an `aisql worker`) may serve the next one.
    fn end_query(&self) {}

    /// Where this backend stands in the order queries take shared backends
    /// (an `aisql worker`'s URL): a coordinator of several starts its query on
    /// them in this order, so that two coordinators sharing workers never each
    /// hold one while waiting for the other's. `None`: not shared.
    fn turn_order(&self) -> Option<String> {
        None
    }

    /// Called when an AI join without equality or residual conditions has
    /// collected its partner side, before its anchors stream in: every anchor
    /// will be paired with each of these documents (distinct by id). A backend
    /// may ask the join's questions ahead of time.
    fn partners_collected(&self, _call: &AiCall, _partners: &[Doc<'_>]) {}
}

/// An error unless `who` (the backend, a worker) gave `call` as many answers,
/// `got`, as it was asked questions, `want`.
pub fn check_answer_count(call: &AiCall, who: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(EngineError::Inference(format!(
            "{}: {who} gave {got} answers to {want} questions",
            call.op_id
        )));
    }
    Ok(())
}

/// Answers every question from the reference labels of a collection: the
/// relational half of the engine can be proved exact before any model runs.
#[derive(Debug, Clone)]
pub struct OracleBackend {
    labels: Arc<LabelStore>,
}

impl OracleBackend {
    /// An oracle over `labels`.
    pub fn new(labels: Arc<LabelStore>) -> Self {
        Self { labels }
    }
}

impl InferenceBackend for OracleBackend {
    fn name(&self) -> &str {
        "oracle"
    }

    fn decide(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Vec<bool>> {
        let set = self.labels.require_template(&call.template, &call.op_id)?;
        requests
            .iter()
            .map(|r| set.require_bool(r.anchor.id, r.partner.map(|p| p.id)))
            .collect()
    }

    fn classify(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Vec<usize>> {
        let set = self.labels.require_template(&call.template, &call.op_id)?;
        requests
            .iter()
            .map(|r| {
                let label = set.require_label(r.anchor.id, r.partner.map(|p| p.id))?;
                call.labels.iter().position(|l| l == label).ok_or_else(|| {
                    EngineError::Labels(format!(
                        "{}: reference label {label:?} is not among the plan's labels",
                        call.op_id
                    ))
                })
            })
            .collect()
    }
}

/// Answers from a hash of the prompt's template and document texts: about 45 %
/// TRUE, one label per prompt, always the same for the same prompt. Not a model:
/// the reference of differential tests and fuzzing, where two ways of running
/// one query must ask about the same prompts and get the same answers. Counts
/// the prompts it answers.
#[derive(Debug, Default)]
pub struct ContentHashBackend {
    prompts: std::sync::atomic::AtomicUsize,
}

impl ContentHashBackend {
    /// Prompts answered so far.
    pub fn prompts(&self) -> usize {
        self.prompts.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn hash(call: &AiCall, r: &AiRequest<'_>) -> u64 {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(call.template.as_bytes());
        h.update([0]);
        h.update(r.anchor.text.as_bytes());
        h.update([0]);
        if let Some(p) = r.partner {
            h.update(p.text.as_bytes());
        }
        u64::from_le_bytes(h.finalize()[..8].try_into().expect("8 bytes"))
    }
}

impl InferenceBackend for ContentHashBackend {
    fn name(&self) -> &str {
        "content-hash"
    }

    fn decide(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Vec<bool>> {
        self.prompts
            .fetch_add(requests.len(), std::sync::atomic::Ordering::Relaxed);
        Ok(requests
            .iter()
            .map(|r| Self::hash(call, r) % 100 < 45)
            .collect())
    }

    fn classify(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Vec<usize>> {
        self.prompts
            .fetch_add(requests.len(), std::sync::atomic::Ordering::Relaxed);
        let n = call.labels.len().max(1) as u64;
        Ok(requests
            .iter()
            .map(|r| (Self::hash(call, r) % n) as usize)
            .collect())
    }
}

/// An [`AiCall`] of `kind` over tables `t` and `u` for unit tests: `template`'s
/// prompt pieces in the default format, `labels` without descriptions.
#[cfg(test)]
pub(crate) fn test_call(kind: AiKind, template: &str, labels: &[&str]) -> AiCall {
    use crate::prompt::{PromptFormat, classify_pieces, filter_pieces, join_pieces};
    let f = PromptFormat::default();
    let labels: Vec<String> = labels.iter().map(|s| s.to_string()).collect();
    let pieces = match kind {
        AiKind::Filter => filter_pieces(f, template).expect("a filter template"),
        AiKind::Join => join_pieces(f, template),
        AiKind::Classify => {
            classify_pieces(f, template, &labels, &vec![String::new(); labels.len()])
                .expect("a classification template")
        }
    };
    AiCall {
        op_id: "op-1".into(),
        kind,
        template: template.into(),
        tables: vec!["t".into(), "u".into()],
        columns: vec!["text".into(), "text".into()],
        pieces,
        labels,
        descriptions: Vec::new(),
        relations: Vec::new(),
    }
}
