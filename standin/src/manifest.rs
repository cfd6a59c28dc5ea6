//! The QUAIL-B layout's file formats (SPEC §C.1) that the generator writes and
//! `aisql-bench`'s layout reader reads: the table list, the label-set folder rule,
//! the corpus, collection and label-set manifests (with the predicate a label set
//! answers), and the file hash they record.
//! Moved here from `aisql_bench::layout` so that the stand-in generator does not
//! depend on the bench crate; `aisql_bench::layout` re-exports them.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use aisql_engine::inference::backend::AiKind;
use serde::{Deserialize, Deserializer, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Result, StandinError};

/// A predicate as a label-set manifest describes it (SPEC §C.1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PredicateInfo {
    /// Predicate key, e.g. `quailb.imdb.review.mentions_positive_aspect`.
    pub key: String,
    /// Filter, join or classify.
    pub kind: AiKind,
    /// The prompt template exactly as written in the plans.
    pub template: String,
    /// Table of the `{0}` document.
    pub left_table: String,
    /// Text column of the `{0}` document.
    pub left_column: String,
    /// Table of the `{1}` document (joins, joined-row classifications).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub right_table: Option<String>,
    /// Text column of the `{1}` document.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub right_column: Option<String>,
    /// Classification labels in tie-break order (empty for filters and joins).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
    /// One description per label ("" = none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub descriptions: Vec<String>,
}

/// The nine QUAIL-B tables, in SPEC §C order (PrivacyPolicies is optional and not here).
pub const TABLES: [&str; 9] = [
    "reviews",
    "aspects",
    "reports",
    "terms",
    "claims",
    "evidence",
    "citation_contexts",
    "citation_passages",
    "agent_traces",
];

/// Folder of a predicate's label sets under `label_sets/`: the key without its
/// `quailb.` prefix, split at the first dot into dataset and predicate path
/// (`quailb.imdb.review.sentiment` → `imdb/review.sentiment`). A label set `ls_…` of
/// that predicate is `label_sets/<this>/<ls_…>/`.
pub fn labels_predicate_dir(key: &str) -> PathBuf {
    let rest = key.strip_prefix("quailb.").unwrap_or(key);
    match rest.split_once('.') {
        Some((ds, pred)) => Path::new(ds).join(pred),
        None => PathBuf::from(rest),
    }
}

/// Per-table entry of a corpus manifest.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TableEntry {
    /// Exact row count.
    pub rows: u64,
    /// Hash over the per-row canonical-JSON hashes (recorded, not re-computed on read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordered_rows_full_hash: Option<String>,
    /// SHA-256 of the Parquet file (stand-in manifests; verified by `fetch`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_sha256: Option<String>,
    /// File name relative to the corpus folder (default `<table>.parquet`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

fn de_tables<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<BTreeMap<String, TableEntry>, D::Error> {
    use serde::de::Error;
    let v = serde_json::Value::deserialize(d)?;
    let mut out = BTreeMap::new();
    let entry = |v: &serde_json::Value| -> std::result::Result<TableEntry, D::Error> {
        if let Some(n) = v.as_u64() {
            return Ok(TableEntry {
                rows: n,
                ..Default::default()
            });
        }
        serde_json::from_value(v.clone()).map_err(D::Error::custom)
    };
    match &v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                out.insert(k.clone(), entry(x)?);
            }
        }
        serde_json::Value::Array(xs) => {
            for x in xs {
                let name = x
                    .get("name")
                    .or_else(|| x.get("table"))
                    .and_then(|n| n.as_str())
                    .ok_or_else(|| D::Error::custom("table entry without a name"))?;
                out.insert(name.to_string(), entry(x)?);
            }
        }
        _ => return Err(D::Error::custom("`tables` must be an object or a list")),
    }
    Ok(out)
}

/// `corpora/<corpus_id>/manifest.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CorpusManifest {
    /// Corpus id (`c_…`).
    pub corpus_id: String,
    /// Scale factor.
    pub scale_factor: f64,
    /// Per table: rows and hashes.
    #[serde(deserialize_with = "de_tables")]
    pub tables: BTreeMap<String, TableEntry>,
    /// Hash of the whole corpus.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub corpus_full_hash: Option<String>,
    /// Schema version (1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_version: Option<u32>,
    /// Data seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_seed: Option<u64>,
    /// True for the aisql stand-in.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub standin: bool,
    /// Other fields, kept as read.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// `summary` of a collection manifest.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CollectionSummary {
    /// The reference model.
    #[serde(default)]
    pub model: String,
}

fn de_label_sets<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<BTreeMap<String, String>, D::Error> {
    use serde::de::Error;
    let m = BTreeMap::<String, serde_json::Value>::deserialize(d)?;
    m.into_iter()
        .map(|(k, v)| {
            let id = match &v {
                serde_json::Value::String(s) => s.clone(),
                other => other
                    .get("label_set_id")
                    .and_then(|x| x.as_str())
                    .ok_or_else(|| D::Error::custom(format!("label set of {k} has no id")))?
                    .to_string(),
            };
            Ok((k, id))
        })
        .collect()
}

/// `collections/<collection_id>/manifest.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CollectionManifest {
    /// Collection id (`gt_…`).
    pub collection_id: String,
    /// Corpus the labels belong to.
    pub corpus_id: String,
    /// Scale factor.
    pub scale_factor: f64,
    /// Must be `complete`.
    pub status: String,
    /// Predicate key → label-set id.
    #[serde(deserialize_with = "de_label_sets")]
    pub label_sets: BTreeMap<String, String>,
    /// Summary with the reference model.
    #[serde(default)]
    pub summary: CollectionSummary,
    /// True for the aisql stand-in.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub standin: bool,
    /// Other fields (e.g. `reused_label_sets`), kept as read.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// `label_sets/…/<label_set_id>/manifest.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LabelSetManifest {
    /// Label-set id (`ls_…`).
    pub label_set_id: String,
    /// Must be `complete`.
    pub status: String,
    /// Exact number of label rows.
    pub rows: u64,
    /// Corpus the labels belong to.
    pub corpus_id: String,
    /// Hash of that corpus.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub corpus_full_hash: Option<String>,
    /// Rows per source table.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub source_rows: BTreeMap<String, u64>,
    /// The predicate.
    pub predicate: PredicateInfo,
    /// True for the aisql stand-in.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub standin: bool,
    /// Other fields, kept as read.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// SHA-256 hex of a file.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f =
        aisql_engine::data::input_file::open(path).map_err(|e| StandinError::io(path, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| StandinError::io(path, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}
