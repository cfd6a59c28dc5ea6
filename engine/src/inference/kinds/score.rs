//! `ai_score`: P(TRUE) over the restricted TRUE/FALSE head, for a document or
//! a pair, read from the pass a filter's or join's decision reads.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, AsArray, Float64Array};
use datafusion::arrow::datatypes::{DataType, Float64Type};

use super::{AnswerKind, ModelReading, SampleSoFar, TableColumn, wrong};
use crate::error::Result;
use crate::inference::call::{AiCall, Answer};
use crate::inference::prompt::{PromptFormat, PromptPieces, filter_pieces, join_pieces};

/// See the module header.
#[derive(Debug)]
pub struct Score;

impl AnswerKind for Score {
    fn name(&self) -> &'static str {
        "score"
    }

    fn return_type(&self, _fields: &[String], _size: u32) -> DataType {
        DataType::Float64
    }

    fn fits(&self, answer: &Answer, _labels: &[String], _size: u32) -> bool {
        matches!(answer, Answer::Score(p) if (0.0..=1.0).contains(p))
    }

    fn cache_code(&self) -> u8 {
        b's'
    }

    fn answer_column(&self) -> &'static str {
        "score"
    }

    fn projection_node(&self) -> &'static str {
        "AiScore"
    }

    /// A score asks its filter's or join's prompt.
    fn pieces(
        &self,
        format: PromptFormat,
        template: &str,
        pair: bool,
        _labels: &[String],
        _descriptions: &[String],
    ) -> Result<PromptPieces> {
        if pair {
            Ok(join_pieces(format, template))
        } else {
            filter_pieces(format, template)
        }
    }

    fn column(
        &self,
        _labels: &[String],
        _size: u32,
        answers: &[Option<&Answer>],
    ) -> Result<ArrayRef> {
        Ok(Arc::new(
            answers
                .iter()
                .map(|a| {
                    a.map(|a| match a {
                        Answer::Score(p) => Ok(*p),
                        other => Err(wrong(self, other)),
                    })
                    .transpose()
                })
                .collect::<Result<Float64Array>>()?,
        ))
    }

    fn read_column(
        &self,
        column: &TableColumn<'_>,
        _labels: &mut Vec<String>,
    ) -> std::result::Result<Vec<Answer>, String> {
        column.no_nulls()?;
        let col = column
            .array
            .as_primitive_opt::<Float64Type>()
            .ok_or_else(|| format!("score column is {}, not float64", column.array.data_type()))?;
        Ok(col.values().iter().map(|&p| Answer::Score(p)).collect())
    }

    fn reading(&self) -> ModelReading {
        ModelReading::Decision(|_, p_true| Answer::Score(p_true))
    }

    /// One of the sample's scores, else one half.
    fn drawn(&self, _call: &AiCall, sample: SampleSoFar<'_>, u: f64) -> Answer {
        sample.example(u).unwrap_or(Answer::Score(0.5))
    }

    /// The hash as a fraction, so that `score > 0.55` ⇔ the decision of the
    /// same prompt (as a model's P(TRUE) > 0.5 ⇔ its decision).
    fn hashed(&self, _call: &AiCall, h: u64) -> Answer {
        Answer::Score(1.0 - (h % 100) as f64 / 99.0)
    }
}
