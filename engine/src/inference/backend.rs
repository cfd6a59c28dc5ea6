//! The inference-backend trait the AI operators call, and the oracle backend
//! that answers from a collection's reference labels.
//!
//! Operators call a backend once per batch of requests, never per row. A batch
//! belongs to one operator ([`AiCall`]) and its requests are ordered so that those
//! sharing an anchor document are adjacent — the order a model backend needs to
//! reuse the document's KV for every partner or question.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Fields};

use crate::error::{EngineError, Result};
use crate::inference::prompt::PromptPieces;
use crate::inference::work::Work;
use crate::limits::spend::Spend;

/// What kind of question an operator asks, and so how its answer is read from
/// the model and what type it has (`"filter"`, `"join"`, `"classify"`, … in
/// manifests and label sets). The SQL functions that ask each kind are in
/// [`crate::exec::ai_functions`]'s registry.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum AiKind {
    /// TRUE/FALSE about one document: one next-token decision (SPEC §B.5).
    Filter,
    /// TRUE/FALSE about a pair.
    Join,
    /// One label for a document or a pair: the best summed label log-probability.
    Classify,
    /// P(TRUE) over the restricted TRUE/FALSE head, for a document or a pair.
    Score,
    /// One probability per label: the softmax of the labels' summed
    /// log-probabilities, from the pass that [`AiKind::Classify`] reads.
    ClassifyScores,
    /// Text: greedy decoding until the end of sequence or `max_tokens`.
    Complete,
    /// Several texts about one document, one per field (the call's labels
    /// name the fields, its descriptions hold their questions), each decoded
    /// after the document's shared KV.
    Extract,
}

impl AiKind {
    /// Every kind.
    pub const ALL: [AiKind; 7] = [
        AiKind::Filter,
        AiKind::Join,
        AiKind::Classify,
        AiKind::Score,
        AiKind::ClassifyScores,
        AiKind::Complete,
        AiKind::Extract,
    ];

    /// The name in manifests, label sets and answer files.
    pub fn name(self) -> &'static str {
        match self {
            AiKind::Filter => "filter",
            AiKind::Join => "join",
            AiKind::Classify => "classify",
            AiKind::Score => "score",
            AiKind::ClassifyScores => "classify_scores",
            AiKind::Complete => "complete",
            AiKind::Extract => "extract",
        }
    }

    /// Whether the answer is a label chosen among the call's labels (or a
    /// probability for each).
    pub fn has_labels(self) -> bool {
        matches!(self, AiKind::Classify | AiKind::ClassifyScores)
    }

    /// Whether the answer is generated text, which costs decoding and which no
    /// reference label set holds.
    pub fn generates(self) -> bool {
        matches!(self, AiKind::Complete | AiKind::Extract)
    }

    /// Whether the answer is TRUE/FALSE (the kinds an `ai_filter` or `ai_join`
    /// operator can filter rows or pairs by).
    pub fn is_decision(self) -> bool {
        matches!(self, AiKind::Filter | AiKind::Join)
    }

    /// The Arrow type of the answers (an SQL call's value): label
    /// probabilities are a list of `{label, probability}` in label order, an
    /// extraction a struct of one text per field (named by `fields`).
    pub fn return_type(self, fields: &[String]) -> DataType {
        match self {
            AiKind::Extract => DataType::Struct(
                fields
                    .iter()
                    .map(|f| Field::new(f, DataType::Utf8, true))
                    .collect(),
            ),
            AiKind::Filter | AiKind::Join => DataType::Boolean,
            AiKind::Classify | AiKind::Complete => DataType::Utf8,
            AiKind::Score => DataType::Float64,
            AiKind::ClassifyScores => DataType::List(Arc::new(Field::new(
                "item",
                DataType::Struct(label_score_fields()),
                true,
            ))),
        }
    }
}

/// The fields of one label probability: `label` and `probability`.
pub fn label_score_fields() -> Fields {
    Fields::from(vec![
        Field::new("label", DataType::Utf8, false),
        Field::new("probability", DataType::Float64, false),
    ])
}

impl AiCall {
    /// The Arrow type of this call's answers.
    pub fn return_type(&self) -> DataType {
        self.kind.return_type(&self.labels)
    }

    /// Whether `other` asks the same question of a document as this call: the
    /// same kind, pieces and what the answer depends on besides them (labels
    /// or fields, their descriptions or questions, `max_tokens`); operators
    /// and tables aside.
    pub fn asks_as(&self, other: &AiCall) -> bool {
        self.kind == other.kind
            && self.pieces == other.pieces
            && self.labels == other.labels
            && self.descriptions == other.descriptions
            && self.max_tokens == other.max_tokens
    }
}

/// One answer to one prompt, typed by the kind of question ([`AiKind`]).
/// Large variants are boxed so that the query's memo keeps 24 bytes a question.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Answer {
    /// A filter's or join's TRUE/FALSE.
    Bool(bool),
    /// A classification: the index of the chosen label in the call's labels.
    Label(u32),
    /// A score: P(TRUE) in [0, 1].
    Score(f64),
    /// One probability per label, in the call's label order, summing to 1.
    LabelScores(Box<[f64]>),
    /// Generated text.
    Text(Box<str>),
    /// One generated text per field of an extraction, in field order.
    Fields(Box<[Box<str>]>),
    /// No answer: the model cannot answer this row (its prompt is longer than
    /// the model's context, its generated tokens are not text). The reason
    /// names the operator and the row. Never cached; what the operator does
    /// with it is `--on-row-error`'s ([`crate::exec::coverage`]).
    Failed(Box<str>),
    /// Not asked: the query's budget was spent first ([`crate::limits::spend`]).
    /// Never cached; the operator fails or leaves the row out
    /// ([`crate::exec::coverage`]).
    Unreached,
}

impl Answer {
    /// Whether this answer has the type `call` asks for (and a label index or
    /// probability list that fits its labels): what every backend's and
    /// worker's answers are checked with.
    /// A failed or unreached question fits every kind.
    pub fn fits(&self, call: &AiCall) -> bool {
        match (call.kind, self) {
            (_, Answer::Failed(_) | Answer::Unreached) => true,
            (AiKind::Filter | AiKind::Join, Answer::Bool(_)) => true,
            (AiKind::Classify, Answer::Label(i)) => (*i as usize) < call.labels.len(),
            (AiKind::Score, Answer::Score(p)) => (0.0..=1.0).contains(p),
            (AiKind::ClassifyScores, Answer::LabelScores(p)) => {
                p.len() == call.labels.len() && p.iter().all(|p| (0.0..=1.0).contains(p))
            }
            (AiKind::Complete, Answer::Text(_)) => true,
            (AiKind::Extract, Answer::Fields(f)) => f.len() == call.labels.len(),
            _ => false,
        }
    }

    /// Whether this is an answer of the model (not [`Answer::Failed`] or
    /// [`Answer::Unreached`]): what may be cached, recorded and shown.
    pub fn is_answer(&self) -> bool {
        !matches!(self, Answer::Failed(_) | Answer::Unreached)
    }

    /// The TRUE/FALSE of a decision, `None` for other answers.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Answer::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// A short description for errors (never a whole generated text).
    pub fn describe(&self) -> String {
        match self {
            Answer::Bool(b) => format!("TRUE/FALSE {b}"),
            Answer::Label(i) => format!("label index {i}"),
            Answer::Score(p) => format!("score {p}"),
            Answer::LabelScores(p) => format!("{} label probabilities", p.len()),
            Answer::Text(t) => format!("a text of {} bytes", t.len()),
            Answer::Fields(f) => format!("{} field texts", f.len()),
            Answer::Failed(_) => "a failed row".into(),
            Answer::Unreached => "no answer (the budget was spent)".into(),
        }
    }
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
    /// Most tokens a generating call ([`AiKind::Complete`], each field of an
    /// [`AiKind::Extract`]) decodes; 0 for other kinds.
    pub max_tokens: u32,
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

/// What a query tells its backend as it begins ([`InferenceBackend::begin`]).
#[derive(Debug, Clone, Default)]
pub struct QueryStart {
    /// The query's AI operators in the order they run (post-order of the
    /// plan): a backend may plan around them.
    pub calls: Vec<AiCall>,
    /// The query's budget meter (`None`: no budget). A backend that runs model
    /// work checks it before each forward batch, charges it what each batch
    /// computed, and answers [`Answer::Unreached`] to the questions it did not
    /// get to once a limit is reached. Backends that compute nothing (an
    /// oracle) ignore it.
    pub spend: Option<Arc<Spend>>,
}

impl QueryStart {
    /// A query of one call and no budget: a tool's or a test's question.
    pub fn one(call: &AiCall) -> Self {
        Self {
            calls: vec![call.clone()],
            spend: None,
        }
    }
}

/// One batch's answers and what computing them cost.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Answered {
    /// One answer per request, in order.
    pub answers: Vec<Answer>,
    /// The work this batch cost its query (fresh and decoded positions, each
    /// worker's share): what the operator that asked adds to its metrics.
    pub work: Work,
}

impl Answered {
    /// Answers that cost nothing measured (an oracle's, a cache's).
    pub fn free(answers: Vec<Answer>) -> Self {
        Self {
            answers,
            work: Work::default(),
        }
    }
}

/// Answers AI questions for queries: the process-wide object (a model with its
/// scheduler, an oracle, remote workers) that each query [`begins`](Self::begin).
///
/// # A query's lifecycle
/// 1. [`InferenceBackend::begin`] with the query's calls and budget: the
///    backend readies what the query needs (a worker is taken, shared
///    workers in [`InferenceBackend::turn_order`]) and returns the query's own
///    [`QueryBackend`]. Until 54's shared scheduler, a backend serves one query
///    at a time: beginning a query stops the one before (after its forward
///    batch in flight).
/// 2. [`QueryBackend::answer`], batch by batch, from the query's AI operators;
///    each batch comes back with the [`Work`] it cost. Meanwhile any thread
///    may [`QueryBackend::cancel`] and then [`QueryBackend::wait_stopped`].
/// 3. [`QueryBackend::work`] once the rows are out: the query's measurements.
/// 4. Dropping the last handle on the [`QueryBackend`] ends the query: a
///    backend shared with other coordinators (an `aisql worker`) may serve the
///    next one.
pub trait InferenceBackend: Send + Sync {
    /// Short name recorded in results (`oracle`, `model`, …).
    fn name(&self) -> &str;

    /// Begins a query (see the trait's lifecycle).
    fn begin(self: Arc<Self>, start: QueryStart) -> Result<Arc<dyn QueryBackend>>;

    /// How many positions of KV the backend can hold, if it caches KV: input
    /// batches are cut so that one batch of documents fits in a fraction of it.
    fn kv_capacity_tokens(&self) -> Option<usize> {
        None
    }

    /// The model's context in positions (`max_position_embeddings`), if the
    /// backend has one: `ai_agg` packs rows into prompts that fit it.
    fn context_positions(&self) -> Option<usize> {
        None
    }

    /// Host memory the backend may add while a query runs, beyond the query's
    /// `--memory-limit`: a model's KV cache on the host and a forward batch's
    /// working memory. The query's heap bound ([`crate::limits::memory_guard`]) leaves
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

    /// Where this backend stands in the order queries take shared backends
    /// (an `aisql worker`'s URL): a coordinator of several begins its query on
    /// them in this order, so that two coordinators sharing workers never each
    /// hold one while waiting for the other's. `None`: not shared.
    fn turn_order(&self) -> Option<String> {
        None
    }
}

impl std::fmt::Debug for dyn InferenceBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "InferenceBackend({})", self.name())
    }
}

/// One query on a backend, from [`InferenceBackend::begin`] until dropped.
pub trait QueryBackend: Send + Sync {
    /// One answer per request, in order, of the type `call.kind` asks for
    /// ([`Answer::fits`]; callers check with [`check_answers`]), with the work
    /// the batch cost.
    fn answer(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Answered>;

    /// The query's measurements so far (SPEC §D.1 keys): the work of its
    /// batches and what the backend measured of the query as a whole (KV
    /// peaks, its settings). A backend that measures nothing reports none.
    fn work(&self) -> Work {
        Work::default()
    }

    /// Asks the query's work in flight to stop soon (a timed-out or
    /// interrupted query); answers after this may fail with a "cancelled"
    /// error.
    fn cancel(&self) {}

    /// Blocks until no model work of the cancelled query is running any more
    /// (at most one forward batch after [`Self::cancel`]). Call it off the
    /// async threads.
    fn wait_stopped(&self) {}

    /// Called when an AI join without equality or residual conditions has
    /// collected its partner side, before its anchors stream in: every anchor
    /// will be paired with each of these documents (distinct by id). A backend
    /// may ask the join's questions ahead of time.
    fn partners_collected(&self, _call: &AiCall, _partners: &[Doc<'_>]) {}
}

/// A backend that keeps nothing per query and measures no work (an oracle
/// answering from labels, a hash): every query is the same to it. Each is an
/// [`InferenceBackend`] whose queries only answer.
pub trait Answerer: Send + Sync + 'static {
    /// Short name recorded in results.
    fn name(&self) -> &str;

    /// One answer per request, in order, of the type `call.kind` asks for.
    fn answer(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Vec<Answer>>;

    /// The context in positions, if the answerer stands for a model with one.
    fn context_positions(&self) -> Option<usize> {
        None
    }
}

impl<A: Answerer> InferenceBackend for A {
    fn name(&self) -> &str {
        Answerer::name(self)
    }

    fn begin(self: Arc<Self>, _start: QueryStart) -> Result<Arc<dyn QueryBackend>> {
        Ok(Arc::new(AnswererQuery(self)))
    }

    fn context_positions(&self) -> Option<usize> {
        Answerer::context_positions(self)
    }
}

/// A query on an [`Answerer`].
struct AnswererQuery<A>(Arc<A>);

impl<A: Answerer> QueryBackend for AnswererQuery<A> {
    fn answer(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Answered> {
        Ok(Answered::free(self.0.answer(call, requests)?))
    }
}

/// `requests` of `call` answered in a query of their own on `backend`: a
/// tool's or a test's one-off question (the answers checked).
pub fn ask_once(
    backend: &Arc<dyn InferenceBackend>,
    call: &AiCall,
    requests: &[AiRequest<'_>],
) -> Result<Vec<Answer>> {
    let query = backend.clone().begin(QueryStart::one(call))?;
    let answers = query.answer(call, requests)?.answers;
    check_answers(call, backend.name(), &answers, requests.len())?;
    Ok(answers)
}

/// Typed views of a query's answers for callers that know the kind they ask
/// (tests, tools): the answers checked and unwrapped.
pub trait AskTyped {
    /// TRUE/FALSE answers of a filter or join call.
    fn decide(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Vec<bool>>;
    /// Chosen label indices of a classification call.
    fn classify(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Vec<usize>>;
}

impl<Q: QueryBackend + ?Sized> AskTyped for Q {
    fn decide(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Vec<bool>> {
        let answers = self.answer(call, requests)?.answers;
        check_answers(call, "the backend", &answers, requests.len())?;
        Ok(require_answered(answers)?
            .iter()
            .filter_map(Answer::as_bool)
            .collect())
    }

    fn classify(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Vec<usize>> {
        let answers = self.answer(call, requests)?.answers;
        check_answers(call, "the backend", &answers, requests.len())?;
        Ok(require_answered(answers)?
            .iter()
            .filter_map(|a| match a {
                Answer::Label(i) => Some(*i as usize),
                _ => None,
            })
            .collect())
    }
}

/// An error unless `who` (the backend, a worker, a cache) gave `call` one
/// answer of its type per question: `want` questions.
pub fn check_answers(call: &AiCall, who: &str, answers: &[Answer], want: usize) -> Result<()> {
    if answers.len() != want {
        return Err(EngineError::Inference(format!(
            "{}: {who} gave {} answers to {want} questions",
            call.op_id,
            answers.len()
        )));
    }
    if let Some((i, bad)) = answers.iter().enumerate().find(|(_, a)| !a.fits(call)) {
        return Err(EngineError::Inference(format!(
            "{}: {who} answered question {} of a {} call with {} ({} labels)",
            call.op_id,
            i + 1,
            call.kind.name(),
            bad.describe(),
            call.labels.len()
        )));
    }
    Ok(())
}

/// `answers` when every one is an answer ([`Answer::is_answer`]): a failed row
/// is an error with its reason, an unreached one says the budget was spent.
/// For callers that apply no `--on-row-error` policy (the row-by-row
/// evaluator, tools); AI operators apply theirs ([`crate::exec::coverage`]).
pub fn require_answered(answers: Vec<Answer>) -> Result<Vec<Answer>> {
    match answers.iter().find(|a| !a.is_answer()) {
        Some(Answer::Failed(reason)) => Err(EngineError::Inference(reason.to_string())),
        Some(_) => Err(EngineError::OverBudget(
            "the query's budget was spent before this question was asked".into(),
        )),
        None => Ok(answers),
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

impl ContentHashBackend {
    /// At most `max_tokens` words (1 to 7) naming `h`.
    fn words(h: u64, max_tokens: u32) -> Box<str> {
        let words = (h % 7 + 1).min(u64::from(max_tokens.max(1)));
        let text: Vec<String> = (0..words)
            .map(|w| format!("w{:x}", (h >> (w * 8)) & 0xff))
            .collect();
        text.join(" ").into()
    }

    /// `h` mixed with `text`: a field's own hash.
    fn hash_text(h: u64, text: &str) -> u64 {
        use sha2::{Digest, Sha256};
        let digest = Sha256::new()
            .chain_update(h.to_le_bytes())
            .chain_update(text.as_bytes())
            .finalize();
        u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"))
    }
}

impl Answerer for ContentHashBackend {
    fn name(&self) -> &str {
        "content-hash"
    }

    /// A small context, so that an `ai_agg` over a few rows takes several
    /// rounds.
    fn context_positions(&self) -> Option<usize> {
        Some(1024)
    }

    /// A decision is TRUE for 45 % of hashes and a score is the hash as a
    /// fraction, so `score > 0.55` ⇔ the decision of the same prompt (as a
    /// model's P(TRUE) > 0.5 ⇔ its decision); a label is the hash modulo the
    /// labels and its probabilities favour it; a text names the prompt's hash
    /// in at most `max_tokens` words.
    fn answer(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Vec<Answer>> {
        self.prompts
            .fetch_add(requests.len(), std::sync::atomic::Ordering::Relaxed);
        let n = call.labels.len().max(1) as u64;
        Ok(requests
            .iter()
            .map(|r| {
                let h = Self::hash(call, r);
                match call.kind {
                    AiKind::Filter | AiKind::Join => Answer::Bool(h % 100 < 45),
                    AiKind::Score => Answer::Score(1.0 - (h % 100) as f64 / 99.0),
                    AiKind::Classify => Answer::Label((h % n) as u32),
                    AiKind::ClassifyScores => {
                        let chosen = (h % n) as usize;
                        let rest = 0.5 / (n as f64 - 1.0).max(1.0);
                        Answer::LabelScores(
                            (0..n as usize)
                                .map(|j| if j == chosen { 0.5 } else { rest })
                                .collect(),
                        )
                    }
                    AiKind::Complete => Answer::Text(Self::words(h, call.max_tokens)),
                    AiKind::Extract => Answer::Fields(
                        call.descriptions
                            .iter()
                            .map(|q| {
                                let field = Self::hash_text(h, q);
                                Self::words(field, call.max_tokens)
                            })
                            .collect(),
                    ),
                }
            })
            .collect())
    }
}

/// An [`AiCall`] of `kind` over tables `t` and `u` for unit tests: `template`'s
/// prompt pieces in the default format, `labels` without descriptions.
#[cfg(test)]
pub(crate) fn test_call(kind: AiKind, template: &str, labels: &[&str]) -> AiCall {
    use crate::inference::prompt::PromptFormat;
    let f = PromptFormat::default();
    let labels: Vec<String> = labels.iter().map(|s| s.to_string()).collect();
    let pieces = crate::inference::prompt::call_pieces(
        f,
        kind,
        template,
        kind == AiKind::Join,
        &labels,
        &vec![String::new(); labels.len()],
    )
    .expect("a template of its kind");
    AiCall {
        op_id: "op-1".into(),
        kind,
        template: template.into(),
        tables: vec!["t".into(), "u".into()],
        columns: vec!["text".into(), "text".into()],
        pieces,
        labels,
        max_tokens: if kind.generates() { 16 } else { 0 },
        descriptions: Vec::new(),
        relations: Vec::new(),
    }
}

/// A test's query on a backend, begun with no calls and no budget: it asks
/// as the backend itself once did, and reaches the backend's own methods.
#[cfg(test)]
pub(crate) struct TestQuery<B> {
    pub backend: Arc<B>,
    pub query: Arc<dyn QueryBackend>,
}

#[cfg(test)]
impl<B> TestQuery<B> {
    /// The query's answers alone.
    pub fn answer(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Vec<Answer>> {
        self.query.answer(call, requests).map(|a| a.answers)
    }

    /// The query's measurements.
    pub fn work(&self) -> Work {
        self.query.work()
    }
}

#[cfg(test)]
impl<B> std::ops::Deref for TestQuery<B> {
    type Target = B;
    fn deref(&self) -> &B {
        &self.backend
    }
}

/// A query begun on `backend` for a test.
#[cfg(test)]
pub(crate) fn begun<B: InferenceBackend + 'static>(backend: B) -> TestQuery<B> {
    let backend = Arc::new(backend);
    let query = backend
        .clone()
        .begin(QueryStart::default())
        .expect("a query begins");
    TestQuery { backend, query }
}

/// One request per `(id, text)` document, no partner: the batch a test asks.
#[cfg(test)]
pub(crate) fn test_requests(docs: &[(String, String)]) -> Vec<AiRequest<'_>> {
    docs.iter()
        .map(|(id, text)| AiRequest {
            anchor: Doc { id, text },
            partner: None,
        })
        .collect()
}

/// A backend with no answers: every question is a [`EngineError::NoAnswer`]
/// error, as an oracle without reference labels gives. For tests that plan,
/// or run queries that ask nothing.
#[cfg(test)]
#[derive(Debug, Default)]
pub(crate) struct NoAnswers;

#[cfg(test)]
impl Answerer for NoAnswers {
    fn name(&self) -> &str {
        "no-answers"
    }

    fn answer(&self, call: &AiCall, _requests: &[AiRequest<'_>]) -> Result<Vec<Answer>> {
        Err(EngineError::NoAnswer(format!(
            "{}: no reference answers for {:?}",
            call.op_id, call.template
        )))
    }
}
