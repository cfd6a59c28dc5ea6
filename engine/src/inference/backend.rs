//! The backend traits the AI operators call: [`InferenceBackend`], the
//! process-wide object each query begins on; [`QueryBackend`], one query's
//! own object, which answers and measures it (the lifecycle is on
//! [`InferenceBackend`]); and [`Answerer`], for backends that keep nothing per
//! query (the content-hash reference here, the benchmark's oracle).
//!
//! Operators call a query once per batch of requests, never per row. A batch
//! belongs to one operator ([`AiCall`]) and its requests are ordered so that those
//! sharing an anchor document are adjacent — the order a model backend needs to
//! reuse the document's KV for every partner or question.

use std::sync::{Arc, Mutex};

use crate::error::{EngineError, Result};
pub use crate::inference::call::{AiCall, AiKind, AiRequest, Answer, Doc, label_score_fields};
use crate::inference::work::Work;
use crate::limits::spend::Spend;

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
    /// Whether the query may use the KV that earlier queries left (a
    /// session's later question over the same documents computes only what
    /// it does not find). `false`: a query that runs alone starts from
    /// nothing, so that its fresh tokens are all its own work (the
    /// benchmark's rule, and a tool's or a test's question).
    pub reuse_earlier_kv: bool,
}

impl QueryStart {
    /// A query of one call and no budget: a tool's or a test's question.
    pub fn one(call: &AiCall) -> Self {
        Self {
            calls: vec![call.clone()],
            ..Self::default()
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

    /// The size of the model's embeddings (its hidden size), if the backend
    /// has a model: the dimensions of an `ai_embed` that gives none.
    fn embedding_dims(&self) -> Option<u32> {
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

    /// The on-disk KV store the backend reads documents' KV from
    /// (`--kv-store`), if it has one: an estimate counts what it holds as
    /// read, not computed.
    fn kv_store(&self) -> Option<Arc<crate::inference::kv_store::KvStore>> {
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

/// The query of a plan without AI operators: nothing of the backend is
/// touched unless a call comes after all (none should), when the backend's
/// query begins. A plain statement never waits for the model, whatever
/// other queries it is running.
pub struct QueryWithoutCalls {
    backend: Arc<dyn InferenceBackend>,
    start: QueryStart,
    begun: Mutex<Option<Arc<dyn QueryBackend>>>,
    cancelled: std::sync::atomic::AtomicBool,
}

impl QueryWithoutCalls {
    /// A query on `backend` that declared no calls (`start.calls` is empty).
    pub fn new(backend: Arc<dyn InferenceBackend>, start: QueryStart) -> Self {
        Self {
            backend,
            start,
            begun: Mutex::new(None),
            cancelled: Default::default(),
        }
    }

    fn begun(&self) -> Option<Arc<dyn QueryBackend>> {
        self.begun.lock().expect("query lock").clone()
    }
}

impl QueryBackend for QueryWithoutCalls {
    fn answer(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Answered> {
        let query = {
            let mut begun = self.begun.lock().expect("query lock");
            if self.cancelled.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(EngineError::Inference(format!("{}: cancelled", call.op_id)));
            }
            match &*begun {
                Some(q) => q.clone(),
                None => {
                    let q = self.backend.clone().begin(self.start.clone())?;
                    *begun = Some(q.clone());
                    q
                }
            }
        };
        query.answer(call, requests)
    }

    fn work(&self) -> Work {
        self.begun().map(|q| q.work()).unwrap_or_default()
    }

    fn cancel(&self) {
        self.cancelled
            .store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(q) = self.begun() {
            q.cancel();
        }
    }

    fn wait_stopped(&self) {
        if let Some(q) = self.begun() {
            q.wait_stopped();
        }
    }
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
        Ok(requests
            .iter()
            .map(|r| {
                let h = Self::hash(call, r);
                call.kind.describe().hashed(call, h)
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
    let pieces = crate::inference::kinds::call_pieces(
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
        max_tokens: match kind {
            AiKind::Embed => 8,
            k if k.generates() => 16,
            _ => 0,
        },
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
