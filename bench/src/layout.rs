//! The published QUAIL-B layout (SPEC §C.1): its facts (table list, label-set paths,
//! published ids, cache roots), the reader, label loading and `fetch`. The look-up
//! order that falls back to the stand-in is [`crate::resolve`]'s.
//!
//! A *layout root* holds `corpora/<corpus_id>/{<table>.parquet, manifest.json,
//! active_collection.json}`, `collections/<collection_id>/manifest.json` and
//! `label_sets/<dataset>/<predicate>/<label_set_id>/{manifest.json, labels.parquet |
//! parts/*.parquet}`. [`Dataset::open`] reads one (a local mirror of
//! `s3://quail-bench/ground_truth/quailb/schema_v1/`, aisql's fetch cache, or the
//! stand-in root), checking manifests only; [`Dataset::require_tables`] and
//! [`Dataset::load_labels`] check the tables and label sets a query needs.
//! [`fetch`] mirrors the published corpus of a scale factor from an object store.
//!
//! Remote source: the public bucket `quail-bench` over anonymous S3 (HTTPS, no
//! signature) via `object_store`'s `aws` feature, prefix
//! `ground_truth/quailb/schema_v1/` ([`default_source`]); region `us-east-1` unless
//! `AWS_REGION`/`AWS_DEFAULT_REGION` says otherwise.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use crate::quailb::labels::{LabelSet, LabelStore, LabelValue};
use aisql_engine::data::cache_dir::cache_dir;
use aisql_engine::data::parquet_read::{ParquetReadError, footer_rows, read_batches};
use aisql_engine::data::tables::TablePaths;
use aisql_engine::inference::backend::AiKind;
use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::DataType;
use futures::StreamExt;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt};
use rayon::prelude::*;
use sha2::{Digest, Sha256};

use crate::error::{BenchError, Result};

// The file formats the stand-in generator writes too: they live in its crate (it
// must not depend on this one) and are part of this module's interface.
pub use aisql_standin::manifest::{
    CollectionManifest, CollectionSummary, CorpusManifest, LabelSetManifest, TABLES, TableEntry,
    labels_predicate_dir, sha256_file,
};

/// Path of the layout root inside the public bucket.
pub const BUCKET: &str = "quail-bench";
/// Prefix of the layout root inside [`BUCKET`].
pub const BUCKET_PREFIX: &str = "ground_truth/quailb/schema_v1";

/// A published corpus (SPEC §C table).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PublishedCorpus {
    /// Scale factor.
    pub scale_factor: f64,
    /// Corpus id.
    pub corpus_id: &'static str,
    /// Collection of the 43-query line.
    pub collection_43: &'static str,
    /// Collection of the 42-query line.
    pub collection_42: &'static str,
}

/// The published corpora and collections.
pub const PUBLISHED: [PublishedCorpus; 3] = [
    PublishedCorpus {
        scale_factor: 0.1,
        corpus_id: "c_1aa2c4f0d0b6c816fd37aa5748c33341",
        collection_43: "gt_72abc9af3feaea668e493ece67e980a0",
        collection_42: "gt_93e6532710832f1f11acf22f7baaa455",
    },
    PublishedCorpus {
        scale_factor: 0.5,
        corpus_id: "c_6773c85b3754908434661c1dadfad0fa",
        collection_43: "gt_397dae1857e5850c84b61dccabb3431c",
        collection_42: "gt_d204ad99618b2d56f584950ab81fc46d",
    },
    PublishedCorpus {
        scale_factor: 1.0,
        corpus_id: "c_81a95887a650aaa1a343e0d688b81bef",
        collection_43: "gt_a72baf70eae95e6b1681a11091eaafca",
        collection_42: "gt_ac3e48c5195c7007f96b35da621f7a2a",
    },
];

fn same_sf(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// The published corpus of a scale factor, if there is one.
pub fn published_for(sf: f64) -> Option<&'static PublishedCorpus> {
    PUBLISHED.iter().find(|p| same_sf(p.scale_factor, sf))
}

fn published_or_err(sf: f64) -> Result<&'static PublishedCorpus> {
    published_for(sf).ok_or_else(|| {
        BenchError::ScaleFactor(format!(
            "no published QUAIL-B corpus for scale factor {sf} (published: 0.1, 0.5, 1.0); \
             use the stand-in (`aisql data generate --sf {sf}`) instead"
        ))
    })
}

// ---------------------------------------------------------------- sources

/// Where the layout's files are.
#[derive(Debug, Clone, PartialEq)]
pub enum LayoutSource {
    /// A plain mirror: files at their layout paths under this root.
    Plain(PathBuf),
    /// The QUAIL-B harness download cache: files named by the SHA-256 hex of
    /// `quail-bench/ground_truth/quailb/schema_v1/<path>` (SPEC §C.1).
    HarnessCache(PathBuf),
}

impl LayoutSource {
    /// The local file of a layout path (`corpora/…`, `label_sets/…`).
    pub fn file(&self, rel: &str) -> PathBuf {
        match self {
            LayoutSource::Plain(root) => root.join(rel),
            LayoutSource::HarnessCache(dir) => {
                let h = harness_name(rel);
                let plain = dir.join(&h);
                if plain.exists() {
                    return plain;
                }
                if let Some(ext) = Path::new(rel).extension().and_then(|e| e.to_str()) {
                    let with = dir.join(format!("{h}.{ext}"));
                    if with.exists() {
                        return with;
                    }
                }
                plain
            }
        }
    }

    /// The root folder.
    pub fn root(&self) -> &Path {
        match self {
            LayoutSource::Plain(p) | LayoutSource::HarnessCache(p) => p,
        }
    }
}

/// The harness cache's file name of a layout path.
pub fn harness_name(rel: &str) -> String {
    hex::encode(Sha256::digest(
        format!("{BUCKET}/{BUCKET_PREFIX}/{rel}").as_bytes(),
    ))
}

/// The QUAIL-B harness cache: `$QUAIL_B_CACHE_DIR`, else `~/.cache/quail-b`.
pub fn harness_cache_dir() -> PathBuf {
    std::env::var_os("QUAIL_B_CACHE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| home().join(".cache").join("quail-b"))
}

fn home() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Root of fetched published data: `quailb/` under aisql's cache folder
/// ([`aisql_engine::data::cache_dir::cache_dir`]).
pub fn published_cache_root() -> PathBuf {
    cache_dir().join("quailb")
}

/// Root of the stand-in: `quailb-standin/` under aisql's cache folder.
pub fn standin_root() -> PathBuf {
    cache_dir().join("quailb-standin")
}

fn io(path: &Path, e: impl std::fmt::Display) -> BenchError {
    BenchError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let s =
        aisql_engine::data::input_file::read_to_string(path).map_err(|e| BenchError::Manifest {
            path: path.to_path_buf(),
            message: format!("cannot read: {e}"),
        })?;
    serde_json::from_str(&s).map_err(|e| BenchError::Manifest {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// Row count from a Parquet footer (errors name the file: truncated, not Parquet).
pub fn parquet_rows(path: &Path) -> Result<u64> {
    footer_rows(path).map_err(|e| parquet_error(path, e))
}

fn parquet_error(path: &Path, e: ParquetReadError) -> BenchError {
    match e {
        ParquetReadError::Io(e) => io(path, e),
        ParquetReadError::Corrupt(message) => BenchError::Parquet {
            path: path.to_path_buf(),
            message,
        },
    }
}

// ---------------------------------------------------------------- dataset

/// A label set of the chosen collection, located and validated (manifest only).
#[derive(Debug, Clone)]
pub struct LabelSetRef {
    /// Predicate key.
    pub key: String,
    /// Its manifest.
    pub manifest: LabelSetManifest,
    /// Label files (`labels.parquet`, or every `parts/*.parquet`).
    pub files: Vec<PathBuf>,
}

/// A QUAIL-B corpus at one scale factor, with its chosen collection.
///
/// Opening checks only the manifests (corpus and collection): the tables and label
/// sets a query needs are checked when asked for, by [`Dataset::require_tables`] and
/// [`Dataset::load_labels`], so a root holding one dataset's files can run that
/// dataset's queries, and a query does not pay for checking what it does not read.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// Where the files are.
    pub source: LayoutSource,
    /// Corpus id (`c_…`).
    pub corpus_id: String,
    /// Chosen collection (`gt_…`); `None` when the corpus has no complete collection.
    pub collection_id: Option<String>,
    /// Scale factor.
    pub scale_factor: f64,
    /// Reference model of the collection (`summary.model`).
    pub reference_model: String,
    /// Table name → Parquet file, for every table of the corpus manifest, as the
    /// manifest names it. Unchecked (the file may be missing): use
    /// [`Dataset::require_tables`] for the tables a query reads.
    pub tables: BTreeMap<String, PathBuf>,
    /// Table name → rows, as the corpus manifest says (checked against the file by
    /// [`Dataset::require_tables`]).
    pub table_rows: BTreeMap<String, u64>,
    /// True for the aisql stand-in corpus.
    pub standin: bool,
    /// The corpus manifest.
    pub manifest: CorpusManifest,
    /// Predicate key → label-set id, from the chosen collection's manifest (empty
    /// without a collection). Located and validated only when loaded
    /// ([`Dataset::label_set`], [`Dataset::load_labels`]).
    pub label_sets: BTreeMap<String, String>,
    /// Label sets (ids or predicate keys) the collection borrows from another corpus
    /// (`reused_label_sets`): their manifests may name that corpus.
    pub reused_label_sets: HashSet<String>,
    /// The labels [`Dataset::shared_labels`] last loaded, while someone holds them.
    shared: SharedLabels,
}

/// Labels loaded once for a template list, handed out while held.
type SharedLabels = Arc<Mutex<Option<(Vec<String>, Weak<LabelStore>)>>>;

fn normalize_root(root: &Path) -> PathBuf {
    let nested = root.join("ground_truth").join("quailb").join("schema_v1");
    if !root.join("corpora").exists() && nested.join("corpora").exists() {
        nested
    } else {
        root.to_path_buf()
    }
}

/// Label-set folders under `root/label_sets/` by folder name (= label-set id): the
/// dataset/predicate path in between is informative only (SPEC §C.1).
fn find_label_set_dirs(root: &Path) -> HashMap<String, PathBuf> {
    let mut out = HashMap::new();
    fn walk(dir: &Path, depth: usize, out: &mut HashMap<String, PathBuf>) {
        let Ok(rd) = fs::read_dir(dir) else { return };
        for e in rd.flatten() {
            let p = e.path();
            if !p.is_dir() {
                continue;
            }
            if p.join("manifest.json").exists() {
                if let Some(name) = p.file_name().and_then(|n| n.to_str()) {
                    out.insert(name.to_string(), p.clone());
                }
            } else if depth < 6 {
                walk(&p, depth + 1, out);
            }
        }
    }
    walk(&root.join("label_sets"), 0, &mut out);
    out
}

fn reused_label_sets(coll: &CollectionManifest) -> HashSet<String> {
    coll.extra
        .get("reused_label_sets")
        .map(|v| match v {
            serde_json::Value::Object(m) => m
                .iter()
                .flat_map(|(k, x)| [Some(k.clone()), x.as_str().map(str::to_string)])
                .flatten()
                .collect(),
            serde_json::Value::Array(xs) => xs
                .iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect(),
            _ => HashSet::new(),
        })
        .unwrap_or_default()
}

/// Where the label sets are, found once per [`Dataset::load_labels`] call.
enum LabelDirs {
    /// Plain layout: label-set id → folder.
    Found(HashMap<String, PathBuf>),
    /// Harness cache: paths follow [`labels_predicate_dir`].
    ByRule,
}

impl Dataset {
    /// Opens the corpus of scale factor `sf` under a plain layout root (a mirror of
    /// `ground_truth/quailb/schema_v1/`, or a folder holding that path), choosing the
    /// collection `collection` or else the active / only complete one (SPEC §C.1).
    /// Reads and checks the corpus and collection manifests only; tables and label
    /// sets are checked when required ([`Dataset::require_tables`],
    /// [`Dataset::load_labels`]).
    pub fn open(root: &Path, sf: f64, collection: Option<&str>) -> Result<Dataset> {
        Self::open_source(LayoutSource::Plain(normalize_root(root)), sf, collection)
    }

    /// [`Dataset::open`] on any [`LayoutSource`].
    pub fn open_source(source: LayoutSource, sf: f64, collection: Option<&str>) -> Result<Dataset> {
        let (corpus_id, manifest) = find_corpus(&source, sf)?;
        let cdir = format!("corpora/{corpus_id}");
        let mpath = source.file(&format!("{cdir}/manifest.json"));
        let tables = manifest
            .tables
            .iter()
            .map(|(t, e)| {
                let file = table_file(t, e, &mpath.display().to_string())?;
                Ok((t.clone(), source.file(&format!("{cdir}/{file}"))))
            })
            .collect::<Result<_>>()?;
        let table_rows = manifest
            .tables
            .iter()
            .map(|(t, e)| (t.clone(), e.rows))
            .collect();
        let coll = choose_collection(&source, &corpus_id, sf, collection)?;
        Ok(Dataset {
            source,
            corpus_id,
            collection_id: coll.as_ref().map(|c| c.collection_id.clone()),
            scale_factor: manifest.scale_factor,
            reference_model: coll
                .as_ref()
                .map(|c| c.summary.model.clone())
                .unwrap_or_default(),
            tables,
            table_rows,
            standin: manifest.standin,
            manifest,
            label_sets: coll
                .as_ref()
                .map(|c| c.label_sets.clone())
                .unwrap_or_default(),
            reused_label_sets: coll.as_ref().map(reused_label_sets).unwrap_or_default(),
            shared: SharedLabels::default(),
        })
    }

    /// The corpus manifest's path.
    pub fn manifest_path(&self) -> PathBuf {
        self.source
            .file(&format!("corpora/{}/manifest.json", self.corpus_id))
    }

    /// Checks the tables `names` and returns their files: each must be in the corpus
    /// manifest, have its file, and that file's Parquet footer must give the
    /// manifest's row count. Errors name the table and what is wrong (not in the
    /// manifest, file missing, unreadable, row count).
    pub fn require_tables(&self, names: &[&str]) -> Result<TablePaths> {
        let mut out = TablePaths::new();
        for &t in names {
            if out.contains_key(t) {
                continue;
            }
            let Some(e) = self.manifest.tables.get(t) else {
                return Err(BenchError::TableNotInManifest {
                    table: t.into(),
                    path: self.manifest_path(),
                });
            };
            let path = self.source.file(&format!(
                "corpora/{}/{}",
                self.corpus_id,
                table_file(t, e, &self.manifest_path().display().to_string())?
            ));
            if !path.exists() {
                return Err(BenchError::MissingTable {
                    table: t.into(),
                    path,
                });
            }
            let found = parquet_rows(&path)?;
            if found != e.rows {
                return Err(BenchError::RowCount {
                    table: t.into(),
                    path,
                    expected: e.rows,
                    found,
                });
            }
            out.insert(t.to_string(), path);
        }
        Ok(out)
    }

    /// [`Dataset::require_tables`] of the nine QUAIL-B tables ([`TABLES`]).
    pub fn require_all_tables(&self) -> Result<TablePaths> {
        self.require_tables(&TABLES)
    }

    /// True when this is a published corpus (SPEC §C ids).
    pub fn is_published(&self) -> bool {
        PUBLISHED.iter().any(|p| p.corpus_id == self.corpus_id)
    }

    /// True when the chosen collection is a published one.
    pub fn is_published_collection(&self) -> bool {
        self.collection_id.as_deref().is_some_and(|c| {
            PUBLISHED
                .iter()
                .any(|p| p.collection_43 == c || p.collection_42 == c)
        })
    }

    fn collection_or_err(&self) -> Result<&str> {
        self.collection_id.as_deref().ok_or_else(|| {
            BenchError::Collection(format!(
                "corpus {} has no complete collection",
                self.corpus_id
            ))
        })
    }

    fn label_dirs(&self) -> LabelDirs {
        match &self.source {
            LayoutSource::Plain(root) => LabelDirs::Found(find_label_set_dirs(root)),
            LayoutSource::HarnessCache(_) => LabelDirs::ByRule,
        }
    }

    /// The manifest path and label files of the label set `ls_id` of predicate `key`.
    fn locate_label_set(
        &self,
        dirs: &LabelDirs,
        key: &str,
        ls_id: &str,
    ) -> Result<(PathBuf, Vec<PathBuf>)> {
        let missing = |where_: String| BenchError::Labels {
            predicate: key.into(),
            message: format!(
                "label set {ls_id} of collection {} is missing: no {where_}",
                self.collection_id.as_deref().unwrap_or("?")
            ),
        };
        match dirs {
            LabelDirs::Found(found) => {
                let dir = found.get(ls_id).ok_or_else(|| {
                    missing(format!(
                        "folder {ls_id} (with a manifest.json) under {}",
                        self.source.root().join("label_sets").display()
                    ))
                })?;
                let single = dir.join("labels.parquet");
                let files = if single.exists() {
                    vec![single]
                } else {
                    let mut v: Vec<PathBuf> = fs::read_dir(dir.join("parts"))
                        .map(|rd| {
                            rd.flatten()
                                .map(|e| e.path())
                                .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
                                .collect()
                        })
                        .unwrap_or_default();
                    v.sort();
                    v
                };
                Ok((dir.join("manifest.json"), files))
            }
            LabelDirs::ByRule => {
                for (what, name) in std::iter::once(("label-set id", ls_id))
                    .chain(key.split('.').map(|part| ("predicate key part", part)))
                {
                    plain_name(what, name).map_err(|message| BenchError::Labels {
                        predicate: key.to_string(),
                        message,
                    })?;
                }
                let rel = labels_predicate_dir(key).join(ls_id);
                let rel = rel.to_string_lossy().replace('\\', "/");
                let m = self.source.file(&format!("label_sets/{rel}/manifest.json"));
                if !m.exists() {
                    return Err(missing(format!("manifest {}", m.display())));
                }
                let f = self
                    .source
                    .file(&format!("label_sets/{rel}/labels.parquet"));
                Ok((m, if f.exists() { vec![f] } else { vec![] }))
            }
        }
    }

    /// Checks a label set's manifest against the collection and the corpus, and
    /// that it has label files.
    fn check_label_set(
        &self,
        key: &str,
        ls_id: &str,
        mpath: &Path,
        m: &LabelSetManifest,
        files: &[PathBuf],
    ) -> Result<()> {
        let bad = |message: String| BenchError::Manifest {
            path: mpath.to_path_buf(),
            message,
        };
        if m.label_set_id != ls_id {
            return Err(bad(format!(
                "label_set_id {} but the collection names {ls_id}",
                m.label_set_id
            )));
        }
        if m.status != "complete" {
            return Err(bad(format!(
                "label set {ls_id} has status {:?}, not complete",
                m.status
            )));
        }
        if m.predicate.key != key {
            return Err(bad(format!(
                "predicate key {} but the collection maps {key} to it",
                m.predicate.key
            )));
        }
        if m.corpus_id != self.corpus_id
            && !self.reused_label_sets.contains(ls_id)
            && !self.reused_label_sets.contains(key)
        {
            return Err(bad(format!(
                "label set belongs to corpus {}, not {}",
                m.corpus_id, self.corpus_id
            )));
        }
        if files.is_empty() {
            return Err(BenchError::Labels {
                predicate: key.into(),
                message: format!(
                    "label set {ls_id} has no labels.parquet or parts/*.parquet next to {}",
                    mpath.display()
                ),
            });
        }
        Ok(())
    }

    /// The label set of predicate `key` in the chosen collection, located and its
    /// manifest checked (the labels themselves are read by [`Dataset::load_labels`]).
    pub fn label_set(&self, key: &str) -> Result<LabelSetRef> {
        let coll = self.collection_or_err()?;
        let ls_id = self.label_sets.get(key).ok_or_else(|| BenchError::Labels {
            predicate: key.into(),
            message: format!("collection {coll} has no label set for it"),
        })?;
        let (mpath, files) = self.locate_label_set(&self.label_dirs(), key, ls_id)?;
        let m: LabelSetManifest = read_json(&mpath)?;
        self.check_label_set(key, ls_id, &mpath, &m, &files)?;
        Ok(LabelSetRef {
            key: key.into(),
            manifest: m,
            files,
        })
    }

    /// The labels of `templates` as [`Dataset::load_labels`] reads them, loaded
    /// once while they are held: a benchmark's oracle and its scorer ask for the
    /// same ones, and at sf 1.0 a second copy costs gigabytes.
    pub fn shared_labels(&self, templates: &[String]) -> Result<Arc<LabelStore>> {
        let mut shared = self.shared.lock().expect("shared labels lock");
        if let Some((loaded, labels)) = shared.as_ref()
            && loaded == templates
            && let Some(labels) = labels.upgrade()
        {
            return Ok(labels);
        }
        let labels = Arc::new(self.load_labels(Some(templates))?);
        *shared = Some((templates.to_vec(), Arc::downgrade(&labels)));
        Ok(labels)
    }

    /// Loads the label sets whose template is in `templates` (all when `None`) into a
    /// [`LabelStore`], validating each: its manifest matches the collection and the
    /// corpus, every row's `predicate_key` and `label_set_id` match the manifest, ids
    /// are non-null, no (left, right) pair repeats, labels are from the predicate's
    /// list, and the row count equals the manifest's `rows`.
    ///
    /// With `templates`, label sets of other templates are not validated, and may be
    /// missing: a root can hold one dataset's label sets. A template no label set has
    /// is left out of the store (its operators cannot be scored, SPEC §C.1) — unless
    /// some label sets of the collection are missing or unreadable, since the
    /// template may be theirs: then the error names each of those (predicate key and
    /// label-set id). With `None`, every label set of the collection must be there.
    pub fn load_labels(&self, templates: Option<&[String]>) -> Result<LabelStore> {
        let coll = self.collection_or_err()?.to_string();
        let wanted: Option<HashSet<&str>> =
            templates.map(|t| t.iter().map(String::as_str).collect());
        let dirs = self.label_dirs();
        let mut refs: Vec<LabelSetRef> = Vec::new();
        // Label sets not found, and found but unreadable (tolerated with `templates`).
        let mut missing: Vec<String> = Vec::new();
        let mut unreadable: Vec<String> = Vec::new();
        let mut by_template: HashMap<String, String> = HashMap::new();
        for (key, ls_id) in &self.label_sets {
            let (mpath, files) = match (self.locate_label_set(&dirs, key, ls_id), &wanted) {
                (Ok(x), _) => x,
                (Err(e), None) => return Err(e),
                (Err(_), Some(_)) => {
                    missing.push(format!("{key} ({ls_id})"));
                    continue;
                }
            };
            let m: LabelSetManifest = match (read_json(&mpath), &wanted) {
                (Ok(m), _) => m,
                (Err(e), None) => return Err(e),
                (Err(e), Some(_)) => {
                    unreadable.push(format!("predicate {key} (label set {ls_id}): {e}"));
                    continue;
                }
            };
            let template = m.predicate.template.clone();
            if let Some(other) = by_template.insert(template.clone(), key.clone()) {
                return Err(BenchError::Collection(format!(
                    "predicates {other} and {key} of collection {coll} share one template"
                )));
            }
            if wanted
                .as_ref()
                .is_some_and(|w| !w.contains(template.as_str()))
            {
                continue;
            }
            self.check_label_set(key, ls_id, &mpath, &m, &files)?;
            refs.push(LabelSetRef {
                key: key.clone(),
                manifest: m,
                files,
            });
        }
        if let Some(w) = &wanted {
            let mut uncovered: Vec<&str> = w
                .iter()
                .copied()
                .filter(|t| !by_template.contains_key(*t))
                .collect();
            let some_unavailable = !missing.is_empty() || !unreadable.is_empty();
            if !uncovered.is_empty() && some_unavailable {
                uncovered.sort();
                let mut why = Vec::new();
                if !missing.is_empty() {
                    why.push(format!(
                        "missing from {}: {}",
                        self.source.root().join("label_sets").display(),
                        missing.join(", ")
                    ));
                }
                if !unreadable.is_empty() {
                    why.push(format!("unreadable: {}", unreadable.join("; ")));
                }
                return Err(BenchError::Collection(format!(
                    "no label set found for template{} {}; label sets of collection {coll} \
                     that could hold {} are {}",
                    if uncovered.len() == 1 { "" } else { "s" },
                    uncovered
                        .iter()
                        .map(|t| short_template(t))
                        .collect::<Vec<_>>()
                        .join(", "),
                    if uncovered.len() == 1 { "it" } else { "them" },
                    why.join("; "),
                )));
            }
        }
        let sets: Vec<LabelSet> = refs.par_iter().map(load_label_set).collect::<Result<_>>()?;
        let mut store = LabelStore::new(coll, self.reference_model.clone());
        for s in sets {
            store.insert(s)?;
        }
        Ok(store)
    }
}

/// A template cut to its first 60 characters, quoted, for error messages.
fn short_template(t: &str) -> String {
    let cut: String = t.chars().take(60).collect();
    if cut.len() < t.len() {
        format!("{cut:?}…")
    } else {
        format!("{cut:?}")
    }
}

/// A table's file name in its corpus folder (the manifest's `file`, else
/// `<table>.parquet`); `manifest` names the manifest in errors.
fn table_file(table: &str, e: &TableEntry, manifest: &str) -> Result<String> {
    let bad = |message: String| BenchError::Manifest {
        path: PathBuf::from(manifest),
        message,
    };
    plain_name("table", table).map_err(bad)?;
    let file = e.file.clone().unwrap_or_else(|| format!("{table}.parquet"));
    plain_name(&format!("file of table {table}"), &file).map_err(bad)?;
    Ok(file)
}

/// Checks that a name read from a manifest (or given for one) is a single plain path
/// component, so that a folder cannot make aisql read or write outside its root:
/// not empty, not `.` or `..`, and without a slash, a backslash or a NUL.
pub fn plain_name(what: &str, name: &str) -> std::result::Result<(), String> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\\', '\0']) {
        return Err(format!(
            "{what} {name:?} is not a plain file or folder name (it would name a path outside the data root)"
        ));
    }
    Ok(())
}

fn find_corpus(source: &LayoutSource, sf: f64) -> Result<(String, CorpusManifest)> {
    let mut found: Vec<(String, CorpusManifest)> = Vec::new();
    let mut available = Vec::new();
    match source {
        LayoutSource::Plain(root) => {
            let dir = root.join("corpora");
            if let Ok(rd) = fs::read_dir(&dir) {
                let mut entries: Vec<PathBuf> = rd
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.is_dir())
                    .collect();
                entries.sort();
                for p in entries {
                    let mpath = p.join("manifest.json");
                    if !mpath.exists() {
                        continue;
                    }
                    let m: CorpusManifest = read_json(&mpath)?;
                    let name = p.file_name().unwrap().to_string_lossy().to_string();
                    if m.corpus_id != name {
                        return Err(BenchError::Manifest {
                            path: mpath,
                            message: format!(
                                "corpus_id {} differs from its folder {name}",
                                m.corpus_id
                            ),
                        });
                    }
                    available.push(format!("{} ({})", m.scale_factor, m.corpus_id));
                    if same_sf(m.scale_factor, sf) {
                        found.push((name, m));
                    }
                }
            }
        }
        LayoutSource::HarnessCache(_) => {
            let p = published_or_err(sf)?;
            let mpath = source.file(&format!("corpora/{}/manifest.json", p.corpus_id));
            if mpath.exists() {
                let m: CorpusManifest = read_json(&mpath)?;
                found.push((p.corpus_id.to_string(), m));
            }
        }
    }
    if found.len() > 1 {
        if let Some(p) = published_for(sf)
            && let Some(i) = found.iter().position(|(id, _)| id == p.corpus_id)
        {
            return Ok(found.swap_remove(i));
        }
        return Err(BenchError::NoCorpus {
            root: source.root().to_path_buf(),
            sf,
            available: format!(
                "several corpora with this scale factor: {}",
                available.join(", ")
            ),
        });
    }
    let Some(one) = found.pop() else {
        if published_for(sf).is_none() && available.iter().all(|a| !a.contains("c_")) {
            // Nothing at all: say which scale factors are published.
        }
        return Err(BenchError::NoCorpus {
            root: source.root().to_path_buf(),
            sf,
            available: if available.is_empty() {
                "none".into()
            } else {
                available.join(", ")
            },
        });
    };
    let m = &one.1;
    if !same_sf(m.scale_factor, sf) {
        return Err(BenchError::Manifest {
            path: source.file(&format!("corpora/{}/manifest.json", one.0)),
            message: format!("scale factor {} but {sf} was asked for", m.scale_factor),
        });
    }
    Ok(one)
}

fn read_collection(source: &LayoutSource, id: &str) -> Result<CollectionManifest> {
    plain_name("collection id", id).map_err(BenchError::Collection)?;
    let path = source.file(&format!("collections/{id}/manifest.json"));
    if !path.exists() {
        return Err(BenchError::Collection(format!(
            "collection {id}: {} is missing",
            path.display()
        )));
    }
    let m: CollectionManifest = read_json(&path)?;
    if m.collection_id != id {
        return Err(BenchError::Manifest {
            path,
            message: format!("collection_id {} differs from {id}", m.collection_id),
        });
    }
    Ok(m)
}

fn check_collection(m: &CollectionManifest, corpus_id: &str, sf: f64) -> Result<()> {
    if m.status != "complete" {
        return Err(BenchError::Collection(format!(
            "collection {} has status {:?}, not complete",
            m.collection_id, m.status
        )));
    }
    if m.corpus_id != corpus_id || !same_sf(m.scale_factor, sf) {
        return Err(BenchError::Collection(format!(
            "collection {} belongs to corpus {} at sf {}, not {corpus_id} at sf {sf}",
            m.collection_id, m.corpus_id, m.scale_factor
        )));
    }
    Ok(())
}

fn choose_collection(
    source: &LayoutSource,
    corpus_id: &str,
    sf: f64,
    explicit: Option<&str>,
) -> Result<Option<CollectionManifest>> {
    if let Some(id) = explicit {
        let m = read_collection(source, id)?;
        check_collection(&m, corpus_id, sf)?;
        return Ok(Some(m));
    }
    let active = source.file(&format!("corpora/{corpus_id}/active_collection.json"));
    if active.exists() {
        let v: serde_json::Value = read_json(&active)?;
        let id = v
            .get("collection_id")
            .and_then(|x| x.as_str())
            .ok_or_else(|| BenchError::Manifest {
                path: active.clone(),
                message: "no collection_id".into(),
            })?;
        let m = read_collection(source, id)?;
        check_collection(&m, corpus_id, sf)?;
        return Ok(Some(m));
    }
    match source {
        LayoutSource::Plain(root) => {
            let mut complete = Vec::new();
            if let Ok(rd) = fs::read_dir(root.join("collections")) {
                for e in rd.flatten() {
                    let p = e.path().join("manifest.json");
                    if let Ok(m) = read_json::<CollectionManifest>(&p)
                        && m.status == "complete"
                        && m.corpus_id == corpus_id
                        && same_sf(m.scale_factor, sf)
                    {
                        complete.push(m);
                    }
                }
            }
            match complete.len() {
                0 => Ok(None),
                1 => Ok(complete.pop()),
                _ => Err(BenchError::Collection(format!(
                    "several complete collections for corpus {corpus_id}: {}; name one",
                    complete
                        .iter()
                        .map(|m| m.collection_id.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))),
            }
        }
        LayoutSource::HarnessCache(_) => {
            let p = published_or_err(sf)?;
            let m = read_collection(source, p.collection_43)?;
            check_collection(&m, corpus_id, sf)?;
            Ok(Some(m))
        }
    }
}

fn load_label_set(r: &LabelSetRef) -> Result<LabelSet> {
    let m = &r.manifest;
    let key = &r.key;
    let lerr = |message: String| BenchError::Labels {
        predicate: key.clone(),
        message,
    };
    let mut set = LabelSet::new(m.predicate.clone(), m.label_set_id.clone());
    let classify = m.predicate.kind == AiKind::Classify;
    let mut rows = 0u64;
    for path in &r.files {
        let perr = |e: &dyn std::fmt::Display| BenchError::Parquet {
            path: path.clone(),
            message: e.to_string(),
        };
        let (_, batches) = read_batches(path, 65_536).map_err(|e| parquet_error(path, e))?;
        for batch in batches {
            let col = |name: &str| {
                batch
                    .column_by_name(name)
                    .cloned()
                    .ok_or_else(|| perr(&format!("no column {name}")))
            };
            let as_str = |name: &str| -> Result<datafusion::arrow::array::ArrayRef> {
                let c = col(name)?;
                if c.data_type() == &DataType::Utf8 {
                    Ok(c)
                } else {
                    datafusion::arrow::compute::cast(&c, &DataType::Utf8).map_err(|e| perr(&e))
                }
            };
            let kcol = as_str("predicate_key")?;
            let lscol = as_str("label_set_id")?;
            let left = as_str("left_id")?;
            let right = as_str("right_id")?;
            let (k, ls, l, rt) = (
                kcol.as_string::<i32>(),
                lscol.as_string::<i32>(),
                left.as_string::<i32>(),
                right.as_string::<i32>(),
            );
            let value = if classify {
                as_str("label")?
            } else {
                col("answer")?
            };
            for i in 0..batch.num_rows() {
                if k.is_null(i) || k.value(i) != key {
                    return Err(lerr(format!(
                        "row {} of {} has predicate_key {:?}",
                        rows + i as u64,
                        path.display(),
                        k.is_valid(i).then(|| k.value(i))
                    )));
                }
                if ls.is_null(i) || ls.value(i) != m.label_set_id {
                    return Err(lerr(format!(
                        "row {} of {} has label_set_id {:?}, not {}",
                        rows + i as u64,
                        path.display(),
                        ls.is_valid(i).then(|| ls.value(i)),
                        m.label_set_id
                    )));
                }
                if l.is_null(i) {
                    return Err(lerr(format!(
                        "row {} of {} has a null left_id",
                        rows + i as u64,
                        path.display()
                    )));
                }
                let r_id = rt.is_valid(i).then(|| rt.value(i));
                if value.is_null(i) {
                    return Err(lerr(format!(
                        "row {} of {} has a null answer",
                        rows + i as u64,
                        path.display()
                    )));
                }
                let v = if classify {
                    LabelValue::Label(value.as_string::<i32>().value(i).to_string())
                } else {
                    LabelValue::Bool(
                        value
                            .as_boolean_opt()
                            .ok_or_else(|| perr(&"answer is not boolean"))?
                            .value(i),
                    )
                };
                set.insert(l.value(i), r_id, v)
                    .map_err(|e| lerr(e.to_string()))?;
            }
            rows += batch.num_rows() as u64;
        }
    }
    if rows != m.rows {
        return Err(BenchError::LabelCount {
            predicate: key.clone(),
            label_set_id: m.label_set_id.clone(),
            expected: m.rows,
            found: rows,
        });
    }
    Ok(set)
}

// ---------------------------------------------------------------- fetch

/// What [`fetch`] did.
#[derive(Debug, Clone, Default)]
pub struct FetchSummary {
    /// Layout root written (the aisql cache root for the CLI).
    pub dest: PathBuf,
    /// Corpus id.
    pub corpus_id: String,
    /// Collection id.
    pub collection_id: String,
    /// Files downloaded.
    pub downloaded: usize,
    /// Files already complete and skipped.
    pub skipped: usize,
    /// Bytes downloaded.
    pub bytes: u64,
}

/// The public bucket as an anonymous S3 store, rooted at the layout root.
pub fn default_source() -> Result<Arc<dyn ObjectStore>> {
    let region = std::env::var("AWS_REGION")
        .or_else(|_| std::env::var("AWS_DEFAULT_REGION"))
        .unwrap_or_else(|_| "us-east-1".into());
    let s3 = object_store::aws::AmazonS3Builder::new()
        .with_bucket_name(BUCKET)
        .with_region(region)
        .with_skip_signature(true)
        .build()
        .map_err(|e| BenchError::Fetch {
            path: format!("s3://{BUCKET}"),
            message: e.to_string(),
        })?;
    Ok(Arc::new(object_store::prefix::PrefixStore::new(
        s3,
        BUCKET_PREFIX,
    )))
}

fn ferr(path: &str, e: impl std::fmt::Display) -> BenchError {
    BenchError::Fetch {
        path: path.into(),
        message: e.to_string(),
    }
}

async fn get_json<T: serde::de::DeserializeOwned>(
    source: &Arc<dyn ObjectStore>,
    rel: &str,
) -> Result<(T, Vec<u8>)> {
    let bytes = source
        .get(&ObjPath::from(rel))
        .await
        .map_err(|e| ferr(rel, e))?
        .bytes()
        .await
        .map_err(|e| ferr(rel, e))?;
    let v = serde_json::from_slice(&bytes).map_err(|e| ferr(rel, format!("bad JSON: {e}")))?;
    Ok((v, bytes.to_vec()))
}

/// Downloads `rel` to `dest/rel` unless a file of the same size is already there.
async fn download(
    source: &Arc<dyn ObjectStore>,
    rel: &str,
    dest: &Path,
    sum: &mut FetchSummary,
) -> Result<PathBuf> {
    let target = dest.join(rel);
    let meta = source
        .head(&ObjPath::from(rel))
        .await
        .map_err(|e| ferr(rel, e))?;
    if let Ok(m) = fs::metadata(&target)
        && m.len() == meta.size
    {
        sum.skipped += 1;
        return Ok(target);
    }
    if let Some(p) = target.parent() {
        fs::create_dir_all(p).map_err(|e| io(p, e))?;
    }
    let part = target.with_extension("partial");
    let mut f = File::create(&part).map_err(|e| io(&part, e))?;
    let mut stream = source
        .get(&ObjPath::from(rel))
        .await
        .map_err(|e| ferr(rel, e))?
        .into_stream();
    let mut n = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| ferr(rel, e))?;
        f.write_all(&chunk).map_err(|e| io(&part, e))?;
        n += chunk.len() as u64;
    }
    f.sync_all().map_err(|e| io(&part, e))?;
    drop(f);
    if n != meta.size {
        return Err(ferr(rel, format!("got {n} bytes, expected {}", meta.size)));
    }
    fs::rename(&part, &target).map_err(|e| io(&target, e))?;
    sum.downloaded += 1;
    sum.bytes += n;
    Ok(target)
}

fn write_bytes(path: &Path, bytes: &[u8]) -> Result<()> {
    if let Some(p) = path.parent() {
        fs::create_dir_all(p).map_err(|e| io(p, e))?;
    }
    fs::write(path, bytes).map_err(|e| io(path, e))
}

/// Mirrors the published corpus and its collection for `sf` from `source` (paths
/// relative to the layout root; [`default_source`] for the real bucket) into the
/// plain layout under `dest`. Verifies table row counts (and file hashes where the
/// manifest gives `file_sha256`) and label row counts; resumable: complete files are
/// skipped, manifests are written last. Ends with [`Dataset::open`] on the result.
pub async fn fetch(source: Arc<dyn ObjectStore>, dest: &Path, sf: f64) -> Result<FetchSummary> {
    let p = published_or_err(sf)?;
    fetch_corpus(source, dest, sf, p.corpus_id, None).await
}

/// [`fetch`] of any corpus id (and optionally a named collection).
pub async fn fetch_corpus(
    source: Arc<dyn ObjectStore>,
    dest: &Path,
    sf: f64,
    corpus_id: &str,
    collection: Option<&str>,
) -> Result<FetchSummary> {
    let mut sum = FetchSummary {
        dest: dest.to_path_buf(),
        corpus_id: corpus_id.into(),
        ..Default::default()
    };
    let cdir = format!("corpora/{corpus_id}");
    let (manifest, manifest_bytes): (CorpusManifest, _) =
        get_json(&source, &format!("{cdir}/manifest.json")).await?;
    if manifest.corpus_id != corpus_id || !same_sf(manifest.scale_factor, sf) {
        return Err(ferr(
            &format!("{cdir}/manifest.json"),
            format!(
                "names corpus {} at sf {}",
                manifest.corpus_id, manifest.scale_factor
            ),
        ));
    }
    for (t, e) in &manifest.tables {
        let rel = format!(
            "{cdir}/{}",
            table_file(t, e, &format!("{cdir}/manifest.json"))?
        );
        let path = download(&source, &rel, dest, &mut sum).await?;
        let found = parquet_rows(&path)?;
        if found != e.rows {
            let _ = fs::remove_file(&path);
            return Err(BenchError::RowCount {
                table: t.clone(),
                path,
                expected: e.rows,
                found,
            });
        }
        if let Some(h) = &e.file_sha256 {
            let got = sha256_file(&path)?;
            if &got != h {
                let _ = fs::remove_file(&path);
                return Err(BenchError::Hash {
                    path,
                    expected: h.clone(),
                    found: got,
                });
            }
        }
    }
    let active_rel = format!("{cdir}/active_collection.json");
    let active: Option<(serde_json::Value, Vec<u8>)> = get_json(&source, &active_rel).await.ok();
    let coll_id = match (collection, &active) {
        (Some(c), _) => c.to_string(),
        (None, Some((v, _))) => v
            .get("collection_id")
            .and_then(|x| x.as_str())
            .map(str::to_string)
            .ok_or_else(|| ferr(&active_rel, "no collection_id"))?,
        (None, None) => published_for(sf)
            .map(|p| p.collection_43.to_string())
            .ok_or_else(|| ferr(&active_rel, "missing"))?,
    };
    plain_name("collection id", &coll_id).map_err(|m| ferr(&active_rel, m))?;
    let coll_rel = format!("collections/{coll_id}/manifest.json");
    let (coll, coll_bytes): (CollectionManifest, _) = get_json(&source, &coll_rel).await?;
    check_collection(&coll, corpus_id, sf)?;
    // Locate label sets by listing label_sets/.
    let mut objects: Vec<String> = Vec::new();
    let mut listing = source.list(Some(&ObjPath::from("label_sets")));
    while let Some(meta) = listing.next().await {
        objects.push(
            meta.map_err(|e| ferr("label_sets/", e))?
                .location
                .to_string(),
        );
    }
    for (key, ls_id) in &coll.label_sets {
        let prefix = objects
            .iter()
            .filter_map(|o| {
                o.find(&format!("/{ls_id}/"))
                    .map(|i| o[..i + ls_id.len() + 2].to_string())
            })
            .next()
            .ok_or_else(|| {
                ferr(
                    &format!("label_sets/…/{ls_id}/"),
                    format!("label set of {key} not found"),
                )
            })?;
        let mrel = format!("{prefix}manifest.json");
        let (lm, lm_bytes): (LabelSetManifest, _) = get_json(&source, &mrel).await?;
        let single = format!("{prefix}labels.parquet");
        let mut files: Vec<&String> = objects.iter().filter(|o| **o == single).collect();
        if files.is_empty() {
            files = objects
                .iter()
                .filter(|o| o.starts_with(&format!("{prefix}parts/")) && o.ends_with(".parquet"))
                .collect();
        }
        let mut rows = 0;
        for f in files {
            let path = download(&source, f, dest, &mut sum).await?;
            rows += parquet_rows(&path)?;
        }
        if rows != lm.rows {
            return Err(BenchError::LabelCount {
                predicate: key.clone(),
                label_set_id: ls_id.clone(),
                expected: lm.rows,
                found: rows,
            });
        }
        write_bytes(&dest.join(&mrel), &lm_bytes)?;
    }
    write_bytes(&dest.join(format!("{cdir}/manifest.json")), &manifest_bytes)?;
    if let Some((_, b)) = &active {
        write_bytes(&dest.join(&active_rel), b)?;
    }
    write_bytes(&dest.join(&coll_rel), &coll_bytes)?;
    sum.collection_id = coll_id.clone();
    Dataset::open(dest, sf, Some(&coll_id))?;
    Ok(sum)
}

#[cfg(test)]
mod tests {
    // The reader over generated roots is tested in `crate::layout_tests` (the
    // generator sits above this module).
    use super::*;

    #[test]
    fn published_ids_harness_names_and_label_paths() {
        assert!(published_for(0.5).is_some() && published_for(0.25).is_none());
        assert_eq!(harness_name("x").len(), 64);
        let hc = LayoutSource::HarnessCache(PathBuf::from("/nonexistent"));
        assert!(
            hc.file("corpora/c_1/manifest.json")
                .ends_with(harness_name("corpora/c_1/manifest.json"))
        );
        assert_eq!(
            labels_predicate_dir("quailb.imdb.review.sentiment"),
            Path::new("imdb").join("review.sentiment")
        );
        assert_eq!(labels_predicate_dir("x"), PathBuf::from("x"));
    }

    #[test]
    fn fetch_rejects_an_unpublished_scale_factor() {
        let d = tempfile::tempdir().unwrap();
        let src: Arc<dyn ObjectStore> =
            Arc::new(object_store::local::LocalFileSystem::new_with_prefix(d.path()).unwrap());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let e = rt
            .block_on(fetch(src, d.path(), 0.2))
            .unwrap_err()
            .to_string();
        assert!(e.contains("0.2") && e.contains("published"), "{e}");
    }
}
