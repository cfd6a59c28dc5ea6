//! Token metrics (SPEC §D.3, §D.4): the reference prompt pieces of every operator
//! as Qwen3 token ids (`prompt_pieces.json`), input tokens from the answer tables,
//! the minimum an unlimited prefix cache must compute (43-query rule), and the
//! recomputed tokens / KV regret against the engine's fresh tokens.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use crate::quailb::plan::{Operator, QueryPlan};
use aisql_engine::exec::answers::AnswerTable;
use aisql_engine::inference::prompt::PromptFormat;
use aisql_engine::inference::work::Work;
use aisql_models::tokenizer::Tokenizer;
use serde_json::json;

use crate::corpus::Corpus;
use crate::error::{BenchError, Result};
use crate::metrics::{TokenMetrics, r6};

/// Tokenizer name recorded in `prompt_pieces.json`.
pub const TOKENIZER_NAME: &str = "Qwen/Qwen3-32B";

/// One operator's reference prompt pieces as token ids.
#[derive(Debug, Clone, PartialEq)]
pub struct OpPieces {
    /// Operator id.
    pub id: String,
    /// Filter/join/classify.
    pub kind: &'static str,
    /// `(table, text column)` of the anchor (`{0}`) document.
    pub anchor: (String, String),
    /// Alias of the anchor.
    pub anchor_alias: String,
    /// `(table, text column)` of the partner, for two-document prompts.
    pub partner: Option<(String, String)>,
    /// Ids before the first document.
    pub preamble: Vec<u32>,
    /// Ids after the anchor (two-document prompts).
    pub frame: Vec<u32>,
    /// Ids before the partner (two-document prompts).
    pub label: Vec<u32>,
    /// Ids after the last document.
    pub tail: Vec<u32>,
}

/// Tokenizes the reference (`raw-v1`) pieces of every AI operator of `plan`.
pub fn plan_pieces(plan: &QueryPlan, tok: &Tokenizer) -> Result<Vec<OpPieces>> {
    let mut out = Vec::new();
    for op in &plan.operators {
        let Some(p) = op.prompt_pieces(PromptFormat::RawV1)? else {
            continue;
        };
        let (kind, alias, partner) = match op {
            Operator::Filter { alias, .. } => ("filter", alias.clone(), None),
            Operator::Join { aliases, .. } => {
                ("join", aliases[0].clone(), Some(aliases[1].clone()))
            }
            Operator::Classify { alias, partner, .. } => {
                ("classify", alias.clone(), partner.clone())
            }
            Operator::InList { .. } => continue,
        };
        let doc = |a: &str| -> Result<(String, String)> {
            let r = plan
                .relation(a)
                .ok_or_else(|| BenchError::Tokens(format!("{}: unknown alias {a}", op.id())))?;
            Ok((r.table.clone(), r.text_column.clone()))
        };
        let enc = |s: &str| -> Result<Vec<u32>> {
            if s.is_empty() {
                Ok(Vec::new())
            } else {
                Ok(tok.encode(s)?)
            }
        };
        out.push(OpPieces {
            id: op.id().to_string(),
            kind,
            anchor: doc(&alias)?,
            anchor_alias: alias,
            partner: partner.as_deref().map(doc).transpose()?,
            preamble: enc(&p.preamble)?,
            frame: enc(&p.frame)?,
            label: enc(&p.label)?,
            tail: enc(&p.tail)?,
        });
    }
    Ok(out)
}

/// `prompt_pieces.json` (SPEC §D.3).
pub fn pieces_json(pieces: &[OpPieces]) -> serde_json::Value {
    let preamble = pieces
        .first()
        .map(|p| p.preamble.clone())
        .unwrap_or_default();
    let one = |p: &OpPieces| json!({"id": p.id, "tail": p.tail});
    let two = |p: &OpPieces| json!({"id": p.id, "anchor": p.anchor_alias, "frame": p.frame, "label": p.label, "tail": p.tail});
    let filters: Vec<_> = pieces
        .iter()
        .filter(|p| p.kind == "filter")
        .map(one)
        .collect();
    let joins: Vec<_> = pieces
        .iter()
        .filter(|p| p.kind == "join")
        .map(two)
        .collect();
    let classifies: Vec<_> = pieces
        .iter()
        .filter(|p| p.kind == "classify")
        .map(|p| if p.partner.is_some() { two(p) } else { one(p) })
        .collect();
    json!({"tokenizer": TOKENIZER_NAME, "preamble": preamble, "filters": filters, "joins": joins, "classifies": classifies})
}

type DocMap = HashMap<String, Arc<Vec<u32>>>;

/// Document token sequences per (table, text column, id), cached for a run.
pub struct DocTokens {
    tok: Tokenizer,
    cache: Mutex<HashMap<(String, String), DocMap>>,
}

impl std::fmt::Debug for DocTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DocTokens").finish_non_exhaustive()
    }
}

impl DocTokens {
    /// An empty cache over `tok`.
    pub fn new(tok: Tokenizer) -> Self {
        Self {
            tok,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tok
    }

    /// Forgets the documents of tables other than `tables`: a run scores
    /// collection by collection, and at sf 1.0 keeping the token ids of all
    /// five to the end would hold gigabytes for no reuse.
    pub fn keep_tables(&self, tables: &[String]) {
        let mut cache = self.cache.lock().expect("token cache lock");
        cache.retain(|(table, _), _| tables.contains(table));
        cache.shrink_to_fit();
    }

    /// Token ids of `ids` of `(table, column)`, tokenizing those not cached yet.
    pub fn get(
        &self,
        corpus: &Corpus,
        doc: &(String, String),
        ids: &HashSet<&str>,
    ) -> Result<DocMap> {
        let missing: Vec<&str> = {
            let cache = self.cache.lock().expect("token cache lock");
            let known = cache.get(doc);
            ids.iter()
                .copied()
                .filter(|id| known.is_none_or(|m| !m.contains_key(*id)))
                .collect()
        };
        if !missing.is_empty() {
            let column = corpus.column(&doc.0, &doc.1)?;
            let texts: Vec<&str> = missing
                .iter()
                .map(|id| {
                    column.get(id).ok_or_else(|| {
                        BenchError::Tokens(format!("table {}: no row with id {id}", doc.0))
                    })
                })
                .collect::<Result<_>>()?;
            let mut encoded = Vec::with_capacity(texts.len());
            for chunk in texts.chunks(256) {
                encoded.extend(self.tok.encode_documents(chunk)?);
            }
            let mut cache = self.cache.lock().expect("token cache lock");
            let m = cache.entry(doc.clone()).or_default();
            for (id, t) in missing.iter().zip(encoded) {
                m.insert(id.to_string(), Arc::new(t));
            }
        }
        let cache = self.cache.lock().expect("token cache lock");
        // No entry when no id was ever asked of this table (an operator that
        // asked nothing: every row dropped before it).
        let Some(m) = cache.get(doc) else {
            return Ok(DocMap::new());
        };
        Ok(ids
            .iter()
            .map(|id| (id.to_string(), m[*id].clone()))
            .collect())
    }
}

/// Prefix-trie size of a set of sequences (each a list of segments read in turn):
/// Σ lengths − Σ longest common prefixes of neighbours in sorted order. Duplicates count once.
pub fn trie_size(seqs: &mut Vec<Vec<&[u32]>>) -> u64 {
    seqs.sort_by(|a, b| {
        a.iter()
            .flat_map(|x| x.iter())
            .cmp(b.iter().flat_map(|x| x.iter()))
    });
    let mut total = 0u64;
    for (i, s) in seqs.iter().enumerate() {
        let len: usize = s.iter().map(|x| x.len()).sum();
        let lcp = if i == 0 {
            0
        } else {
            let prev = &seqs[i - 1];
            prev.iter()
                .flat_map(|x| x.iter())
                .zip(s.iter().flat_map(|x| x.iter()))
                .take_while(|(a, b)| a == b)
                .count()
        };
        // A duplicate of its neighbour adds nothing (len == lcp).
        total += (len - lcp) as u64;
    }
    total
}

/// Input and minimum tokens of one query from its answer tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PieceCounts {
    /// Σ full prompt lengths.
    pub input_tokens: u64,
    /// Unlimited-prefix-cache minimum (43-query rule).
    pub minimum_tokens: u64,
}

/// Input and minimum tokens (SPEC §D.4) over the requests implied by `answers`.
pub fn piece_counts(
    pieces: &[OpPieces],
    answers: &[AnswerTable],
    corpus: &Corpus,
    docs: &DocTokens,
) -> Result<PieceCounts> {
    // Document kinds (table, text column) as small numbers; documents as (kind, id).
    let mut kinds: Vec<(String, String)> = Vec::new();
    let mut kind_of = |d: &(String, String)| -> usize {
        match kinds.iter().position(|k| k == d) {
            Some(i) => i,
            None => {
                kinds.push(d.clone());
                kinds.len() - 1
            }
        }
    };
    let mut wanted: Vec<HashSet<&str>> = Vec::new();
    let mut tables: Vec<(&OpPieces, &AnswerTable, usize, Option<usize>)> = Vec::new();
    for p in pieces {
        let t = answers
            .iter()
            .find(|t| t.op_id == p.id)
            .ok_or_else(|| BenchError::Tokens(format!("{}: no answer table", p.id)))?;
        let a = kind_of(&p.anchor);
        let b = p.partner.as_ref().map(&mut kind_of);
        wanted.resize_with(
            wanted.len().max(a + 1).max(b.map_or(0, |b| b + 1)),
            HashSet::new,
        );
        wanted[a].extend(t.ids[0].iter().map(String::as_str));
        if let Some(b) = b {
            if t.ids.len() != 2 {
                return Err(BenchError::Tokens(format!(
                    "{}: answer table lacks the partner column",
                    p.id
                )));
            }
            wanted[b].extend(t.ids[1].iter().map(String::as_str));
        }
        tables.push((p, t, a, b));
    }
    let toks: Vec<DocMap> = kinds
        .iter()
        .zip(&wanted)
        .map(|(k, ids)| docs.get(corpus, k, ids))
        .collect::<Result<_>>()?;
    let len_of = |k: usize, id: &str| toks[k][id].len() as u64;

    let mut input = 0u64;
    // Part 1 subjects with their preambles; Part 2 suffixes per subject; Part 3 partners
    // per (anchor, (frame, label, tail)).
    type Doc<'a> = (usize, &'a str);
    type Group<'a> = (&'a [u32], &'a [u32], &'a [u32]);
    let mut subjects: HashMap<Doc<'_>, BTreeSet<&[u32]>> = HashMap::new();
    let mut suffixes: HashMap<Doc<'_>, BTreeSet<&[u32]>> = HashMap::new();
    let mut groups: HashMap<(Doc<'_>, Group<'_>), HashSet<Doc<'_>>> = HashMap::new();
    for &(p, t, a, b) in &tables {
        let fixed = (p.preamble.len() + p.frame.len() + p.label.len() + p.tail.len()) as u64;
        input += fixed * t.len() as u64;
        let group: Group<'_> = (&p.frame, &p.label, &p.tail);
        for row in 0..t.len() {
            let x: Doc<'_> = (a, t.ids[0][row].as_str());
            input += len_of(x.0, x.1);
            subjects.entry(x).or_default().insert(&p.preamble);
            match b {
                None => {
                    suffixes.entry(x).or_default().insert(&p.tail);
                }
                Some(b) => {
                    let y: Doc<'_> = (b, t.ids[1][row].as_str());
                    input += len_of(y.0, y.1);
                    suffixes.entry(x).or_default().insert(&p.frame);
                    groups.entry((x, group)).or_default().insert(y);
                }
            }
        }
    }
    // Part 1. When every subject has the same single preamble (the usual case), the
    // trie is the preamble plus the trie of the documents.
    let preambles: BTreeSet<&[u32]> = subjects.values().flatten().copied().collect();
    let mut minimum = if preambles.len() == 1 && subjects.values().all(|s| s.len() == 1) {
        let pre = preambles.first().expect("one preamble");
        let mut seqs: Vec<&[u32]> = subjects
            .keys()
            .map(|&(k, id)| toks[k][id].as_slice())
            .collect();
        pre.len() as u64 + trie_size_flat(&mut seqs)
    } else {
        let mut seqs: Vec<Vec<&[u32]>> = Vec::new();
        for (&(k, id), pres) in &subjects {
            for pre in pres {
                seqs.push(vec![pre, toks[k][id].as_slice()]);
            }
        }
        trie_size(&mut seqs)
    };
    // Part 2.
    for set in suffixes.values() {
        let mut s: Vec<&[u32]> = set.iter().copied().collect();
        minimum += trie_size_flat(&mut s);
    }
    // Part 3 (43-query rule: label, partner and tail once per pair).
    for ((_, (_, label, tail)), partners) in &groups {
        minimum += ((label.len() + tail.len()) * partners.len()) as u64;
        minimum += partners.iter().map(|&(k, id)| len_of(k, id)).sum::<u64>();
    }
    Ok(PieceCounts {
        input_tokens: input,
        minimum_tokens: minimum,
    })
}

/// [`trie_size`] of one-segment sequences.
pub fn trie_size_flat(seqs: &mut [&[u32]]) -> u64 {
    seqs.sort_unstable();
    let mut total = 0u64;
    for i in 0..seqs.len() {
        let lcp = if i == 0 {
            0
        } else {
            seqs[i - 1]
                .iter()
                .zip(seqs[i])
                .take_while(|(a, b)| a == b)
                .count()
        };
        total += (seqs[i].len() - lcp) as u64;
    }
    total
}

/// Combines piece counts with the engine's `fresh_tokens` / `input_tokens`.
pub fn token_metrics(counts: Option<PieceCounts>, measurements: &Work) -> Result<TokenMetrics> {
    let fresh = measurements.fresh_tokens.map(|s| s.0);
    // SPEC §D.3: prompt pieces go with the engine's fresh tokens. Without them the
    // harness has no pieces: input tokens are the engine's own (or unknown), and the
    // minimum and the regret are unavailable, not numbers.
    let counts = counts.filter(|_| fresh.is_some());
    let reported_input = measurements.input_tokens.map(|s| s.0);
    let mut approximate = false;
    let (input, minimum) = match (counts, reported_input) {
        (Some(c), Some(reported)) => {
            approximate = true;
            let min = if c.input_tokens > 0 {
                (c.minimum_tokens as f64 * reported as f64 / c.input_tokens as f64).round() as u64
            } else {
                c.minimum_tokens
            };
            (Some(reported), Some(min))
        }
        (Some(c), None) => (Some(c.input_tokens), Some(c.minimum_tokens)),
        (None, r) => (r, None),
    };
    // Questions the persistent answer cache answered were not computed in this
    // run, so its fresh tokens may be below the minimum of a run from scratch:
    // regret is not defined.
    let from_cache = measurements.answer_cache_reused.is_some_and(|n| n.0 > 0);
    // Likewise KV that earlier queries left (`--keep-kv on`).
    let kept_kv = measurements
        .kv_kept_across_queries
        .as_ref()
        .is_some_and(|k| k.0);
    // And KV read from the on-disk store (`--kv-store`).
    let stored_kv = measurements.kv_store_read_tokens.is_some_and(|n| n.0 > 0);
    let regret = match (fresh, minimum) {
        _ if from_cache || kept_kv || stored_kv => None,
        (Some(f), Some(m)) if approximate => Some((f as i64 - m as i64).max(0)),
        (Some(f), Some(m)) => {
            if f < m {
                return Err(BenchError::Tokens(format!(
                    "the engine reported {f} fresh tokens, below the minimum {m} an unlimited prefix cache needs"
                )));
            }
            Some(f as i64 - m as i64)
        }
        _ => None,
    };
    let kv_regret_percent = match (regret, fresh) {
        (Some(r), Some(f)) if f > 0 => Some(r6(100.0 * r as f64 / f as f64)),
        _ => None,
    };
    Ok(TokenMetrics {
        input_tokens: input,
        fresh_tokens: fresh,
        minimum_tokens: minimum,
        regret_tokens: regret,
        regret_approximate: approximate,
        kv_regret_percent,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use aisql_engine::inference::backend::Answer;

    fn size(seqs: &[&[u32]]) -> u64 {
        let mut v: Vec<Vec<&[u32]>> = seqs.iter().map(|s| vec![*s]).collect();
        let mut flat: Vec<&[u32]> = seqs.to_vec();
        let n = trie_size(&mut v);
        assert_eq!(n, trie_size_flat(&mut flat));
        n
    }

    #[test]
    fn trie_size_counts_distinct_prefixes() {
        assert_eq!(size(&[]), 0);
        assert_eq!(size(&[&[1, 2, 3]]), 3);
        // {1,2,3}, {1,2,4}, {1,5}: prefixes 1, 12, 123, 124, 15 = 5.
        assert_eq!(size(&[&[1, 2, 3], &[1, 5], &[1, 2, 4]]), 5);
        // Duplicates and a prefix of another sequence add nothing.
        assert_eq!(size(&[&[1, 2, 3], &[1, 2, 3], &[1, 2]]), 3);
        // Segments are read in turn.
        let mut v = vec![
            vec![&[1u32][..], &[2, 3][..]],
            vec![&[1u32, 2][..], &[4][..]],
        ];
        assert_eq!(trie_size(&mut v), 4);
    }

    #[test]
    fn minimum_of_hand_computed_requests() {
        use aisql_engine::inference::backend::AiKind;
        let dir = tempfile::tempdir().unwrap();
        // Texts chosen so each is a handful of tokens; lengths read back from the tokenizer.
        let tok = Tokenizer::vendored().unwrap();
        let write = |table: &str, ids: &[&str], texts: &[&str]| {
            use datafusion::arrow::array::StringArray;
            use datafusion::arrow::datatypes::{DataType, Field, Schema};
            let schema = Arc::new(Schema::new(vec![
                Field::new("id", DataType::Utf8, false),
                Field::new("text", DataType::Utf8, false),
            ]));
            let batch = datafusion::arrow::array::RecordBatch::try_new(
                schema,
                vec![
                    Arc::new(StringArray::from(ids.to_vec())),
                    Arc::new(StringArray::from(texts.to_vec())),
                ],
            )
            .unwrap();
            let p = dir.path().join(format!("{table}.parquet"));
            aisql_engine::data::files::write_parquet(&p, &batch).unwrap();
            (table.to_string(), p)
        };
        let paths: std::collections::BTreeMap<_, _> = [
            write("d", &["a", "b"], &["alpha beta", "gamma"]),
            write("q", &["x", "y"], &["one two three", "four"]),
        ]
        .into_iter()
        .collect();
        let corpus = Corpus::new(paths);
        let docs = DocTokens::new(tok.clone());
        let len = |s: &str| tok.encode(s).unwrap().len() as u64;
        let (la, lb, lx, ly) = (
            len("alpha beta"),
            len("gamma"),
            len("one two three"),
            len("four"),
        );
        let d = ("d".to_string(), "text".to_string());
        let q = ("q".to_string(), "text".to_string());
        let filter = OpPieces {
            id: "filter-1".into(),
            kind: "filter",
            anchor: d.clone(),
            anchor_alias: "r".into(),
            partner: None,
            preamble: vec![7, 8],
            frame: vec![],
            label: vec![],
            tail: vec![1, 2, 3],
        };
        let filter2 = OpPieces {
            id: "filter-2".into(),
            tail: vec![1, 2, 9, 9],
            ..filter.clone()
        };
        let join = OpPieces {
            id: "join-1".into(),
            kind: "join",
            anchor: d.clone(),
            anchor_alias: "r".into(),
            partner: Some(q.clone()),
            preamble: vec![7, 8],
            frame: vec![5, 5],
            label: vec![6],
            tail: vec![4],
        };
        let mut f1 = AnswerTable::new("filter-1", AiKind::Filter, vec!["r".into()], Vec::new());
        f1.ids[0] = vec!["a".into(), "b".into()];
        f1.answers = vec![Answer::Bool(true), Answer::Bool(true)];
        let mut f2 = AnswerTable::new("filter-2", AiKind::Filter, vec!["r".into()], Vec::new());
        f2.ids[0] = vec!["a".into()];
        f2.answers = vec![Answer::Bool(false)];
        let mut j = AnswerTable::new(
            "join-1",
            AiKind::Join,
            vec!["r".into(), "s".into()],
            Vec::new(),
        );
        j.ids = vec![vec!["a".into(), "a".into()], vec!["x".into(), "y".into()]];
        j.answers = vec![Answer::Bool(true), Answer::Bool(false)];
        let c = piece_counts(&[filter, filter2, join], &[f1, f2, j], &corpus, &docs).unwrap();
        // Input: filter-1 2×(2+3)+la+lb; filter-2 (2+4)+la; join 2×(2+2+1+1)+2la+lx+ly.
        assert_eq!(
            c.input_tokens,
            10 + la + lb + 6 + la + 12 + 2 * la + lx + ly
        );
        // Part 1: preamble+a, preamble+b share the 2-token preamble (documents differ from
        // their first token here). Part 2: a's suffixes {1,2,3},{1,2,9,9},{5,5} → 3+2+2 = 7;
        // b's {1,2,3} → 3. Part 3: (1+1)×2 + lx + ly.
        let tokens_a = tok.encode("alpha beta").unwrap();
        let tokens_b = tok.encode("gamma").unwrap();
        let shared = tokens_a
            .iter()
            .zip(&tokens_b)
            .take_while(|(x, y)| x == y)
            .count() as u64;
        let part1 = 2 + la + lb - shared;
        assert_eq!(c.minimum_tokens, part1 + 7 + 3 + 4 + lx + ly);
    }

    #[test]
    fn regret_from_measurements() {
        let work = |m: &serde_json::Map<String, serde_json::Value>| -> Work {
            serde_json::from_value(m.clone().into()).unwrap()
        };
        let counts = Some(PieceCounts {
            input_tokens: 200,
            minimum_tokens: 80,
        });
        let mut m = serde_json::Map::new();
        let t = token_metrics(counts, &work(&m)).unwrap();
        // No fresh tokens (an oracle run): no prompt pieces, so input, minimum and
        // regret are unavailable, as the QUAIL-B harness reports them.
        assert_eq!(
            (t.fresh_tokens, t.regret_tokens, t.kv_regret_percent),
            (None, None, None)
        );
        assert_eq!((t.input_tokens, t.minimum_tokens), (None, None));
        m.insert("input_tokens".into(), json!(300));
        let t = token_metrics(counts, &work(&m)).unwrap();
        assert_eq!((t.input_tokens, t.minimum_tokens), (Some(300), None));
        m.remove("input_tokens");
        m.insert("fresh_tokens".into(), json!(100));
        let t = token_metrics(counts, &work(&m)).unwrap();
        assert_eq!(
            (t.regret_tokens, t.kv_regret_percent),
            (Some(20), Some(20.0))
        );
        m.insert("fresh_tokens".into(), json!(50));
        assert!(token_metrics(counts, &work(&m)).is_err());
        // Below the minimum because the answer cache answered some questions: the
        // regret is undefined, not an error.
        m.insert("answer_cache_reused".into(), json!(7));
        let t = token_metrics(counts, &work(&m)).unwrap();
        assert_eq!(
            (
                t.fresh_tokens,
                t.minimum_tokens,
                t.regret_tokens,
                t.kv_regret_percent
            ),
            (Some(50), Some(80), None, None)
        );
        m.insert("answer_cache_reused".into(), json!(0));
        assert!(token_metrics(counts, &work(&m)).is_err());
        m.remove("answer_cache_reused");
        // So is KV that earlier queries left (`--keep-kv on`).
        m.insert("kv_kept_across_queries".into(), json!(true));
        let t = token_metrics(counts, &work(&m)).unwrap();
        assert_eq!((t.regret_tokens, t.kv_regret_percent), (None, None));
        m.remove("kv_kept_across_queries");
        // And KV read from the store (`--kv-store`); a store that gave
        // nothing leaves the regret defined.
        m.insert("kv_store_read_tokens".into(), json!(30));
        let t = token_metrics(counts, &work(&m)).unwrap();
        assert_eq!((t.regret_tokens, t.kv_regret_percent), (None, None));
        m.insert("kv_store_read_tokens".into(), json!(0));
        assert!(token_metrics(counts, &work(&m)).is_err());
        m.remove("kv_store_read_tokens");
        m.insert("input_tokens".into(), json!(100));
        let t = token_metrics(counts, &work(&m)).unwrap();
        assert_eq!(
            (t.input_tokens, t.minimum_tokens, t.regret_tokens),
            (Some(100), Some(40), Some(10))
        );
        assert!(t.regret_approximate);
    }
}
