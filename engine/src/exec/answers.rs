//! Answers as Arrow: [`answer_array`], the one conversion of typed answers to
//! an SQL value column (operators and the naive evaluator alike), and the
//! per-operator answer tables (SPEC §D.1): every evaluated tuple once, with the
//! answer the backend gave. Operators record into a shared [`AnswerRecorder`]
//! while the query runs; the query result lists the tables in post-order.

use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{Array, ArrayRef, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};

use crate::error::{EngineError, Result};
use crate::inference::backend::{AiCall, AiKind, Answer};
use crate::inference::kinds::TableColumn;

/// The answers of `call`'s questions as a column of its return type, NULL
/// where a row was not asked (a NULL document) or got no answer
/// ([`Answer::Failed`], [`Answer::Unreached`]).
pub fn answer_array(call: &AiCall, answers: &[Option<Answer>]) -> Result<ArrayRef> {
    typed_array(
        call.kind,
        &call.labels,
        call.max_tokens,
        answers.iter().map(|a| a.as_ref().filter(|a| a.is_answer())),
    )
}

fn typed_array<'a>(
    kind: AiKind,
    labels: &[String],
    size: u32,
    answers: impl Iterator<Item = Option<&'a Answer>>,
) -> Result<ArrayRef> {
    let answers: Vec<Option<&Answer>> = answers.collect();
    kind.describe().column(labels, size, &answers)
}

/// The answer column's name in an answer table of `kind`.
pub fn answer_column(kind: AiKind) -> &'static str {
    kind.describe().answer_column()
}

/// The answers of one operator.
#[derive(Debug, Clone, PartialEq)]
pub struct AnswerTable {
    /// Operator id.
    pub op_id: String,
    /// Filter, join or classify.
    pub kind: AiKind,
    /// Column names: the aliases of the `{0}` (and `{1}`) documents.
    pub aliases: Vec<String>,
    /// Ids per alias column (`ids[c][row]`).
    pub ids: Vec<Vec<String>>,
    /// One answer per row, of the type `kind` asks for.
    pub answers: Vec<Answer>,
    /// The labels a label answer indexes: the call's labels, or for a table
    /// read back, its labels in order of first appearance.
    pub labels: Vec<String>,
}

impl AnswerTable {
    /// An empty table for an operator whose label answers index `labels`.
    pub fn new(op_id: &str, kind: AiKind, aliases: Vec<String>, labels: Vec<String>) -> Self {
        let ids = aliases.iter().map(|_| Vec::new()).collect();
        Self {
            op_id: op_id.to_string(),
            kind,
            aliases,
            ids,
            answers: Vec::new(),
            labels,
        }
    }

    /// The TRUE/FALSE of row `row` of a filter or join table.
    pub fn decision(&self, row: usize) -> Option<bool> {
        self.answers.get(row)?.as_bool()
    }

    /// The chosen label of row `row` of a classification table.
    pub fn label(&self, row: usize) -> Option<&str> {
        match self.answers.get(row)? {
            Answer::Label(i) => self.labels.get(*i as usize).map(String::as_str),
            _ => None,
        }
    }

    /// Number of evaluated tuples.
    pub fn len(&self) -> usize {
        self.ids.first().map_or(0, Vec::len)
    }

    /// True when nothing was evaluated.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The table as Arrow: one string column per alias, then `answer` or `label`.
    pub fn to_record_batch(&self) -> Result<RecordBatch> {
        let mut fields: Vec<Field> = self
            .aliases
            .iter()
            .map(|a| Field::new(a, DataType::Utf8, false))
            .collect();
        let mut columns: Vec<ArrayRef> = self
            .ids
            .iter()
            .map(|c| Arc::new(StringArray::from_iter_values(c)) as ArrayRef)
            .collect();
        let answers = typed_array(self.kind, &self.labels, 0, self.answers.iter().map(Some))
            .map_err(|e| EngineError::Data(format!("answer table {}: {e}", self.op_id)))?;
        fields.push(Field::new(
            answer_column(self.kind),
            answers.data_type().clone(),
            false,
        ));
        columns.push(answers);
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
            .map_err(|e| EngineError::Data(format!("answer table {}: {e}", self.op_id)))
    }

    /// Reads a table written by [`AnswerTable::to_record_batch`] (or by the QUAIL-B
    /// harness) back: every column but the last is an alias's ids (strings), the last
    /// is `answer` (boolean, filters and joins), `label` (string, classifications),
    /// `score` (float) or `text` (string). Nulls are an error naming the operator,
    /// column and row. Label probabilities are written, not read back.
    pub fn from_record_batch(op_id: &str, kind: AiKind, batch: &RecordBatch) -> Result<Self> {
        let bad = |m: String| EngineError::Data(format!("answer table {op_id}: {m}"));
        let n = batch.num_columns();
        if n < 2 {
            return Err(bad(format!(
                "{n} column(s); it needs one id column per document and an answer column"
            )));
        }
        let schema = batch.schema();
        let aliases: Vec<String> = schema.fields()[..n - 1]
            .iter()
            .map(|f| f.name().clone())
            .collect();
        let column = |c: usize| TableColumn {
            name: schema.field(c).name(),
            array: batch.column(c),
        };
        let mut table = Self::new(op_id, kind, aliases, Vec::new());
        for c in 0..n - 1 {
            table.ids[c] = column(c).strings("id").map_err(bad)?;
        }
        let last = schema.field(n - 1).name();
        let want = answer_column(kind);
        if last != want {
            return Err(bad(format!("last column is {last:?}, expected {want:?}")));
        }
        table.answers = kind
            .describe()
            .read_column(&column(n - 1), &mut table.labels)
            .map_err(bad)?;
        Ok(table)
    }
}

/// Collects answer tables from the operators of one query.
#[derive(Debug, Default)]
pub struct AnswerRecorder {
    tables: Mutex<Vec<AnswerTable>>,
}

impl AnswerRecorder {
    /// Adds (or extends) an operator's table.
    pub fn record(&self, table: AnswerTable) {
        let mut tables = self.tables.lock().expect("answer recorder lock");
        match tables.iter_mut().find(|t| t.op_id == table.op_id) {
            Some(t) => {
                for (c, ids) in t.ids.iter_mut().zip(table.ids) {
                    c.extend(ids);
                }
                t.answers.extend(table.answers);
            }
            None => tables.push(table),
        }
    }

    /// Takes the recorded tables.
    pub fn take(&self) -> Vec<AnswerTable> {
        std::mem::take(&mut *self.tables.lock().expect("answer recorder lock"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::BooleanArray;

    fn table(kind: AiKind) -> AnswerTable {
        let aliases = match kind {
            AiKind::Join => vec!["r".to_string(), "a".to_string()],
            _ => vec!["r".to_string()],
        };
        let labels = match kind {
            AiKind::Classify => vec!["POSITIVE".to_string(), "NEGATIVE".to_string()],
            _ => Vec::new(),
        };
        let mut t = AnswerTable::new("op-1", kind, aliases, labels);
        for (i, c) in t.ids.iter_mut().enumerate() {
            *c = vec![format!("x{i}"), format!("y{i}")];
        }
        t.answers = match kind {
            AiKind::Classify => vec![Answer::Label(0), Answer::Label(1)],
            AiKind::Score => vec![Answer::Score(0.25), Answer::Score(1.0)],
            AiKind::Complete => vec![Answer::Text("a".into()), Answer::Text("".into())],
            _ => vec![Answer::Bool(true), Answer::Bool(false)],
        };
        t
    }

    #[test]
    fn record_batches_round_trip() {
        for kind in [
            AiKind::Filter,
            AiKind::Join,
            AiKind::Classify,
            AiKind::Score,
            AiKind::Complete,
        ] {
            let t = table(kind);
            let back = AnswerTable::from_record_batch("op-1", kind, &t.to_record_batch().unwrap());
            assert_eq!(back.unwrap(), t, "{kind:?}");
        }
    }

    #[test]
    fn malformed_tables_name_the_operator_and_the_problem() {
        let err = |kind: AiKind, batch: &RecordBatch| {
            AnswerTable::from_record_batch("op-9", kind, batch)
                .unwrap_err()
                .to_string()
        };
        // A filter table read as a classification: the last column is `answer`.
        let filter = table(AiKind::Filter).to_record_batch().unwrap();
        let e = err(AiKind::Classify, &filter);
        assert!(e.contains("op-9") && e.contains("\"answer\""), "{e}");
        // Only one column.
        let one = filter.project(&[0]).unwrap();
        assert!(err(AiKind::Filter, &one).contains("1 column"));
        // A null id and a non-string id column.
        let schema = Arc::new(Schema::new(vec![
            Field::new("r", DataType::Utf8, true),
            Field::new("answer", DataType::Boolean, false),
        ]));
        let with_null = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(vec![Some("x"), None])),
                Arc::new(BooleanArray::from(vec![true, false])),
            ],
        )
        .unwrap();
        let e = err(AiKind::Filter, &with_null);
        assert!(e.contains("column r") && e.contains("row 1"), "{e}");
        let schema = Arc::new(Schema::new(vec![
            Field::new("r", DataType::Boolean, false),
            Field::new("answer", DataType::Boolean, false),
        ]));
        let bools = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(BooleanArray::from(vec![true])),
                Arc::new(BooleanArray::from(vec![true])),
            ],
        )
        .unwrap();
        assert!(err(AiKind::Filter, &bools).contains("not a string"));
    }
}
