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
//! prompt pieces is answered by the query's memo ([`crate::memo`]) before it
//! reaches the scheduler. This is exactly the structure of
//! QUAIL-B's minimum-token rule (SPEC §D.4), so with enough KV memory the fresh
//! tokens equal the minimum. Inserting a batch's sequences before computing them
//! makes every distinct prefix computed once, in waves of packed forward passes
//! bounded by a token budget.
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
//! Every forward batch goes through one gate ([`ScheduledBackend::forward`]):
//! it does not start once the query is cancelled or its budget
//! ([`crate::spend`]) is spent, and what it computed is charged to the budget.
//! With a budget, a call's requests are asked about one forward batch at a
//! time, so the answers of those done before the budget ran out are kept and
//! the rest come back [`Answer::Unreached`]. A row whose prompt is longer than
//! the model's context is answered [`Answer::Failed`], naming it; the other
//! rows of its batch are answered as usual.
//!
//! The module's jobs, one file each: scheduling (here), the executors that
//! compute KV ([`executors`]), the KV budget ([`budget`]) and model loading
//! ([`loading`]).

mod budget;
mod executors;
mod loading;
mod lookahead;

pub use budget::{default_host_kv_budget_bytes, default_kv_budget_bytes, gpu_kv_budget_bytes};
pub use executors::{
    Executor, ModelExecutor, QWEN3_4B_KV_BYTES_PER_TOKEN, QWEN3_4B_MAX_POSITIONS,
    SIMULATED_LINK_BYTES_PER_SECOND, SimExecutor, VirtualKv, best_label, label_probabilities,
};
pub use loading::{
    ModelSpec, RunMetadata, answer_identity, load_model_backend, model_input_paths, model_source,
    simulation_backend, tiny_model_dir, tiny_model_path,
};

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use aisql_models::Tokenizer;

use crate::backend::{AiCall, AiKind, AiRequest, Answer, Doc, InferenceBackend};
use crate::error::{EngineError, Result};
use crate::kv_cache::{KvOps, NodeId, PrefixTrie};
use crate::memo::DocKey;
use crate::prompt::{Excerpt, label_continuations};
use crate::query_gate::{QueryGate, Ticket};
use crate::spend::Spend;
use crate::work::{Config, Max, Sum, Work};
use lookahead::{AheadQuestion, Lookahead, MAX_PARTNERS_AHEAD};

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

/// SHA-256 of a document's text.
type TextDigest = [u8; 32];

/// The SHA-256 of each text, each distinct one hashed once: a batch repeats a
/// join anchor for every partner, and the same string (one address and length,
/// both borrowed for the whole call) holds the same bytes.
fn text_digests(texts: &[&str]) -> Vec<TextDigest> {
    use sha2::Digest as _;
    let mut seen: HashMap<(usize, usize), TextDigest> = HashMap::new();
    texts
        .iter()
        .map(|t| {
            *seen
                .entry((t.as_ptr() as usize, t.len()))
                .or_insert_with(|| sha2::Sha256::digest(t.as_bytes()).into())
        })
        .collect()
}

/// Token ids kept across queries.
#[derive(Default)]
struct Tokens {
    /// Documents' token ids by the SHA-256 of their text, each with the table it
    /// was last read from. Keyed by content, not by id: ids repeat across
    /// datasets (`rv0` in every IMDB collection), and a worker or session that
    /// serves another dataset must never reuse the tokens of the first.
    docs: HashMap<TextDigest, (Arc<str>, Arc<Vec<u32>>)>,
    pieces: HashMap<String, Arc<Vec<u32>>>,
}

struct Cache<K> {
    docs: PrefixTrie<K>,
    doc_nodes: HashMap<DocKey, NodeId>,
    suffixes: HashMap<DocKey, PrefixTrie<K>>,
    /// Per document, the call that last used it (eviction order).
    last_used: HashMap<DocKey, u64>,
    calls: u64,
    /// A dropped document keeps its KV up to this depth (preamble and first
    /// tokens): documents to come that start the same way reuse it.
    stub_depth: usize,
}

impl<K: KvOps> Cache<K> {
    fn new() -> Self {
        Self {
            docs: PrefixTrie::new(None),
            doc_nodes: HashMap::new(),
            suffixes: HashMap::new(),
            last_used: HashMap::new(),
            calls: 0,
            stub_depth: 0,
        }
    }

    /// Device bytes of KV held.
    fn bytes(&self) -> usize {
        self.docs.bytes() + self.suffixes.values().map(PrefixTrie::bytes).sum::<usize>()
    }

    /// Host bytes of KV held (offloaded).
    fn host_bytes(&self) -> usize {
        self.docs.host_bytes()
            + self
                .suffixes
                .values()
                .map(PrefixTrie::host_bytes)
                .sum::<usize>()
    }
}

struct QueryState<K> {
    cache: Cache<K>,
    /// Per AI operator in post-order: (op id, anchor table).
    ops: Vec<(String, String)>,
    fresh_start: u64,
    label_start: u64,
    decode_start: u64,
    decode_seconds_start: f64,
    peak_bytes: usize,
    evictions: u64,
    current_op: Option<String>,
    /// Host tier: peak bytes, documents moved there, positions brought back.
    host_peak_bytes: usize,
    offloads: u64,
    restored_tokens: u64,
    restored_bytes: u64,
    offloaded_bytes: u64,
    /// Questions of later operators asked ahead.
    lookahead: Lookahead,
}

/// The model backend: plan-aware scheduling over an [`Executor`].
pub struct ScheduledBackend<E: Executor> {
    exec: E,
    tokenizer: Tokenizer,
    config: SchedulerConfig,
    /// Shared with another backend over the same tokenizer
    /// ([`Self::sharing_tokens`]), which then tokenizes each document once.
    tokens: Arc<Mutex<Tokens>>,
    state: Mutex<QueryState<E::Kv>>,
    gate: QueryGate,
    /// The running query's budget meter, if it has a budget.
    spend: Mutex<Option<Arc<Spend>>>,
    /// The executor's fresh tokens already charged to the budget: a batch
    /// charges what the count grew by since, so work is never charged twice.
    charged_fresh: AtomicU64,
}

impl<E: Executor> ScheduledBackend<E> {
    /// A backend over `exec`, tokenizing with `tokenizer`.
    pub fn new(exec: E, tokenizer: Tokenizer, config: SchedulerConfig) -> Self {
        Self::with_tokens(exec, tokenizer, config, Arc::default())
    }

    /// A backend over `exec` that shares `other`'s token ids (and its
    /// tokenizer): an estimate's two simulations of one query tokenize each
    /// document once.
    pub fn sharing_tokens<F: Executor>(
        exec: E,
        other: &ScheduledBackend<F>,
        config: SchedulerConfig,
    ) -> Self {
        Self::with_tokens(exec, other.tokenizer.clone(), config, other.tokens.clone())
    }

    fn with_tokens(
        exec: E,
        tokenizer: Tokenizer,
        config: SchedulerConfig,
        tokens: Arc<Mutex<Tokens>>,
    ) -> Self {
        Self {
            exec,
            tokenizer,
            config,
            tokens,
            state: Mutex::new(QueryState {
                cache: Cache::new(),
                ops: Vec::new(),
                fresh_start: 0,
                label_start: 0,
                decode_start: 0,
                decode_seconds_start: 0.0,
                peak_bytes: 0,
                evictions: 0,
                current_op: None,
                host_peak_bytes: 0,
                offloads: 0,
                restored_tokens: 0,
                restored_bytes: 0,
                offloaded_bytes: 0,
                lookahead: Lookahead::default(),
            }),
            gate: QueryGate::default(),
            spend: Mutex::new(None),
            charged_fresh: AtomicU64::new(0),
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

    /// The running query's budget meter, if it has a budget.
    fn spend(&self) -> Option<Arc<Spend>> {
        self.spend.lock().expect("spend lock").clone()
    }

    /// Whether the running query's budget is spent.
    fn budget_spent(&self) -> bool {
        self.spend().is_some_and(|s| s.reached().is_some())
    }

    /// Runs one forward batch of `op_id`'s work: `work(stopped)` calls the
    /// model, where `stopped()` tells a generation to give up between two
    /// decode steps. The batch does not start once the query is cancelled or
    /// its budget is spent ([`EngineError::OverBudget`]); what it computed
    /// (fresh tokens, wall time) is charged to the budget after.
    fn forward<T>(
        &self,
        ticket: Ticket,
        op_id: &str,
        work: impl FnOnce(&dyn Fn() -> bool) -> Result<T>,
    ) -> Result<T> {
        self.gate.check(ticket, op_id)?;
        let Some(spend) = self.spend() else {
            return work(&|| self.gate.check(ticket, op_id).is_err());
        };
        if let Some(limit) = spend.reached() {
            return Err(EngineError::OverBudget(spend.describe(limit)));
        }
        let started = Instant::now();
        let uncharged = || {
            (self.exec.fresh_tokens()).saturating_sub(self.charged_fresh.load(Ordering::Relaxed))
        };
        let stopped = || {
            self.gate.check(ticket, op_id).is_err()
                || spend.reached_with(uncharged(), started.elapsed()).is_some()
        };
        let out = work(&stopped);
        let fresh = self.exec.fresh_tokens();
        let before = self.charged_fresh.swap(fresh, Ordering::Relaxed);
        spend.charge(fresh.saturating_sub(before), started.elapsed());
        out
    }

    /// `Ok` when `e` is model work the spent budget stopped (a batch refused
    /// before it started, a generation given up between decode steps) in a
    /// query not cancelled: the questions left are unreached. `Err(e)`
    /// otherwise.
    fn spent_stop(&self, ticket: Ticket, op_id: &str, e: EngineError) -> Result<()> {
        self.gate.check(ticket, op_id)?;
        let stopped = matches!(
            e,
            EngineError::OverBudget(_) | EngineError::Model(aisql_models::ModelError::Stopped)
        );
        if stopped && self.budget_spent() {
            Ok(())
        } else {
            Err(e)
        }
    }

    /// `fitting` (indices of `requests`) cut into runs of about one forward
    /// batch (`batch_tokens` of document tokens, each anchor counted once)
    /// when the query has a budget: each run is answered before the next
    /// starts, so a spent budget loses at most one run's answers. Without a
    /// budget: one run.
    fn budget_runs(
        &self,
        requests: &[AiRequest<'_>],
        fitting: &[usize],
        anchors: &[Arc<Vec<u32>>],
        partners: &[Arc<Vec<u32>>],
    ) -> Vec<Vec<usize>> {
        if self.spend().is_none() {
            return vec![fitting.to_vec()];
        }
        let mut runs = Vec::new();
        let mut run = Vec::new();
        let mut tokens = 0;
        let mut seen: HashSet<&str> = HashSet::new();
        for &i in fitting {
            let mut cost = partners.get(i).map_or(0, |p| p.len());
            if seen.insert(requests[i].anchor.id) {
                cost += anchors[i].len();
            }
            if !run.is_empty() && tokens + cost > self.config.batch_tokens {
                runs.push(std::mem::take(&mut run));
                tokens = 0;
            }
            run.push(i);
            tokens += cost;
        }
        if !run.is_empty() {
            runs.push(run);
        }
        runs
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
        let mut t = self.tokens.lock().expect("tokens lock");
        t.docs.retain(|_, (table, _)| read.contains(table.as_ref()));
        t.docs.shrink_to_fit();
    }

    /// The tables whose documents' token ids are held, sorted.
    pub fn tokenized_tables(&self) -> Vec<String> {
        let t = self.tokens.lock().expect("tokens lock");
        let tables: std::collections::BTreeSet<&str> =
            t.docs.values().map(|(table, _)| table.as_ref()).collect();
        tables.into_iter().map(str::to_string).collect()
    }

    /// Token ids of documents of `table` by their texts, each distinct text
    /// tokenized once.
    fn docs(&self, table: &str, texts: &[&str]) -> Result<Vec<Arc<Vec<u32>>>> {
        let digests = text_digests(texts);
        let missing: Vec<(TextDigest, &str)> = {
            let t = self.tokens.lock().expect("tokens lock");
            let mut seen = HashSet::new();
            digests
                .iter()
                .zip(texts)
                .filter(|(d, _)| !t.docs.contains_key(*d) && seen.insert(**d))
                .map(|(d, text)| (*d, *text))
                .collect()
        };
        let table: Arc<str> = Arc::from(table);
        if !missing.is_empty() {
            let texts: Vec<&str> = missing.iter().map(|(_, text)| *text).collect();
            let encoded = self.tokenizer.encode_documents(&texts)?;
            let mut t = self.tokens.lock().expect("tokens lock");
            for ((digest, _), ids) in missing.iter().zip(encoded) {
                t.docs.insert(*digest, (table.clone(), Arc::new(ids)));
            }
        }
        let mut t = self.tokens.lock().expect("tokens lock");
        Ok(digests
            .iter()
            .map(|d| {
                let entry = t.docs.get_mut(d).expect("tokenized above");
                // The table that reads it now keeps it past this query.
                if *entry.0 != *table {
                    entry.0 = table.clone();
                }
                entry.1.clone()
            })
            .collect())
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
        let gone: Vec<DocKey> = state
            .cache
            .doc_nodes
            .keys()
            .filter(|k| !needed.contains(&k.table))
            .cloned()
            .collect();
        if gone.is_empty() {
            return Ok(());
        }
        let mut users = node_users(&state.cache);
        for k in &gone {
            drop_doc(&mut state.cache, k, &HashSet::new(), &mut users, 0)?;
            state.lookahead.forget(k);
        }
        Ok(())
    }

    /// Keeps the cache within the budget. Documents of the current call are
    /// kept; among the others, the least recently used leave the device first,
    /// each with its question trie: to host memory while the host tier has room
    /// (making room by dropping its own least recently used documents), dropped
    /// otherwise. A document is asked its later operators' questions before it
    /// is dropped ([`Self::ask_ahead`]). Then shared prefixes no document holds
    /// any more go.
    fn enforce_budget(
        &self,
        ticket: Ticket,
        state: &mut QueryState<E::Kv>,
        keep: &HashSet<DocKey>,
    ) -> Result<()> {
        let mut held = state.cache.bytes();
        state.peak_bytes = state.peak_bytes.max(held);
        let budget = self.config.kv_budget_bytes;
        if held <= budget {
            return Ok(());
        }
        let host_budget = self.config.host_kv_budget_bytes;
        let mut host_held = state.cache.host_bytes();
        let cache = &state.cache;
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
        let mut users = node_users(cache);
        // Offloaded documents, oldest first: the host tier's own eviction order.
        let mut on_host: std::collections::VecDeque<DocKey> = victims
            .iter()
            .filter(|(_, k)| doc_bytes(cache, k, &keep_nodes, &users).0 == 0)
            .map(|(_, k)| k.clone())
            .collect();
        // Asks a document ahead, then drops it from both tiers.
        let drop = |state: &mut QueryState<E::Kv>,
                    k: &DocKey,
                    users: &mut HashMap<NodeId, usize>,
                    held: &mut usize,
                    host_held: &mut usize|
         -> Result<()> {
            let (added, freed) = self.ask_ahead(ticket, state, k)?;
            *held += added;
            *host_held -= freed;
            let depth = state.cache.stub_depth;
            let (d, h) = drop_doc(&mut state.cache, k, &keep_nodes, users, depth)?;
            state.lookahead.forget(k);
            *held -= d;
            *host_held -= h;
            state.evictions += 1;
            Ok(())
        };
        for (_, k) in &victims {
            if held <= budget {
                break;
            }
            let (device, host) = doc_bytes(&state.cache, k, &keep_nodes, &users);
            if device == 0 {
                continue; // on the host already
            }
            if host_budget > 0 && device + host <= host_budget {
                while host_held + device > host_budget {
                    let Some(old) = on_host.pop_front() else {
                        break;
                    };
                    drop(state, &old, &mut users, &mut held, &mut host_held)?;
                }
                if host_held + device <= host_budget {
                    let cache = &state.cache;
                    if let Some(t) = cache.suffixes.get(k) {
                        t.offload_all()?;
                    }
                    for n in doc_path(cache, k, &keep_nodes, &users) {
                        cache.docs.offload(n)?;
                    }
                    held -= device;
                    host_held += device;
                    state.offloads += 1;
                    state.offloaded_bytes += device as u64;
                    on_host.push_back(k.clone());
                    state.host_peak_bytes = state.host_peak_bytes.max(host_held);
                    continue;
                }
            }
            drop(state, k, &mut users, &mut held, &mut host_held)?;
        }
        if held > budget {
            let cache = &mut state.cache;
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
        // Stubs of dropped documents left in host memory give way in turn.
        if host_held > host_budget {
            let cache = &mut state.cache;
            let removed: HashSet<NodeId> = cache
                .docs
                .evict_lru_host(host_budget, &|n| keep_nodes.contains(&n))
                .into_iter()
                .collect();
            cache.doc_nodes.retain(|_, n| !removed.contains(n));
            let docs = &cache.doc_nodes;
            cache.suffixes.retain(|k, _| docs.contains_key(k));
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
        state: &mut QueryState<E::Kv>,
        call: &AiCall,
        requests: &[AiRequest<'_>],
        tokens: &[Arc<Vec<u32>>],
        suffix: &[u32],
        scored: bool,
    ) -> Result<Vec<(DocKey, NodeId)>> {
        let preamble = self.piece(&call.pieces.preamble)?;
        let budget_tokens = self.config.kv_budget_bytes / self.exec.kv_bytes_per_token().max(1);
        let cache = &mut state.cache;
        cache.stub_depth = cache
            .stub_depth
            .max(preamble.len() + DROPPED_DOCUMENT_STUB_TOKENS);
        let mut leaves = Vec::with_capacity(requests.len());
        let mut keys = Vec::with_capacity(requests.len());
        for (r, doc) in requests.iter().zip(tokens) {
            // Past the model's context the request was answered Failed before
            // it got here ([`Self::overflowing`]).
            let len = preamble.len() + doc.len() + suffix.len();
            if len > budget_tokens {
                return Err(EngineError::Inference(format!(
                    "{}: document {} of {} needs {len} positions of KV, over the KV budget of {budget_tokens} ({} MiB)",
                    call.op_id,
                    Excerpt(r.anchor.id),
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
        // KV moved to the host comes back by copy, never recomputed.
        let mut restored = 0;
        for &leaf in &leaves {
            restored += cache.docs.restore_path(leaf)?;
        }
        self.materialize(ticket, &call.op_id, &mut cache.docs, &leaves)?;
        self.count_restored(state, restored);
        let targets = self.question_nodes(ticket, state, &call.op_id, &keys, suffix, scored)?;
        Ok(keys
            .into_iter()
            .map(|k| {
                let n = targets[&k];
                (k, n)
            })
            .collect())
    }

    fn count_restored(&self, state: &mut QueryState<E::Kv>, positions: usize) {
        state.restored_tokens += positions as u64;
        state.restored_bytes += (positions * self.exec.kv_bytes_per_token()) as u64;
    }

    /// The KV of `suffix` after each document of `keys` (whose own KV is held):
    /// a node of the document's question trie, computed once per document.
    fn question_nodes(
        &self,
        ticket: Ticket,
        state: &mut QueryState<E::Kv>,
        op_id: &str,
        keys: &[DocKey],
        suffix: &[u32],
        scored: bool,
    ) -> Result<HashMap<DocKey, NodeId>> {
        let cache = &mut state.cache;
        // Question tries: rooted at each document's KV; the suffix computed once per document.
        let mut targets: HashMap<DocKey, NodeId> = HashMap::new();
        for key in keys {
            if targets.contains_key(key) {
                continue;
            }
            let doc_kv = cache
                .doc_nodes
                .get(key)
                .and_then(|&n| cache.docs.kv(n).cloned());
            let trie = cache
                .suffixes
                .entry(key.clone())
                .or_insert_with(|| PrefixTrie::new(doc_kv));
            let node = trie.insert(suffix)?;
            targets.insert(key.clone(), node);
        }
        let mut restored = 0;
        for (key, &node) in &targets {
            restored += cache.suffixes[key].restore_path(node)?;
        }
        self.count_restored(state, restored);
        let cache = &mut state.cache;
        // Compute all questions in waves across documents: gather pending items.
        self.materialize_suffixes(ticket, op_id, cache, &targets)?;
        // A scored question ending on a view (its exact text is a prefix of
        // another question) needs its last position computed again.
        for (key, &node) in targets.iter().filter(|_| scored) {
            let trie = cache.suffixes.get_mut(key).expect("trie exists");
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
                let items: Vec<(Option<&E::Kv>, &[u32])> = chunk
                    .iter()
                    .map(|(k, n)| {
                        let t = &cache.suffixes[k];
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
                    cache.suffixes.get_mut(&k).expect("trie").set_kv(n, h);
                }
            }
        }
        Ok(())
    }

    fn run(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Vec<Answer>> {
        // Held until this call returns: the next query starts only after it.
        let (_in_flight, ticket) = self.gate.enter();
        self.gate.check(ticket, &call.op_id)?;
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        // Once the budget is spent nothing more is asked, nor cached.
        if self.budget_spent() {
            return Ok(vec![Answer::Unreached; requests.len()]);
        }
        if !self.config.prefix_cache {
            return self.run_uncached(ticket, call, requests);
        }
        let mut state = self.state.lock().expect("scheduler lock");
        self.enter_operator(&mut state, &call.op_id)?;
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
            let got = self.answer(ticket, &mut state, call, &asked)?;
            for (&i, a) in todo.iter().zip(got) {
                answers[i] = Some(a);
            }
        }
        let keep: HashSet<DocKey> = keep.into_iter().collect();
        self.enforce_budget(ticket, &mut state, &keep)?;
        Ok(answers
            .into_iter()
            .map(|a| a.expect("every request answered"))
            .collect())
    }

    /// Answers `requests` with the model, reusing and extending the cache. A
    /// request whose prompt does not fit the model's context is answered
    /// [`Answer::Failed`] ([`Self::overflowing`]), the others as usual. With a
    /// budget they are asked in runs of about one forward batch
    /// ([`Self::budget_runs`]); once it is spent the rest are
    /// [`Answer::Unreached`].
    fn answer(
        &self,
        ticket: Ticket,
        state: &mut QueryState<E::Kv>,
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
        for run in self.budget_runs(requests, &fitting, &anchors, &partners) {
            spent = spent || self.budget_spent();
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
                    state,
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
        state: &mut QueryState<E::Kv>,
        call: &AiCall,
        requests: &[AiRequest<'_>],
        anchors: &[Arc<Vec<u32>>],
        partners: &[Arc<Vec<u32>>],
    ) -> Result<Vec<Answer>> {
        let pieces = &call.pieces;
        if !pieces.pair {
            // One document: preamble + doc, then the tail as the question.
            let tail = self.piece(&pieces.tail)?;
            let nodes = self.anchor_prompts(ticket, state, call, requests, anchors, &tail, true)?;
            self.ask_one(ticket, &state.cache, call, &nodes, requests)
        } else {
            // Pairs: preamble + anchor + frame cached, partners packed as suffixes.
            // Each pair is asked once per query: the operators' memo
            // ([`crate::memo`]) answers repeats before they get here.
            let frame = self.piece(&pieces.frame)?;
            let nodes =
                self.anchor_prompts(ticket, state, call, requests, anchors, &frame, false)?;
            self.ask_pairs(ticket, &state.cache, call, &nodes, requests, partners)
        }
    }

    /// One-document questions whose whole prompt is the KV of `nodes` (one per request).
    /// A generating call is asked [`GENERATING_REQUESTS_PER_CALL`] requests at
    /// a time, so that a stopped query (`--timeout-s`, an interrupt, a spent
    /// budget) waits for at most one such group's decoding, not a whole
    /// batch's. Requests left when the budget ran out are [`Answer::Unreached`].
    fn ask_one(
        &self,
        ticket: Ticket,
        cache: &Cache<E::Kv>,
        call: &AiCall,
        nodes: &[(DocKey, NodeId)],
        requests: &[AiRequest<'_>],
    ) -> Result<Vec<Answer>> {
        let items: Vec<(Option<&E::Kv>, &[u32])> = nodes
            .iter()
            .map(|(k, n)| (cache.suffixes[k].kv(*n), &[][..]))
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
        if call.kind == AiKind::Extract {
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
        cache: &Cache<E::Kv>,
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
            let anchor_len = cache.suffixes[k].kv(*n).map_or(0, |kv| kv.len());
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
                (cache.suffixes[k].kv(*n), suffixes[j].as_slice())
            },
        )
    }

    /// Asks `requests` in chunks of at most `batch_tokens` suffix positions;
    /// `item(i)` is request `i`'s (prefix KV, suffix) and `tokens(i)` its suffix length.
    /// Requests left when the budget ran out are [`Answer::Unreached`].
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

    /// Before `doc`'s KV is dropped: asks it the questions later operators will
    /// ask ([`Lookahead`]) and keeps the answers for them. KV on the host comes
    /// back to do so (restored, counted). Returns the (device bytes added, host
    /// bytes freed) that the caller's accounting must follow.
    fn ask_ahead(
        &self,
        ticket: Ticket,
        state: &mut QueryState<E::Kv>,
        doc: &DocKey,
    ) -> Result<(usize, usize)> {
        let questions = state.lookahead.questions_for(doc);
        let Some(&leaf) = state
            .cache
            .doc_nodes
            .get(doc)
            .filter(|_| !questions.is_empty())
        else {
            return Ok((0, 0));
        };
        let per_token = self.exec.kv_bytes_per_token();
        let fresh = self.exec.fresh_tokens();
        let trie_bytes = |state: &QueryState<E::Kv>| {
            state
                .cache
                .suffixes
                .get(doc)
                .map_or((0, 0), |t| (t.bytes(), t.host_bytes()))
        };
        let (device_before, host_before) = trie_bytes(state);
        let restored = state.cache.docs.restore_path(leaf)?;
        self.count_restored(state, restored);
        for q in questions {
            if self.ask_ahead_one(ticket, state, doc, &q).is_err() {
                // Cancelled: stop. Otherwise the operator asks in its turn,
                // where a failure is reported with its row.
                self.gate.check(ticket, &q.call.op_id)?;
                state.lookahead.disable(&q.call.op_id);
            }
        }
        state.lookahead.tokens += self.exec.fresh_tokens() - fresh;
        let (device_after, host_after) = trie_bytes(state);
        let moved = restored * per_token;
        Ok((
            (moved + device_after).saturating_sub(device_before),
            (moved + host_before).saturating_sub(host_after),
        ))
    }

    fn ask_ahead_one(
        &self,
        ticket: Ticket,
        state: &mut QueryState<E::Kv>,
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
            self.question_nodes(ticket, state, &call.op_id, one, &suffix, !pieces.pair)?[doc];
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
            self.ask_pairs(ticket, &state.cache, call, &nodes, &requests, &partners)?
        } else {
            self.ask_one(ticket, &state.cache, call, &nodes, &requests)?
        };
        state.lookahead.store(call, &requests, answers);
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

/// Device and host bytes a document holds alone: its question trie, and its
/// own KV unless a kept document or another key shares that node; on the
/// device, also the start of its KV that only it uses ([`doc_path`]).
fn doc_bytes<K: KvOps>(
    cache: &Cache<K>,
    k: &DocKey,
    keep_nodes: &HashSet<NodeId>,
    users: &HashMap<NodeId, usize>,
) -> (usize, usize) {
    let (mut device, mut host) = cache
        .suffixes
        .get(k)
        .map_or((0, 0), |t| (t.bytes(), t.host_bytes()));
    device += doc_path(cache, k, keep_nodes, users)
        .into_iter()
        .filter_map(|n| cache.docs.kv(n))
        .map(KvOps::bytes)
        .sum::<usize>();
    if let Some(kv) = sole_node(cache, k, keep_nodes, users).and_then(|n| cache.docs.kv(n)) {
        host += kv.host_bytes();
    }
    (device, host)
}

/// Document `k`'s trie node when the document holds it alone: no kept
/// document and no other key shares it.
fn sole_node<K: KvOps>(
    cache: &Cache<K>,
    k: &DocKey,
    keep_nodes: &HashSet<NodeId>,
    users: &HashMap<NodeId, usize>,
) -> Option<NodeId> {
    let &node = cache.doc_nodes.get(k)?;
    (!keep_nodes.contains(&node) && users.get(&node).copied().unwrap_or(0) <= 1).then_some(node)
}

/// The document-trie nodes whose KV leaves the device with document `k`
/// ([`PrefixTrie::device_path`]): its node and the ancestors on the device no
/// other document there needs. None while a kept document or another key
/// shares its node.
fn doc_path<K: KvOps>(
    cache: &Cache<K>,
    k: &DocKey,
    keep_nodes: &HashSet<NodeId>,
    users: &HashMap<NodeId, usize>,
) -> Vec<NodeId> {
    let Some(node) = sole_node(cache, k, keep_nodes, users) else {
        return Vec::new();
    };
    cache
        .docs
        .device_path(node, &|n| n != node && is_owned(n, keep_nodes, users))
}

/// Whether a document-trie node is some document's own: a kept one's, or any key's.
fn is_owned(n: NodeId, keep_nodes: &HashSet<NodeId>, users: &HashMap<NodeId, usize>) -> bool {
    keep_nodes.contains(&n) || users.get(&n).is_some_and(|&u| u > 0)
}

/// How many document keys use each node (documents with one text share one),
/// counted once rather than searched for per document.
fn node_users<K: KvOps>(cache: &Cache<K>) -> HashMap<NodeId, usize> {
    let mut users: HashMap<NodeId, usize> = HashMap::new();
    for &n in cache.doc_nodes.values() {
        *users.entry(n).or_default() += 1;
    }
    users
}

/// Drops a document's KV from both tiers but its first `keep_depth` positions,
/// which documents not seen yet may share ([`Cache::stub_depth`]); returns the
/// (device, host) bytes freed.
fn drop_doc<K: KvOps>(
    cache: &mut Cache<K>,
    k: &DocKey,
    keep_nodes: &HashSet<NodeId>,
    users: &mut HashMap<NodeId, usize>,
    keep_depth: usize,
) -> Result<(usize, usize)> {
    let (mut device, mut host) = (0, 0);
    cache.last_used.remove(k);
    if let Some(t) = cache.suffixes.remove(k) {
        device += t.bytes();
        host += t.host_bytes();
    }
    if let Some(node) = cache.doc_nodes.remove(k) {
        // Another document with the same text may still use the node.
        let left = users.get_mut(&node).map_or(0, |n| {
            *n -= 1;
            *n
        });
        let shared = keep_nodes.contains(&node) || left > 0;
        if !shared {
            // The start it shared with dropped documents goes too (down to the stub).
            let users = &*users;
            let (d, h) = cache
                .docs
                .truncate_chain(node, keep_depth, &|n| is_owned(n, keep_nodes, users))?;
            device += d;
            host += h;
        }
    }
    Ok((device, host))
}

/// Fills `answers` up to `want` with [`Answer::Unreached`]: the requests a
/// spent budget stopped before.
fn unreached_after(answers: &mut Vec<Answer>, want: usize) {
    if answers.len() < want {
        answers.resize(want, Answer::Unreached);
    }
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

/// Host memory a forward batch may use besides the KV cache (activations,
/// score matrices), left to the model by a query's heap bound.
const FORWARD_WORKING_BYTES: usize = 2 << 30;

impl<E: Executor> InferenceBackend for ScheduledBackend<E> {
    fn name(&self) -> &str {
        self.exec.name()
    }

    fn answer(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Vec<Answer>> {
        self.run(call, requests)
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
        *self.spend.lock().expect("spend lock") = None;
        self.keep_tokens_of(operators);
        let mut state = self.state.lock().expect("scheduler lock");
        state.cache = Cache::new();
        state.ops = operators
            .iter()
            .map(|c| (c.op_id.clone(), c.tables[0].clone()))
            .collect();
        state.fresh_start = self.exec.fresh_tokens();
        state.label_start = self.exec.label_tokens();
        state.decode_start = self.exec.decode_tokens();
        state.decode_seconds_start = self.exec.decode_seconds();
        state.peak_bytes = 0;
        state.evictions = 0;
        state.current_op = None;
        state.host_peak_bytes = 0;
        state.offloads = 0;
        state.restored_tokens = 0;
        state.restored_bytes = 0;
        state.offloaded_bytes = 0;
        state.lookahead = if self.config.lookahead {
            Lookahead::new(operators)
        } else {
            Lookahead::default()
        };
    }

    fn meter_query(&self, spend: Option<Arc<Spend>>) {
        self.charged_fresh
            .store(self.exec.fresh_tokens(), Ordering::Relaxed);
        *self.spend.lock().expect("spend lock") = spend;
    }

    fn partners_collected(&self, call: &AiCall, partners: &[Doc<'_>]) {
        if !self.config.prefix_cache || partners.len() > MAX_PARTNERS_AHEAD {
            return;
        }
        let owned = partners
            .iter()
            .map(|d| (d.id.to_string(), d.text.to_string()))
            .collect();
        let mut state = self.state.lock().expect("scheduler lock");
        state.lookahead.partners_collected(call, owned);
    }

    fn measurements(&self) -> Work {
        let state = self.state.lock().expect("scheduler lock");
        let ahead = &state.lookahead;
        let transfer = self.exec.simulated_link_bytes_per_second().map(|link| {
            let moved = (state.offloaded_bytes + state.restored_bytes) as f64;
            Sum(moved / link)
        });
        Work {
            fresh_tokens: Some(Sum(self.exec.fresh_tokens() - state.fresh_start)),
            label_tokens: Some(Sum(self.exec.label_tokens() - state.label_start)),
            decode_tokens: Some(Sum(self.exec.decode_tokens() - state.decode_start)),
            decode_seconds: Some(Sum(self.exec.decode_seconds() - state.decode_seconds_start)),
            prefix_cache: Some(Config(self.config.prefix_cache)),
            kv_peak_bytes: Some(Max(state.peak_bytes.max(state.cache.bytes()) as u64)),
            kv_evictions: Some(Sum(state.evictions)),
            kv_host_budget_bytes: Some(Config(self.config.host_kv_budget_bytes as u64)),
            kv_host_peak_bytes: Some(Max(
                state.host_peak_bytes.max(state.cache.host_bytes()) as u64
            )),
            kv_offloads: Some(Sum(state.offloads)),
            restored_tokens: Some(Sum(state.restored_tokens)),
            speculative_tokens: Some(Sum(ahead.tokens)),
            speculative_questions: Some(Sum(ahead.questions)),
            speculative_unused: Some(Sum(ahead.unused() as u64)),
            kv_restored_bytes: Some(Sum(state.restored_bytes)),
            kv_offloaded_bytes: Some(Sum(state.offloaded_bytes)),
            kv_transfer_seconds: transfer,
            kv_budget_bytes: Some(Config(self.config.kv_budget_bytes as u64)),
            batch_tokens: Some(Config(self.config.batch_tokens as u64)),
            ..Work::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{AiKind, AiRequest, Doc, test_call};

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

    fn ask(backend: &dyn InferenceBackend, docs: &[(String, String)]) -> (Vec<bool>, usize) {
        let call = test_call(AiKind::Filter, "Is the review {0} positive?", &[]);
        backend.start_query(std::slice::from_ref(&call));
        let requests: Vec<AiRequest<'_>> = docs
            .iter()
            .map(|(id, text)| AiRequest {
                anchor: Doc { id, text },
                partner: None,
            })
            .collect();
        let answers: Vec<bool> = backend
            .answer(&call, &requests)
            .unwrap()
            .iter()
            .map(|a| a.as_bool().unwrap())
            .collect();
        let fresh = backend.measurements().fresh() as usize;
        (answers, fresh)
    }

    #[test]
    fn a_second_dataset_with_the_same_ids_is_answered_from_its_own_texts() {
        let first = dataset("a warm, funny and moving film that I loved", 12);
        let second = dataset("dull plot; wooden acting; I left early", 12);
        let alone = ask(tiny_backend().as_ref(), &second);
        let reused = tiny_backend();
        let before = ask(reused.as_ref(), &first);
        // The test can fail: the two datasets' answers and token counts differ.
        assert_ne!(before, alone);
        assert_eq!(ask(reused.as_ref(), &second), alone);
        // And back: the first dataset's texts are still told apart.
        assert_eq!(ask(reused.as_ref(), &first), before);
    }
}
