//! AI work spread over several workers by document: the [`ShardedBackend`]
//! answers each batch by sending every request to the worker that owns its
//! `{0}` document, and the [`DocumentRouter`] decides, once per document, which
//! worker that is.
//!
//! A document's KV lives on one worker only, so every question, join partner
//! and later operator about it must go there: the owner is chosen the first
//! time a document is seen and kept for the query. Documents of one chain
//! (agent-trace snapshots of one trajectory, each the one before it plus a few
//! turns) go to one worker, whatever order they arrive in and however much
//! longer each is than the last, or their shared prefix would be computed
//! twice: a document that extends one already placed, or that one already
//! placed extends, follows it. The rest go where they finish first: the
//! worker whose work so far plus what this document adds to it (its bytes
//! past the longest opening that worker already holds) is least, counted in
//! prompt bytes (plus every question's own text): balance by tokens' proxy,
//! not by rows.
//!
//! One exception: a join anchor whose pairs in a batch carry far more text
//! than the anchor itself (a few claims that survived a filter, each asked
//! against every evidence passage) has its pairs spread over the workers, each
//! computing the short anchor once; kept whole, four such anchors on three
//! workers leave one worker with half the query.
//!
//! Workers run their share of a batch at the same time, one thread each; in
//! one process they are one model per GPU (`--gpu 0,1,2`), or simulated
//! devices. Their measurements are summed (peaks: the largest), and each
//! worker's own are listed under `workers`. They spend one budget
//! ([`crate::limits::spend`]): each checks and charges the query's meter.

use std::cmp::Reverse;
use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hasher};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::error::{EngineError, Result};
use crate::inference::backend::{
    AiCall, AiRequest, Answer, Answered, Doc, InferenceBackend, QueryBackend, QueryStart,
    check_answers,
};
use crate::inference::memo::DocKey;
use crate::inference::work::{Config, Max, Work, WorkerShare};

/// Prefix hashes are taken every this many bytes of a document.
const PREFIX_BLOCK_BYTES: usize = 512;

/// An anchor's pairs in one batch are spread over the workers when, kept on its
/// worker, they would leave it more than 10 % above the mean, and their prompt
/// bytes exceed this many times the anchor's own (per extra worker): the copies
/// of the anchor's KV then cost at most 1/16 of the work they balance.
const SPLIT_WORK_OVER_DOCUMENT: u64 = 16;
/// ... and when they are at least this many per worker: fewer are balanced by
/// placing whole documents.
const SPLIT_MIN_PAIRS_PER_WORKER: usize = 32;

/// How the documents placed so far go on after one block-aligned prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// All the same way: into the prefix one block longer with this hash.
    One(u64),
    /// In different ways: an opening documents share (a system prompt), not
    /// one chain.
    Several,
}

/// Which worker owns each document.
#[derive(Debug)]
pub struct DocumentRouter {
    owners: HashMap<DocKey, usize>,
    /// Documents whose KV a worker other than the owner computed, for a share
    /// of a join anchor's pairs.
    copies: HashSet<(DocKey, usize)>,
    /// Hash of a block-aligned prefix of a placed document → the workers whose
    /// documents open with it.
    held: HashMap<u64, Vec<usize>>,
    /// Hash of a block-aligned prefix → how placed documents go on after it
    /// (absent: every document through it ends within its next block).
    next: HashMap<u64, Next>,
    /// Prompt bytes charged to each worker.
    load: Vec<u64>,
}

impl DocumentRouter {
    /// A router over `workers` workers (at least one).
    pub fn new(workers: usize) -> Self {
        Self {
            owners: HashMap::new(),
            copies: HashSet::new(),
            held: HashMap::new(),
            next: HashMap::new(),
            load: vec![0; workers.max(1)],
        }
    }

    /// Prompt bytes charged to each worker so far.
    pub fn load(&self) -> &[u64] {
        &self.load
    }

    /// The worker that owns document `key` with text `text`, placing it if new.
    ///
    /// A document extends a chain on a worker when the longest opening it
    /// shares with that worker's documents is where one of them ends, or where
    /// it ends itself: nothing placed goes on differently there. Such a
    /// document follows the worker of its longest chain, whatever the load, so
    /// no trajectory's prefix is computed on two workers; the load is balanced
    /// by where chains start. A mere shared opening (every trace's system
    /// prompt, which documents leave in different ways) binds nothing: it
    /// only lowers what a document would cost on a worker that holds it.
    pub fn owner(&mut self, key: &DocKey, text: &str) -> usize {
        if let Some(&w) = self.owners.get(key) {
            return w;
        }
        let hashes = prefix_hashes(text);
        // Whole blocks of this document's opening each worker already holds
        // (a worker holds every shorter prefix of what it holds).
        let held: Vec<usize> = (0..self.load.len())
            .map(|w| hashes.partition_point(|h| self.held.get(h).is_some_and(|ws| ws.contains(&w))))
            .collect();
        let extends_chain = |w: usize| {
            let n = held[w];
            n > 0
                && (n == hashes.len()
                    || match self.next.get(&hashes[n - 1]) {
                        None => true,
                        Some(Next::One(after)) => hashes[n] == *after,
                        Some(Next::Several) => false,
                    })
        };
        let adds = |w: usize| (text.len() - held[w] * PREFIX_BLOCK_BYTES) as u64;
        let workers = 0..self.load.len();
        let worker = workers
            .clone()
            .filter(|&w| extends_chain(w))
            .min_by_key(|&w| (Reverse(held[w]), self.load[w], w))
            .or_else(|| workers.min_by_key(|&w| (self.load[w] + adds(w), self.load[w], w)))
            .expect("at least one worker");
        for (i, &h) in hashes.iter().enumerate() {
            let holders = self.held.entry(h).or_default();
            if !holders.contains(&worker) {
                holders.push(worker);
            }
            if let Some(&after) = hashes.get(i + 1) {
                self.next
                    .entry(h)
                    .and_modify(|n| {
                        if *n != Next::One(after) {
                            *n = Next::Several;
                        }
                    })
                    .or_insert(Next::One(after));
            }
        }
        self.owners.insert(key.clone(), worker);
        self.load[worker] += adds(worker);
        worker
    }

    /// Charges `bytes` of prompt work to `worker`.
    pub fn charge(&mut self, worker: usize, bytes: u64) {
        self.load[worker] += bytes;
    }

    fn least_loaded(&self) -> usize {
        (0..self.load.len())
            .min_by_key(|&w| (self.load[w], w))
            .expect("at least one worker")
    }
}

/// Hashes of `text`'s prefixes of 1, 2, … whole blocks.
fn prefix_hashes(text: &str) -> Vec<u64> {
    let mut h = DefaultHasher::new();
    text.as_bytes()
        .chunks_exact(PREFIX_BLOCK_BYTES)
        .map(|block| {
            h.write(block);
            h.finish()
        })
        .collect()
}

/// One worker's query and what it did in it.
struct Worker {
    query: std::sync::Arc<dyn QueryBackend>,
    questions: AtomicU64,
    busy_nanos: AtomicU64,
}

/// Several backends answering as one, each document's questions on its owner.
pub struct ShardedBackend {
    backends: Vec<std::sync::Arc<dyn InferenceBackend>>,
}

impl ShardedBackend {
    /// One worker per backend. Fails on none.
    pub fn try_new(backends: Vec<std::sync::Arc<dyn InferenceBackend>>) -> Result<Self> {
        if backends.is_empty() {
            return Err(EngineError::Inference("no workers to shard over".into()));
        }
        Ok(Self { backends })
    }
}

/// One query over the workers: each worker's query, and which worker owns
/// each document in it.
struct ShardedQuery {
    workers: Vec<Worker>,
    router: Mutex<DocumentRouter>,
}

impl ShardedQuery {
    /// Requests' indices per worker, in their order. A run of requests is one
    /// anchor's questions in this batch ([`crate::inference::backend`] keeps them adjacent).
    fn split(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Vec<Vec<usize>> {
        let mut router = self.router.lock().expect("router lock");
        let workers = self.workers.len();
        let mut parts = vec![Vec::new(); workers];
        let table = call.tables.first().map_or("", String::as_str);
        let column = call.columns.first().map_or("", String::as_str);
        let own = (call.pieces.frame.len() + call.pieces.tail.len()) as u64;
        let cost = |r: &AiRequest<'_>| {
            own + r
                .partner
                .map_or(0, |p| (call.pieces.label.len() + p.text.len()) as u64)
        };
        let mut start = 0;
        while start < requests.len() {
            let anchor = requests[start].anchor;
            let end = start
                + requests[start..]
                    .iter()
                    .position(|r| r.anchor.id != anchor.id)
                    .unwrap_or(requests.len() - start);
            let key = DocKey::new(table, column, anchor.id);
            let home = router.owner(&key, anchor.text);
            let run = start..end;
            let work: u64 = requests[run.clone()].iter().map(cost).sum();
            let copy = (call.pieces.preamble.len() + anchor.text.len()) as u64;
            // Spread only work that whole documents cannot balance: kept on
            // its home, the run would leave that worker more than 10 % above
            // the mean.
            let total = router.load.iter().sum::<u64>() + work;
            let unbalancing = 10 * (router.load[home] + work) * workers as u64 > 11 * total;
            if workers > 1
                && unbalancing
                && run.len() >= SPLIT_MIN_PAIRS_PER_WORKER * workers
                && work >= SPLIT_WORK_OVER_DOCUMENT * copy * (workers as u64 - 1)
            {
                // One anchor with far more partner work than its own text (a
                // claim against every passage): its pairs are spread, each
                // other worker computing the anchor's KV once for them.
                for i in run {
                    let w = router.least_loaded();
                    if w != home && router.copies.insert((key.clone(), w)) {
                        router.charge(w, copy);
                    }
                    router.charge(w, cost(&requests[i]));
                    parts[w].push(i);
                }
            } else {
                for i in run {
                    router.charge(home, cost(&requests[i]));
                    parts[home].push(i);
                }
            }
            start = end;
        }
        parts
    }

    /// Asks each worker its part at once and puts the answers back in order.
    fn answer_split(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Answered> {
        let parts = self.split(call, requests);
        let results: Vec<Result<(Answered, u64)>> = std::thread::scope(|scope| {
            let handles: Vec<_> = parts
                .iter()
                .zip(&self.workers)
                .map(|(part, worker)| {
                    std::thread::Builder::new()
                        .name("aisql-shard".into())
                        .spawn_scoped(scope, move || {
                            if part.is_empty() {
                                return Ok((Answered::default(), 0));
                            }
                            let mine: Vec<AiRequest<'_>> =
                                part.iter().map(|&i| requests[i]).collect();
                            let start = Instant::now();
                            let got = worker.query.answer(call, &mine);
                            let busy = start.elapsed().as_nanos() as u64;
                            worker.busy_nanos.fetch_add(busy, Ordering::Relaxed);
                            worker
                                .questions
                                .fetch_add(mine.len() as u64, Ordering::Relaxed);
                            got.map(|got| (got, busy))
                        })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| match h {
                    Ok(h) => h.join().unwrap_or_else(|panic| {
                        Err(EngineError::Inference(format!(
                            "a worker panicked: {}",
                            crate::panic_hook::describe(panic.as_ref())
                        )))
                    }),
                    Err(e) => Err(EngineError::Inference(format!(
                        "could not start a thread for a worker's share of the batch: {e}"
                    ))),
                })
                .collect()
        });
        let mut answers: Vec<Option<Answer>> = vec![None; requests.len()];
        let mut work = Vec::with_capacity(parts.len());
        let mut busy = Vec::with_capacity(parts.len());
        for (w, (part, got)) in parts.iter().zip(results).enumerate() {
            let got = got.map_err(|e| match e {
                // A remote worker names itself by address; add its index.
                EngineError::Worker { worker, message } => EngineError::Worker {
                    worker: format!("{w} ({worker})"),
                    message: format!("{}: {message}", call.op_id),
                },
                e => EngineError::Inference(format!("{}: worker {w}: {e}", call.op_id)),
            })?;
            let (got, nanos) = got;
            check_answers(call, &format!("worker {w}"), &got.answers, part.len())?;
            for (&i, a) in part.iter().zip(got.answers) {
                answers[i] = Some(a);
            }
            // A worker's KV peak is its query's so far, not the batch's.
            let mut share = got.work;
            share.kv_peak_bytes = self.workers[w].query.work().kv_peak_bytes;
            work.push(share);
            busy.push(nanos);
        }
        let questions: Vec<u64> = parts.iter().map(|p| p.len() as u64).collect();
        Ok(Answered {
            answers: answers
                .into_iter()
                .map(|a| a.expect("every part answered"))
                .collect(),
            work: combined(&work, &questions, &busy),
        })
    }
}

impl ShardedBackend {
    /// Begins a query on every worker (see [`InferenceBackend::begin`]).
    fn query(&self, start: QueryStart) -> Result<ShardedQuery> {
        let mut order: Vec<usize> = (0..self.backends.len()).collect();
        order.sort_by_cached_key(|&i| self.backends[i].turn_order());
        let mut queries: Vec<Option<std::sync::Arc<dyn QueryBackend>>> =
            vec![None; self.backends.len()];
        for i in order {
            queries[i] = Some(self.backends[i].clone().begin(start.clone())?);
        }
        Ok(ShardedQuery {
            workers: queries
                .into_iter()
                .map(|q| Worker {
                    query: q.expect("every worker begun"),
                    questions: AtomicU64::new(0),
                    busy_nanos: AtomicU64::new(0),
                })
                .collect(),
            router: Mutex::new(DocumentRouter::new(self.backends.len())),
        })
    }
}

impl InferenceBackend for ShardedBackend {
    fn name(&self) -> &str {
        self.backends[0].name()
    }

    /// Shared workers are taken in one order by every coordinator (see
    /// [`InferenceBackend::turn_order`]), the rest in the given order; every
    /// worker spends the one budget of the query.
    fn begin(
        self: std::sync::Arc<Self>,
        start: QueryStart,
    ) -> Result<std::sync::Arc<dyn QueryBackend>> {
        Ok(std::sync::Arc::new(self.query(start)?))
    }

    fn context_positions(&self) -> Option<usize> {
        self.backends
            .iter()
            .map(|b| b.context_positions())
            .collect::<Option<Vec<_>>>()
            .and_then(|c| c.into_iter().min())
    }

    fn kv_capacity_tokens(&self) -> Option<usize> {
        // A batch is split over the workers; each must hold its part.
        self.backends
            .iter()
            .map(|b| b.kv_capacity_tokens())
            .collect::<Option<Vec<_>>>()
            .and_then(|c| c.into_iter().min())
    }

    fn host_memory_allowance(&self) -> usize {
        self.backends
            .iter()
            .map(|b| b.host_memory_allowance())
            .fold(0, usize::saturating_add)
    }

    fn reuses_work(&self) -> bool {
        self.backends.iter().all(|b| b.reuses_work())
    }
}

/// The workers' figures combined ([`Work::merge`]) with each one's share
/// under `workers`: `work` is each worker's, `questions` and `busy_nanos`
/// its questions and seconds over the same span.
fn combined(work: &[Work], questions: &[u64], busy_nanos: &[u64]) -> Work {
    let mut total = Work::default();
    let mut shares = Vec::new();
    let mut fresh = Vec::new();
    for (i, m) in work.iter().enumerate() {
        total.merge(m);
        let fresh_tokens = m.fresh_tokens.map(|s| s.0);
        fresh.extend(fresh_tokens);
        shares.push(WorkerShare {
            fresh_tokens,
            questions: questions[i],
            busy_s: busy_nanos[i] as f64 / 1e9,
            kv_peak_bytes: m.kv_peak_bytes.map(|p| p.0),
        });
    }
    total.workers = Some(Config(shares));
    let sum: u64 = fresh.iter().sum();
    if fresh.len() == work.len() && sum > 0 {
        let mean = sum as f64 / fresh.len() as f64;
        let max = *fresh.iter().max().expect("workers") as f64;
        total.worker_fresh_max_over_mean = Some(Max(max / mean));
    }
    total
}

impl QueryBackend for ShardedQuery {
    fn answer(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Answered> {
        self.answer_split(call, requests)
    }

    fn work(&self) -> Work {
        let work: Vec<Work> = self.workers.iter().map(|w| w.query.work()).collect();
        let questions: Vec<u64> = self
            .workers
            .iter()
            .map(|w| w.questions.load(Ordering::Relaxed))
            .collect();
        let busy: Vec<u64> = self
            .workers
            .iter()
            .map(|w| w.busy_nanos.load(Ordering::Relaxed))
            .collect();
        combined(&work, &questions, &busy)
    }

    fn cancel(&self) {
        for w in &self.workers {
            w.query.cancel();
        }
    }

    fn wait_stopped(&self) {
        for w in &self.workers {
            w.query.wait_stopped();
        }
    }

    fn partners_collected(&self, call: &AiCall, partners: &[Doc<'_>]) {
        // Any worker may hold an anchor of this join.
        for w in &self.workers {
            w.query.partners_collected(call, partners);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inference::backend::{
        AiKind, Answerer, AskTyped, ContentHashBackend, begun, test_call,
    };
    use crate::inference::work::Sum;
    use std::sync::Arc;

    fn key(id: &str) -> DocKey {
        DocKey::new("t", "text", id)
    }

    #[test]
    fn a_document_keeps_its_worker_and_snapshots_follow_their_trajectory() {
        let mut router = DocumentRouter::new(3);
        let system = "s".repeat(2000);
        let a5 = format!("{system}{}", "a".repeat(1500));
        let a10 = format!("{a5}{}", "A".repeat(1500));
        let b5 = format!("{system}{}", "b".repeat(1500));
        let b10 = format!("{b5}{}", "B".repeat(2500));
        let wa = router.owner(&key("a5"), &a5);
        let wb = router.owner(&key("b5"), &b5);
        // b5 shares only the system prompt (under half of it) with a5: placed
        // by load, on another worker.
        assert_ne!(wa, wb);
        assert_eq!(router.owner(&key("a10"), &a10), wa);
        assert_eq!(router.owner(&key("b10"), &b10), wb);
        // Asked again, whatever the text: the same owner.
        assert_eq!(router.owner(&key("a5"), "other"), wa);
    }

    #[test]
    fn documents_are_balanced_by_bytes_not_by_count() {
        let mut router = DocumentRouter::new(2);
        let long = "x".repeat(10_000);
        let w_long = router.owner(&key("long"), &long);
        // Ten short documents all go to the other worker until it catches up.
        let others: Vec<usize> = (0..10)
            .map(|i| {
                router.owner(
                    &key(&format!("s{i}")),
                    &format!("short {i} {}", "y".repeat(1000)),
                )
            })
            .collect();
        assert!(others.iter().all(|&w| w != w_long), "{others:?}");
        let load = router.load();
        let (max, min) = (load.iter().max().unwrap(), load.iter().min().unwrap());
        assert!((*max as f64) / (*min as f64) < 1.1, "{load:?}");
    }

    /// Snapshots (trajectory, id, text) of twelve trajectories: every one opens
    /// with one system prompt, longer than half of a first snapshot, and each
    /// snapshot is more than twice as long as the one before (a few turns that
    /// read long files). Both once split chains: a first snapshot followed the
    /// worker of the first system prompt, a long one went by load.
    fn trajectories() -> Vec<(usize, String, String)> {
        let system = format!("[SYSTEM] {}", "You are an agent. ".repeat(170));
        let mut out = Vec::new();
        for t in 0..12 {
            let mut text = system.clone();
            for (k, turns) in [900 + 37 * t, 6_000 + 211 * t, 15_000 + 503 * t]
                .into_iter()
                .enumerate()
            {
                text.push_str(&format!("\n[TURN {k} of {t}] "));
                text.push_str(&"abcdefgh"[t % 8..].repeat(turns / (8 - t % 8)));
                out.push((t, format!("at{t:02}-s{k}"), text.clone()));
            }
        }
        out
    }

    #[test]
    fn a_trajectory_stays_on_one_worker_in_any_order_and_trajectories_are_balanced() {
        let snapshots = trajectories();
        let n = snapshots.len();
        let scrambled = |i: usize| (i * 17 + 5) % n;
        let orders: [(&str, Vec<usize>); 4] = [
            ("as stored", (0..n).collect()),
            ("reversed", (0..n).rev().collect()),
            ("longest first", {
                let mut o: Vec<usize> = (0..n).collect();
                o.sort_by_key(|&i| Reverse(snapshots[i].2.len()));
                o
            }),
            ("scrambled", (0..n).map(scrambled).collect()),
        ];
        for (name, order) in orders {
            let mut router = DocumentRouter::new(3);
            let mut home: HashMap<usize, usize> = HashMap::new();
            for i in order {
                let (t, id, text) = &snapshots[i];
                let w = router.owner(&key(id), text);
                assert_eq!(
                    *home.entry(*t).or_insert(w),
                    w,
                    "{name}: {id} left its trajectory"
                );
            }
            let mut per_worker = [0; 3];
            for w in home.values() {
                per_worker[*w] += 1;
            }
            let load = router.load();
            let mean = load.iter().sum::<u64>() as f64 / 3.0;
            let max = *load.iter().max().unwrap() as f64;
            assert!(
                per_worker.iter().all(|&c| c >= 2) && max < 1.5 * mean,
                "{name}: trajectories per worker {per_worker:?}, load {load:?}"
            );
        }
    }

    #[test]
    fn an_opening_documents_leave_in_different_ways_binds_none_of_them() {
        let mut router = DocumentRouter::new(3);
        let opening = "Read the report below and answer. ".repeat(60);
        // The opening alone is a document too; the first that extends it may
        // follow it, the others go where they cost least.
        router.owner(&key("opening"), &opening);
        let owners: Vec<usize> = (0..30)
            .map(|i| {
                let text = format!("{opening}report {i}: {}", "r".repeat(1500 + 10 * i));
                router.owner(&key(&format!("r{i}")), &text)
            })
            .collect();
        let load = router.load();
        let (max, min) = (load.iter().max().unwrap(), load.iter().min().unwrap());
        assert!(
            (0..3).all(|w| owners.contains(&w)) && (*max as f64) < 1.2 * *min as f64,
            "{owners:?} {load:?}"
        );
    }

    /// Records which anchors it was asked about.
    #[derive(Default)]
    struct Recording {
        inner: ContentHashBackend,
        anchors: Mutex<Vec<String>>,
    }

    impl Answerer for Recording {
        fn name(&self) -> &str {
            "recording"
        }
        fn answer(&self, call: &AiCall, requests: &[AiRequest<'_>]) -> Result<Vec<Answer>> {
            if call.kind.is_decision() {
                let mut seen = self.anchors.lock().unwrap();
                seen.extend(requests.iter().map(|r| r.anchor.id.to_string()));
            }
            self.inner.answer(call, requests)
        }
    }

    /// Records when its query started, in a log shared with others.
    struct Turn {
        url: Option<&'static str>,
        log: Arc<Mutex<Vec<&'static str>>>,
    }

    impl InferenceBackend for Turn {
        fn name(&self) -> &str {
            "turn"
        }
        fn begin(self: Arc<Self>, _: QueryStart) -> Result<Arc<dyn QueryBackend>> {
            self.log.lock().unwrap().push(self.url.unwrap_or("local"));
            Ok(begun(ContentHashBackend::default()).query)
        }
        fn turn_order(&self) -> Option<String> {
            self.url.map(String::from)
        }
    }

    #[test]
    fn shared_workers_start_a_query_in_one_order_whatever_the_list() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let turn = |url| {
            Arc::new(Turn {
                url,
                log: log.clone(),
            }) as Arc<dyn InferenceBackend>
        };
        let listed = [
            Some("http://b:1/"),
            None,
            Some("http://a:1/"),
            Some("http://c:1/"),
        ];
        let sharded = ShardedBackend::try_new(listed.iter().map(|&u| turn(u)).collect()).unwrap();
        sharded.query(QueryStart::default()).unwrap();
        assert_eq!(
            *log.lock().unwrap(),
            ["local", "http://a:1/", "http://b:1/", "http://c:1/"]
        );
    }

    /// Three recording workers behind one sharded backend.
    fn recorded() -> (Vec<Arc<Recording>>, ShardedBackend) {
        let workers: Vec<Arc<Recording>> = (0..3).map(|_| Arc::default()).collect();
        let sharded = ShardedBackend::try_new(
            workers
                .iter()
                .map(|w| w.clone() as Arc<dyn InferenceBackend>)
                .collect(),
        )
        .unwrap();
        (workers, sharded)
    }

    #[test]
    fn answers_come_back_in_order_and_each_anchor_stays_on_one_worker() {
        let (workers, sharded) = recorded();
        let texts: Vec<String> = (0..30)
            .map(|i| format!("document {i} {}", "z".repeat(i * 37)))
            .collect();
        let ids: Vec<String> = (0..30).map(|i| format!("d{i}")).collect();
        let doc = |i: usize| Doc {
            id: &ids[i],
            text: &texts[i],
        };
        let filter = test_call(AiKind::Filter, "Is {0} kind?", &[]);
        let join = test_call(AiKind::Join, "Does {0} cite {1}?", &[]);
        let singles: Vec<AiRequest<'_>> = (0..30)
            .map(|i| AiRequest {
                anchor: doc(i),
                partner: None,
            })
            .collect();
        let pairs: Vec<AiRequest<'_>> = (0..30)
            .flat_map(|i| (0..4).map(move |j| (i, j)))
            .map(|(i, j)| AiRequest {
                anchor: doc(i),
                partner: Some(doc(j)),
            })
            .collect();
        let sharded = sharded
            .query(QueryStart {
                calls: vec![filter.clone(), join.clone()],
                spend: None,
                ..QueryStart::default()
            })
            .unwrap();
        let reference = begun(ContentHashBackend::default()).query;
        assert_eq!(
            sharded.decide(&filter, &singles).unwrap(),
            reference.decide(&filter, &singles).unwrap()
        );
        assert_eq!(
            sharded.decide(&join, &pairs).unwrap(),
            reference.decide(&join, &pairs).unwrap()
        );
        // Every anchor was asked on exactly one worker, and all three worked.
        let mut owner: HashMap<String, usize> = HashMap::new();
        for (w, worker) in workers.iter().enumerate() {
            let seen = worker.anchors.lock().unwrap();
            assert!(!seen.is_empty(), "worker {w} got nothing");
            for id in seen.iter() {
                assert_eq!(*owner.entry(id.clone()).or_insert(w), w, "{id}");
            }
        }
        assert_eq!(owner.len(), 30);
        let m = sharded.work();
        let questions: u64 = m.workers.unwrap().0.iter().map(|w| w.questions).sum();
        assert_eq!(questions, 30 + 120);
    }

    #[test]
    fn few_anchors_with_many_partners_have_their_pairs_spread() {
        let (workers, sharded) = recorded();
        let join = test_call(AiKind::Join, "Does {1} support {0}?", &[]);
        let claims: Vec<String> = (0..4).map(|i| format!("claim {i}")).collect();
        let passages: Vec<String> = (0..300)
            .map(|j| format!("passage {j} {}", "p".repeat(500)))
            .collect();
        let ids: Vec<String> = (0..300).map(|j| format!("e{j}")).collect();
        let pairs: Vec<AiRequest<'_>> = (0..4)
            .flat_map(|i| (0..300).map(move |j| (i, j)))
            .map(|(i, j)| AiRequest {
                anchor: Doc {
                    id: &claims[i],
                    text: &claims[i],
                },
                partner: Some(Doc {
                    id: &ids[j],
                    text: &passages[j],
                }),
            })
            .collect();
        let sharded = sharded.query(QueryStart::one(&join)).unwrap();
        assert_eq!(
            sharded.decide(&join, &pairs).unwrap(),
            begun(ContentHashBackend::default())
                .query
                .decide(&join, &pairs)
                .unwrap()
        );
        let load = sharded.router.lock().unwrap().load().to_vec();
        let (max, min) = (*load.iter().max().unwrap(), *load.iter().min().unwrap());
        assert!((max as f64) < 1.02 * min as f64, "{load:?}");
        let asked: Vec<usize> = workers
            .iter()
            .map(|w| w.anchors.lock().unwrap().len())
            .collect();
        assert_eq!(asked.iter().sum::<usize>(), 1200, "{asked:?}");
        // Kept whole, the best split of four anchors over three workers is 2/1/1.
        assert!(asked.iter().all(|&n| n >= 380), "{asked:?}");
    }

    /// Fails every call, like a lost worker.
    struct Lost;

    impl Answerer for Lost {
        fn name(&self) -> &str {
            "lost"
        }
        fn answer(&self, _: &AiCall, _: &[AiRequest<'_>]) -> Result<Vec<Answer>> {
            Err(EngineError::Inference("connection reset".into()))
        }
    }

    #[test]
    fn a_failing_worker_fails_the_batch_naming_it() {
        let sharded = ShardedBackend::try_new(vec![
            Arc::new(ContentHashBackend::default()),
            Arc::new(Lost),
        ])
        .unwrap();
        let filter = test_call(AiKind::Filter, "Is {0} kind?", &[]);
        let texts: Vec<String> = (0..8).map(|i| format!("text {i}")).collect();
        let ids: Vec<String> = (0..8).map(|i| i.to_string()).collect();
        let requests: Vec<AiRequest<'_>> = (0..8)
            .map(|i| AiRequest {
                anchor: Doc {
                    id: &ids[i],
                    text: &texts[i],
                },
                partner: None,
            })
            .collect();
        let sharded = sharded.query(QueryStart::default()).unwrap();
        let e = sharded.decide(&filter, &requests).unwrap_err().to_string();
        assert!(
            e.contains("worker 1") && e.contains("connection reset"),
            "{e}"
        );
        assert!(ShardedBackend::try_new(Vec::new()).is_err());
    }

    /// Reports the same work whatever it is asked.
    struct Measured(Work);

    impl InferenceBackend for Measured {
        fn name(&self) -> &str {
            "measured"
        }
        fn begin(self: Arc<Self>, _: QueryStart) -> Result<Arc<dyn QueryBackend>> {
            Ok(self)
        }
    }

    impl QueryBackend for Measured {
        fn answer(&self, _: &AiCall, _: &[AiRequest<'_>]) -> Result<Answered> {
            Err(EngineError::Inference("not asked".into()))
        }
        fn work(&self) -> Work {
            self.0.clone()
        }
    }

    #[test]
    fn measurements_sum_counts_and_keep_peaks_and_configuration() {
        let worker = |fresh: u64, peak: u64| {
            Arc::new(Measured(Work {
                fresh_tokens: Some(Sum(fresh)),
                kv_peak_bytes: Some(Max(peak)),
                kv_budget_bytes: Some(Config(100)),
                kv_transfer_seconds: Some(Sum(0.5)),
                ..Work::default()
            })) as Arc<dyn InferenceBackend>
        };
        let sharded = ShardedBackend::try_new(vec![worker(10, 5), worker(30, 9)]).unwrap();
        let query = sharded.query(QueryStart::default()).unwrap();
        let total = serde_json::Value::Object(query.work().to_json());
        assert_eq!(total["fresh_tokens"], 40);
        assert_eq!(total["kv_peak_bytes"], 9);
        assert_eq!(total["kv_budget_bytes"], 100);
        assert_eq!(total["kv_transfer_seconds"], 1.0);
        assert_eq!(total["worker_fresh_max_over_mean"], 1.5);
        let shares = total["workers"].as_array().unwrap();
        assert_eq!(shares[1]["fresh_tokens"], 30);
        assert_eq!(shares[1]["kv_peak_bytes"], 9);
        assert_eq!(shares[1]["questions"], 0);
    }
}
