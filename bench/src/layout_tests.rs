//! Tests of the layout reader ([`crate::layout`]) over stand-in roots written by the
//! generator: here rather than in `layout`, which does not depend on the generator.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use object_store::ObjectStore;

use crate::layout::*;
use aisql_standin::{self as standin, generate, predicates};

const SF: f64 = 0.001;

fn small_root() -> (tempfile::TempDir, standin::GenerateSummary) {
    let d = tempfile::tempdir().unwrap();
    let s = generate(d.path(), SF).unwrap();
    (d, s)
}

/// Moved from the generator's tests, which cannot see the published table.
#[test]
fn standin_ids_are_never_published_ids() {
    let (_d, s) = small_root();
    assert!(!PUBLISHED.iter().any(|p| p.corpus_id == s.corpus_id));
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            copy_dir(&p, &to.join(e.file_name()));
        } else {
            fs::copy(&p, to.join(e.file_name())).unwrap();
        }
    }
}

fn copy_of(root: &Path) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    copy_dir(root, d.path());
    d
}

fn template_of(name: &str) -> String {
    predicates()
        .iter()
        .find(|p| p.name == name)
        .unwrap()
        .template
        .to_string()
}

#[test]
fn standin_opens_and_every_plan_predicate_has_complete_labels() {
    let (d, s) = small_root();
    let ds = Dataset::open(d.path(), SF, None).unwrap();
    assert!(ds.standin && !ds.is_published() && !ds.is_published_collection());
    assert_eq!(ds.collection_id.as_deref(), Some(s.collection_id.as_str()));
    assert!(s.collection_id.starts_with("gt_") && s.collection_id.len() == 35);
    assert_eq!(ds.label_sets.len(), 31);
    assert_eq!(ds.require_all_tables().unwrap().len(), 9);
    let store = ds.load_labels(None).unwrap();
    let rows = &ds.table_rows;
    for p in predicates() {
        let set = store
            .for_template(p.template)
            .unwrap_or_else(|| panic!("no labels for {}", p.key));
        let n = rows[p.left.0] * p.right.map(|r| rows[r.0]).unwrap_or(1);
        if p.name == "IMDB_ASPECT_SENTIMENT" {
            // Only the pairs the reference join keeps (DISCUSS_ASPECT TRUE).
            let disc = store.for_template(&template_of("DISCUSS_ASPECT")).unwrap();
            let kept = (0..rows["reviews"])
                .flat_map(|r| (0..12).map(move |a| (r, a)))
                .filter(|(r, a)| {
                    disc.get_bool(&format!("rv{r}"), Some(&format!("as{a}"))) == Some(true)
                })
                .count();
            assert_eq!(set.len(), kept);
            assert!(kept > 0);
        } else {
            assert_eq!(set.len() as u64, n, "{}", p.key);
        }
    }
    // LEPJOIN agrees with the list columns.
    let lep = store.for_template(&template_of("LEPJOIN")).unwrap();
    assert!(lep.get_bool("lc0", Some("lp0")) == Some(true));
    // Every template of the 43 shipped plans has a label set.
    let mut seen = 0;
    for (id, plan) in crate::plans::PlanSource::Embedded
        .select(None, Default::default())
        .unwrap()
    {
        for t in plan.templates() {
            assert!(
                store.for_template(&t).is_some(),
                "{id}: no label set for template {t:?}"
            );
            seen += 1;
        }
    }
    assert!(seen >= 43, "{seen}");
    // Loading a subset only loads those.
    let one = vec![predicates()[0].template.to_string()];
    assert_eq!(ds.load_labels(Some(&one)).unwrap().sets().count(), 1);
}

/// A root with only the IMDB tables and label sets (a user who has one dataset) runs
/// IMDB queries; what it lacks is named exactly when asked for.
#[test]
fn a_root_with_one_dataset_serves_its_queries() {
    let (d, s) = small_root();
    let imdb = copy_of(d.path());
    let cdir = imdb.path().join("corpora").join(&s.corpus_id);
    // The tables and templates of the IMDB predicates (what IMDB plans read).
    let imdb_preds: Vec<_> = predicates()
        .iter()
        .filter(|p| p.key.starts_with("quailb.imdb."))
        .collect();
    let tables: BTreeSet<&str> = imdb_preds
        .iter()
        .flat_map(|p| [Some(p.left.0), p.right.map(|r| r.0)])
        .flatten()
        .collect();
    assert_eq!(tables, BTreeSet::from(["aspects", "reviews"]));
    for t in TABLES {
        if !tables.contains(t) {
            fs::remove_file(cdir.join(format!("{t}.parquet"))).unwrap();
        }
    }
    for e in fs::read_dir(imdb.path().join("label_sets"))
        .unwrap()
        .flatten()
    {
        if e.file_name() != "imdb" {
            fs::remove_dir_all(e.path()).unwrap();
        }
    }
    let ds = Dataset::open(imdb.path(), SF, None).unwrap();
    // The manifest's view stays complete (unchecked).
    assert_eq!(ds.tables.len(), 9);
    let needed: Vec<&str> = tables.iter().copied().collect();
    let paths = ds.require_tables(&needed).unwrap();
    assert_eq!(paths.keys().map(String::as_str).collect::<Vec<_>>(), needed);
    assert_eq!(paths["reviews"], cdir.join("reviews.parquet"));
    // The tables of a shipped IMDB plan.
    let q = crate::plans::PlanSource::Embedded.plan("IMDB-1").unwrap();
    let names: Vec<&str> = q.relations.iter().map(|r| r.table.as_str()).collect();
    ds.require_tables(&names).unwrap();
    let templates: Vec<String> = imdb_preds.iter().map(|p| p.template.to_string()).collect();
    let store = ds.load_labels(Some(&templates)).unwrap();
    assert_eq!(store.sets().count(), imdb_preds.len());
    // A table whose file is missing.
    let e = ds.require_tables(&["reviews", "claims"]).unwrap_err();
    let claims = cdir.join("claims.parquet");
    assert_eq!(
        e.to_string(),
        format!("table claims: file {} is missing", claims.display())
    );
    // A table the manifest does not list.
    let e = ds.require_tables(&["policies"]).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "table policies is not in the corpus manifest {}",
            cdir.join("manifest.json").display()
        )
    );
    // A template whose label set is missing names the predicate and the label set.
    let f11 = predicates().iter().find(|p| p.name == "F11").unwrap();
    let f11_ls = &ds.label_sets[f11.key];
    let e = ds
        .load_labels(Some(&[f11.template.to_string()]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(f11.key) && e.contains(f11_ls.as_str()) && e.contains("missing"),
        "{e}"
    );
    let e = ds.label_set(f11.key).unwrap_err().to_string();
    assert!(e.contains(f11.key) && e.contains(f11_ls.as_str()), "{e}");
    // Loading everything needs everything.
    assert!(ds.load_labels(None).is_err());
    // A template of no label set is left out (it cannot be scored) when nothing is missing.
    let full = Dataset::open(d.path(), SF, None).unwrap();
    let store = full
        .load_labels(Some(&["no such template {0}".to_string()]))
        .unwrap();
    assert_eq!(store.sets().count(), 0);
}

#[test]
fn bad_roots_give_clear_errors() {
    let (d, s) = small_root();
    let cdir = |root: &Path| root.join("corpora").join(&s.corpus_id);
    // Unknown scale factor: at open.
    let e = Dataset::open(d.path(), 0.3, None).unwrap_err().to_string();
    assert!(e.contains("0.3") && e.contains("0.001"), "{e}");
    // Missing table: when it is required, not before.
    let bad = copy_of(d.path());
    fs::remove_file(cdir(bad.path()).join("terms.parquet")).unwrap();
    let ds = Dataset::open(bad.path(), SF, None).unwrap();
    ds.require_tables(&["reviews", "reports"]).unwrap();
    let e = ds.require_all_tables().unwrap_err().to_string();
    assert!(e.contains("terms") && e.contains("missing"), "{e}");
    // Truncated Parquet: when required.
    let bad = copy_of(d.path());
    let f = cdir(bad.path()).join("claims.parquet");
    let bytes = fs::read(&f).unwrap();
    fs::write(&f, &bytes[..bytes.len() / 2]).unwrap();
    let ds = Dataset::open(bad.path(), SF, None).unwrap();
    let e = ds.require_tables(&["claims"]).unwrap_err().to_string();
    assert!(e.contains("claims.parquet"), "{e}");
    // Manifest with wrong counts: when required.
    let bad = copy_of(d.path());
    let mpath = cdir(bad.path()).join("manifest.json");
    let mut m: CorpusManifest = serde_json::from_str(&fs::read_to_string(&mpath).unwrap()).unwrap();
    m.tables.get_mut("reviews").unwrap().rows += 1;
    fs::write(&mpath, serde_json::to_string(&m).unwrap()).unwrap();
    let ds = Dataset::open(bad.path(), SF, None).unwrap();
    assert_eq!(ds.table_rows["reviews"], 51);
    let e = ds.require_tables(&["reviews"]).unwrap_err().to_string();
    assert!(
        e.contains("reviews") && e.contains("51") && e.contains("50"),
        "{e}"
    );
    // Label manifest with wrong rows: when its labels are loaded.
    let bad = copy_of(d.path());
    let ds = Dataset::open(bad.path(), SF, None).unwrap();
    let key = "quailb.imdb.review.sentiment";
    let r = ds.label_set(key).unwrap();
    let dir = r.files[0].parent().unwrap();
    let mut lm = r.manifest.clone();
    lm.rows = 7;
    fs::write(
        dir.join("manifest.json"),
        serde_json::to_string(&lm).unwrap(),
    )
    .unwrap();
    let ds = Dataset::open(bad.path(), SF, None).unwrap();
    let e = ds.load_labels(None).unwrap_err().to_string();
    assert!(
        e.contains(key) && e.contains('7') && e.contains("50"),
        "{e}"
    );
    let e = ds
        .load_labels(Some(&[lm.predicate.template.clone()]))
        .unwrap_err()
        .to_string();
    assert!(e.contains(key) && e.contains('7'), "{e}");
    // Others still load.
    ds.load_labels(Some(&[template_of("F1")])).unwrap();
    // An incomplete label set: at its manifest, when it is needed.
    lm.rows = r.manifest.rows;
    lm.status = "running".into();
    fs::write(
        dir.join("manifest.json"),
        serde_json::to_string(&lm).unwrap(),
    )
    .unwrap();
    let e = ds.label_set(key).unwrap_err().to_string();
    assert!(e.contains("manifest.json") && e.contains("running"), "{e}");
    ds.load_labels(Some(&[template_of("F1")])).unwrap();
    // The active collection names a missing collection: at open.
    let bad = copy_of(d.path());
    fs::remove_dir_all(bad.path().join("collections").join(&s.collection_id)).unwrap();
    let e = Dataset::open(bad.path(), SF, None).unwrap_err().to_string();
    assert!(e.contains(&s.collection_id) && e.contains("missing"), "{e}");
}

#[test]
fn fetch_mirrors_a_local_object_store_and_resumes() {
    let (d, s) = small_root();
    let src: Arc<dyn ObjectStore> =
        Arc::new(object_store::local::LocalFileSystem::new_with_prefix(d.path()).unwrap());
    let dest = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let sum = rt
        .block_on(fetch_corpus(
            src.clone(),
            dest.path(),
            SF,
            &s.corpus_id,
            None,
        ))
        .unwrap();
    assert_eq!(sum.collection_id, s.collection_id);
    assert!(sum.downloaded >= 9 + 31 && sum.skipped == 0, "{sum:?}");
    let ds = Dataset::open(dest.path(), SF, None).unwrap();
    ds.require_all_tables().unwrap();
    assert_eq!(ds.load_labels(None).unwrap().sets().count(), 31);
    // Second run skips complete files.
    let again = rt
        .block_on(fetch_corpus(
            src.clone(),
            dest.path(),
            SF,
            &s.corpus_id,
            None,
        ))
        .unwrap();
    assert_eq!(again.downloaded, 0);
    assert_eq!(again.skipped, sum.downloaded);
    // Hash check: a source file that differs from its manifest is rejected.
    let bad = copy_of(d.path());
    let cdir: PathBuf = bad.path().join("corpora").join(&s.corpus_id);
    assert!(cdir.join("aspects.parquet").exists());
    let mpath = cdir.join("manifest.json");
    let mut m: CorpusManifest = serde_json::from_str(&fs::read_to_string(&mpath).unwrap()).unwrap();
    m.tables.get_mut("aspects").unwrap().file_sha256 = Some("00".repeat(32));
    fs::write(&mpath, serde_json::to_string(&m).unwrap()).unwrap();
    let src2: Arc<dyn ObjectStore> =
        Arc::new(object_store::local::LocalFileSystem::new_with_prefix(bad.path()).unwrap());
    let dest2 = tempfile::tempdir().unwrap();
    let e = rt
        .block_on(fetch_corpus(src2, dest2.path(), SF, &s.corpus_id, None))
        .unwrap_err()
        .to_string();
    assert!(e.contains("aspects") && e.contains("sha256"), "{e}");
}

/// Names a folder says about itself (table files, collection ids) cannot make aisql
/// read or write outside the root.
#[test]
fn names_that_would_leave_the_root_are_refused() {
    let (d, s) = small_root();
    let cdir = |root: &Path| root.join("corpora").join(&s.corpus_id);
    // A table whose file is `../…`.
    let bad = copy_of(d.path());
    let mpath = cdir(bad.path()).join("manifest.json");
    let mut m: CorpusManifest = serde_json::from_str(&fs::read_to_string(&mpath).unwrap()).unwrap();
    m.tables.get_mut("reviews").unwrap().file = Some("../../reviews.parquet".into());
    fs::write(&mpath, serde_json::to_string(&m).unwrap()).unwrap();
    let e = Dataset::open(bad.path(), SF, None).unwrap_err().to_string();
    assert!(
        e.contains("reviews") && e.contains("outside the data root") && e.contains("manifest.json"),
        "{e}"
    );
    // An active collection id with a path in it.
    let bad = copy_of(d.path());
    fs::write(
        cdir(bad.path()).join("active_collection.json"),
        r#"{"collection_id": "../../../etc"}"#,
    )
    .unwrap();
    let e = Dataset::open(bad.path(), SF, None).unwrap_err().to_string();
    assert!(
        e.contains("../../../etc") && e.contains("outside the data root"),
        "{e}"
    );
    // So is one given on the command line.
    let e = Dataset::open(d.path(), SF, Some("gt_x/../../y"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("outside the data root"), "{e}");
    for ok in [
        "reviews.parquet",
        "gt_72abc9af3feaea668e493ece67e980a0",
        "a..b",
    ] {
        plain_name("name", ok).unwrap();
    }
    for bad in ["", ".", "..", "a/b", "a\\b", "a\0b", "/etc"] {
        assert!(plain_name("name", bad).is_err(), "{bad:?}");
    }
}
