//! `ai_complete` (and each round of `ai_agg`): text decoded greedily until
//! the end of sequence or `max_tokens`.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, StringBuilder};
use datafusion::arrow::datatypes::DataType;

use super::{AnswerKind, ModelReading, SampleSoFar, TableColumn, hash_words, wrong};
use crate::error::Result;
use crate::inference::call::{AiCall, Answer};
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

    fn return_type(&self, _fields: &[String], _size: u32) -> DataType {
        DataType::Utf8
    }

    fn fits(&self, answer: &Answer, _labels: &[String], _size: u32) -> bool {
        matches!(answer, Answer::Text(_))
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
        _labels: &[String],
        _size: u32,
        answers: &[Option<&Answer>],
    ) -> Result<ArrayRef> {
        let mut b = StringBuilder::with_capacity(answers.len(), 0);
        for a in answers {
            match a {
                None => b.append_null(),
                Some(Answer::Text(t)) => b.append_value(t),
                Some(other) => return Err(wrong(self, other)),
            }
        }
        Ok(Arc::new(b.finish()))
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

    /// Empty: no sample can say where a text would end.
    fn drawn(&self, _call: &AiCall, _sample: SampleSoFar<'_>, _u: f64) -> Answer {
        Answer::Text("".into())
    }

    /// The prompt's hash in at most `max_tokens` words.
    fn hashed(&self, call: &AiCall, h: u64) -> Answer {
        Answer::Text(hash_words(h, call.max_tokens))
    }
}
