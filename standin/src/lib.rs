//! Deterministic stand-in QUAIL-B corpus, written in the published layout (SPEC §C.1).
//!
//! The published tables and labels cannot be fetched on every machine, so this crate
//! generates, from `DATA_SEED = 20260818` alone, a corpus with the same nine tables,
//! columns, types, id formats and — at sf 0.1, 0.5 and 1.0 — the same row counts as
//! SPEC §C, with realistic document lengths (Qwen3 tokens) and text that reads like its
//! genre. Every document is generated from planted attributes (sentiment, aspects,
//! reactions, claim facts, citation links, agent progress, …), so the reference label of
//! every predicate of the 43 plans is known by construction and written in the published
//! label-file format with label-set and collection manifests.
//!
//! Properties:
//! * row `i` of a base table (reviews, reports, claims, LePaRD pairs, agent
//!   trajectories) is identical at every scale factor (per-row streams, see [`rng`]);
//!   derived tables (terms, evidence, LePaRD passages/contexts) follow upstream's rules
//!   (terms by frequency, evidence in a hashed "scan" order, LePaRD first-seen order);
//! * generation is streamed (row groups, label parts) and parallel (rayon);
//! * the corpus, collection and label-set ids (`c_…`, `gt_…`, `ls_…`) and the per-row
//!   hashes are SHA-256 over canonical JSON ([`canonical`]), never equal
//!   to the published ids; manifests carry `"standin": true` and the generator version.
//!
//! Entry points: [`generate`], [`planned_rows`]; the ids it computes ([`corpus_id`],
//! [`label_set_id`], [`collection_id`]) and the seal ([`seal_path`]) let
//! `aisql_bench::resolve::stale_reason` tell whether a cached stand-in is what this
//! generator writes. The layout's file formats it writes are [`manifest`]'s.

pub mod canonical;
pub mod error;
pub mod manifest;

mod agent;
mod biodex;
mod fever;
mod imdb;
mod labels;
mod lepard;
mod predicates;
pub mod rng;
mod text;

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use aisql_engine::data::cache_dir::{SEAL_FILE, files_of, seal};
use aisql_engine::inference::backend::AiKind;
use datafusion::arrow::array::{ArrayRef, Int32Builder, ListBuilder, RecordBatch, StringBuilder};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::basic::{Compression, ZstdLevel};
use datafusion::parquet::file::properties::WriterProperties;
use rayon::prelude::*;
use serde_json::json;
use sha2::{Digest, Sha256};

pub use crate::error::{Result, StandinError};
use crate::manifest::{CollectionManifest, CollectionSummary, CorpusManifest, TABLES, TableEntry};

pub use rng::DATA_SEED;

/// The reference "model" recorded in stand-in collections.
pub const STANDIN_MODEL: &str = "aisql-standin-v1 (labels by construction)";
/// Generator version, part of the stand-in corpus identity and recorded in the corpus
/// manifest (`generator`). v2: ids and row hashes over canonical JSON (v1 hashed
/// serde_json's insertion-ordered output, so its ids were not SPEC §C's).
pub const GENERATOR_VERSION: &str = "aisql-standin-v2";
/// Snapshots above this many Qwen3 tokens are skipped (SPEC §C).
pub const AGENT_TOKEN_CAP: usize = 24_000;

/// One predicate of the 43 plans (SPEC §C, §E).
#[derive(Debug, Clone, Copy)]
pub struct PredDef {
    /// Upstream constant name (F1, DISCUSS_ASPECT, …).
    pub name: &'static str,
    /// Predicate key.
    pub key: &'static str,
    /// Filter, join or classify.
    pub kind: AiKind,
    /// Template exactly as in the plans.
    pub template: &'static str,
    /// Left (table, column).
    pub left: (&'static str, &'static str),
    /// Right (table, column) for two-document predicates.
    pub right: Option<(&'static str, &'static str)>,
    /// Classification labels.
    pub labels: &'static [&'static str],
    /// One description per label.
    pub descriptions: &'static [&'static str],
}

impl PredDef {
    /// The engine's view of this predicate.
    pub fn info(&self) -> crate::manifest::PredicateInfo {
        crate::manifest::PredicateInfo {
            key: self.key.into(),
            kind: self.kind,
            template: self.template.into(),
            left_table: self.left.0.into(),
            left_column: self.left.1.into(),
            right_table: self.right.map(|r| r.0.into()),
            right_column: self.right.map(|r| r.1.into()),
            labels: self.labels.iter().map(|s| s.to_string()).collect(),
            descriptions: self.descriptions.iter().map(|s| s.to_string()).collect(),
        }
    }
}

/// The 31 predicates used by the 43 plans.
pub fn predicates() -> &'static [PredDef] {
    predicates::PREDICATES
}

/// Rows, bytes and time of one generated table.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TableSummary {
    /// Rows written.
    pub rows: u64,
    /// Parquet file size.
    pub bytes: u64,
    /// Wall time to generate and write.
    pub seconds: f64,
}

/// What [`generate`] wrote.
#[derive(Debug, Clone)]
pub struct GenerateSummary {
    /// Layout root.
    pub root: PathBuf,
    /// Stand-in corpus id (`c_…`).
    pub corpus_id: String,
    /// Stand-in collection id (`gt_…`, empty when labels were skipped).
    pub collection_id: String,
    /// Scale factor.
    pub scale_factor: f64,
    /// Per table.
    pub tables: BTreeMap<String, TableSummary>,
    /// Rows per predicate key.
    pub label_rows: BTreeMap<String, u64>,
    /// Bytes of all label files.
    pub label_bytes: u64,
    /// Wall time of the label sets.
    pub label_seconds: f64,
    /// Total wall time.
    pub seconds: f64,
}

/// Options of [`generate_with`].
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// Write label sets and the collection (default true).
    pub labels: bool,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        Self { labels: true }
    }
}

/// Row counts of the derived and base tables at a scale factor.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Counts {
    reviews: usize,
    reports: usize,
    claims: usize,
    pairs: usize,
    traces: usize,
}

fn check_sf(sf: f64) -> Result<()> {
    if !(sf.is_finite() && sf > 0.0 && sf <= 10.0) {
        return Err(StandinError::ScaleFactor(format!(
            "stand-in scale factor must be in (0, 10], got {sf}"
        )));
    }
    Ok(())
}

fn base_n(base: usize, sf: f64) -> usize {
    ((base as f64 * sf) + 1e-9).floor().max(8.0) as usize
}

fn counts(sf: f64) -> Counts {
    let traces = if sf <= 1.0 {
        ((17_718.0 * sf).round() as usize).clamp(8, 17_711)
    } else {
        (17_711.0 * sf).round() as usize
    };
    Counts {
        reviews: base_n(50_000, sf),
        reports: base_n(5_000, sf),
        claims: base_n(5_000, sf),
        pairs: base_n(5_000, sf),
        traces,
    }
}

/// Piecewise-linear growth through `anchors` (integer ceiling; the last slope continues).
fn grow(n: usize, anchors: &[(usize, usize)]) -> usize {
    for w in anchors.windows(2) {
        let ((n0, v0), (n1, v1)) = (w[0], w[1]);
        if n <= n1 || w[1] == *anchors.last().unwrap() {
            let dn = n as i64 - n0 as i64;
            let dv = (v1 - v0) as i64;
            let span = (n1 - n0) as i64;
            let num = dn * dv;
            let q = num.div_euclid(span) + if num.rem_euclid(span) != 0 { 1 } else { 0 };
            return (v0 as i64 + q).max(0) as usize;
        }
    }
    0
}

const TERM_ANCHORS: [(usize, usize); 4] = [(0, 0), (500, 1127), (2500, 2934), (5000, 4144)];
const PAGE_ANCHORS: [(usize, usize); 4] = [(0, 0), (500, 287), (2500, 1037), (5000, 1478)];
const PASSAGE_ANCHORS: [(usize, usize); 4] = [(0, 0), (500, 433), (2500, 1756), (5000, 2991)];
const DUP_ANCHORS: [(usize, usize); 4] = [(0, 0), (500, 0), (2500, 4), (5000, 28)];

fn contexts_after(n: usize) -> usize {
    n - grow(n, &DUP_ANCHORS)
}

/// Exact row count of every table of the stand-in at `sf`, computed without
/// generating text (the generator produces exactly these by construction).
pub fn planned_rows(sf: f64) -> Result<BTreeMap<String, u64>> {
    check_sf(sf)?;
    let c = counts(sf);
    let rows = [
        c.reviews,
        12,
        c.reports,
        grow(c.reports, &TERM_ANCHORS),
        c.claims,
        grow(c.claims, &PAGE_ANCHORS),
        contexts_after(c.pairs),
        grow(c.pairs, &PASSAGE_ANCHORS),
        c.traces,
    ];
    Ok(TABLES
        .iter()
        .zip(rows)
        .map(|(t, r)| (t.to_string(), r as u64))
        .collect())
}

// ---------------------------------------------------------------- writing

fn utf8(name: &str) -> Field {
    Field::new(name, DataType::Utf8, false)
}
fn list_utf8(name: &str) -> Field {
    Field::new(
        name,
        DataType::List(Arc::new(Field::new_list_field(DataType::Utf8, true))),
        false,
    )
}

/// Arrow schema of a table (non-nullable columns).
pub fn table_schema(table: &str) -> Option<SchemaRef> {
    let fields = match table {
        "reviews" => vec![utf8("id"), utf8("body")],
        "aspects" => vec![utf8("id"), utf8("aspect")],
        "reports" => vec![utf8("id"), utf8("report"), list_utf8("reactions")],
        "terms" => vec![utf8("id"), utf8("term")],
        "claims" => vec![
            utf8("id"),
            utf8("claim"),
            utf8("label"),
            utf8("evidence_wiki_url"),
        ],
        "evidence" => vec![utf8("id"), utf8("text")],
        "citation_contexts" => vec![
            utf8("id"),
            utf8("destination_context"),
            list_utf8("cited_passage_ids"),
        ],
        "citation_passages" => vec![utf8("id"), utf8("passage_text"), list_utf8("passage_ids")],
        "agent_traces" => vec![
            utf8("id"),
            utf8("trace"),
            utf8("trajectory_id"),
            Field::new("turn_index", DataType::Int32, false),
            Field::new("token_count", DataType::Int32, false),
        ],
        _ => return None,
    };
    Some(Arc::new(Schema::new(fields)))
}

/// One row as canonical JSON values (for the per-row hash).
enum Cell<'a> {
    S(&'a str),
    L(&'a [String]),
    I(i32),
}

struct TableSink {
    table: String,
    path: PathBuf,
    schema: SchemaRef,
    writer: ArrowWriter<File>,
    rows: u64,
    hasher: Sha256,
    started: Instant,
}

fn io_err(path: &Path, e: impl std::fmt::Display) -> StandinError {
    StandinError::io(path, e)
}

impl TableSink {
    fn new(dir: &Path, table: &str) -> Result<Self> {
        let schema = table_schema(table).expect("known table");
        let path = dir.join(format!("{table}.parquet"));
        let file = File::create(&path).map_err(|e| io_err(&path, e))?;
        let mut props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(3).unwrap()))
            .set_max_row_group_row_count(Some(if table == "agent_traces" { 512 } else { 8192 }));
        if table == "agent_traces" {
            props = props.set_dictionary_enabled(false);
        }
        let writer = ArrowWriter::try_new(file, schema.clone(), Some(props.build()))
            .map_err(|e| io_err(&path, e))?;
        Ok(Self {
            table: table.into(),
            path,
            schema,
            writer,
            rows: 0,
            hasher: Sha256::new(),
            started: Instant::now(),
        })
    }

    fn write(&mut self, rows: &[Vec<Cell<'_>>]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = self
            .schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        let mut cols: Vec<ArrayRef> = Vec::with_capacity(names.len());
        for (c, f) in self.schema.fields().iter().enumerate() {
            let arr: ArrayRef = match f.data_type() {
                DataType::Utf8 => {
                    let mut b = StringBuilder::new();
                    for r in rows {
                        match &r[c] {
                            Cell::S(s) => b.append_value(s),
                            _ => unreachable!(),
                        }
                    }
                    Arc::new(b.finish())
                }
                DataType::Int32 => {
                    let mut b = Int32Builder::new();
                    for r in rows {
                        match &r[c] {
                            Cell::I(x) => b.append_value(*x),
                            _ => unreachable!(),
                        }
                    }
                    Arc::new(b.finish())
                }
                _ => {
                    let mut b = ListBuilder::new(StringBuilder::new());
                    for r in rows {
                        match &r[c] {
                            Cell::L(xs) => {
                                for x in xs.iter() {
                                    b.values().append_value(x);
                                }
                                b.append(true);
                            }
                            _ => unreachable!(),
                        }
                    }
                    Arc::new(b.finish())
                }
            };
            cols.push(arr);
        }
        let batch =
            RecordBatch::try_new(self.schema.clone(), cols).map_err(|e| io_err(&self.path, e))?;
        self.writer
            .write(&batch)
            .map_err(|e| io_err(&self.path, e))?;
        // Per-row canonical-JSON hashes, one hex line each (SPEC §C corpus identity).
        for r in rows {
            self.hasher.update(row_hash(&names, r));
            self.hasher.update(b"\n");
        }
        self.rows += rows.len() as u64;
        Ok(())
    }

    fn finish(self) -> Result<(TableEntry, TableSummary)> {
        self.writer.close().map_err(|e| io_err(&self.path, e))?;
        let bytes = fs::metadata(&self.path)
            .map_err(|e| io_err(&self.path, e))?
            .len();
        let file_sha256 = manifest::sha256_file(&self.path)?;
        Ok((
            TableEntry {
                rows: self.rows,
                ordered_rows_full_hash: Some(hex::encode(self.hasher.finalize())),
                file_sha256: Some(file_sha256),
                file: Some(format!("{}.parquet", self.table)),
            },
            TableSummary {
                rows: self.rows,
                bytes,
                seconds: self.started.elapsed().as_secs_f64(),
            },
        ))
    }
}

/// Planted truth of a whole corpus (no text), used for the labels.
#[derive(Default)]
pub(crate) struct Truth {
    pub ids: HashMap<&'static str, Vec<String>>,
    pub reviews: Vec<imdb::Review>,
    pub reports: Vec<biodex::Report>,
    /// Vocabulary index of each `terms` row.
    pub terms: Vec<usize>,
    pub claims: Vec<fever::Claim>,
    /// Page index of each `evidence` row.
    pub evidence: Vec<usize>,
    pub pages: Vec<fever::Page>,
    pub contexts: Vec<lepard::Context>,
    pub passages: Vec<lepard::Passage>,
    pub snapshots: Vec<agent::Snapshot>,
}

const CHUNK: usize = 512;

fn gen_reviews(dir: &Path, n: usize, truth: &mut Truth) -> Result<(TableEntry, TableSummary)> {
    let mut sink = TableSink::new(dir, "reviews")?;
    let mut ids = Vec::with_capacity(n);
    for start in (0..n).step_by(CHUNK) {
        let end = (start + CHUNK).min(n);
        let rows: Vec<(imdb::Review, String)> = (start..end)
            .into_par_iter()
            .map(|i| imdb::review(i as u64))
            .collect();
        let idv: Vec<String> = (start..end).map(|i| format!("rv{i}")).collect();
        let cells: Vec<Vec<Cell>> = rows
            .iter()
            .zip(&idv)
            .map(|((_, t), id)| vec![Cell::S(id), Cell::S(t)])
            .collect();
        sink.write(&cells)?;
        truth.reviews.extend(rows.into_iter().map(|(r, _)| r));
        ids.extend(idv);
    }
    truth.ids.insert("reviews", ids);
    sink.finish()
}

fn gen_aspects(dir: &Path, truth: &mut Truth) -> Result<(TableEntry, TableSummary)> {
    let mut sink = TableSink::new(dir, "aspects")?;
    let ids: Vec<String> = (0..12).map(|i| format!("as{i}")).collect();
    let cells: Vec<Vec<Cell>> = ids
        .iter()
        .zip(imdb::ASPECTS)
        .map(|(id, a)| vec![Cell::S(id), Cell::S(a)])
        .collect();
    sink.write(&cells)?;
    truth.ids.insert("aspects", ids);
    sink.finish()
}

fn gen_biodex(dir: &Path, n: usize, truth: &mut Truth) -> Result<[(TableEntry, TableSummary); 2]> {
    // Structure first (cheap, sequential): reactions per report.
    let structs: Vec<biodex::Report> = (0..n)
        .into_par_iter()
        .map(|i| {
            biodex::report_struct(i as u64, grow(i, &TERM_ANCHORS), grow(i + 1, &TERM_ANCHORS))
        })
        .collect();
    let n_terms = grow(n, &TERM_ANCHORS);
    let mut freq = vec![0u64; n_terms];
    for r in &structs {
        for &k in &r.reactions {
            freq[k] += 1;
        }
    }
    let mut order: Vec<(usize, String)> = (0..n_terms).map(|k| (k, biodex::term(k).name)).collect();
    order.sort_by(|a, b| freq[b.0].cmp(&freq[a.0]).then_with(|| a.1.cmp(&b.1)));
    let names: Vec<String> = (0..n_terms).map(|k| biodex::term(k).name).collect();
    // Reports.
    let mut sink = TableSink::new(dir, "reports")?;
    let mut ids = Vec::with_capacity(n);
    for start in (0..n).step_by(64) {
        let end = (start + 64).min(n);
        let texts: Vec<String> = (start..end)
            .into_par_iter()
            .map(|i| biodex::report_text(i as u64, &structs[i]))
            .collect();
        let idv: Vec<String> = (start..end).map(|i| format!("rp{i}")).collect();
        let reacts: Vec<Vec<String>> = (start..end)
            .map(|i| {
                structs[i]
                    .reactions
                    .iter()
                    .map(|&k| names[k].clone())
                    .collect()
            })
            .collect();
        let cells: Vec<Vec<Cell>> = (0..end - start)
            .map(|j| vec![Cell::S(&idv[j]), Cell::S(&texts[j]), Cell::L(&reacts[j])])
            .collect();
        sink.write(&cells)?;
        ids.extend(idv);
    }
    truth.ids.insert("reports", ids);
    let reports = sink.finish()?;
    // Terms by descending frequency, then text.
    let mut sink = TableSink::new(dir, "terms")?;
    let tids: Vec<String> = (0..n_terms).map(|i| format!("tm{i}")).collect();
    let cells: Vec<Vec<Cell>> = order
        .iter()
        .zip(&tids)
        .map(|((_, name), id)| vec![Cell::S(id), Cell::S(name)])
        .collect();
    for c in cells.chunks(8192) {
        sink.write(c)?;
    }
    truth.terms = order.iter().map(|(k, _)| *k).collect();
    truth.ids.insert("terms", tids);
    truth.reports = structs;
    Ok([reports, sink.finish()?])
}

fn gen_fever(dir: &Path, n: usize, truth: &mut Truth) -> Result<[(TableEntry, TableSummary); 2]> {
    let structs: Vec<(usize, bool)> = (0..n)
        .map(|i| {
            let known = grow(i, &PAGE_ANCHORS);
            fever::claim_struct(i as u64, known, grow(i + 1, &PAGE_ANCHORS) > known)
        })
        .collect();
    let n_pages = grow(n, &PAGE_ANCHORS);
    let pages: Vec<fever::Page> = (0..n_pages)
        .into_par_iter()
        .map(|j| fever::page(j as u64))
        .collect();
    let mut sink = TableSink::new(dir, "claims")?;
    let mut ids = Vec::with_capacity(n);
    for start in (0..n).step_by(CHUNK) {
        let end = (start + CHUNK).min(n);
        let rows: Vec<(fever::Claim, String)> = (start..end)
            .into_par_iter()
            .map(|i| fever::claim(i as u64, structs[i].0, &pages[structs[i].0], structs[i].1))
            .collect();
        let idv: Vec<String> = (start..end).map(|i| format!("cl{i}")).collect();
        let cells: Vec<Vec<Cell>> = rows
            .iter()
            .zip(&idv)
            .map(|((c, t), id)| {
                vec![
                    Cell::S(id),
                    Cell::S(t),
                    Cell::S(if c.supports { "SUPPORTS" } else { "REFUTES" }),
                    Cell::S(&pages[c.page].id),
                ]
            })
            .collect();
        sink.write(&cells)?;
        truth.claims.extend(rows.into_iter().map(|(c, _)| c));
        ids.extend(idv);
    }
    truth.ids.insert("claims", ids);
    let claims = sink.finish()?;
    // Evidence in a hashed "scan" order.
    let mut order: Vec<usize> = (0..n_pages).collect();
    order.sort_by_key(|&j| (rng::Rng::row("evidence.order", j as u64).next_u64(), j));
    let mut sink = TableSink::new(dir, "evidence")?;
    for chunk in order.chunks(CHUNK) {
        let texts: Vec<String> = chunk
            .par_iter()
            .map(|&j| fever::page_text(j as u64, &pages[j]))
            .collect();
        let cells: Vec<Vec<Cell>> = chunk
            .iter()
            .zip(&texts)
            .map(|(&j, t)| vec![Cell::S(&pages[j].id), Cell::S(t)])
            .collect();
        sink.write(&cells)?;
    }
    truth.ids.insert(
        "evidence",
        order.iter().map(|&j| pages[j].id.clone()).collect(),
    );
    truth.evidence = order;
    truth.pages = pages;
    Ok([claims, sink.finish()?])
}

fn gen_lepard(
    dir: &Path,
    n_pairs: usize,
    truth: &mut Truth,
) -> Result<[(TableEntry, TableSummary); 2]> {
    // Pair plan: which context cites which passage.
    let mut cited: Vec<Vec<usize>> = Vec::new();
    for k in 0..n_pairs {
        let mut r = rng::Rng::row("lepard.pairs", k as u64);
        let known = grow(k, &PASSAGE_ANCHORS);
        let after = grow(k + 1, &PASSAGE_ANCHORS);
        let mut p = if after > known || known == 0 {
            known
        } else {
            r.zipf(known)
        };
        let dup = contexts_after(k + 1) == contexts_after(k) && !cited.is_empty();
        if dup {
            let c = cited.len() - 1;
            let avail = after.max(1);
            let mut tries = 0;
            while cited[c].contains(&p) && tries < avail {
                p = (p + 1) % avail;
                tries += 1;
            }
            cited[c].push(p);
        } else {
            cited.push(vec![p]);
        }
    }
    let n_passages = grow(n_pairs, &PASSAGE_ANCHORS);
    let passages: Vec<(lepard::Passage, String)> = (0..n_passages)
        .into_par_iter()
        .map(|j| lepard::passage(j as u64))
        .collect();
    let mut sink = TableSink::new(dir, "citation_contexts")?;
    let mut ids = Vec::new();
    for start in (0..cited.len()).step_by(CHUNK) {
        let end = (start + CHUNK).min(cited.len());
        let rows: Vec<(lepard::Context, String)> = (start..end)
            .into_par_iter()
            .map(|c| {
                let (mut ctx, t) = lepard::context(c as u64, cited[c][0], &passages[cited[c][0]].0);
                ctx.cited = cited[c].clone();
                (ctx, t)
            })
            .collect();
        let idv: Vec<String> = (start..end).map(|i| format!("lc{i}")).collect();
        let lists: Vec<Vec<String>> = rows
            .iter()
            .map(|(c, _)| {
                let mut v: Vec<String> = c
                    .cited
                    .iter()
                    .map(|&p| passages[p].0.source_id.clone())
                    .collect();
                v.sort();
                v
            })
            .collect();
        let cells: Vec<Vec<Cell>> = (0..end - start)
            .map(|j| vec![Cell::S(&idv[j]), Cell::S(&rows[j].1), Cell::L(&lists[j])])
            .collect();
        sink.write(&cells)?;
        truth.contexts.extend(rows.into_iter().map(|(c, _)| c));
        ids.extend(idv);
    }
    truth.ids.insert("citation_contexts", ids);
    let contexts = sink.finish()?;
    let mut sink = TableSink::new(dir, "citation_passages")?;
    let pids: Vec<String> = (0..n_passages).map(|j| format!("lp{j}")).collect();
    let lists: Vec<Vec<String>> = passages
        .iter()
        .map(|(p, _)| vec![p.source_id.clone()])
        .collect();
    let cells: Vec<Vec<Cell>> = (0..n_passages)
        .map(|j| {
            vec![
                Cell::S(&pids[j]),
                Cell::S(&passages[j].1),
                Cell::L(&lists[j]),
            ]
        })
        .collect();
    for c in cells.chunks(CHUNK) {
        sink.write(c)?;
    }
    truth.ids.insert("citation_passages", pids);
    truth.passages = passages.into_iter().map(|(p, _)| p).collect();
    Ok([contexts, sink.finish()?])
}

fn gen_agent(dir: &Path, n: usize, truth: &mut Truth) -> Result<(TableEntry, TableSummary)> {
    let tok = aisql_models::tokenizer::Tokenizer::vendored()
        .map_err(|e| StandinError::Generate(format!("tokenizer: {e}")))?;
    let count = move |s: &str| count_tokens(&tok, s);
    let mut sink = TableSink::new(dir, "agent_traces")?;
    let mut ids = Vec::with_capacity(n);
    let mut next_traj = 0u64;
    let batch = (rayon::current_num_threads() * 2).max(2) as u64;
    while ids.len() < n {
        let rows: Vec<Vec<(agent::Snapshot, String)>> = (next_traj..next_traj + batch)
            .into_par_iter()
            .map(|j| {
                let (t, c) = agent::trajectory(j, &count);
                t.snapshots(j as u32, &c, &count, AGENT_TOKEN_CAP)
                    .into_iter()
                    .map(|(s, m)| (s, t.text(m)))
                    .collect()
            })
            .collect();
        next_traj += batch;
        for snaps in rows {
            let take = (n - ids.len()).min(snaps.len());
            let snaps = &snaps[..take];
            let idv: Vec<(String, String)> = snaps
                .iter()
                .map(|(s, _)| {
                    (
                        format!("at{:04}-t{:03}", s.trajectory, s.turn),
                        format!("at{:04}", s.trajectory),
                    )
                })
                .collect();
            let cells: Vec<Vec<Cell>> = snaps
                .iter()
                .zip(&idv)
                .map(|((s, t), (id, tr))| {
                    vec![
                        Cell::S(id),
                        Cell::S(t),
                        Cell::S(tr),
                        Cell::I(s.turn as i32),
                        Cell::I(s.tokens as i32),
                    ]
                })
                .collect();
            sink.write(&cells)?;
            truth.snapshots.extend(snaps.iter().map(|(s, _)| s.clone()));
            ids.extend(idv.into_iter().map(|(id, _)| id));
            if ids.len() >= n {
                break;
            }
        }
    }
    truth.ids.insert("agent_traces", ids);
    sink.finish()
}

/// Byte offsets where Qwen3's pre-tokenizer always starts a new piece: just after a
/// `\n` whose following whitespace run holds no further line break (every
/// newline-holding whitespace run ends a piece at its last newline, and no piece
/// continues past a newline into non-newline text). Splitting there and summing the
/// counts gives the exact token count of the whole text.
pub(crate) fn safe_splits(text: &str) -> Vec<usize> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\n' {
            let p = i + 1;
            let mut j = p;
            while j < b.len() && (b[j] == b' ' || b[j] == b'\t') {
                j += 1;
            }
            if p < b.len()
                && j < b.len()
                && b[j] != b'\n'
                && b[j] != b'\r'
                && !b[j].is_ascii_whitespace()
                && b[j] < 0x80
            {
                out.push(p);
            }
        }
        i += 1;
    }
    out
}

/// Exact Qwen3 token count of `text`, encoded in line-sized pieces (the fancy-regex
/// pre-tokenizer is superlinear on long code listings).
pub(crate) fn count_tokens(tok: &aisql_models::tokenizer::Tokenizer, text: &str) -> usize {
    const PIECE: usize = 512;
    let mut total = 0;
    let mut start = 0;
    let mut last = 0;
    for p in safe_splits(text) {
        if p - start >= PIECE && last > start {
            total += tok.encode(&text[start..last]).map(|v| v.len()).unwrap_or(0);
            start = last;
        }
        last = p;
    }
    if text.len() - start >= PIECE && last > start {
        total += tok.encode(&text[start..last]).map(|v| v.len()).unwrap_or(0);
        start = last;
    }
    total + tok.encode(&text[start..]).map(|v| v.len()).unwrap_or(0)
}

/// SHA-256 hex of one row's canonical JSON: an object of column name → value.
fn row_hash(names: &[String], row: &[Cell<'_>]) -> String {
    let m: serde_json::Map<String, serde_json::Value> = names
        .iter()
        .zip(row)
        .map(|(name, cell)| {
            let v = match cell {
                Cell::S(s) => json!(s),
                Cell::L(xs) => json!(xs),
                Cell::I(x) => json!(x),
            };
            (name.clone(), v)
        })
        .collect();
    canonical::sha256_hex(&serde_json::Value::Object(m))
}

/// The object whose canonical-JSON hash is a stand-in corpus's identity: generator,
/// scale factor, seed and per table its rows and ordered-rows hash.
pub fn corpus_identity(sf: f64, tables: &BTreeMap<String, TableEntry>) -> serde_json::Value {
    let tables_json: serde_json::Map<String, serde_json::Value> = tables
        .iter()
        .map(|(k, e)| {
            (
                k.clone(),
                json!({"rows": e.rows, "hash": e.ordered_rows_full_hash}),
            )
        })
        .collect();
    json!({
        "schema_version": 1,
        "benchmark": "quailb-standin",
        "generator": GENERATOR_VERSION,
        "scale_factor": sf,
        "data_seed": DATA_SEED,
        "tables": tables_json,
    })
}

/// The stand-in corpus id of `sf` with these tables: `c_` + 32 hex digits of the
/// SHA-256 of [`corpus_identity`]'s canonical JSON.
pub fn corpus_id(sf: f64, tables: &BTreeMap<String, TableEntry>) -> String {
    canonical::hashed_id("c", &corpus_identity(sf, tables))
}

/// The stand-in label-set id of predicate `p` in corpus `corpus_id`.
pub fn label_set_id(corpus_id: &str, p: &PredDef) -> String {
    canonical::hashed_id(
        "ls",
        &json!({"corpus_id": corpus_id, "predicate": p.info(), "generator": GENERATOR_VERSION}),
    )
}

/// The stand-in collection id of corpus `corpus_id` with these label sets (predicate
/// key → label-set id).
pub fn collection_id(corpus_id: &str, label_sets: &BTreeMap<String, String>) -> String {
    canonical::hashed_id(
        "gt",
        &json!({"corpus_id": corpus_id, "label_sets": label_sets, "model": STANDIN_MODEL}),
    )
}

/// Where the seal of stand-in corpus `corpus_id` lives (inside its folder).
pub fn seal_path(root: &Path, corpus_id: &str) -> PathBuf {
    root.join("corpora").join(corpus_id).join(SEAL_FILE)
}

/// Seals a generated stand-in, last, so that a generation cut short has no seal:
/// the corpus folder, the collection manifest and the collection's label sets
/// (`label_dirs`, relative to `root`).
fn seal_standin(
    root: &Path,
    corpus_id: &str,
    collection_id: &str,
    label_dirs: &[PathBuf],
) -> Result<()> {
    let corpus = Path::new("corpora").join(corpus_id);
    let mut files: Vec<PathBuf> = files_of(&root.join(&corpus))?
        .into_iter()
        .map(|f| corpus.join(f))
        .collect();
    if !collection_id.is_empty() {
        files.push(
            Path::new("collections")
                .join(collection_id)
                .join("manifest.json"),
        );
    }
    for dir in label_dirs {
        files.extend(files_of(&root.join(dir))?.into_iter().map(|f| dir.join(f)));
    }
    Ok(seal(root, &files, &seal_path(root, corpus_id))?)
}

/// The table names in sorted order (a stand-in manifest lists exactly these).
pub fn sorted_tables() -> impl Iterator<Item = &'static str> {
    let mut t = TABLES;
    t.sort_unstable();
    t.into_iter()
}

fn write_json(path: &Path, v: &impl serde::Serialize) -> Result<()> {
    if let Some(p) = path.parent() {
        fs::create_dir_all(p).map_err(|e| io_err(p, e))?;
    }
    let s = serde_json::to_string_pretty(v).expect("json");
    fs::write(path, s + "\n").map_err(|e| io_err(path, e))
}

fn replace_dir(from: &Path, to: &Path) -> Result<()> {
    if to.exists() {
        fs::remove_dir_all(to).map_err(|e| io_err(to, e))?;
    }
    if let Some(p) = to.parent() {
        fs::create_dir_all(p).map_err(|e| io_err(p, e))?;
    }
    fs::rename(from, to).map_err(|e| io_err(to, e))
}

/// Removes stand-in corpora of scale factor `sf` other than `keep` (left by an older
/// generator version), with their collections and label sets.
fn remove_stale(root: &Path, sf: f64, keep: &str) -> Result<()> {
    let mut stale = Vec::new();
    if let Ok(rd) = fs::read_dir(root.join("corpora")) {
        for e in rd.flatten() {
            let m = e.path().join("manifest.json");
            if let Ok(text) = fs::read_to_string(&m)
                && let Ok(c) = serde_json::from_str::<CorpusManifest>(&text)
                && c.standin
                && (c.scale_factor - sf).abs() < 1e-9
                && c.corpus_id != keep
            {
                stale.push((c.corpus_id, e.path()));
            }
        }
    }
    if stale.is_empty() {
        return Ok(());
    }
    let ids: std::collections::HashSet<&str> = stale.iter().map(|(id, _)| id.as_str()).collect();
    let mut dirs: Vec<PathBuf> = stale.iter().map(|(_, p)| p.clone()).collect();
    for sub in ["collections"] {
        if let Ok(rd) = fs::read_dir(root.join(sub)) {
            for e in rd.flatten() {
                if let Ok(text) = fs::read_to_string(e.path().join("manifest.json"))
                    && let Ok(v) = serde_json::from_str::<serde_json::Value>(&text)
                    && v.get("corpus_id")
                        .and_then(|x| x.as_str())
                        .is_some_and(|c| ids.contains(c))
                {
                    dirs.push(e.path());
                }
            }
        }
    }
    fn walk(d: &Path, ids: &std::collections::HashSet<&str>, out: &mut Vec<PathBuf>) {
        let Ok(rd) = fs::read_dir(d) else { return };
        for e in rd.flatten() {
            let p = e.path();
            if !p.is_dir() {
                continue;
            }
            match fs::read_to_string(p.join("manifest.json")) {
                Ok(text) => {
                    if serde_json::from_str::<serde_json::Value>(&text)
                        .ok()
                        .and_then(|v| {
                            v.get("corpus_id")
                                .and_then(|x| x.as_str())
                                .map(|c| ids.contains(c))
                        })
                        .unwrap_or(false)
                    {
                        out.push(p);
                    }
                }
                Err(_) => walk(&p, ids, out),
            }
        }
    }
    walk(&root.join("label_sets"), &ids, &mut dirs);
    for d in dirs {
        fs::remove_dir_all(&d).map_err(|e| io_err(&d, e))?;
    }
    Ok(())
}

/// Generates the stand-in corpus and its labels for `sf` under `root` (the layout
/// root: `corpora/`, `label_sets/`, `collections/`), replacing an earlier stand-in of
/// the same scale factor. Deterministic: two runs write byte-identical files.
pub fn generate(root: &Path, sf: f64) -> Result<GenerateSummary> {
    generate_with(root, sf, &GenerateOptions::default())
}

/// [`generate`] with options (e.g. tables only).
pub fn generate_with(root: &Path, sf: f64, opts: &GenerateOptions) -> Result<GenerateSummary> {
    check_sf(sf)?;
    let t0 = Instant::now();
    let c = counts(sf);
    fs::create_dir_all(root).map_err(|e| io_err(root, e))?;
    let tmp = root.join(format!(".standin-tmp-{}-{}", sf, std::process::id()));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(|e| io_err(&tmp, e))?;
    }
    let corpus_tmp = tmp.join("corpus");
    fs::create_dir_all(&corpus_tmp).map_err(|e| io_err(&corpus_tmp, e))?;
    let result = (|| -> Result<GenerateSummary> {
        let mut truth = Truth::default();
        let mut entries: BTreeMap<String, TableEntry> = BTreeMap::new();
        let mut summaries: BTreeMap<String, TableSummary> = BTreeMap::new();
        let mut add = |name: &str, (e, s): (TableEntry, TableSummary)| {
            entries.insert(name.into(), e);
            summaries.insert(name.into(), s);
        };
        add("reviews", gen_reviews(&corpus_tmp, c.reviews, &mut truth)?);
        add("aspects", gen_aspects(&corpus_tmp, &mut truth)?);
        let [a, b] = gen_biodex(&corpus_tmp, c.reports, &mut truth)?;
        add("reports", a);
        add("terms", b);
        let [a, b] = gen_fever(&corpus_tmp, c.claims, &mut truth)?;
        add("claims", a);
        add("evidence", b);
        let [a, b] = gen_lepard(&corpus_tmp, c.pairs, &mut truth)?;
        add("citation_contexts", a);
        add("citation_passages", b);
        add(
            "agent_traces",
            gen_agent(&corpus_tmp, c.traces, &mut truth)?,
        );
        // Corpus identity.
        let identity = corpus_identity(sf, &entries);
        let corpus_id = canonical::hashed_id("c", &identity);
        let corpus_full_hash = canonical::sha256_hex(&identity);
        let manifest = CorpusManifest {
            corpus_id: corpus_id.clone(),
            scale_factor: sf,
            tables: entries,
            corpus_full_hash: Some(corpus_full_hash.clone()),
            schema_version: Some(1),
            data_seed: Some(DATA_SEED),
            standin: true,
            extra: BTreeMap::from([("generator".to_string(), json!(GENERATOR_VERSION))]),
        };
        let mut summary = GenerateSummary {
            root: root.to_path_buf(),
            corpus_id: corpus_id.clone(),
            collection_id: String::new(),
            scale_factor: sf,
            tables: summaries,
            label_rows: BTreeMap::new(),
            label_bytes: 0,
            label_seconds: 0.0,
            seconds: 0.0,
        };
        let mut collection = None;
        if opts.labels {
            let t1 = Instant::now();
            let written = labels::write_all(
                &tmp.join("label_sets"),
                &corpus_id,
                &corpus_full_hash,
                &truth,
            )?;
            let mut map = BTreeMap::new();
            for w in &written {
                map.insert(w.key.clone(), w.label_set_id.clone());
                summary.label_rows.insert(w.key.clone(), w.rows);
                summary.label_bytes += w.bytes;
            }
            let collection_id = collection_id(&corpus_id, &map);
            summary.label_seconds = t1.elapsed().as_secs_f64();
            summary.collection_id = collection_id.clone();
            collection = Some((
                CollectionManifest {
                    collection_id: collection_id.clone(),
                    corpus_id: corpus_id.clone(),
                    scale_factor: sf,
                    status: "complete".into(),
                    label_sets: map,
                    summary: CollectionSummary {
                        model: STANDIN_MODEL.into(),
                    },
                    standin: true,
                    extra: BTreeMap::new(),
                },
                written,
            ));
            write_json(
                &corpus_tmp.join("active_collection.json"),
                &json!({"collection_id": collection_id}),
            )?;
        }
        write_json(&corpus_tmp.join("manifest.json"), &manifest)?;
        remove_stale(root, sf, &corpus_id)?;
        // Move into place: label sets, then the corpus, then the collection manifest.
        let mut label_dirs = Vec::new();
        if let Some((coll, written)) = collection {
            for w in &written {
                label_dirs.push(Path::new("label_sets").join(&w.rel_dir));
                replace_dir(
                    &tmp.join("label_sets").join(&w.rel_dir),
                    &root.join("label_sets").join(&w.rel_dir),
                )?;
            }
            replace_dir(&corpus_tmp, &root.join("corpora").join(&corpus_id))?;
            write_json(
                &root
                    .join("collections")
                    .join(&coll.collection_id)
                    .join("manifest.json"),
                &coll,
            )?;
        } else {
            replace_dir(&corpus_tmp, &root.join("corpora").join(&corpus_id))?;
        }
        seal_standin(root, &corpus_id, &summary.collection_id, &label_dirs)?;
        summary.seconds = t0.elapsed().as_secs_f64();
        Ok(summary)
    })();
    let _ = fs::remove_dir_all(&tmp);
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    fn read_col(path: &Path, col: &str) -> Vec<String> {
        let f = File::open(path).unwrap();
        let r = ParquetRecordBatchReaderBuilder::try_new(f)
            .unwrap()
            .build()
            .unwrap();
        let mut out = Vec::new();
        for b in r {
            let b = b.unwrap();
            let a = b.column_by_name(col).unwrap().as_string::<i32>();
            out.extend((0..a.len()).map(|i| a.value(i).to_string()));
        }
        out
    }

    #[test]
    fn planned_rows_match_spec_at_published_scale_factors() {
        let spec: [(f64, [u64; 9]); 3] = [
            (0.1, [5000, 12, 500, 1127, 500, 287, 500, 433, 1772]),
            (0.5, [25000, 12, 2500, 2934, 2500, 1037, 2496, 1756, 8859]),
            (1.0, [50000, 12, 5000, 4144, 5000, 1478, 4972, 2991, 17711]),
        ];
        for (sf, rows) in spec {
            let p = planned_rows(sf).unwrap();
            for (t, r) in TABLES.iter().zip(rows) {
                assert_eq!(p[*t], r, "table {t} at sf {sf}");
            }
        }
        assert!(planned_rows(0.0).is_err() && planned_rows(f64::NAN).is_err());
        let small = planned_rows(0.001).unwrap();
        assert_eq!(small["reviews"], 50);
        assert_eq!(small["reports"], 8);
        assert!(small["terms"] >= 8 && small["evidence"] >= 1);
    }

    #[test]
    fn derived_counts_match_spec_through_the_plans() {
        // The derived-table construction (not just the formula) at sf 0.1: distinct
        // reactions of 500 reports, distinct pages of 500 claims.
        let n = 500;
        let mut terms = std::collections::HashSet::new();
        for i in 0..n {
            let r =
                biodex::report_struct(i as u64, grow(i, &TERM_ANCHORS), grow(i + 1, &TERM_ANCHORS));
            terms.extend(r.reactions);
        }
        assert_eq!(terms.len(), 1127);
        let mut pages = std::collections::HashSet::new();
        for i in 0..n {
            let known = grow(i, &PAGE_ANCHORS);
            pages
                .insert(fever::claim_struct(i as u64, known, grow(i + 1, &PAGE_ANCHORS) > known).0);
        }
        assert_eq!(pages.len(), 287);
    }

    #[test]
    fn generated_tables_have_planned_rows_schema_and_ids() {
        let dir = tempfile::tempdir().unwrap();
        let s = generate_with(dir.path(), 0.002, &GenerateOptions { labels: false }).unwrap();
        let planned = planned_rows(0.002).unwrap();
        let cdir = dir.path().join("corpora").join(&s.corpus_id);
        for t in TABLES {
            assert_eq!(s.tables[t].rows, planned[t], "{t}");
            let f = File::open(cdir.join(format!("{t}.parquet"))).unwrap();
            let b = ParquetRecordBatchReaderBuilder::try_new(f).unwrap();
            assert_eq!(
                b.schema().as_ref(),
                table_schema(t).unwrap().as_ref(),
                "{t}"
            );
            assert_eq!(b.metadata().file_metadata().num_rows() as u64, planned[t]);
        }
        let ids = read_col(&cdir.join("reviews.parquet"), "id");
        assert_eq!(ids[0], "rv0");
        assert_eq!(
            read_col(&cdir.join("aspects.parquet"), "aspect"),
            imdb::ASPECTS.to_vec()
        );
        assert!(
            read_col(&cdir.join("terms.parquet"), "id")
                .iter()
                .enumerate()
                .all(|(i, x)| *x == format!("tm{i}"))
        );
        let urls = read_col(&cdir.join("claims.parquet"), "evidence_wiki_url");
        let ev: std::collections::HashSet<String> = read_col(&cdir.join("evidence.parquet"), "id")
            .into_iter()
            .collect();
        assert!(urls.iter().all(|u| ev.contains(u)));
        let at = read_col(&cdir.join("agent_traces.parquet"), "id");
        assert!(
            at.iter()
                .all(|x| x.len() == 11 && x.starts_with("at") && &x[6..8] == "-t"),
            "{at:?}"
        );
        assert!(s.corpus_id.starts_with("c_") && s.corpus_id.len() == 34);
        // The generated aspects table's ordered-rows hash, computed outside the project:
        // python3 -c 'import json,hashlib; A=["the acting","the plot","the directing","the cinematography","the soundtrack","the pacing","the ending","the dialogue","the special effects","the character development","the screenplay","the editing"]; print(hashlib.sha256("".join(hashlib.sha256(json.dumps({"id":"as%d"%i,"aspect":a},sort_keys=True,separators=(",",":"),ensure_ascii=False).encode()).hexdigest()+"\n" for i,a in enumerate(A)).encode()).hexdigest())'
        let m: CorpusManifest =
            serde_json::from_str(&fs::read_to_string(cdir.join("manifest.json")).unwrap()).unwrap();
        assert_eq!(
            m.tables["aspects"].ordered_rows_full_hash.as_deref(),
            Some("a7b54bfb582ced25b8db66b9aeae02de8c75e78d07ca855a3b786a1fa66a14b7")
        );
        assert_eq!(s.corpus_id, corpus_id(0.002, &m.tables));
    }

    /// Ids and hashes are SHA-256 over canonical JSON (sorted keys, `,`/`:`, UTF-8),
    /// pinned against values computed outside the project (Python's `json.dumps` with
    /// `sort_keys=True`), so a regression to serde_json's insertion-ordered output (its
    /// `preserve_order` feature is on in this workspace) fails here.
    #[test]
    fn ids_are_hashes_of_canonical_json() {
        // python3 -c 'import json,hashlib; o={"corpus_id":"c_0123456789abcdef0123456789abcdef","generator":"aisql-standin-v2","predicate":{"key":"quailb.biodex.reaction.is_neurological","kind":"filter","template":"Is this reaction neurological, affecting the nervous system? {0}","left_table":"terms","left_column":"term"}}; print("ls_"+hashlib.sha256(json.dumps(o,sort_keys=True,separators=(",",":"),ensure_ascii=False).encode()).hexdigest()[:32])'
        let neuro = predicates()
            .iter()
            .find(|p| p.name == "NEUROLOGICAL_REACTION")
            .unwrap();
        assert_eq!(
            label_set_id("c_0123456789abcdef0123456789abcdef", neuro),
            "ls_22b578b23173fc1b9d8c4cf0cc1cf5d8"
        );
        // python3 -c 'import json,hashlib; o={"schema_version":1,"benchmark":"quailb-standin","generator":"aisql-standin-v2","scale_factor":0.001,"data_seed":20260818,"tables":{"aspects":{"rows":12,"hash":"ab"},"reviews":{"rows":50,"hash":None}}}; print("c_"+hashlib.sha256(json.dumps(o,sort_keys=True,separators=(",",":"),ensure_ascii=False).encode()).hexdigest()[:32])'
        let tables = BTreeMap::from([
            (
                "aspects".to_string(),
                TableEntry {
                    rows: 12,
                    ordered_rows_full_hash: Some("ab".into()),
                    ..Default::default()
                },
            ),
            (
                "reviews".to_string(),
                TableEntry {
                    rows: 50,
                    ..Default::default()
                },
            ),
        ]);
        assert_eq!(
            corpus_id(0.001, &tables),
            "c_00742ccd0d00831d970f661902d72d2f"
        );
        // One row of `aspects`, its columns in schema order (id, aspect):
        // python3 -c 'import json,hashlib; print(hashlib.sha256(json.dumps({"id":"as0","aspect":"the acting"},sort_keys=True,separators=(",",":"),ensure_ascii=False).encode()).hexdigest())'
        assert_eq!(
            row_hash(
                &["id".into(), "aspect".into()],
                &[Cell::S("as0"), Cell::S("the acting")]
            ),
            "c7a37f3e6e58f24984b8d9c925b7243ad937f416d43935562bfc8186e11d0634"
        );
    }

    #[test]
    fn split_counting_is_exact() {
        let tok = aisql_models::tokenizer::Tokenizer::vendored().unwrap();
        let count = |s: &str| s.len() / 3;
        let (t, _) = agent::trajectory(5, &count);
        let mut texts: Vec<String> = t.messages.clone();
        texts.push(t.text(t.messages.len()));
        texts.push("a\n\n  b\n   \n c\r\n d)\n  e \n\tf\n".repeat(40));
        for x in &texts {
            assert_eq!(count_tokens(&tok, x), tok.encode(x).unwrap().len(), "{x:?}");
        }
    }

    #[test]
    fn generation_is_byte_identical() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let sa = generate(a.path(), 0.001).unwrap();
        let sb = generate(b.path(), 0.001).unwrap();
        assert_eq!(sa.corpus_id, sb.corpus_id);
        assert_eq!(sa.collection_id, sb.collection_id);
        let mut files = Vec::new();
        fn walk(d: &Path, base: &Path, out: &mut Vec<PathBuf>) {
            for e in fs::read_dir(d).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(&p, base, out);
                } else {
                    out.push(p.strip_prefix(base).unwrap().to_path_buf());
                }
            }
        }
        walk(a.path(), a.path(), &mut files);
        assert!(files.len() > 40);
        for f in files {
            assert_eq!(
                fs::read(a.path().join(&f)).unwrap(),
                fs::read(b.path().join(&f)).unwrap(),
                "{}",
                f.display()
            );
        }
    }

    #[test]
    fn regenerating_replaces_a_stale_standin_of_the_same_sf() {
        let d = tempfile::tempdir().unwrap();
        let s = generate(d.path(), 0.001).unwrap();
        // Pretend an older generator left a corpus with another id.
        let old = d.path().join("corpora").join("c_old");
        replace_dir(&d.path().join("corpora").join(&s.corpus_id), &old).unwrap();
        let mpath = old.join("manifest.json");
        let text = fs::read_to_string(&mpath)
            .unwrap()
            .replace(&s.corpus_id, "c_old");
        fs::write(&mpath, text).unwrap();
        let s2 = generate(d.path(), 0.001).unwrap();
        assert_eq!(s2.corpus_id, s.corpus_id);
        assert!(!old.exists());
        let corpora: Vec<_> = fs::read_dir(d.path().join("corpora")).unwrap().collect();
        assert_eq!(corpora.len(), 1, "only the regenerated corpus is left");
    }

    #[test]
    fn rows_are_stable_across_scale_factors() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let sa = generate_with(a.path(), 0.001, &GenerateOptions { labels: false }).unwrap();
        let sb = generate_with(b.path(), 0.002, &GenerateOptions { labels: false }).unwrap();
        for (t, col) in [
            ("reviews", "body"),
            ("reports", "report"),
            ("claims", "claim"),
            ("agent_traces", "trace"),
        ] {
            let x = read_col(
                &a.path()
                    .join("corpora")
                    .join(&sa.corpus_id)
                    .join(format!("{t}.parquet")),
                col,
            );
            let y = read_col(
                &b.path()
                    .join("corpora")
                    .join(&sb.corpus_id)
                    .join(format!("{t}.parquet")),
                col,
            );
            assert!(x.len() < y.len() || t == "agent_traces");
            assert_eq!(x[..], y[..x.len()], "{t}");
        }
    }

    fn stats(mut v: Vec<usize>) -> (f64, f64, f64, f64) {
        v.sort_unstable();
        let n = v.len();
        let mean = v.iter().sum::<usize>() as f64 / n as f64;
        let q = |p: f64| v[((n as f64 - 1.0) * p).round() as usize] as f64;
        (mean, q(0.5), q(0.9), q(0.95))
    }

    fn within(fails: &mut Vec<String>, name: &str, got: f64, want: f64) {
        let rel = (got - want).abs() / want;
        eprintln!(
            "{name}: {got:.1} (target {want}, {:+.1}%)",
            100.0 * (got - want) / want
        );
        if rel > 0.10 {
            fails.push(format!("{name}: {got:.1} vs target {want}"));
        }
    }

    #[test]
    fn token_lengths_match_the_real_tables() {
        let mut fails = Vec::new();
        let tok = aisql_models::tokenizer::Tokenizer::vendored().unwrap();
        let count = |texts: Vec<String>| -> Vec<usize> {
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            tok.encode_batch(&refs)
                .unwrap()
                .iter()
                .map(Vec::len)
                .collect()
        };
        let reviews = count(
            (0..1500u64)
                .into_par_iter()
                .map(|i| imdb::review(i).1)
                .collect(),
        );
        let (m, med, _, p95) = stats(reviews);
        within(&mut fails, "reviews mean", m, 299.0);
        within(&mut fails, "reviews median", med, 221.0);
        within(&mut fails, "reviews p95", p95, 769.0);
        let reports = count(
            (0..60u64)
                .into_par_iter()
                .map(|i| {
                    let i = i as usize;
                    let r = biodex::report_struct(
                        i as u64,
                        grow(i, &TERM_ANCHORS),
                        grow(i + 1, &TERM_ANCHORS),
                    );
                    biodex::report_text(i as u64, &r)
                })
                .collect(),
        );
        within(&mut fails, "reports mean", stats(reports).0, 4100.0);
        let terms = count((0..1127).map(|k| biodex::term(k).name).collect());
        within(&mut fails, "terms mean", stats(terms).0, 4.6);
        let claims = count(
            (0..1000u64)
                .map(|i| {
                    let p = fever::page(i % 300);
                    fever::claim(i, (i % 300) as usize, &p, i % 4 != 0).1
                })
                .collect(),
        );
        within(&mut fails, "claims mean", stats(claims).0, 11.4);
        let evidence = count(
            (0..400u64)
                .into_par_iter()
                .map(|j| fever::page_text(j, &fever::page(j)))
                .collect(),
        );
        within(&mut fails, "evidence mean", stats(evidence).0, 400.0);
        let passages: Vec<(lepard::Passage, String)> = (0..800u64).map(lepard::passage).collect();
        let contexts = count(
            (0..800u64)
                .map(|c| lepard::context(c, c as usize, &passages[c as usize].0).1)
                .collect(),
        );
        within(
            &mut fails,
            "citation_contexts mean",
            stats(contexts).0,
            233.0,
        );
        within(
            &mut fails,
            "citation_passages mean",
            stats(count(passages.into_iter().map(|p| p.1).collect())).0,
            82.9,
        );
        // Agent traces: a generated table (token_count is the real count of each snapshot).
        let dir = tempfile::tempdir().unwrap();
        let s = generate_with(dir.path(), 0.02, &GenerateOptions { labels: false }).unwrap();
        let path = dir
            .path()
            .join("corpora")
            .join(&s.corpus_id)
            .join("agent_traces.parquet");
        let f = File::open(&path).unwrap();
        let mut counts = Vec::new();
        let mut sample = Vec::new();
        for b in ParquetRecordBatchReaderBuilder::try_new(f)
            .unwrap()
            .build()
            .unwrap()
        {
            let b = b.unwrap();
            let tc = b
                .column_by_name("token_count")
                .unwrap()
                .as_primitive::<datafusion::arrow::datatypes::Int32Type>();
            let tr = b.column_by_name("trace").unwrap().as_string::<i32>();
            for i in 0..b.num_rows() {
                counts.push(tc.value(i) as usize);
                if sample.len() < 5 && i % 7 == 0 {
                    sample.push((tr.value(i).to_string(), tc.value(i) as usize));
                }
            }
        }
        for (t, c) in sample {
            let real = tok.encode(&t).unwrap().len();
            assert_eq!(real, c, "token_count");
        }
        assert!(counts.iter().all(|&c| c <= AGENT_TOKEN_CAP));
        let (m, med, p90, _) = stats(counts);
        within(&mut fails, "agent_traces mean", m, 9736.0);
        within(&mut fails, "agent_traces median", med, 8880.0);
        within(&mut fails, "agent_traces p90", p90, 17988.0);
        assert!(fails.is_empty(), "{fails:?}");
    }
}
