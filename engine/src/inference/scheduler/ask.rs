//! Asking the model: the one loop that hands prompts whose KV is held (or,
//! without a prefix cache, whole prompts) to the executor in forward
//! batches, for the operator's calls and for the questions asked ahead.

use std::sync::Arc;

use super::lookahead::{AheadQuestion, Lookahead};
use super::prompts::PromptTokens;
use super::spend_gate::unreached_after;
use super::tiers::KvTiers;
use super::{
    Executor, GENERATING_REQUESTS_PER_CALL, QueryTicket, ScheduledBackend, chunk_by_tokens,
};
use crate::error::{EngineError, Result};
use crate::inference::backend::{AiCall, AiRequest, Answer, Doc};
use crate::inference::kv_cache::{KvOps, NodeId};
use crate::inference::memo::DocKey;

impl<E: Executor> ScheduledBackend<E> {
    /// One-document questions whose whole prompt is the KV of `nodes` (one
    /// per request).
    pub(super) fn ask_one(
        &self,
        ticket: &QueryTicket,
        tiers: &KvTiers<E::Kv>,
        call: &AiCall,
        tokens: &PromptTokens,
        nodes: &[(DocKey, NodeId)],
        requests: &[AiRequest<'_>],
    ) -> Result<Vec<Answer>> {
        self.ask(
            ticket,
            call,
            tokens,
            requests,
            |_| 0,
            |j| {
                let (k, n) = &nodes[j];
                (tiers.question_kv(k, *n), &[][..])
            },
        )
    }

    /// Pair questions: `label + partner + tail` packed after the KV of
    /// `nodes` (`preamble + anchor + frame`, one per request); `partners`
    /// are the partner documents' token ids. A prompt longer than the
    /// model's context is an error here (the operator's own calls were
    /// checked before; this catches the questions asked ahead).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn ask_pairs(
        &self,
        ticket: &QueryTicket,
        tiers: &KvTiers<E::Kv>,
        call: &AiCall,
        tokens: &PromptTokens,
        nodes: &[(DocKey, NodeId)],
        requests: &[AiRequest<'_>],
        partners: &[Arc<Vec<u32>>],
    ) -> Result<Vec<Answer>> {
        let suffixes: Vec<Vec<u32>> = partners.iter().map(|p| tokens.partner_suffix(p)).collect();
        for (j, r) in requests.iter().enumerate() {
            let (k, n) = &nodes[j];
            let anchor_len = tiers.question_kv(k, *n).map_or(0, |kv| kv.len());
            let positions = anchor_len + suffixes[j].len() + tokens.answer_positions;
            if let Some(message) = self.context_overflow(call, r, positions) {
                return Err(EngineError::Inference(message));
            }
        }
        self.ask(
            ticket,
            call,
            tokens,
            requests,
            |j| suffixes[j].len(),
            |j| {
                let (k, n) = &nodes[j];
                (tiers.question_kv(k, *n), suffixes[j].as_slice())
            },
        )
    }

    /// Asks `requests` in forward batches of at most `batch_tokens` suffix
    /// positions; `item(i)` is request `i`'s (prefix KV, suffix) and
    /// `suffix_len(i)` its suffix length. A generating call is asked
    /// [`GENERATING_REQUESTS_PER_CALL`] requests at a time, so that a stopped
    /// query (`--timeout-s`, an interrupt, a spent budget) waits for at most
    /// one such group's decoding, not a whole batch's. Requests left when the
    /// spend budget ran out are [`Answer::Unreached`].
    pub(super) fn ask<'a>(
        &self,
        ticket: &QueryTicket,
        call: &AiCall,
        tokens: &PromptTokens,
        requests: &[AiRequest<'_>],
        suffix_len: impl Fn(usize) -> usize,
        item: impl Fn(usize) -> (Option<&'a E::Kv>, &'a [u32]),
    ) -> Result<Vec<Answer>>
    where
        E::Kv: 'a,
    {
        let order: Vec<usize> = (0..requests.len()).collect();
        let mut answers = Vec::with_capacity(requests.len());
        let most = if call.kind.generates() {
            GENERATING_REQUESTS_PER_CALL
        } else {
            usize::MAX
        };
        'chunks: for chunk in chunk_by_tokens(&order, self.config.batch_tokens, |&i| suffix_len(i))
        {
            for group in chunk.chunks(most) {
                let items: Vec<(Option<&E::Kv>, &[u32])> = group.iter().map(|&i| item(i)).collect();
                let reqs: Vec<AiRequest<'_>> = group.iter().map(|&i| requests[i]).collect();
                let asked = self.forward(ticket, &call.op_id, |stopped| {
                    self.exec
                        .answer(call, &reqs, &items, &tokens.labels, stopped)
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
    pub(super) fn ask_ahead_one(
        &self,
        ticket: &QueryTicket,
        tiers: &mut KvTiers<E::Kv>,
        lookahead: &mut Lookahead,
        doc: &DocKey,
        q: &AheadQuestion,
    ) -> Result<()> {
        let call = &q.call;
        let pair = call.pieces.pair;
        let tokens = self.prompt_tokens(call)?;
        let one = std::slice::from_ref(doc);
        let node =
            self.question_nodes(ticket, tiers, &call.op_id, one, tokens.question(), !pair)?[doc];
        // The document's text is in its KV; executors read the ids.
        let anchor = Doc {
            id: &doc.id,
            text: "",
        };
        let requests: Vec<AiRequest<'_>> = if pair {
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
        let answers = if pair {
            let texts: Vec<&str> = q.partners.iter().map(|(_, text)| text.as_str()).collect();
            let partners = self.docs(&call.tables[1], &texts)?;
            self.ask_pairs(ticket, tiers, call, &tokens, &nodes, &requests, &partners)?
        } else {
            self.ask_one(ticket, tiers, call, &tokens, &nodes, &requests)?
        };
        lookahead.store(call, &requests, answers);
        Ok(())
    }

    /// `--prefix-cache off`: every prompt from its first token.
    pub(super) fn run_uncached(
        &self,
        ticket: &QueryTicket,
        call: &AiCall,
        requests: &[AiRequest<'_>],
    ) -> Result<Vec<Answer>> {
        let tokens = self.prompt_tokens(call)?;
        let (anchors, partners) = self.request_docs(call, requests)?;
        let prompts: Vec<Vec<u32>> = (0..requests.len())
            .map(|i| tokens.whole(&anchors[i], partners.get(i).map(|p| p.as_slice())))
            .collect();
        let mut answers = self.overflowing(call, &tokens, requests, &anchors, &partners);
        let fitting: Vec<usize> = (0..requests.len())
            .filter(|&i| answers[i].is_none())
            .collect();
        let asked: Vec<AiRequest<'_>> = fitting.iter().map(|&i| requests[i]).collect();
        let got = self.ask(
            ticket,
            call,
            &tokens,
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
