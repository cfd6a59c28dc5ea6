//! Look-ahead: which questions a later operator will ask about a document, so
//! that they can be asked while the document's KV is still held, and the
//! answers asked that way until their operator comes for them.
//!
//! A plan that reads one table under two names (IMDB-9's `r1` and `r2`) asks
//! about each document twice, far apart: a join's partner side runs to its
//! end before the anchors stream in. When the documents outgrow every KV tier,
//! the second visit computes each one again. So when the scheduler is about to
//! drop a document's KV, it first asks it the questions of every later
//! operator that reads the same documents under another name (an operator
//! under the same name sees the document in the same pipeline, or not at all
//! because an earlier operator dropped the row, and asking it ahead would be
//! waste). A join's questions pair the document with the join's partner side,
//! which its operator reports when collected ([`Lookahead::partners_collected`]);
//! one not collected yet is guessed by the documents of its table collected so
//! far. Questions the document was already asked under the same prompt are left
//! to the memo.
//!
//! Nothing asked ahead is free: its positions are fresh tokens like any other,
//! and those whose operator never asks for them are counted apart (unused).

use std::collections::HashMap;
use std::sync::Arc;

use crate::inference::backend::{AiCall, AiRequest, Answer};
use crate::inference::memo::{AnswerMemo, DocKey};

/// A join's partner side is asked ahead only up to this many documents: past it
/// each anchor's questions would cost more than recomputing the anchor.
pub const MAX_PARTNERS_AHEAD: usize = 64;

/// Plans with more operators than this are not looked ahead (one bit each).
const MAX_OPERATORS: usize = 64;

/// A partner document: id and text.
pub type PartnerDoc = (String, String);

/// One AI operator of the query, as the look-ahead sees it.
struct PlannedOp {
    call: AiCall,
    /// Relation of the `{0}` document (`r1`); empty when unknown.
    anchor_relation: String,
}

/// A later operator to ask about a document ahead of time, with the partners to
/// pair it with (empty for one-document questions).
pub struct AheadQuestion {
    /// The operator's call.
    pub call: AiCall,
    /// Partner documents (joins).
    pub partners: Arc<Vec<PartnerDoc>>,
}

/// The query's look-ahead state.
#[derive(Default)]
pub struct Lookahead {
    ops: Vec<PlannedOp>,
    /// Per document, the operators that asked about it (bit per position).
    asked_by: HashMap<DocKey, u64>,
    /// Partner sides collected, by operator id.
    partners: HashMap<String, Arc<Vec<PartnerDoc>>>,
    /// Partner documents collected so far, by (table, column): the guess for a
    /// join whose partner side is not collected yet.
    collected: HashMap<(String, String), Arc<Vec<PartnerDoc>>>,
    /// Operators whose questions could not be asked ahead (their answers are
    /// asked in their turn).
    disabled: Vec<bool>,
    /// Answers asked ahead, taken out as their operator asks.
    answers: AnswerMemo,
    /// Questions answered ahead and not yet asked for.
    pending: usize,
    /// Positions computed to answer ahead (fresh tokens, also counted there).
    pub tokens: u64,
    /// Questions answered ahead.
    pub questions: u64,
    /// Of those, asked for by their operator.
    pub used: u64,
}

impl Lookahead {
    /// The state for a query running `operators` in post-order.
    pub fn new(operators: &[AiCall]) -> Self {
        let answers = AnswerMemo::new(true);
        let ops: Vec<PlannedOp> = if operators.len() > MAX_OPERATORS {
            Vec::new()
        } else {
            operators
                .iter()
                .map(|c| PlannedOp {
                    call: c.clone(),
                    anchor_relation: c.relations.first().cloned().unwrap_or_default(),
                })
                .collect()
        };
        Self {
            disabled: vec![false; ops.len()],
            ops,
            answers,
            ..Self::default()
        }
    }

    fn position(&self, op_id: &str) -> Option<usize> {
        self.ops.iter().position(|o| o.call.op_id == op_id)
    }

    /// Records that `op_id` asked about `docs`.
    pub fn asked(&mut self, op_id: &str, docs: &[DocKey]) {
        let Some(pos) = self.position(op_id) else {
            return;
        };
        for d in docs {
            *self.asked_by.entry(d.clone()).or_default() |= 1 << pos;
        }
    }

    /// Forgets a document whose KV is gone.
    pub fn forget(&mut self, doc: &DocKey) {
        self.asked_by.remove(doc);
    }

    /// A join's partner side, collected before its anchors stream in.
    pub fn partners_collected(&mut self, call: &AiCall, partners: Vec<PartnerDoc>) {
        if partners.len() > MAX_PARTNERS_AHEAD || call.tables.len() < 2 {
            return;
        }
        let column = (call.tables[1].clone(), call.columns[1].clone());
        let known = self.collected.entry(column).or_default();
        let mut union: Vec<PartnerDoc> = known.as_ref().clone();
        for p in &partners {
            if !union.iter().any(|(id, _)| *id == p.0) {
                union.push(p.clone());
            }
        }
        *known = Arc::new(union);
        self.partners.insert(call.op_id.clone(), Arc::new(partners));
    }

    /// The later operators' questions to ask `doc` before its KV is dropped.
    pub fn questions_for(&self, doc: &DocKey) -> Vec<AheadQuestion> {
        let Some(&asked) = self.asked_by.get(doc) else {
            return Vec::new();
        };
        let askers: Vec<&PlannedOp> = (0..self.ops.len())
            .filter(|&i| asked & (1 << i) != 0)
            .map(|i| &self.ops[i])
            .collect();
        let Some(first) = askers.first() else {
            return Vec::new();
        };
        // Operators after the first that asked: those before it have run (post-order).
        let after = asked.trailing_zeros() as usize + 1;
        let mut out = Vec::new();
        for (pos, op) in self.ops.iter().enumerate().skip(after) {
            let c = &op.call;
            let same_documents = c.tables[0] == doc.table
                && c.columns[0] == doc.column
                && c.pieces.preamble == first.call.pieces.preamble;
            let other_relation = !op.anchor_relation.is_empty()
                && askers
                    .iter()
                    .all(|a| a.anchor_relation != op.anchor_relation);
            let asked_already = askers.iter().any(|a| a.call.asks_as(c));
            if self.disabled[pos] || !same_documents || !other_relation || asked_already {
                continue;
            }
            let partners = match (c.kind.describe().documents(), c.pieces.pair) {
                (_, false) => Arc::new(Vec::new()),
                (Some(2), true) => {
                    let known = self.partners.get(&c.op_id).or_else(|| {
                        self.collected
                            .get(&(c.tables[1].clone(), c.columns[1].clone()))
                    });
                    match known {
                        Some(p) if !p.is_empty() => p.clone(),
                        _ => continue,
                    }
                }
                // A joined-row classification pairs each row with its own
                // partner, unknown until the row arrives.
                (_, true) => continue,
            };
            out.push(AheadQuestion {
                call: c.clone(),
                partners,
            });
        }
        out
    }

    /// Stops asking `op_id`'s questions ahead (one failed: they are asked in
    /// their turn, where a failure is reported).
    pub fn disable(&mut self, op_id: &str) {
        if let Some(pos) = self.position(op_id) {
            self.disabled[pos] = true;
        }
    }

    /// Keeps answers asked ahead for `call`'s `requests`.
    pub fn store(&mut self, call: &AiCall, requests: &[AiRequest<'_>], answers: Vec<Answer>) {
        let keys = self.answers.keys(call, requests);
        // A question without an answer (failed, or the budget spent) is left
        // to its operator, which settles it in its turn.
        for (k, a) in keys.into_iter().zip(answers) {
            if !a.is_answer() {
                continue;
            }
            if self.answers.remove(&k).is_none() {
                self.pending += 1;
                self.questions += 1;
            }
            self.answers.insert(k, a);
        }
    }

    /// Answers asked ahead for `requests` of `call` (None where not asked),
    /// each handed out once.
    pub fn take(&mut self, call: &AiCall, requests: &[AiRequest<'_>]) -> Vec<Option<Answer>> {
        if self.pending == 0 {
            return vec![None; requests.len()];
        }
        let keys = self.answers.keys(call, requests);
        keys.iter()
            .map(|k| {
                let a = self.answers.remove(k);
                if a.is_some() {
                    self.pending -= 1;
                    self.used += 1;
                }
                a
            })
            .collect()
    }

    /// Questions answered ahead that no operator asked for (so far).
    pub fn unused(&self) -> usize {
        self.pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inference::backend::{AiKind, Doc};
    use crate::inference::prompt::{PromptFormat, filter_pieces, join_pieces};

    fn join(op: &str, relation: &str, template: &str) -> AiCall {
        AiCall {
            op_id: op.into(),
            kind: AiKind::Join,
            template: template.into(),
            tables: vec!["reviews".into(), "aspects".into()],
            columns: vec!["body".into(), "aspect".into()],
            pieces: join_pieces(PromptFormat::default(), template),
            labels: Vec::new(),
            max_tokens: 0,
            descriptions: Vec::new(),
            relations: vec![relation.into(), "a".into()],
        }
    }

    fn filter(op: &str, relation: &str, template: &str) -> AiCall {
        AiCall {
            op_id: op.into(),
            kind: AiKind::Filter,
            template: template.into(),
            tables: vec!["reviews".into()],
            columns: vec!["body".into()],
            pieces: filter_pieces(PromptFormat::default(), template).unwrap(),
            labels: Vec::new(),
            max_tokens: 0,
            descriptions: Vec::new(),
            relations: vec![relation.into()],
        }
    }

    fn aspects(n: usize) -> Vec<PartnerDoc> {
        (0..n)
            .map(|i| (format!("as{i}"), format!("aspect {i}")))
            .collect()
    }

    fn ids(q: &[AheadQuestion]) -> Vec<&str> {
        q.iter().map(|q| q.call.op_id.as_str()).collect()
    }

    /// IMDB-10's shape: filter-1 and join-1 on r1; join-2 (join-1's prompt) and
    /// join-3 on r2.
    fn imdb10() -> Vec<AiCall> {
        vec![
            filter("filter-1", "r1", "Is {0} positive?"),
            join("join-1", "r1", "Does {0} discuss {1}?"),
            join("join-2", "r2", "Does {0} discuss {1}?"),
            join("join-3", "r2", "Does {0} like {1}?"),
        ]
    }

    #[test]
    fn later_operators_under_another_name_are_asked_ahead() {
        let ops = imdb10();
        let mut la = Lookahead::new(&ops);
        la.partners_collected(&ops[3], aspects(3));
        la.partners_collected(&ops[1], aspects(4));
        let doc = DocKey::new("reviews", "body", "r7");
        la.asked("filter-1", std::slice::from_ref(&doc));
        // Not asked by join-1 (filtered out): join-2 guessed by the aspects
        // collected so far (4 distinct), join-3 by its own partner side.
        let q = la.questions_for(&doc);
        assert_eq!(ids(&q), ["join-2", "join-3"]);
        assert_eq!(q[0].partners.len(), 4);
        assert_eq!(q[1].partners.len(), 3);
        // Asked by join-1: join-2's prompt is the memo's, only join-3 is left.
        la.asked("join-1", std::slice::from_ref(&doc));
        assert_eq!(ids(&la.questions_for(&doc)), ["join-3"]);
        // Once r2's pipeline has asked about it, join-3 sees it there.
        la.asked("join-2", &[]);
        assert_eq!(ids(&la.questions_for(&doc)), ["join-3"]);
        la.asked("join-2", std::slice::from_ref(&doc));
        assert!(la.questions_for(&doc).is_empty());
        // Operators before the first that asked have run: not asked ahead.
        let other = DocKey::new("reviews", "body", "r8");
        la.asked("join-2", std::slice::from_ref(&other));
        assert!(la.questions_for(&other).is_empty());
        // A document no operator asked about, or a forgotten one: nothing.
        la.forget(&doc);
        assert!(la.questions_for(&doc).is_empty());
    }

    #[test]
    fn the_same_relation_or_an_unknown_partner_side_is_not_asked_ahead() {
        // IMDB-13's shape: one relation throughout.
        let ops = vec![
            filter("filter-1", "r", "Is {0} negative?"),
            join("join-1", "r", "Does {0} discuss {1}?"),
        ];
        let mut la = Lookahead::new(&ops);
        la.partners_collected(&ops[1], aspects(3));
        let doc = DocKey::new("reviews", "body", "r1");
        la.asked("filter-1", std::slice::from_ref(&doc));
        assert!(la.questions_for(&doc).is_empty());
        // Another relation, but no partner of the table collected yet.
        let ops = vec![
            filter("filter-1", "r1", "Is {0} negative?"),
            join("join-1", "r2", "Does {0} discuss {1}?"),
        ];
        let mut la = Lookahead::new(&ops);
        la.asked("filter-1", std::slice::from_ref(&doc));
        assert!(la.questions_for(&doc).is_empty());
        // A partner side too large to ask each anchor about.
        la.partners_collected(&ops[1], aspects(MAX_PARTNERS_AHEAD + 1));
        assert!(la.questions_for(&doc).is_empty());
        la.partners_collected(&ops[1], aspects(2));
        assert_eq!(ids(&la.questions_for(&doc)), ["join-1"]);
        la.disable("join-1");
        assert!(la.questions_for(&doc).is_empty());
    }

    #[test]
    fn answers_asked_ahead_are_handed_out_once_and_unused_ones_counted() {
        let ops = imdb10();
        let mut la = Lookahead::new(&ops);
        let req = |a: &'static str, p: &'static str| AiRequest {
            anchor: Doc { id: a, text: "" },
            partner: Some(Doc { id: p, text: "" }),
        };
        la.store(
            &ops[3],
            &[req("r1", "as0"), req("r1", "as1")],
            vec![Answer::Bool(true), Answer::Bool(false)],
        );
        assert_eq!(la.questions, 2);
        assert_eq!(la.unused(), 2);
        // join-2's prompt differs: not answered.
        assert_eq!(la.take(&ops[2], &[req("r1", "as0")]), [None]);
        assert_eq!(
            la.take(&ops[3], &[req("r1", "as1"), req("r2", "as1")]),
            [Some(Answer::Bool(false)), None]
        );
        assert_eq!(la.take(&ops[3], &[req("r1", "as1")]), [None]);
        assert_eq!((la.used, la.unused()), (1, 1));
    }
}
