//! Token ids of prompt pieces and documents, kept across queries: the
//! scheduler's tokenizer front ([`TokenCache`]).
//!
//! Documents are keyed by the SHA-256 of their text, not by id: ids repeat
//! across datasets (`rv0` in every IMDB collection), and a worker or session
//! that serves another dataset must never reuse the tokens of the first. Each
//! document remembers the table it was last read from, so a run that goes
//! collection by collection can forget the tables no operator reads any more.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use aisql_models::Tokenizer;

use crate::error::Result;

/// SHA-256 of a document's text.
type TextDigest = [u8; 32];

/// The SHA-256 of each text, each distinct one hashed once: a batch repeats a
/// join anchor for every partner, and the same string (one address and length,
/// both borrowed for the whole call) holds the same bytes.
fn text_digests(texts: &[&str]) -> Vec<TextDigest> {
    use sha2::Digest as _;
    let mut seen: HashMap<(usize, usize), TextDigest> = HashMap::new();
    texts
        .iter()
        .map(|t| {
            *seen
                .entry((t.as_ptr() as usize, t.len()))
                .or_insert_with(|| sha2::Sha256::digest(t.as_bytes()).into())
        })
        .collect()
}

/// Token ids kept across queries.
#[derive(Default)]
struct Tokens {
    /// Documents' token ids by the SHA-256 of their text, each with the table it
    /// was last read from.
    docs: HashMap<TextDigest, (Arc<str>, Arc<Vec<u32>>)>,
    pieces: HashMap<String, Arc<Vec<u32>>>,
}

/// A tokenizer and the token ids it produced. Clones share the ids: an
/// estimate's two simulations of one query tokenize each document once.
#[derive(Clone)]
pub(super) struct TokenCache {
    tokenizer: Tokenizer,
    tokens: Arc<Mutex<Tokens>>,
}

impl TokenCache {
    /// An empty cache over `tokenizer`.
    pub(super) fn new(tokenizer: Tokenizer) -> Self {
        Self {
            tokenizer,
            tokens: Arc::default(),
        }
    }

    /// Token ids of a prompt piece (preamble, frame, tail, label), each
    /// distinct text tokenized once.
    pub(super) fn piece(&self, text: &str) -> Result<Arc<Vec<u32>>> {
        let mut t = self.tokens.lock().expect("tokens lock");
        if let Some(ids) = t.pieces.get(text) {
            return Ok(ids.clone());
        }
        let ids = Arc::new(self.tokenizer.encode(text)?);
        t.pieces.insert(text.to_string(), ids.clone());
        Ok(ids)
    }

    /// Token ids of documents of `table` by their texts, each distinct text
    /// tokenized once.
    pub(super) fn docs(&self, table: &str, texts: &[&str]) -> Result<Vec<Arc<Vec<u32>>>> {
        let digests = text_digests(texts);
        let missing: Vec<(TextDigest, &str)> = {
            let t = self.tokens.lock().expect("tokens lock");
            let mut seen = HashSet::new();
            digests
                .iter()
                .zip(texts)
                .filter(|(d, _)| !t.docs.contains_key(*d) && seen.insert(**d))
                .map(|(d, text)| (*d, *text))
                .collect()
        };
        let table: Arc<str> = Arc::from(table);
        if !missing.is_empty() {
            let texts: Vec<&str> = missing.iter().map(|(_, text)| *text).collect();
            let encoded = self.tokenizer.encode_documents(&texts)?;
            let mut t = self.tokens.lock().expect("tokens lock");
            for ((digest, _), ids) in missing.iter().zip(encoded) {
                t.docs.insert(*digest, (table.clone(), Arc::new(ids)));
            }
        }
        let mut t = self.tokens.lock().expect("tokens lock");
        Ok(digests
            .iter()
            .map(|d| {
                let entry = t.docs.get_mut(d).expect("tokenized above");
                // The table that reads it now keeps it past this query.
                if *entry.0 != *table {
                    entry.0 = table.clone();
                }
                entry.1.clone()
            })
            .collect())
    }

    /// Forgets the token ids of documents of tables not in `read`: a run goes
    /// collection by collection, and at sf 1.0 the documents of all five would
    /// stay in memory to the end (gigabytes) for no reuse.
    pub(super) fn keep_tables(&self, read: &HashSet<&str>) {
        let mut t = self.tokens.lock().expect("tokens lock");
        t.docs.retain(|_, (table, _)| read.contains(table.as_ref()));
        t.docs.shrink_to_fit();
    }

    /// The tables whose documents' token ids are held, sorted.
    pub(super) fn tables(&self) -> Vec<String> {
        let t = self.tokens.lock().expect("tokens lock");
        let tables: BTreeSet<&str> = t.docs.values().map(|(table, _)| table.as_ref()).collect();
        tables.into_iter().map(str::to_string).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_text_is_hashed_once_and_equal_texts_share_a_digest() {
        let a = String::from("a review");
        let b = String::from("a review");
        let d = text_digests(&[&a, &a, &b, "another"]);
        assert_eq!(d[0], d[1]);
        assert_eq!(d[0], d[2]);
        assert_ne!(d[0], d[3]);
    }

    #[test]
    fn a_text_is_tokenized_once_and_kept_by_the_table_that_read_it_last() {
        let cache = TokenCache::new(Tokenizer::vendored().unwrap());
        let first = cache.docs("imdb", &["a fine film", "a dull film"]).unwrap();
        // A clone shares the ids: the same text read from another table is
        // not tokenized again, and moves to that table.
        let shared = cache.clone();
        let again = shared.docs("movies", &["a fine film"]).unwrap();
        assert!(Arc::ptr_eq(&first[0], &again[0]));
        assert_eq!(cache.tables(), ["imdb", "movies"]);
        cache.keep_tables(&HashSet::from(["movies"]));
        assert_eq!(shared.tables(), ["movies"]);
        assert!(Arc::ptr_eq(
            &cache.piece("Yes").unwrap(),
            &shared.piece("Yes").unwrap()
        ));
    }
}
