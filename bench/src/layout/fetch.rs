//! `aisql data fetch`: mirroring a published corpus and its collection from an
//! object store into a plain layout root, checked as it lands and resumable.
//!
//! Remote source: the public bucket `quail-bench` over anonymous S3 (HTTPS, no
//! signature) via `object_store`'s `aws` feature, prefix
//! `ground_truth/quailb/schema_v1/` ([`default_source`]); region `us-east-1` unless
//! `AWS_REGION`/`AWS_DEFAULT_REGION` says otherwise.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::StreamExt;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt};

use super::dataset::{Dataset, check_collection};
use super::facts::{BUCKET, BUCKET_PREFIX, published_for, published_or_err, same_sf};
use super::files::{io, parquet_rows, plain_name, table_file};
use super::{CollectionManifest, CorpusManifest, LabelSetManifest, sha256_file};
use crate::error::{BenchError, Result};

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
    use super::*;

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
