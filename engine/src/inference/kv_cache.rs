//! A radix trie over token sequences whose nodes hold KV handles: the prefix
//! cache of the model backend.
//!
//! Each node stands for the token sequence on the path from the root and, once
//! computed, holds the KV of that whole sequence (a handle chaining to its
//! parent's). Inserting a sequence only adds structure; [`PrefixTrie::pending`]
//! then lists, parents first, the nodes whose KV must be computed, so a caller can
//! prefill a whole batch level by level and every distinct prefix is computed
//! exactly once — the prefix-trie size QUAIL-B's minimum-token rule counts.
//! When a new sequence leaves a cached edge midway, the edge is split and the
//! split point gets a *view* of the longer KV (see [`KvOps::prefix`]).
//!
//! The trie is generic over the KV type so the same scheduling code drives the
//! real model and the simulation's virtual cache. It keeps no clock: which
//! leaves go first is the caller's eviction policy
//! ([`crate::inference::scheduler`]'s `KvTiers`), handed in as a rank per node, so one
//! place holds recency for documents and their shared starts alike.

use std::collections::HashMap;

/// What the trie needs from a KV handle type.
pub trait KvOps: Clone {
    /// A view of the first `len` positions (can be continued, not scored).
    fn prefix(&self, len: usize) -> crate::Result<Self>;
    /// Bytes this handle's own segment holds.
    fn bytes(&self) -> usize;
    /// Positions covered, ancestors included.
    fn len(&self) -> usize;
    /// Positions this handle's own segment holds.
    fn segment_len(&self) -> usize;
    /// Whether the segment is in device memory, usable; `false` once offloaded.
    fn is_resident(&self) -> bool {
        true
    }
    /// Bytes of this handle's own segment held in host memory (offloaded).
    fn host_bytes(&self) -> usize {
        0
    }
    /// Moves the segment to host memory (a no-op when it is there).
    fn offload(&self) -> crate::Result<()> {
        Ok(())
    }
    /// Brings an offloaded segment back to device memory.
    fn restore(&self) -> crate::Result<()> {
        Ok(())
    }
    /// Whether the handle covers no positions.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Index of a node.
pub type NodeId = usize;

#[derive(Debug, Clone)]
struct Node<K> {
    /// Tokens on the edge from the parent.
    edge: Vec<u32>,
    /// Length of the whole sequence ending here.
    depth: usize,
    parent: NodeId,
    children: HashMap<u32, NodeId>,
    kv: Option<K>,
    /// The KV is a view of a longer sequence: no output at its last position.
    view: bool,
    alive: bool,
}

/// The radix trie.
#[derive(Debug, Clone)]
pub struct PrefixTrie<K> {
    /// Positions the root's KV already covers (a question trie is rooted at its
    /// document): node depths are relative to it, KV positions absolute.
    root_len: usize,
    nodes: Vec<Node<K>>,
    free: Vec<NodeId>,
}

impl<K: KvOps> PrefixTrie<K> {
    /// A trie whose root (the empty sequence, or whatever `root_kv` holds) has `root_kv`.
    pub fn new(root_kv: Option<K>) -> Self {
        Self {
            root_len: root_kv.as_ref().map_or(0, K::len),
            nodes: vec![Node {
                edge: Vec::new(),
                depth: 0,
                parent: 0,
                children: HashMap::new(),
                kv: root_kv,
                view: false,
                alive: true,
            }],
            free: Vec::new(),
        }
    }

    fn alloc(&mut self, node: Node<K>) -> NodeId {
        match self.free.pop() {
            Some(id) => {
                self.nodes[id] = node;
                id
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        }
    }

    /// Adds `seq` (structure only) and returns its node. Splits an edge where
    /// `seq` leaves it, giving the split point a view of the edge's KV if any.
    /// The nodes the sequence passes are [`Self::path`] of the node returned.
    pub fn insert(&mut self, seq: &[u32]) -> crate::Result<NodeId> {
        let mut node = 0;
        let mut pos = 0;
        loop {
            if pos == seq.len() {
                return Ok(node);
            }
            let Some(&child) = self.nodes[node].children.get(&seq[pos]) else {
                let leaf = self.alloc(Node {
                    edge: seq[pos..].to_vec(),
                    depth: seq.len(),
                    parent: node,
                    children: HashMap::new(),
                    kv: None,
                    view: false,
                    alive: true,
                });
                self.nodes[node].children.insert(seq[pos], leaf);
                return Ok(leaf);
            };
            let edge = &self.nodes[child].edge;
            let common = edge
                .iter()
                .zip(&seq[pos..])
                .take_while(|(a, b)| a == b)
                .count();
            if common == edge.len() {
                node = child;
                pos += common;
                continue;
            }
            // Split `child`'s edge after `common` tokens.
            let split_depth = self.nodes[node].depth + common;
            let kv = match &self.nodes[child].kv {
                Some(k) => Some(k.prefix(self.root_len + split_depth)?),
                None => None,
            };
            let head = self.nodes[child].edge[..common].to_vec();
            let tail = self.nodes[child].edge[common..].to_vec();
            let split = self.alloc(Node {
                edge: head,
                depth: split_depth,
                parent: node,
                children: HashMap::from([(tail[0], child)]),
                view: kv.is_some(),
                kv,
                alive: true,
            });
            self.nodes[node].children.insert(seq[pos], split);
            let c = &mut self.nodes[child];
            c.edge = tail;
            c.parent = split;
            node = split;
            pos += common;
        }
    }

    /// The nodes on the way to `targets` (targets included) that have no KV yet,
    /// grouped in waves: every node of a wave has a parent with KV once the
    /// previous waves are computed.
    pub fn pending(&self, targets: &[NodeId]) -> Vec<Vec<NodeId>> {
        let mut need: HashMap<NodeId, usize> = HashMap::new();
        for &t in targets {
            let mut n = t;
            while self.nodes[n].kv.is_none() && n != 0 {
                if need.contains_key(&n) {
                    break;
                }
                need.insert(n, 0);
                n = self.nodes[n].parent;
            }
        }
        let mut by_level: Vec<Vec<NodeId>> = Vec::new();
        let mut ids: Vec<NodeId> = need.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let mut level = 0;
            let mut p = self.nodes[id].parent;
            while need.contains_key(&p) {
                level += 1;
                p = self.nodes[p].parent;
            }
            if by_level.len() <= level {
                by_level.resize(level + 1, Vec::new());
            }
            by_level[level].push(id);
        }
        by_level
    }

    /// The nodes from `id` up to the root, both included: what a sequence
    /// ending at `id` uses (every node an [`Self::insert`] of it passes).
    pub fn path(&self, id: NodeId) -> Vec<NodeId> {
        let mut path = vec![id];
        let mut n = id;
        while n != 0 {
            n = self.nodes[n].parent;
            path.push(n);
        }
        path
    }

    /// KV of a node's parent (must exist).
    pub fn parent_kv(&self, id: NodeId) -> Option<&K> {
        self.nodes[self.nodes[id].parent].kv.as_ref()
    }

    /// Tokens from the parent to the node.
    pub fn edge(&self, id: NodeId) -> &[u32] {
        &self.nodes[id].edge
    }

    /// Stores a node's computed KV.
    pub fn set_kv(&mut self, id: NodeId, kv: K) {
        let n = &mut self.nodes[id];
        n.kv = Some(kv);
        n.view = false;
    }

    /// Stores KV for a node that has no output at its last position (read
    /// back from a store as part of a longer sequence): it can be continued,
    /// not scored, as a split's view.
    pub fn set_view_kv(&mut self, id: NodeId, kv: K) {
        let n = &mut self.nodes[id];
        n.kv = Some(kv);
        n.view = true;
    }

    /// The nodes from `id` up that have no KV, topmost first (empty when
    /// `id` has its KV): what computing `id` must compute.
    pub fn missing_path(&self, id: NodeId) -> Vec<NodeId> {
        let mut out = Vec::new();
        let mut n = id;
        while n != 0 && self.nodes[n].kv.is_none() {
            out.push(n);
            n = self.nodes[n].parent;
        }
        out.reverse();
        out
    }

    /// A node's KV, if computed.
    pub fn kv(&self, id: NodeId) -> Option<&K> {
        self.nodes[id].kv.as_ref()
    }

    /// Whether a node's KV is a view (cannot be scored).
    pub fn is_view(&self, id: NodeId) -> bool {
        self.nodes[id].view
    }

    /// Length of the node's sequence.
    pub fn depth(&self, id: NodeId) -> usize {
        self.nodes[id].depth
    }

    /// Bytes held by the computed KV of every node but the root (whose KV, when
    /// given, belongs to someone else).
    pub fn bytes(&self) -> usize {
        self.nodes[1..]
            .iter()
            .filter(|n| n.alive)
            .filter_map(|n| n.kv.as_ref())
            .map(K::bytes)
            .sum()
    }

    /// Bytes the computed KV of every node but the root holds in host memory.
    pub fn host_bytes(&self) -> usize {
        self.nodes[1..]
            .iter()
            .filter(|n| n.alive)
            .filter_map(|n| n.kv.as_ref())
            .map(K::host_bytes)
            .sum()
    }

    /// Moves one node's KV to host memory; returns the device bytes it freed.
    pub fn offload(&self, id: NodeId) -> crate::Result<usize> {
        match self.nodes[id].kv.as_ref().filter(|_| id != 0) {
            Some(kv) => {
                let bytes = kv.bytes();
                kv.offload()?;
                Ok(bytes)
            }
            None => Ok(0),
        }
    }

    /// Moves the KV of every node but the root to host memory; returns the
    /// device bytes freed.
    pub fn offload_all(&self) -> crate::Result<usize> {
        let mut freed = 0;
        for id in 1..self.nodes.len() {
            if self.nodes[id].alive {
                freed += self.offload(id)?;
            }
        }
        Ok(freed)
    }

    /// Brings back to device memory the offloaded KV on the path from the root
    /// (excluded) to `id`; returns the positions restored.
    pub fn restore_path(&self, id: NodeId) -> crate::Result<usize> {
        let mut restored = 0;
        let mut n = id;
        while n != 0 {
            if let Some(kv) = self.nodes[n].kv.as_ref()
                && !kv.is_resident()
            {
                kv.restore()?;
                restored += kv.segment_len();
            }
            n = self.nodes[n].parent;
        }
        Ok(restored)
    }

    /// The nodes whose KV leaves the device with `id`'s: `id` itself and each
    /// ancestor on the device that only this path uses. The walk passes KV
    /// already on the host and stops at the first ancestor that `keep` claims
    /// (a sequence still on the device ends there) or that another child on the
    /// device needs. Without it, a sequence's offloaded end would leave its
    /// start on the device, held for a child that is not there.
    pub fn device_path(&self, id: NodeId, keep: &dyn Fn(NodeId) -> bool) -> Vec<NodeId> {
        let resident = |n: NodeId| self.nodes[n].kv.as_ref().is_some_and(|kv| kv.is_resident());
        let mut path = Vec::new();
        if id == 0 || !self.nodes[id].alive || keep(id) {
            return path;
        }
        if resident(id) {
            path.push(id);
        }
        let (mut child, mut n) = (id, self.nodes[id].parent);
        while n != 0 {
            if resident(n) {
                let shared = self.nodes[n]
                    .children
                    .values()
                    .any(|&c| c != child && resident(c));
                if keep(n) || shared {
                    break;
                }
                path.push(n);
            }
            (child, n) = (n, self.nodes[n].parent);
        }
        path
    }

    fn is_evictable_leaf(&self, i: NodeId) -> bool {
        let n = &self.nodes[i];
        i != 0
            && n.alive
            && n.kv.is_some()
            && n.children.values().all(|&c| self.nodes[c].kv.is_none())
    }

    /// Drops the KV of leaves, lowest `rank` first (ties by node id), until at
    /// most `target` device bytes are held or nothing more can go; `keep`
    /// vetoes nodes still needed, and KV in host memory stays (dropping it
    /// frees no device bytes). A parent left a leaf joins the candidates.
    /// Returns the removed nodes.
    pub fn evict_leaves(
        &mut self,
        target: usize,
        keep: &dyn Fn(NodeId) -> bool,
        rank: &dyn Fn(NodeId) -> u64,
    ) -> Vec<NodeId> {
        self.evict_leaves_in(true, target, keep, rank)
    }

    /// Like [`Self::evict_leaves`] for the host tier: drops leaves held in
    /// host memory until at most `target` host bytes are held.
    pub fn evict_host_leaves(
        &mut self,
        target: usize,
        keep: &dyn Fn(NodeId) -> bool,
        rank: &dyn Fn(NodeId) -> u64,
    ) -> Vec<NodeId> {
        self.evict_leaves_in(false, target, keep, rank)
    }

    fn evict_leaves_in(
        &mut self,
        device: bool,
        target: usize,
        keep: &dyn Fn(NodeId) -> bool,
        rank: &dyn Fn(NodeId) -> u64,
    ) -> Vec<NodeId> {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        let tier_bytes = |kv: &K| if device { kv.bytes() } else { kv.host_bytes() };
        let mut held = if device {
            self.bytes()
        } else {
            self.host_bytes()
        };
        let in_tier = |t: &Self, i: NodeId| {
            t.nodes[i]
                .kv
                .as_ref()
                .is_some_and(|kv| kv.is_resident() == device)
        };
        let mut heap: BinaryHeap<Reverse<(u64, NodeId)>> = (1..self.nodes.len())
            .filter(|&i| self.is_evictable_leaf(i) && in_tier(self, i) && !keep(i))
            .map(|i| Reverse((rank(i), i)))
            .collect();
        let mut removed = Vec::new();
        while held > target {
            let Some(Reverse((_, v))) = heap.pop() else {
                break;
            };
            if !self.is_evictable_leaf(v) {
                continue;
            }
            let parent = self.nodes[v].parent;
            held -= self.nodes[v].kv.as_ref().map_or(0, tier_bytes);
            self.remove_subtree(v, &mut removed);
            if self.is_evictable_leaf(parent) && in_tier(self, parent) && !keep(parent) {
                heap.push(Reverse((rank(parent), parent)));
            }
        }
        removed
    }

    /// Drops one node's KV if it is a leaf (no child holds KV); returns the bytes
    /// freed (0 when it is not a leaf or already gone).
    pub fn evict_leaf(&mut self, id: NodeId) -> usize {
        if !self.is_evictable_leaf(id) {
            return 0;
        }
        let mut removed = Vec::new();
        self.remove_subtree(id, &mut removed)
    }

    /// Shortens a leaf to its first `depth` positions (a view of its KV), so
    /// that the start it may share with sequences not seen yet stays computed;
    /// removes it when its parent already reaches `depth`. Returns the (device,
    /// host) bytes freed; nothing happens to a node that is not a leaf.
    pub fn truncate_leaf(&mut self, id: NodeId, depth: usize) -> crate::Result<(usize, usize)> {
        if !self.is_evictable_leaf(id) {
            return Ok((0, 0));
        }
        let kv = self.nodes[id].kv.clone().expect("a leaf with KV");
        let before = (kv.bytes(), kv.host_bytes());
        let parent_depth = self.nodes[self.nodes[id].parent].depth;
        if depth <= parent_depth {
            let mut removed = Vec::new();
            self.remove_subtree(id, &mut removed);
            return Ok(before);
        }
        if depth >= self.nodes[id].depth {
            return Ok((0, 0));
        }
        let view = kv.prefix(self.root_len + depth)?;
        let after = (view.bytes(), view.host_bytes());
        let n = &mut self.nodes[id];
        n.edge.truncate(depth - parent_depth);
        n.depth = depth;
        n.kv = Some(view);
        n.view = true;
        Ok((
            before.0.saturating_sub(after.0),
            before.1.saturating_sub(after.1),
        ))
    }

    /// Like [`Self::truncate_leaf`], and when that removes the leaf, its parent
    /// in turn, and so on up while the parent is left a leaf that `owned` does
    /// not claim: a start that only removed sequences used goes with them.
    /// Returns the (device, host) bytes freed.
    pub fn truncate_chain(
        &mut self,
        id: NodeId,
        depth: usize,
        owned: &dyn Fn(NodeId) -> bool,
    ) -> crate::Result<(usize, usize)> {
        let (mut device, mut host) = (0, 0);
        let mut n = id;
        loop {
            let parent = self.nodes[n].parent;
            let (d, h) = self.truncate_leaf(n, depth)?;
            device += d;
            host += h;
            if self.nodes[n].alive
                || parent == 0
                || owned(parent)
                || !self.is_evictable_leaf(parent)
            {
                return Ok((device, host));
            }
            n = parent;
        }
    }

    /// Removes a subtree; returns the KV bytes it held.
    fn remove_subtree(&mut self, id: NodeId, removed: &mut Vec<NodeId>) -> usize {
        let mut freed = 0;
        let children: Vec<NodeId> = self.nodes[id].children.values().copied().collect();
        for c in children {
            freed += self.remove_subtree(c, removed);
        }
        let parent = self.nodes[id].parent;
        let first = self.nodes[id].edge[0];
        if self.nodes[parent].children.get(&first) == Some(&id) {
            self.nodes[parent].children.remove(&first);
        }
        let n = &mut self.nodes[id];
        freed += n.kv.as_ref().map_or(0, K::bytes);
        n.kv = None;
        n.alive = false;
        n.children.clear();
        self.free.push(id);
        removed.push(id);
        freed
    }

    /// Whether a node id currently stands for a live node.
    pub fn is_alive(&self, id: NodeId) -> bool {
        self.nodes.get(id).is_some_and(|n| n.alive)
    }

    /// Number of live nodes with KV.
    pub fn cached_nodes(&self) -> usize {
        self.nodes
            .iter()
            .filter(|n| n.alive && n.kv.is_some())
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A virtual KV: just the sequence length.
    #[derive(Debug, Clone, PartialEq)]
    struct Len(usize);

    impl KvOps for Len {
        fn prefix(&self, len: usize) -> crate::Result<Self> {
            Ok(Len(len))
        }
        fn bytes(&self) -> usize {
            self.0
        }
        fn len(&self) -> usize {
            self.0
        }
        fn segment_len(&self) -> usize {
            self.0
        }
    }

    /// A KV that can be offloaded: length, own segment, and whether on the device.
    #[derive(Debug, Clone)]
    struct Tiered(usize, usize, std::rc::Rc<std::cell::Cell<bool>>);

    impl KvOps for Tiered {
        fn prefix(&self, len: usize) -> crate::Result<Self> {
            Ok(Tiered(
                len,
                len,
                std::rc::Rc::new(std::cell::Cell::new(self.2.get())),
            ))
        }
        fn bytes(&self) -> usize {
            if self.2.get() { self.1 } else { 0 }
        }
        fn len(&self) -> usize {
            self.0
        }
        fn segment_len(&self) -> usize {
            self.1
        }
        fn is_resident(&self) -> bool {
            self.2.get()
        }
        fn host_bytes(&self) -> usize {
            if self.2.get() { 0 } else { self.1 }
        }
        fn offload(&self) -> crate::Result<()> {
            self.2.set(false);
            Ok(())
        }
        fn restore(&self) -> crate::Result<()> {
            self.2.set(true);
            Ok(())
        }
    }

    /// A computed segment on the device: `seg` positions after `base`.
    fn tiered(base: usize, seg: usize) -> Tiered {
        Tiered(
            base + seg,
            seg,
            std::rc::Rc::new(std::cell::Cell::new(true)),
        )
    }

    /// Two snapshots of one trace (a, then b extending it) and another sequence
    /// c sharing their first two tokens, computed: the trie and (a, b, c, the
    /// split point [1, 2]).
    fn snapshot_trie() -> (PrefixTrie<Tiered>, [NodeId; 4]) {
        let mut t = PrefixTrie::new(None);
        let a = t.insert(&[1, 2, 3, 4]).unwrap();
        let b = t.insert(&[1, 2, 3, 4, 5, 6]).unwrap();
        let c = t.insert(&[1, 2, 9]).unwrap();
        fill_with(&mut t, &[a, b, c], tiered);
        let split = t.insert(&[1, 2]).unwrap();
        (t, [a, b, c, split])
    }

    /// Computes every pending node, each KV made by `make` from the parent's
    /// length and the edge's; returns the positions computed.
    fn fill_with<K: KvOps>(
        t: &mut PrefixTrie<K>,
        targets: &[NodeId],
        make: impl Fn(usize, usize) -> K,
    ) -> usize {
        let mut fresh = 0;
        for wave in t.pending(targets) {
            for id in wave {
                let base = t.parent_kv(id).map_or(0, K::len);
                let seg = t.edge(id).len();
                fresh += seg;
                t.set_kv(id, make(base, seg));
            }
        }
        fresh
    }

    /// Computes every pending node; returns the positions computed.
    fn fill(t: &mut PrefixTrie<Len>, targets: &[NodeId]) -> usize {
        fill_with(t, targets, |base, seg| Len(base + seg))
    }

    #[test]
    fn computes_each_distinct_prefix_once() {
        let mut t = PrefixTrie::new(None);
        let seqs: [&[u32]; 4] = [&[1, 2, 3, 4], &[1, 2, 3, 5, 6], &[1, 2], &[7]];
        let ids: Vec<NodeId> = seqs.iter().map(|s| t.insert(s).unwrap()).collect();
        // Distinct prefixes: 1,12,123,1234,1235,12356,7 = 7.
        assert_eq!(fill(&mut t, &ids), 7);
        for (s, id) in seqs.iter().zip(&ids) {
            assert_eq!(t.kv(*id), Some(&Len(s.len())));
        }
        // Asking again costs nothing; a new branch costs only its new tokens.
        let again = t.insert(&[1, 2, 3, 5, 6]).unwrap();
        assert_eq!(fill(&mut t, &[again]), 0);
        let branch = t.insert(&[1, 2, 3, 5, 9, 9]).unwrap();
        assert_eq!(fill(&mut t, &[branch]), 2);
    }

    #[test]
    fn splitting_a_computed_edge_reuses_a_view() {
        let mut t = PrefixTrie::new(None);
        let a = t.insert(&[1, 2, 3, 4, 5]).unwrap();
        assert_eq!(fill(&mut t, &[a]), 5);
        let b = t.insert(&[1, 2, 3, 9]).unwrap();
        // Only token 9 is new: [1,2,3] comes from a view of [1..5].
        assert_eq!(fill(&mut t, &[b]), 1);
        let split = t.insert(&[1, 2, 3]).unwrap();
        assert!(t.is_view(split));
        assert_eq!(t.kv(split), Some(&Len(3)));
        assert_eq!(t.kv(a), Some(&Len(5)));
    }

    #[test]
    fn views_of_a_rooted_trie_use_absolute_positions() {
        let mut t = PrefixTrie::new(Some(Len(100)));
        let a = t.insert(&[1, 2, 3]).unwrap();
        for wave in t.pending(&[a]) {
            for id in wave {
                let base = t.parent_kv(id).unwrap().0;
                t.set_kv(id, Len(base + t.edge(id).len()));
            }
        }
        assert_eq!(t.kv(a), Some(&Len(103)));
        let split = t.insert(&[1, 2]).unwrap();
        assert_eq!(t.kv(split), Some(&Len(102)));
    }

    #[test]
    fn eviction_drops_the_lowest_ranked_leaves_first() {
        let mut t = PrefixTrie::new(None);
        let a = t.insert(&[1, 2, 3]).unwrap();
        let b = t.insert(&[4, 5, 6, 7]).unwrap();
        fill(&mut t, &[a, b]);
        // The caller's policy ranks b below a (a used since, say).
        let touched = t.insert(&[1, 2, 3]).unwrap();
        assert_eq!(t.path(touched), vec![a, 0]);
        let rank = |n: NodeId| if n == a { 2 } else { 1 };
        let removed = t.evict_leaves(3, &|_| false, &rank);
        assert_eq!(removed, vec![b]);
        assert!(t.kv(a).is_some());
        assert_eq!(t.cached_nodes(), 1);
        let c = t.insert(&[4, 5]).unwrap();
        assert_eq!(fill(&mut t, &[c]), 2);
    }

    #[test]
    fn a_sequence_leaves_the_device_with_the_start_only_it_uses() {
        let (t, [a, b, c, split]) = snapshot_trie();
        // While a is still wanted on the device, b goes alone.
        assert_eq!(t.device_path(b, &|n| n == a), vec![b]);
        // Otherwise a goes with it; the shared [1, 2] stays for c.
        assert_eq!(t.device_path(b, &|_| false), vec![b, a]);
        for n in t.device_path(b, &|_| false) {
            t.offload(n).unwrap();
        }
        // c then takes the shared start along: nothing on the device needs it,
        // and the walk passes KV already on the host.
        assert_eq!(t.device_path(c, &|_| false), vec![c, split]);
        // b has nothing left on the device of its own: c still needs [1, 2].
        assert!(t.device_path(b, &|_| false).is_empty());
        assert!(t.device_path(c, &|n| n == c).is_empty());
    }

    #[test]
    fn a_removed_leaf_takes_the_start_no_one_owns_with_it() {
        let (mut t, [a, b, c, split]) = snapshot_trie();
        // a is owned: only b's own edge goes.
        assert_eq!(t.truncate_chain(b, 0, &|n| n == a).unwrap(), (2, 0));
        assert!(t.is_alive(a));
        // Owned by no one, a goes with its child; the split point c uses stays.
        let b = t.insert(&[1, 2, 3, 4, 5, 6]).unwrap();
        fill_with(&mut t, &[b], tiered);
        assert_eq!(t.truncate_chain(b, 0, &|_| false).unwrap(), (2 + 2, 0));
        assert!(!t.is_alive(a));
        assert!(t.is_alive(split) && t.is_alive(c));
        // The last sequence takes everything, up to the root.
        assert_eq!(t.truncate_chain(c, 0, &|_| false).unwrap(), (1 + 2, 0));
        assert_eq!(t.cached_nodes(), 0);
    }

    #[test]
    fn a_truncated_leaf_keeps_the_start_later_sequences_share() {
        let mut t = PrefixTrie::new(None);
        let a = t.insert(&[1, 2, 3, 4, 5, 6]).unwrap();
        let b = t.insert(&[1, 2, 7]).unwrap();
        fill(&mut t, &[a, b]);
        // a's own edge is [3..6] under the shared [1,2]: keep up to depth 4.
        assert_eq!(t.truncate_leaf(a, 4).unwrap(), (2, 0));
        assert_eq!((t.edge(a), t.depth(a)), (&[3, 4][..], 4));
        assert!(t.is_view(a));
        assert_eq!(t.kv(a), Some(&Len(4)));
        // A sequence starting as a did computes only what is past the stub.
        let c = t.insert(&[1, 2, 3, 4, 8]).unwrap();
        assert_eq!(fill(&mut t, &[c]), 1);
        // Not a leaf any more: untouched. A leaf whose parent reaches the depth goes.
        assert_eq!(t.truncate_leaf(a, 3).unwrap(), (0, 0));
        assert_eq!(t.truncate_leaf(b, 2).unwrap(), (3, 0));
        assert!(!t.is_alive(b));
        // Deeper than the leaf: nothing to cut.
        assert_eq!(t.truncate_leaf(c, 9).unwrap(), (0, 0));
    }
}
