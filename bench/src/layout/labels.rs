//! Loading a collection's label sets ([`Dataset::label_set`],
//! [`Dataset::load_labels`], [`Dataset::shared_labels`]): locating each one in a
//! plain root or the harness cache, checking its manifest against the collection
//! and the corpus, and reading and checking its rows into a [`LabelStore`].

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use aisql_engine::data::parquet_read::read_batches;
use aisql_engine::inference::backend::AiKind;
use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::DataType;
use rayon::prelude::*;

use super::dataset::Dataset;
use super::facts::LayoutSource;
use super::files::{parquet_error, plain_name, read_json};
use super::{LabelSetManifest, labels_predicate_dir};
use crate::error::{BenchError, Result};
use crate::quailb::labels::{LabelSet, LabelStore, LabelValue};

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

/// Where the label sets are, found once per [`Dataset::load_labels`] call.
enum LabelDirs {
    /// Plain layout: label-set id → folder.
    Found(HashMap<String, PathBuf>),
    /// Harness cache: paths follow [`labels_predicate_dir`].
    ByRule,
}

impl Dataset {
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
