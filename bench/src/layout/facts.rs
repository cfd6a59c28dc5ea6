//! What is fixed about the published QUAIL-B layout (SPEC §C): the bucket, the
//! published corpus and collection ids, the two ways its files lie on disk
//! ([`LayoutSource`]) and the cache roots aisql and the harness use.

use std::path::{Path, PathBuf};

use aisql_engine::data::cache_dir::cache_dir;
use sha2::{Digest, Sha256};

use crate::error::{BenchError, Result};

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

pub(super) fn same_sf(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// The published corpus of a scale factor, if there is one.
pub fn published_for(sf: f64) -> Option<&'static PublishedCorpus> {
    PUBLISHED.iter().find(|p| same_sf(p.scale_factor, sf))
}

pub(super) fn published_or_err(sf: f64) -> Result<&'static PublishedCorpus> {
    published_for(sf).ok_or_else(|| {
        BenchError::ScaleFactor(format!(
            "no published QUAIL-B corpus for scale factor {sf} (published: 0.1, 0.5, 1.0); \
             use the stand-in (`aisql data generate --sf {sf}`) instead"
        ))
    })
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::labels_predicate_dir;

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
}
