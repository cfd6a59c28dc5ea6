//! Per-operator answer tables (SPEC §D.1): every evaluated tuple once, with the
//! answer the backend gave. Operators record into a shared [`AnswerRecorder`]
//! while the query runs; the query result lists the tables in post-order.

use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};

use crate::backend::AiKind;
use crate::error::{EngineError, Result};

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
    /// TRUE/FALSE answers (filters, joins).
    pub answers: Vec<bool>,
    /// Labels (classifications).
    pub labels: Vec<String>,
}

impl AnswerTable {
    /// An empty table for an operator.
    pub fn new(op_id: &str, kind: AiKind, aliases: Vec<String>) -> Self {
        let ids = aliases.iter().map(|_| Vec::new()).collect();
        Self {
            op_id: op_id.to_string(),
            kind,
            aliases,
            ids,
            answers: Vec::new(),
            labels: Vec::new(),
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
        match self.kind {
            AiKind::Classify => {
                fields.push(Field::new("label", DataType::Utf8, false));
                columns.push(Arc::new(StringArray::from_iter_values(&self.labels)));
            }
            AiKind::Filter | AiKind::Join => {
                fields.push(Field::new("answer", DataType::Boolean, false));
                columns.push(Arc::new(BooleanArray::from(self.answers.clone())));
            }
        }
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
            .map_err(|e| EngineError::Data(format!("answer table {}: {e}", self.op_id)))
    }

    /// Reads a table written by [`AnswerTable::to_record_batch`] (or by the QUAIL-B
    /// harness) back: every column but the last is an alias's ids (strings), the last
    /// is `answer` (boolean, filters and joins) or `label` (string, classifications).
    /// Nulls are an error naming the operator, column and row.
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
        let no_nulls = |c: usize| -> Result<()> {
            let col = batch.column(c);
            match col
                .nulls()
                .and_then(|nulls| (0..col.len()).find(|&i| nulls.is_null(i)))
            {
                Some(row) => Err(bad(format!(
                    "column {} has a null in row {row}",
                    schema.field(c).name()
                ))),
                None => Ok(()),
            }
        };
        let strings = |c: usize, what: &str| -> Result<Vec<String>> {
            no_nulls(c)?;
            let col = batch.column(c).as_string_opt::<i32>().ok_or_else(|| {
                bad(format!(
                    "{what} column {} is {}, not a string",
                    schema.field(c).name(),
                    schema.field(c).data_type()
                ))
            })?;
            Ok(col
                .iter()
                .map(|v| v.unwrap_or_default().to_string())
                .collect())
        };
        let mut table = Self::new(op_id, kind, aliases);
        for c in 0..n - 1 {
            table.ids[c] = strings(c, "id")?;
        }
        let last = schema.field(n - 1).name();
        match kind {
            AiKind::Classify => {
                if last != "label" {
                    return Err(bad(format!("last column is {last:?}, expected \"label\"")));
                }
                table.labels = strings(n - 1, "label")?;
            }
            AiKind::Filter | AiKind::Join => {
                if last != "answer" {
                    return Err(bad(format!("last column is {last:?}, expected \"answer\"")));
                }
                no_nulls(n - 1)?;
                let col = batch.column(n - 1).as_boolean_opt().ok_or_else(|| {
                    bad(format!(
                        "answer column is {}, not boolean",
                        schema.field(n - 1).data_type()
                    ))
                })?;
                table.answers = col.values().iter().collect();
            }
        }
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
                t.labels.extend(table.labels);
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

    fn table(kind: AiKind) -> AnswerTable {
        let aliases = match kind {
            AiKind::Join => vec!["r".to_string(), "a".to_string()],
            _ => vec!["r".to_string()],
        };
        let mut t = AnswerTable::new("op-1", kind, aliases);
        for (i, c) in t.ids.iter_mut().enumerate() {
            *c = vec![format!("x{i}"), format!("y{i}")];
        }
        match kind {
            AiKind::Classify => t.labels = vec!["POSITIVE".into(), "NEGATIVE".into()],
            _ => t.answers = vec![true, false],
        }
        t
    }

    #[test]
    fn record_batches_round_trip() {
        for kind in [AiKind::Filter, AiKind::Join, AiKind::Classify] {
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
