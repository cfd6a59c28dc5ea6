//! The inference-backend trait the AI operators call, and the oracle backend
//! that answers from a collection's reference labels.
//!
//! Operators call a backend once per batch of requests, never per row. A batch
//! belongs to one operator ([`AiCall`]) and its requests are ordered so that those
//! sharing an anchor document are adjacent — the order a model backend needs to
//! reuse the document's KV for every partner or question.

use std::sync::Arc;

use crate::error::{EngineError, Result};
pub use crate::inference::call::{AiCall, AiKind, AiRequest, Answer, Doc, label_score_fields};
use crate::limits::spend::Spend;

/// Answers AI questions in batches.
pub trait InferenceBackend: Send + Sync {
    /// Short name recorded in results (`oracle`, `model`, …).
    fn name(&self) -> &str;

    /// One answer per request, in order, of the type `call.kind` asks for
    /// ([`Answer::fits`]; callers check with [`check_answers`]).
    fn answer(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Vec<Answer>>;

    /// Engine measurements for the query so far (e.g. `fresh_tokens`), reset by
    /// [`InferenceBackend::start_query`]. Keys follow SPEC §D.1; a backend that
    /// measures nothing reports none.
    fn measurements(&self) -> crate::inference::work::Work {
        crate::inference::work::Work::default()
    }

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

    /// Called right after [`Self::start_query`] with the query's budget meter
    /// (`None`: no budget). A backend that runs model work checks it before
    /// each forward batch, charges it what each batch computed, and answers
    /// [`Answer::Unreached`] to the questions it did not get to once a limit
    /// is reached. Backends that compute nothing (the oracle) ignore it.
    fn meter_query(&self, _spend: Option<Arc<Spend>>) {}

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

/// Typed views of [`InferenceBackend::answer`] for callers that know the
/// kind they ask (tests, tools): the answers checked and unwrapped.
pub trait AskTyped {
    /// TRUE/FALSE answers of a filter or join call.
    fn decide(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Vec<bool>>;
    /// Chosen label indices of a classification call.
    fn classify(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Vec<usize>>;
}

impl<B: InferenceBackend + ?Sized> AskTyped for B {
    fn decide(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Vec<bool>> {
        let answers = self.answer(call, requests)?;
        check_answers(call, self.name(), &answers, requests.len())?;
        Ok(require_answered(answers)?
            .iter()
            .filter_map(Answer::as_bool)
            .collect())
    }

    fn classify(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Vec<usize>> {
        let answers = self.answer(call, requests)?;
        check_answers(call, self.name(), &answers, requests.len())?;
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

impl InferenceBackend for ContentHashBackend {
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
        max_tokens: if kind.generates() { 16 } else { 0 },
        descriptions: Vec::new(),
        relations: Vec::new(),
    }
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
impl InferenceBackend for NoAnswers {
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
