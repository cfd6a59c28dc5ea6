//! Which QUAIL-B dataset a command runs on: the look-up order over the published
//! layout ([`crate::layout`]) that falls back to the stand-in ([`aisql_standin`]),
//! generated on first use and regenerated when the cached one is out of date.
//!
//! This module sits above both so that the layout reader does not depend on the
//! generator (it shares only the manifest formats, `aisql_standin::manifest`). Whether
//! a cached stand-in is current ([`stale_reason`]) is decided here, over the
//! [`Dataset`] the reader opened, from the ids and seal the generator computes.

use std::collections::BTreeMap;
use std::path::Path;

use aisql_engine::data::cache_dir::check_seal;
use aisql_standin::{
    GENERATOR_VERSION, collection_id, corpus_id, label_set_id, predicates, seal_path, sorted_tables,
};

use crate::error::{BenchError, Result};
use crate::layout::{
    Dataset, LayoutSource, harness_cache_dir, published_cache_root, published_for, standin_root,
};

/// The dataset for scale factor `sf` (with collection `collection`, else the active
/// one), in this order: `root` (a local mirror of the published layout); aisql's
/// cache (`<cache>/quailb/`) when it holds the published corpus; the QUAIL-B harness
/// cache when it holds it; else the stand-in under `<cache>/quailb-standin/`
/// ([`open_standin`]). Only the manifests are checked (see [`Dataset::open`]).
pub fn resolve(root: Option<&Path>, sf: f64, collection: Option<&str>) -> Result<Dataset> {
    if let Some(r) = root {
        return Dataset::open(r, sf, collection);
    }
    if let Some(p) = published_for(sf) {
        let cache = published_cache_root();
        if cache
            .join("corpora")
            .join(p.corpus_id)
            .join("manifest.json")
            .exists()
        {
            return Dataset::open(&cache, sf, collection);
        }
        let hc = LayoutSource::HarnessCache(harness_cache_dir());
        if hc
            .file(&format!("corpora/{}/manifest.json", p.corpus_id))
            .exists()
        {
            return Dataset::open_source(hc, sf, collection);
        }
    }
    let root = standin_root();
    let ds = open_standin(&root, sf)?;
    match collection {
        Some(c) if ds.collection_id.as_deref() != Some(c) => Err(BenchError::Collection(format!(
            "collection {c} not found: no published QUAIL-B data for sf {sf} is cached, and \
             the stand-in at {} has collection {}",
            root.display(),
            ds.collection_id.as_deref().unwrap_or("(none)")
        ))),
        _ => Ok(ds),
    }
}

/// The stand-in of `sf` under `root`: the cached one when it is what this generator
/// would write ([`stale_reason`]: same generator version, ids that are this
/// generator's hashes of its manifests), else generated afresh (replacing a stale one).
/// Prints one line on stderr saying the stand-in is used.
pub fn open_standin(root: &Path, sf: f64) -> Result<Dataset> {
    let why = match Dataset::open(root, sf, None) {
        Ok(d) => match stale_reason(&d) {
            None => {
                let _ = aisql_engine::errln!(
                    "note: published QUAIL-B data for sf {sf} not found; using the deterministic stand-in corpus {} at {} (not the published data)",
                    d.corpus_id,
                    root.display()
                );
                return Ok(d);
            }
            Some(reason) => format!("the cached stand-in is out of date: {reason}"),
        },
        Err(_) => "published QUAIL-B data not found".to_string(),
    };
    let _ = aisql_engine::errln!(
        "note: {why}; generating the deterministic stand-in corpus for sf {sf} at {} (not the published data)",
        root.display()
    );
    aisql_standin::generate(root, sf)?;
    let d = Dataset::open(root, sf, None)?;
    // The generator's own output must pass its own check; anything else is a bug that
    // would regenerate on every run.
    if let Some(reason) = stale_reason(&d) {
        return Err(BenchError::Generate(format!(
            "the stand-in just written at {} fails its check: {reason}",
            root.display()
        )));
    }
    Ok(d)
}

/// Why the stand-in `ds` is not what this generator would write for its scale factor
/// (`None` when it is): not a stand-in, another generator version, or ids that are
/// not the hashes this generator computes from the manifests (e.g. a cache written
/// before the ids were canonical), or files that no longer match the seal written
/// when it was generated (hashing every file of the corpus and its label sets).
pub fn stale_reason(ds: &Dataset) -> Option<String> {
    let m = &ds.manifest;
    if !ds.standin {
        return Some(format!("corpus {} is not a stand-in", ds.corpus_id));
    }
    let generator = m.extra.get("generator").and_then(|g| g.as_str());
    if generator != Some(GENERATOR_VERSION) {
        return Some(format!(
            "made by generator {}, not {GENERATOR_VERSION}",
            generator.unwrap_or("aisql-standin-v1")
        ));
    }
    if m.tables.keys().map(String::as_str).ne(sorted_tables()) {
        return Some(format!(
            "its manifest lists tables {:?}",
            m.tables.keys().collect::<Vec<_>>()
        ));
    }
    let want = corpus_id(m.scale_factor, &m.tables);
    if want != ds.corpus_id {
        return Some(format!(
            "corpus id {} is not the hash of its manifest ({want})",
            ds.corpus_id
        ));
    }
    let Some(coll) = &ds.collection_id else {
        return Some("it has no complete collection".into());
    };
    let sets: BTreeMap<String, String> = predicates()
        .iter()
        .map(|p| (p.key.to_string(), label_set_id(&ds.corpus_id, p)))
        .collect();
    if sets != ds.label_sets {
        return Some(format!(
            "collection {coll} does not map the predicates to this generator's label sets"
        ));
    }
    let want = collection_id(&ds.corpus_id, &sets);
    if &want != coll {
        return Some(format!(
            "collection id {coll} is not the hash of its label sets ({want})"
        ));
    }
    // Its files as generated: a truncated or edited cache entry is rebuilt.
    let root = ds.source.root();
    check_seal(root, &seal_path(root, &ds.corpus_id)).err()
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::Path;

    use super::*;
    use crate::layout::{CorpusManifest, published_cache_root};

    const SF: f64 = 0.001;

    /// Renames the corpus `from` of a stand-in root to `to` (folder, manifest and its
    /// collection), optionally dropping the manifest's `generator` as versions before
    /// v2 wrote it: what a cache written by another generator looks like when opened.
    fn rename_corpus(root: &Path, from: &str, to: &str, drop_generator: bool) {
        let corpora = root.join("corpora");
        fs::rename(corpora.join(from), corpora.join(to)).unwrap();
        let mpath = corpora.join(to).join("manifest.json");
        let mut m: CorpusManifest =
            serde_json::from_str(&fs::read_to_string(&mpath).unwrap()).unwrap();
        m.corpus_id = to.into();
        if drop_generator {
            m.extra.remove("generator");
        }
        fs::write(&mpath, serde_json::to_string(&m).unwrap()).unwrap();
        for e in fs::read_dir(root.join("collections")).unwrap().flatten() {
            let p = e.path().join("manifest.json");
            let text = fs::read_to_string(&p).unwrap().replace(from, to);
            fs::write(&p, text).unwrap();
        }
    }

    /// The id the v1 generator gave: the hash of serde_json's insertion-ordered (not
    /// canonical) output of the identity object, whose `generator` was v1.
    fn v1_corpus_id(m: &CorpusManifest) -> String {
        use sha2::{Digest, Sha256};
        let mut identity = aisql_standin::corpus_identity(m.scale_factor, &m.tables);
        identity["generator"] = "aisql-standin-v1".into();
        let text = serde_json::to_string(&identity).unwrap();
        assert_ne!(text, aisql_standin::canonical::to_string(&identity));
        format!("c_{}", &hex::encode(Sha256::digest(text.as_bytes()))[..32])
    }

    #[test]
    fn a_cached_standin_is_reused_when_current_and_regenerated_when_stale() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        // First use generates; the result passes its own check.
        let fresh = open_standin(root, SF).unwrap();
        assert_eq!(stale_reason(&fresh), None);
        let id = fresh.corpus_id.clone();
        let marker = root.join("corpora").join(&id).join("marker");
        fs::write(&marker, "x").unwrap();
        // A current cache is used as it is.
        let again = open_standin(root, SF).unwrap();
        assert_eq!(again.corpus_id, id);
        assert!(marker.exists(), "a current stand-in was regenerated");

        // A cache of the v1 generator (ids over non-canonical JSON, no `generator`).
        let old = v1_corpus_id(&fresh.manifest);
        rename_corpus(root, &id, &old, true);
        let stale = Dataset::open(root, SF, None).unwrap();
        assert_eq!(stale.corpus_id, old);
        let why = stale_reason(&stale).unwrap();
        assert!(why.contains("aisql-standin-v1"), "{why}");
        let d2 = open_standin(root, SF).unwrap();
        assert_eq!(d2.corpus_id, id);
        assert!(!root.join("corpora").join(&old).exists());
        d2.require_all_tables().unwrap();
        assert_eq!(d2.load_labels(None).unwrap().sets().count(), 31);

        // Ids that are not this generator's hashes, whatever the version says.
        rename_corpus(root, &id, "c_0123456789abcdef0123456789abcdef", false);
        let stale = Dataset::open(root, SF, None).unwrap();
        let why = stale_reason(&stale).unwrap();
        assert!(why.contains("not the hash"), "{why}");
        assert_eq!(open_standin(root, SF).unwrap().corpus_id, id);
        // A collection whose id is not the hash of its label sets.
        let coll = d2.collection_id.clone().unwrap();
        let cpath = root.join("collections").join(&coll).join("manifest.json");
        let text = fs::read_to_string(&cpath).unwrap();
        let other = "gt_0123456789abcdef0123456789abcdef";
        fs::create_dir_all(root.join("collections").join(other)).unwrap();
        fs::write(
            root.join("collections").join(other).join("manifest.json"),
            text.replace(&coll, other),
        )
        .unwrap();
        let stale = Dataset::open(root, SF, Some(other)).unwrap();
        let why = stale_reason(&stale).unwrap();
        assert!(why.contains(other), "{why}");
    }

    #[test]
    fn resolve_prefers_the_root() {
        let d = tempfile::tempdir().unwrap();
        let s = aisql_standin::generate(d.path(), SF).unwrap();
        let ds = resolve(Some(d.path()), SF, None).unwrap();
        assert_eq!(ds.corpus_id, s.corpus_id);
        let e = resolve(Some(d.path()), SF, Some("gt_nope"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("gt_nope"), "{e}");
        // The caches hang off aisql's one cache folder.
        let cache = aisql_engine::data::cache_dir::cache_dir();
        assert_eq!(published_cache_root(), cache.join("quailb"));
        assert_eq!(standin_root(), cache.join("quailb-standin"));
    }
}
