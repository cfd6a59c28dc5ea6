//! `ai_complete` (and each round of `ai_agg`): text decoded greedily until
//! the end of sequence or `max_tokens`; `ai_generate`, the same decoded in
//! the grammar of the call's one label, a field type (`INT`, `DATE`, ...),
//! and read as a value of it.

use std::sync::Arc;

use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::datatypes::DataType;

use super::extract::kept_declarations;
use super::{AnswerKind, ModelReading, SampleSoFar, TableColumn, hash_words, wrong};
use crate::error::{EngineError, Result};
use crate::inference::call::{AiCall, Answer};
use crate::inference::field_type::{FieldDecl, FieldType};
use crate::inference::prompt::{PromptFormat, PromptPieces, complete_pieces, pair_complete_pieces};

/// See the module header.
#[derive(Debug)]
pub struct Complete;

impl AnswerKind for Complete {
    fn name(&self) -> &'static str {
        "complete"
    }

    fn generates(&self) -> bool {
        true
    }

    fn return_type(&self, fields: &[String], _size: u32) -> DataType {
        answer_type(fields).data_type()
    }

    fn fits(&self, answer: &Answer, labels: &[String], _size: u32) -> bool {
        matches!(answer, Answer::Text(t) if answer_type(labels).accepts(t))
    }

    fn cache_code(&self) -> u8 {
        b'g'
    }

    fn answer_column(&self) -> &'static str {
        "text"
    }

    fn projection_node(&self) -> &'static str {
        "AiComplete"
    }

    fn pieces(
        &self,
        format: PromptFormat,
        template: &str,
        pair: bool,
        _labels: &[String],
        _descriptions: &[String],
    ) -> Result<PromptPieces> {
        if pair {
            Ok(pair_complete_pieces(format, template))
        } else {
            complete_pieces(format, template)
        }
    }

    fn column(
        &self,
        labels: &[String],
        _size: u32,
        answers: &[Option<&Answer>],
    ) -> Result<ArrayRef> {
        let texts = answers
            .iter()
            .map(|a| match a {
                None => Ok(None),
                Some(Answer::Text(t)) => Ok(Some(&**t)),
                Some(other) => Err(wrong(self, other)),
            })
            .collect::<Result<Vec<Option<&str>>>>()?;
        answer_type(labels)
            .column(&texts)
            .map_err(|e| EngineError::Inference(format!("a generated answer: {e}")))
    }

    fn read_column(
        &self,
        column: &TableColumn<'_>,
        _labels: &mut Vec<String>,
    ) -> std::result::Result<Vec<Answer>, String> {
        Ok(column
            .strings("text")?
            .into_iter()
            .map(|t| Answer::Text(t.into()))
            .collect())
    }

    fn reading(&self) -> ModelReading {
        ModelReading::Text
    }

    /// Empty (no sample can say where a text would end), or a value of the
    /// call's type.
    fn drawn(&self, call: &AiCall, _sample: SampleSoFar<'_>, u: f64) -> Answer {
        let h = (u * 2f64.powi(53)) as u64;
        Answer::Text(
            answer_type(&call.labels)
                .example(h)
                .unwrap_or_default()
                .into(),
        )
    }

    /// The prompt's hash in at most `max_tokens` words, or a value of the
    /// call's type named by it.
    fn hashed(&self, call: &AiCall, h: u64) -> Answer {
        match answer_type(&call.labels).example(h) {
            Some(value) => Answer::Text(value.into()),
            None => Answer::Text(hash_words(h, call.max_tokens)),
        }
    }
}

/// The type of a generating call's answers: its one label's (an
/// `ai_generate`), else text. Read once per label and kept with the fields
/// of extractions ([`kept_declarations`]): every answer's check asks for
/// it, and a struct's or a key set's spelling is long.
pub fn answer_type(labels: &[String]) -> AnswerType {
    AnswerType(matches!(labels, [_]).then(|| kept_declarations(labels, "answer ")))
}

/// A generating call's answer type (see [`answer_type`]): its one label's
/// declaration, or none (text).
pub struct AnswerType(Option<Arc<[FieldDecl]>>);

impl std::ops::Deref for AnswerType {
    type Target = FieldType;

    fn deref(&self) -> &FieldType {
        static TEXT: FieldType = FieldType::Text;
        // A label that is no declaration is one text field: never empty.
        self.0.as_ref().map_or(&TEXT, |d| &d[0].ty)
    }
}
