//! Opening a corpus of a layout root ([`Dataset::open`]): finding the corpus of a
//! scale factor, choosing its collection, and checking the tables a query reads.
//! Its label sets are loaded by [`crate::layout::labels`]'s half of [`Dataset`].

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use aisql_engine::data::tables::TablePaths;

use super::facts::{LayoutSource, PUBLISHED, published_for, published_or_err, same_sf};
use super::files::{parquet_rows, plain_name, read_json, table_file};
use super::{CollectionManifest, CorpusManifest, TABLES};
use crate::error::{BenchError, Result};
use crate::quailb::labels::LabelStore;

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
    pub(super) shared: SharedLabels,
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

pub(super) fn check_collection(m: &CollectionManifest, corpus_id: &str, sf: f64) -> Result<()> {
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
