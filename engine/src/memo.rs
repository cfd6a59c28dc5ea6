//! The one answer memo of a query: a question asked once — the same prompt of
//! the same document or pair — is not asked again, whichever AI operator asks
//! it (a join repeated with the same template, a row repeated after a join, a
//! document seen in an earlier batch).
//!
//! A prompt is named by its kind and exact pieces, numbered in the order first
//! asked (two different prompts never share answers, which a hash could not
//! promise), and a document by its table, text column and id ([`DocKey`]).

use std::collections::HashMap;

use crate::backend::{AiCall, AiKind, AiRequest};
use crate::prompt::PromptPieces;

/// One document: its table, text column and row id. Typed, so a table or column
/// whose name holds a dot cannot make two documents one key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DocKey {
    /// Table of the document.
    pub table: String,
    /// Its text column.
    pub column: String,
    /// Its row id.
    pub id: String,
}

impl DocKey {
    /// The key of document `id` of `table.column`.
    pub fn new(table: &str, column: &str, id: &str) -> Self {
        Self {
            table: table.to_string(),
            column: column.to_string(),
            id: id.to_string(),
        }
    }
}

/// A question: the prompt's number, the `{0}` document and the `{1}` document.
pub type MemoKey = (u32, DocKey, Option<DocKey>);

/// Answers given so far in one query: a TRUE/FALSE as 0/1, a label as its index.
#[derive(Debug, Default)]
pub struct AnswerMemo {
    /// Prompt numbers by kind, pieces and — when operators do not share
    /// answers — operator id.
    prompts: HashMap<(AiKind, PromptPieces, Option<String>), u32>,
    answers: HashMap<MemoKey, u16>,
    /// Each operator keeps its own answers (a backend that reuses no work: the
    /// input-token baseline).
    per_operator: bool,
}

impl AnswerMemo {
    /// Forgets everything for a new query; `shared` says whether operators
    /// share answers ([`crate::backend::InferenceBackend::reuses_work`]).
    pub fn reset(&mut self, shared: bool) {
        self.prompts.clear();
        self.answers.clear();
        self.per_operator = !shared;
    }

    /// The key of `request` asked by `call`.
    pub fn key(&mut self, call: &AiCall, request: &AiRequest<'_>) -> MemoKey {
        self.keys(call, std::slice::from_ref(request)).remove(0)
    }

    /// The keys of `requests`, all asked by `call` (its prompt is looked up once).
    pub fn keys(&mut self, call: &AiCall, requests: &[AiRequest<'_>]) -> Vec<MemoKey> {
        let next = self.prompts.len() as u32;
        let prompt = *self
            .prompts
            .entry((
                call.kind,
                call.pieces.clone(),
                self.per_operator.then(|| call.op_id.clone()),
            ))
            .or_insert(next);
        let doc = |slot: usize, id: &str| {
            DocKey::new(
                call.tables.get(slot).map_or("", String::as_str),
                call.columns.get(slot).map_or("", String::as_str),
                id,
            )
        };
        requests
            .iter()
            .map(|request| {
                (
                    prompt,
                    doc(0, request.anchor.id),
                    request.partner.map(|p| doc(1, p.id)),
                )
            })
            .collect()
    }

    /// The answer to a question asked before.
    pub fn get(&self, key: &MemoKey) -> Option<u16> {
        self.answers.get(key).copied()
    }

    /// Takes an answer out.
    pub fn remove(&mut self, key: &MemoKey) -> Option<u16> {
        self.answers.remove(key)
    }

    /// Records an answer.
    pub fn insert(&mut self, key: MemoKey, answer: u16) {
        self.answers.insert(key, answer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Doc;
    use crate::prompt::{PromptFormat, filter_pieces, join_pieces};

    fn call(op: &str, kind: AiKind, pieces: PromptPieces) -> AiCall {
        AiCall {
            op_id: op.into(),
            kind,
            template: String::new(),
            tables: vec!["a.b".into(), "c".into()],
            columns: vec!["text".into(), "text".into()],
            pieces,
            labels: Vec::new(),
            descriptions: Vec::new(),
            relations: Vec::new(),
        }
    }

    #[test]
    fn one_prompt_of_one_document_is_one_question() {
        let f = PromptFormat::default();
        let mut memo = AnswerMemo::default();
        memo.reset(true);
        let j1 = call("join-1", AiKind::Join, join_pieces(f, "Does {0} cite {1}?"));
        let j3 = call("join-3", AiKind::Join, join_pieces(f, "Does {0} cite {1}?"));
        let j2 = call(
            "join-2",
            AiKind::Join,
            join_pieces(f, "Does {0} refute {1}?"),
        );
        let r = AiRequest {
            anchor: Doc { id: "x", text: "" },
            partner: Some(Doc { id: "y", text: "" }),
        };
        let k = memo.key(&j1, &r);
        memo.insert(k.clone(), 1);
        // Another operator with the same prompt: answered.
        let k3 = memo.key(&j3, &r);
        assert_eq!(memo.get(&k3), Some(1));
        // Another prompt, or another document: not.
        let k2 = memo.key(&j2, &r);
        assert_eq!(memo.get(&k2), None);
        let f1 = call(
            "filter-1",
            AiKind::Filter,
            filter_pieces(f, "Is {0} ok?").unwrap(),
        );
        let one = AiRequest {
            anchor: Doc { id: "x", text: "" },
            partner: None,
        };
        let k1 = memo.key(&f1, &one);
        assert_eq!(memo.get(&k1), None);
        // Operators that do not share: the same prompt is another question.
        memo.reset(false);
        assert_eq!(memo.get(&k), None);
        let k = memo.key(&j1, &r);
        memo.insert(k, 1);
        let k3 = memo.key(&j3, &r);
        assert_eq!(memo.get(&k3), None);
    }
}
