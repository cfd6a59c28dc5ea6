//! Per-operator answer tables (SPEC §D.1): every evaluated tuple once, with the
//! answer the backend gave. Operators record into a shared [`AnswerRecorder`]
//! while the query runs; the query result lists the tables in post-order.

use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{ArrayRef, BooleanArray, RecordBatch, StringArray};
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
