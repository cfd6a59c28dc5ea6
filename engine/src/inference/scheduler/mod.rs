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
//! The cache is shared by the queries running on the backend, and what one
//! query leaves stays for the next; a query uses it only when its
//! [`QueryStart::reuse_earlier_kv`] says so, and otherwise (the benchmark's
//! rule: fresh tokens per query) starts from empty tiers when it runs alone.
//! When it outgrows the KV budget, least recently used documents (with their questions) leave
//! the device (with the start of their KV no document left there needs): to
//! the host tier while it has room (`host_kv_budget_bytes`),
//! whence they come back by copy before their next use (restored tokens, not
//! fresh ones), else evicted — costing recomputation, never a wrong answer. Documents of
//! tables no later operator of a query that owns the tiers reads are dropped
//! as soon as their last operator starts.
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
//! The module's jobs, one file each: the order of work (here: a query's
//! start, a call's path through look-ahead, the context check, spend runs,
//! KV building and asking, then making room), tokenizing ([`tokenize`]),
//! prompt token ids and the context check ([`prompts`]), the KV tiers, which
//! alone touch their tries, and what leaves them ([`tiers`], in the order of
//! a [`policy`]), building a call's KV in them ([`prefill`]), asking the
//! model ([`ask`]), questions asked ahead ([`lookahead`]), the spend
//! budget's gate on every forward batch ([`spend_gate`]), the KV memory
//! budget ([`kv_budget`]), the executors that compute KV ([`executors`]), a
//! query's measurements ([`measure`]) and model loading ([`loading`]).

mod ask;
mod executors;
mod kv_budget;
mod loading;
mod lookahead;
mod measure;
mod policy;
mod prefill;
mod prompts;
mod spend_gate;
mod tiers;
mod tokenize;

pub use executors::{
    Executor, ModelExecutor, QWEN3_4B_KV_BYTES_PER_TOKEN, QWEN3_4B_MAX_POSITIONS,
    SIMULATED_LINK_BYTES_PER_SECOND, SimExecutor, VirtualKv, best_label, label_probabilities,
};
pub use kv_budget::{default_host_kv_budget_bytes, default_kv_budget_bytes, gpu_kv_budget_bytes};
pub use loading::{
    DEFAULT_KV_STORE_BYTES, KvStoreSpec, ModelSpec, answer_identity, describe_model_backend,
    load_model_backend, model_input_paths, model_source, simulation_backend, tiny_model_dir,
    tiny_model_path,
};

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use aisql_models::Tokenizer;

use crate::error::{EngineError, Result};
use crate::inference::backend::{
    AiCall, AiRequest, Answer, Answered, Doc, InferenceBackend, QueryBackend, QueryStart,
};
use crate::inference::kv_store::KvStore;
use crate::inference::memo::DocKey;
use crate::inference::work::Work;
use crate::limits::query_gate::Ticket;
use lookahead::{AheadQuestion, Lookahead, MAX_PARTNERS_AHEAD};
use prompts::PromptTokens;
use spend_gate::SpendGate;
use tiers::{BeforeDrop, KvTiers, TierCounters};
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

/// What one query keeps of its own between its calls.
struct QueryState {
    /// [`QueryStart::reuse_earlier_kv`].
    reuse_earlier_kv: bool,
    /// Per AI operator in post-order: (op id, anchor table).
    ops: Vec<(String, String)>,
    current_op: Option<String>,
    /// Questions of later operators asked ahead.
    lookahead: Lookahead,
}

/// One query's stop signal and spend gate, handed to each of its forward
/// batches.
pub(super) struct QueryTicket {
    stop: Ticket,
    /// Whether a forward batch may run, and what it costs the spend budget.
    spend: SpendGate,
}

/// The model backend: plan-aware scheduling over an [`Executor`].
///
/// Several queries run on it at once: each is a [`ScheduledQuery`] with its
/// own operators, look-ahead, spend gate and stop signal, and they share the
/// executor and the KV tiers. A call holds the tiers (and so the executor)
/// while it runs; calls of different queries take turns. The KV a query
/// leaves stays for the next one, which uses it when its
/// [`QueryStart::reuse_earlier_kv`] says so; otherwise a query that starts
/// while no other runs finds the tiers empty.
pub struct ScheduledBackend<E: Executor> {
    exec: E,
    config: SchedulerConfig,
    /// Shared with another backend over the same tokenizer
    /// ([`Self::sharing_tokens`]), which then tokenizes each document once.
    tokens: TokenCache,
    /// The KV held and what leaves it, for every query.
    kv: Mutex<KvTiers<E::Kv>>,
    /// Queries begun and not yet ended.
    live: AtomicUsize,
    /// The on-disk KV store: documents' KV kept across queries and restarts
    /// ([`Self::with_kv_store`]).
    store: Option<Arc<KvStore>>,
    /// A write to the store failed (said once).
    store_failed: AtomicBool,
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
            kv: Mutex::new(tiers),
            live: AtomicUsize::new(0),
            store: None,
            store_failed: AtomicBool::new(false),
        }
    }

    /// The backend reading documents' KV from `store` when neither tier
    /// holds it, and keeping there what it computes.
    pub fn with_kv_store(mut self, store: Arc<KvStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// The on-disk KV store, when there is one.
    pub fn kv_store(&self) -> Option<&Arc<KvStore>> {
        self.store.as_ref()
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

    /// Runs one forward batch of `op_id`'s work through the spend gate
    /// ([`SpendGate::forward`]).
    fn forward<T>(
        &self,
        ticket: &QueryTicket,
        op_id: &str,
        work: impl FnOnce(&dyn Fn() -> bool) -> Result<T>,
    ) -> Result<T> {
        let fresh_tokens = || self.exec.fresh_tokens();
        ticket
            .spend
            .forward(&ticket.stop, op_id, &fresh_tokens, work)
    }

    /// `Ok` when `e` is work the spent budget stopped, `Err(e)` otherwise
    /// ([`SpendGate::stopped_by_spend`]).
    fn spent_stop(&self, ticket: &QueryTicket, op_id: &str, e: EngineError) -> Result<()> {
        ticket.spend.stopped_by_spend(&ticket.stop, op_id, e)
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
    /// Not by a query that reuses what earlier ones left, nor while another
    /// query runs: their documents are not this query's to drop.
    fn enter_operator(
        &self,
        state: &mut QueryState,
        tiers: &mut KvTiers<E::Kv>,
        op_id: &str,
    ) -> Result<()> {
        if state.current_op.as_deref() == Some(op_id) {
            return Ok(());
        }
        state.current_op = Some(op_id.to_string());
        if !self.query_owns_tiers(state) {
            return Ok(());
        }
        let Some(pos) = state.ops.iter().position(|(id, _)| id == op_id) else {
            return Ok(());
        };
        let needed: HashSet<String> = state.ops[pos..].iter().map(|(_, t)| t.clone()).collect();
        for k in tiers.drop_tables_but(&needed)? {
            state.lookahead.forget(&k);
        }
        Ok(())
    }

    /// Whether a query may treat the tiers as its own: it does not reuse
    /// what earlier queries left (nor, then, leave its own KV for later
    /// ones beyond what the budget holds) and no other query runs.
    fn query_owns_tiers(&self, state: &QueryState) -> bool {
        !state.reuse_earlier_kv && self.live.load(Ordering::SeqCst) <= 1
    }

    /// One call's order of work: questions asked ahead answer what they
    /// can, the model the rest ([`Self::answer`]), then the tiers make room
    /// within the KV budget, asking documents about to leave their later
    /// operators' questions first. The call holds the tiers, and so the
    /// executor, throughout: what the executor computed meanwhile is this
    /// call's work, returned with its answers.
    fn run(
        &self,
        query: &ScheduledQuery<E>,
        call: &AiCall,
        requests: &[AiRequest<'_>],
    ) -> Result<Answered> {
        let ticket = &query.ticket;
        // Held until this call returns: whoever waits for the query to stop
        // waits for it.
        let _in_flight = ticket.stop.enter();
        ticket.stop.check(&call.op_id)?;
        if requests.is_empty() {
            return Ok(Answered::default());
        }
        // Once the spend budget is spent nothing more is asked, nor cached.
        if ticket.spend.spent() {
            return Ok(Answered {
                answers: vec![Answer::Unreached; requests.len()],
                work: Work::default(),
            });
        }
        let mut state = query.state.lock().expect("query state lock");
        let state = &mut *state;
        let mut tiers = self.kv.lock().expect("scheduler KV lock");
        let before = self.computed();
        let answers = if self.config.prefix_cache {
            self.run_cached(ticket, state, &mut tiers, call, requests)?
        } else {
            self.run_uncached(ticket, call, requests)?
        };
        Ok(Answered {
            answers,
            work: self.computed().since(&before),
        })
    }

    /// [`Self::run`] with the prefix cache.
    fn run_cached(
        &self,
        ticket: &QueryTicket,
        state: &mut QueryState,
        tiers: &mut KvTiers<E::Kv>,
        call: &AiCall,
        requests: &[AiRequest<'_>],
    ) -> Result<Vec<Answer>> {
        self.enter_operator(state, tiers, &call.op_id)?;
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
            let got = self.answer(ticket, tiers, call, &asked)?;
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
        tiers.make_room(&keep, &mut ahead)?;
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
        ticket: &QueryTicket,
        tiers: &mut KvTiers<E::Kv>,
        call: &AiCall,
        requests: &[AiRequest<'_>],
    ) -> Result<Vec<Answer>> {
        let tokens = self.prompt_tokens(call)?;
        let (anchors, partners) = self.request_docs(call, requests)?;
        let mut answers = self.overflowing(call, &tokens, requests, &anchors, &partners);
        let fitting: Vec<usize> = (0..requests.len())
            .filter(|&i| answers[i].is_none())
            .collect();
        let mut spent = false;
        for run in ticket.spend.runs(
            requests,
            &fitting,
            &anchors,
            &partners,
            self.config.batch_tokens,
        ) {
            spent = spent || ticket.spend.spent();
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
                    &tokens,
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
    /// documents' token ids: one-document questions are asked on the KV of
    /// `preamble + document + tail`; a pair's anchor has
    /// `preamble + anchor + frame` cached and its partners packed after it.
    /// Each pair is asked once per query: the operators' memo
    /// ([`crate::inference::memo`]) answers repeats before they get here.
    #[allow(clippy::too_many_arguments)]
    fn answer_fitting(
        &self,
        ticket: &QueryTicket,
        tiers: &mut KvTiers<E::Kv>,
        call: &AiCall,
        tokens: &PromptTokens,
        requests: &[AiRequest<'_>],
        anchors: &[Arc<Vec<u32>>],
        partners: &[Arc<Vec<u32>>],
    ) -> Result<Vec<Answer>> {
        let nodes = self.anchor_prompts(ticket, tiers, call, tokens, requests, anchors)?;
        if call.pieces.pair {
            self.ask_pairs(ticket, tiers, call, tokens, &nodes, requests, partners)
        } else {
            self.ask_one(ticket, tiers, call, tokens, &nodes, requests)
        }
    }
}

/// What the scheduler does with a document the tiers are about to drop: asks
/// it the questions later operators will ask ([`Lookahead`]) and keeps the
/// answers for them.
struct AskAhead<'a, E: Executor> {
    backend: &'a ScheduledBackend<E>,
    ticket: &'a QueryTicket,
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
                self.ticket.stop.check(&q.call.op_id)?;
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

/// Host memory a backend scheduled by `config` may add while a query runs
/// ([`InferenceBackend::host_memory_allowance`]): where the KV lives (host
/// or device) is the executor's; both budgets are counted, so a CPU model
/// never trips the bound with its cache.
fn host_memory_allowance(config: &SchedulerConfig) -> usize {
    config
        .kv_budget_bytes
        .saturating_add(config.host_kv_budget_bytes)
        .saturating_add(FORWARD_WORKING_BYTES)
}

/// Positions of KV a backend scheduled by `config` holds at
/// `kv_bytes_per_token` ([`InferenceBackend::kv_capacity_tokens`]).
fn kv_capacity_tokens(config: &SchedulerConfig, kv_bytes_per_token: usize) -> Option<usize> {
    config
        .prefix_cache
        .then(|| config.kv_budget_bytes / kv_bytes_per_token.max(1))
}

impl<E: Executor> InferenceBackend for ScheduledBackend<E> {
    fn name(&self) -> &str {
        self.exec.name()
    }

    /// Stops the previous query's work and waits for it to leave (at most one
    /// forward batch), so it cannot touch this query's state or counters; then
    /// new KV tiers for this one.
    fn begin(self: Arc<Self>, start: QueryStart) -> Result<Arc<dyn QueryBackend>> {
        let alone = self.live.fetch_add(1, Ordering::SeqCst) == 0;
        // Counts the query as live from here: ending it (dropping the
        // object) counts it out, whatever happens below.
        let live = LiveQuery(self.clone());
        let (tiers_start, held_at_start_tokens) = {
            let mut tiers = self.kv.lock().expect("scheduler KV lock");
            if alone && !start.reuse_earlier_kv {
                // A query that has the backend to itself starts from nothing.
                self.keep_tokens_of(&start.calls);
                *tiers = Self::empty_tiers(&self.exec, &self.config);
            }
            if alone {
                tiers.restart_peaks();
            }
            let held = (tiers.bytes() + tiers.host_bytes()) / self.exec.kv_bytes_per_token().max(1);
            (tiers.counters(), held as u64)
        };
        let state = QueryState {
            reuse_earlier_kv: start.reuse_earlier_kv,
            ops: start
                .calls
                .iter()
                .map(|c| (c.op_id.clone(), c.tables[0].clone()))
                .collect(),
            current_op: None,
            lookahead: if self.config.lookahead {
                Lookahead::new(&start.calls)
            } else {
                Lookahead::default()
            },
        };
        Ok(Arc::new(ScheduledQuery {
            ticket: QueryTicket {
                stop: Ticket::default(),
                spend: SpendGate::new(start.spend),
            },
            state: Mutex::new(state),
            tiers_start,
            held_at_start_tokens,
            // Nothing computed yet: zeros, not unknowns.
            work: Mutex::new({
                let now = self.computed();
                now.since(&now)
            }),
            live,
        }))
    }

    fn reuses_work(&self) -> bool {
        self.config.prefix_cache
    }

    fn context_positions(&self) -> Option<usize> {
        Some(self.exec.max_positions())
    }

    fn kv_store(&self) -> Option<Arc<KvStore>> {
        self.store.clone()
    }

    fn embedding_dims(&self) -> Option<u32> {
        self.exec.embedding_dims()
    }

    fn kv_capacity_tokens(&self) -> Option<usize> {
        kv_capacity_tokens(&self.config, self.exec.kv_bytes_per_token())
    }

    fn host_memory_allowance(&self) -> usize {
        host_memory_allowance(&self.config)
    }
}

/// One query on a [`ScheduledBackend`]: its ticket at the backend's gate and
/// the executor's counts when it began.
/// Counts a query among the backend's live ones until dropped.
struct LiveQuery<E: Executor>(Arc<ScheduledBackend<E>>);

impl<E: Executor> Drop for LiveQuery<E> {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One query on a [`ScheduledBackend`].
struct ScheduledQuery<E: Executor> {
    ticket: QueryTicket,
    state: Mutex<QueryState>,
    /// The tiers' counters when the query began.
    tiers_start: TierCounters,
    /// KV positions the tiers held when it began.
    held_at_start_tokens: u64,
    /// What the executor computed for the query's calls so far.
    work: Mutex<Work>,
    live: LiveQuery<E>,
}

impl<E: Executor> ScheduledQuery<E> {
    fn backend(&self) -> &ScheduledBackend<E> {
        &self.live.0
    }
}

impl<E: Executor> QueryBackend for ScheduledQuery<E> {
    fn answer(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Answered> {
        let answered = self.backend().run(self, call, requests)?;
        self.work
            .lock()
            .expect("query work lock")
            .merge(&answered.work);
        Ok(answered)
    }

    fn work(&self) -> Work {
        self.backend().query_work(self)
    }

    fn cancel(&self) {
        self.ticket.stop.cancel();
    }

    fn wait_stopped(&self) {
        self.ticket.stop.wait_idle();
    }

    fn partners_collected(&self, call: &AiCall, partners: &[Doc<'_>]) {
        let backend = self.backend();
        if !backend.config.prefix_cache || partners.len() > MAX_PARTNERS_AHEAD {
            return;
        }
        let owned = partners
            .iter()
            .map(|d| (d.id.to_string(), d.text.to_string()))
            .collect();
        let mut state = self.state.lock().expect("query state lock");
        state.lookahead.partners_collected(call, owned);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inference::backend::{AiKind, Answerer, test_call, test_requests};
    use spend_gate::unreached_after;

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
            kv_store: None,
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

    /// A query of `calls` on `backend`, from nothing when it runs alone.
    fn start<E: Executor>(
        backend: &Arc<ScheduledBackend<E>>,
        calls: &[AiCall],
    ) -> Arc<dyn QueryBackend> {
        start_reusing(backend, calls, false)
    }

    /// A query of `calls` on `backend` that uses the KV earlier queries
    /// left when `reuse`.
    fn start_reusing<E: Executor>(
        backend: &Arc<ScheduledBackend<E>>,
        calls: &[AiCall],
        reuse: bool,
    ) -> Arc<dyn QueryBackend> {
        backend
            .clone()
            .begin(QueryStart {
                calls: calls.to_vec(),
                spend: None,
                reuse_earlier_kv: reuse,
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
        // A new query that runs alone starts from nothing, counters included.
        let (backend, ended) = backend;
        drop(ended);
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
        let tiers = backend.kv.lock().unwrap();
        let tables: HashSet<&str> = tiers.doc_keys().map(|k| k.table.as_str()).collect();
        assert_eq!(tables, HashSet::from(["u"]));
    }

    /// Scores (P(TRUE), which any KV change moves) of `docs` and the fresh
    /// tokens of a query of its own, which uses the KV earlier queries left
    /// when `reuse`.
    fn scores<E: Executor>(
        backend: &Arc<ScheduledBackend<E>>,
        docs: &[(String, String)],
        reuse: bool,
    ) -> (Vec<Answer>, u64) {
        let call = test_call(AiKind::Score, "Is the review {0} positive?", &[]);
        let query = start_reusing(backend, std::slice::from_ref(&call), reuse);
        let answers = query.answer(&call, &test_requests(docs)).unwrap().answers;
        (answers, query.work().fresh())
    }

    #[test]
    fn kept_kv_of_a_text_that_changed_under_its_id_is_not_used() {
        let first = dataset("a warm, funny and moving film that I loved", 12);
        let second = dataset("dull plot; wooden acting; I left early", 12);
        let (alone, _) = scores(&tiny_backend(), &second, false);
        let kept = tiny_backend();
        let (before, first_fresh) = scores(&kept, &first, true);
        assert_ne!(before, alone);
        // The same ids, other texts: scored on their own KV, not the kept one.
        assert_eq!(scores(&kept, &second, true).0, alone);
        // The first texts again: the same scores, their documents' KV kept.
        let (again, again_fresh) = scores(&kept, &first, true);
        assert_eq!(again, before);
        assert!(
            again_fresh < first_fresh,
            "{again_fresh} fresh, first {first_fresh}"
        );
    }

    #[test]
    fn a_later_query_reuses_the_kept_kv_of_its_documents_when_told() {
        let docs = long_docs(20);
        let asked = test_requests(&docs);
        let positive = test_call(AiKind::Filter, "Is the review {0} positive?", &[]);
        let funny = test_call(AiKind::Filter, "Is the film in {0} funny?", &[]);
        let second_fresh = |reuse: bool| {
            let backend = simulation(1 << 30, 0);
            let first = start_reusing(&backend, std::slice::from_ref(&positive), reuse);
            first.answer(&positive, &asked).unwrap();
            let first_fresh = measured(&first, "fresh_tokens");
            drop(first);
            let second = start_reusing(&backend, std::slice::from_ref(&funny), reuse);
            let answers = second.answer(&funny, &asked).unwrap().answers;
            let direct = crate::inference::backend::ContentHashBackend::default();
            assert_eq!(answers, direct.answer(&funny, &asked).unwrap());
            (measured(&second, "fresh_tokens"), first_fresh)
        };
        // Only the question after each document is computed.
        let (reused, first) = second_fresh(true);
        assert!(reused * 100 <= first * 15, "second {reused}, first {first}");
        // A query told to start from nothing computes its documents again.
        let (again, first) = second_fresh(false);
        assert!(again > first * 9 / 10, "second {again}, first {first}");
    }

    #[test]
    fn queries_at_once_get_their_own_answers_and_stop_alone() {
        let docs = long_docs(12);
        let positive = test_call(AiKind::Filter, "Is the review {0} positive?", &[]);
        let mut funny = test_call(AiKind::Filter, "Is the film in {0} funny?", &[]);
        funny.op_id = "filter-2".into();
        let backend = simulation(1 << 30, 0);
        let one = start(&backend, std::slice::from_ref(&positive));
        let other = start(&backend, std::slice::from_ref(&funny));
        // Their calls interleave, from two threads.
        let asks = |query: Arc<dyn QueryBackend>, call: AiCall| {
            let docs = docs.clone();
            std::thread::spawn(move || {
                let mut answers = Vec::new();
                for r in test_requests(&docs) {
                    answers.extend(query.answer(&call, &[r]).unwrap().answers);
                }
                (answers, query.work().fresh())
            })
        };
        let (a, b) = (
            asks(one.clone(), positive.clone()),
            asks(other.clone(), funny.clone()),
        );
        let ((one_answers, one_fresh), (other_answers, other_fresh)) =
            (a.join().unwrap(), b.join().unwrap());
        let direct = crate::inference::backend::ContentHashBackend::default();
        let asked = test_requests(&docs);
        assert_eq!(one_answers, direct.answer(&positive, &asked).unwrap());
        assert_eq!(other_answers, direct.answer(&funny, &asked).unwrap());
        // A document's KV is computed once, by whichever query asked first;
        // each query counts what was computed for its own calls.
        let alone = {
            let backend = simulation(1 << 30, 0);
            let q = start(&backend, std::slice::from_ref(&positive));
            q.answer(&positive, &asked).unwrap();
            q.work().fresh()
        };
        assert!(one_fresh + other_fresh < alone * 13 / 10);
        assert!(one_fresh > 0 && other_fresh > 0);
        // Cancelling one query stops its work only.
        one.cancel();
        one.wait_stopped();
        let e = one.answer(&positive, &asked[..1]).unwrap_err().to_string();
        assert!(e.contains("cancelled"), "{e}");
        assert_eq!(
            other.answer(&funny, &asked[..1]).unwrap().answers,
            direct.answer(&funny, &asked[..1]).unwrap()
        );
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
