//! Label sets of the stand-in, written from the planted truth in the published
//! label-file format (SPEC §C.1), streamed in row groups and parts.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use aisql_engine::inference::backend::AiKind;
use datafusion::arrow::array::{ArrayRef, BooleanBuilder, RecordBatch, StringBuilder};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::basic::{Compression, ZstdLevel};
use datafusion::parquet::file::properties::WriterProperties;
use rayon::prelude::*;

use super::{PredDef, Truth, agent, biodex, fever, imdb, lepard};
use crate::error::{Result, StandinError};
use crate::manifest::{LabelSetManifest, labels_predicate_dir};

/// Rows per Parquet row group / per part file.
const ROW_GROUP: usize = 1 << 20;
const PART_ROWS: u64 = 8 << 20;

/// One written label set.
#[derive(Debug, Clone)]
pub(crate) struct Written {
    pub key: String,
    pub label_set_id: String,
    pub rows: u64,
    pub bytes: u64,
    /// `<dataset>/<predicate path>/<label_set_id>` under `label_sets/`.
    pub rel_dir: PathBuf,
}

/// Schema of a label file.
pub fn label_schema(classify: bool) -> SchemaRef {
    let value = if classify {
        Field::new("label", DataType::Utf8, false)
    } else {
        Field::new("answer", DataType::Boolean, false)
    };
    Arc::new(Schema::new(vec![
        Field::new("predicate_key", DataType::Utf8, false),
        Field::new("label_set_id", DataType::Utf8, false),
        Field::new("left_id", DataType::Utf8, false),
        Field::new("right_id", DataType::Utf8, true),
        value,
    ]))
}

enum Value {
    B(bool),
    L(&'static str),
}

/// The reference answer of `p` for left row `l` (and right row `r`), `None` when the
/// pair has no label (joined-row classification of a pair the join does not keep).
fn answer(p: &PredDef, t: &Truth, l: usize, r: Option<usize>) -> Option<Value> {
    use Value::{B, L};
    let r0 = r.unwrap_or(0);
    Some(match p.name {
        "F1" => B(t.reviews[l].positive_aspect()),
        "F4" => B(t.reviews[l].discusses_ending()),
        "F5" => B(t.reviews[l].actor_named),
        "DISCUSS_ASPECT" => B(t.reviews[l].aspects[r0].is_some()),
        "ASPECT_SENTIMENT" => B(t.reviews[l].aspects[r0] == Some(0)),
        "IMDB_SENTIMENT" => L(imdb::SENTIMENTS[t.reviews[l].sentiment as usize]),
        "IMDB_GENRE" => L(imdb::GENRES[t.reviews[l].genre as usize]),
        "IMDB_COMPLAINT" => L(imdb::COMPLAINTS[t.reviews[l].complaint as usize]),
        "IMDB_ASPECT_SENTIMENT" => L(imdb::SENTIMENTS[t.reviews[l].aspects[r0]? as usize]),
        "SERIOUS_ADVERSE_EVENT" => B(t.reports[l].serious),
        "REACTION" => B(t.reports[l].experienced.binary_search(&t.terms[r0]).is_ok()),
        "NEUROLOGICAL_REACTION" => B(biodex::term(t.terms[l]).class == biodex::NERVOUS),
        "CARDIOVASCULAR_REACTION" => B(biodex::term(t.terms[l]).class <= 1),
        "BIO_ORGAN_CLASS" => L(biodex::ORGAN_CLASSES[biodex::term(t.terms[l]).class as usize]),
        "F11" => B(t.claims[l].about_person),
        "F12" => B(t.claims[l].has_date),
        "F13" => B(t.pages[t.evidence[l]].person),
        "SUPPORT" => B(t.claims[l].page == t.evidence[r0] && t.claims[l].supports),
        "REFUTE" => B(t.claims[l].page == t.evidence[r0] && !t.claims[l].supports),
        "FEV_TOPIC" => L(fever::TOPICS[t.claims[l].topic as usize]),
        "LEP1" => B(t.contexts[l].not_apply),
        "LEP2" => B(t.contexts[l].procedural),
        "LEPS1" => B(t.passages[l].general_rule),
        "LEPJOIN" => B(t.contexts[l].cited.contains(&r0)),
        "LEP_AREA" => L(lepard::AREAS[t.contexts[l].area as usize]),
        "AGENT_RECOVERED" => B(t.snapshots[l].recovered),
        "AGENT_IMPLEMENTED_FIX" => B(t.snapshots[l].implemented_fix),
        "AGENT_PROGRESS" => L(agent::PROGRESS[t.snapshots[l].progress as usize]),
        "AGENT_TEST_RESULT" => L(agent::TEST_RESULTS[t.snapshots[l].test_result as usize]),
        "AGENT_DOMAIN" => L(agent::DOMAINS[t.snapshots[l].domain as usize]),
        "AGENT_ROOT_CAUSE" => L(agent::ROOT_CAUSES[t.snapshots[l].root_cause as usize]),
        other => unreachable!("no planted truth for predicate {other}"),
    })
}

struct Writer {
    dir: PathBuf,
    schema: SchemaRef,
    key: String,
    ls: String,
    classify: bool,
    part: usize,
    part_rows: u64,
    use_parts: bool,
    writer: Option<ArrowWriter<File>>,
    b_left: StringBuilder,
    b_right: StringBuilder,
    b_bool: BooleanBuilder,
    b_label: StringBuilder,
    pending: usize,
    rows: u64,
}

fn err(path: &Path, e: impl std::fmt::Display) -> StandinError {
    StandinError::io(path, e)
}

impl Writer {
    fn open_file(&mut self) -> Result<()> {
        let path = if self.use_parts {
            let d = self.dir.join("parts");
            fs::create_dir_all(&d).map_err(|e| err(&d, e))?;
            d.join(format!("part-{:05}.parquet", self.part))
        } else {
            self.dir.join("labels.parquet")
        };
        let f = File::create(&path).map_err(|e| err(&path, e))?;
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(3).unwrap()))
            .set_max_row_group_row_count(Some(ROW_GROUP))
            .build();
        self.writer = Some(
            ArrowWriter::try_new(f, self.schema.clone(), Some(props)).map_err(|e| err(&path, e))?,
        );
        self.part += 1;
        self.part_rows = 0;
        Ok(())
    }

    fn push(&mut self, left: &str, right: Option<&str>, v: Value) -> Result<()> {
        self.b_left.append_value(left);
        self.b_right.append_option(right);
        match v {
            Value::B(b) => self.b_bool.append_value(b),
            Value::L(l) => self.b_label.append_value(l),
        }
        self.pending += 1;
        if self.pending >= ROW_GROUP {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if self.pending == 0 {
            return Ok(());
        }
        if self.writer.is_none() {
            self.open_file()?;
        }
        let n = self.pending;
        let mut k = StringBuilder::with_capacity(n, n * self.key.len());
        let mut l = StringBuilder::with_capacity(n, n * self.ls.len());
        for _ in 0..n {
            k.append_value(&self.key);
            l.append_value(&self.ls);
        }
        let value: ArrayRef = if self.classify {
            Arc::new(self.b_label.finish())
        } else {
            Arc::new(self.b_bool.finish())
        };
        let cols: Vec<ArrayRef> = vec![
            Arc::new(k.finish()),
            Arc::new(l.finish()),
            Arc::new(self.b_left.finish()),
            Arc::new(self.b_right.finish()),
            value,
        ];
        let batch =
            RecordBatch::try_new(self.schema.clone(), cols).map_err(|e| err(&self.dir, e))?;
        self.writer
            .as_mut()
            .unwrap()
            .write(&batch)
            .map_err(|e| err(&self.dir, e))?;
        self.rows += n as u64;
        self.part_rows += n as u64;
        self.pending = 0;
        if self.use_parts && self.part_rows >= PART_ROWS {
            self.writer
                .take()
                .unwrap()
                .close()
                .map_err(|e| err(&self.dir, e))?;
        }
        Ok(())
    }

    fn finish(mut self) -> Result<u64> {
        self.flush()?;
        if self.writer.is_none() && self.rows == 0 {
            self.open_file()?;
        }
        if let Some(w) = self.writer.take() {
            w.close().map_err(|e| err(&self.dir, e))?;
        }
        Ok(self.rows)
    }
}

fn dir_bytes(dir: &Path) -> u64 {
    let mut n = 0;
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                n += dir_bytes(&p);
            } else if let Ok(m) = e.metadata() {
                n += m.len();
            }
        }
    }
    n
}

fn write_one(
    base: &Path,
    corpus_id: &str,
    corpus_full_hash: &str,
    p: &PredDef,
    t: &Truth,
) -> Result<Written> {
    let info = p.info();
    let label_set_id = super::label_set_id(corpus_id, p);
    let rel_dir = labels_predicate_dir(p.key).join(&label_set_id);
    let dir = base.join(&rel_dir);
    fs::create_dir_all(&dir).map_err(|e| err(&dir, e))?;
    let left_ids = &t.ids[p.left.0];
    let right_ids = p.right.map(|r| &t.ids[r.0]);
    let classify = p.kind == AiKind::Classify;
    let total = left_ids.len() as u64 * right_ids.map(|r| r.len() as u64).unwrap_or(1);
    let mut w = Writer {
        dir: dir.clone(),
        schema: super::labels::label_schema(classify),
        key: p.key.into(),
        ls: label_set_id.clone(),
        classify,
        part: 0,
        part_rows: 0,
        use_parts: total > PART_ROWS,
        writer: None,
        b_left: StringBuilder::new(),
        b_right: StringBuilder::new(),
        b_bool: BooleanBuilder::new(),
        b_label: StringBuilder::new(),
        pending: 0,
        rows: 0,
    };
    for (l, lid) in left_ids.iter().enumerate() {
        match right_ids {
            None => {
                if let Some(v) = answer(p, t, l, None) {
                    w.push(lid, None, v)?;
                }
            }
            Some(rs) => {
                for (r, rid) in rs.iter().enumerate() {
                    if let Some(v) = answer(p, t, l, Some(r)) {
                        w.push(lid, Some(rid), v)?;
                    }
                }
            }
        }
    }
    let rows = w.finish()?;
    let mut source_rows = std::collections::BTreeMap::new();
    source_rows.insert(p.left.0.to_string(), left_ids.len() as u64);
    if let Some((rt, _)) = p.right {
        source_rows.insert(rt.to_string(), t.ids[rt].len() as u64);
    }
    let manifest = LabelSetManifest {
        label_set_id: label_set_id.clone(),
        status: "complete".into(),
        rows,
        corpus_id: corpus_id.into(),
        corpus_full_hash: Some(corpus_full_hash.into()),
        source_rows,
        predicate: info,
        standin: true,
        extra: Default::default(),
    };
    super::write_json(&dir.join("manifest.json"), &manifest)?;
    Ok(Written {
        key: p.key.into(),
        label_set_id,
        rows,
        bytes: dir_bytes(&dir),
        rel_dir,
    })
}

/// Writes the label sets of every predicate under `base` (= `label_sets/`).
pub(crate) fn write_all(
    base: &Path,
    corpus_id: &str,
    corpus_full_hash: &str,
    t: &Truth,
) -> Result<Vec<Written>> {
    // Largest first so the two cores stay busy.
    let mut preds: Vec<&PredDef> = super::predicates().iter().collect();
    let size = |p: &PredDef| t.ids[p.left.0].len() * p.right.map(|r| t.ids[r.0].len()).unwrap_or(1);
    preds.sort_by_key(|p| std::cmp::Reverse(size(p)));
    let mut out: Vec<Written> = preds
        .par_iter()
        .map(|p| write_one(base, corpus_id, corpus_full_hash, p, t))
        .collect::<Result<Vec<_>>>()?;
    out.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(out)
}
