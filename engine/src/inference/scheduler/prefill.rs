//! Building the KV of a call's prompts: the scheduler inserts them in the
//! tiers, asks the tiers which nodes still need KV, computes those in
//! forward batches through the spend gate and hands the KV back
//! ([`KvTiers`] alone touches its tries).

use std::collections::HashMap;
use std::sync::Arc;

use super::prompts::PromptTokens;
use super::tiers::{KvNode, KvTiers};
use super::{
    DROPPED_DOCUMENT_STUB_TOKENS, Executor, QueryTicket, ScheduledBackend, chunk_by_tokens,
};
use crate::error::{EngineError, Result};
use crate::inference::backend::{AiCall, AiRequest};
use crate::inference::kv_cache::{KvOps, NodeId};
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
        }
        tiers.docs_used(&keys);
        // KV moved to the host comes back by copy, never recomputed.
        let restored = tiers.restore_docs(&leaves)?;
        let waves = tiers.doc_waves(&leaves);
        self.compute(ticket, &call.op_id, tiers, waves)?;
        tiers.count_restored(restored);
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
