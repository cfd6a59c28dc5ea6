//! The reference result of a query (SPEC §D.2) built from the labels: which
//! documents survive each relation's filters, classifications and IN-lists, and
//! which of their pairs each join keeps. From these parts the result is either
//! materialised ([`crate::scoring::reference_rows`]) or, without ever holding
//! it, tested row by row and counted through the join tree
//! ([`Reference::compare_stream`]): at sf 1.0 IMDB-9's result has billions of
//! rows, but its documents and labelled pairs are a few hundred thousand.

use std::collections::{HashMap, HashSet};

use crate::quailb::labels::{LabelSet, LabelStore};
use crate::quailb::plan::{Operator, QueryPlan};
use aisql_engine::data::row_digest::row_hash;
use datafusion::arrow::array::{Array, ArrayRef, DictionaryArray, RecordBatch, StringArray};
use datafusion::arrow::datatypes::Int32Type;
use rayon::prelude::*;

use crate::corpus::Corpus;
use crate::error::{BenchError, Result};
use crate::metrics::{Assessment, OutputAccuracy, Reason, judged};

fn err(msg: impl Into<String>) -> BenchError {
    BenchError::Scoring(msg.into())
}

/// The label set answering `op`, or an error naming it.
pub(crate) fn label_set<'a>(labels: &'a LabelStore, op: &Operator) -> Result<&'a LabelSet> {
    let template = op.template().unwrap_or_default();
    labels
        .for_template(template)
        .map(|s| s.as_ref())
        .ok_or_else(|| {
            err(format!(
                "collection {} has no labels for {}",
                labels.collection_id,
                op.id()
            ))
        })
}

/// The documents of one relation that survive its document-level operators.
#[derive(Debug)]
pub struct Survivors {
    /// Relation alias.
    pub alias: String,
    /// Surviving ids in table order.
    pub ids: Vec<String>,
    /// Hashed with foldhash: every row of a streamed comparison looks its
    /// ids up here.
    index: foldhash::HashMap<String, u32>,
}

impl Survivors {
    fn new(alias: &str, ids: Vec<String>) -> Self {
        let index = ids
            .iter()
            .enumerate()
            .map(|(i, x)| (x.clone(), i as u32))
            .collect();
        Self {
            alias: alias.to_string(),
            ids,
            index,
        }
    }

    /// The position of a surviving id.
    pub fn position(&self, id: &str) -> Option<u32> {
        self.index.get(id).copied()
    }
}

/// The pairs of surviving documents one join keeps (labelled true, equality
/// keys met), as positions in the two relations' [`Survivors`].
#[derive(Debug)]
pub struct JoinPairs {
    /// Relation (index into [`Reference::survivors`]) of `{0}`.
    pub left: usize,
    /// Relation of `{1}`.
    pub right: usize,
    /// The kept pairs, left position then right.
    pub pairs: Vec<(u32, u32)>,
    /// The kept pairs as a set, looked up for every row of results of
    /// billions of rows.
    kept: PairSet,
}

fn pair_key(left: u32, right: u32) -> u64 {
    (u64::from(left) << 32) | u64::from(right)
}

/// How many (left, right) position pairs a join may span and still be held
/// as a bit matrix (32 MiB).
const DENSE_PAIR_BITS: u64 = 1 << 28;

/// A set of (left, right) position pairs.
#[derive(Debug)]
enum PairSet {
    /// A bit per pair of positions, `width` right positions a row: one probe
    /// of a matrix that mostly stays in cache (IMDB-9's reviews by aspects at
    /// sf 1.0 are a few megabits), where a hash probe missed it on nearly
    /// every row.
    Dense { width: u64, bits: Vec<u64> },
    /// Keys of [`pair_key`], hashed with foldhash, whose folded multiply
    /// spreads both halves of the key (a plain multiply left the table's
    /// index bits to the right position alone, and every lookup of IMDB-9's
    /// join-3 probed long runs of collisions).
    Hashed(foldhash::HashSet<u64>),
}

impl PairSet {
    /// The set of `pairs`, positions below `left_len` and `right_len`.
    fn new(pairs: &[(u32, u32)], left_len: usize, right_len: usize) -> Self {
        let width = right_len as u64;
        match (left_len as u64).checked_mul(width) {
            Some(cells) if cells <= DENSE_PAIR_BITS => {
                let mut bits = vec![0u64; cells.div_ceil(64) as usize];
                for &(l, r) in pairs {
                    let cell = u64::from(l) * width + u64::from(r);
                    bits[(cell / 64) as usize] |= 1 << (cell % 64);
                }
                PairSet::Dense { width, bits }
            }
            _ => PairSet::Hashed(pairs.iter().map(|&(l, r)| pair_key(l, r)).collect()),
        }
    }

    /// Whether the pair of positions is in the set; positions outside the
    /// relations are not.
    fn contains(&self, left: u32, right: u32) -> bool {
        match self {
            PairSet::Dense { width, bits } => {
                if u64::from(right) >= *width {
                    return false;
                }
                let cell = u64::from(left) * width + u64::from(right);
                bits.get((cell / 64) as usize)
                    .is_some_and(|word| word & (1 << (cell % 64)) != 0)
            }
            PairSet::Hashed(keys) => keys.contains(&pair_key(left, right)),
        }
    }
}

/// What the reference result is made of.
#[derive(Debug)]
pub struct Reference<'a> {
    plan: &'a QueryPlan,
    labels: &'a LabelStore,
    /// Per relation of the plan, in its order.
    pub survivors: Vec<Survivors>,
    /// Per (alias, label column) of a one-document classification: each
    /// surviving document's reference label.
    pub doc_labels: HashMap<(String, String), HashMap<String, String>>,
    /// Per join operator, in post-order.
    pub joins: Vec<JoinPairs>,
}

impl<'a> Reference<'a> {
    /// The parts of `plan`'s reference result over `corpus`, from `labels`.
    pub fn build(plan: &'a QueryPlan, labels: &'a LabelStore, corpus: &Corpus) -> Result<Self> {
        let mut survivors: HashMap<String, Vec<String>> = HashMap::new();
        for r in &plan.relations {
            survivors.insert(r.alias.clone(), corpus.ids(&r.table)?.ids.clone());
        }
        let mut doc_labels: HashMap<(String, String), HashMap<String, String>> = HashMap::new();
        for op in &plan.operators {
            match op {
                Operator::Filter { alias, id, .. } => {
                    let set = label_set(labels, op)?;
                    let s = survivors.get_mut(alias).expect("alias of a filter");
                    let mut keep = Vec::with_capacity(s.len());
                    for x in s.drain(..) {
                        if set.get_bool(&x, None).ok_or_else(|| {
                            err(format!(
                                "{id}: predicate {} has no label for {x}",
                                set.info.key
                            ))
                        })? {
                            keep.push(x);
                        }
                    }
                    *s = keep;
                }
                Operator::Classify {
                    alias,
                    partner: None,
                    output,
                    ..
                } => {
                    let set = label_set(labels, op)?;
                    let s = survivors.get_mut(alias).expect("alias of a classification");
                    let mut map = HashMap::new();
                    s.retain(|x| match set.get_label(x, None) {
                        Some(l) => {
                            map.insert(x.clone(), l.to_string());
                            true
                        }
                        None => false,
                    });
                    doc_labels.insert((alias.clone(), output.clone()), map);
                }
                _ => {}
            }
        }
        for op in &plan.operators {
            if let Operator::InList {
                alias,
                output,
                accepted,
                ..
            } = op
            {
                let map = doc_labels
                    .get(&(alias.clone(), output.clone()))
                    .ok_or_else(|| {
                        err(format!(
                            "{}: no classification for {alias}.{output}",
                            op.id()
                        ))
                    })?;
                survivors
                    .get_mut(alias)
                    .expect("alias of an IN-list")
                    .retain(|x| map.get(x).is_some_and(|l| accepted.contains(l)));
            }
        }
        let survivors: Vec<Survivors> = plan
            .relations
            .iter()
            .map(|r| Survivors::new(&r.alias, survivors.remove(&r.alias).unwrap_or_default()))
            .collect();
        let relation = |alias: &str| {
            survivors
                .iter()
                .position(|s| s.alias == alias)
                .ok_or_else(|| err(format!("alias {alias} is not a relation of the plan")))
        };
        let mut joins = Vec::new();
        for op in &plan.operators {
            let Operator::Join { aliases, on, .. } = op else {
                continue;
            };
            let set = label_set(labels, op)?;
            let (l, r) = (relation(&aliases[0])?, relation(&aliases[1])?);
            let table = |i: usize| &plan.relations[i].table;
            let eq_cols: Vec<_> = on
                .iter()
                .map(|(c0, c1)| -> Result<_> {
                    Ok((corpus.column(table(l), c0)?, corpus.column(table(r), c1)?))
                })
                .collect::<Result<_>>()?;
            let mut by_key: HashMap<Vec<&str>, Vec<u32>> = HashMap::new();
            for (j, y) in survivors[r].ids.iter().enumerate() {
                let k: Vec<&str> = eq_cols
                    .iter()
                    .map(|(_, c1)| c1.get(y).unwrap_or(""))
                    .collect();
                by_key.entry(k).or_default().push(j as u32);
            }
            let mut pairs = Vec::new();
            for (i, x) in survivors[l].ids.iter().enumerate() {
                let k: Vec<&str> = eq_cols
                    .iter()
                    .map(|(c0, _)| c0.get(x).unwrap_or(""))
                    .collect();
                for &j in by_key.get(&k).map(Vec::as_slice).unwrap_or(&[]) {
                    if set.get_bool(x, Some(&survivors[r].ids[j as usize])) == Some(true) {
                        pairs.push((i as u32, j));
                    }
                }
            }
            let kept = PairSet::new(&pairs, survivors[l].ids.len(), survivors[r].ids.len());
            joins.push(JoinPairs {
                left: l,
                right: r,
                pairs,
                kept,
            });
        }
        Ok(Self {
            plan,
            labels,
            survivors,
            doc_labels,
            joins,
        })
    }

    /// The classification writing label column `name` of `alias`.
    fn classification(&self, alias: &str, column: &str) -> Result<&'a Operator> {
        self.plan
            .operators
            .iter()
            .find(|o| {
                matches!(o, Operator::Classify { alias: a, output, .. } if a == alias && output == column)
            })
            .ok_or_else(|| err(format!("no classification outputs {alias}.{column}")))
    }

    /// The reference label of column `column` of `alias` for a row whose
    /// relations hold `ids` (by relation index).
    pub fn label_of(
        &self,
        alias: &str,
        column: &str,
        ids: impl Fn(&str) -> Result<String>,
    ) -> Result<String> {
        let op = self.classification(alias, column)?;
        let Operator::Classify { partner, .. } = op else {
            unreachable!("classification() finds classifications")
        };
        let x = ids(alias)?;
        match partner {
            None => self.doc_labels[&(alias.to_string(), column.to_string())]
                .get(&x)
                .cloned()
                .ok_or_else(|| err(format!("{}: no label for {x}", op.id()))),
            Some(p) => {
                let y = ids(p)?;
                label_set(self.labels, op)?
                    .get_label(&x, Some(&y))
                    .map(str::to_string)
                    .ok_or_else(|| {
                        err(format!(
                            "{}: no reference label for the pair ({x}, {y})",
                            op.id()
                        ))
                    })
            }
        }
    }

    /// How a streamed comparison reads the output columns, or `None` when the
    /// plan's shape needs the materialised reference: every relation's id must
    /// be selected once (so rows are distinct by their ids), the joins must
    /// connect all relations without a cycle, and a two-document label must
    /// belong to a joined pair.
    fn stream_shape(&self, columns: &[String]) -> Option<Vec<Column>> {
        let n = self.survivors.len();
        let mut seen = vec![false; n];
        let mut shape = Vec::new();
        for name in columns {
            let s = self.plan.select.iter().find(|s| &s.name == name)?;
            let rel = self.survivors.iter().position(|r| r.alias == s.alias)?;
            if s.column == "id" {
                if std::mem::replace(&mut seen[rel], true) {
                    return None;
                }
                shape.push(Column::Id(rel));
                continue;
            }
            let Operator::Classify { partner, .. } =
                self.classification(&s.alias, &s.column).ok()?
            else {
                return None;
            };
            let partner = match partner {
                None => None,
                Some(p) => {
                    let p = self.survivors.iter().position(|r| &r.alias == p)?;
                    let join = self.joins.iter().position(|j| {
                        (j.left, j.right) == (rel, p) || (j.left, j.right) == (p, rel)
                    })?;
                    Some((p, join))
                }
            };
            shape.push(Column::Label {
                relation: rel,
                column: s.column.clone(),
                partner,
            });
        }
        if seen.iter().any(|s| !s) {
            return None;
        }
        // A forest spanning one tree: n - 1 joins that never close a cycle.
        if self.joins.len() + 1 != n {
            return None;
        }
        let mut parent: Vec<usize> = (0..n).collect();
        fn root(p: &mut [usize], mut x: usize) -> usize {
            while p[x] != x {
                p[x] = p[p[x]];
                x = p[x];
            }
            x
        }
        for j in &self.joins {
            let (a, b) = (root(&mut parent, j.left), root(&mut parent, j.right));
            if a == b {
                return None;
            }
            parent[a] = b;
        }
        Some(shape)
    }

    /// How many distinct rows the reference result has, when its rows are
    /// tuples of documents with `columns` holding each relation's id (counted
    /// through the join tree); `None` for other shapes.
    pub fn expected_rows(&self, columns: &[String]) -> Result<Option<u64>> {
        match self.stream_shape(columns) {
            Some(_) => self.count().map(Some),
            None => Ok(None),
        }
    }

    /// The number of reference rows: tuples of surviving documents, one per
    /// relation, whose pairs every join keeps. Counted through the join tree
    /// (each relation's count per document is the product, over the relations
    /// joined below it, of its partners' counts), never enumerated.
    fn count(&self) -> Result<u64> {
        let n = self.survivors.len();
        let mut edges: Vec<Vec<(usize, bool)>> = vec![Vec::new(); n];
        for (e, j) in self.joins.iter().enumerate() {
            edges[j.left].push((e, true));
            edges[j.right].push((e, false));
        }
        // Depth-first order from relation 0; parents come before children.
        let mut order = vec![0];
        let mut parent_edge: Vec<Option<usize>> = vec![None; n];
        let mut visited = vec![false; n];
        visited[0] = true;
        let mut i = 0;
        while i < order.len() {
            let node = order[i];
            for &(e, is_left) in &edges[node] {
                let j = &self.joins[e];
                let other = if is_left { j.right } else { j.left };
                if !visited[other] {
                    visited[other] = true;
                    parent_edge[other] = Some(e);
                    order.push(other);
                }
            }
            i += 1;
        }
        let mut counts: Vec<Vec<u64>> = self
            .survivors
            .iter()
            .map(|s| vec![1; s.ids.len()])
            .collect();
        let overflow = || err("the reference result has more than 2^64 rows");
        for &node in order.iter().rev() {
            let Some(e) = parent_edge[node] else { continue };
            let j = &self.joins[e];
            let parent = if j.left == node { j.right } else { j.left };
            let mut sums = vec![0u64; self.survivors[parent].ids.len()];
            for &(l, r) in &j.pairs {
                let (p, c) = if parent == j.left { (l, r) } else { (r, l) };
                sums[p as usize] = sums[p as usize]
                    .checked_add(counts[node][c as usize])
                    .ok_or_else(overflow)?;
            }
            for (total, s) in counts[parent].iter_mut().zip(sums) {
                *total = total.checked_mul(s).ok_or_else(overflow)?;
            }
        }
        counts[0]
            .iter()
            .try_fold(0u64, |acc, &c| acc.checked_add(c))
            .ok_or_else(overflow)
    }

    /// Compares the predicted rows in `parts` (string columns named
    /// `columns`, plain or dictionary-encoded) with the reference without
    /// materialising either: each row is tested for membership, the reference
    /// is counted through its join tree, and a row whose documents form a
    /// reference row with other labels is a label mismatch (one more pass over
    /// the rows, only when there are such rows, tells whether the right row is
    /// there too). `None` when the plan's shape needs the materialised
    /// comparison.
    ///
    /// `parts` gives the rows as consecutive runs, each with the index of its
    /// first row; the runs are read side by side (rayon). Distinct rows are
    /// counted: the first [`DISTINCT_CHECKED_ROWS`] rows are checked for
    /// repeats by a 128-bit hash (each run's sorted once at the end, then
    /// merged, not probed row by row: a set of 64 M hashes misses the cache on
    /// every insert); past that the rows are taken as distinct, as the engine
    /// writes them (every relation's id is among the columns). `rows`, when
    /// known (a file's footer), sizes the hashes once.
    pub fn compare_stream<I>(
        &self,
        columns: &[String],
        rows: Option<u64>,
        parts: impl Fn() -> Result<Vec<(u64, I)>>,
    ) -> Result<Option<(OutputAccuracy, Assessment)>>
    where
        I: Iterator<Item = Result<RecordBatch>> + Send,
    {
        let Some(shape) = self.stream_shape(columns) else {
            return Ok(None);
        };
        let expected = self.count()?;
        let runs = parts()?;
        let ends: Vec<Option<u64>> = runs
            .iter()
            .skip(1)
            .map(|(first, _)| Some(*first))
            .chain([rows])
            .collect();
        let tallies = runs
            .into_par_iter()
            .zip(ends)
            .map(|((first, batches), end)| self.tally(&shape, columns, first, end, batches))
            .collect::<Result<Vec<PartTally>>>()?;
        let mut predicted = 0u64;
        let mut matching = 0u64;
        let mut extra = 0u64;
        let mut candidates: HashMap<Vec<u32>, u64> = HashMap::new();
        let mut sorted = Vec::with_capacity(tallies.len());
        for t in tallies {
            predicted += t.predicted;
            matching += t.matching;
            extra += t.extra;
            for (key, n) in t.candidates {
                *candidates.entry(key).or_default() += n;
            }
            sorted.push(t.hashes);
        }
        // Repeats among the checked rows count once. A repeated row of other
        // labels is also taken off its documents' count below, where the
        // second pass finds its documents.
        let mut repeated_other: foldhash::HashMap<u128, u64> = Default::default();
        for_each_repeat(&sorted, |hash, repeats| {
            predicted -= repeats;
            match hash & TAG_MASK {
                MEMBER_TAG => matching -= repeats,
                OTHER_TAG => {
                    extra -= repeats;
                    repeated_other.insert(hash, repeats);
                }
                _ => extra -= repeats,
            }
        });
        drop(sorted);
        // Reference rows whose documents were predicted with wrong labels only
        // (the right row is absent): those rows are label mismatches, not
        // missing and extra rows.
        let mut mismatched_rows = 0u64;
        let mut mismatched_keys = 0u64;
        if !candidates.is_empty() {
            let mut right_present: HashSet<Vec<u32>> = HashSet::new();
            let mut positions = Vec::new();
            let mut scratch = Vec::new();
            for (first, batches) in parts()? {
                let mut row_index = first;
                RowReader::new(&shape).for_each_row(self, batches, columns, |row| {
                    let checked = row_index < DISTINCT_CHECKED_ROWS as u64;
                    row_index += 1;
                    match self.classify_row(&shape, &row, &mut positions)? {
                        RowMatch::Member => {
                            let key = self.key_of(&shape, &row);
                            if candidates.contains_key(&key) {
                                right_present.insert(key);
                            }
                        }
                        RowMatch::OtherLabels(key) if checked && !repeated_other.is_empty() => {
                            let hash = tagged(row_hash(row.values, &mut scratch), OTHER_TAG);
                            if let Some(repeats) = repeated_other.remove(&hash)
                                && let Some(rows) = candidates.get_mut(&key)
                            {
                                *rows -= repeats;
                            }
                        }
                        _ => {}
                    }
                    Ok(())
                })?;
            }
            for (key, rows) in &candidates {
                if !right_present.contains(key) {
                    mismatched_rows += rows;
                    mismatched_keys += 1;
                }
            }
        }
        let missing = expected - matching;
        let mut reasons = Vec::new();
        if predicted > 0 && expected > 0 {
            if mismatched_rows > 0 {
                reasons.push(Reason::LabelMismatch);
            }
            if missing > mismatched_keys {
                reasons.push(Reason::ResultMissingRows);
            }
            if extra > mismatched_rows {
                reasons.push(Reason::ResultExtraRows);
            }
        }
        Ok(Some(judged(predicted, expected, matching, reasons)))
    }

    /// The first pass of [`Self::compare_stream`] over one run of the rows,
    /// whose first row is the `first`th (`end`: the index after its last, when
    /// known).
    fn tally<I>(
        &self,
        shape: &[Column],
        columns: &[String],
        first: u64,
        end: Option<u64>,
        batches: I,
    ) -> Result<PartTally>
    where
        I: Iterator<Item = Result<RecordBatch>>,
    {
        let limit = DISTINCT_CHECKED_ROWS as u64;
        let checked = end.map_or(0, |end| end.min(limit).saturating_sub(first.min(limit)));
        let mut tally = PartTally {
            hashes: Vec::with_capacity(checked as usize),
            ..PartTally::default()
        };
        let mut scratch = Vec::new();
        let mut positions = Vec::new();
        let mut row_index = first;
        RowReader::new(shape).for_each_row(self, batches, columns, |row| {
            let hash = (row_index < limit).then(|| row_hash(row.values, &mut scratch));
            row_index += 1;
            let tag = match self.classify_row(shape, &row, &mut positions)? {
                RowMatch::Member => {
                    tally.matching += 1;
                    MEMBER_TAG
                }
                RowMatch::Outside => {
                    tally.extra += 1;
                    OUTSIDE_TAG
                }
                RowMatch::OtherLabels(key) => {
                    tally.extra += 1;
                    *tally.candidates.entry(key).or_default() += 1;
                    OTHER_TAG
                }
            };
            tally.hashes.extend(hash.map(|h| tagged(h, tag)));
            tally.predicted += 1;
            Ok(())
        })?;
        tally.hashes.sort_unstable();
        Ok(tally)
    }

    /// Where one predicted row stands against the reference.
    fn classify_row(
        &self,
        shape: &[Column],
        row: &RowView<'_>,
        positions: &mut Vec<u32>,
    ) -> Result<RowMatch> {
        positions.clear();
        positions.resize(self.survivors.len(), 0);
        for (c, col) in shape.iter().enumerate() {
            if let Column::Id(rel) = col {
                match row.position(c) {
                    NOT_A_SURVIVOR => return Ok(RowMatch::Outside),
                    p => positions[*rel] = p,
                }
            }
        }
        if !self
            .joins
            .iter()
            .zip(row.kept.iter())
            .all(|(j, kept)| kept.contains(j, positions[j.left], positions[j.right]))
        {
            return Ok(RowMatch::Outside);
        }
        for (c, col) in shape.iter().enumerate() {
            let Column::Label {
                relation,
                column,
                partner,
            } = col
            else {
                continue;
            };
            let x = &self.survivors[*relation].ids[positions[*relation] as usize];
            let want = match partner {
                None => self.doc_labels[&(self.survivors[*relation].alias.clone(), column.clone())]
                    .get(x)
                    .map(String::as_str),
                Some((p, _)) => {
                    let y = &self.survivors[*p].ids[positions[*p] as usize];
                    let op = self.classification(&self.survivors[*relation].alias, column)?;
                    Some(
                        label_set(self.labels, op)?
                            .get_label(x, Some(y))
                            .ok_or_else(|| {
                                err(format!(
                                    "{}: no reference label for the pair ({x}, {y})",
                                    op.id()
                                ))
                            })?,
                    )
                }
            };
            if want != Some(row.values[c]) {
                return Ok(RowMatch::OtherLabels(positions.clone()));
            }
        }
        Ok(RowMatch::Member)
    }

    /// The relations' positions of a member row.
    fn key_of(&self, shape: &[Column], row: &RowView<'_>) -> Vec<u32> {
        let mut positions = vec![0u32; self.survivors.len()];
        for (c, col) in shape.iter().enumerate() {
            if let Column::Id(rel) = col {
                positions[*rel] = row.position(c);
            }
        }
        positions
    }
}

/// How many predicted rows are checked for repeats (a 16-byte hash each, 1 GiB
/// at most).
pub const DISTINCT_CHECKED_ROWS: usize = 1 << 26;

/// The low bits of a checked row's hash say how the row stands.
const TAG_MASK: u128 = 3;
const OUTSIDE_TAG: u128 = 0;
const MEMBER_TAG: u128 = 1;
const OTHER_TAG: u128 = 2;

fn tagged(hash: u128, tag: u128) -> u128 {
    (hash & !TAG_MASK) | tag
}

/// What the first pass over one run of predicted rows found.
#[derive(Default)]
struct PartTally {
    /// Rows, repeats included.
    predicted: u64,
    /// Reference rows among them.
    matching: u64,
    /// Rows outside the reference, or of its documents with other labels.
    extra: u64,
    /// The tagged hashes of the run's checked rows, sorted.
    hashes: Vec<u128>,
    /// Per documents of a reference row (their positions), the run's rows of
    /// them with other labels.
    candidates: HashMap<Vec<u32>, u64>,
}

/// Calls `repeated` with every value that `sorted` (each list sorted) hold
/// more than once in all, and how many times more.
fn for_each_repeat(sorted: &[Vec<u128>], mut repeated: impl FnMut(u128, u64)) {
    let mut heads = vec![0usize; sorted.len()];
    let mut run: Option<(u128, u64)> = None;
    loop {
        let next = sorted
            .iter()
            .zip(&heads)
            .enumerate()
            .filter_map(|(list, (values, &head))| values.get(head).map(|&v| (v, list)))
            .min();
        let Some((value, list)) = next else { break };
        heads[list] += 1;
        match &mut run {
            Some((v, n)) if *v == value => *n += 1,
            _ => {
                if let Some((v, n)) = run.replace((value, 1))
                    && n > 1
                {
                    repeated(v, n - 1);
                }
            }
        }
    }
    if let Some((v, n)) = run
        && n > 1
    {
        repeated(v, n - 1);
    }
}

/// What an output column holds, for a streamed comparison.
#[derive(Debug)]
enum Column {
    /// The id of a relation (index into the survivors).
    Id(usize),
    /// A label column of a relation; with its partner relation and the join
    /// between them for a two-document classification.
    Label {
        relation: usize,
        column: String,
        partner: Option<(usize, usize)>,
    },
}

enum RowMatch {
    /// A reference row.
    Member,
    /// The documents of a reference row (their positions), other labels.
    OtherLabels(Vec<u32>),
    /// Not a reference row's documents.
    Outside,
}

/// An id column's value that is not a surviving document.
const NOT_A_SURVIVOR: u32 = u32::MAX;

/// One predicted row as the comparison sees it.
struct RowView<'r> {
    /// The row's values, in the order of the output columns.
    values: &'r [&'r str],
    /// Per output column, the positions of the batch's ids among their
    /// relation's survivors ([`NOT_A_SURVIVOR`]); empty for label columns.
    positions: &'r [Vec<u32>],
    /// The row's index in its batch.
    row: usize,
    /// Per join, the last pair looked up and whether it was kept.
    kept: &'r [KeptMemo],
}

impl RowView<'_> {
    /// The survivor position of the id in output column `c`, an id column.
    fn position(&self, c: usize) -> u32 {
        self.positions[c][self.row]
    }
}

/// The last pair a join was asked about: joined rows repeat the same pairs
/// over long runs (IMDB-9's r1, a1 and r2 stay while a2 turns), and one
/// compare is cheaper than a probe of the join's set.
#[derive(Default)]
struct KeptMemo {
    last: std::cell::Cell<Option<(u64, bool)>>,
}

impl KeptMemo {
    fn contains(&self, join: &JoinPairs, left: u32, right: u32) -> bool {
        let key = pair_key(left, right);
        if let Some((k, kept)) = self.last.get()
            && k == key
        {
            return kept;
        }
        let kept = join.kept.contains(left, right);
        self.last.set(Some((key, kept)));
        kept
    }
}

/// Reads predicted rows batch by batch, resolving their ids to survivor
/// positions: a dictionary-encoded column (as a result file is read) looks
/// each dictionary value up once, however many rows repeat it; a plain column
/// remembers its last id, since joined rows repeat ids over long runs.
struct RowReader<'s> {
    shape: &'s [Column],
    /// Per output column, the last dictionary resolved and its values'
    /// positions (the dictionary is held, so its buffers' addresses name it:
    /// the reader hands every batch of a column chunk the same buffers, each
    /// time in a new array).
    dictionaries: Vec<Option<(ArrayRef, Vec<u32>)>>,
    /// Per output column, the last plain id and its position.
    last_plain: Vec<Option<(String, u32)>>,
}

impl<'s> RowReader<'s> {
    fn new(shape: &'s [Column]) -> Self {
        Self {
            shape,
            dictionaries: vec![None; shape.len()],
            last_plain: vec![None; shape.len()],
        }
    }

    /// Calls `each` with every row of `batches`, its values in the order of
    /// `columns` (reused buffers: rows are never collected).
    fn for_each_row<I>(
        &mut self,
        reference: &Reference<'_>,
        batches: I,
        columns: &[String],
        mut each: impl FnMut(RowView<'_>) -> Result<()>,
    ) -> Result<()>
    where
        I: Iterator<Item = Result<RecordBatch>>,
    {
        let kept: Vec<KeptMemo> = reference
            .joins
            .iter()
            .map(|_| KeptMemo::default())
            .collect();
        let mut positions: Vec<Vec<u32>> = vec![Vec::new(); columns.len()];
        for batch in batches {
            let batch = batch?;
            let texts = text_columns(&batch, columns)?;
            let mut values: Vec<&str> = Vec::with_capacity(columns.len());
            for (c, col) in self.shape.iter().enumerate() {
                if let Column::Id(rel) = col {
                    self.resolve(c, &texts[c], &reference.survivors[*rel], &mut positions[c])?;
                }
            }
            for row in 0..batch.num_rows() {
                values.clear();
                values.extend(texts.iter().map(|t| t.value(row)));
                each(RowView {
                    values: &values,
                    positions: &positions,
                    row,
                    kept: &kept,
                })?;
            }
        }
        Ok(())
    }

    /// The survivor position of every row's id in column `c` into `out`.
    fn resolve(
        &mut self,
        c: usize,
        texts: &TextColumn<'_>,
        survivors: &Survivors,
        out: &mut Vec<u32>,
    ) -> Result<()> {
        out.clear();
        let position = |id: &str| survivors.position(id).unwrap_or(NOT_A_SURVIVOR);
        match texts {
            TextColumn::Dictionary {
                keys,
                values,
                dictionary,
            } => {
                let known =
                    matches!(&self.dictionaries[c], Some((d, _)) if same_strings(d, values));
                if !known {
                    let table = (0..values.len())
                        .map(|i| position(values.value(i)))
                        .collect();
                    self.dictionaries[c] = Some((dictionary.clone(), table));
                }
                let (_, table) = self.dictionaries[c].as_ref().expect("resolved above");
                out.extend(keys.iter().map(|&k| table[k as usize]));
            }
            TextColumn::Plain(array) => {
                let last = &mut self.last_plain[c];
                out.extend((0..array.len()).map(|row| {
                    let id = array.value(row);
                    match last {
                        Some((l, p)) if l == id => *p,
                        _ => {
                            let p = position(id);
                            *last = Some((id.to_string(), p));
                            p
                        }
                    }
                }));
            }
        }
        Ok(())
    }
}

/// Whether `held` is an array over the very buffers of `values`.
fn same_strings(held: &ArrayRef, values: &StringArray) -> bool {
    let Some(held) = held.as_any().downcast_ref::<StringArray>() else {
        return false;
    };
    held.len() == values.len()
        && held.value_offsets().as_ptr() == values.value_offsets().as_ptr()
        && held.values().as_ptr() == values.values().as_ptr()
}

/// A string column of a result batch, as read.
enum TextColumn<'b> {
    Plain(&'b StringArray),
    /// Keys (checked to lie in the dictionary) into `values`.
    Dictionary {
        keys: &'b [i32],
        values: &'b StringArray,
        dictionary: ArrayRef,
    },
}

impl<'b> TextColumn<'b> {
    fn value(&self, row: usize) -> &'b str {
        match self {
            TextColumn::Plain(a) => a.value(row),
            TextColumn::Dictionary { keys, values, .. } => values.value(keys[row] as usize),
        }
    }
}

/// The named string columns of a result batch, plain or with 32-bit
/// dictionary keys; a null, or a key outside its dictionary, is an error.
fn text_columns<'b>(batch: &'b RecordBatch, columns: &[String]) -> Result<Vec<TextColumn<'b>>> {
    columns
        .iter()
        .map(|n| {
            let a = batch
                .column_by_name(n)
                .ok_or_else(|| err(format!("the output has no column {n}")))?;
            if a.null_count() > 0 {
                return Err(err(format!("output column {n} has nulls")));
            }
            if let Some(a) = a.as_any().downcast_ref::<StringArray>() {
                return Ok(TextColumn::Plain(a));
            }
            let not_text = || err(format!("output column {n} is not a string column"));
            let dict = a
                .as_any()
                .downcast_ref::<DictionaryArray<Int32Type>>()
                .ok_or_else(not_text)?;
            let values = dict
                .values()
                .as_any()
                .downcast_ref::<StringArray>()
                .ok_or_else(not_text)?;
            if values.null_count() > 0 {
                return Err(err(format!("output column {n} has nulls")));
            }
            let keys = dict.keys().values();
            if keys.iter().any(|&k| k < 0 || k as usize >= values.len()) {
                return Err(err(format!(
                    "output column {n}: a dictionary key outside its {} values",
                    values.len()
                )));
            }
            Ok(TextColumn::Dictionary {
                keys,
                values,
                dictionary: dict.values().clone(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_are_found_within_and_across_sorted_lists() {
        let mut found = Vec::new();
        for_each_repeat(&[vec![1, 2, 2, 5, 9], vec![], vec![2, 3, 5, 5]], |v, n| {
            found.push((v, n))
        });
        assert_eq!(found, [(2, 2), (5, 2)]);
        found.clear();
        for_each_repeat(&[vec![4, 4], vec![4]], |v, n| found.push((v, n)));
        assert_eq!(found, [(4, 2)]);
        found.clear();
        for_each_repeat(&[vec![1, 3], vec![2, 4]], |v, n| found.push((v, n)));
        assert!(found.is_empty());
        for_each_repeat(&[], |_, _| panic!("no values"));
    }

    #[test]
    fn a_pair_set_answers_alike_as_a_bit_matrix_and_hashed() {
        let pairs = [(0, 0), (2, 4), (3, 1), (1, 4)];
        let dense = PairSet::new(&pairs, 4, 5);
        assert!(matches!(dense, PairSet::Dense { .. }));
        // Past the matrix bound the same pairs are hashed.
        let wide = PairSet::new(&pairs, 1 << 20, 1 << 20);
        assert!(matches!(wide, PairSet::Hashed(_)));
        for set in [&dense, &wide] {
            for l in 0..6 {
                for r in 0..7 {
                    assert_eq!(set.contains(l, r), pairs.contains(&(l, r)), "({l}, {r})");
                }
            }
        }
        // A right position past the width must not alias the next row's cell.
        assert!(!dense.contains(1, 5));
        assert!(!dense.contains(u32::MAX, u32::MAX));
    }
}
