//! A call's prompt pieces as token ids, the one place prompts are put
//! together from them, and the one check that a prompt fits the model's
//! context.
//!
//! Every prompt is `preamble + anchor + frame + [label + partner] + tail`
//! (the label and partner for pair calls only), followed by the answer's
//! positions: the longest label continuation, plus `max_tokens` for a
//! generation. The cached path computes `preamble + anchor` in the document
//! trie and the question (`tail`, or `frame` for pairs) in the document's
//! question trie; the uncached path computes it whole.

use std::sync::Arc;

use super::{Executor, ScheduledBackend};
use crate::error::Result;
use crate::inference::backend::{AiCall, AiRequest, Answer};
use crate::inference::prompt::{Excerpt, label_continuations};

/// The token ids of some documents, one entry per request.
pub(super) type DocTokens = Vec<Arc<Vec<u32>>>;

/// The token ids of a call's prompt pieces and answer continuations.
pub(super) struct PromptTokens {
    preamble: Arc<Vec<u32>>,
    frame: Arc<Vec<u32>>,
    label: Arc<Vec<u32>>,
    tail: Arc<Vec<u32>>,
    pair: bool,
    /// What is scored or prefilled after a prompt: label continuations, or
    /// an extraction's field questions.
    pub(super) labels: Vec<Vec<u32>>,
    /// Positions an answer adds after its prompt: the longest label, plus a
    /// generating call's `max_tokens`.
    pub(super) answer_positions: usize,
}

impl PromptTokens {
    /// The preamble every prompt opens with.
    pub(super) fn preamble(&self) -> &[u32] {
        &self.preamble
    }

    /// What is asked right after a document, cached on its question trie:
    /// the tail, or for pairs the frame (the partner follows).
    pub(super) fn question(&self) -> &[u32] {
        if self.pair { &self.frame } else { &self.tail }
    }

    /// `label + partner + tail`: what a pair asks after its anchor's question.
    pub(super) fn partner_suffix(&self, partner: &[u32]) -> Vec<u32> {
        [self.label.as_slice(), partner, self.tail.as_slice()].concat()
    }

    /// The whole prompt of `anchor` (and `partner` for a pair).
    pub(super) fn whole(&self, anchor: &[u32], partner: Option<&[u32]>) -> Vec<u32> {
        let mut v = Vec::new();
        v.extend_from_slice(&self.preamble);
        v.extend_from_slice(anchor);
        v.extend_from_slice(&self.frame);
        if let Some(p) = partner {
            v.extend_from_slice(&self.label);
            v.extend_from_slice(p);
        }
        v.extend_from_slice(&self.tail);
        v
    }

    /// Positions of a prompt over documents of `anchor` and `partner` tokens
    /// (0 for one-document calls), its answer's included.
    pub(super) fn positions(&self, anchor: usize, partner: usize) -> usize {
        let mut fixed = self.preamble.len() + self.tail.len() + self.answer_positions;
        if self.pair {
            fixed += self.frame.len() + self.label.len();
        }
        fixed + anchor + partner
    }
}

impl<E: Executor> ScheduledBackend<E> {
    /// `call`'s pieces and answer continuations as token ids.
    pub(super) fn prompt_tokens(&self, call: &AiCall) -> Result<PromptTokens> {
        let p = &call.pieces;
        let labels: Vec<Vec<u32>> = answer_pieces(call)
            .iter()
            .map(|l| self.piece(l).map(|v| v.as_ref().clone()))
            .collect::<Result<_>>()?;
        let longest = labels.iter().map(Vec::len).max().unwrap_or(0);
        let answer_positions = if call.kind.generates() {
            longest + call.max_tokens as usize
        } else {
            longest
        };
        Ok(PromptTokens {
            preamble: self.piece(&p.preamble)?,
            frame: self.piece(&p.frame)?,
            label: self.piece(&p.label)?,
            tail: self.piece(&p.tail)?,
            pair: p.pair,
            labels,
            answer_positions,
        })
    }

    /// Why request `r`'s prompt of `positions` (its answer's included) does
    /// not fit the model's context, `None` when it does: past
    /// `max_position_embeddings` its answer would be silently wrong, so the
    /// row is named instead (a row by its id, an [`Excerpt`]: the id may be
    /// the document). Formatted only on overflow: this runs for every pair.
    pub(super) fn context_overflow(
        &self,
        call: &AiCall,
        r: &AiRequest<'_>,
        positions: usize,
    ) -> Option<String> {
        let max = self.exec.max_positions();
        (positions > max).then(|| {
            let (row, table) = match r.partner {
                Some(partner) => (
                    format!("{} × {}", Excerpt(r.anchor.id), Excerpt(partner.id)),
                    format!("{} × {}", call.tables[0], call.tables[1]),
                ),
                None => (Excerpt(r.anchor.id).to_string(), call.tables[0].clone()),
            };
            format!(
                "{}: the prompt for row {row} of {table} is {positions} tokens with its \
                 answer's (the longest label, or a generation's max_tokens), longer than the \
                 model's context of {max} positions (max_position_embeddings); shorten that \
                 document or max_tokens, leave the row out with a WHERE clause, or give \
                 --on-row-error null to make its value NULL",
                call.op_id
            )
        })
    }
}

/// The texts scored or prefilled after a prompt: label continuations, or
/// an extraction's field questions.
fn answer_pieces(call: &AiCall) -> Vec<String> {
    if call.kind.describe().asks_per_field() {
        call.descriptions.clone()
    } else {
        label_continuations(&call.labels)
    }
}

impl<E: Executor> ScheduledBackend<E> {
    /// The token ids of each request's anchor document and, for a pair
    /// call, of its partner (empty otherwise).
    pub(super) fn request_docs(
        &self,
        call: &AiCall,
        requests: &[AiRequest<'_>],
    ) -> Result<(DocTokens, DocTokens)> {
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
        Ok((anchors, partners))
    }

    /// Per request, [`Answer::Failed`] naming its row when its prompt does
    /// not fit the model's context ([`Self::context_overflow`]); `None` for
    /// the requests that fit. `anchors` and `partners` are the requests'
    /// documents' token ids ([`Self::request_docs`]).
    pub(super) fn overflowing(
        &self,
        call: &AiCall,
        tokens: &PromptTokens,
        requests: &[AiRequest<'_>],
        anchors: &[Arc<Vec<u32>>],
        partners: &[Arc<Vec<u32>>],
    ) -> Vec<Option<Answer>> {
        requests
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let partner = partners.get(i).map_or(0, |t| t.len());
                let positions = tokens.positions(anchors[i].len(), partner);
                self.context_overflow(call, r, positions)
                    .map(|m| Answer::Failed(m.into()))
            })
            .collect()
    }
}
