//! Token masks for typed answers ([`crate::inference::field_type`]), by
//! llguidance: a field type's regular expression becomes a parser over the
//! tokenizer's byte trie, which answers, before each decode step, which of
//! the vocabulary's tokens keep the text inside the language. llguidance
//! builds no index per grammar (a new type costs nothing up front) and
//! walks the trie lazily per step; it is the masking library of llama.cpp,
//! vLLM and SGLang.
//!
//! [`Grammars`] is built once per model (the trie over the vocabulary, about
//! a second of work); each type's parser is compiled once and cloned per
//! sequence. A parser's state is a function of its type and the tokens it
//! has taken, so each (type, tokens) mask is computed once and shared by
//! every row that reaches it (most rows of a step share their first
//! masks): [`MaskMemo`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use aisql_models::{TokenConstraint, Tokenizer};
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{InferenceCapabilities, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};

use crate::error::{EngineError, Result};
use crate::inference::field_type::FieldType;

/// The tokenizer as llguidance reads it: the bytes of every token, in a trie.
struct TokenBytes {
    trie: TokTrie,
    tokenizer: Tokenizer,
}

impl TokenizerEnv for TokenBytes {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Only used for text the grammar forces; bytes that are not UTF-8 are
    /// read with replacement characters.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        self.tokenizer
            .encode(&String::from_utf8_lossy(s))
            .unwrap_or_default()
    }
}

/// Time and count of the masks computed, for the cost per decoded token.
#[derive(Debug, Default)]
pub struct MaskCost {
    nanos: std::sync::atomic::AtomicU64,
    masks: std::sync::atomic::AtomicU64,
}

impl MaskCost {
    /// Masks computed so far and the seconds they took.
    pub fn totals(&self) -> (u64, f64) {
        use std::sync::atomic::Ordering::Relaxed;
        (
            self.masks.load(Relaxed),
            self.nanos.load(Relaxed) as f64 / 1e9,
        )
    }
}

/// A parser's state: its type's spelling and the tokens it has taken.
type ParserState = (Arc<str>, Vec<u32>);

/// Masks already computed, by the state they were computed in.
#[derive(Debug, Default)]
pub struct MaskMemo {
    masks: Mutex<HashMap<ParserState, Arc<[u32]>>>,
}

impl MaskMemo {
    /// Masks kept at most (each is the vocabulary's bits, 19 KB for
    /// Qwen3's); past them all are dropped and computed again when asked.
    const MOST: usize = 512;

    fn get(&self, key: &ParserState) -> Option<Arc<[u32]>> {
        self.masks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned()
    }

    fn keep(&self, key: ParserState, mask: Arc<[u32]>) {
        let mut masks = self.masks.lock().unwrap_or_else(|p| p.into_inner());
        if masks.len() >= Self::MOST {
            masks.clear();
        }
        masks.insert(key, mask);
    }
}

/// Parsers for the field types of one model's vocabulary.
pub struct Grammars {
    factory: ParserFactory,
    /// One compiled parser per type (by its spelling), cloned per sequence.
    compiled: Mutex<HashMap<Arc<str>, Matcher>>,
    memo: Arc<MaskMemo>,
    cost: Arc<MaskCost>,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars").finish_non_exhaustive()
    }
}

impl Grammars {
    /// Grammars over `tokenizer`'s tokens for a model of `vocab_size` logits
    /// (ids past the tokenizer's are never allowed); `stop` is the id that
    /// ends a complete answer.
    pub fn new(tokenizer: &Tokenizer, vocab_size: usize, stop: u32) -> Result<Self> {
        let err = |e: String| EngineError::Inference(format!("typed answers: {e}"));
        let json = tokenizer
            .inner()
            .to_string(false)
            .map_err(|e| err(format!("the tokenizer cannot be written as JSON: {e}")))?;
        let json: serde_json::Value = serde_json::from_str(&json)
            .map_err(|e| err(format!("the tokenizer's JSON cannot be read: {e}")))?;
        let mut words = llguidance::token_bytes_from_tokenizer_json(&json).map_err(|e| {
            err(format!(
                "the tokenizer's tokens cannot be read as bytes: {e}"
            ))
        })?;
        if words.len() > vocab_size {
            return Err(err(format!(
                "the tokenizer has {} tokens, more than the model's {vocab_size} logits",
                words.len()
            )));
        }
        words.resize(vocab_size, Vec::new());
        let info = TokRxInfo::new(vocab_size as u32, stop);
        let env: TokEnv = Arc::new(TokenBytes {
            trie: TokTrie::from(&info, &words),
            tokenizer: tokenizer.clone(),
        });
        let mut factory = ParserFactory::new(
            &env,
            InferenceCapabilities::default(),
            &llguidance::earley::SlicedBiasComputer::general_slices(),
        )
        .map_err(|e| err(e.to_string()))?;
        factory.quiet();
        Ok(Self {
            factory,
            compiled: Mutex::new(HashMap::new()),
            memo: Arc::default(),
            cost: Arc::new(MaskCost::default()),
        })
    }

    /// The masks computed so far by every constraint of these grammars.
    pub fn cost(&self) -> &MaskCost {
        &self.cost
    }

    /// A fresh constraint for one answer of type `ty`; `None` for free text
    /// (and for a set of values, which a token trie follows).
    pub fn constraint(&self, ty: &FieldType) -> Result<Option<Box<dyn TokenConstraint>>> {
        let spelled: Arc<str> = ty.to_string().into();
        let mut compiled = self.compiled.lock().unwrap_or_else(|p| p.into_inner());
        // JSON schemas come from queries: keep a few parsers, not all.
        if compiled.len() >= 64 && !compiled.contains_key(&spelled) {
            compiled.clear();
        }
        let matcher = match compiled.get(&spelled) {
            Some(m) => m.deep_clone(),
            None => {
                // The grammar is built only for a parser not compiled yet.
                let Some(grammar) = grammar_of(ty) else {
                    return Ok(None);
                };
                let parser = self.factory.create_parser(grammar);
                let matcher = Matcher::new(parser);
                if let Some(e) = matcher.get_error() {
                    return Err(EngineError::Inference(format!(
                        "typed answers: the grammar of {ty} does not compile: {e}"
                    )));
                }
                let fresh = matcher.deep_clone();
                compiled.insert(spelled.clone(), matcher);
                fresh
            }
        };
        Ok(Some(Box::new(TypedAnswer {
            matcher,
            state: (spelled, Vec::new()),
            memo: self.memo.clone(),
            cost: self.cost.clone(),
        })))
    }
}

/// The grammar of `ty`'s answers: its regular expression's, or its JSON
/// schema's; `None` for text and sets of values.
fn grammar_of(ty: &FieldType) -> Option<TopLevelGrammar> {
    match ty {
        FieldType::Json(schema) => serde_json::from_str(schema)
            .ok()
            .map(compact)
            .map(TopLevelGrammar::from_json_schema),
        nested if nested.is_nested() => Some(TopLevelGrammar::from_json_schema(compact(
            nested.json_schema(),
        ))),
        other => other.regex().map(|rx| TopLevelGrammar::from_regex(&rx)),
    }
}

/// `schema` asking for compact JSON (no whitespace between tokens) unless
/// it says otherwise (`x-guidance`): a model that would pad with spaces or
/// new lines cannot run out its `max_tokens` on them.
fn compact(mut schema: serde_json::Value) -> serde_json::Value {
    if let Some(object) = schema.as_object_mut() {
        object
            .entry("x-guidance")
            .or_insert_with(|| serde_json::json!({"whitespace_flexible": false}));
    }
    schema
}

/// An error unless llguidance compiles `schema` (checked when a query is
/// planned, over a one-byte-per-token vocabulary, before any model is
/// asked).
pub fn check_json_schema(schema: &serde_json::Value) -> std::result::Result<(), String> {
    static FACTORY: std::sync::OnceLock<std::result::Result<ParserFactory, String>> =
        std::sync::OnceLock::new();
    let factory = FACTORY
        .get_or_init(|| {
            let env = llguidance::toktrie::ApproximateTokEnv::single_byte_env();
            let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
            factory.quiet();
            Ok(factory)
        })
        .as_ref()?;
    if !schema.is_object() {
        return Err("the JSON schema must be an object".into());
    }
    factory
        .create_parser(TopLevelGrammar::from_json_schema(compact(schema.clone())))
        .map(|_| ())
        .map_err(|e| format!("the JSON schema is not one llguidance reads: {e}"))
}

/// One sequence's constraint: its parser's state, and the type and tokens
/// that name the state in the memo.
struct TypedAnswer {
    matcher: Matcher,
    state: ParserState,
    memo: Arc<MaskMemo>,
    cost: Arc<MaskCost>,
}

impl TokenConstraint for TypedAnswer {
    /// The memo's mask for this state, or the parser's (then kept); the cost
    /// counts both, as the cost of a decoded token's mask.
    fn mask(&mut self) -> std::result::Result<Vec<u32>, String> {
        use std::sync::atomic::Ordering::Relaxed;
        let started = Instant::now();
        let mask = match self.memo.get(&self.state) {
            Some(mask) => mask.to_vec(),
            None => {
                let mask = self
                    .matcher
                    .compute_mask_or_eos()
                    .map_err(|e| e.to_string())?;
                let mask = mask.as_slice().to_vec();
                self.memo.keep(self.state.clone(), mask.as_slice().into());
                mask
            }
        };
        self.cost
            .nanos
            .fetch_add(started.elapsed().as_nanos() as u64, Relaxed);
        self.cost.masks.fetch_add(1, Relaxed);
        Ok(mask)
    }

    fn accept(&mut self, token: u32) -> std::result::Result<(), String> {
        self.matcher
            .consume_token(token)
            .map_err(|e| e.to_string())?;
        self.state.1.push(token);
        Ok(())
    }

    fn must_stop(&self) -> bool {
        self.matcher.is_stopped()
    }

    fn is_complete(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
            || self.matcher.is_stopped() && !self.matcher.is_error()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Walks the grammar of `ty` greedily by `prefer` (the allowed token whose
    /// text `prefer` likes best), as a decoder would, and returns the text.
    fn walk(
        grammars: &Grammars,
        tokenizer: &Tokenizer,
        ty: &FieldType,
        prefer: &dyn Fn(u32, &str) -> i64,
        stop: u32,
    ) -> String {
        let mut c = grammars.constraint(ty).unwrap().unwrap();
        let mut ids = Vec::new();
        for _ in 0..80 {
            let mask = c.mask().unwrap();
            let allowed: Vec<u32> = aisql_models::allowed_ids(&mask).map(|i| i as u32).collect();
            assert!(!allowed.is_empty(), "{ty}: nothing allowed after {ids:?}");
            let pick = *allowed
                .iter()
                .max_by_key(|&&t| {
                    (
                        prefer(t, &tokenizer.decode(&[t]).unwrap()),
                        std::cmp::Reverse(t),
                    )
                })
                .unwrap();
            if pick == stop {
                assert!(c.is_complete());
                break;
            }
            c.accept(pick).unwrap();
            ids.push(pick);
            if c.must_stop() {
                assert!(c.is_complete());
                break;
            }
        }
        tokenizer.decode(&ids).unwrap()
    }

    /// Whatever the decoder prefers among the allowed tokens, the text is of
    /// the type: long tokens, short ones, digits, the stop as soon as allowed.
    #[test]
    fn every_walk_through_a_grammar_is_an_answer_of_its_type() {
        let tokenizer = Tokenizer::vendored().unwrap();
        let stop = tokenizer.stop_ids()[0];
        let grammars = Grammars::new(&tokenizer, 151_936, stop).unwrap();
        let types = [
            FieldType::Int,
            FieldType::Double,
            FieldType::Boolean,
            FieldType::Date,
            FieldType::Json(
                r#"{"type":"object","properties":{"n":{"type":"integer","minimum":0,"maximum":999},"ok":{"type":"boolean"}},"required":["n","ok"],"additionalProperties":false}"#.into(),
            ),
            crate::inference::field_type::FieldDecl::parse(
                "x STRUCT<n INT, ok BOOLEAN, d DATE, g ENUM(a, 'b c') OR NULL>",
            )
            .unwrap()
            .ty,
        ];
        let long = |_: u32, s: &str| s.len() as i64;
        let short = |_: u32, s: &str| -(s.len() as i64);
        let stop_early = |t: u32, s: &str| if t == stop { 1000 } else { s.len() as i64 };
        let nines = |_: u32, s: &str| s.matches('9').count() as i64 * 10 + s.len() as i64;
        let by_id = |t: u32, _: &str| (t as i64).wrapping_mul(2654435761) % 1000;
        let mut texts = 0;
        for ty in &types {
            for prefer in [
                &long as &dyn Fn(u32, &str) -> i64,
                &short,
                &stop_early,
                &nines,
                &by_id,
            ] {
                let text = walk(&grammars, &tokenizer, ty, prefer, stop);
                assert!(ty.accepts(&text), "{ty}: {text:?}");
                ty.column(&[Some(&text)]).unwrap();
                texts += 1;
            }
        }
        assert_eq!(texts, 30);
        let (masks, seconds) = grammars.cost().totals();
        let computed = grammars.memo.masks.lock().unwrap().len();
        assert!(
            masks > 30 && computed < masks as usize,
            "{masks}, {computed}"
        );
        eprintln!(
            "{masks} masks ({computed} computed, the rest shared), {:.0} µs each",
            seconds / masks as f64 * 1e6
        );
        // Free text has no grammar, nor has a set of values (a token trie).
        assert!(grammars.constraint(&FieldType::Text).unwrap().is_none());
        let set = FieldType::Enum {
            values: vec!["a".into()],
            or_null: false,
        };
        assert!(grammars.constraint(&set).unwrap().is_none());
    }
}
