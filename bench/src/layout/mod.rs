//! The published QUAIL-B layout (SPEC §C.1): its facts (table list, label-set paths,
//! published ids, cache roots), the reader, label loading and `fetch`, one file a
//! job. The look-up order that falls back to the stand-in is [`crate::resolve`]'s.
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
//! | file | job |
//! | --- | --- |
//! | `facts.rs` | the bucket, the published ids, [`LayoutSource`], the cache roots |
//! | `files.rs` | reading one manifest or Parquet footer; names kept inside the root |
//! | `dataset.rs` | [`Dataset`]: the corpus, its collection, the tables a query reads |
//! | `labels.rs` | the collection's label sets, located, checked and loaded |
//! | `fetch.rs` | [`fetch`]: mirroring a published corpus from an object store |

mod dataset;
mod facts;
mod fetch;
mod files;
mod labels;

pub use dataset::Dataset;
pub use facts::{
    BUCKET, BUCKET_PREFIX, LayoutSource, PUBLISHED, PublishedCorpus, harness_cache_dir,
    harness_name, published_cache_root, published_for, standin_root,
};
pub use fetch::{FetchSummary, default_source, fetch, fetch_corpus};
pub use files::{parquet_rows, plain_name};
pub use labels::LabelSetRef;

// The file formats the stand-in generator writes too: they live in its crate (it
// must not depend on this one) and are part of this module's interface.
pub use aisql_standin::manifest::{
    CollectionManifest, CollectionSummary, CorpusManifest, LabelSetManifest, TABLES, TableEntry,
    labels_predicate_dir, sha256_file,
};
