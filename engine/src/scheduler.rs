//! Plan-aware execution of AI operators on a model: the [`ScheduledBackend`].
//!
//! Every prompt is `preamble + document + suffix`, tokenized piece by piece. The
//! backend keeps two levels of prefix cache (radix tries of KV handles, see
//! [`crate::kv_cache`]):
//!
//! 1. a **document trie** over `preamble + document` for every document asked
//!    about (filter/classification subjects, join anchors). Documents that share
//!    leading tokens — agent-trace snapshots of one trajectory — share KV;
//! 2. per document, a **suffix trie** rooted at the document's KV holding the
//!    questions asked of it (filter and classification tails, join frames), so
//!    a chain of filters or a filter then a join computes each question's shared
//!    start once and reuses the document KV for all of them.
//!
//! Join partners (and joined-row classifications) are scored as packed batches
//! of `label + partner + tail` suffixes on top of the anchor's
//! `preamble + anchor + frame` KV, never cached; a pair asked twice with the same
//! prompt pieces is answered from a memo. This is exactly the structure of
//! QUAIL-B's minimum-token rule (SPEC §D.4), so with enough KV memory the fresh
//! tokens equal the minimum. Inserting a batch's sequences before computing them
//! makes every distinct prefix computed once, in waves of packed forward passes
//! bounded by a token budget.
//!
//! The cache lives for one query (fresh tokens are per query). When it outgrows
//! the KV budget, least recently used documents (with their questions) are
//! evicted — costing recomputation, never a wrong answer — and documents of
//! tables no later operator reads are dropped as soon as their last operator
//! starts.
//!
//! The same code runs over a virtual KV ([`SimExecutor`]): the simulation mode
//! answers from labels and reports the fresh tokens the model would compute.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use aisql_models::{ClassifyRequest, Continuation, KvHandle, Qwen3, Tokenizer};

use crate::backend::{AiCall, AiKind, AiRequest, InferenceBackend, OracleBackend};
use crate::error::{EngineError, Result};
use crate::kv_cache::{KvOps, NodeId, PrefixTrie};
use crate::prompt::label_continuations;
use crate::query_gate::{QueryGate, Ticket};

/// What the scheduler asks of an execution engine (the model or a simulation).
pub trait Executor: Send + Sync {
    /// KV handle type.
    type Kv: KvOps + Send + Sync;
    /// Name recorded in results.
    fn name(&self) -> &str;
    /// Prefills each `(parent, tokens)`; one handle per item.
    fn prefill(&self, items: &[(Option<&Self::Kv>, &[u32])]) -> Result<Vec<Self::Kv>>;
    /// TRUE/FALSE after each `(prefix, suffix)`; the suffix may be empty when the
    /// prefix ends with the whole prompt. `requests` are the matching prompts.
    fn decide(
        &self,
        call: &AiCall,
        requests: &[AiRequest<'_>],
        items: &[(Option<&Self::Kv>, &[u32])],
    ) -> Result<Vec<bool>>;
    /// Label index after each `(prefix, suffix)`, scoring `labels` (token ids of `" " + label`).
    fn classify(
        &self,
        call: &AiCall,
        requests: &[AiRequest<'_>],
        items: &[(Option<&Self::Kv>, &[u32])],
        labels: &[Vec<u32>],
    ) -> Result<Vec<usize>>;
    /// Prompt positions computed so far (label continuations excluded).
    fn fresh_tokens(&self) -> u64;
    /// Label-continuation positions computed so far.
    fn label_tokens(&self) -> u64;
    /// KV bytes per cached position (for the budget check).
    fn kv_bytes_per_token(&self) -> usize;
    /// Longest prompt the model was trained for (`max_position_embeddings`).
    fn max_positions(&self) -> usize;
}

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
}

/// The real model.
pub struct ModelExecutor {
    model: Arc<Qwen3>,
    answers: aisql_models::AnswerIds,
    name: String,
}

impl ModelExecutor {
    /// Wraps a loaded model; `tokenizer` gives the TRUE/FALSE ids.
    pub fn new(model: Arc<Qwen3>, tokenizer: &Tokenizer, name: impl Into<String>) -> Result<Self> {
        Ok(Self {
            answers: tokenizer.answer_ids()?,
            model,
            name: name.into(),
        })
    }
}

/// Index of the best score; ties go to the earlier label (SPEC §B.5).
pub fn best_label(scores: &[f32]) -> usize {
    let mut best = 0;
    for (i, &s) in scores.iter().enumerate() {
        if s > scores[best] {
            best = i;
        }
    }
    best
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

    fn decide(
        &self,
        _call: &AiCall,
        _requests: &[AiRequest<'_>],
        items: &[(Option<&KvHandle>, &[u32])],
    ) -> Result<Vec<bool>> {
        let conts: Vec<Continuation<'_>> = items
            .iter()
            .map(|(p, t)| Continuation::new(*p, t))
            .collect();
        Ok(self
            .model
            .decide(&conts, &self.answers)?
            .into_iter()
            .map(|d| d.answer)
            .collect())
    }

    fn classify(
        &self,
        _call: &AiCall,
        _requests: &[AiRequest<'_>],
        items: &[(Option<&KvHandle>, &[u32])],
        labels: &[Vec<u32>],
    ) -> Result<Vec<usize>> {
        let reqs: Vec<ClassifyRequest<'_>> = items
            .iter()
            .map(|(p, t)| ClassifyRequest {
                prefix: *p,
                prompt: t,
                labels,
            })
            .collect();
        Ok(self
            .model
            .classify(&reqs)?
            .iter()
            .map(|s| best_label(s))
            .collect())
    }

    fn fresh_tokens(&self) -> u64 {
        self.model.fresh_tokens() - self.model.label_tokens()
    }

    fn label_tokens(&self) -> u64 {
        self.model.label_tokens()
    }

    fn kv_bytes_per_token(&self) -> usize {
        self.model.kv_bytes_per_token()
    }

    fn max_positions(&self) -> usize {
        self.model.config().max_position_embeddings
    }
}

/// A virtual KV: only the positions it covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VirtualKv {
    len: usize,
    segment: usize,
    bytes_per_token: usize,
}

impl KvOps for VirtualKv {
    fn prefix(&self, len: usize) -> Result<Self> {
        Ok(VirtualKv {
            len,
            segment: len.min(self.segment),
            bytes_per_token: self.bytes_per_token,
        })
    }
    fn bytes(&self) -> usize {
        self.segment * self.bytes_per_token
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// Bytes per position the simulation charges by default: Qwen3-4B in bf16
/// (36 layers × K and V × 8 KV heads × 128 dims × 2 bytes).
pub const QWEN3_4B_KV_BYTES_PER_TOKEN: usize = 147_456;

/// Qwen3-4B's `max_position_embeddings`: the simulation refuses longer prompts
/// as the model would.
pub const QWEN3_4B_MAX_POSITIONS: usize = 40_960;

/// The simulation: no forward passes; answers from labels; counts positions.
pub struct SimExecutor {
    oracle: OracleBackend,
    bytes_per_token: usize,
    fresh: std::sync::atomic::AtomicU64,
    labels: std::sync::atomic::AtomicU64,
}

impl SimExecutor {
    /// A simulation answering from `oracle`, charging `bytes_per_token` of KV
    /// per cached position (the model it stands for).
    pub fn new(oracle: OracleBackend, bytes_per_token: usize) -> Self {
        Self {
            oracle,
            bytes_per_token,
            fresh: Default::default(),
            labels: Default::default(),
        }
    }
}

impl Executor for SimExecutor {
    type Kv = VirtualKv;

    fn name(&self) -> &str {
        "simulation"
    }

    fn prefill(&self, items: &[(Option<&VirtualKv>, &[u32])]) -> Result<Vec<VirtualKv>> {
        Ok(items
            .iter()
            .map(|(p, t)| {
                self.fresh
                    .fetch_add(t.len() as u64, std::sync::atomic::Ordering::Relaxed);
                VirtualKv {
                    len: p.map_or(0, |k| k.len) + t.len(),
                    segment: t.len(),
                    bytes_per_token: self.bytes_per_token,
                }
            })
            .collect())
    }

    fn decide(
        &self,
        call: &AiCall,
        requests: &[AiRequest<'_>],
        items: &[(Option<&VirtualKv>, &[u32])],
    ) -> Result<Vec<bool>> {
        let fed: usize = items.iter().map(|(_, t)| t.len()).sum();
        self.fresh
            .fetch_add(fed as u64, std::sync::atomic::Ordering::Relaxed);
        self.oracle.decide(call, requests)
    }

    fn classify(
        &self,
        call: &AiCall,
        requests: &[AiRequest<'_>],
        items: &[(Option<&VirtualKv>, &[u32])],
        labels: &[Vec<u32>],
    ) -> Result<Vec<usize>> {
        let fed: usize = items.iter().map(|(_, t)| t.len()).sum();
        let label_fed: usize = labels.iter().map(|l| l.len().saturating_sub(1)).sum();
        self.fresh
            .fetch_add(fed as u64, std::sync::atomic::Ordering::Relaxed);
        self.labels.fetch_add(
            (label_fed * items.len()) as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        self.oracle.classify(call, requests)
    }

    fn fresh_tokens(&self) -> u64 {
        self.fresh.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn label_tokens(&self) -> u64 {
        self.labels.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn kv_bytes_per_token(&self) -> usize {
        self.bytes_per_token
    }

    fn max_positions(&self) -> usize {
        QWEN3_4B_MAX_POSITIONS
    }
}

/// Scheduling knobs.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Reuse KV across prompts (off: every prompt computed from scratch).
    pub prefix_cache: bool,
    /// KV memory budget in bytes.
    pub kv_budget_bytes: usize,
    /// Tokens per forward batch.
    pub batch_tokens: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            prefix_cache: true,
            kv_budget_bytes: default_kv_budget_bytes(),
            batch_tokens: 8192,
        }
    }
}

/// A quarter of the memory available now, at most 16 GiB.
pub fn default_kv_budget_bytes() -> usize {
    let available = crate::host_memory::meminfo_bytes("MemAvailable").unwrap_or(8 << 30);
    (available / 4).min(16 << 30)
}

/// One document: its table, text column and row id. Typed, so that a table or
/// column whose name holds a dot cannot make two documents one key (and share KV).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct DocKey {
    table: String,
    column: String,
    id: String,
}

impl DocKey {
    fn new(table: &str, column: &str, id: &str) -> Self {
        Self {
            table: table.to_string(),
            column: column.to_string(),
            id: id.to_string(),
        }
    }
}

/// Memo key of a pair question: which prompt (its number in [`Cache::groups`]),
/// anchor and partner. The number stands for the exact prompt pieces and kind, so
/// two different prompts never share answers (a 64-bit hash could collide).
type MemoKey = (u32, DocKey, DocKey);

#[derive(Default)]
struct Tokens {
    docs: HashMap<DocKey, Arc<Vec<u32>>>,
    pieces: HashMap<String, Arc<Vec<u32>>>,
}

struct Cache<K> {
    docs: PrefixTrie<K>,
    doc_nodes: HashMap<DocKey, NodeId>,
    suffixes: HashMap<DocKey, PrefixTrie<K>>,
    /// The prompts asked in this query, numbered for [`MemoKey`].
    groups: HashMap<(AiKind, crate::prompt::PromptPieces), u32>,
    memo_bool: HashMap<MemoKey, bool>,
    memo_label: HashMap<MemoKey, usize>,
    /// Per document, the call that last used it (eviction order).
    last_used: HashMap<DocKey, u64>,
    calls: u64,
}

impl<K: KvOps> Cache<K> {
    fn new() -> Self {
        Self {
            docs: PrefixTrie::new(None),
            doc_nodes: HashMap::new(),
            suffixes: HashMap::new(),
            groups: HashMap::new(),
            memo_bool: HashMap::new(),
            memo_label: HashMap::new(),
            last_used: HashMap::new(),
            calls: 0,
        }
    }

    fn bytes(&self) -> usize {
        self.docs.bytes() + self.suffixes.values().map(PrefixTrie::bytes).sum::<usize>()
    }
}

struct QueryState<K> {
    cache: Cache<K>,
    /// Per AI operator in post-order: (op id, anchor table).
    ops: Vec<(String, String)>,
    fresh_start: u64,
    label_start: u64,
    peak_bytes: usize,
    evictions: u64,
    current_op: Option<String>,
}

/// The model backend: plan-aware scheduling over an [`Executor`].
pub struct ScheduledBackend<E: Executor> {
    exec: E,
    tokenizer: Tokenizer,
    config: SchedulerConfig,
    tokens: Mutex<Tokens>,
    state: Mutex<QueryState<E::Kv>>,
    gate: QueryGate,
}

impl<E: Executor> ScheduledBackend<E> {
    /// A backend over `exec`, tokenizing with `tokenizer`.
    pub fn new(exec: E, tokenizer: Tokenizer, config: SchedulerConfig) -> Self {
        Self {
            exec,
            tokenizer,
            config,
            tokens: Mutex::new(Tokens::default()),
            state: Mutex::new(QueryState {
                cache: Cache::new(),
                ops: Vec::new(),
                fresh_start: 0,
                label_start: 0,
                peak_bytes: 0,
                evictions: 0,
                current_op: None,
            }),
            gate: QueryGate::default(),
        }
    }

    /// The executor.
    pub fn executor(&self) -> &E {
        &self.exec
    }

    fn piece(&self, text: &str) -> Result<Arc<Vec<u32>>> {
        let mut t = self.tokens.lock().expect("tokens lock");
        if let Some(ids) = t.pieces.get(text) {
            return Ok(ids.clone());
        }
        let ids = Arc::new(self.tokenizer.encode(text)?);
        t.pieces.insert(text.to_string(), ids.clone());
        Ok(ids)
    }

    /// Refuses a prompt of `len` positions (label continuations included) that is
    /// longer than the model's context: past `max_position_embeddings` its answer
    /// would be silently wrong, so the row is named instead.
    /// `row` and `table` are formatted only for the error (this runs for every pair).
    fn check_context(
        &self,
        op_id: &str,
        row: impl std::fmt::Display,
        table: impl std::fmt::Display,
        len: usize,
    ) -> Result<()> {
        let max = self.exec.max_positions();
        if len > max {
            return Err(EngineError::Inference(format!(
                "{op_id}: the prompt for row {row} of {table} is {len} tokens, longer than the \
                 model's context of {max} positions (max_position_embeddings); shorten that \
                 document, or leave the row out with a WHERE clause"
            )));
        }
        Ok(())
    }

    /// Positions of the longest label continuation a classification scores after
    /// its prompt (0 for yes/no questions).
    fn longest_label(&self, call: &AiCall) -> Result<usize> {
        label_continuations(&call.labels)
            .iter()
            .map(|l| self.piece(l).map(|v| v.len()))
            .try_fold(0, |m, n| n.map(|n| m.max(n)))
    }

    /// Token ids of documents, tokenized once per (table, column, id).
    fn docs(&self, table: &str, column: &str, docs: &[(&str, &str)]) -> Result<Vec<Arc<Vec<u32>>>> {
        let key = |id: &str| DocKey::new(table, column, id);
        let missing: Vec<(&str, &str)> = {
            let t = self.tokens.lock().expect("tokens lock");
            let mut seen = HashSet::new();
            docs.iter()
                .filter(|(id, _)| !t.docs.contains_key(&key(id)) && seen.insert(*id))
                .copied()
                .collect()
        };
        if !missing.is_empty() {
            let texts: Vec<&str> = missing.iter().map(|(_, text)| *text).collect();
            let encoded = self.tokenizer.encode_documents(&texts)?;
            let mut t = self.tokens.lock().expect("tokens lock");
            for ((id, _), ids) in missing.iter().zip(encoded) {
                t.docs.insert(key(id), Arc::new(ids));
            }
        }
        let t = self.tokens.lock().expect("tokens lock");
        Ok(docs
            .iter()
            .map(|(id, _)| t.docs[&key(id)].clone())
            .collect())
    }

    /// Called at each operator's first batch: drops documents of tables that no
    /// remaining operator asks about.
    fn enter_operator(&self, state: &mut QueryState<E::Kv>, op_id: &str) {
        if state.current_op.as_deref() == Some(op_id) {
            return;
        }
        state.current_op = Some(op_id.to_string());
        let Some(pos) = state.ops.iter().position(|(id, _)| id == op_id) else {
            return;
        };
        let needed: HashSet<String> = state.ops[pos..].iter().map(|(_, t)| t.clone()).collect();
        let cache = &mut state.cache;
        cache.doc_nodes.retain(|k, _| needed.contains(&k.table));
        let docs = &cache.doc_nodes;
        cache.suffixes.retain(|k, _| docs.contains_key(k));
        let keep: HashSet<NodeId> = cache.doc_nodes.values().copied().collect();
        cache.docs.retain(&keep);
    }

    /// Keeps the cache within the budget. Documents of the current call are
    /// kept; among the others, the least recently used go first, each with its
    /// question trie, then shared prefixes no document holds any more.
    fn enforce_budget(&self, state: &mut QueryState<E::Kv>, keep: &HashSet<DocKey>) {
        let mut held = state.cache.bytes();
        state.peak_bytes = state.peak_bytes.max(held);
        let budget = self.config.kv_budget_bytes;
        if held <= budget {
            return;
        }
        let cache = &mut state.cache;
        let mut victims: Vec<(u64, DocKey)> = cache
            .last_used
            .iter()
            .filter(|(k, _)| !keep.contains(*k))
            .map(|(k, &t)| (t, k.clone()))
            .collect();
        victims.sort_unstable();
        let keep_nodes: HashSet<NodeId> = keep
            .iter()
            .filter_map(|k| cache.doc_nodes.get(k).copied())
            .collect();
        for (_, k) in victims {
            if held <= budget {
                break;
            }
            cache.last_used.remove(&k);
            if let Some(t) = cache.suffixes.remove(&k) {
                held -= t.bytes();
                state.evictions += 1;
            }
            if let Some(node) = cache.doc_nodes.remove(&k) {
                // Another document with the same text may still use the node.
                let shared =
                    keep_nodes.contains(&node) || cache.doc_nodes.values().any(|&n| n == node);
                if !shared {
                    held -= cache.docs.evict_leaf(node);
                }
            }
        }
        if held > budget {
            let removed: HashSet<NodeId> = cache
                .docs
                .evict_lru(budget.saturating_sub(held - cache.docs.bytes()), &|n| {
                    keep_nodes.contains(&n)
                })
                .into_iter()
                .collect();
            state.evictions += removed.len() as u64;
            cache.doc_nodes.retain(|_, n| !removed.contains(n));
            let docs = &cache.doc_nodes;
            cache.suffixes.retain(|k, _| docs.contains_key(k));
        }
    }

    /// Computes the pending nodes of a trie in waves of at most `batch_tokens`.
    fn materialize(
        &self,
        ticket: Ticket,
        op_id: &str,
        trie: &mut PrefixTrie<E::Kv>,
        targets: &[NodeId],
    ) -> Result<()> {
        for wave in trie.pending(targets) {
            for chunk in chunk_by_tokens(&wave, self.config.batch_tokens, |&id| trie.edge(id).len())
            {
                self.gate.check(ticket, op_id)?;
                let items: Vec<(Option<&E::Kv>, &[u32])> = chunk
                    .iter()
                    .map(|&id| (trie.parent_kv(id), trie.edge(id)))
                    .collect();
                let handles = self.exec.prefill(&items)?;
                for (&id, h) in chunk.iter().zip(handles) {
                    trie.set_kv(id, h);
                }
            }
        }
        Ok(())
    }

    /// The KV of `preamble + document` for each request's anchor, computed once.
    fn anchor_prompts(
        &self,
        ticket: Ticket,
        state: &mut QueryState<E::Kv>,
        call: &AiCall,
        requests: &[AiRequest<'_>],
        suffix: &[u32],
        scored: bool,
    ) -> Result<Vec<(DocKey, NodeId)>> {
        let preamble = self.piece(&call.pieces.preamble)?;
        let docs: Vec<(&str, &str)> = requests
            .iter()
            .map(|r| (r.anchor.id, r.anchor.text))
            .collect();
        let tokens = self.docs(&call.tables[0], &call.columns[0], &docs)?;
        let budget_tokens = self.config.kv_budget_bytes / self.exec.kv_bytes_per_token().max(1);
        let label_tokens = self.longest_label(call)?;
        let cache = &mut state.cache;
        let mut leaves = Vec::with_capacity(requests.len());
        let mut keys = Vec::with_capacity(requests.len());
        for (r, doc) in requests.iter().zip(&tokens) {
            let len = preamble.len() + doc.len() + suffix.len();
            let scored_len = len + if scored { label_tokens } else { 0 };
            self.check_context(&call.op_id, r.anchor.id, &call.tables[0], scored_len)?;
            if len > budget_tokens {
                return Err(EngineError::Inference(format!(
                    "{}: document {} of {} needs {len} positions of KV, over the KV budget of {budget_tokens} ({} MiB)",
                    call.op_id,
                    r.anchor.id,
                    call.tables[0],
                    self.config.kv_budget_bytes >> 20
                )));
            }
            let mut seq = Vec::with_capacity(preamble.len() + doc.len());
            seq.extend_from_slice(&preamble);
            seq.extend_from_slice(doc);
            let leaf = cache.docs.insert(&seq)?;
            let key = DocKey::new(&call.tables[0], &call.columns[0], r.anchor.id);
            cache.doc_nodes.insert(key.clone(), leaf);
            leaves.push(leaf);
            keys.push(key);
        }
        cache.calls += 1;
        for k in &keys {
            cache.last_used.insert(k.clone(), cache.calls);
        }
        self.materialize(ticket, &call.op_id, &mut cache.docs, &leaves)?;
        // Question tries: rooted at each document's KV; the suffix computed once per document.
        let mut targets: HashMap<DocKey, NodeId> = HashMap::new();
        for (key, &leaf) in keys.iter().zip(&leaves) {
            if targets.contains_key(key) {
                continue;
            }
            let doc_kv = cache.docs.kv(leaf).cloned();
            let trie = cache
                .suffixes
                .entry(key.clone())
                .or_insert_with(|| PrefixTrie::new(doc_kv));
            let node = trie.insert(suffix)?;
            targets.insert(key.clone(), node);
        }
        // Compute all questions in waves across documents: gather pending items.
        self.materialize_suffixes(ticket, &call.op_id, cache, &targets)?;
        // A scored question ending on a view (its exact text is a prefix of
        // another question) needs its last position computed again.
        for (key, &node) in targets.iter().filter(|_| scored) {
            let trie = cache.suffixes.get_mut(key).expect("trie exists");
            if node != 0 && trie.is_view(node) {
                let depth = trie.depth(node);
                let kv = trie.kv(node).expect("view has kv").clone();
                let shorter = kv.prefix(depth - 1)?;
                let last = [suffix[suffix.len() - 1]];
                let h = self.exec.prefill(&[(Some(&shorter), &last[..])])?.remove(0);
                trie.set_kv(node, h);
            }
        }
        Ok(keys
            .into_iter()
            .map(|k| {
                let n = targets[&k];
                (k, n)
            })
            .collect())
    }

    /// Like [`Self::materialize`] over many per-document tries at once, so the
    /// questions of a whole batch of documents share forward passes.
    fn materialize_suffixes(
        &self,
        ticket: Ticket,
        op_id: &str,
        cache: &mut Cache<E::Kv>,
        targets: &HashMap<DocKey, NodeId>,
    ) -> Result<()> {
        let mut waves: Vec<Vec<(DocKey, NodeId)>> = Vec::new();
        for (key, &node) in targets {
            let trie = &cache.suffixes[key];
            for (level, wave) in trie.pending(&[node]).into_iter().enumerate() {
                if waves.len() <= level {
                    waves.resize(level + 1, Vec::new());
                }
                waves[level].extend(wave.into_iter().map(|n| (key.clone(), n)));
            }
        }
        for wave in waves {
            for chunk in chunk_by_tokens(&wave, self.config.batch_tokens, |(k, n)| {
                cache.suffixes[k].edge(*n).len()
            }) {
                self.gate.check(ticket, op_id)?;
                let items: Vec<(Option<&E::Kv>, &[u32])> = chunk
                    .iter()
                    .map(|(k, n)| {
                        let t = &cache.suffixes[k];
                        (t.parent_kv(*n), t.edge(*n))
                    })
                    .collect();
                let handles = self.exec.prefill(&items)?;
                let done: Vec<(DocKey, NodeId, E::Kv)> = chunk
                    .iter()
                    .cloned()
                    .zip(handles)
                    .map(|((k, n), h)| (k, n, h))
                    .collect();
                for (k, n, h) in done {
                    cache.suffixes.get_mut(&k).expect("trie").set_kv(n, h);
                }
            }
        }
        Ok(())
    }

    /// The number of `call`'s prompt in this query's memo.
    fn memo_group(cache: &mut Cache<E::Kv>, call: &AiCall) -> u32 {
        let next = cache.groups.len() as u32;
        *cache
            .groups
            .entry((call.kind, call.pieces.clone()))
            .or_insert(next)
    }

    fn run(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Answers> {
        // Held until this call returns: the next query starts only after it.
        let (_in_flight, ticket) = self.gate.enter();
        self.gate.check(ticket, &call.op_id)?;
        if requests.is_empty() {
            return Ok(Answers::Bools(Vec::new()));
        }
        if !self.config.prefix_cache {
            return self.run_uncached(ticket, call, requests);
        }
        let mut state = self.state.lock().expect("scheduler lock");
        self.enter_operator(&mut state, &call.op_id);
        let pieces = &call.pieces;
        let labels: Vec<Vec<u32>> = label_continuations(&call.labels)
            .iter()
            .map(|l| self.piece(l).map(|v| v.as_ref().clone()))
            .collect::<Result<_>>()?;
        let out = if !pieces.pair {
            // One document: preamble + doc, then the tail as the question.
            let tail = self.piece(&pieces.tail)?;
            let nodes = self.anchor_prompts(ticket, &mut state, call, requests, &tail, true)?;
            let cache = &state.cache;
            let items: Vec<(Option<&E::Kv>, &[u32])> = nodes
                .iter()
                .map(|(k, n)| (cache.suffixes[k].kv(*n), &[][..]))
                .collect();
            match call.kind {
                AiKind::Classify => {
                    Answers::Labels(self.exec.classify(call, requests, &items, &labels)?)
                }
                _ => Answers::Bools(self.exec.decide(call, requests, &items)?),
            }
        } else {
            // Pairs: preamble + anchor + frame cached, partners packed as suffixes.
            let frame = self.piece(&pieces.frame)?;
            let label = self.piece(&pieces.label)?;
            let tail = self.piece(&pieces.tail)?;
            let group = Self::memo_group(&mut state.cache, call);
            // Memo: a pair asked before with the same pieces is not asked again,
            // and its anchor's KV is not needed for it.
            let keys: Vec<MemoKey> = requests
                .iter()
                .map(|r| {
                    let p = r.partner.expect("pair requests have partners");
                    (
                        group,
                        DocKey::new(&call.tables[0], &call.columns[0], r.anchor.id),
                        DocKey::new(&call.tables[1], &call.columns[1], p.id),
                    )
                })
                .collect();
            let todo: Vec<usize> = (0..requests.len())
                .filter(|&i| match call.kind {
                    AiKind::Classify => !state.cache.memo_label.contains_key(&keys[i]),
                    _ => !state.cache.memo_bool.contains_key(&keys[i]),
                })
                .collect();
            let todo_requests: Vec<AiRequest<'_>> = todo.iter().map(|&i| requests[i]).collect();
            let nodes = if todo.is_empty() {
                Vec::new()
            } else {
                self.anchor_prompts(ticket, &mut state, call, &todo_requests, &frame, false)?
            };
            let partner_docs: Vec<(&str, &str)> = todo_requests
                .iter()
                .map(|r| {
                    let p = r.partner.expect("pair requests have partners");
                    (p.id, p.text)
                })
                .collect();
            let partners = self.docs(&call.tables[1], &call.columns[1], &partner_docs)?;
            let suffixes: Vec<Vec<u32>> = partners
                .iter()
                .map(|p| [label.as_slice(), p.as_slice(), tail.as_slice()].concat())
                .collect();
            let label_tokens = self.longest_label(call)?;
            for (j, r) in todo_requests.iter().enumerate() {
                let (k, n) = &nodes[j];
                let anchor_len = state.cache.suffixes[k].kv(*n).map_or(0, |kv| kv.len());
                let len = anchor_len + suffixes[j].len() + label_tokens;
                self.check_context(
                    &call.op_id,
                    format_args!("{} × {}", r.anchor.id, r.partner.map_or("", |p| p.id)),
                    format_args!("{} × {}", call.tables[0], call.tables[1]),
                    len,
                )?;
            }
            let order: Vec<usize> = (0..todo.len()).collect();
            for chunk in chunk_by_tokens(&order, self.config.batch_tokens, |&j| suffixes[j].len()) {
                self.gate.check(ticket, &call.op_id)?;
                let cache = &state.cache;
                let items: Vec<(Option<&E::Kv>, &[u32])> = chunk
                    .iter()
                    .map(|&j| {
                        let (k, n) = &nodes[j];
                        (cache.suffixes[k].kv(*n), suffixes[j].as_slice())
                    })
                    .collect();
                let reqs: Vec<AiRequest<'_>> = chunk.iter().map(|&j| todo_requests[j]).collect();
                match call.kind {
                    AiKind::Classify => {
                        let got = self.exec.classify(call, &reqs, &items, &labels)?;
                        for (&j, g) in chunk.iter().zip(got) {
                            state.cache.memo_label.insert(keys[todo[j]].clone(), g);
                        }
                    }
                    _ => {
                        let got = self.exec.decide(call, &reqs, &items)?;
                        for (&j, g) in chunk.iter().zip(got) {
                            state.cache.memo_bool.insert(keys[todo[j]].clone(), g);
                        }
                    }
                }
            }
            match call.kind {
                AiKind::Classify => {
                    Answers::Labels(keys.iter().map(|k| state.cache.memo_label[k]).collect())
                }
                _ => Answers::Bools(keys.iter().map(|k| state.cache.memo_bool[k]).collect()),
            }
        };
        let keep: HashSet<DocKey> = requests
            .iter()
            .map(|r| DocKey::new(&call.tables[0], &call.columns[0], r.anchor.id))
            .collect();
        self.enforce_budget(&mut state, &keep);
        Ok(out)
    }

    /// `--prefix-cache off`: every prompt from its first token.
    fn run_uncached(
        &self,
        ticket: Ticket,
        call: &AiCall,
        requests: &[AiRequest<'_>],
    ) -> Result<Answers> {
        let pieces = &call.pieces;
        let preamble = self.piece(&pieces.preamble)?;
        let anchors: Vec<(&str, &str)> = requests
            .iter()
            .map(|r| (r.anchor.id, r.anchor.text))
            .collect();
        let anchor_tokens = self.docs(&call.tables[0], &call.columns[0], &anchors)?;
        let partner_tokens = if pieces.pair {
            let ps: Vec<(&str, &str)> = requests
                .iter()
                .map(|r| {
                    let p = r.partner.expect("pair");
                    (p.id, p.text)
                })
                .collect();
            Some(self.docs(&call.tables[1], &call.columns[1], &ps)?)
        } else {
            None
        };
        let frame = self.piece(&pieces.frame)?;
        let label = self.piece(&pieces.label)?;
        let tail = self.piece(&pieces.tail)?;
        let prompts: Vec<Vec<u32>> = (0..requests.len())
            .map(|i| {
                let mut v = Vec::new();
                v.extend_from_slice(&preamble);
                v.extend_from_slice(&anchor_tokens[i]);
                v.extend_from_slice(&frame);
                if let Some(p) = &partner_tokens {
                    v.extend_from_slice(&label);
                    v.extend_from_slice(&p[i]);
                }
                v.extend_from_slice(&tail);
                v
            })
            .collect();
        let labels: Vec<Vec<u32>> = label_continuations(&call.labels)
            .iter()
            .map(|l| self.piece(l).map(|v| v.as_ref().clone()))
            .collect::<Result<_>>()?;
        let label_tokens = labels.iter().map(Vec::len).max().unwrap_or(0);
        for (r, p) in requests.iter().zip(&prompts) {
            self.check_context(
                &call.op_id,
                r.anchor.id,
                &call.tables[0],
                p.len() + label_tokens,
            )?;
        }
        let order: Vec<usize> = (0..prompts.len()).collect();
        let mut bools = Vec::new();
        let mut chosen = Vec::new();
        for chunk in chunk_by_tokens(&order, self.config.batch_tokens, |&i| prompts[i].len()) {
            self.gate.check(ticket, &call.op_id)?;
            let items: Vec<(Option<&E::Kv>, &[u32])> = chunk
                .iter()
                .map(|&i| (None, prompts[i].as_slice()))
                .collect();
            let reqs: Vec<AiRequest<'_>> = chunk.iter().map(|&i| requests[i]).collect();
            match call.kind {
                AiKind::Classify => {
                    chosen.extend(self.exec.classify(call, &reqs, &items, &labels)?)
                }
                _ => bools.extend(self.exec.decide(call, &reqs, &items)?),
            }
        }
        Ok(match call.kind {
            AiKind::Classify => Answers::Labels(chosen),
            _ => Answers::Bools(bools),
        })
    }
}

enum Answers {
    Bools(Vec<bool>),
    Labels(Vec<usize>),
}

/// Splits `items` into consecutive chunks of at most `budget` tokens (at least one item each).
fn chunk_by_tokens<T>(items: &[T], budget: usize, tokens: impl Fn(&T) -> usize) -> Vec<&[T]> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < items.len() {
        let mut end = start;
        let mut used = 0;
        while end < items.len() && (end == start || used + tokens(&items[end]) <= budget) {
            used += tokens(&items[end]);
            end += 1;
        }
        out.push(&items[start..end]);
        start = end;
    }
    out
}

impl<E: Executor> InferenceBackend for ScheduledBackend<E> {
    fn name(&self) -> &str {
        self.exec.name()
    }

    fn decide(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Vec<bool>> {
        match self.run(call, requests)? {
            Answers::Bools(b) => Ok(b),
            Answers::Labels(_) => Err(EngineError::Inference(format!(
                "{}: expected decisions",
                call.op_id
            ))),
        }
    }

    fn classify(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Vec<usize>> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        match self.run(call, requests)? {
            Answers::Labels(l) => Ok(l),
            Answers::Bools(_) => Err(EngineError::Inference(format!(
                "{}: expected labels",
                call.op_id
            ))),
        }
    }

    fn kv_capacity_tokens(&self) -> Option<usize> {
        self.config
            .prefix_cache
            .then(|| self.config.kv_budget_bytes / self.exec.kv_bytes_per_token().max(1))
    }

    fn cancel(&self) {
        self.gate.cancel();
    }

    fn wait_stopped(&self) {
        self.gate.wait_idle();
    }

    fn start_query(&self, operators: &[AiCall]) {
        // Stops the previous query's work and waits for it to leave (at most one
        // forward batch), so it cannot touch this query's state or counters.
        let _started = self.gate.next_query();
        let mut state = self.state.lock().expect("scheduler lock");
        state.cache = Cache::new();
        state.ops = operators
            .iter()
            .map(|c| (c.op_id.clone(), c.tables[0].clone()))
            .collect();
        state.fresh_start = self.exec.fresh_tokens();
        state.label_start = self.exec.label_tokens();
        state.peak_bytes = 0;
        state.evictions = 0;
        state.current_op = None;
    }

    fn measurements(&self) -> serde_json::Map<String, serde_json::Value> {
        let state = self.state.lock().expect("scheduler lock");
        let mut m = serde_json::Map::new();
        m.insert(
            "fresh_tokens".into(),
            (self.exec.fresh_tokens() - state.fresh_start).into(),
        );
        m.insert(
            "label_tokens".into(),
            (self.exec.label_tokens() - state.label_start).into(),
        );
        m.insert("prefix_cache".into(), self.config.prefix_cache.into());
        m.insert(
            "kv_peak_bytes".into(),
            state.peak_bytes.max(state.cache.bytes()).into(),
        );
        m.insert("kv_evictions".into(), state.evictions.into());
        m.insert("kv_budget_bytes".into(), self.config.kv_budget_bytes.into());
        m.insert("batch_tokens".into(), self.config.batch_tokens.into());
        m
    }
}

/// Which model to load and how to schedule it.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    /// `tiny`, a local directory, or a Hugging Face id in the local cache.
    pub model: String,
    /// CUDA device, `None` for the CPU.
    pub gpu: Option<usize>,
    /// Weights dtype (default: f32 on CPU, bf16 on GPU).
    pub dtype: Option<aisql_models::DType>,
    /// Scheduling knobs.
    pub scheduler: SchedulerConfig,
    /// The KV budget was not chosen by the user: on a GPU, replace it by
    /// [`gpu_kv_budget_bytes`] of the memory left free once the weights are loaded.
    pub kv_budget_from_device: bool,
}

/// KV budget on a GPU with `free` bytes free after loading the weights: 70 % of it,
/// less 4 GiB kept for activations (a forward batch of 8,192 tokens and the score
/// matrices of a large shared-prefix run each take a few GiB).
pub fn gpu_kv_budget_bytes(free: usize) -> usize {
    (free / 10 * 7).saturating_sub(4 << 30)
}

/// Where `--model tiny` lives: `models/tiny-qwen3-seed0` under aisql's cache folder
/// ([`crate::cache_dir::cache_dir`]), generated on first use, deterministic (seed 0),
/// and sealed: a copy whose files no longer match the seal is generated again.
pub fn tiny_model_dir() -> Result<std::path::PathBuf> {
    use crate::cache_dir::{SEAL_FILE, check_seal, files_of, seal};
    let base = crate::cache_dir::cache_dir();
    let dir = base.join("models/tiny-qwen3-seed0");
    if dir.exists() {
        match check_seal(&dir, &dir.join(SEAL_FILE)) {
            Ok(()) => return Ok(dir),
            Err(why) => {
                eprintln!(
                    "note: the cached tiny model at {} is damaged ({why}); generating it again",
                    dir.display()
                );
                std::fs::remove_dir_all(&dir).map_err(|e| EngineError::io(&dir, e))?;
            }
        }
    }
    let tmp = base.join(format!("models/.tiny-qwen3-seed0.{}", std::process::id()));
    aisql_models::tiny::write_tiny_model(&tmp, 0)?;
    seal(&tmp, &files_of(&tmp)?, &tmp.join(SEAL_FILE))?;
    std::fs::create_dir_all(dir.parent().expect("has parent"))
        .map_err(|e| EngineError::io(&dir, e))?;
    // Another process may have placed its copy first: then use that one.
    if std::fs::rename(&tmp, &dir).is_err() && check_seal(&dir, &dir.join(SEAL_FILE)).is_err() {
        return Err(EngineError::Inference(format!(
            "could not place the tiny model at {}",
            dir.display()
        )));
    }
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(dir)
}

/// Metadata describing a backend (model, device, dtype, budgets), for run records.
pub type RunMetadata = serde_json::Map<String, serde_json::Value>;

/// Loads the model of `spec` and wraps it in the scheduled backend. Also returns
/// metadata describing it (model, device, dtype, budgets).
pub fn load_model_backend(
    spec: &ModelSpec,
) -> Result<(Arc<ScheduledBackend<ModelExecutor>>, RunMetadata)> {
    let source = if spec.model == "tiny" {
        tiny_model_dir()?.display().to_string()
    } else {
        spec.model.clone()
    };
    let device = aisql_models::device(spec.gpu)?;
    let (model, tokenizer) = aisql_models::load(&source, &device, spec.dtype)?;
    let mut scheduler = spec.scheduler.clone();
    let mut meta = serde_json::Map::new();
    if spec.kv_budget_from_device
        && let Some(free) = aisql_models::device_free_memory(&device)
    {
        scheduler.kv_budget_bytes = gpu_kv_budget_bytes(free);
        meta.insert("device_free_bytes_after_weights".into(), free.into());
    }
    meta.insert("model".into(), spec.model.clone().into());
    meta.insert("model_path".into(), source.into());
    meta.insert(
        "device".into(),
        match spec.gpu {
            Some(n) => format!("cuda:{n}"),
            None => "cpu".to_string(),
        }
        .into(),
    );
    meta.insert(
        "dtype".into(),
        format!("{:?}", model.dtype()).to_lowercase().into(),
    );
    meta.insert("prefix_cache".into(), scheduler.prefix_cache.into());
    meta.insert("kv_budget_bytes".into(), scheduler.kv_budget_bytes.into());
    meta.insert("batch_tokens".into(), scheduler.batch_tokens.into());
    let exec = ModelExecutor::new(Arc::new(model), &tokenizer, "model")?;
    Ok((
        Arc::new(ScheduledBackend::new(exec, tokenizer, scheduler)),
        meta,
    ))
}

/// The simulation backend: the model backend's scheduler over a virtual KV cache
/// of `kv_bytes_per_token` per position, answering from `labels`.
pub fn simulation_backend(
    labels: Arc<crate::labels::LabelStore>,
    config: SchedulerConfig,
    kv_bytes_per_token: usize,
) -> Result<Arc<ScheduledBackend<SimExecutor>>> {
    Ok(Arc::new(ScheduledBackend::new(
        SimExecutor::new(OracleBackend::new(labels), kv_bytes_per_token),
        Tokenizer::vendored()?,
        config,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An H200 with Qwen3-4B's bf16 weights loaded keeps close to 90 GiB for KV
    /// (the simulation assumes 100 GiB); a nearly full GPU gets no budget rather
    /// than a negative one (the scheduler then names the document that does not fit).
    #[test]
    fn gpu_kv_budget_leaves_room_for_activations() {
        let gib = 1usize << 30;
        let h200_after_4b = 131 * gib;
        let budget = gpu_kv_budget_bytes(h200_after_4b);
        assert!((87 * gib..88 * gib).contains(&budget), "{}", budget / gib);
        assert_eq!(gpu_kv_budget_bytes(5 * gib), 0);
    }
}
