//! Which KV leaves a tier first: the eviction-policy seam of
//! [`KvTiers`](super::tiers::KvTiers), and least-recently-used ([`Lru`]), the
//! policy the scheduler runs.
//!
//! A policy sees two kinds of use, both from the tiers: a call's documents
//! (the unit that leaves the device, to the host tier or for good), and the
//! document-trie nodes a sequence passes (the shared starts and stubs that go
//! once no document holds them). It answers with an order: documents in the
//! order they should leave, and a rank per node (lower goes first). It holds
//! no KV and frees nothing; [`KvTiers::make_room`](super::tiers::KvTiers::make_room)
//! does, in the order the policy gives.

use std::collections::{HashMap, HashSet};

use crate::inference::kv_cache::NodeId;
use crate::inference::memo::DocKey;

/// An eviction order over documents and document-trie nodes.
pub trait EvictionPolicy: Send {
    /// The documents of one call were used, all at one moment.
    fn docs_used(&mut self, docs: &[DocKey]);
    /// A document left both tiers: it is no candidate any more.
    fn doc_dropped(&mut self, doc: &DocKey);
    /// The documents known to the policy but `keep`, in the order they leave
    /// the device (and, once on the host, the host tier).
    fn victims(&self, keep: &HashSet<DocKey>) -> Vec<DocKey>;
    /// The document-trie nodes of one inserted sequence were used
    /// ([`PrefixTrie::path`](crate::inference::kv_cache::PrefixTrie::path)).
    fn nodes_used(&mut self, path: &[NodeId]);
    /// A node's place in the order leaves go in: lower first (ties by id).
    fn node_rank(&self, node: NodeId) -> u64;
}

/// Least recently used first, documents and nodes on one clock.
#[derive(Debug, Default)]
pub struct Lru {
    clock: u64,
    /// Per document, the tick of the call that last used it.
    docs: HashMap<DocKey, u64>,
    /// Per document-trie node, the tick of the last sequence that passed it.
    nodes: HashMap<NodeId, u64>,
}

impl EvictionPolicy for Lru {
    fn docs_used(&mut self, docs: &[DocKey]) {
        self.clock += 1;
        for d in docs {
            self.docs.insert(d.clone(), self.clock);
        }
    }

    fn doc_dropped(&mut self, doc: &DocKey) {
        self.docs.remove(doc);
    }

    fn victims(&self, keep: &HashSet<DocKey>) -> Vec<DocKey> {
        // Documents of one call share a tick: their key orders them, so the
        // order never depends on a hash map's.
        let mut order: Vec<(u64, &DocKey)> = self
            .docs
            .iter()
            .filter(|(k, _)| !keep.contains(*k))
            .map(|(k, &t)| (t, k))
            .collect();
        order.sort_unstable();
        order.into_iter().map(|(_, k)| k.clone()).collect()
    }

    fn nodes_used(&mut self, path: &[NodeId]) {
        self.clock += 1;
        for &n in path {
            self.nodes.insert(n, self.clock);
        }
    }

    fn node_rank(&self, node: NodeId) -> u64 {
        // A node is ranked when inserted (a reused id with it), so an unknown
        // one is the root, never evicted.
        self.nodes.get(&node).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(id: &str) -> DocKey {
        DocKey::new("reviews", "review", id)
    }

    #[test]
    fn the_least_recently_used_go_first_and_a_call_is_ordered_by_key() {
        let mut lru = Lru::default();
        lru.docs_used(&[doc("b"), doc("a")]);
        lru.docs_used(&[doc("c")]);
        lru.docs_used(&[doc("a")]);
        assert_eq!(lru.victims(&HashSet::new()), [doc("b"), doc("c"), doc("a")]);
        assert_eq!(
            lru.victims(&HashSet::from([doc("c")])),
            [doc("b"), doc("a")]
        );
        lru.doc_dropped(&doc("b"));
        assert_eq!(lru.victims(&HashSet::new()), [doc("c"), doc("a")]);
        // Nodes share the clock: a later sequence ranks its path higher.
        lru.nodes_used(&[3, 1, 0]);
        lru.nodes_used(&[4, 1, 0]);
        assert!(lru.node_rank(3) < lru.node_rank(4));
        assert_eq!(lru.node_rank(1), lru.node_rank(4));
        assert_eq!(lru.node_rank(9), 0);
    }
}
