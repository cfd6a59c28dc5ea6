//! Answers constrained to a set of values (an `ENUM(...)` field, or the
//! distinct keys of a column): the decoder follows a trie of the values'
//! token sequences, so that each row costs one short constrained decode
//! whose answer is always one of the values, instead of one yes/no question
//! per (row, value) pair. Each value enters the trie as the tokenizer
//! writes it and as it writes it after a space (a model's answer often
//! opens with one); a sequence ends when it has spelled a whole value and
//! the model picks a stop, or when no longer value continues it.
//!
//! Only the values' own tokenizations are followed: a value the model
//! would spell in other tokens is still reached through these, as every
//! step picks the best token the trie allows.
//!
//! A walk that may answer none (`ENUM(...) OR NULL`) ends where the model's
//! best token over the whole vocabulary is outside the trie: after a whole
//! value that value is the answer, before one the answer is none (the
//! executor reads the unfinished walk as the empty text, NULL).

use std::sync::Arc;

use aisql_models::{TokenConstraint, Tokenizer};

use crate::error::{EngineError, Result};

/// One node: its children by token, sorted, and whether a value ends here.
#[derive(Debug, Default)]
struct Node {
    children: Vec<(u32, u32)>,
    terminal: bool,
}

/// The token trie of one set of values.
#[derive(Debug)]
pub struct KeyTrie {
    nodes: Vec<Node>,
    /// Words of a mask over the model's vocabulary.
    mask_words: usize,
    /// The id that ends a whole value.
    stop: u32,
}

impl KeyTrie {
    /// The trie of `values` (at least one; duplicates are one value) as
    /// `tokenizer` writes them, for a model of `vocab_size` logits whose
    /// `stop` id ends an answer.
    pub fn new(
        tokenizer: &Tokenizer,
        values: &[String],
        vocab_size: usize,
        stop: u32,
    ) -> Result<Self> {
        if values.is_empty() {
            return Err(EngineError::Inference(
                "a set of answers with no value: nothing could be answered".into(),
            ));
        }
        let spelled: Vec<String> = values
            .iter()
            .flat_map(|v| [v.clone(), format!(" {v}")])
            .collect();
        let refs: Vec<&str> = spelled.iter().map(String::as_str).collect();
        let sequences = tokenizer
            .encode_batch(&refs)
            .map_err(|e| EngineError::Inference(format!("the answers' values: {e}")))?;
        let mut trie = Self {
            nodes: vec![Node::default()],
            mask_words: vocab_size.div_ceil(32),
            stop,
        };
        for (value, tokens) in spelled.iter().zip(&sequences) {
            if tokens.is_empty() {
                continue;
            }
            if let Some(&t) = tokens.iter().find(|&&t| t as usize >= vocab_size) {
                return Err(EngineError::Inference(format!(
                    "the answer value {value:?} has token {t}, outside the model's {vocab_size}"
                )));
            }
            trie.insert(tokens);
        }
        Ok(trie)
    }

    fn insert(&mut self, tokens: &[u32]) {
        let mut node = 0usize;
        for &t in tokens {
            let children = &self.nodes[node].children;
            node = match children.binary_search_by_key(&t, |&(tok, _)| tok) {
                Ok(i) => children[i].1 as usize,
                Err(i) => {
                    let next = self.nodes.len();
                    self.nodes[node].children.insert(i, (t, next as u32));
                    self.nodes.push(Node::default());
                    next
                }
            };
        }
        self.nodes[node].terminal = true;
    }

    /// Nodes in the trie (its root included).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the trie holds only its root (never: a trie has a value).
    pub fn is_empty(&self) -> bool {
        self.nodes.len() <= 1
    }

    /// A fresh walk from the root, for one answer; `or_none`: the model may
    /// leave the trie (see the module header).
    pub fn walk(self: &Arc<Self>, or_none: bool) -> Box<dyn TokenConstraint> {
        Box::new(KeyWalk {
            trie: self.clone(),
            node: 0,
            or_none,
        })
    }
}

/// One answer's place in the trie.
struct KeyWalk {
    trie: Arc<KeyTrie>,
    node: usize,
    or_none: bool,
}

impl TokenConstraint for KeyWalk {
    fn mask(&mut self) -> std::result::Result<Vec<u32>, String> {
        let node = &self.trie.nodes[self.node];
        let mut mask = vec![0u32; self.trie.mask_words];
        let mut allow = |t: u32| mask[t as usize / 32] |= 1 << (t % 32);
        node.children.iter().for_each(|&(t, _)| allow(t));
        if node.terminal {
            allow(self.trie.stop);
        }
        Ok(mask)
    }

    fn accept(&mut self, token: u32) -> std::result::Result<(), String> {
        let children = &self.trie.nodes[self.node].children;
        match children.binary_search_by_key(&token, |&(t, _)| t) {
            Ok(i) => {
                self.node = children[i].1 as usize;
                Ok(())
            }
            Err(_) => Err(format!("token {token} spells no answer value")),
        }
    }

    fn must_stop(&self) -> bool {
        let node = &self.trie.nodes[self.node];
        node.terminal && node.children.is_empty()
    }

    fn is_complete(&mut self) -> bool {
        self.trie.nodes[self.node].terminal
    }

    fn may_leave(&self) -> bool {
        self.or_none
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Walks by `prefer` among the allowed tokens until the walk ends.
    fn walk(trie: &Arc<KeyTrie>, tokenizer: &Tokenizer, prefer: &dyn Fn(u32) -> u64) -> String {
        let mut c = trie.walk(false);
        let mut ids = Vec::new();
        loop {
            let mask = c.mask().unwrap();
            let pick = aisql_models::allowed_ids(&mask)
                .map(|t| t as u32)
                .max_by_key(|&t| prefer(t))
                .expect("a walk always has a way on");
            if pick == trie.stop {
                assert!(c.is_complete());
                break;
            }
            c.accept(pick).unwrap();
            ids.push(pick);
            if c.must_stop() {
                break;
            }
        }
        tokenizer.decode(&ids).unwrap()
    }

    #[test]
    fn every_walk_spells_a_value() {
        let tokenizer = Tokenizer::vendored().unwrap();
        let stop = tokenizer.stop_ids()[0];
        let values: Vec<String> = [
            "aspirin",
            "aspirin plus",
            "ibuprofen",
            "paracetamol (500 mg)",
            "Ünïcödé drug",
            "aspirin",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let trie = Arc::new(KeyTrie::new(&tokenizer, &values, 151_936, stop).unwrap());
        for seed in 0..200u64 {
            let prefer = |t: u32| (u64::from(t) ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let text = walk(&trie, &tokenizer, &prefer);
            let value = text.strip_prefix(' ').unwrap_or(&text);
            assert!(values.iter().any(|v| v == value), "{text:?}");
        }
        // A foreign token is refused.
        let mut c = trie.walk(false);
        assert!(!c.may_leave() && trie.walk(true).may_leave());
        assert!(c.accept(stop).unwrap_err().contains("no answer value"));
        let e = KeyTrie::new(&tokenizer, &[], 151_936, stop).unwrap_err();
        assert!(e.to_string().contains("no value"), "{e}");
    }

    /// 100,000 keys: built once, every walk a key.
    #[test]
    fn a_hundred_thousand_keys() {
        let tokenizer = Tokenizer::vendored().unwrap();
        let stop = tokenizer.stop_ids()[0];
        let values: Vec<String> = (0..100_000u64)
            .map(|i| format!("compound-{:x}", i.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40))
            .collect();
        let started = std::time::Instant::now();
        let trie = Arc::new(KeyTrie::new(&tokenizer, &values, 151_936, stop).unwrap());
        eprintln!(
            "100,000 keys: {} nodes in {:.2} s",
            trie.len(),
            started.elapsed().as_secs_f64()
        );
        let keys: std::collections::HashSet<&str> = values.iter().map(String::as_str).collect();
        for seed in 0..50u64 {
            let prefer = |t: u32| (u64::from(t) ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let text = walk(&trie, &tokenizer, &prefer);
            assert!(
                keys.contains(text.strip_prefix(' ').unwrap_or(&text)),
                "{text:?}"
            );
        }
    }
}
