//! Scoring one query against the reference labels (SPEC §D.2): the reference
//! result built from the labels, output quality on distinct tuples, predicate
//! accuracy of filter/join answers, label accuracy of classifications, and a
//! `good`/`bad` assessment with deterministic reasons.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use crate::quailb::labels::{LabelSet, LabelStore};
use crate::quailb::output::{OutputFiles, ROWS_SUMMARY_FILE};
use crate::quailb::plan::{Operator, QueryPlan};
use aisql_engine::data::files::read_parquet;
use aisql_engine::data::parquet_read::stream_dictionary_parts;
use aisql_engine::data::row_digest::RowsSummary;
use aisql_engine::exec::answers::AnswerTable;
use aisql_engine::inference::backend::AiKind;
use aisql_engine::inference::work::Work;
use datafusion::arrow::array::{Array, RecordBatch, StringArray};

use aisql_models::tokenizer::Tokenizer;

use crate::corpus::Corpus;
use crate::error::{BenchError, Result};
use crate::layout::Dataset;
use crate::metrics::{
    Accuracy, Assessment, BinaryCounts, LabelCounts, OutputAccuracy, PredicateScore, QueryMetrics,
    QueryStatus, Reason, Throughput, Verdict, judged,
};
use crate::reference::Reference;
use crate::run_file::{QueryRecord, write_atomic};
use crate::tokens::{DocTokens, piece_counts, pieces_json, plan_pieces, token_metrics};

fn err(msg: impl Into<String>) -> BenchError {
    BenchError::Scoring(msg.into())
}

/// Strings as small integers, so that large results compare cheaply.
#[derive(Debug, Clone, Default)]
pub struct Interner {
    map: HashMap<String, u32>,
    strings: Vec<String>,
}

impl Interner {
    /// The number of `s` (added on first sight).
    pub fn intern(&mut self, s: &str) -> u32 {
        if let Some(&i) = self.map.get(s) {
            return i;
        }
        let i = self.strings.len() as u32;
        self.strings.push(s.to_string());
        self.map.insert(s.to_string(), i);
        i
    }

    /// The string of a number.
    pub fn get(&self, i: u32) -> &str {
        &self.strings[i as usize]
    }
}

/// Most columns a scored row can have (relations joined, or output columns):
/// the 43 queries need at most 4, and every byte counts at tens of millions of rows.
pub const ROW_CAP: usize = 4;

/// A tuple of interned values stored inline: result sets can hold tens of
/// millions of rows (IMDB-9 at sf 0.1), so a row must not cost a heap block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Row {
    len: u8,
    values: [u32; ROW_CAP],
}

impl std::ops::Deref for Row {
    type Target = [u32];
    fn deref(&self) -> &[u32] {
        &self.values[..self.len as usize]
    }
}

impl Extend<u32> for Row {
    /// Values past [`ROW_CAP`] are dropped; callers check widths first
    /// ([`check_width`]).
    fn extend<I: IntoIterator<Item = u32>>(&mut self, iter: I) {
        for x in iter {
            if (self.len as usize) < ROW_CAP {
                self.values[self.len as usize] = x;
                self.len += 1;
            }
        }
    }
}

impl FromIterator<u32> for Row {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        let mut row = Row::default();
        row.extend(iter);
        row
    }
}

/// An error when rows of `width` columns do not fit in a [`Row`].
fn check_width(width: usize, what: &str) -> Result<()> {
    if width > ROW_CAP {
        return Err(err(format!(
            "{what} has {width} columns; scoring supports at most {ROW_CAP}"
        )));
    }
    Ok(())
}

/// A set of distinct tuples with named columns (values interned).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tuples {
    /// Column names.
    pub columns: Vec<String>,
    /// Distinct rows.
    pub rows: HashSet<Row>,
}

impl Tuples {
    /// Distinct tuples from strings.
    pub fn from_strings(columns: &[&str], rows: &[&[&str]], interner: &mut Interner) -> Self {
        Self {
            columns: columns.iter().map(|s| s.to_string()).collect(),
            rows: rows
                .iter()
                .map(|r| r.iter().map(|s| interner.intern(s)).collect())
                .collect(),
        }
    }

    /// Distinct string tuples of a batch (every column must be a string).
    pub fn from_batch(batch: &RecordBatch, interner: &mut Interner) -> Result<Self> {
        let columns: Vec<String> = batch
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        let arrays: Vec<&StringArray> = batch
            .columns()
            .iter()
            .zip(&columns)
            .map(|(a, n)| {
                a.as_any()
                    .downcast_ref::<StringArray>()
                    .ok_or_else(|| err(format!("output column {n} is not a string column")))
            })
            .collect::<Result<_>>()?;
        check_width(columns.len(), "the output")?;
        let mut rows = HashSet::with_capacity(batch.num_rows());
        for i in 0..batch.num_rows() {
            let row = arrays
                .iter()
                .zip(&columns)
                .map(|(a, n)| {
                    if a.is_null(i) {
                        Err(err(format!("output column {n} is null in row {i}")))
                    } else {
                        Ok(interner.intern(a.value(i)))
                    }
                })
                .collect::<Result<Row>>()?;
            rows.insert(row);
        }
        Ok(Self { columns, rows })
    }

    /// The rows with columns reordered to `order` (None when the sets differ);
    /// borrowed when the order is already the same.
    fn reordered(&self, order: &[String]) -> Option<std::borrow::Cow<'_, HashSet<Row>>> {
        let idx: Vec<usize> = order
            .iter()
            .map(|c| self.columns.iter().position(|x| x == c))
            .collect::<Option<_>>()?;
        if idx.len() != self.columns.len() {
            return None;
        }
        if idx.iter().enumerate().all(|(i, &j)| i == j) {
            return Some(std::borrow::Cow::Borrowed(&self.rows));
        }
        Some(std::borrow::Cow::Owned(
            self.rows
                .iter()
                .map(|r| idx.iter().map(|&i| r[i]).collect())
                .collect(),
        ))
    }
}

/// The column reasons of an output with `predicted` columns against a
/// reference with `expected` ones (order irrelevant); empty when they match.
fn column_reasons(predicted: &[String], expected: &[String]) -> Vec<Reason> {
    let pred_set: HashSet<&String> = predicted.iter().collect();
    let exp_set: HashSet<&String> = expected.iter().collect();
    let mut reasons = Vec::new();
    if exp_set.iter().any(|c| !pred_set.contains(c)) {
        reasons.push(Reason::ResultMissingColumns);
    }
    if pred_set.iter().any(|c| !exp_set.contains(c)) {
        reasons.push(Reason::ResultExtraColumns);
    }
    reasons
}

/// Compares output and reference: quality counts and the assessment.
/// `label_columns` are the names of the output's label columns (not ids).
pub fn compare_rows(
    predicted: &Tuples,
    expected: &Tuples,
    label_columns: &[String],
) -> (OutputAccuracy, Assessment) {
    let mut reasons = column_reasons(&predicted.columns, &expected.columns);
    let n_pred = predicted.rows.len() as u64;
    let n_exp = expected.rows.len() as u64;
    let aligned = if !reasons.is_empty() {
        None
    } else {
        predicted.reordered(&expected.columns)
    };
    let matching = match &aligned {
        Some(rows) => rows.intersection(&expected.rows).count() as u64,
        None => 0,
    };
    if let Some(rows) = &aligned
        && n_pred > 0
        && n_exp > 0
    {
        let extra: Vec<&Row> = rows.difference(&expected.rows).collect();
        let missing: Vec<&Row> = expected.rows.difference(rows).collect();
        let id_cols: Vec<usize> = (0..expected.columns.len())
            .filter(|&i| !label_columns.contains(&expected.columns[i]))
            .collect();
        let key = |r: &Row| -> Row { id_cols.iter().map(|&i| r[i]).collect() };
        let (mut extra_left, mut missing_left) = (extra.len(), missing.len());
        if id_cols.len() < expected.columns.len() {
            let missing_keys: HashSet<Row> = missing.iter().map(|r| key(r)).collect();
            let extra_keys: HashSet<Row> = extra.iter().map(|r| key(r)).collect();
            let mismatched = extra
                .iter()
                .filter(|r| missing_keys.contains(&key(r)))
                .count();
            if mismatched > 0 {
                reasons.push(Reason::LabelMismatch);
            }
            extra_left -= mismatched;
            missing_left -= missing
                .iter()
                .filter(|r| extra_keys.contains(&key(r)))
                .count();
        }
        if missing_left > 0 {
            reasons.push(Reason::ResultMissingRows);
        }
        if extra_left > 0 {
            reasons.push(Reason::ResultExtraRows);
        }
    }
    judged(n_pred, n_exp, matching, reasons)
}

/// The reference result of a query (SPEC §D.2), columns in output order.
pub fn reference_rows(
    plan: &QueryPlan,
    labels: &LabelStore,
    corpus: &Corpus,
    interner: &mut Interner,
) -> Result<Tuples> {
    let reference = Reference::build(plan, labels, corpus)?;
    let survivors: BTreeMap<&str, &Vec<String>> = reference
        .survivors
        .iter()
        .map(|s| (s.alias.as_str(), &s.ids))
        .collect();
    // Joins, then their natural join.
    check_width(plan.relations.len(), "the query's join")?;
    check_width(plan.select.len(), "the query's output")?;
    let mut result: Option<(Vec<String>, Vec<Row>)> = None;
    for join in &reference.joins {
        let (l, r) = (
            &reference.survivors[join.left],
            &reference.survivors[join.right],
        );
        let pairs: Vec<Row> = join
            .pairs
            .iter()
            .map(|&(i, j)| {
                [
                    interner.intern(&l.ids[i as usize]),
                    interner.intern(&r.ids[j as usize]),
                ]
                .into_iter()
                .collect()
            })
            .collect();
        let rel_cols = vec![l.alias.clone(), r.alias.clone()];
        result = Some(match result {
            None => (rel_cols, pairs),
            Some((cols, rows)) => natural_join(&cols, &rows, &rel_cols, &pairs),
        });
    }
    let (cols, rows) = match result {
        Some(r) => r,
        None => {
            let base = &plan.relations[0].alias;
            (
                vec![base.clone()],
                survivors[base.as_str()]
                    .iter()
                    .map(|x| std::iter::once(interner.intern(x)).collect::<Row>())
                    .collect(),
            )
        }
    };
    // Label columns and projection.
    let col_of = |a: &str| {
        cols.iter()
            .position(|c| c == a)
            .ok_or_else(|| err(format!("alias {a} not joined")))
    };
    let mut out = HashSet::new();
    for r in &rows {
        let mut t = Row::default();
        for s in &plan.select {
            if s.column == "id" {
                t.extend([r[col_of(&s.alias)?]]);
                continue;
            }
            let id_of = |alias: &str| Ok(interner.get(r[col_of(alias)?]).to_string());
            let label = reference.label_of(&s.alias, &s.column, id_of)?;
            t.extend([interner.intern(&label)]);
        }
        out.insert(t);
    }
    Ok(Tuples {
        columns: plan.output_names(),
        rows: out,
    })
}

fn natural_join(
    lc: &[String],
    lrows: &[Row],
    rc: &[String],
    rrows: &[Row],
) -> (Vec<String>, Vec<Row>) {
    let shared: Vec<(usize, usize)> = lc
        .iter()
        .enumerate()
        .filter_map(|(i, c)| rc.iter().position(|x| x == c).map(|j| (i, j)))
        .collect();
    let extra: Vec<usize> = (0..rc.len())
        .filter(|j| !shared.iter().any(|&(_, s)| s == *j))
        .collect();
    let mut index: HashMap<Row, Vec<&Row>> = HashMap::new();
    for r in rrows {
        index
            .entry(shared.iter().map(|&(_, j)| r[j]).collect())
            .or_default()
            .push(r);
    }
    let mut cols = lc.to_vec();
    cols.extend(extra.iter().map(|&j| rc[j].clone()));
    let mut rows = Vec::new();
    for l in lrows {
        let k: Row = shared.iter().map(|&(i, _)| l[i]).collect();
        for r in index.get(&k).map(Vec::as_slice).unwrap_or(&[]) {
            let mut row = *l;
            row.extend(extra.iter().map(|&j| r[j]));
            rows.push(row);
        }
    }
    (cols, rows)
}

/// TRUE/FALSE agreement of one filter/join answer table; a missing label is an error.
pub fn agreement(table: &AnswerTable, set: &LabelSet) -> Result<BinaryCounts> {
    let mut c = BinaryCounts::default();
    for row in 0..table.len() {
        let left = &table.ids[0][row];
        let right = table.ids.get(1).map(|c| c[row].as_str());
        let label = set.get_bool(left, right).ok_or_else(|| {
            err(format!(
                "{}: predicate {} has no label for ({left}, {})",
                table.op_id,
                set.info.key,
                right.unwrap_or("null")
            ))
        })?;
        let answer = table.decision(row).ok_or_else(|| {
            err(format!(
                "{}: row {row} of a {} table is not a TRUE/FALSE",
                table.op_id,
                table.kind.name()
            ))
        })?;
        c.add(answer, label);
    }
    Ok(c.finish())
}

/// Label agreement of one classification answer table.
pub fn label_agreement(table: &AnswerTable, set: &LabelSet) -> Result<LabelCounts> {
    let mut c = LabelCounts::default();
    for row in 0..table.len() {
        let left = &table.ids[0][row];
        let right = table.ids.get(1).map(|c| c[row].as_str());
        match set.get_label(left, right) {
            Some(l) => {
                c.evaluated += 1;
                c.correct += u64::from(Some(l) == table.label(row));
            }
            None if right.is_some() => c.unlabeled += 1,
            None => {
                return Err(err(format!(
                    "{}: predicate {} has no label for {left}",
                    table.op_id, set.info.key
                )));
            }
        }
    }
    Ok(c.finish())
}

/// The saved outputs of a query, read back from its files.
#[derive(Debug, Clone)]
pub struct SavedQuery {
    /// `rows.parquet` as distinct tuples.
    pub rows: Tuples,
    /// The strings of `rows`.
    pub interner: Interner,
    /// Answer tables in file order (filters, joins, classifications).
    pub answers: Vec<AnswerTable>,
}

impl SavedQuery {
    /// Reads the files of a query saved under `run_dir`, its rows into memory.
    pub fn load(run_dir: &Path, files: &OutputFiles) -> Result<Self> {
        let batch = read_parquet(&run_dir.join(&files.rows))?;
        let mut interner = Interner::default();
        let rows = Tuples::from_batch(&batch, &mut interner)?;
        Ok(Self {
            rows,
            interner,
            answers: load_answers(run_dir, files)?,
        })
    }

    /// The answer table of an operator.
    pub fn answers_of(&self, op_id: &str) -> Option<&AnswerTable> {
        self.answers.iter().find(|t| t.op_id == op_id)
    }
}

/// The answer tables of a query saved under `run_dir`, in file order (filters,
/// joins, classifications).
pub fn load_answers(run_dir: &Path, files: &OutputFiles) -> Result<Vec<AnswerTable>> {
    let mut answers = Vec::new();
    for (list, kind) in [
        (&files.filters, AiKind::Filter),
        (&files.joins, AiKind::Join),
        (&files.classifications, AiKind::Classify),
    ] {
        for f in list {
            let path = run_dir.join(&f.path);
            let batch = read_parquet(&path)?;
            let table = AnswerTable::from_record_batch(&f.key, kind, &batch)
                .map_err(|e| err(format!("{}: {e}", path.display())))?;
            answers.push(table);
        }
    }
    Ok(answers)
}

/// The answer table of operator `op_id` among `answers`.
fn answers_of<'a>(answers: &'a [AnswerTable], op_id: &str) -> Option<&'a AnswerTable> {
    answers.iter().find(|t| t.op_id == op_id)
}

/// Compares the rows saved in `rows_path` with the reference: streamed, with
/// neither side held in memory, when the plan's shape allows it (see
/// [`Reference::compare_stream`]), else both materialised. A summary in place
/// of the rows ([`ROWS_SUMMARY_FILE`]) only tells whether the count is right.
pub fn compare_saved_rows(
    plan: &QueryPlan,
    labels: &LabelStore,
    corpus: &Corpus,
    rows_path: &Path,
) -> Result<(Option<OutputAccuracy>, Assessment)> {
    if rows_path.file_name().and_then(|n| n.to_str()) == Some(ROWS_SUMMARY_FILE) {
        return compare_summary(plan, labels, corpus, rows_path).map(|a| (None, a));
    }
    let failed = |e: &dyn std::fmt::Display| err(format!("{}: {e}", rows_path.display()));
    // One run of row groups per thread: the runs are compared side by side.
    let open = || {
        stream_dictionary_parts(rows_path, 8192, rayon::current_num_threads())
            .map_err(|e| failed(&e))
    };
    let columns: Vec<String> = open()?[0]
        .batches
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    let parts = || {
        Ok(open()?
            .into_iter()
            .map(|p| {
                (
                    p.first_row,
                    p.batches.map(move |b| b.map_err(|e| failed(&e))),
                )
            })
            .collect::<Vec<_>>())
    };
    let mut wanted = plan.output_names();
    let mut have = columns.clone();
    wanted.sort();
    have.sort();
    if have == wanted {
        let reference = Reference::build(plan, labels, corpus)?;
        let rows = aisql_engine::data::parquet_read::footer_rows(rows_path).ok();
        if let Some(compared) = reference.compare_stream(&columns, rows, parts)? {
            return Ok((Some(compared.0), compared.1));
        }
    }
    let batch = read_parquet(rows_path)?;
    let mut interner = Interner::default();
    let predicted = Tuples::from_batch(&batch, &mut interner)?;
    let expected = reference_rows(plan, labels, corpus, &mut interner)?;
    let (output, assessment) = compare_rows(&predicted, &expected, &label_columns(plan));
    Ok((Some(output), assessment))
}

/// The assessment of a result kept only as a count and hash: never good (it
/// was not compared), with the reasons its count and columns do tell.
fn compare_summary(
    plan: &QueryPlan,
    labels: &LabelStore,
    corpus: &Corpus,
    path: &Path,
) -> Result<Assessment> {
    let failed = |e: &dyn std::fmt::Display| err(format!("{}: {e}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| failed(&e))?;
    let summary: RowsSummary = serde_json::from_str(&text).map_err(|e| failed(&e))?;
    let mut reasons = column_reasons(&summary.columns, &plan.output_names());
    if reasons.is_empty() {
        let reference = Reference::build(plan, labels, corpus)?;
        let expected = match reference.expected_rows(&summary.columns)? {
            Some(n) => n,
            None => reference_rows(plan, labels, corpus, &mut Interner::default())?
                .rows
                .len() as u64,
        };
        // The engine writes distinct rows: more rows than the reference has
        // means extra ones, fewer means missing ones.
        match (summary.rows, expected) {
            (0, e) if e > 0 => reasons.push(Reason::EmptyResult),
            (p, 0) if p > 0 => reasons.push(Reason::EmptyReference),
            (p, e) if p < e => reasons.push(Reason::ResultMissingRows),
            (p, e) if p > e => reasons.push(Reason::ResultExtraRows),
            _ => {}
        }
    }
    reasons.push(Reason::ResultNotSaved);
    reasons.sort();
    Ok(Assessment {
        verdict: Verdict::Bad,
        reasons,
    })
}

/// Label columns of a plan's output (names).
pub fn label_columns(plan: &QueryPlan) -> Vec<String> {
    plan.select
        .iter()
        .filter(|s| s.column != "id")
        .map(|s| s.name.clone())
        .collect()
}

/// Scores a saved query: accuracy record and assessment.
pub fn score_accuracy(
    plan: &QueryPlan,
    labels: &LabelStore,
    corpus: &Corpus,
    table_rows: &BTreeMap<String, u64>,
    rows_path: &Path,
    answers: &[AnswerTable],
) -> Result<(Accuracy, Assessment)> {
    let (output, assessment) = compare_saved_rows(plan, labels, corpus, rows_path)?;
    let mut answer = BinaryCounts::default();
    let mut label = LabelCounts::default();
    let mut per = Vec::new();
    for op in &plan.operators {
        if op.template().is_none() {
            continue;
        }
        let table = answers_of(answers, op.id())
            .ok_or_else(|| err(format!("{}: no answer table was saved", op.id())))?;
        let set = crate::reference::label_set(labels, op)?;
        let key = set.info.key.clone();
        let operator_id = op.id().to_string();
        match op {
            Operator::Filter { alias, .. } => {
                let counts = agreement(table, set)?;
                answer.merge(&counts);
                per.push(PredicateScore::Filter {
                    predicate_key: key,
                    operator_id,
                    alias: alias.clone(),
                    counts,
                });
            }
            Operator::Join { .. } => {
                let counts = agreement(table, set)?;
                answer.merge(&counts);
                per.push(PredicateScore::Join {
                    predicate_key: key,
                    operator_id,
                    counts,
                });
            }
            Operator::Classify { .. } => {
                let counts = label_agreement(table, set)?;
                label.merge(&counts);
                per.push(PredicateScore::Classify {
                    predicate_key: key,
                    operator_id,
                    counts,
                });
            }
            Operator::InList { .. } => {}
        }
    }
    let rows_of = |t: &str| table_rows.get(t).copied().unwrap_or(0);
    Ok((
        Accuracy {
            ground_truth_collection_id: labels.collection_id.clone(),
            ground_truth_reference_model: labels.reference_model.clone(),
            answer_accuracy: answer.finish(),
            label_accuracy: label.finish(),
            output_accuracy: output,
            per_predicate: per,
            input_document_rows: plan.relations.iter().map(|r| rows_of(&r.table)).sum(),
            unique_input_documents: plan.tables().iter().map(|t| rows_of(t)).sum(),
        },
        assessment,
    ))
}

/// What scoring needs, shared by every query of a run: the reference labels of the
/// run's templates, the input tables' columns and the documents' token ids.
pub struct Scorer {
    labels: Arc<LabelStore>,
    corpus: Corpus,
    docs: DocTokens,
    table_rows: BTreeMap<String, u64>,
}

impl Scorer {
    /// Labels of `templates` and the tables of `dataset`.
    pub fn new(dataset: &Dataset, templates: &[String]) -> Result<Self> {
        let labels = dataset.shared_labels(templates)?;
        Ok(Self {
            labels,
            corpus: Corpus::new(dataset.tables.clone()),
            docs: DocTokens::new(Tokenizer::vendored()?),
            table_rows: dataset.table_rows.clone(),
        })
    }

    /// Writes `prompt_pieces.json` of a query and returns its path relative to the
    /// run, or `None` when the engine reported no fresh tokens: SPEC §D.3 pairs prompt
    /// pieces with `measurements.fresh_tokens`, so without them QUAIL-B has no pieces,
    /// and no minimum tokens or regret.
    pub fn save_pieces(
        &self,
        run_dir: &Path,
        id: &str,
        plan: &QueryPlan,
        measurements: &Work,
    ) -> Result<Option<String>> {
        if !has_fresh_tokens(measurements) {
            return Ok(None);
        }
        let pieces = plan_pieces(plan, self.docs.tokenizer())?;
        let rel = format!("{id}/prompt_pieces.json");
        let text = pieces_json(&pieces).to_string() + "\n";
        write_atomic(&run_dir.join(&rel), text.as_bytes())?;
        Ok(Some(rel))
    }

    /// Scores a saved query: its metrics and assessment.
    pub fn score(
        &self,
        run_dir: &Path,
        plan: &QueryPlan,
        rec: &QueryRecord,
        gpu_count: u32,
        rate: Option<f64>,
    ) -> Result<(QueryMetrics, Assessment)> {
        let files = rec
            .files
            .as_ref()
            .ok_or_else(|| err(format!("{}: the query has no saved files", rec.id)))?;
        let runtime_s = rec
            .runtime_s
            .ok_or_else(|| err(format!("{}: the query has no runtime", rec.id)))?;
        let empty = Work::default();
        let measurements = rec.measurements.as_ref().unwrap_or(&empty);
        let answers = load_answers(run_dir, files)?;
        let (accuracy, assessment) = score_accuracy(
            plan,
            &self.labels,
            &self.corpus,
            &self.table_rows,
            &run_dir.join(&files.rows),
            &answers,
        )?;
        let counts = if files.prompt_pieces.is_some() && has_fresh_tokens(measurements) {
            let pieces = plan_pieces(plan, self.docs.tokenizer())?;
            self.docs.keep_tables(&plan.tables());
            Some(piece_counts(&pieces, &answers, &self.corpus, &self.docs)?)
        } else {
            None
        };
        let tokens = token_metrics(counts, measurements)?;
        let input_rows: BTreeMap<String, u64> = plan
            .relations
            .iter()
            .map(|r| {
                (
                    r.alias.clone(),
                    self.table_rows.get(&r.table).copied().unwrap_or(0),
                )
            })
            .collect();
        let per_s = |v: f64| (runtime_s > 0.0).then(|| v / runtime_s);
        let joins: Vec<&Operator> = plan
            .operators
            .iter()
            .filter(|o| matches!(o, Operator::Join { .. }))
            .collect();
        let pairs = if joins.is_empty() {
            None
        } else {
            joins
                .iter()
                .map(|o| answers_of(&answers, o.id()).map(|t| t.len() as u64))
                .sum::<Option<u64>>()
                .or_else(|| measurements.evaluated_document_pairs.map(|s| s.0))
        };
        let throughput = if joins.is_empty() {
            Throughput::Documents(per_s(input_rows.values().sum::<u64>() as f64))
        } else {
            Throughput::Pairs(pairs.and_then(|p| per_s(p as f64)))
        };
        let cost_usd = rate.map(|r| runtime_s / 3600.0 * gpu_count as f64 * r);
        let cost_per_m = match (cost_usd, tokens.input_tokens) {
            (Some(c), Some(i)) if i > 0 => Some(c / i as f64 * 1e6),
            _ => None,
        };
        Ok((
            QueryMetrics {
                runtime_s,
                input_rows,
                accuracy,
                cost_usd,
                input_tokens: tokens.input_tokens,
                fresh_tokens: tokens.fresh_tokens,
                minimum_tokens: tokens.minimum_tokens,
                regret_tokens: tokens.regret_tokens,
                regret_approximate: tokens.regret_approximate,
                evaluated_document_pairs: pairs,
                input_tokens_per_second: tokens.input_tokens.and_then(|i| per_s(i as f64)),
                cost_usd_per_million_input_tokens: cost_per_m,
                kv_regret_percent: tokens.kv_regret_percent,
                throughput,
            },
            assessment,
        ))
    }

    /// Scores `rec` in place: `complete` with metrics, or `scoring_failed` with the
    /// error.
    pub fn score_into(
        &self,
        run_dir: &Path,
        plan: &QueryPlan,
        rec: &mut QueryRecord,
        gpu_count: u32,
        rate: Option<f64>,
    ) {
        match self.score(run_dir, plan, rec, gpu_count, rate) {
            Ok((m, a)) => {
                rec.metrics = Some(m);
                rec.assessment = Some(a);
                rec.status = QueryStatus::Complete;
                rec.error = None;
            }
            Err(e) => {
                rec.metrics = None;
                rec.assessment = None;
                rec.status = QueryStatus::ScoringFailed;
                rec.error = Some(format!("ScoringError: {e}"));
            }
        }
    }
}

fn has_fresh_tokens(measurements: &Work) -> bool {
    measurements.fresh_tokens.is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use aisql_engine::inference::backend::Answer;

    fn tuples(cols: &[&str], rows: &[&[&str]]) -> Tuples {
        thread_local!(static INTERNER: std::cell::RefCell<Interner> = Default::default());
        INTERNER.with(|i| Tuples::from_strings(cols, rows, &mut i.borrow_mut()))
    }

    fn reasons(p: &Tuples, e: &Tuples) -> Vec<&'static str> {
        let (_, a) = compare_rows(p, e, &["label".to_string()]);
        assert_eq!(a.verdict == Verdict::Good, a.reasons.is_empty());
        a.reasons.iter().map(|r| r.as_str()).collect()
    }

    #[test]
    fn equal_outputs_are_good_even_when_empty_or_reordered() {
        let e = tuples(&["r", "label"], &[&["1", "x"], &["2", "y"]]);
        let p = tuples(&["label", "r"], &[&["y", "2"], &["x", "1"]]);
        let (q, a) = compare_rows(&p, &e, &["label".into()]);
        assert_eq!(a.verdict, Verdict::Good);
        assert_eq!(
            (q.precision, q.recall, q.f1, q.exact_match),
            (1.0, 1.0, 1.0, true)
        );
        let empty = tuples(&["r"], &[]);
        let (q, a) = compare_rows(&empty, &empty, &[]);
        assert_eq!(a.verdict, Verdict::Good);
        assert_eq!(q.precision, 1.0);
    }

    #[test]
    fn every_reason_is_triggered() {
        let e = tuples(&["r", "label"], &[&["1", "x"], &["2", "y"]]);
        assert_eq!(reasons(&tuples(&["r", "label"], &[]), &e), ["EMPTY_RESULT"]);
        assert_eq!(
            reasons(&tuples(&["r", "label"], &[&["1", "x"]]), &e),
            ["RESULT_MISSING_ROWS"]
        );
        assert_eq!(
            reasons(
                &tuples(&["r", "label"], &[&["1", "x"], &["2", "y"], &["3", "z"]]),
                &e
            ),
            ["RESULT_EXTRA_ROWS"]
        );
        assert_eq!(
            reasons(&tuples(&["r"], &[&["1"], &["2"]]), &e),
            ["RESULT_MISSING_COLUMNS"]
        );
        assert_eq!(
            reasons(&tuples(&["r", "label", "z"], &[&["1", "x", "0"]]), &e),
            ["RESULT_EXTRA_COLUMNS"]
        );
        assert_eq!(
            reasons(&tuples(&["r", "label"], &[&["1", "x"], &["2", "x"]]), &e),
            ["LABEL_MISMATCH"]
        );
        assert_eq!(
            reasons(
                &tuples(&["r", "label"], &[&["1", "x"]]),
                &tuples(&["r", "label"], &[])
            ),
            ["EMPTY_REFERENCE"]
        );
    }

    #[test]
    fn binary_agreement_counts_and_missing_label_is_an_error() {
        use crate::quailb::labels::{LabelValue, PredicateInfo};
        let info = PredicateInfo {
            key: "k".into(),
            kind: AiKind::Filter,
            template: "t {0}".into(),
            left_table: "reviews".into(),
            left_column: "review".into(),
            right_table: None,
            right_column: None,
            labels: vec![],
            descriptions: vec![],
        };
        let mut set = LabelSet::new(info, "ls");
        for (id, v) in [("a", true), ("b", false), ("c", true), ("d", false)] {
            set.insert(id, None, LabelValue::Bool(v)).unwrap();
        }
        let mut t = AnswerTable::new("filter-1", AiKind::Filter, vec!["r".into()], Vec::new());
        t.ids[0] = vec!["a".into(), "b".into(), "c".into(), "d".into()];
        t.answers = vec![
            Answer::Bool(true),
            Answer::Bool(true),
            Answer::Bool(false),
            Answer::Bool(false),
        ];
        let c = agreement(&t, &set).unwrap();
        assert_eq!(
            (c.evaluated, c.correct, c.tp, c.tn, c.fp, c.fn_),
            (4, 2, 1, 1, 1, 1)
        );
        assert_eq!(
            (c.accuracy, c.precision, c.recall, c.f1),
            (0.5, 0.5, 0.5, 0.5)
        );
        t.ids[0].push("zz".into());
        t.answers.push(Answer::Bool(true));
        assert!(agreement(&t, &set).unwrap_err().to_string().contains("zz"));
    }

    #[test]
    fn natural_join_on_shared_aliases() {
        let row = |v: &[u32]| v.iter().copied().collect::<Row>();
        let (c, r) = natural_join(
            &["a".into(), "b".into()],
            &[row(&[1, 10]), row(&[2, 11])],
            &["b".into(), "c".into()],
            &[row(&[10, 20]), row(&[10, 21])],
        );
        assert_eq!(c, ["a", "b", "c"]);
        assert_eq!(r, [row(&[1, 10, 20]), row(&[1, 10, 21])]);
        assert_eq!(&*r[0], &[1, 10, 20]);
    }
}
