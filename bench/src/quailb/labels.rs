//! Reference labels of a QUAIL-B collection, held in memory for the oracle backend
//! and for scoring.
//!
//! A collection maps each prompt template one-to-one to a predicate; a predicate's
//! label set holds one answer per document (filters, one-document classifications)
//! or per document pair (joins, joined-row classifications). Ids are interned per
//! label set so that a join label costs a `(u32, u32)` key and a `u16` value —
//! sf 1.0 has about 52 million labels.

use std::collections::HashMap;
use std::sync::Arc;

use aisql_engine::EngineError;
use aisql_engine::inference::backend::AiKind;

use crate::error::{BenchError, Result};

pub use aisql_standin::manifest::PredicateInfo;

/// One reference answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelValue {
    /// Filter or join answer.
    Bool(bool),
    /// Classification label (one of the predicate's labels).
    Label(String),
}

/// Interns the string ids of one table side.
#[derive(Debug, Default, Clone)]
struct IdIndex {
    ids: HashMap<Box<str>, u32>,
}

impl IdIndex {
    fn intern(&mut self, id: &str) -> u32 {
        let next = self.ids.len() as u32;
        *self.ids.entry(id.into()).or_insert(next)
    }
    fn get(&self, id: &str) -> Option<u32> {
        self.ids.get(id).copied()
    }
}

const NO_RIGHT: u32 = u32::MAX;

/// All reference labels of one predicate.
#[derive(Debug, Clone)]
pub struct LabelSet {
    /// The predicate these labels answer.
    pub info: PredicateInfo,
    /// Label-set id (`ls_…`).
    pub label_set_id: String,
    left: IdIndex,
    right: IdIndex,
    values: HashMap<(u32, u32), u16>,
}

impl LabelSet {
    /// An empty label set for `info`.
    pub fn new(info: PredicateInfo, label_set_id: impl Into<String>) -> Self {
        Self {
            info,
            label_set_id: label_set_id.into(),
            left: IdIndex::default(),
            right: IdIndex::default(),
            values: HashMap::new(),
        }
    }

    /// Number of labels held.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// True when no label is held.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Adds one label; a duplicate (left, right) or a value of the wrong kind is an error.
    pub fn insert(
        &mut self,
        left_id: &str,
        right_id: Option<&str>,
        value: LabelValue,
    ) -> Result<()> {
        let code = match (&value, self.info.kind) {
            (LabelValue::Bool(b), AiKind::Filter | AiKind::Join) => *b as u16,
            (LabelValue::Label(l), AiKind::Classify) => self
                .info
                .labels
                .iter()
                .position(|x| x == l)
                .ok_or_else(|| BenchError::Labels {
                    predicate: self.info.key.clone(),
                    message: format!("label {l:?} for id {left_id} is not one of its labels"),
                })? as u16,
            _ => {
                return Err(BenchError::Labels {
                    predicate: self.info.key.clone(),
                    message: format!(
                        "value {value:?} for id {left_id} has the wrong kind (a {:?} predicate)",
                        self.info.kind
                    ),
                });
            }
        };
        let l = self.left.intern(left_id);
        let r = match right_id {
            Some(r) => self.right.intern(r),
            None => NO_RIGHT,
        };
        if self.values.insert((l, r), code).is_some() {
            return Err(BenchError::Labels {
                predicate: self.info.key.clone(),
                message: format!(
                    "duplicate label for ({left_id}, {})",
                    right_id.unwrap_or("null")
                ),
            });
        }
        Ok(())
    }

    fn code(&self, left_id: &str, right_id: Option<&str>) -> Option<u16> {
        let l = self.left.get(left_id)?;
        let r = match right_id {
            Some(r) => self.right.get(r)?,
            None => NO_RIGHT,
        };
        self.values.get(&(l, r)).copied()
    }

    /// The TRUE/FALSE label of a document or pair, `None` when absent.
    pub fn get_bool(&self, left_id: &str, right_id: Option<&str>) -> Option<bool> {
        self.code(left_id, right_id).map(|c| c != 0)
    }

    /// The classification label of a document or pair, `None` when absent.
    pub fn get_label(&self, left_id: &str, right_id: Option<&str>) -> Option<&str> {
        self.code(left_id, right_id)
            .map(|c| self.info.labels[c as usize].as_str())
    }

    /// The TRUE/FALSE label, or an error naming the predicate and ids.
    pub fn require_bool(
        &self,
        left_id: &str,
        right_id: Option<&str>,
    ) -> aisql_engine::Result<bool> {
        self.get_bool(left_id, right_id)
            .ok_or_else(|| self.missing(left_id, right_id))
    }

    /// The classification label, or an error naming the predicate and ids.
    pub fn require_label(
        &self,
        left_id: &str,
        right_id: Option<&str>,
    ) -> aisql_engine::Result<&str> {
        self.get_label(left_id, right_id)
            .ok_or_else(|| self.missing(left_id, right_id))
    }

    fn missing(&self, left_id: &str, right_id: Option<&str>) -> EngineError {
        use aisql_engine::inference::prompt::Excerpt;
        EngineError::NoAnswer(format!(
            "predicate {} has no label for ({}, {})",
            self.info.key,
            Excerpt(left_id),
            right_id.map_or_else(|| "null".to_string(), |id| Excerpt(id).to_string())
        ))
    }
}

/// The label sets of one collection, found by template.
#[derive(Debug, Clone, Default)]
pub struct LabelStore {
    /// Collection id (`gt_…`, or a stand-in id).
    pub collection_id: String,
    /// The model that produced the labels.
    pub reference_model: String,
    by_template: HashMap<String, Arc<LabelSet>>,
}

impl LabelStore {
    /// An empty store for a collection.
    pub fn new(collection_id: impl Into<String>, reference_model: impl Into<String>) -> Self {
        Self {
            collection_id: collection_id.into(),
            reference_model: reference_model.into(),
            by_template: HashMap::new(),
        }
    }

    /// Adds a label set; two sets with one template are an error (a template
    /// identifies its predicate).
    pub fn insert(&mut self, set: LabelSet) -> Result<()> {
        let template = set.info.template.clone();
        if let Some(old) = self.by_template.get(&template) {
            return Err(BenchError::Labels {
                predicate: set.info.key.clone(),
                message: format!("shares its template with predicate {}", old.info.key),
            });
        }
        self.by_template.insert(template, Arc::new(set));
        Ok(())
    }

    /// The label set of a template, if the collection has one.
    pub fn for_template(&self, template: &str) -> Option<&Arc<LabelSet>> {
        self.by_template.get(template)
    }

    /// The label set of a template, or an error naming the operator.
    pub fn require_template(
        &self,
        template: &str,
        operator: &str,
    ) -> aisql_engine::Result<&Arc<LabelSet>> {
        self.for_template(template).ok_or_else(|| {
            EngineError::NoAnswer(format!(
                "collection {} has no label set for the template of {operator} ({})",
                self.collection_id,
                aisql_engine::inference::prompt::shorten(template, 60)
            ))
        })
    }

    /// Every label set held.
    pub fn sets(&self) -> impl Iterator<Item = &Arc<LabelSet>> {
        self.by_template.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(kind: AiKind, labels: &[&str]) -> PredicateInfo {
        PredicateInfo {
            key: "k".into(),
            kind,
            template: "t {0}".into(),
            left_table: "reviews".into(),
            left_column: "body".into(),
            right_table: None,
            right_column: None,
            labels: labels.iter().map(|s| s.to_string()).collect(),
            descriptions: labels.iter().map(|_| String::new()).collect(),
        }
    }

    #[test]
    fn bool_labels_round_trip_and_missing_is_named() {
        let mut set = LabelSet::new(info(AiKind::Join, &[]), "ls_1");
        set.insert("rv0", Some("as1"), LabelValue::Bool(true))
            .unwrap();
        set.insert("rv0", Some("as2"), LabelValue::Bool(false))
            .unwrap();
        assert_eq!(set.get_bool("rv0", Some("as1")), Some(true));
        assert_eq!(set.get_bool("rv0", Some("as2")), Some(false));
        let err = set
            .require_bool("rv9", Some("as1"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("rv9") && err.contains('k'), "{err}");
        assert!(
            set.insert("rv0", Some("as1"), LabelValue::Bool(false))
                .is_err()
        );
    }

    #[test]
    fn classification_labels_must_be_listed() {
        let mut set = LabelSet::new(info(AiKind::Classify, &["a", "b"]), "ls_2");
        set.insert("x", None, LabelValue::Label("b".into()))
            .unwrap();
        assert_eq!(set.get_label("x", None), Some("b"));
        assert!(
            set.insert("y", None, LabelValue::Label("c".into()))
                .is_err()
        );
        assert!(set.insert("y", None, LabelValue::Bool(true)).is_err());
    }
}
