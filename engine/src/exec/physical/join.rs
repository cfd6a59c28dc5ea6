//! The AI join's row work: which anchor and partner rows meet (equality keys,
//! residual condition), the distinct document pairs among them that the model
//! is asked, and the output rows, assembled in chunks of [`OUTPUT_CHUNK_ROWS`]
//! so that a join whose result has billions of rows (IMDB-9 at sf 1.0) streams
//! them instead of holding one anchor batch's whole product.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, RecordBatch, StringArray, UInt32Array, new_null_array,
};
use datafusion::arrow::compute::take;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::JoinType;
use datafusion::error::Result as DfResult;
use datafusion::physical_expr::PhysicalExpr;

use super::{OpState, RowDocs, answer, id_strings, settle};
use crate::error::{EngineError, Result};
use crate::inference::backend::Answer;
use crate::inference::backend::{AiRequest, Doc};

/// Which input an AI join streams (the anchor's) and what its type keeps.
#[derive(Debug, Clone, Copy)]
pub(super) struct JoinSides {
    pub(super) join_type: JoinType,
    pub(super) anchor_left: bool,
}

impl JoinSides {
    /// Whether unmatched rows of the left (`left = true`) or right input are kept
    /// with NULLs on the other side.
    fn keeps_unmatched(self, left: bool) -> bool {
        matches!(
            (self.join_type, left),
            (JoinType::Full, _) | (JoinType::Left, true) | (JoinType::Right, false)
        )
    }

    /// `Some(true)` when the output is the matched rows of one input only
    /// (semi), `Some(false)` its unmatched rows (anti), for that input.
    fn semi(self, left: bool) -> Option<bool> {
        match (self.join_type, left) {
            (JoinType::LeftSemi, true) | (JoinType::RightSemi, false) => Some(true),
            (JoinType::LeftAnti, true) | (JoinType::RightAnti, false) => Some(false),
            _ => None,
        }
    }

    /// Whether the output is every row of one input with a `mark` column saying
    /// whether it matched (a subquery under `OR`), for that input.
    fn marks(self, left: bool) -> bool {
        matches!(
            (self.join_type, left),
            (JoinType::LeftMark, true) | (JoinType::RightMark, false)
        )
    }

    fn one_sided(self) -> bool {
        self.semi(true).is_some()
            || self.semi(false).is_some()
            || self.marks(true)
            || self.marks(false)
    }
}

/// What the anchor batches so far said about each partner row: whether an
/// anchor matched it, and whether one of its pairs went unasked because the
/// budget was spent. An unmatched row with an unasked pair may have matched:
/// it is left out of the rows a join keeps for not matching (outer, anti,
/// mark), never reported as unmatched.
pub(super) struct PartnerMarks {
    matched: Vec<bool>,
    unreached: Vec<bool>,
}

impl PartnerMarks {
    /// Marks for `rows` partner rows, none matched.
    pub(super) fn new(rows: usize) -> Self {
        Self {
            matched: vec![false; rows],
            unreached: vec![false; rows],
        }
    }

    /// Whether row `p`'s match is unknown: unmatched, with an unasked pair.
    fn undetermined(&self, p: usize) -> bool {
        !self.matched[p] && self.unreached[p]
    }
}

/// Rows of one anchor batch with a pair the spent budget left unasked.
#[derive(Default)]
struct Unasked {
    /// Anchor rows.
    anchors: Vec<u32>,
    /// Partner rows.
    partners: Vec<u32>,
}

/// One output row of a join: (left row, right row); `None` pads with NULLs.
type JoinRow = (Option<u32>, Option<u32>);

/// Output rows as (left row, right row) indices into the two inputs; `None`
/// makes that side NULL. One-sided outputs (semi, anti, mark) use only their
/// side; a mark join's rows come with their `marks`.
fn assemble(
    schema: SchemaRef,
    sides: JoinSides,
    left: &RecordBatch,
    right: &RecordBatch,
    rows: &[JoinRow],
    marks: &[bool],
) -> Result<RecordBatch> {
    let side = |batch: &RecordBatch, pick: &dyn Fn(&JoinRow) -> Option<u32>| {
        let indices = UInt32Array::from(rows.iter().map(pick).collect::<Vec<_>>());
        batch
            .columns()
            .iter()
            .map(|c| {
                if indices.null_count() == indices.len() {
                    Ok(new_null_array(c.data_type(), indices.len()))
                } else {
                    take(c.as_ref(), &indices, None)
                }
            })
            .collect::<std::result::Result<Vec<_>, _>>()
    };
    let mut columns = Vec::with_capacity(schema.fields().len());
    if !sides.one_sided() || sides.semi(true).is_some() || sides.marks(true) {
        columns.extend(side(left, &|r| r.0)?);
    }
    if !sides.one_sided() || sides.semi(false).is_some() || sides.marks(false) {
        columns.extend(side(right, &|r| r.1)?);
    }
    if sides.marks(true) || sides.marks(false) {
        columns.push(Arc::new(BooleanArray::from(marks.to_vec())));
    }
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// `batch` with its string and binary view columns holding only the bytes their
/// rows use. Rows taken from a large batch keep referencing all of its text, so
/// a partner side gathered from many such batches would keep, and be charged
/// for, the same text buffers once per batch (IMDB-9's join-2 at sf 1.0: 12 GB
/// counted for a few hundred MB of reviews).
pub(super) fn compact_views(batch: RecordBatch) -> DfResult<RecordBatch> {
    use datafusion::arrow::array::AsArray;
    let columns: Vec<ArrayRef> = batch
        .columns()
        .iter()
        .map(|c| match c.data_type() {
            DataType::Utf8View => Arc::new(c.as_string_view().gc()) as ArrayRef,
            DataType::BinaryView => Arc::new(c.as_binary_view().gc()) as ArrayRef,
            _ => c.clone(),
        })
        .collect();
    Ok(RecordBatch::try_new(batch.schema(), columns)?)
}

/// The distinct (anchor document, partner document) pairs among `candidates`
/// (row pairs), as the rows that first show each, and for every candidate the
/// index of its pair. Documents are told apart by id, as the answer memo does.
fn distinct_pairs(
    anchors: &RowDocs<'_>,
    partners: &RowDocs<'_>,
    candidates: &[(u32, u32)],
) -> (Vec<u32>, Vec<(u32, u32)>) {
    let rows = |c: &dyn Fn(&(u32, u32)) -> u32| {
        candidates.iter().map(c).max().map_or(0, |m| m as usize + 1)
    };
    let (a_doc, a_first) = number_documents(anchors, rows(&|c| c.0));
    let (p_doc, p_first) = number_documents(partners, rows(&|c| c.1));
    let (a_count, p_count) = (a_first.len() as u32, p_first.len() as u32);
    // A table of pair indexes when it is small, else a map.
    let cells = (a_count as usize).saturating_mul(p_count as usize);
    let mut table = if cells <= 1 << 20 {
        vec![u32::MAX; cells]
    } else {
        Vec::new()
    };
    let mut map: HashMap<(u32, u32), u32> = HashMap::new();
    let mut distinct = Vec::new();
    let pair_of = candidates
        .iter()
        .map(|&(a, p)| {
            let (da, dp) = (a_doc[a as usize], p_doc[p as usize]);
            let fresh = distinct.len() as u32;
            let slot = if table.is_empty() {
                map.entry((da, dp)).or_insert(fresh)
            } else {
                let cell = &mut table[da as usize * p_count as usize + dp as usize];
                if *cell == u32::MAX {
                    *cell = fresh;
                }
                cell
            };
            if *slot == fresh {
                distinct.push((a, p));
            }
            *slot
        })
        .collect();
    (pair_of, distinct)
}

/// Tells the backend a join's partner documents (distinct by id) when every
/// anchor meets every one of them: no equality, no residual condition.
pub(super) fn report_partners(state: &OpState, partner_batch: &RecordBatch) -> Result<()> {
    if !state.spec.equalities.is_empty() || state.spec.residual.is_some() {
        return Ok(());
    }
    let op = &state.spec.call.op_id;
    let lw = state.layout.left_width;
    let (id, text) = state.layout.docs[1];
    let local = |index: usize| if index < lw { index } else { index - lw };
    let partners = RowDocs::new(partner_batch, &[(local(id), local(text))], op)?;
    let mut seen = HashSet::new();
    let docs: Vec<Doc<'_>> = (0..partner_batch.num_rows())
        .filter_map(|row| partners.doc(0, row))
        .filter(|d| seen.insert(d.id))
        .collect();
    state
        .runtime
        .query
        .partners_collected(&state.spec.call, &docs);
    Ok(())
}

/// Output rows per batch an AI join emits: enough that the next operator's
/// per-batch work is amortised, few enough that an anchor batch whose product
/// has hundreds of millions of rows (IMDB-9's join-2 at sf 1.0) streams in
/// bounded memory.
pub(super) const OUTPUT_CHUNK_ROWS: usize = 1 << 20;

/// Rows per output batch of a join whose output rows are made of one anchor
/// row and one partner row: [`OUTPUT_CHUNK_ROWS`], or fewer where that many
/// would take more than `chunk_bytes` (an eighth of `--memory-limit`: one
/// batch is made whole before the heap is checked again, and a chain of
/// joins makes wide rows).
fn chunk_rows(chunk_bytes: usize, anchor: &RecordBatch, partner: &RecordBatch) -> usize {
    let row_bytes = (row_bytes(anchor) + row_bytes(partner)).max(1);
    (chunk_bytes / row_bytes).clamp(1024, OUTPUT_CHUNK_ROWS)
}

/// Bytes one row of `batch` takes once picked into an output batch: a view
/// or a fixed-width value its width, another value its column's share per
/// row.
fn row_bytes(batch: &RecordBatch) -> usize {
    let rows = batch.num_rows().max(1);
    batch
        .columns()
        .iter()
        .map(|c| match c.data_type() {
            DataType::Utf8View | DataType::BinaryView => 16,
            t => t
                .primitive_width()
                .unwrap_or_else(|| c.get_array_memory_size() / rows),
        })
        .sum::<usize>()
}

/// The TRUE (anchor row, partner row) pairs of one anchor batch.
enum TruePairs {
    /// Chosen pair by pair, because equality keys or a residual condition
    /// picked the candidates; anchor-major, partner rows ascending.
    Listed(Vec<(u32, u32)>),
    /// Every anchor row meets every partner row, so the product is never
    /// enumerated: an anchor row's partners are the rows of the partner
    /// documents its document was TRUE with (anchor-major, then by partner
    /// document, rows ascending within one).
    ByDocument {
        /// Per anchor row, its document's number (`u32::MAX`: no document).
        anchor_doc: Vec<u32>,
        /// Per anchor document, the partner documents it was TRUE with.
        true_partners: Vec<Vec<u32>>,
        /// Per partner document, its rows.
        partner_rows: Vec<Vec<u32>>,
    },
}

/// AI join of one batch of anchor rows against all partner rows: every
/// candidate that meets the equalities is asked once (across batches, via the
/// memo), and the output (TRUE pairs and, as the join type says, unmatched
/// anchor rows) is read from the returned [`JoinOutput`] a chunk at a time.
/// Matched partner rows are marked in `marks` for [`unmatched_partners`]. An
/// anchor row with an unasked pair (a spent budget) and no TRUE one is left
/// out of the anchor rows kept alone: whether it matched is unknown.
pub(super) fn join_batch(
    state: Arc<OpState>,
    sides: JoinSides,
    anchor_batch: RecordBatch,
    partner_batch: Arc<RecordBatch>,
    marks: &mut PartnerMarks,
    chunk_bytes: usize,
) -> Result<JoinOutput> {
    let op = &state.spec.call.op_id;
    state.metrics.input_rows.add(anchor_batch.num_rows());
    let lw = state.layout.left_width;
    let local = |index: usize| if index < lw { index } else { index - lw };
    let (a_doc, p_doc) = (state.layout.docs[0], state.layout.docs[1]);
    let anchors = RowDocs::new(&anchor_batch, &[(local(a_doc.0), local(a_doc.1))], op)?;
    let partners = RowDocs::new(&partner_batch, &[(local(p_doc.0), local(p_doc.1))], op)?;
    let (pairs, unasked) = if state.layout.equalities.is_empty() && state.layout.residual.is_none()
    {
        pairs_by_document(
            &state,
            &anchors,
            &partners,
            anchor_batch.num_rows(),
            partner_batch.num_rows(),
        )?
    } else {
        let (pairs, unasked) = listed_pairs(
            &state,
            sides,
            &anchors,
            &partners,
            &anchor_batch,
            &partner_batch,
        )?;
        (TruePairs::Listed(pairs), unasked)
    };
    let matched = &mut marks.matched;
    let mut anchor_matched = vec![false; anchor_batch.num_rows()];
    match &pairs {
        TruePairs::Listed(pairs) => {
            for &(a, p) in pairs {
                anchor_matched[a as usize] = true;
                matched[p as usize] = true;
            }
        }
        TruePairs::ByDocument {
            anchor_doc,
            true_partners,
            partner_rows,
        } => {
            for (a, &d) in anchor_doc.iter().enumerate() {
                anchor_matched[a] = d != u32::MAX && !true_partners[d as usize].is_empty();
            }
            let mut partner_matched = vec![false; partner_rows.len()];
            for &d in true_partners.iter().flatten() {
                partner_matched[d as usize] = true;
            }
            for (rows, _) in partner_rows.iter().zip(partner_matched).filter(|(_, m)| *m) {
                for &p in rows {
                    matched[p as usize] = true;
                }
            }
        }
    }
    for &p in &unasked.partners {
        marks.unreached[p as usize] = true;
    }
    let mut anchor_unasked = vec![false; anchor_batch.num_rows()];
    for &a in &unasked.anchors {
        anchor_unasked[a as usize] = true;
    }
    // Anchor rows whose match is known: matched, or every pair asked.
    let known = (0..anchor_batch.num_rows() as u32)
        .filter(|&a| anchor_matched[a as usize] || !anchor_unasked[a as usize]);
    let (lone_anchors, lone_marks): (Vec<u32>, Vec<bool>) = match sides.semi(sides.anchor_left) {
        _ if sides.marks(sides.anchor_left) => {
            known.map(|a| (a, anchor_matched[a as usize])).unzip()
        }
        Some(want) => (
            known
                .filter(|&a| anchor_matched[a as usize] == want)
                .collect(),
            Vec::new(),
        ),
        None if sides.keeps_unmatched(sides.anchor_left) => (
            known.filter(|&a| !anchor_matched[a as usize]).collect(),
            Vec::new(),
        ),
        None => (Vec::new(), Vec::new()),
    };
    let chunk_rows = chunk_rows(chunk_bytes, &anchor_batch, &partner_batch);
    Ok(JoinOutput {
        state,
        sides,
        chunk_rows,
        anchor_batch,
        partner_batch,
        pairs,
        lone_anchors,
        lone_marks,
        cursor: (0, 0),
        next_lone: 0,
    })
}

/// Numbers each row's document by id in the order rows first show it, as the
/// answer memo tells documents apart: per row its number (`u32::MAX`: no
/// document), and per number the row that first showed it.
fn number_documents(docs: &RowDocs<'_>, rows: usize) -> (Vec<u32>, Vec<u32>) {
    let mut by_id: HashMap<&str, u32> = HashMap::new();
    let mut first = Vec::new();
    let numbers = (0..rows)
        .map(|r| match docs.doc(0, r) {
            None => u32::MAX,
            Some(d) => *by_id.entry(d.id).or_insert_with(|| {
                first.push(r as u32);
                first.len() as u32 - 1
            }),
        })
        .collect();
    (numbers, first)
}

/// Asks every (anchor document, partner document) pair of the batch, anchor by
/// anchor in the order rows first show them (the order a row-by-row product
/// would meet them), and keeps the TRUE ones by document.
fn pairs_by_document(
    state: &OpState,
    anchors: &RowDocs<'_>,
    partners: &RowDocs<'_>,
    anchor_rows: usize,
    partner_rows: usize,
) -> Result<(TruePairs, Unasked)> {
    let (anchor_doc, anchor_first) = number_documents(anchors, anchor_rows);
    let (partner_doc, partner_first) = number_documents(partners, partner_rows);
    fn docs_of<'d>(docs: &'d RowDocs<'_>, first: &[u32]) -> Vec<Doc<'d>> {
        first
            .iter()
            .map(|&r| docs.doc(0, r as usize).expect("a numbered row's document"))
            .collect()
    }
    let (anchor_docs, partner_docs) = (
        docs_of(anchors, &anchor_first),
        docs_of(partners, &partner_first),
    );
    let requests: Vec<AiRequest<'_>> = anchor_docs
        .iter()
        .flat_map(|&anchor| {
            partner_docs.iter().map(move |&p| AiRequest {
                anchor,
                partner: Some(p),
            })
        })
        .collect();
    let answers = answer(state, &requests)?;
    settle(state, &requests, &answers)?;
    let width = partner_first.len();
    let true_partners: Vec<Vec<u32>> = (0..anchor_first.len())
        .map(|da| {
            (0..width as u32)
                .filter(|&dp| answers[da * width + dp as usize] == Answer::Bool(true))
                .collect()
        })
        .collect();
    let mut rows_of = vec![Vec::new(); partner_first.len()];
    for (p, &d) in partner_doc.iter().enumerate() {
        if d != u32::MAX {
            rows_of[d as usize].push(p as u32);
        }
    }
    // Documents with an unasked pair, then their rows.
    let (mut anchor_unasked, mut partner_unasked) =
        (vec![false; anchor_first.len()], vec![false; width]);
    for (i, _) in answers
        .iter()
        .enumerate()
        .filter(|(_, a)| **a == Answer::Unreached)
    {
        anchor_unasked[i / width] = true;
        partner_unasked[i % width] = true;
    }
    let unasked = Unasked {
        anchors: (0..anchor_doc.len() as u32)
            .filter(|&a| {
                let d = anchor_doc[a as usize];
                d != u32::MAX && anchor_unasked[d as usize]
            })
            .collect(),
        partners: (0..width)
            .filter(|&d| partner_unasked[d])
            .flat_map(|d| rows_of[d].iter().copied())
            .collect(),
    };
    Ok((
        TruePairs::ByDocument {
            anchor_doc,
            true_partners,
            partner_rows: rows_of,
        },
        unasked,
    ))
}

/// The TRUE pairs among the candidates that meet the equalities and the
/// residual condition, each distinct document pair asked once.
fn listed_pairs(
    state: &OpState,
    sides: JoinSides,
    anchors: &RowDocs<'_>,
    partners: &RowDocs<'_>,
    anchor_batch: &RecordBatch,
    partner_batch: &RecordBatch,
) -> Result<(Vec<(u32, u32)>, Unasked)> {
    let lw = state.layout.left_width;
    let local = |index: usize| if index < lw { index } else { index - lw };
    // Partner rows per equality key (all partner rows when there is no
    // equality); a NULL key matches nothing.
    let key_columns = |batch: &RecordBatch, pick: &dyn Fn(&(usize, usize)) -> usize| {
        state
            .layout
            .equalities
            .iter()
            .map(|e| id_strings(batch, local(pick(e))))
            .collect::<Result<Vec<_>>>()
    };
    let a_keys = key_columns(anchor_batch, &|e| e.0)?;
    let p_keys = key_columns(partner_batch, &|e| e.1)?;
    let key = |cols: &[StringArray], row: usize| -> Option<Vec<String>> {
        cols.iter()
            .map(|c| c.is_valid(row).then(|| c.value(row).to_string()))
            .collect()
    };
    let mut by_key: HashMap<Vec<String>, Vec<u32>> = HashMap::new();
    if !p_keys.is_empty() {
        for r in 0..partner_batch.num_rows() {
            if let Some(k) = key(&p_keys, r) {
                by_key.entry(k).or_default().push(r as u32);
            }
        }
    }
    let all_partners: Vec<u32> = (0..partner_batch.num_rows() as u32).collect();
    let mut candidates: Vec<(u32, u32)> = Vec::new();
    for a in 0..anchor_batch.num_rows() {
        if anchors.doc(0, a).is_none() {
            continue;
        }
        let rows = if p_keys.is_empty() {
            &all_partners[..]
        } else {
            match key(&a_keys, a).and_then(|k| by_key.get(&k)) {
                Some(v) => &v[..],
                None => &[][..],
            }
        };
        for &p in rows {
            if partners.doc(0, p as usize).is_some() {
                candidates.push((a as u32, p));
            }
        }
    }
    if let Some((residual, combined)) = &state.layout.residual {
        let keep = residual_mask(
            residual,
            combined.clone(),
            sides.anchor_left,
            anchor_batch,
            partner_batch,
            &candidates,
        )?;
        let mut i = 0;
        candidates.retain(|_| {
            i += 1;
            keep[i - 1]
        });
    }
    // Each distinct pair of documents is asked once: rows made by an earlier
    // join repeat their documents, and a request costs far more than an index.
    let (pair_of, distinct) = distinct_pairs(anchors, partners, &candidates);
    let requests: Vec<AiRequest<'_>> = distinct
        .iter()
        .map(|&(a, p)| AiRequest {
            anchor: anchors.doc(0, a as usize).expect("a candidate's anchor"),
            partner: partners.doc(0, p as usize),
        })
        .collect();
    let answers = answer(state, &requests)?;
    settle(state, &requests, &answers)?;
    let mut unasked = Unasked::default();
    for (&(a, p), pair) in candidates.iter().zip(&pair_of) {
        if answers[*pair as usize] == Answer::Unreached {
            unasked.anchors.push(a);
            unasked.partners.push(p);
        }
    }
    let pairs = candidates
        .iter()
        .zip(&pair_of)
        .filter(|(_, pair)| answers[**pair as usize] == Answer::Bool(true))
        .map(|(&c, _)| c)
        .collect();
    Ok((pairs, unasked))
}

/// One anchor batch's output rows, assembled [`OUTPUT_CHUNK_ROWS`] at a time as
/// they are read: first the TRUE pairs (unless the join keeps one side only),
/// then the anchor rows kept alone (an outer anchor side's unmatched rows, a
/// semi or anti join's rows, or a mark join's every row).
pub(super) struct JoinOutput {
    state: Arc<OpState>,
    sides: JoinSides,
    /// Rows per output batch ([`chunk_rows`]).
    chunk_rows: usize,
    anchor_batch: RecordBatch,
    partner_batch: Arc<RecordBatch>,
    pairs: TruePairs,
    lone_anchors: Vec<u32>,
    /// Per lone anchor row, whether it matched (mark joins only).
    lone_marks: Vec<bool>,
    /// Where [`TruePairs::take`] goes on.
    cursor: (usize, usize),
    next_lone: usize,
}

impl TruePairs {
    /// Up to `limit` more (anchor, partner) rows into `rows`, from `cursor` on:
    /// (pair index, unused) for listed pairs; (anchor row, how many of its
    /// partner rows, taken document by document, are already out) by document.
    fn take(&self, cursor: &mut (usize, usize), rows: &mut Vec<JoinRow>, limit: usize) {
        match self {
            TruePairs::Listed(pairs) => {
                let start = cursor.0;
                let end = pairs.len().min(start + limit - rows.len());
                rows.extend(pairs[start..end].iter().map(|&(a, p)| (Some(a), Some(p))));
                cursor.0 = end;
            }
            TruePairs::ByDocument {
                anchor_doc,
                true_partners,
                partner_rows,
            } => {
                let (mut a, mut skip) = *cursor;
                while a < anchor_doc.len() {
                    let d = anchor_doc[a];
                    if d != u32::MAX {
                        let mut index = 0;
                        for &dp in &true_partners[d as usize] {
                            let these = &partner_rows[dp as usize];
                            let from = skip.saturating_sub(index).min(these.len());
                            let to = these.len().min(from + (limit - rows.len()));
                            rows.extend(these[from..to].iter().map(|&p| (Some(a as u32), Some(p))));
                            skip = skip.max(index + to);
                            index += these.len();
                            if rows.len() == limit {
                                *cursor = (a, skip);
                                return;
                            }
                        }
                    }
                    a += 1;
                    skip = 0;
                }
                *cursor = (a, 0);
            }
        }
    }
}

impl Iterator for JoinOutput {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        let mut rows: Vec<JoinRow> = Vec::new();
        if !self.sides.one_sided() {
            self.pairs
                .take(&mut self.cursor, &mut rows, self.chunk_rows);
        }
        let room = self.chunk_rows - rows.len();
        let end = self.lone_anchors.len().min(self.next_lone + room);
        rows.extend(
            self.lone_anchors[self.next_lone..end]
                .iter()
                .map(|&a| (Some(a), None)),
        );
        let marks = self.lone_marks.get(self.next_lone..end).unwrap_or_default();
        self.next_lone = end;
        if rows.is_empty() {
            return None;
        }
        // Rows as (anchor, partner), placed as (left, right).
        let out = if self.sides.anchor_left {
            assemble(
                self.state.schema.clone(),
                self.sides,
                &self.anchor_batch,
                &self.partner_batch,
                &rows,
                marks,
            )
        } else {
            let rows: Vec<_> = rows.into_iter().map(|(a, p)| (p, a)).collect();
            assemble(
                self.state.schema.clone(),
                self.sides,
                &self.partner_batch,
                &self.anchor_batch,
                &rows,
                marks,
            )
        };
        Some(out)
    }
}

/// Which candidate (anchor row, partner row) pairs meet the residual condition
/// (NULL counts as not met), evaluated on the pairs as left ‖ right rows.
fn residual_mask(
    residual: &Arc<dyn PhysicalExpr>,
    combined: SchemaRef,
    anchor_left: bool,
    anchor_batch: &RecordBatch,
    partner_batch: &RecordBatch,
    candidates: &[(u32, u32)],
) -> Result<Vec<bool>> {
    if candidates.is_empty() {
        return Ok(Vec::new());
    }
    let a = UInt32Array::from_iter_values(candidates.iter().map(|c| c.0));
    let p = UInt32Array::from_iter_values(candidates.iter().map(|c| c.1));
    let pick = |batch: &RecordBatch, idx: &UInt32Array| {
        batch
            .columns()
            .iter()
            .map(|c| take(c.as_ref(), idx, None))
            .collect::<std::result::Result<Vec<_>, _>>()
    };
    let (mut columns, right) = if anchor_left {
        (pick(anchor_batch, &a)?, pick(partner_batch, &p)?)
    } else {
        (pick(partner_batch, &p)?, pick(anchor_batch, &a)?)
    };
    columns.extend(right);
    let pairs = RecordBatch::try_new_with_options(
        combined,
        columns,
        &datafusion::arrow::array::RecordBatchOptions::new().with_row_count(Some(candidates.len())),
    )?;
    let value = residual
        .evaluate(&pairs)
        .and_then(|v| v.into_array(pairs.num_rows()))
        .map_err(EngineError::DataFusion)?;
    let mask = value.as_boolean_opt().ok_or_else(|| {
        EngineError::Data(format!(
            "a join condition evaluated to {}, not a boolean",
            value.data_type()
        ))
    })?;
    Ok((0..mask.len())
        .map(|i| mask.is_valid(i) && mask.value(i))
        .collect())
}

/// After the last anchor batch: the partner rows the join type keeps by their
/// match state (unmatched rows of an outer side, semi or anti on the partner
/// side), or all of them with their marks.
pub(super) fn unmatched_partners(
    state: &OpState,
    sides: JoinSides,
    anchor_schema: SchemaRef,
    partner_batch: &RecordBatch,
    partner_marks: &PartnerMarks,
) -> DfResult<RecordBatch> {
    let partner_left = !sides.anchor_left;
    let marking = sides.marks(partner_left);
    let want = match sides.semi(partner_left) {
        _ if marking => false,
        Some(want) => want,
        None if sides.keeps_unmatched(partner_left) => false,
        None => return Ok(RecordBatch::new_empty(state.schema.clone())),
    };
    let matched = &partner_marks.matched;
    // A row whose match is unknown (a spent budget) is not kept for not matching.
    let partner_rows: Vec<u32> = (0..partner_batch.num_rows() as u32)
        .filter(|&p| {
            (marking || matched[p as usize] == want) && !partner_marks.undetermined(p as usize)
        })
        .collect();
    let marks: Vec<bool> = if marking {
        partner_rows.iter().map(|&p| matched[p as usize]).collect()
    } else {
        Vec::new()
    };
    let marks = &marks[..];
    let partner_rows = partner_rows.into_iter();
    let no_anchors = RecordBatch::new_empty(anchor_schema);
    let out = if partner_left {
        let rows: Vec<_> = partner_rows.map(|p| (Some(p), None)).collect();
        assemble(
            state.schema.clone(),
            sides,
            partner_batch,
            &no_anchors,
            &rows,
            marks,
        )?
    } else {
        let rows: Vec<_> = partner_rows.map(|p| (None, Some(p))).collect();
        assemble(
            state.schema.clone(),
            sides,
            &no_anchors,
            partner_batch,
            &rows,
            marks,
        )?
    };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::StringViewArray;
    use datafusion::arrow::compute::concat_batches;
    use datafusion::arrow::datatypes::{Field, Schema};

    #[test]
    fn a_partner_side_made_of_slices_keeps_only_its_own_text() {
        let text: Vec<String> = (0..1000).map(|i| format!("{i:0>200}")).collect();
        let column: ArrayRef = Arc::new(StringViewArray::from_iter_values(&text));
        let schema = Arc::new(Schema::new(vec![Field::new(
            "t",
            DataType::Utf8View,
            false,
        )]));
        let whole = RecordBatch::try_new(schema.clone(), vec![column]).unwrap();
        // One row from each of 50 slices: every piece still points at all the text.
        let pieces: Vec<RecordBatch> = (0..50).map(|i| whole.slice(i * 20, 1)).collect();
        let joined = concat_batches(&schema, &pieces).unwrap();
        let compact = compact_views(joined.clone()).unwrap();
        assert_eq!(compact.num_rows(), 50);
        let values = |b: &RecordBatch| -> Vec<String> {
            use datafusion::arrow::array::AsArray;
            let a = b.column(0).as_string_view();
            (0..a.len()).map(|i| a.value(i).to_string()).collect()
        };
        assert_eq!(values(&compact), values(&joined));
        assert!(
            compact.get_array_memory_size() * 20 < joined.get_array_memory_size(),
            "{} bytes compacted from {}",
            compact.get_array_memory_size(),
            joined.get_array_memory_size()
        );
    }

    /// Every pair, taken `limit` at a time.
    fn drained(pairs: &TruePairs, limit: usize) -> Vec<JoinRow> {
        let (mut cursor, mut all) = ((0, 0), Vec::new());
        loop {
            let mut rows = Vec::new();
            pairs.take(&mut cursor, &mut rows, limit);
            assert!(rows.len() <= limit);
            if rows.is_empty() {
                return all;
            }
            all.extend(rows);
        }
    }

    #[test]
    fn pairs_by_document_come_out_whole_in_chunks_of_any_size() {
        // Anchor rows 0..6 with documents 0, 1, none, 0, 2, 1; partner
        // documents 0 (rows 0, 3), 1 (row 1), 2 (rows 2, 4, 5).
        let pairs = TruePairs::ByDocument {
            anchor_doc: vec![0, 1, u32::MAX, 0, 2, 1],
            true_partners: vec![vec![2, 0], vec![], vec![1]],
            partner_rows: vec![vec![0, 3], vec![1], vec![2, 4, 5]],
        };
        let s = |a: u32, p: u32| (Some(a), Some(p));
        let want = vec![
            s(0, 2),
            s(0, 4),
            s(0, 5),
            s(0, 0),
            s(0, 3),
            s(3, 2),
            s(3, 4),
            s(3, 5),
            s(3, 0),
            s(3, 3),
            s(4, 1),
        ];
        for limit in 1..=want.len() + 1 {
            assert_eq!(drained(&pairs, limit), want, "limit {limit}");
        }
        let listed = TruePairs::Listed(vec![(0, 1), (0, 2), (5, 0)]);
        for limit in 1..=4 {
            assert_eq!(
                drained(&listed, limit),
                vec![s(0, 1), s(0, 2), s(5, 0)],
                "limit {limit}"
            );
        }
    }
}
