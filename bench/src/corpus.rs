//! Columns of the input tables as scoring and token counting need them: ids,
//! equality columns (FEV-10's `claims.evidence_wiki_url`) and text columns, read
//! once per run and shared across queries.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use aisql_engine::data::tables::read_table;

use crate::error::{BenchError, Result};
use datafusion::arrow::array::{Array, StringArray};

/// One string column of a table, with the table's ids alongside.
#[derive(Debug)]
pub struct TableColumn {
    /// `id` per row.
    pub ids: Vec<String>,
    /// The column's value per row.
    pub values: Vec<String>,
    index: HashMap<String, usize>,
}

impl TableColumn {
    /// The value of the row with `id`.
    pub fn get(&self, id: &str) -> Option<&str> {
        self.index.get(id).map(|&i| self.values[i].as_str())
    }
}

/// The input tables of a run.
#[derive(Debug)]
pub struct Corpus {
    paths: BTreeMap<String, PathBuf>,
    columns: Mutex<HashMap<(String, String), Arc<TableColumn>>>,
}

impl Corpus {
    /// Tables by name.
    pub fn new(paths: BTreeMap<String, PathBuf>) -> Self {
        Self {
            paths,
            columns: Mutex::new(HashMap::new()),
        }
    }

    /// `column` of `table` (read on first use).
    pub fn column(&self, table: &str, column: &str) -> Result<Arc<TableColumn>> {
        let key = (table.to_string(), column.to_string());
        if let Some(c) = self.columns.lock().expect("corpus lock").get(&key) {
            return Ok(c.clone());
        }
        let path = self.paths.get(table).ok_or_else(|| {
            BenchError::Scoring(format!("table {table} is not among the dataset's tables"))
        })?;
        let wanted = if column == "id" {
            vec!["id".to_string()]
        } else {
            vec!["id".to_string(), column.to_string()]
        };
        let batch = read_table(table, path, &wanted, &[])?;
        let strings = |name: &str| -> Result<Vec<String>> {
            let idx = batch.schema().index_of(name)?;
            let array = batch
                .column(idx)
                .as_any()
                .downcast_ref::<StringArray>()
                .ok_or_else(|| BenchError::Parquet {
                    path: path.clone(),
                    message: format!("table {table}: column {name} is not a string"),
                })?;
            Ok((0..array.len())
                .map(|i| array.value(i).to_string())
                .collect())
        };
        let ids = strings("id")?;
        let values = if column == "id" {
            ids.clone()
        } else {
            strings(column)?
        };
        let index = ids
            .iter()
            .enumerate()
            .map(|(i, id)| (id.clone(), i))
            .collect();
        let col = Arc::new(TableColumn { ids, values, index });
        self.columns
            .lock()
            .expect("corpus lock")
            .insert(key, col.clone());
        Ok(col)
    }

    /// Ids of `table` in file order.
    pub fn ids(&self, table: &str) -> Result<Arc<TableColumn>> {
        self.column(table, "id")
    }
}
