//! Building the KV of a call's prompts: the scheduler inserts them in the
//! tiers, asks the tiers which nodes still need KV, computes those in
//! forward batches through the spend gate and hands the KV back
//! ([`KvTiers`] alone touches its tries).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::prompts::PromptTokens;
use super::tiers::{KvNode, KvTiers};
use super::{
    DROPPED_DOCUMENT_STUB_TOKENS, Executor, QueryTicket, ScheduledBackend, chunk_by_tokens,
};
use crate::error::{EngineError, Result};
use crate::inference::backend::{AiCall, AiRequest};
use crate::inference::kv_cache::{KvOps, NodeId};
use crate::inference::kv_store::Lookup;
use crate::inference::memo::DocKey;
use crate::inference::prompt::Excerpt;

impl<E: Executor> ScheduledBackend<E> {
    /// Computes the KV of `waves` (from the tiers: each wave's parents are
    /// computed by the waves before) in forward batches of at most
    /// `batch_tokens`, and hands it to the tiers.
    pub(super) fn compute(
        &self,
        ticket: &QueryTicket,
        op_id: &str,
        tiers: &mut KvTiers<E::Kv>,
        waves: Vec<Vec<KvNode>>,
    ) -> Result<()> {
        for wave in waves {
            for chunk in chunk_by_tokens(&wave, self.config.batch_tokens, |n| {
                tiers.pending_item(n).1.len()
            }) {
                let items: Vec<(Option<&E::Kv>, &[u32])> =
                    chunk.iter().map(|n| tiers.pending_item(n)).collect();
                let handles = self.forward(ticket, op_id, |_| self.exec.prefill(&items))?;
                for (n, h) in chunk.iter().zip(handles) {
                    tiers.set_kv(n, h);
                }
            }
        }
        Ok(())
    }

    /// The KV of `preamble + document` for each request's anchor (its token
    /// ids in `anchors`), computed once, then of the call's question after
    /// it: each request's node in its document's question trie.
    pub(super) fn anchor_prompts(
        &self,
        ticket: &QueryTicket,
        tiers: &mut KvTiers<E::Kv>,
        call: &AiCall,
        prompt: &PromptTokens,
        requests: &[AiRequest<'_>],
        anchors: &[Arc<Vec<u32>>],
    ) -> Result<Vec<(DocKey, NodeId)>> {
        let preamble = prompt.preamble();
        let suffix = prompt.question();
        let kv_budget_tokens = self.config.kv_budget_bytes / self.exec.kv_bytes_per_token().max(1);
        tiers.keep_stubs_of(preamble.len() + DROPPED_DOCUMENT_STUB_TOKENS);
        let mut leaves = Vec::with_capacity(requests.len());
        let mut keys = Vec::with_capacity(requests.len());
        let mut seqs = Vec::with_capacity(if self.store.is_some() {
            requests.len()
        } else {
            0
        });
        for (r, doc) in requests.iter().zip(anchors) {
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
            seq.extend_from_slice(preamble);
            seq.extend_from_slice(doc);
            let key = DocKey::new(&call.tables[0], &call.columns[0], r.anchor.id);
            leaves.push(tiers.insert_doc(key.clone(), &seq)?);
            keys.push(key);
            if self.store.is_some() {
                seqs.push(seq);
            }
        }
        tiers.docs_used(&keys);
        // KV moved to the host comes back by copy, never recomputed.
        let restored = tiers.restore_docs(&leaves)?;
        // What neither tier holds, the on-disk store may.
        let computed = self.read_stored(tiers, &leaves, &seqs)?;
        let waves = tiers.doc_waves(&leaves);
        self.compute(ticket, &call.op_id, tiers, waves)?;
        tiers.count_restored(restored);
        self.write_stored(tiers, &computed)?;
        // A pair's question (its frame) is not scored: the partner follows.
        let scored = !call.pieces.pair;
        let targets = self.question_nodes(ticket, tiers, &call.op_id, &keys, suffix, scored)?;
        Ok(keys
            .into_iter()
            .map(|k| {
                let n = targets[&k];
                (k, n)
            })
            .collect())
    }

    /// Fills from the on-disk KV store ([`crate::inference::kv_store`]) the
    /// KV of documents `leaves` (whole sequences `seqs`) that neither tier
    /// holds; a block that fails its checks, or does not fit the model, is
    /// counted and its KV computed. Returns the documents still to compute,
    /// with their sequences, for [`Self::write_stored`]. Nothing without a
    /// store.
    fn read_stored<'s>(
        &self,
        tiers: &mut KvTiers<E::Kv>,
        leaves: &[NodeId],
        seqs: &'s [Vec<u32>],
    ) -> Result<Vec<(NodeId, &'s [u32])>> {
        let Some(store) = &self.store else {
            return Ok(Vec::new());
        };
        let all: HashSet<NodeId> = leaves.iter().copied().collect();
        let mut seen = HashSet::new();
        let mut todo = Vec::new();
        for (&leaf, seq) in leaves.iter().zip(seqs) {
            if !seen.insert(leaf) || tiers.has_doc_kv(leaf) {
                continue;
            }
            let (parent, path) = tiers.missing_doc_path(leaf);
            let parent = parent.cloned();
            // Another document of the call ending inside this one's path
            // would get a view without an output: it is computed instead.
            let inner_doc = path[..path.len() - 1].iter().any(|(n, _)| all.contains(n));
            if !inner_doc {
                let start = parent.as_ref().map_or(0, KvOps::len);
                let cuts: Vec<usize> = std::iter::once(start)
                    .chain(path.iter().map(|&(_, depth)| depth))
                    .collect();
                let nodes: Vec<NodeId> = path.iter().map(|&(n, _)| n).collect();
                if let Some(stand_ins) = self.exec.stored_stand_ins(parent.as_ref(), &cuts) {
                    // An estimate: what the store holds is read, not computed.
                    if store.contains(seq) {
                        tiers.set_stored(&nodes, stand_ins, seq.len() - start, 0);
                        continue;
                    }
                    todo.push((leaf, seq.as_slice()));
                    continue;
                }
                match store.get(seq) {
                    Lookup::Hit(bytes) => {
                        match self.exec.kv_from_bytes(parent.as_ref(), &bytes, &cuts) {
                            Ok(handles) => {
                                tiers.set_stored(&nodes, handles, seq.len() - start, bytes.len());
                                continue;
                            }
                            Err(_) => tiers.count_stored_rejected(),
                        }
                    }
                    Lookup::Rejected(_) => tiers.count_stored_rejected(),
                    Lookup::Miss => {}
                }
            }
            todo.push((leaf, seq.as_slice()));
        }
        Ok(todo)
    }

    /// Keeps in the store the KV just computed for `computed` (of
    /// [`Self::read_stored`]). A store that cannot be written (a full disk,
    /// a folder made read-only) costs later queries their reuse, not this
    /// query its answers: it is said once, on standard error.
    fn write_stored(
        &self,
        tiers: &mut KvTiers<E::Kv>,
        computed: &[(NodeId, &[u32])],
    ) -> Result<()> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        for &(leaf, seq) in computed {
            let Some(kv) = tiers.doc_kv_to_store(leaf) else {
                continue;
            };
            let written = self
                .exec
                .kv_to_bytes(kv)
                .and_then(|b| b.map_or(Ok(0), |bytes| store.put(seq, &bytes)));
            match written {
                Ok(n) => tiers.count_stored_written(n),
                Err(e) => {
                    if !self.store_failed.swap(true, Ordering::SeqCst) {
                        let _ = crate::errln!(
                            "warning: the KV store {} could not be written ({e}); queries go on without keeping their KV there",
                            store.root().display()
                        );
                    }
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// The KV of `suffix` after each document of `keys` (whose own KV is held):
    /// a node of the document's question trie, computed once per document.
    pub(super) fn question_nodes(
        &self,
        ticket: &QueryTicket,
        tiers: &mut KvTiers<E::Kv>,
        op_id: &str,
        keys: &[DocKey],
        suffix: &[u32],
        scored: bool,
    ) -> Result<HashMap<DocKey, NodeId>> {
        // The suffix is computed once per document, on its question trie.
        let mut targets: HashMap<DocKey, NodeId> = HashMap::new();
        for key in keys {
            if targets.contains_key(key) {
                continue;
            }
            let node = tiers.insert_question(key, suffix)?;
            targets.insert(key.clone(), node);
        }
        let restored = tiers.restore_questions(&targets)?;
        tiers.count_restored(restored);
        let waves = tiers.question_waves(&targets);
        self.compute(ticket, op_id, tiers, waves)?;
        for (key, &node) in targets.iter().filter(|_| scored) {
            if let Some(kv) = tiers.question_view(key, node) {
                // The view covers the document and the question: all of it
                // but the last position, whose hidden state is computed again.
                let shorter = kv.prefix(kv.len() - 1)?;
                let last = [suffix[suffix.len() - 1]];
                let h = self
                    .forward(ticket, op_id, |_| {
                        self.exec.prefill(&[(Some(&shorter), &last[..])])
                    })?
                    .remove(0);
                tiers.set_kv(&KvNode::Question(key.clone(), node), h);
            }
        }
        Ok(targets)
    }
}
