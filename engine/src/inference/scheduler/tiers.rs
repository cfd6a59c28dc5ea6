//! The KV a query holds, in two tiers, and the one place that decides what
//! leaves them: [`KvTiers`].
//!
//! The device tier holds two levels of prefix cache (radix tries of KV
//! handles, [`crate::inference::kv_cache`]): a document trie over `preamble + document`
//! and, per document, a question trie rooted at the document's KV. The host
//! tier holds KV moved off the device (`host_kv_budget_bytes`), whence it comes
//! back by copy before its next use (restored positions, not fresh ones).
//!
//! The tries are the tiers' alone: as TGI's queue calls a block allocator
//! that alone touches its radix tree, the scheduler inserts a call's prompts,
//! asks which nodes still need KV ([`KvTiers::doc_waves`],
//! [`KvTiers::question_waves`]), hands back what the model computed for them
//! ([`KvTiers::set_kv`]), reads the KV of the prompts it asks about
//! ([`KvTiers::question_kv`]), tells the tiers what a call used and then
//! asks [`KvTiers::make_room`] to come back within the KV budget; the order in
//! which documents leave comes from an [`EvictionPolicy`] ([`Lru`] unless
//! told otherwise). A document that must leave for good is first handed to the
//! scheduler's [`BeforeDrop`], which may ask it the questions of later
//! operators while its KV is still held.
//!
//! The tiers also count what they did (peak bytes, documents evicted and
//! offloaded, positions restored): [`KvTiers::counters`].

use std::collections::{HashMap, HashSet, VecDeque};

use super::policy::{EvictionPolicy, Lru};
use crate::error::Result;
use crate::inference::kv_cache::{KvOps, NodeId, PrefixTrie};
use crate::inference::memo::DocKey;

/// What the tiers did in one query.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierCounters {
    /// Most device bytes held.
    pub peak_bytes: usize,
    /// Documents (and shared starts) dropped from both tiers.
    pub evictions: u64,
    /// Most host bytes held.
    pub host_peak_bytes: usize,
    /// Documents moved to the host tier.
    pub offloads: u64,
    /// Positions brought back from the host.
    pub restored_tokens: u64,
    /// Bytes brought back from the host.
    pub restored_bytes: u64,
    /// Bytes moved to the host.
    pub offloaded_bytes: u64,
    /// Positions read from the on-disk KV store instead of computed.
    pub stored_read_tokens: u64,
    /// Bytes read from it.
    pub stored_read_bytes: u64,
    /// Bytes written to it.
    pub stored_written_bytes: u64,
    /// Blocks found there that failed their checks: computed instead.
    pub stored_rejected: u64,
}

impl TierCounters {
    /// What was done since `start`, an earlier reading of the same tiers:
    /// counts as differences, peaks as they are now.
    pub fn since(&self, start: &TierCounters) -> TierCounters {
        TierCounters {
            peak_bytes: self.peak_bytes,
            host_peak_bytes: self.host_peak_bytes,
            evictions: self.evictions - start.evictions,
            offloads: self.offloads - start.offloads,
            restored_tokens: self.restored_tokens - start.restored_tokens,
            restored_bytes: self.restored_bytes - start.restored_bytes,
            offloaded_bytes: self.offloaded_bytes - start.offloaded_bytes,
            stored_read_tokens: self.stored_read_tokens - start.stored_read_tokens,
            stored_read_bytes: self.stored_read_bytes - start.stored_read_bytes,
            stored_written_bytes: self.stored_written_bytes - start.stored_written_bytes,
            stored_rejected: self.stored_rejected - start.stored_rejected,
        }
    }
}

/// Told by [`KvTiers::make_room`] about a document about to leave both tiers.
pub trait BeforeDrop<K, P = Lru> {
    /// Whether something must be done with `doc`'s KV before it goes; when so,
    /// the tiers bring that KV back to the device and call [`Self::ask`].
    fn wants(&mut self, doc: &DocKey) -> bool;
    /// Works on `doc` while its KV is held (it may grow its question trie).
    fn ask(&mut self, tiers: &mut KvTiers<K, P>, doc: &DocKey) -> Result<()>;
    /// `doc` has left both tiers.
    fn dropped(&mut self, doc: &DocKey);
}

/// A node of the tiers' tries whose KV the model computes: a document's
/// `preamble + document`, or a question asked of a document.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KvNode {
    /// A node of the document trie.
    Doc(NodeId),
    /// A node of a document's question trie.
    Question(DocKey, NodeId),
}

/// Device and host KV of one query, within budgets, in a policy's order.
pub struct KvTiers<K, P = Lru> {
    /// `preamble + document` for every document asked about.
    docs: PrefixTrie<K>,
    /// Each document's node in [`Self::docs`].
    doc_nodes: HashMap<DocKey, NodeId>,
    /// Per document, the questions asked of it, rooted at its KV.
    suffixes: HashMap<DocKey, PrefixTrie<K>>,
    /// A dropped document keeps its KV up to this depth (preamble and first
    /// tokens): documents to come that start the same way reuse it.
    stub_depth: usize,
    policy: P,
    device_budget: usize,
    host_budget: usize,
    bytes_per_token: usize,
    counters: TierCounters,
}

impl<K: KvOps> KvTiers<K> {
    /// Empty tiers of `device_budget` and `host_budget` bytes (0: no host
    /// tier) under [`Lru`], for KV of `bytes_per_token` per position.
    pub fn new(device_budget: usize, host_budget: usize, bytes_per_token: usize) -> Self {
        Self::with_policy(Lru::default(), device_budget, host_budget, bytes_per_token)
    }
}

impl<K: KvOps, P: EvictionPolicy> KvTiers<K, P> {
    /// Empty tiers under `policy`.
    pub fn with_policy(
        policy: P,
        device_budget: usize,
        host_budget: usize,
        bytes_per_token: usize,
    ) -> Self {
        Self {
            docs: PrefixTrie::new(None),
            doc_nodes: HashMap::new(),
            suffixes: HashMap::new(),
            stub_depth: 0,
            policy,
            device_budget,
            host_budget,
            bytes_per_token,
            counters: TierCounters::default(),
        }
    }

    /// Device bytes of KV held.
    pub fn bytes(&self) -> usize {
        self.docs.bytes() + self.suffixes.values().map(PrefixTrie::bytes).sum::<usize>()
    }

    /// Host bytes of KV held (offloaded).
    pub fn host_bytes(&self) -> usize {
        self.docs.host_bytes()
            + self
                .suffixes
                .values()
                .map(PrefixTrie::host_bytes)
                .sum::<usize>()
    }

    /// Peaks start again from what is held now: a query that finds the
    /// tiers of queries before it reports its own peaks.
    pub fn restart_peaks(&mut self) {
        self.counters.peak_bytes = self.bytes();
        self.counters.host_peak_bytes = self.host_bytes();
    }

    /// What the tiers did so far, peaks including what is held now.
    pub fn counters(&self) -> TierCounters {
        TierCounters {
            peak_bytes: self.counters.peak_bytes.max(self.bytes()),
            host_peak_bytes: self.counters.host_peak_bytes.max(self.host_bytes()),
            ..self.counters
        }
    }

    /// Dropped documents keep at least their first `depth` positions.
    pub fn keep_stubs_of(&mut self, depth: usize) {
        self.stub_depth = self.stub_depth.max(depth);
    }

    /// Adds document `key`'s `preamble + document` sequence (structure only,
    /// [`PrefixTrie::insert`]) and returns its node; the policy sees the path used.
    ///
    /// A key whose text is not the one its KV was computed for (a table
    /// registered again under its name, between two queries that share the
    /// tiers) loses the questions asked of the old text: they are rooted at
    /// the old text's KV.
    pub fn insert_doc(&mut self, key: DocKey, seq: &[u32]) -> Result<NodeId> {
        let leaf = self.docs.insert(seq)?;
        self.policy.nodes_used(&self.docs.path(leaf));
        if let Some(old) = self.doc_nodes.insert(key.clone(), leaf)
            && old != leaf
        {
            self.suffixes.remove(&key);
        }
        Ok(leaf)
    }

    /// Brings the KV of documents `leaves` back from the host (by copy,
    /// never recomputed); returns the positions restored, for
    /// [`Self::count_restored`].
    pub fn restore_docs(&mut self, leaves: &[NodeId]) -> Result<usize> {
        let mut restored = 0;
        for &leaf in leaves {
            restored += self.docs.restore_path(leaf)?;
        }
        Ok(restored)
    }

    /// The document-trie nodes `leaves` still need, in waves: a wave's
    /// parents are all computed by the waves before.
    pub fn doc_waves(&self, leaves: &[NodeId]) -> Vec<Vec<KvNode>> {
        self.docs
            .pending(leaves)
            .into_iter()
            .map(|wave| wave.into_iter().map(KvNode::Doc).collect())
            .collect()
    }

    /// The document-trie nodes on the way to `leaf` that have no KV,
    /// topmost first, each with its depth, and the KV they continue (none
    /// at the root): what a stored block of `leaf`'s whole sequence can fill
    /// ([`Self::set_stored`]). Empty when `leaf` has its KV.
    pub fn missing_doc_path(&self, leaf: NodeId) -> (Option<&K>, Vec<(NodeId, usize)>) {
        let path = self.docs.missing_path(leaf);
        let Some(&top) = path.first() else {
            return (None, Vec::new());
        };
        let depths = path.iter().map(|&n| (n, self.docs.depth(n))).collect();
        (self.docs.parent_kv(top), depths)
    }

    /// Takes KV read from the store for `nodes` (of [`Self::missing_doc_path`]),
    /// one handle each; all but the last have no output at their last
    /// position (views), and count `positions` and `bytes` read.
    pub fn set_stored(&mut self, nodes: &[NodeId], kv: Vec<K>, positions: usize, bytes: usize) {
        let last = nodes.len().saturating_sub(1);
        for (i, (&n, h)) in nodes.iter().zip(kv).enumerate() {
            if i == last {
                self.docs.set_kv(n, h);
            } else {
                self.docs.set_view_kv(n, h);
            }
        }
        self.counters.stored_read_tokens += positions as u64;
        self.counters.stored_read_bytes += bytes as u64;
    }

    /// Whether document node `leaf` has its KV.
    pub fn has_doc_kv(&self, leaf: NodeId) -> bool {
        self.docs.kv(leaf).is_some()
    }

    /// The KV of document node `leaf` to keep in the store: computed, and
    /// with an output at its last position (not a view of a longer
    /// document's, which a read could not score).
    pub fn doc_kv_to_store(&self, leaf: NodeId) -> Option<&K> {
        self.docs.kv(leaf).filter(|_| !self.docs.is_view(leaf))
    }

    /// Counts a block written to the store.
    pub fn count_stored_written(&mut self, bytes: u64) {
        self.counters.stored_written_bytes += bytes;
    }

    /// Counts a stored block that failed its checks.
    pub fn count_stored_rejected(&mut self) {
        self.counters.stored_rejected += 1;
    }

    /// Adds question `suffix` to document `key`'s question trie (made on
    /// first use, rooted at the document's KV) and returns its node.
    pub fn insert_question(&mut self, key: &DocKey, suffix: &[u32]) -> Result<NodeId> {
        let doc_kv = self
            .doc_nodes
            .get(key)
            .and_then(|&n| self.docs.kv(n).cloned());
        let trie = self
            .suffixes
            .entry(key.clone())
            .or_insert_with(|| PrefixTrie::new(doc_kv));
        trie.insert(suffix)
    }

    /// Brings the KV of the questions `targets` back from the host; returns
    /// the positions restored, for [`Self::count_restored`].
    pub fn restore_questions(&mut self, targets: &HashMap<DocKey, NodeId>) -> Result<usize> {
        let mut restored = 0;
        for (key, &node) in targets {
            restored += self.suffixes[key].restore_path(node)?;
        }
        Ok(restored)
    }

    /// The question-trie nodes `targets` still need, in waves across
    /// documents, so the questions of many documents share forward passes.
    pub fn question_waves(&self, targets: &HashMap<DocKey, NodeId>) -> Vec<Vec<KvNode>> {
        let mut waves: Vec<Vec<KvNode>> = Vec::new();
        for (key, &node) in targets {
            let trie = &self.suffixes[key];
            for (level, wave) in trie.pending(&[node]).into_iter().enumerate() {
                if waves.len() <= level {
                    waves.resize(level + 1, Vec::new());
                }
                waves[level].extend(wave.into_iter().map(|n| KvNode::Question(key.clone(), n)));
            }
        }
        waves
    }

    /// What the model computes for `node`: its parent's KV (none at a
    /// root without one) and the tokens of its edge.
    pub fn pending_item(&self, node: &KvNode) -> (Option<&K>, &[u32]) {
        match node {
            KvNode::Doc(n) => (self.docs.parent_kv(*n), self.docs.edge(*n)),
            KvNode::Question(key, n) => {
                let trie = &self.suffixes[key];
                (trie.parent_kv(*n), trie.edge(*n))
            }
        }
    }

    /// Takes back the KV the model computed for `node`.
    pub fn set_kv(&mut self, node: &KvNode, kv: K) {
        match node {
            KvNode::Doc(n) => self.docs.set_kv(*n, kv),
            KvNode::Question(key, n) => self.suffixes.get_mut(key).expect("trie").set_kv(*n, kv),
        }
    }

    /// The KV of question `node` asked of document `key`: the whole prompt
    /// up to the answer.
    pub fn question_kv(&self, key: &DocKey, node: NodeId) -> Option<&K> {
        self.suffixes[key].kv(node)
    }

    /// The KV of question `node` of `key` when it ends on a view (its text
    /// is a prefix of another question's): its last position's hidden state
    /// is not kept, so a scored question computes it again.
    pub fn question_view(&self, key: &DocKey, node: NodeId) -> Option<K> {
        let trie = self.suffixes.get(key).expect("trie exists");
        (node != 0 && trie.is_view(node)).then(|| trie.kv(node).expect("view has kv").clone())
    }

    /// The documents held, on either tier.
    #[cfg(test)]
    pub fn doc_keys(&self) -> impl Iterator<Item = &DocKey> {
        self.doc_nodes.keys()
    }

    /// The documents of one call were used.
    pub fn docs_used(&mut self, keys: &[DocKey]) {
        self.policy.docs_used(keys);
    }

    /// Counts `positions` brought back from the host.
    pub fn count_restored(&mut self, positions: usize) {
        self.counters.restored_tokens += positions as u64;
        self.counters.restored_bytes += (positions * self.bytes_per_token) as u64;
    }

    /// Drops, from both tiers, every document of a table not in `tables`;
    /// returns them. Shared starts and stubs stay: documents of the tables
    /// still read may start the same way.
    pub fn drop_tables_but(&mut self, tables: &HashSet<String>) -> Result<Vec<DocKey>> {
        let gone: Vec<DocKey> = self
            .doc_nodes
            .keys()
            .filter(|k| !tables.contains(&k.table))
            .cloned()
            .collect();
        if gone.is_empty() {
            return Ok(gone);
        }
        let mut users = self.node_users();
        for k in &gone {
            self.drop_doc(k, &HashSet::new(), &mut users, 0)?;
        }
        Ok(gone)
    }

    /// Comes back within the device budget. Documents in `keep` stay; the
    /// others leave the device in the policy's order, each with its question
    /// trie: to the host tier while it has room (making room there by dropping
    /// its own first documents), dropped otherwise. A document is handed to
    /// `before_drop` before it is dropped. Then shared starts no document
    /// holds any more go, on each tier, lowest policy rank first.
    pub fn make_room(
        &mut self,
        keep: &HashSet<DocKey>,
        before_drop: &mut dyn BeforeDrop<K, P>,
    ) -> Result<()> {
        let held = self.bytes();
        self.counters.peak_bytes = self.counters.peak_bytes.max(held);
        let budget = self.device_budget;
        if held <= budget {
            return Ok(());
        }
        let host_budget = self.host_budget;
        let host_held = self.host_bytes();
        let victims = self.policy.victims(keep);
        let keep_nodes: HashSet<NodeId> = keep
            .iter()
            .filter_map(|k| self.doc_nodes.get(k).copied())
            .collect();
        let mut users = self.node_users();
        // Documents on the host, in the policy's order, then those moved there
        // now: the host tier's own eviction order.
        let mut on_host: VecDeque<DocKey> = victims
            .iter()
            .filter(|k| self.doc_bytes(k, &keep_nodes, &users).0 == 0)
            .cloned()
            .collect();
        let mut tally = Tally { held, host_held };
        for k in &victims {
            if tally.held <= budget {
                break;
            }
            let (device, host) = self.doc_bytes(k, &keep_nodes, &users);
            if device == 0 {
                continue; // on the host already
            }
            if host_budget > 0 && device + host <= host_budget {
                while tally.host_held + device > host_budget {
                    let Some(old) = on_host.pop_front() else {
                        break;
                    };
                    self.evict(&old, &keep_nodes, &mut users, &mut tally, before_drop)?;
                }
                if tally.host_held + device <= host_budget {
                    self.offload_doc(k, &keep_nodes, &users)?;
                    tally.held -= device;
                    tally.host_held += device;
                    self.counters.offloads += 1;
                    self.counters.offloaded_bytes += device as u64;
                    on_host.push_back(k.clone());
                    self.counters.host_peak_bytes =
                        self.counters.host_peak_bytes.max(tally.host_held);
                    continue;
                }
            }
            self.evict(k, &keep_nodes, &mut users, &mut tally, before_drop)?;
        }
        let policy = &self.policy;
        let rank = |n: NodeId| policy.node_rank(n);
        let kept = |n: NodeId| keep_nodes.contains(&n);
        let Tally { held, host_held } = tally;
        if held > budget {
            let target = budget.saturating_sub(held - self.docs.bytes());
            let removed: HashSet<NodeId> = self
                .docs
                .evict_leaves(target, &kept, &rank)
                .into_iter()
                .collect();
            self.counters.evictions += removed.len() as u64;
            self.doc_nodes.retain(|_, n| !removed.contains(n));
            let docs = &self.doc_nodes;
            self.suffixes.retain(|k, _| docs.contains_key(k));
        }
        // Stubs of dropped documents left in host memory give way in turn.
        if host_held > host_budget {
            let removed: HashSet<NodeId> = self
                .docs
                .evict_host_leaves(host_budget, &kept, &rank)
                .into_iter()
                .collect();
            self.doc_nodes.retain(|_, n| !removed.contains(n));
            let docs = &self.doc_nodes;
            self.suffixes.retain(|k, _| docs.contains_key(k));
        }
        Ok(())
    }

    /// Hands `k` to `before_drop` (its KV brought back to the device first),
    /// then drops it from both tiers, keeping `tally` in step.
    fn evict(
        &mut self,
        k: &DocKey,
        keep_nodes: &HashSet<NodeId>,
        users: &mut HashMap<NodeId, usize>,
        tally: &mut Tally,
        before_drop: &mut dyn BeforeDrop<K, P>,
    ) -> Result<()> {
        let (added, freed) = self.ask_before_drop(k, before_drop)?;
        tally.held += added;
        tally.host_held -= freed;
        let depth = self.stub_depth;
        let (d, h) = self.drop_doc(k, keep_nodes, users, depth)?;
        before_drop.dropped(k);
        tally.held -= d;
        tally.host_held -= h;
        self.counters.evictions += 1;
        Ok(())
    }

    /// Brings `doc`'s KV back to the device (restored, counted) when
    /// `before_drop` wants it, and lets it work. Returns the (device bytes
    /// added, host bytes freed) that the running tally must follow: what came
    /// back, and what the document's question trie grew or lost.
    fn ask_before_drop(
        &mut self,
        doc: &DocKey,
        before_drop: &mut dyn BeforeDrop<K, P>,
    ) -> Result<(usize, usize)> {
        let Some(&leaf) = self.doc_nodes.get(doc) else {
            return Ok((0, 0));
        };
        if !before_drop.wants(doc) {
            return Ok((0, 0));
        }
        let trie_bytes = |tiers: &Self| {
            tiers
                .suffixes
                .get(doc)
                .map_or((0, 0), |t| (t.bytes(), t.host_bytes()))
        };
        let (device_before, host_before) = trie_bytes(self);
        let restored = self.docs.restore_path(leaf)?;
        self.count_restored(restored);
        before_drop.ask(self, doc)?;
        let (device_after, host_after) = trie_bytes(self);
        let moved = restored * self.bytes_per_token;
        Ok((
            (moved + device_after).saturating_sub(device_before),
            (moved + host_before).saturating_sub(host_after),
        ))
    }

    /// Moves document `k`'s question trie and the device KV only it holds
    /// ([`Self::doc_path`]) to the host.
    fn offload_doc(
        &self,
        k: &DocKey,
        keep_nodes: &HashSet<NodeId>,
        users: &HashMap<NodeId, usize>,
    ) -> Result<()> {
        if let Some(t) = self.suffixes.get(k) {
            t.offload_all()?;
        }
        for n in self.doc_path(k, keep_nodes, users) {
            self.docs.offload(n)?;
        }
        Ok(())
    }

    /// Device and host bytes a document holds alone: its question trie, and its
    /// own KV unless a kept document or another key shares that node; on the
    /// device, also the start of its KV that only it uses ([`Self::doc_path`]).
    fn doc_bytes(
        &self,
        k: &DocKey,
        keep_nodes: &HashSet<NodeId>,
        users: &HashMap<NodeId, usize>,
    ) -> (usize, usize) {
        let (mut device, mut host) = self
            .suffixes
            .get(k)
            .map_or((0, 0), |t| (t.bytes(), t.host_bytes()));
        device += self
            .doc_path(k, keep_nodes, users)
            .into_iter()
            .filter_map(|n| self.docs.kv(n))
            .map(KvOps::bytes)
            .sum::<usize>();
        if let Some(kv) = self
            .sole_node(k, keep_nodes, users)
            .and_then(|n| self.docs.kv(n))
        {
            host += kv.host_bytes();
        }
        (device, host)
    }

    /// Document `k`'s trie node when the document holds it alone: no kept
    /// document and no other key shares it.
    fn sole_node(
        &self,
        k: &DocKey,
        keep_nodes: &HashSet<NodeId>,
        users: &HashMap<NodeId, usize>,
    ) -> Option<NodeId> {
        let &node = self.doc_nodes.get(k)?;
        (!keep_nodes.contains(&node) && users.get(&node).copied().unwrap_or(0) <= 1).then_some(node)
    }

    /// The document-trie nodes whose KV leaves the device with document `k`
    /// ([`PrefixTrie::device_path`]): its node and the ancestors on the device no
    /// other document there needs. None while a kept document or another key
    /// shares its node.
    fn doc_path(
        &self,
        k: &DocKey,
        keep_nodes: &HashSet<NodeId>,
        users: &HashMap<NodeId, usize>,
    ) -> Vec<NodeId> {
        let Some(node) = self.sole_node(k, keep_nodes, users) else {
            return Vec::new();
        };
        self.docs
            .device_path(node, &|n| n != node && is_owned(n, keep_nodes, users))
    }

    /// How many document keys use each node (documents with one text share one),
    /// counted once rather than searched for per document.
    fn node_users(&self) -> HashMap<NodeId, usize> {
        let mut users: HashMap<NodeId, usize> = HashMap::new();
        for &n in self.doc_nodes.values() {
            *users.entry(n).or_default() += 1;
        }
        users
    }

    /// Drops a document's KV from both tiers but its first `keep_depth`
    /// positions, which documents not seen yet may share
    /// ([`Self::keep_stubs_of`]); returns the (device, host) bytes freed.
    fn drop_doc(
        &mut self,
        k: &DocKey,
        keep_nodes: &HashSet<NodeId>,
        users: &mut HashMap<NodeId, usize>,
        keep_depth: usize,
    ) -> Result<(usize, usize)> {
        let (mut device, mut host) = (0, 0);
        self.policy.doc_dropped(k);
        if let Some(t) = self.suffixes.remove(k) {
            device += t.bytes();
            host += t.host_bytes();
        }
        if let Some(node) = self.doc_nodes.remove(k) {
            // Another document with the same text may still use the node.
            let left = users.get_mut(&node).map_or(0, |n| {
                *n -= 1;
                *n
            });
            let shared = keep_nodes.contains(&node) || left > 0;
            if !shared {
                // The start it shared with dropped documents goes too (down to the stub).
                let users = &*users;
                let (d, h) = self
                    .docs
                    .truncate_chain(node, keep_depth, &|n| is_owned(n, keep_nodes, users))?;
                device += d;
                host += h;
            }
        }
        Ok((device, host))
    }
}

/// [`KvTiers::make_room`]'s running count of the bytes held on each tier.
struct Tally {
    held: usize,
    host_held: usize,
}

/// Whether a document-trie node is some document's own: a kept one's, or any key's.
fn is_owned(n: NodeId, keep_nodes: &HashSet<NodeId>, users: &HashMap<NodeId, usize>) -> bool {
    keep_nodes.contains(&n) || users.get(&n).is_some_and(|&u| u > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inference::scheduler::VirtualKv;

    /// One byte per position: bytes read as positions.
    const BYTES_PER_TOKEN: usize = 1;

    fn doc(id: &str) -> DocKey {
        DocKey::new("reviews", "review", id)
    }

    /// Computes the KV of `leaves` on the device, as the simulation would.
    fn fill<P: EvictionPolicy>(tiers: &mut KvTiers<VirtualKv, P>, leaves: &[NodeId]) {
        for wave in tiers.docs.pending(leaves) {
            for n in wave {
                let base = tiers.docs.parent_kv(n).map_or(0, KvOps::len);
                let seg = tiers.docs.edge(n).len();
                let kv = VirtualKv::new(base + seg, seg, BYTES_PER_TOKEN, true);
                tiers.docs.set_kv(n, kv);
            }
        }
    }

    /// Adds document `id` as `seq` and computes its KV.
    fn add<P: EvictionPolicy>(tiers: &mut KvTiers<VirtualKv, P>, id: &str, seq: &[u32]) -> NodeId {
        let leaf = tiers.insert_doc(doc(id), seq).unwrap();
        fill(tiers, &[leaf]);
        leaf
    }

    /// Documents `ids`, each used by a call of its own, in that order: four
    /// positions each, sharing nothing.
    fn used_in_turn<P: EvictionPolicy>(tiers: &mut KvTiers<VirtualKv, P>, ids: &[&str]) {
        for id in ids {
            let first = u32::from(id.as_bytes()[0]);
            add(tiers, id, &[first; 4]);
            tiers.docs_used(&[doc(id)]);
        }
    }

    fn keep(ids: &[&str]) -> HashSet<DocKey> {
        ids.iter().map(|id| doc(id)).collect()
    }

    fn resident(tiers: &KvTiers<VirtualKv, impl EvictionPolicy>, id: &str) -> Option<bool> {
        let node = *tiers.doc_nodes.get(&doc(id))?;
        tiers.docs.kv(node).map(KvOps::is_resident)
    }

    /// What the tiers told the scheduler: documents asked before their drop
    /// (with whether their KV was on the device then) and documents dropped.
    #[derive(Default)]
    struct Told {
        /// Documents with questions to ask before they go.
        ask: HashSet<DocKey>,
        asked: Vec<(DocKey, bool)>,
        dropped: Vec<DocKey>,
    }

    impl<P: EvictionPolicy> BeforeDrop<VirtualKv, P> for Told {
        fn wants(&mut self, doc: &DocKey) -> bool {
            self.ask.contains(doc)
        }

        fn ask(&mut self, tiers: &mut KvTiers<VirtualKv, P>, doc: &DocKey) -> Result<()> {
            let node = tiers.doc_nodes[doc];
            let on_device = tiers.docs.kv(node).is_some_and(KvOps::is_resident);
            // A question of two positions on the document's KV.
            let root = tiers.docs.kv(node).cloned();
            let len = root.as_ref().map_or(0, KvOps::len);
            let trie = tiers
                .suffixes
                .entry(doc.clone())
                .or_insert_with(|| PrefixTrie::new(root));
            let q = trie.insert(&[7, 7])?;
            trie.set_kv(q, VirtualKv::new(len + 2, 2, BYTES_PER_TOKEN, true));
            self.asked.push((doc.clone(), on_device));
            Ok(())
        }

        fn dropped(&mut self, doc: &DocKey) {
            self.dropped.push(doc.clone());
        }
    }

    #[test]
    fn the_least_recently_used_documents_leave_first() {
        let mut tiers = KvTiers::new(8, 0, BYTES_PER_TOKEN);
        used_in_turn(&mut tiers, &["a", "b", "c"]);
        let mut told = Told::default();
        tiers.make_room(&keep(&["c"]), &mut told).unwrap();
        assert_eq!(told.dropped, [doc("a")]);
        assert_eq!(tiers.bytes(), 8);
        // b used again: c is now the oldest one not kept.
        tiers.docs_used(&[doc("b")]);
        used_in_turn(&mut tiers, &["d"]);
        tiers.make_room(&keep(&["d"]), &mut told).unwrap();
        assert_eq!(told.dropped, [doc("a"), doc("c")]);
        let c = tiers.counters();
        assert_eq!((c.evictions, c.offloads, c.peak_bytes), (2, 0, 12));
        assert!(told.asked.is_empty());
    }

    #[test]
    fn the_host_tier_admits_what_fits_and_gives_way_oldest_first() {
        let mut tiers = KvTiers::new(4, 8, BYTES_PER_TOKEN);
        used_in_turn(&mut tiers, &["a", "b", "c"]);
        let mut told = Told::default();
        tiers.make_room(&keep(&["c"]), &mut told).unwrap();
        assert_eq!(
            (resident(&tiers, "a"), resident(&tiers, "b")),
            (Some(false), Some(false))
        );
        assert_eq!((tiers.bytes(), tiers.host_bytes()), (4, 8));
        assert!(told.dropped.is_empty());
        // The host tier is full: its oldest document goes to admit c.
        used_in_turn(&mut tiers, &["d"]);
        tiers.make_room(&keep(&["d"]), &mut told).unwrap();
        assert_eq!(told.dropped, [doc("a")]);
        assert_eq!(resident(&tiers, "c"), Some(false));
        let c = tiers.counters();
        assert_eq!((c.offloads, c.offloaded_bytes, c.evictions), (3, 12, 1));
        assert_eq!(c.host_peak_bytes, 8);
    }

    #[test]
    fn a_document_larger_than_the_host_tier_is_dropped_not_offloaded() {
        let mut tiers = KvTiers::new(4, 3, BYTES_PER_TOKEN);
        used_in_turn(&mut tiers, &["a", "b"]);
        let mut told = Told::default();
        tiers.make_room(&keep(&["b"]), &mut told).unwrap();
        assert_eq!(told.dropped, [doc("a")]);
        assert_eq!(tiers.host_bytes(), 0);
        assert_eq!(tiers.counters().offloads, 0);
    }

    #[test]
    fn a_path_comes_back_from_the_host_with_the_start_it_shared() {
        let mut tiers = KvTiers::new(0, 100, BYTES_PER_TOKEN);
        let a = tiers.insert_doc(doc("a"), &[1, 2, 3, 4, 5]).unwrap();
        let b = tiers.insert_doc(doc("b"), &[1, 2, 3, 6, 7]).unwrap();
        fill(&mut tiers, &[a, b]);
        tiers.docs_used(&[doc("a"), doc("b")]);
        tiers
            .make_room(&HashSet::new(), &mut Told::default())
            .unwrap();
        // Both on the host, the shared start [1, 2, 3] with the last to go.
        assert_eq!((tiers.bytes(), tiers.host_bytes()), (0, 7));
        let restored = tiers.docs.restore_path(b).unwrap();
        tiers.count_restored(restored);
        assert_eq!(restored, 3 + 2);
        assert_eq!(
            (resident(&tiers, "b"), resident(&tiers, "a")),
            (Some(true), Some(false))
        );
        let c = tiers.counters();
        assert_eq!(
            (c.restored_tokens, c.restored_bytes),
            (5, 5 * BYTES_PER_TOKEN as u64)
        );
    }

    #[test]
    fn a_document_is_asked_ahead_on_the_device_before_it_is_dropped() {
        let mut tiers = KvTiers::new(4, 4, BYTES_PER_TOKEN);
        used_in_turn(&mut tiers, &["a", "b", "c"]);
        let mut told = Told {
            ask: keep(&["a", "b"]),
            ..Told::default()
        };
        // a goes to the host; b finds it full: a is brought back, asked, dropped.
        tiers.make_room(&keep(&["c"]), &mut told).unwrap();
        assert_eq!(told.asked, [(doc("a"), true)]);
        assert_eq!(told.dropped, [doc("a")]);
        assert!(!tiers.doc_nodes.contains_key(&doc("a")));
        assert!(!tiers.suffixes.contains_key(&doc("a")));
        assert_eq!(resident(&tiers, "b"), Some(false));
        let c = tiers.counters();
        assert_eq!((c.restored_tokens, c.evictions, c.offloads), (4, 1, 2));
        // Nothing is asked of a document that only moves to the host.
        assert!(!told.asked.iter().any(|(d, _)| *d == doc("b")));
    }

    /// First in, first out: a second policy, ignoring later use.
    #[derive(Default)]
    struct Fifo {
        order: Vec<DocKey>,
        nodes: HashMap<NodeId, u64>,
    }

    impl EvictionPolicy for Fifo {
        fn docs_used(&mut self, docs: &[DocKey]) {
            for d in docs {
                if !self.order.contains(d) {
                    self.order.push(d.clone());
                }
            }
        }
        fn doc_dropped(&mut self, doc: &DocKey) {
            self.order.retain(|d| d != doc);
        }
        fn victims(&self, keep: &HashSet<DocKey>) -> Vec<DocKey> {
            self.order
                .iter()
                .filter(|d| !keep.contains(*d))
                .cloned()
                .collect()
        }
        fn nodes_used(&mut self, path: &[NodeId]) {
            let next = self.nodes.len() as u64 + 1;
            for &n in path {
                self.nodes.entry(n).or_insert(next);
            }
        }
        fn node_rank(&self, node: NodeId) -> u64 {
            self.nodes.get(&node).copied().unwrap_or(0)
        }
    }

    /// a, b, then a again and c: the policy picks who goes.
    fn first_dropped<P: EvictionPolicy>(policy: P) -> Vec<DocKey> {
        let mut tiers = KvTiers::with_policy(policy, 8, 0, BYTES_PER_TOKEN);
        used_in_turn(&mut tiers, &["a", "b"]);
        tiers.docs_used(&[doc("a")]);
        used_in_turn(&mut tiers, &["c"]);
        let mut told = Told::default();
        tiers.make_room(&keep(&["c"]), &mut told).unwrap();
        told.dropped
    }

    #[test]
    fn the_policy_is_a_seam() {
        assert_eq!(first_dropped(Lru::default()), [doc("b")]);
        assert_eq!(first_dropped(Fifo::default()), [doc("a")]);
    }

    #[test]
    fn documents_of_tables_no_longer_read_are_dropped_with_their_questions() {
        let mut tiers = KvTiers::new(100, 0, BYTES_PER_TOKEN);
        used_in_turn(&mut tiers, &["a"]);
        let other = DocKey::new("movies", "plot", "m");
        tiers.insert_doc(other.clone(), &[9, 9]).unwrap();
        let gone = tiers
            .drop_tables_but(&HashSet::from(["movies".to_string()]))
            .unwrap();
        assert_eq!(gone, [doc("a")]);
        assert!(tiers.doc_nodes.contains_key(&other));
        assert_eq!(tiers.bytes(), 0);
    }
}
