//! Plan-aware execution of AI operators on a model: the [`ScheduledBackend`].
//!
//! Every prompt is `preamble + document + suffix`, tokenized piece by piece. The
//! backend keeps two levels of prefix cache (radix tries of KV handles, see
//! [`crate::inference::kv_cache`]):
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
//! prompt pieces is answered by the query's memo ([`crate::inference::memo`]) before it
//! reaches the scheduler. This is exactly the structure of
//! QUAIL-B's minimum-token rule (SPEC §D.4), so with enough KV memory the fresh
//! tokens equal the minimum. Inserting a batch's sequences before computing them
//! makes every distinct prefix computed once, in waves of packed forward passes
//! bounded by `batch_tokens`.
//!
//! The cache lives for one query (fresh tokens are per query). When it outgrows
//! the KV budget, least recently used documents (with their questions) leave
//! the device (with the start of their KV no document left there needs): to
//! the host tier while it has room (`host_kv_budget_bytes`),
//! whence they come back by copy before their next use (restored tokens, not
//! fresh ones), else evicted — costing recomputation, never a wrong answer. Documents of
//! tables no later operator reads are dropped as soon as their last operator
//! starts.
//!
//! The same code runs over a virtual KV ([`SimExecutor`]): the simulation mode
//! answers from labels and reports the fresh tokens the model would compute.
//!
//! Every forward batch goes through one gate ([`SpendGate::forward`]):
//! it does not start once the query is cancelled or its spend budget
//! ([`crate::limits::spend`]) is spent, and what it computed is charged to it
//! ([`spend_gate`]). With a spend budget, a call's requests are asked about one
//! forward batch at a time, so the answers of those done before it ran out are kept and
//! the rest come back [`Answer::Unreached`]. A row whose prompt is longer than
//! the model's context is answered [`Answer::Failed`], naming it; the other
//! rows of its batch are answered as usual.
//!
//! The module's jobs, one file each: scheduling (here), tokenizing
//! ([`tokenize`]), the KV tiers and what leaves them ([`tiers`], in the order
//! of a [`policy`]), questions asked ahead ([`lookahead`]), the executors that
//! compute KV ([`executors`]), the KV memory budget ([`kv_budget`]), the spend budget's gate
//! ([`spend_gate`]) and model loading
//! ([`loading`]).

mod executors;
mod kv_budget;
mod loading;
mod lookahead;
mod policy;
mod spend_gate;
mod tiers;
mod tokenize;

pub use executors::{
    Executor, ModelExecutor, QWEN3_4B_KV_BYTES_PER_TOKEN, QWEN3_4B_MAX_POSITIONS,
    SIMULATED_LINK_BYTES_PER_SECOND, SimExecutor, VirtualKv, best_label, label_probabilities,
};
pub use kv_budget::{default_host_kv_budget_bytes, default_kv_budget_bytes, gpu_kv_budget_bytes};
pub use loading::{
    ModelSpec, answer_identity, load_model_backend, model_input_paths, model_source,
    simulation_backend, tiny_model_dir, tiny_model_path,
};

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use aisql_models::Tokenizer;

use crate::error::{EngineError, Result};
use crate::inference::backend::{
    AiCall, AiRequest, Answer, Answered, Doc, InferenceBackend, QueryBackend, QueryStart,
};
use crate::inference::kv_cache::{KvOps, NodeId, PrefixTrie};
use crate::inference::memo::DocKey;
use crate::inference::prompt::{Excerpt, label_continuations};
use crate::inference::work::{Config, Max, Sum, Work};
use crate::limits::query_gate::{QueryGate, Ticket};
use lookahead::{AheadQuestion, Lookahead, MAX_PARTNERS_AHEAD};
use spend_gate::{SpendGate, unreached_after};
use tiers::{BeforeDrop, KvTiers};
use tokenize::TokenCache;

/// A document dropped from both tiers keeps the KV of its first positions after
/// the preamble: documents still to come that open the same way reuse them
/// instead of computing them again (the minimum counts a shared opening once).
/// Measured on IMDB-1 at sf 0.1 under a tenth of the simulated budgets, the
/// regret is 0.64 % keeping none, 0.56 % keeping 16, 0.14 % keeping 32 and 0
/// keeping 64. Stubs are KV like any other: the least recently used go first
/// when a tier is full.
const DROPPED_DOCUMENT_STUB_TOKENS: usize = 64;

/// Requests of a generating call given to the executor at once: it decodes
/// them side by side, and a stopped query waits for one such group.
const GENERATING_REQUESTS_PER_CALL: usize = 64;

/// Scheduling knobs.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Reuse KV across prompts (off: every prompt computed from scratch).
    pub prefix_cache: bool,
    /// Ask a document the questions of later operators before its KV is
    /// dropped ([`lookahead`]).
    pub lookahead: bool,
    /// KV memory budget in bytes.
    pub kv_budget_bytes: usize,
    /// Host memory for KV moved off the device (0: none). KV evicted from the
    /// device goes here while it fits and comes back by copy, not recompute.
    pub host_kv_budget_bytes: usize,
    /// Tokens per forward batch.
    pub batch_tokens: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            prefix_cache: true,
            lookahead: true,
            kv_budget_bytes: default_kv_budget_bytes(),
            host_kv_budget_bytes: 0,
            batch_tokens: 8192,
        }
    }
}

struct QueryState<K> {
    /// The KV held and what leaves it (with the counters of the tiers).
    tiers: KvTiers<K>,
    /// Per AI operator in post-order: (op id, anchor table).
    ops: Vec<(String, String)>,
    current_op: Option<String>,
    /// Questions of later operators asked ahead.
    lookahead: Lookahead,
}

/// The model backend: plan-aware scheduling over an [`Executor`].
pub struct ScheduledBackend<E: Executor> {
    exec: E,
    config: SchedulerConfig,
    /// Shared with another backend over the same tokenizer
    /// ([`Self::sharing_tokens`]), which then tokenizes each document once.
    tokens: TokenCache,
    state: Mutex<QueryState<E::Kv>>,
    gate: QueryGate,
    /// Whether a forward batch may run, and what it costs the spend budget.
    spend_gate: SpendGate,
}

impl<E: Executor> ScheduledBackend<E> {
    /// A backend over `exec`, tokenizing with `tokenizer`.
    pub fn new(exec: E, tokenizer: Tokenizer, config: SchedulerConfig) -> Self {
        Self::with_tokens(exec, config, TokenCache::new(tokenizer))
    }

    /// A backend over `exec` that shares `other`'s token ids (and its
    /// tokenizer): an estimate's two simulations of one query tokenize each
    /// document once.
    pub fn sharing_tokens<F: Executor>(
        exec: E,
        other: &ScheduledBackend<F>,
        config: SchedulerConfig,
    ) -> Self {
        Self::with_tokens(exec, config, other.tokens.clone())
    }

    fn with_tokens(exec: E, config: SchedulerConfig, tokens: TokenCache) -> Self {
        let tiers = Self::empty_tiers(&exec, &config);
        Self {
            exec,
            config,
            tokens,
            state: Mutex::new(QueryState {
                tiers,
                ops: Vec::new(),
                current_op: None,
                lookahead: Lookahead::default(),
            }),
            gate: QueryGate::default(),
            spend_gate: SpendGate::default(),
        }
    }

    /// The executor.
    pub fn executor(&self) -> &E {
        &self.exec
    }

    /// A query's empty KV tiers, within the configured budgets.
    fn empty_tiers(exec: &E, config: &SchedulerConfig) -> KvTiers<E::Kv> {
        KvTiers::new(
            config.kv_budget_bytes,
            config.host_kv_budget_bytes,
            exec.kv_bytes_per_token(),
        )
    }

    fn piece(&self, text: &str) -> Result<Arc<Vec<u32>>> {
        self.tokens.piece(text)
    }

    /// Refuses a prompt of `len` positions (label continuations included) that is
    /// longer than the model's context: past `max_position_embeddings` its answer
    /// would be silently wrong, so the row is named instead.
    /// `row` and `table` are formatted only for the error (this runs for every
    /// pair); a row is named by its id, an [`Excerpt`] (the id may be the document).
    fn check_context(
        &self,
        op_id: &str,
        row: impl std::fmt::Display,
        table: impl std::fmt::Display,
        len: usize,
    ) -> Result<()> {
        match self.context_overflow(op_id, row, table, len) {
            Some(message) => Err(EngineError::Inference(message)),
            None => Ok(()),
        }
    }

    /// Why a prompt of `len` positions does not fit the model's context
    /// ([`Self::check_context`]'s error), `None` when it does.
    fn context_overflow(
        &self,
        op_id: &str,
        row: impl std::fmt::Display,
        table: impl std::fmt::Display,
        len: usize,
    ) -> Option<String> {
        let max = self.exec.max_positions();
        (len > max).then(|| {
            format!(
                "{op_id}: the prompt for row {row} of {table} is {len} tokens with its \
                 answer's (the longest label, or a generation's max_tokens), longer than the \
                 model's context of {max} positions (max_position_embeddings); shorten that \
                 document or max_tokens, leave the row out with a WHERE clause, or give \
                 --on-row-error null to make its value NULL"
            )
        })
    }

    /// Per request, [`Answer::Failed`] naming its row when its prompt with its
    /// answer's positions is longer than the model's context (past
    /// `max_position_embeddings` an answer would be silently wrong); `None`
    /// for the requests that fit. `anchors` and `partners` are the requests'
    /// documents' token ids (no partners for one-document calls).
    fn overflowing(
        &self,
        call: &AiCall,
        requests: &[AiRequest<'_>],
        anchors: &[Arc<Vec<u32>>],
        partners: &[Arc<Vec<u32>>],
    ) -> Result<Vec<Option<Answer>>> {
        let p = &call.pieces;
        let mut fixed = self.piece(&p.preamble)?.len()
            + self.piece(&p.tail)?.len()
            + self.longest_label(call)?;
        if p.pair {
            fixed += self.piece(&p.frame)?.len() + self.piece(&p.label)?.len();
        }
        let failed = |m: String| Answer::Failed(m.into());
        Ok(requests
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let len = fixed + anchors[i].len() + partners.get(i).map_or(0, |t| t.len());
                match r.partner {
                    Some(partner) => self.context_overflow(
                        &call.op_id,
                        format_args!("{} × {}", Excerpt(r.anchor.id), Excerpt(partner.id)),
                        format_args!("{} × {}", call.tables[0], call.tables[1]),
                        len,
                    ),
                    None => self.context_overflow(
                        &call.op_id,
                        Excerpt(r.anchor.id),
                        &call.tables[0],
                        len,
                    ),
                }
                .map(failed)
            })
            .collect())
    }

    /// Runs one forward batch of `op_id`'s work through the spend gate
    /// ([`SpendGate::forward`]).
    fn forward<T>(
        &self,
        ticket: Ticket,
        op_id: &str,
        work: impl FnOnce(&dyn Fn() -> bool) -> Result<T>,
    ) -> Result<T> {
        let fresh_tokens = || self.exec.fresh_tokens();
        self.spend_gate
            .forward(&self.gate, ticket, op_id, &fresh_tokens, work)
    }

    /// `Ok` when `e` is work the spent budget stopped, `Err(e)` otherwise
    /// ([`SpendGate::stopped_by_spend`]).
    fn spent_stop(&self, ticket: Ticket, op_id: &str, e: EngineError) -> Result<()> {
        self.spend_gate
            .stopped_by_spend(&self.gate, ticket, op_id, e)
    }

    /// Positions of the longest label continuation a classification scores after
    /// its prompt (0 for yes/no questions).
    /// Positions an answer adds after its prompt: the longest label of a
    /// classification, the `max_tokens` of a generating call.
    fn longest_label(&self, call: &AiCall) -> Result<usize> {
        let longest = self
            .answer_pieces(call)
            .iter()
            .map(|l| self.piece(l).map(|v| v.len()))
            .try_fold(0, |m, n| n.map(|n| m.max(n)))?;
        Ok(if call.kind.generates() {
            longest + call.max_tokens as usize
        } else {
            longest
        })
    }

    /// Forgets the token ids of documents in tables that `operators` do not
    /// read: a run goes collection by collection, and at sf 1.0 the documents
    /// of all five would stay in memory to the end (gigabytes) for no reuse.
    fn keep_tokens_of(&self, operators: &[AiCall]) {
        let read: HashSet<&str> = operators
            .iter()
            .flat_map(|c| c.tables.iter().map(String::as_str))
            .collect();
        self.tokens.keep_tables(&read);
    }

    /// The tables whose documents' token ids are held, sorted.
    pub fn tokenized_tables(&self) -> Vec<String> {
        self.tokens.tables()
    }

    /// Token ids of documents of `table` by their texts, each distinct text
    /// tokenized once.
    fn docs(&self, table: &str, texts: &[&str]) -> Result<Vec<Arc<Vec<u32>>>> {
        self.tokens.docs(table, texts)
    }

    /// Called at each operator's first batch: drops documents of tables that no
    /// remaining operator asks about.
    /// Shared prefixes and the stubs of dropped documents stay: documents of
    /// the tables still read may start the same way.
    fn enter_operator(&self, state: &mut QueryState<E::Kv>, op_id: &str) -> Result<()> {
        if state.current_op.as_deref() == Some(op_id) {
            return Ok(());
        }
        state.current_op = Some(op_id.to_string());
        let Some(pos) = state.ops.iter().position(|(id, _)| id == op_id) else {
            return Ok(());
        };
        let needed: HashSet<String> = state.ops[pos..].iter().map(|(_, t)| t.clone()).collect();
        for k in state.tiers.drop_tables_but(&needed)? {
            state.lookahead.forget(&k);
        }
        Ok(())
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
                let items: Vec<(Option<&E::Kv>, &[u32])> = chunk
                    .iter()
                    .map(|&id| (trie.parent_kv(id), trie.edge(id)))
                    .collect();
                let handles = self.forward(ticket, op_id, |_| self.exec.prefill(&items))?;
                for (&id, h) in chunk.iter().zip(handles) {
                    trie.set_kv(id, h);
                }
            }
        }
        Ok(())
    }

    /// The KV of `preamble + document` for each request's anchor (its token
    /// ids in `tokens`), computed once.
    #[allow(clippy::too_many_arguments)]
    fn anchor_prompts(
        &self,
        ticket: Ticket,
        tiers: &mut KvTiers<E::Kv>,
        call: &AiCall,
        requests: &[AiRequest<'_>],
        tokens: &[Arc<Vec<u32>>],
        suffix: &[u32],
        scored: bool,
    ) -> Result<Vec<(DocKey, NodeId)>> {
        let preamble = self.piece(&call.pieces.preamble)?;
        let kv_budget_tokens = self.config.kv_budget_bytes / self.exec.kv_bytes_per_token().max(1);
        tiers.keep_stubs_of(preamble.len() + DROPPED_DOCUMENT_STUB_TOKENS);
        let mut leaves = Vec::with_capacity(requests.len());
        let mut keys = Vec::with_capacity(requests.len());
        for (r, doc) in requests.iter().zip(tokens) {
            // Past the model's context the request was answered Failed before
            // it got here ([`Self::overflowing`]).
            let len = preamble.len() + doc.len() + suffix.len();
            if len > kv_budget_tokens {
                return Err(EngineError::Inference(format!(
                    "{}: document {} of {} needs {len} positions of KV, over the KV budget of {kv_budget_tokens} ({} MiB)",
                    call.op_id,
                    Excerpt(r.anchor.id),
                    call.tables[0],
                    self.config.kv_budget_bytes >> 20
                )));
            }
            let mut seq = Vec::with_capacity(preamble.len() + doc.len());
            seq.extend_from_slice(&preamble);
            seq.extend_from_slice(doc);
            let key = DocKey::new(&call.tables[0], &call.columns[0], r.anchor.id);
            leaves.push(tiers.insert_doc(key.clone(), &seq)?);
            keys.push(key);
        }
        tiers.docs_used(&keys);
        // KV moved to the host comes back by copy, never recomputed.
        let mut restored = 0;
        for &leaf in &leaves {
            restored += tiers.docs.restore_path(leaf)?;
        }
        self.materialize(ticket, &call.op_id, &mut tiers.docs, &leaves)?;
        tiers.count_restored(restored);
        let targets = self.question_nodes(ticket, tiers, &call.op_id, &keys, suffix, scored)?;
        Ok(keys
            .into_iter()
            .map(|k| {
                let n = targets[&k];
                (k, n)
            })
            .collect())
    }

    /// The KV of `suffix` after each document of `keys` (whose own KV is held):
    /// a node of the document's question trie, computed once per document.
    fn question_nodes(
        &self,
        ticket: Ticket,
        tiers: &mut KvTiers<E::Kv>,
        op_id: &str,
        keys: &[DocKey],
        suffix: &[u32],
        scored: bool,
    ) -> Result<HashMap<DocKey, NodeId>> {
        // Question tries: rooted at each document's KV; the suffix computed once per document.
        let mut targets: HashMap<DocKey, NodeId> = HashMap::new();
        for key in keys {
            if targets.contains_key(key) {
                continue;
            }
            let doc_kv = tiers
                .doc_nodes
                .get(key)
                .and_then(|&n| tiers.docs.kv(n).cloned());
            let trie = tiers
                .suffixes
                .entry(key.clone())
                .or_insert_with(|| PrefixTrie::new(doc_kv));
            let node = trie.insert(suffix)?;
            targets.insert(key.clone(), node);
        }
        let mut restored = 0;
        for (key, &node) in &targets {
            restored += tiers.suffixes[key].restore_path(node)?;
        }
        tiers.count_restored(restored);
        // Compute all questions in waves across documents: gather pending items.
        self.materialize_suffixes(ticket, op_id, &mut tiers.suffixes, &targets)?;
        // A scored question ending on a view (its exact text is a prefix of
        // another question) needs its last position computed again.
        for (key, &node) in targets.iter().filter(|_| scored) {
            let trie = tiers.suffixes.get_mut(key).expect("trie exists");
            if node != 0 && trie.is_view(node) {
                let kv = trie.kv(node).expect("view has kv").clone();
                // The view covers the document and the question: all of it
                // but the last position, whose hidden state is computed again.
                let shorter = kv.prefix(kv.len() - 1)?;
                let last = [suffix[suffix.len() - 1]];
                let h = self
                    .forward(ticket, op_id, |_| {
                        self.exec.prefill(&[(Some(&shorter), &last[..])])
                    })?
                    .remove(0);
                trie.set_kv(node, h);
            }
        }
        Ok(targets)
    }

    /// Like [`Self::materialize`] over many per-document tries at once, so the
    /// questions of a whole batch of documents share forward passes.
    fn materialize_suffixes(
        &self,
        ticket: Ticket,
        op_id: &str,
        suffixes: &mut HashMap<DocKey, PrefixTrie<E::Kv>>,
        targets: &HashMap<DocKey, NodeId>,
    ) -> Result<()> {
        let mut waves: Vec<Vec<(DocKey, NodeId)>> = Vec::new();
        for (key, &node) in targets {
            let trie = &suffixes[key];
            for (level, wave) in trie.pending(&[node]).into_iter().enumerate() {
                if waves.len() <= level {
                    waves.resize(level + 1, Vec::new());
                }
                waves[level].extend(wave.into_iter().map(|n| (key.clone(), n)));
            }
        }
        for wave in waves {
            for chunk in chunk_by_tokens(&wave, self.config.batch_tokens, |(k, n)| {
                suffixes[k].edge(*n).len()
            }) {
                let items: Vec<(Option<&E::Kv>, &[u32])> = chunk
                    .iter()
                    .map(|(k, n)| {
                        let t = &suffixes[k];
                        (t.parent_kv(*n), t.edge(*n))
                    })
                    .collect();
                let handles = self.forward(ticket, op_id, |_| self.exec.prefill(&items))?;
                let done: Vec<(DocKey, NodeId, E::Kv)> = chunk
                    .iter()
                    .cloned()
                    .zip(handles)
                    .map(|((k, n), h)| (k, n, h))
                    .collect();
                for (k, n, h) in done {
                    suffixes.get_mut(&k).expect("trie").set_kv(n, h);
                }
            }
        }
        Ok(())
    }

    fn run(
        &self,
        ticket: Ticket,
        call: &AiCall,
        requests: &[AiRequest<'_>],
    ) -> Result<Vec<Answer>> {
        // Held until this call returns: the next query starts only after it.
        let (_in_flight, _current) = self.gate.enter();
        self.gate.check(ticket, &call.op_id)?;
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        // Once the spend budget is spent nothing more is asked, nor cached.
        if self.spend_gate.spent() {
            return Ok(vec![Answer::Unreached; requests.len()]);
        }
        if !self.config.prefix_cache {
            return self.run_uncached(ticket, call, requests);
        }
        let mut guard = self.state.lock().expect("scheduler lock");
        let state = &mut *guard;
        self.enter_operator(state, &call.op_id)?;
        let keep: Vec<DocKey> = requests
            .iter()
            .map(|r| DocKey::new(&call.tables[0], &call.columns[0], r.anchor.id))
            .collect();
        state.lookahead.asked(&call.op_id, &keep);
        // Questions asked ahead are answered without the model.
        let mut answers = state.lookahead.take(call, requests);
        let todo: Vec<usize> = (0..requests.len())
            .filter(|&i| answers[i].is_none())
            .collect();
        if !todo.is_empty() {
            let asked: Vec<AiRequest<'_>> = todo.iter().map(|&i| requests[i]).collect();
            let got = self.answer(ticket, &mut state.tiers, call, &asked)?;
            for (&i, a) in todo.iter().zip(got) {
                answers[i] = Some(a);
            }
        }
        // The tiers choose what leaves; a document leaving for good is first
        // asked its later operators' questions ([`AskAhead`]).
        let keep: HashSet<DocKey> = keep.into_iter().collect();
        let mut ahead = AskAhead {
            backend: self,
            ticket,
            lookahead: &mut state.lookahead,
            questions: Vec::new(),
        };
        state.tiers.make_room(&keep, &mut ahead)?;
        Ok(answers
            .into_iter()
            .map(|a| a.expect("every request answered"))
            .collect())
    }

    /// Answers `requests` with the model, reusing and extending the cache. A
    /// request whose prompt does not fit the model's context is answered
    /// [`Answer::Failed`] ([`Self::overflowing`]), the others as usual. With a
    /// spend budget they are asked in runs of about one forward batch
    /// ([`SpendGate::runs`]); once it is spent the rest are
    /// [`Answer::Unreached`].
    fn answer(
        &self,
        ticket: Ticket,
        tiers: &mut KvTiers<E::Kv>,
        call: &AiCall,
        requests: &[AiRequest<'_>],
    ) -> Result<Vec<Answer>> {
        let anchor_texts: Vec<&str> = requests.iter().map(|r| r.anchor.text).collect();
        let anchors = self.docs(&call.tables[0], &anchor_texts)?;
        let partners = if call.pieces.pair {
            let texts: Vec<&str> = requests
                .iter()
                .map(|r| r.partner.expect("pair requests have partners").text)
                .collect();
            self.docs(&call.tables[1], &texts)?
        } else {
            Vec::new()
        };
        let mut answers = self.overflowing(call, requests, &anchors, &partners)?;
        let fitting: Vec<usize> = (0..requests.len())
            .filter(|&i| answers[i].is_none())
            .collect();
        let mut spent = false;
        for run in self.spend_gate.runs(
            requests,
            &fitting,
            &anchors,
            &partners,
            self.config.batch_tokens,
        ) {
            spent = spent || self.spend_gate.spent();
            let got = if spent {
                None
            } else {
                let pick = |all: &[Arc<Vec<u32>>]| -> Vec<Arc<Vec<u32>>> {
                    if all.is_empty() {
                        Vec::new()
                    } else {
                        run.iter().map(|&i| all[i].clone()).collect()
                    }
                };
                let asked: Vec<AiRequest<'_>> = run.iter().map(|&i| requests[i]).collect();
                match self.answer_fitting(
                    ticket,
                    tiers,
                    call,
                    &asked,
                    &pick(&anchors),
                    &pick(&partners),
                ) {
                    Ok(got) => Some(got),
                    Err(e) => {
                        self.spent_stop(ticket, &call.op_id, e)?;
                        spent = true;
                        None
                    }
                }
            };
            match got {
                Some(got) => {
                    for (&i, a) in run.iter().zip(got) {
                        answers[i] = Some(a);
                    }
                }
                None => {
                    for &i in &run {
                        answers[i] = Some(Answer::Unreached);
                    }
                }
            }
        }
        Ok(answers
            .into_iter()
            .map(|a| a.expect("every request answered, failed or unreached"))
            .collect())
    }

    /// [`Self::answer`] for requests that fit the context, with their
    /// documents' token ids.
    fn answer_fitting(
        &self,
        ticket: Ticket,
        tiers: &mut KvTiers<E::Kv>,
        call: &AiCall,
        requests: &[AiRequest<'_>],
        anchors: &[Arc<Vec<u32>>],
        partners: &[Arc<Vec<u32>>],
    ) -> Result<Vec<Answer>> {
        let pieces = &call.pieces;
        if !pieces.pair {
            // One document: preamble + doc, then the tail as the question.
            let tail = self.piece(&pieces.tail)?;
            let nodes = self.anchor_prompts(ticket, tiers, call, requests, anchors, &tail, true)?;
            self.ask_one(ticket, tiers, call, &nodes, requests)
        } else {
            // Pairs: preamble + anchor + frame cached, partners packed as suffixes.
            // Each pair is asked once per query: the operators' memo
            // ([`crate::inference::memo`]) answers repeats before they get here.
            let frame = self.piece(&pieces.frame)?;
            let nodes =
                self.anchor_prompts(ticket, tiers, call, requests, anchors, &frame, false)?;
            self.ask_pairs(ticket, tiers, call, &nodes, requests, partners)
        }
    }

    /// One-document questions whose whole prompt is the KV of `nodes` (one per request).
    /// A generating call is asked [`GENERATING_REQUESTS_PER_CALL`] requests at
    /// a time, so that a stopped query (`--timeout-s`, an interrupt, a spent
    /// budget) waits for at most one such group's decoding, not a whole
    /// batch's. Requests left when the spend budget ran out are [`Answer::Unreached`].
    fn ask_one(
        &self,
        ticket: Ticket,
        tiers: &KvTiers<E::Kv>,
        call: &AiCall,
        nodes: &[(DocKey, NodeId)],
        requests: &[AiRequest<'_>],
    ) -> Result<Vec<Answer>> {
        let items: Vec<(Option<&E::Kv>, &[u32])> = nodes
            .iter()
            .map(|(k, n)| (tiers.suffixes[k].kv(*n), &[][..]))
            .collect();
        let labels = self.labels(call)?;
        let group = if call.kind.generates() {
            GENERATING_REQUESTS_PER_CALL
        } else {
            requests.len().max(1)
        };
        let mut answers = Vec::with_capacity(requests.len());
        for (items, group) in items.chunks(group).zip(requests.chunks(group)) {
            let asked = self.forward(ticket, &call.op_id, |stopped| {
                self.exec.answer(call, group, items, &labels, stopped)
            });
            match asked {
                Ok(got) => answers.extend(got),
                Err(e) => {
                    self.spent_stop(ticket, &call.op_id, e)?;
                    unreached_after(&mut answers, requests.len());
                    break;
                }
            }
        }
        Ok(answers)
    }

    /// Token ids of `call`'s label continuations.
    /// For an extraction: each field's question and answer cue.
    fn labels(&self, call: &AiCall) -> Result<Vec<Vec<u32>>> {
        self.answer_pieces(call)
            .iter()
            .map(|l| self.piece(l).map(|v| v.as_ref().clone()))
            .collect()
    }

    /// The texts scored or prefilled after a prompt: label continuations, or
    /// an extraction's field questions.
    fn answer_pieces(&self, call: &AiCall) -> Vec<String> {
        if call.kind.describe().asks_per_field() {
            call.descriptions.clone()
        } else {
            label_continuations(&call.labels)
        }
    }

    /// Pair questions: `label + partner + tail` packed after the KV of `nodes`
    /// (`preamble + anchor + frame`, one per request); `partners` are the
    /// partner documents' token ids.
    fn ask_pairs(
        &self,
        ticket: Ticket,
        tiers: &KvTiers<E::Kv>,
        call: &AiCall,
        nodes: &[(DocKey, NodeId)],
        requests: &[AiRequest<'_>],
        partners: &[Arc<Vec<u32>>],
    ) -> Result<Vec<Answer>> {
        let pieces = &call.pieces;
        let label = self.piece(&pieces.label)?;
        let tail = self.piece(&pieces.tail)?;
        let suffixes: Vec<Vec<u32>> = partners
            .iter()
            .map(|p| [label.as_slice(), p.as_slice(), tail.as_slice()].concat())
            .collect();
        let label_tokens = self.longest_label(call)?;
        for (j, r) in requests.iter().enumerate() {
            let (k, n) = &nodes[j];
            let anchor_len = tiers.suffixes[k].kv(*n).map_or(0, |kv| kv.len());
            let len = anchor_len + suffixes[j].len() + label_tokens;
            self.check_context(
                &call.op_id,
                format_args!(
                    "{} × {}",
                    Excerpt(r.anchor.id),
                    Excerpt(r.partner.map_or("", |p| p.id))
                ),
                format_args!("{} × {}", call.tables[0], call.tables[1]),
                len,
            )?;
        }
        self.ask_in_chunks(
            ticket,
            call,
            requests,
            |j| suffixes[j].len(),
            |j| {
                let (k, n) = &nodes[j];
                (tiers.suffixes[k].kv(*n), suffixes[j].as_slice())
            },
        )
    }

    /// Asks `requests` in chunks of at most `batch_tokens` suffix positions;
    /// `item(i)` is request `i`'s (prefix KV, suffix) and `tokens(i)` its suffix length.
    /// Requests left when the spend budget ran out are [`Answer::Unreached`].
    fn ask_in_chunks<'a>(
        &self,
        ticket: Ticket,
        call: &AiCall,
        requests: &[AiRequest<'_>],
        tokens: impl Fn(usize) -> usize,
        item: impl Fn(usize) -> (Option<&'a E::Kv>, &'a [u32]),
    ) -> Result<Vec<Answer>>
    where
        E::Kv: 'a,
    {
        let labels = self.labels(call)?;
        let order: Vec<usize> = (0..requests.len()).collect();
        let mut answers = Vec::with_capacity(requests.len());
        let most = if call.kind.generates() {
            GENERATING_REQUESTS_PER_CALL
        } else {
            usize::MAX
        };
        'chunks: for chunk in chunk_by_tokens(&order, self.config.batch_tokens, |&i| tokens(i)) {
            for group in chunk.chunks(most) {
                let items: Vec<(Option<&E::Kv>, &[u32])> = group.iter().map(|&i| item(i)).collect();
                let reqs: Vec<AiRequest<'_>> = group.iter().map(|&i| requests[i]).collect();
                let asked = self.forward(ticket, &call.op_id, |stopped| {
                    self.exec.answer(call, &reqs, &items, &labels, stopped)
                });
                match asked {
                    Ok(got) => answers.extend(got),
                    Err(e) => {
                        self.spent_stop(ticket, &call.op_id, e)?;
                        unreached_after(&mut answers, requests.len());
                        break 'chunks;
                    }
                }
            }
        }
        Ok(answers)
    }

    /// Asks `doc` (its KV held) one later operator's questions and keeps the
    /// answers for it.
    fn ask_ahead_one(
        &self,
        ticket: Ticket,
        tiers: &mut KvTiers<E::Kv>,
        lookahead: &mut Lookahead,
        doc: &DocKey,
        q: &AheadQuestion,
    ) -> Result<()> {
        let call = &q.call;
        let pieces = &call.pieces;
        let suffix = self.piece(if pieces.pair {
            &pieces.frame
        } else {
            &pieces.tail
        })?;
        let one = std::slice::from_ref(doc);
        let node =
            self.question_nodes(ticket, tiers, &call.op_id, one, &suffix, !pieces.pair)?[doc];
        // The document's text is in its KV; executors read the ids.
        let anchor = Doc {
            id: &doc.id,
            text: "",
        };
        let requests: Vec<AiRequest<'_>> = if pieces.pair {
            q.partners
                .iter()
                .map(|(id, text)| AiRequest {
                    anchor,
                    partner: Some(Doc { id, text }),
                })
                .collect()
        } else {
            vec![AiRequest {
                anchor,
                partner: None,
            }]
        };
        let nodes = vec![(doc.clone(), node); requests.len()];
        let answers = if pieces.pair {
            let texts: Vec<&str> = q.partners.iter().map(|(_, text)| text.as_str()).collect();
            let partners = self.docs(&call.tables[1], &texts)?;
            self.ask_pairs(ticket, tiers, call, &nodes, &requests, &partners)?
        } else {
            self.ask_one(ticket, tiers, call, &nodes, &requests)?
        };
        lookahead.store(call, &requests, answers);
        Ok(())
    }

    /// `--prefix-cache off`: every prompt from its first token.
    fn run_uncached(
        &self,
        ticket: Ticket,
        call: &AiCall,
        requests: &[AiRequest<'_>],
    ) -> Result<Vec<Answer>> {
        let pieces = &call.pieces;
        let preamble = self.piece(&pieces.preamble)?;
        let anchors: Vec<&str> = requests.iter().map(|r| r.anchor.text).collect();
        let anchor_tokens = self.docs(&call.tables[0], &anchors)?;
        let partner_tokens = if pieces.pair {
            let ps: Vec<&str> = requests
                .iter()
                .map(|r| r.partner.expect("pair").text)
                .collect();
            Some(self.docs(&call.tables[1], &ps)?)
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
        let label_tokens = self.longest_label(call)?;
        let mut answers: Vec<Option<Answer>> = requests
            .iter()
            .zip(&prompts)
            .map(|(r, p)| {
                self.context_overflow(
                    &call.op_id,
                    Excerpt(r.anchor.id),
                    &call.tables[0],
                    p.len() + label_tokens,
                )
                .map(|m| Answer::Failed(m.into()))
            })
            .collect();
        let fitting: Vec<usize> = (0..requests.len())
            .filter(|&i| answers[i].is_none())
            .collect();
        let asked: Vec<AiRequest<'_>> = fitting.iter().map(|&i| requests[i]).collect();
        let got = self.ask_in_chunks(
            ticket,
            call,
            &asked,
            |j| prompts[fitting[j]].len(),
            |j| (None, prompts[fitting[j]].as_slice()),
        )?;
        for (&i, a) in fitting.iter().zip(got) {
            answers[i] = Some(a);
        }
        Ok(answers
            .into_iter()
            .map(|a| a.expect("every request answered or failed"))
            .collect())
    }
}

/// What the scheduler does with a document the tiers are about to drop: asks
/// it the questions later operators will ask ([`Lookahead`]) and keeps the
/// answers for them.
struct AskAhead<'a, E: Executor> {
    backend: &'a ScheduledBackend<E>,
    ticket: Ticket,
    lookahead: &'a mut Lookahead,
    /// The questions [`BeforeDrop::wants`] found, asked by [`BeforeDrop::ask`].
    questions: Vec<AheadQuestion>,
}

impl<E: Executor> BeforeDrop<E::Kv> for AskAhead<'_, E> {
    fn wants(&mut self, doc: &DocKey) -> bool {
        self.questions = self.lookahead.questions_for(doc);
        !self.questions.is_empty()
    }

    fn ask(&mut self, tiers: &mut KvTiers<E::Kv>, doc: &DocKey) -> Result<()> {
        let exec = &self.backend.exec;
        let fresh = exec.fresh_tokens();
        for q in std::mem::take(&mut self.questions) {
            let asked = self
                .backend
                .ask_ahead_one(self.ticket, tiers, self.lookahead, doc, &q);
            if asked.is_err() {
                // Cancelled: stop. Otherwise the operator asks in its turn,
                // where a failure is reported with its row.
                self.backend.gate.check(self.ticket, &q.call.op_id)?;
                self.lookahead.disable(&q.call.op_id);
            }
        }
        self.lookahead.tokens += exec.fresh_tokens() - fresh;
        Ok(())
    }

    fn dropped(&mut self, doc: &DocKey) {
        self.lookahead.forget(doc);
    }
}

/// Splits `items` into consecutive chunks of at most `max_tokens` tokens (at least one item each).
fn chunk_by_tokens<T>(items: &[T], max_tokens: usize, tokens: impl Fn(&T) -> usize) -> Vec<&[T]> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < items.len() {
        let mut end = start;
        let mut used = 0;
        while end < items.len() && (end == start || used + tokens(&items[end]) <= max_tokens) {
            used += tokens(&items[end]);
            end += 1;
        }
        out.push(&items[start..end]);
        start = end;
    }
    out
}

/// Host memory a forward batch may use besides the KV cache (activations,
/// score matrices), left to the model by a query's heap bound.
const FORWARD_WORKING_BYTES: usize = 2 << 30;

impl<E: Executor> ScheduledBackend<E> {
    /// What the executor has computed so far, in all queries: a batch's work
    /// is what these grew by while it ran, and only this query's batches run
    /// between its begin and its end.
    fn computed(&self) -> Computed {
        Computed {
            fresh: self.exec.fresh_tokens(),
            label: self.exec.label_tokens(),
            decode: self.exec.decode_tokens(),
            decode_seconds: self.exec.decode_seconds(),
        }
    }

    /// The query's measurements: what it computed since `start`, its KV tiers'
    /// counters and the look-ahead's, and the scheduler's settings.
    fn query_work(&self, start: &Computed) -> Work {
        let state = self.state.lock().expect("scheduler lock");
        let ahead = &state.lookahead;
        let kv = state.tiers.counters();
        let transfer = self.exec.simulated_link_bytes_per_second().map(|link| {
            let moved = (kv.offloaded_bytes + kv.restored_bytes) as f64;
            Sum(moved / link)
        });
        Work {
            kv_peak_bytes: Some(Max(kv.peak_bytes as u64)),
            kv_evictions: Some(Sum(kv.evictions)),
            kv_host_budget_bytes: Some(Config(self.config.host_kv_budget_bytes as u64)),
            kv_host_peak_bytes: Some(Max(kv.host_peak_bytes as u64)),
            kv_offloads: Some(Sum(kv.offloads)),
            restored_tokens: Some(Sum(kv.restored_tokens)),
            speculative_tokens: Some(Sum(ahead.tokens)),
            speculative_questions: Some(Sum(ahead.questions)),
            speculative_unused: Some(Sum(ahead.unused() as u64)),
            kv_restored_bytes: Some(Sum(kv.restored_bytes)),
            kv_offloaded_bytes: Some(Sum(kv.offloaded_bytes)),
            kv_transfer_seconds: transfer,
            kv_budget_bytes: Some(Config(self.config.kv_budget_bytes as u64)),
            batch_tokens: Some(Config(self.config.batch_tokens as u64)),
            prefix_cache: Some(Config(self.config.prefix_cache)),
            ..self.computed().since(start)
        }
    }
}

/// The executor's running counts ([`ScheduledBackend::computed`]).
#[derive(Debug, Clone, Copy)]
struct Computed {
    fresh: u64,
    label: u64,
    decode: u64,
    decode_seconds: f64,
}

impl Computed {
    /// What was computed between `start` and these counts, as [`Work`].
    fn since(&self, start: &Computed) -> Work {
        Work {
            fresh_tokens: Some(Sum(self.fresh - start.fresh)),
            label_tokens: Some(Sum(self.label - start.label)),
            decode_tokens: Some(Sum(self.decode - start.decode)),
            decode_seconds: Some(Sum(self.decode_seconds - start.decode_seconds)),
            ..Work::default()
        }
    }
}

impl<E: Executor> InferenceBackend for ScheduledBackend<E> {
    fn name(&self) -> &str {
        self.exec.name()
    }

    /// Stops the previous query's work and waits for it to leave (at most one
    /// forward batch), so it cannot touch this query's state or counters; then
    /// new KV tiers for this one.
    fn begin(self: Arc<Self>, start: QueryStart) -> Result<Arc<dyn QueryBackend>> {
        let ticket = {
            let (_started, ticket) = self.gate.next_query();
            self.keep_tokens_of(&start.calls);
            let mut state = self.state.lock().expect("scheduler lock");
            state.tiers = Self::empty_tiers(&self.exec, &self.config);
            state.ops = start
                .calls
                .iter()
                .map(|c| (c.op_id.clone(), c.tables[0].clone()))
                .collect();
            state.current_op = None;
            state.lookahead = if self.config.lookahead {
                Lookahead::new(&start.calls)
            } else {
                Lookahead::default()
            };
            self.spend_gate.begin(start.spend, self.exec.fresh_tokens());
            ticket
        };
        let started = self.computed();
        Ok(Arc::new(ScheduledQuery {
            backend: self,
            ticket,
            started,
        }))
    }

    fn reuses_work(&self) -> bool {
        self.config.prefix_cache
    }

    fn context_positions(&self) -> Option<usize> {
        Some(self.exec.max_positions())
    }

    fn kv_capacity_tokens(&self) -> Option<usize> {
        self.config
            .prefix_cache
            .then(|| self.config.kv_budget_bytes / self.exec.kv_bytes_per_token().max(1))
    }

    fn host_memory_allowance(&self) -> usize {
        // Where the KV lives (host or device) is the executor's; both budgets
        // are counted, so a CPU model never trips the bound with its cache.
        self.config
            .kv_budget_bytes
            .saturating_add(self.config.host_kv_budget_bytes)
            .saturating_add(FORWARD_WORKING_BYTES)
    }
}

/// One query on a [`ScheduledBackend`]: its ticket at the backend's gate and
/// the executor's counts when it began.
struct ScheduledQuery<E: Executor> {
    backend: Arc<ScheduledBackend<E>>,
    ticket: Ticket,
    started: Computed,
}

impl<E: Executor> QueryBackend for ScheduledQuery<E> {
    fn answer(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Answered> {
        let before = self.backend.computed();
        let answers = self.backend.run(self.ticket, call, requests)?;
        Ok(Answered {
            answers,
            work: self.backend.computed().since(&before),
        })
    }

    fn work(&self) -> Work {
        self.backend.query_work(&self.started)
    }

    fn cancel(&self) {
        self.backend.gate.cancel_query(self.ticket);
    }

    fn wait_stopped(&self) {
        self.backend.gate.wait_idle();
    }

    fn partners_collected(&self, call: &AiCall, partners: &[Doc<'_>]) {
        let backend = &self.backend;
        if !backend.config.prefix_cache || partners.len() > MAX_PARTNERS_AHEAD {
            return;
        }
        let owned = partners
            .iter()
            .map(|d| (d.id.to_string(), d.text.to_string()))
            .collect();
        let mut state = backend.state.lock().expect("scheduler lock");
        state.lookahead.partners_collected(call, owned);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inference::backend::{AiKind, Answerer, test_call, test_requests};

    fn tiny_backend() -> Arc<ScheduledBackend<ModelExecutor>> {
        let spec = ModelSpec {
            model: "tiny".into(),
            gpu: None,
            dtype: None,
            scheduler: SchedulerConfig {
                kv_budget_bytes: 256 << 20,
                ..SchedulerConfig::default()
            },
            kv_budget_from_device: false,
            host_kv_from_memory: false,
        };
        load_model_backend(&spec).unwrap().0
    }

    /// Documents `rv0..rv{n}` of one dataset: the same ids in every dataset,
    /// other texts.
    fn dataset(words: &str, n: usize) -> Vec<(String, String)> {
        (0..n)
            .map(|i| {
                let text = format!("{words} {}", words.repeat(i % 5 + 1));
                (format!("rv{i}"), text)
            })
            .collect()
    }

    /// A query of `calls` on `backend`.
    fn start<E: Executor>(
        backend: &Arc<ScheduledBackend<E>>,
        calls: &[AiCall],
    ) -> Arc<dyn QueryBackend> {
        backend
            .clone()
            .begin(QueryStart {
                calls: calls.to_vec(),
                spend: None,
            })
            .unwrap()
    }

    fn ask<E: Executor>(
        backend: &Arc<ScheduledBackend<E>>,
        docs: &[(String, String)],
    ) -> (Vec<bool>, usize) {
        let call = test_call(AiKind::Filter, "Is the review {0} positive?", &[]);
        let query = start(backend, std::slice::from_ref(&call));
        let answers: Vec<bool> = query
            .answer(&call, &test_requests(docs))
            .unwrap()
            .answers
            .iter()
            .map(|a| a.as_bool().unwrap())
            .collect();
        let fresh = query.work().fresh() as usize;
        (answers, fresh)
    }

    #[test]
    fn a_second_dataset_with_the_same_ids_is_answered_from_its_own_texts() {
        let first = dataset("a warm, funny and moving film that I loved", 12);
        let second = dataset("dull plot; wooden acting; I left early", 12);
        let alone = ask(&tiny_backend(), &second);
        let reused = tiny_backend();
        let before = ask(&reused, &first);
        // The test can fail: the two datasets' answers and token counts differ.
        assert_ne!(before, alone);
        assert_eq!(ask(&reused, &second), alone);
        // And back: the first dataset's texts are still told apart.
        assert_eq!(ask(&reused, &first), before);
    }

    /// A simulation answering from prompt hashes, one byte of KV per position.
    fn simulation(
        kv_budget_bytes: usize,
        host_kv_budget_bytes: usize,
    ) -> Arc<ScheduledBackend<SimExecutor>> {
        let answers: Arc<dyn Answerer> =
            Arc::new(crate::inference::backend::ContentHashBackend::default());
        Arc::new(ScheduledBackend::new(
            SimExecutor::answering(answers, 1, QWEN3_4B_MAX_POSITIONS),
            Tokenizer::vendored().unwrap(),
            SchedulerConfig {
                kv_budget_bytes,
                host_kv_budget_bytes,
                ..SchedulerConfig::default()
            },
        ))
    }

    /// Long documents (past the stub a dropped document keeps), all different.
    fn long_docs(n: usize) -> Vec<(String, String)> {
        (0..n)
            .map(|i| {
                let words: Vec<String> = (0..120).map(|w| format!("w{}", w * 7 + i)).collect();
                (format!("rv{i}"), words.join(" "))
            })
            .collect()
    }

    fn measured(query: &Arc<dyn QueryBackend>, key: &str) -> u64 {
        query.work().to_json()[key].as_u64().unwrap()
    }

    /// Asks `call` about each document in a call of its own, twice over;
    /// returns the answers.
    fn ask_each_twice(
        query: &Arc<dyn QueryBackend>,
        call: &AiCall,
        docs: &[(String, String)],
    ) -> Vec<Answer> {
        let all = test_requests(docs);
        let mut answers = Vec::new();
        for _ in 0..2 {
            for r in &all {
                answers.extend(query.answer(call, std::slice::from_ref(r)).unwrap().answers);
            }
        }
        answers
    }

    #[test]
    fn a_document_asked_again_reuses_its_kv() {
        let backend = simulation(1 << 30, 0);
        let call = test_call(AiKind::Filter, "Is the review {0} positive?", &[]);
        let query = start(&backend, std::slice::from_ref(&call));
        let docs = long_docs(4);
        let asked = test_requests(&docs);
        let first = query.answer(&call, &asked).unwrap().answers;
        let fresh = measured(&query, "fresh_tokens");
        assert!(fresh > 4 * 120);
        assert_eq!(query.answer(&call, &asked).unwrap().answers, first);
        assert_eq!(measured(&query, "fresh_tokens"), fresh);
        // The answers are the answering backend's: caching changes no answer.
        let direct = crate::inference::backend::ContentHashBackend::default();
        assert_eq!(first, direct.answer(&call, &asked).unwrap());
    }

    #[test]
    fn a_small_budget_evicts_or_offloads_and_changes_no_answer() {
        let call = test_call(AiKind::Filter, "Is the review {0} positive?", &[]);
        let docs = long_docs(6);
        let run = |device: usize, host: usize| {
            let backend = simulation(device, host);
            let query = start(&backend, std::slice::from_ref(&call));
            let answers = ask_each_twice(&query, &call, &docs);
            let counts = [
                "kv_evictions",
                "kv_offloads",
                "restored_tokens",
                "fresh_tokens",
            ]
            .map(|k| measured(&query, k));
            (answers, counts, (backend, query))
        };
        let (roomy, [evicted, offloaded, _, fresh], _) = run(1 << 30, 0);
        assert_eq!((evicted, offloaded), (0, 0));
        // Room for about two documents (483 positions each with the question):
        // the second pass computes them again.
        let (tight, [evicted, offloaded, restored, tight_fresh], backend) = run(1000, 0);
        assert_eq!(tight, roomy);
        assert!(evicted > 0 && offloaded == 0 && restored == 0);
        assert!(tight_fresh > fresh);
        assert!(measured(&backend.1, "kv_peak_bytes") > 1000);
        // A host tier for all of them: moved, then copied back, never recomputed.
        let (hosted, [evicted, offloaded, restored, hosted_fresh], backend) = run(1000, 1 << 20);
        assert_eq!(hosted, roomy);
        assert!(evicted == 0 && offloaded > 0 && restored > 0);
        assert_eq!(hosted_fresh, fresh);
        // A new query starts from nothing, counters included.
        let (backend, _ended) = backend;
        let query = start(&backend, std::slice::from_ref(&call));
        for key in [
            "kv_offloads",
            "restored_tokens",
            "fresh_tokens",
            "kv_peak_bytes",
        ] {
            assert_eq!(measured(&query, key), 0, "{key}");
        }
    }

    #[test]
    fn documents_of_tables_no_later_operator_reads_are_dropped() {
        let backend = simulation(1 << 30, 0);
        let first = test_call(AiKind::Filter, "Is the review {0} positive?", &[]);
        let mut second = test_call(AiKind::Filter, "Is the plot {0} dull?", &[]);
        second.op_id = "op-2".into();
        second.tables = vec!["u".into()];
        let query = start(&backend, &[first.clone(), second.clone()]);
        let docs = long_docs(2);
        query.answer(&first, &test_requests(&docs)).unwrap();
        query.answer(&second, &test_requests(&docs[..1])).unwrap();
        let state = backend.state.lock().unwrap();
        let tables: HashSet<&str> = state
            .tiers
            .doc_nodes
            .keys()
            .map(|k| k.table.as_str())
            .collect();
        assert_eq!(tables, HashSet::from(["u"]));
    }

    #[test]
    fn batches_are_cut_at_the_token_budget_and_an_oversize_item_goes_alone() {
        let sizes = [3, 4, 10, 2, 2, 1];
        let chunks = chunk_by_tokens(&sizes, 8, |&t| t);
        assert_eq!(chunks, [&[3, 4][..], &[10], &[2, 2, 1]]);
        let mut answers = vec![Answer::Bool(true)];
        unreached_after(&mut answers, 3);
        assert_eq!(
            answers,
            [Answer::Bool(true), Answer::Unreached, Answer::Unreached]
        );
    }
}
