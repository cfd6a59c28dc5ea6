//! The engines that compute KV for the scheduler: the real model
//! ([`ModelExecutor`]) and the simulation over a virtual KV ([`SimExecutor`]),
//! which answers from labels and counts the positions the model would compute.

use std::sync::Arc;

use aisql_models::{
    ClassifyRequest, Continuation, FinishReason, GenerateRequest, KvHandle, Qwen3, TokenConstraint,
    Tokenizer,
};

use crate::error::Result;
use crate::inference::backend::{AiCall, AiRequest, Answer, Answerer};
use crate::inference::field_type::{FieldType, OR_NULL};
use crate::inference::grammar::Grammars;
use crate::inference::key_trie::KeyTrie;
use crate::inference::kinds::{ModelReading, SampleSoFar, answer_type, declarations, embedding_of};
pub use crate::inference::kinds::{best_label, label_probabilities};
use crate::inference::kv_cache::KvOps;
use crate::inference::prompt::Excerpt;

/// What the scheduler asks of an execution engine (the model or a simulation).
pub trait Executor: Send + Sync + 'static {
    /// KV handle type.
    type Kv: KvOps + Send + Sync;
    /// Name recorded in results.
    fn name(&self) -> &str;
    /// Prefills each `(parent, tokens)`; one handle per item.
    fn prefill(&self, items: &[(Option<&Self::Kv>, &[u32])]) -> Result<Vec<Self::Kv>>;
    /// The answer of `call`'s kind after each `(prefix, suffix)`; the suffix may
    /// be empty when the prefix ends with the whole prompt. `requests` are the
    /// matching prompts; `labels` the token ids of each `" " + label` (label
    /// kinds). A generation gives up between two decode steps once `stopped()`
    /// (a cancelled query).
    fn answer(
        &self,
        call: &AiCall,
        requests: &[AiRequest<'_>],
        items: &[(Option<&Self::Kv>, &[u32])],
        labels: &[Vec<u32>],
        stopped: &dyn Fn() -> bool,
    ) -> Result<Vec<Answer>>;
    /// Positions computed so far: prompts and decoded tokens (label
    /// continuations excluded).
    fn fresh_tokens(&self) -> u64;
    /// Decoded positions computed so far (part of [`Self::fresh_tokens`]).
    fn decode_tokens(&self) -> u64;
    /// Seconds spent in generating calls so far (0 where none are timed).
    fn decode_seconds(&self) -> f64 {
        0.0
    }
    /// Token masks computed for typed answers so far, and their seconds.
    fn typed_masks(&self) -> (u64, f64) {
        (0, 0.0)
    }
    /// Label-continuation positions computed so far.
    fn label_tokens(&self) -> u64;
    /// KV bytes per cached position (for the budget check).
    fn kv_bytes_per_token(&self) -> usize;
    /// Longest prompt the model was trained for (`max_position_embeddings`).
    fn max_positions(&self) -> usize;
    /// Every position `kv` covers as bytes for the on-disk KV store
    /// ([`crate::inference::kv_store`]); `None` where the executor holds no
    /// tensors (the simulation).
    fn kv_to_bytes(&self, _kv: &Self::Kv) -> Result<Option<Vec<u8>>> {
        Ok(None)
    }
    /// Handles for the stored positions `cuts[i]..cuts[i + 1]` of `bytes`
    /// ([`Self::kv_to_bytes`]'s), the first continuing `parent`; an error
    /// when the bytes do not fit this model.
    fn kv_from_bytes(
        &self,
        _parent: Option<&Self::Kv>,
        _bytes: &[u8],
        _cuts: &[usize],
    ) -> Result<Vec<Self::Kv>> {
        Err(crate::error::EngineError::Inference(format!(
            "{} reads no stored KV",
            self.name()
        )))
    }
    /// Stand-ins for the stored positions `cuts[i]..cuts[i + 1]` continuing
    /// `parent`, for an executor that holds no tensors (the simulation): an
    /// estimate counts what the store holds as read, without reading it.
    /// `None` for an executor that reads the bytes ([`Self::kv_from_bytes`]).
    fn stored_stand_ins(
        &self,
        _parent: Option<&Self::Kv>,
        _cuts: &[usize],
    ) -> Option<Vec<Self::Kv>> {
        None
    }
    /// The size of the model's embeddings (its hidden size); `None` for a
    /// simulation, which stands for no particular model.
    fn embedding_dims(&self) -> Option<u32> {
        None
    }
    /// Bytes per second the simulation charges for moving KV between device
    /// and host memory; `None` where the moves really happen (their time is
    /// in the query's).
    fn simulated_link_bytes_per_second(&self) -> Option<f64> {
        None
    }
}

/// The host link the simulation assumes: PCIe 5 ×16, about 50 GB/s, as an
/// H200's host has.
pub const SIMULATED_LINK_BYTES_PER_SECOND: f64 = 50e9;

impl KvOps for KvHandle {
    fn prefix(&self, len: usize) -> Result<Self> {
        Ok(KvHandle::prefix(self, len)?)
    }
    fn bytes(&self) -> usize {
        self.segment_bytes()
    }
    fn len(&self) -> usize {
        KvHandle::len(self)
    }
    fn segment_len(&self) -> usize {
        KvHandle::segment_len(self)
    }
    fn is_resident(&self) -> bool {
        KvHandle::is_resident(self)
    }
    fn host_bytes(&self) -> usize {
        KvHandle::host_bytes(self)
    }
    fn offload(&self) -> Result<()> {
        Ok(KvHandle::offload(self)?)
    }
    fn restore(&self) -> Result<()> {
        Ok(KvHandle::restore(self)?)
    }
}

/// The real model.
pub struct ModelExecutor {
    model: Arc<Qwen3>,
    answers: aisql_models::AnswerIds,
    /// Turns generated ids into text.
    tokenizer: Tokenizer,
    /// Where a generation ends (Qwen3's `<|im_end|>`, `<|endoftext|>`).
    stop_ids: Vec<u32>,
    name: String,
    /// Nanoseconds spent in generating calls (prefill of their questions and
    /// decoding), for decode tokens/s.
    decode_nanos: std::sync::atomic::AtomicU64,
    /// The token masks of typed answers, built by the first typed call.
    grammars: std::sync::OnceLock<std::result::Result<Grammars, String>>,
    /// The token tries of sets of values, by the set's spelling.
    key_tries: std::sync::Mutex<std::collections::HashMap<String, Arc<KeyTrie>>>,
}

/// One generated text, or why there is none.
enum Generated {
    Text(Box<str>),
    /// The tokens are not text (the tokenizer's error).
    Unreadable(String),
    /// The text is not a whole answer of its type within `max_tokens`.
    Incomplete,
}

/// Sequences decoded side by side in one generating call: each decode step is
/// one packed forward over this many rows.
const GENERATION_BATCH: usize = 32;

impl ModelExecutor {
    /// The name a model's backend goes by in EXPLAIN and run records.
    pub const NAME: &'static str = "model";

    /// Wraps a loaded model; `tokenizer` gives the TRUE/FALSE and stop ids
    /// and reads generated text.
    pub fn new(model: Arc<Qwen3>, tokenizer: &Tokenizer, name: impl Into<String>) -> Result<Self> {
        Ok(Self {
            answers: tokenizer.answer_ids()?,
            stop_ids: tokenizer.stop_ids(),
            tokenizer: tokenizer.clone(),
            model,
            name: name.into(),
            decode_nanos: Default::default(),
            grammars: std::sync::OnceLock::new(),
            key_tries: Default::default(),
        })
    }

    /// The id that ends a typed answer: the first stop id.
    fn answer_stop(&self) -> Result<u32> {
        self.stop_ids.first().copied().ok_or_else(|| {
            crate::error::EngineError::Inference("the tokenizer has no stop id".into())
        })
    }

    /// The grammars of typed answers over this model's vocabulary.
    pub fn grammars(&self) -> Result<&Grammars> {
        self.grammars
            .get_or_init(|| {
                Grammars::new(
                    &self.tokenizer,
                    self.model.config().vocab_size,
                    self.answer_stop().map_err(|e| e.to_string())?,
                )
                .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| crate::error::EngineError::Inference(e.clone()))
    }

    /// A constraint for each of `types` (`None` for free text): a set of
    /// values is followed by its token trie (built once per set), another
    /// type by its grammar.
    fn constraints(&self, types: &[&FieldType]) -> Result<Vec<Option<Box<dyn TokenConstraint>>>> {
        types
            .iter()
            .map(|t| match t {
                FieldType::Text => Ok(None),
                FieldType::Enum { values, or_null } => {
                    Ok(Some(self.key_trie(t, values)?.walk(*or_null)))
                }
                t => self.grammars()?.constraint(t),
            })
            .collect()
    }

    /// The token trie of the set of values `ty` (one for `ENUM(...)` and
    /// `ENUM(...) OR NULL`).
    fn key_trie(&self, ty: &FieldType, values: &[String]) -> Result<Arc<KeyTrie>> {
        let spelled = ty.to_string();
        let key = spelled
            .strip_suffix(OR_NULL)
            .unwrap_or(&spelled)
            .to_string();
        let mut tries = self.key_tries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(trie) = tries.get(&key) {
            return Ok(trie.clone());
        }
        // A few sets at once (a trie of 100,000 keys is tens of MB): past
        // them all are dropped, and built again when next asked.
        if tries.len() >= 8 {
            tries.clear();
        }
        let trie = Arc::new(KeyTrie::new(
            &self.tokenizer,
            values,
            self.model.config().vocab_size,
            self.answer_stop()?,
        )?);
        tries.insert(key, trie.clone());
        Ok(trie)
    }

    /// Greedy texts after each `(prefix, prompt)` item, `max_tokens` at most,
    /// each in the grammar of its type (`types[i]`); an item whose tokens
    /// cannot be read as text, or whose typed text is not whole, says so
    /// instead (that row fails, not the batch).
    fn generate(
        &self,
        items: &[(Option<&KvHandle>, Vec<u32>)],
        types: &[&FieldType],
        max_tokens: u32,
        stopped: &dyn Fn() -> bool,
    ) -> Result<Vec<Generated>> {
        let started = std::time::Instant::now();
        let requests: Vec<GenerateRequest<'_>> = items
            .iter()
            .map(|(p, t)| GenerateRequest::new(*p, t, max_tokens as usize))
            .collect();
        let mut constraints = self.constraints(types)?;
        let generated = self.model.generate_constrained_until(
            &requests,
            &mut constraints,
            &self.stop_ids,
            GENERATION_BATCH,
            stopped,
        )?;
        self.decode_nanos.fetch_add(
            started.elapsed().as_nanos() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        Ok(generated
            .iter()
            .zip(&mut constraints)
            .map(|(g, c)| {
                if let Some(c) = c.as_mut()
                    && !c.is_complete()
                {
                    // A walk that left its set before a whole value answers
                    // none; one that ran out of tokens answers nothing.
                    return match c.may_leave() && g.finish == FinishReason::Stop {
                        true => Generated::Text("".into()),
                        false => Generated::Incomplete,
                    };
                }
                match self.tokenizer.decode(&g.token_ids) {
                    Ok(text) => Generated::Text(text.into()),
                    Err(e) => Generated::Unreadable(e.to_string()),
                }
            })
            .collect())
    }
}

impl Executor for ModelExecutor {
    type Kv = KvHandle;

    fn name(&self) -> &str {
        &self.name
    }

    fn prefill(&self, items: &[(Option<&KvHandle>, &[u32])]) -> Result<Vec<KvHandle>> {
        let conts: Vec<Continuation<'_>> = items
            .iter()
            .map(|(p, t)| Continuation::new(*p, t))
            .collect();
        Ok(self.model.prefill_batch(&conts)?)
    }

    fn kv_to_bytes(&self, kv: &KvHandle) -> Result<Option<Vec<u8>>> {
        Ok(Some(self.model.kv_to_bytes(kv)?))
    }

    fn kv_from_bytes(
        &self,
        parent: Option<&KvHandle>,
        bytes: &[u8],
        cuts: &[usize],
    ) -> Result<Vec<KvHandle>> {
        Ok(self.model.kv_from_bytes(parent, bytes, cuts)?)
    }

    fn answer(
        &self,
        call: &AiCall,
        requests: &[AiRequest<'_>],
        items: &[(Option<&KvHandle>, &[u32])],
        labels: &[Vec<u32>],
        stopped: &dyn Fn() -> bool,
    ) -> Result<Vec<Answer>> {
        // Tokens that are not text, or a typed text that is not whole, fail
        // their row only.
        let failed = |i: usize, why: String| {
            let row = requests.get(i).map_or("", |r| r.anchor.id);
            Answer::Failed(format!("{}: row {}: {why}", call.op_id, Excerpt(row)).into())
        };
        let unreadable = |e: &str| format!("the tokens generated cannot be read as text: {e}");
        let conts = || -> Vec<Continuation<'_>> {
            items
                .iter()
                .map(|(p, t)| Continuation::new(*p, t))
                .collect()
        };
        let label_scores = || -> Result<Vec<Vec<f32>>> {
            let reqs: Vec<ClassifyRequest<'_>> = items
                .iter()
                .map(|(p, t)| ClassifyRequest {
                    prefix: *p,
                    prompt: t,
                    labels,
                })
                .collect();
            Ok(self.model.classify(&reqs)?)
        };
        Ok(match call.kind.describe().reading() {
            ModelReading::Decision(read) => self
                .model
                .decide(&conts(), &self.answers)?
                .iter()
                .map(|d| read(d.answer, d.p_true()))
                .collect(),
            ModelReading::Labels(read) => label_scores()?.iter().map(|s| read(s)).collect(),
            ModelReading::Text => {
                let prompts: Vec<(Option<&KvHandle>, Vec<u32>)> =
                    items.iter().map(|(p, t)| (*p, t.to_vec())).collect();
                let ty = answer_type(&call.labels);
                let types = vec![&*ty; prompts.len()];
                self.generate(&prompts, &types, call.max_tokens, stopped)?
                    .into_iter()
                    .enumerate()
                    .map(|(i, text)| match text {
                        Generated::Text(text) => Answer::Text(text),
                        Generated::Unreadable(e) => failed(i, unreadable(&e)),
                        Generated::Incomplete => failed(
                            i,
                            format!(
                                "no whole {} answer within max_tokens {}",
                                *ty, call.max_tokens
                            ),
                        ),
                    })
                    .collect()
            }
            ModelReading::FieldTexts => {
                // Every field of an item continues the same prefix (the
                // document's KV): its question, then the decoded answer.
                let prompts: Vec<(Option<&KvHandle>, Vec<u32>)> = items
                    .iter()
                    .flat_map(|(p, t)| {
                        labels
                            .iter()
                            .map(move |q| (*p, [*t, q.as_slice()].concat()))
                    })
                    .collect();
                let fields = declarations(&call.labels);
                let types: Vec<&FieldType> = items
                    .iter()
                    .flat_map(|_| fields.iter().map(|f| &f.ty))
                    .collect();
                let texts = self.generate(&prompts, &types, call.max_tokens, stopped)?;
                texts
                    .chunks(labels.len().max(1))
                    .enumerate()
                    .map(|(i, answers)| {
                        let mut texts = Vec::with_capacity(answers.len());
                        for (field, answer) in fields.iter().zip(answers) {
                            match answer {
                                Generated::Text(t) => texts.push(t.clone()),
                                Generated::Unreadable(e) => {
                                    return failed(
                                        i,
                                        format!("field {}: {}", field.name, unreadable(e)),
                                    );
                                }
                                Generated::Incomplete => {
                                    return failed(
                                        i,
                                        format!(
                                            "field {} has no whole {} answer within max_tokens {}",
                                            field.name, field.ty, call.max_tokens
                                        ),
                                    );
                                }
                            }
                        }
                        Answer::Fields(texts.into())
                    })
                    .collect()
            }
            ModelReading::Embedding => self
                .model
                .final_hidden_states(&conts())?
                .iter()
                .enumerate()
                .map(|(i, hidden)| match embedding_of(hidden, call.max_tokens) {
                    Ok(v) => Answer::Vector(v),
                    Err(e) => {
                        let row = requests.get(i).map_or("", |r| r.anchor.id);
                        Answer::Failed(format!("{}: row {}: {e}", call.op_id, Excerpt(row)).into())
                    }
                })
                .collect(),
        })
    }

    fn fresh_tokens(&self) -> u64 {
        self.model.fresh_tokens() - self.model.label_tokens()
    }

    fn decode_tokens(&self) -> u64 {
        self.model.decode_tokens()
    }

    fn decode_seconds(&self) -> f64 {
        self.decode_nanos.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1e9
    }

    fn label_tokens(&self) -> u64 {
        self.model.label_tokens()
    }

    fn typed_masks(&self) -> (u64, f64) {
        match self.grammars.get() {
            Some(Ok(g)) => g.cost().totals(),
            _ => (0, 0.0),
        }
    }

    fn kv_bytes_per_token(&self) -> usize {
        self.model.kv_bytes_per_token()
    }

    fn max_positions(&self) -> usize {
        self.model.config().max_position_embeddings
    }

    fn embedding_dims(&self) -> Option<u32> {
        u32::try_from(self.model.config().hidden_size).ok()
    }
}

/// A virtual KV: only the positions it covers.
#[derive(Debug, Clone)]
pub struct VirtualKv {
    len: usize,
    segment: usize,
    bytes_per_token: usize,
    /// Shared by clones, as a real handle's place is: offloading one offloads all.
    resident: Arc<std::sync::atomic::AtomicBool>,
}

impl VirtualKv {
    pub(super) fn new(len: usize, segment: usize, bytes_per_token: usize, resident: bool) -> Self {
        Self {
            len,
            segment,
            bytes_per_token,
            resident: Arc::new(std::sync::atomic::AtomicBool::new(resident)),
        }
    }
}

impl KvOps for VirtualKv {
    fn prefix(&self, len: usize) -> Result<Self> {
        // A real view copies the positions of its own segment it keeps.
        let start = self.len - self.segment;
        Ok(VirtualKv::new(
            len,
            if len > start { len - start } else { len },
            self.bytes_per_token,
            self.is_resident(),
        ))
    }
    fn bytes(&self) -> usize {
        if self.is_resident() {
            self.segment * self.bytes_per_token
        } else {
            0
        }
    }
    fn len(&self) -> usize {
        self.len
    }
    fn segment_len(&self) -> usize {
        self.segment
    }
    fn is_resident(&self) -> bool {
        self.resident.load(std::sync::atomic::Ordering::Relaxed)
    }
    fn host_bytes(&self) -> usize {
        if self.is_resident() {
            0
        } else {
            self.segment * self.bytes_per_token
        }
    }
    fn offload(&self) -> Result<()> {
        self.resident
            .store(false, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
    fn restore(&self) -> Result<()> {
        self.resident
            .store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

/// Bytes per position the simulation charges by default: Qwen3-4B in bf16
/// (36 layers × K and V × 8 KV heads × 128 dims × 2 bytes).
pub const QWEN3_4B_KV_BYTES_PER_TOKEN: usize = 147_456;

/// Qwen3-4B's `max_position_embeddings`: the simulation refuses longer prompts
/// as the model would.
pub const QWEN3_4B_MAX_POSITIONS: usize = 40_960;

/// The simulation: no forward passes; answers from another backend (the
/// reference labels, or an estimate's sampled answers); counts positions.
pub struct SimExecutor {
    answers: Arc<dyn Answerer>,
    bytes_per_token: usize,
    max_positions: usize,
    fresh: std::sync::atomic::AtomicU64,
    labels: std::sync::atomic::AtomicU64,
    decoded: std::sync::atomic::AtomicU64,
    /// Prompt positions of the questions answered, each in full (what the
    /// model reads, computed or reused).
    input: std::sync::atomic::AtomicU64,
    /// Positions attended by the fresh prompt positions, and by the decoded
    /// ones: what attention costs beyond the per-token work (a time estimate
    /// charges it apart).
    attended_prefill: std::sync::atomic::AtomicU64,
    attended_decode: std::sync::atomic::AtomicU64,
    /// Label tokens whose log-probability a classification reads, each from
    /// the full vocabulary (a filter reads a restricted head).
    scored: std::sync::atomic::AtomicU64,
}

impl SimExecutor {
    /// A simulation answering from `answers` (the benchmark's oracle, say),
    /// charging `bytes_per_token` of KV per cached position (the model it
    /// stands for: Qwen3-4B's context).
    pub fn new(answers: Arc<dyn Answerer>, bytes_per_token: usize) -> Self {
        Self::answering(answers, bytes_per_token, QWEN3_4B_MAX_POSITIONS)
    }

    /// A simulation of a model of `max_positions` whose answers come from
    /// `answers`.
    pub fn answering(
        answers: Arc<dyn Answerer>,
        bytes_per_token: usize,
        max_positions: usize,
    ) -> Self {
        Self {
            answers,
            bytes_per_token,
            max_positions,
            fresh: Default::default(),
            labels: Default::default(),
            decoded: Default::default(),
            input: Default::default(),
            attended_prefill: Default::default(),
            attended_decode: Default::default(),
            scored: Default::default(),
        }
    }

    /// Prompt positions of every question answered, each counted in full.
    pub fn input_tokens(&self) -> u64 {
        self.input.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Positions attended by fresh prompt positions (each position attends
    /// to itself and all before it).
    pub fn attended_prefill(&self) -> u64 {
        self.attended_prefill
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Positions attended by decoded positions.
    pub fn attended_decode(&self) -> u64 {
        self.attended_decode
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Label tokens scored over the full vocabulary.
    pub fn scored_positions(&self) -> u64 {
        self.scored.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Counts `t` fresh positions after `before` cached ones.
    fn attend(&self, before: usize, t: usize) {
        let (p, t) = (before as u64, t as u64);
        self.attended_prefill.fetch_add(
            t * p + t * (t + 1) / 2,
            std::sync::atomic::Ordering::Relaxed,
        );
    }
}

impl Executor for SimExecutor {
    type Kv = VirtualKv;

    fn name(&self) -> &str {
        "simulation"
    }

    fn stored_stand_ins(
        &self,
        _parent: Option<&VirtualKv>,
        cuts: &[usize],
    ) -> Option<Vec<VirtualKv>> {
        Some(
            cuts.windows(2)
                .map(|w| VirtualKv::new(w[1], w[1] - w[0], self.bytes_per_token, true))
                .collect(),
        )
    }

    fn prefill(&self, items: &[(Option<&VirtualKv>, &[u32])]) -> Result<Vec<VirtualKv>> {
        Ok(items
            .iter()
            .map(|(p, t)| {
                self.fresh
                    .fetch_add(t.len() as u64, std::sync::atomic::Ordering::Relaxed);
                self.attend(p.map_or(0, |k| k.len), t.len());
                VirtualKv::new(
                    p.map_or(0, |k| k.len) + t.len(),
                    t.len(),
                    self.bytes_per_token,
                    true,
                )
            })
            .collect())
    }

    /// Counts the prompt positions fed, the label positions a classification
    /// scores and the positions a generation decodes: `max_tokens` - 1 each
    /// (the first token is read from the prompt's last position; the
    /// simulation cannot know where a text would end, so it counts the
    /// bound). Texts are empty: no label set holds generated text.
    fn answer(
        &self,
        call: &AiCall,
        requests: &[AiRequest<'_>],
        items: &[(Option<&VirtualKv>, &[u32])],
        labels: &[Vec<u32>],
        _stopped: &dyn Fn() -> bool,
    ) -> Result<Vec<Answer>> {
        use std::sync::atomic::Ordering::Relaxed;
        let fed: usize = items.iter().map(|(_, t)| t.len()).sum();
        self.fresh.fetch_add(fed as u64, Relaxed);
        let prompts: usize = items
            .iter()
            .map(|(p, t)| p.map_or(0, |k| k.len) + t.len())
            .sum();
        self.input.fetch_add(prompts as u64, Relaxed);
        for (p, t) in items {
            self.attend(p.map_or(0, |k| k.len), t.len());
        }
        if call.kind.has_labels() {
            let label_fed: usize = labels.iter().map(|l| l.len().saturating_sub(1)).sum();
            self.labels
                .fetch_add((label_fed * items.len()) as u64, Relaxed);
            let label_tokens: usize = labels.iter().map(Vec::len).sum();
            self.scored
                .fetch_add((label_tokens * items.len()) as u64, Relaxed);
        }
        if call.kind.generates() {
            // A kind asked per field prefills each field's question after
            // the document and decodes each field.
            let per_field = matches!(call.kind.describe().reading(), ModelReading::FieldTexts);
            let questions: usize = if per_field {
                labels.iter().map(Vec::len).sum()
            } else {
                0
            };
            // Each text decodes its bound (a typed field's grammar's, else
            // max_tokens) less the first token, read from the prompt.
            let steps: Vec<u64> = call
                .decode_bounds()
                .iter()
                .map(|&b| u64::from(b.saturating_sub(1)))
                .collect();
            let decoded = steps.iter().sum::<u64>() * items.len() as u64;
            self.fresh
                .fetch_add((questions * items.len()) as u64 + decoded, Relaxed);
            self.decoded.fetch_add(decoded, Relaxed);
            // Each decoded position attends to its prompt and the positions
            // decoded before it.
            let attended: u64 = items
                .iter()
                .map(|(p, t)| {
                    let prompt = (p.map_or(0, |k| k.len) + t.len()) as u64;
                    steps
                        .iter()
                        .map(|s| prompt * s + s * (s + 1) / 2)
                        .sum::<u64>()
                })
                .sum();
            self.attended_decode.fetch_add(attended, Relaxed);
            // What the kind draws with no sample: empty texts, a value of
            // its type for a typed one.
            let mut carry = None;
            let nothing = SampleSoFar {
                selectivity: 0.0,
                carry: &mut carry,
                label_counts: &[],
                examples: &[],
            };
            let answer = call.kind.describe().drawn(call, nothing, 0.0);
            return Ok(vec![answer; requests.len()]);
        }
        self.answers.answer(call, requests)
    }

    fn fresh_tokens(&self) -> u64 {
        self.fresh.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn decode_tokens(&self) -> u64 {
        self.decoded.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn label_tokens(&self) -> u64 {
        self.labels.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn kv_bytes_per_token(&self) -> usize {
        self.bytes_per_token
    }

    fn max_positions(&self) -> usize {
        self.max_positions
    }

    fn simulated_link_bytes_per_second(&self) -> Option<f64> {
        Some(SIMULATED_LINK_BYTES_PER_SECOND)
    }
}
