//! The one answer memo of a query: a question asked once — the same prompt of
//! the same document or pair — is not asked again, whichever AI operator asks
//! it (a join repeated with the same template, a row repeated after a join, a
//! document seen in an earlier batch).
//!
//! A prompt is named by its kind and exact pieces, numbered in the order first
//! asked (two different prompts never share answers, which a hash could not
//! promise), and a document by its table, text column and id, numbered the
//! same way. A question's key is those numbers: a join asks one question per
//! document pair (BIO-2 at sf 1.0: 20.7 M of them), and a key that held the
//! documents' names cost hundreds of bytes per question.
//!
//! An id names one text within a query, and the memo lives for one query
//! ([`AnswerMemo::reset`]): a table is keyed by its `id` column only when its
//! ids are checked unique as it is loaded, otherwise the "id" is the text
//! itself. What outlives a query is keyed by content: the scheduler's token ids
//! by the SHA-256 of their text, the answer cache by a hash of the rendered prompt.

use std::collections::HashMap;

use crate::inference::backend::{AiCall, AiKind, AiRequest, Answer};
use crate::inference::prompt::PromptPieces;

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

/// A question: the prompt's number, the `{0}` document's number and the `{1}`
/// document's ([`NO_DOCUMENT`] for a one-document question).
pub type MemoKey = (u32, u32, u32);

/// The `{1}` document number of a question that has none.
pub const NO_DOCUMENT: u32 = u32::MAX;

/// What makes two calls' prompts one question: the kind, the rendered pieces
/// and what the answer depends on besides them — an extraction's fields (its
/// pieces are the same for any fields), a generation's `max_tokens` — and,
/// when operators do not share answers, the operator.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct PromptKey {
    kind: AiKind,
    pieces: PromptPieces,
    labels: Vec<String>,
    descriptions: Vec<String>,
    max_tokens: u32,
    operator: Option<String>,
}

/// Document numbers by table, text column and id, each level looked up by
/// `&str`, so numbering a known document allocates nothing.
type DocumentNumbers = HashMap<String, HashMap<String, HashMap<String, u32>>>;

/// Answers given so far in one query, typed.
#[derive(Debug, Default)]
pub struct AnswerMemo {
    /// Prompt numbers by kind, pieces and — when operators do not share
    /// answers — operator id.
    prompts: HashMap<PromptKey, u32>,
    documents: DocumentNumbers,
    /// Documents numbered so far, in all tables.
    document_count: u32,
    answers: HashMap<MemoKey, Answer>,
    /// Each operator keeps its own answers (a backend that reuses no work: the
    /// input-token baseline).
    per_operator: bool,
}

impl AnswerMemo {
    /// An empty memo for a new query; `shared` says whether operators share
    /// answers ([`crate::inference::backend::InferenceBackend::reuses_work`]).
    pub fn new(shared: bool) -> Self {
        Self {
            per_operator: !shared,
            ..Self::default()
        }
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
            .entry(PromptKey {
                kind: call.kind,
                pieces: call.pieces.clone(),
                labels: call.labels.clone(),
                descriptions: call.descriptions.clone(),
                max_tokens: call.max_tokens,
                operator: self.per_operator.then(|| call.op_id.clone()),
            })
            .or_insert(next);
        fn name(names: &[String], slot: usize) -> &str {
            names.get(slot).map_or("", String::as_str)
        }
        let (t0, c0) = (name(&call.tables, 0), name(&call.columns, 0));
        let (t1, c1) = (name(&call.tables, 1), name(&call.columns, 1));
        requests
            .iter()
            .map(|request| {
                let anchor = self.document(t0, c0, request.anchor.id);
                let partner = request
                    .partner
                    .map_or(NO_DOCUMENT, |p| self.document(t1, c1, p.id));
                (prompt, anchor, partner)
            })
            .collect()
    }

    /// The number of document `id` of `table.column`, numbered now if new.
    fn document(&mut self, table: &str, column: &str, id: &str) -> u32 {
        fn level<'m, V: Default>(map: &'m mut HashMap<String, V>, key: &str) -> &'m mut V {
            if !map.contains_key(key) {
                map.insert(key.to_string(), V::default());
            }
            map.get_mut(key).expect("inserted above")
        }
        let ids = level(level(&mut self.documents, table), column);
        if let Some(&n) = ids.get(id) {
            return n;
        }
        let n = self.document_count;
        self.document_count += 1;
        ids.insert(id.to_string(), n);
        n
    }

    /// The answer to a question asked before.
    pub fn get(&self, key: &MemoKey) -> Option<&Answer> {
        self.answers.get(key)
    }

    /// Takes an answer out.
    pub fn remove(&mut self, key: &MemoKey) -> Option<Answer> {
        self.answers.remove(key)
    }

    /// Records an answer.
    pub fn insert(&mut self, key: MemoKey, answer: Answer) {
        self.answers.insert(key, answer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inference::backend::Doc;
    use crate::inference::prompt::{PromptFormat, filter_pieces, join_pieces};

    fn call(op: &str, kind: AiKind, pieces: PromptPieces) -> AiCall {
        AiCall {
            op_id: op.into(),
            kind,
            template: String::new(),
            tables: vec!["a.b".into(), "c".into()],
            columns: vec!["text".into(), "text".into()],
            pieces,
            labels: Vec::new(),
            max_tokens: 0,
            descriptions: Vec::new(),
            relations: Vec::new(),
        }
    }

    #[test]
    fn one_prompt_of_one_document_is_one_question() {
        let f = PromptFormat::default();
        let mut memo = AnswerMemo::new(true);
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
        memo.insert(k, Answer::Bool(true));
        // Another operator with the same prompt: answered.
        let k3 = memo.key(&j3, &r);
        assert_eq!(memo.get(&k3), Some(&Answer::Bool(true)));
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
        memo = AnswerMemo::new(false);
        assert_eq!(memo.get(&k), None);
        let k = memo.key(&j1, &r);
        memo.insert(k, Answer::Bool(true));
        let k3 = memo.key(&j3, &r);
        assert_eq!(memo.get(&k3), None);
    }

    #[test]
    fn what_an_answer_depends_on_beyond_the_pieces_makes_another_question() {
        let mut memo = AnswerMemo::new(true);
        let one = AiRequest {
            anchor: Doc { id: "x", text: "" },
            partner: None,
        };
        // An extraction's pieces are the same for any fields.
        let mut dish = crate::inference::backend::test_call(AiKind::Extract, "", &["dish"]);
        dish.descriptions = vec!["Which dish?".into()];
        let mut price = dish.clone();
        price.op_id = "op-2".into();
        price.labels = vec!["price".into()];
        price.descriptions = vec!["What price?".into()];
        assert_eq!(dish.pieces, price.pieces);
        assert_ne!(memo.key(&dish, &one), memo.key(&price, &one));
        // A generation's max_tokens.
        let short = crate::inference::backend::test_call(AiKind::Complete, "Summarise {0}.", &[]);
        let long = AiCall {
            op_id: "op-3".into(),
            max_tokens: short.max_tokens + 1,
            ..short.clone()
        };
        assert_ne!(memo.key(&short, &one), memo.key(&long, &one));
        // The same call asked by another operator is the same question.
        let again = AiCall {
            op_id: "op-4".into(),
            ..short.clone()
        };
        assert_eq!(memo.key(&short, &one), memo.key(&again, &one));
    }

    #[test]
    fn documents_are_told_apart_by_table_column_and_id() {
        let f = PromptFormat::default();
        let mut memo = AnswerMemo::new(true);
        let mut join = call("join-1", AiKind::Join, join_pieces(f, "Does {0} cite {1}?"));
        let same_ids = AiRequest {
            anchor: Doc { id: "x", text: "" },
            partner: Some(Doc { id: "x", text: "" }),
        };
        // Tables "a.b" and "c": one id, two documents.
        let (_, a, p) = memo.key(&join, &same_ids);
        assert_ne!(a, p);
        // A table named "a" with column "b.text" is not "a.b"."text".
        join.tables[0] = "a".into();
        join.columns[0] = "b.text".into();
        let (_, a2, p2) = memo.key(&join, &same_ids);
        assert_ne!(a2, a);
        assert_eq!(p2, p);
        // Both sides one table and column: one document.
        join.tables = vec!["c".into(), "c".into()];
        join.columns = vec!["text".into(), "text".into()];
        let (_, a3, p3) = memo.key(&join, &same_ids);
        assert_eq!((a3, p3), (p, p));
        let one = AiRequest {
            anchor: Doc { id: "x", text: "" },
            partner: None,
        };
        let (_, _, none) = memo.key(&join, &one);
        assert_eq!(none, NO_DOCUMENT);
    }
}
