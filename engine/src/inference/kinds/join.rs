//! `ai_join`, and `ai_filter` over two documents: TRUE/FALSE about a pair.

use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::datatypes::DataType;

use super::{AnswerKind, ModelReading, SampleSoFar, TableColumn};
use crate::error::{EngineError, Result};
use crate::inference::call::{AiCall, Answer};
use crate::inference::prompt::{PromptFormat, PromptPieces, join_pieces, shorten};

/// See the module header.
#[derive(Debug)]
pub struct Join;

impl AnswerKind for Join {
    fn name(&self) -> &'static str {
        "join"
    }

    fn is_decision(&self) -> bool {
        true
    }

    fn documents(&self) -> Option<usize> {
        Some(2)
    }

    fn return_type(&self, _fields: &[String], _size: u32) -> DataType {
        DataType::Boolean
    }

    fn fits(&self, answer: &Answer, _labels: &[String], _size: u32) -> bool {
        matches!(answer, Answer::Bool(_))
    }

    fn cache_code(&self) -> u8 {
        b'j'
    }

    fn answer_column(&self) -> &'static str {
        "answer"
    }

    fn pieces(
        &self,
        format: PromptFormat,
        template: &str,
        pair: bool,
        _labels: &[String],
        _descriptions: &[String],
    ) -> Result<PromptPieces> {
        if !pair {
            return Err(EngineError::InvalidPlan(format!(
                "a join prompt needs two documents: {}",
                shorten(template, 60)
            )));
        }
        Ok(join_pieces(format, template))
    }

    fn column(
        &self,
        _labels: &[String],
        _size: u32,
        answers: &[Option<&Answer>],
    ) -> Result<ArrayRef> {
        super::decision_column(self, answers)
    }

    fn read_column(
        &self,
        column: &TableColumn<'_>,
        _labels: &mut Vec<String>,
    ) -> std::result::Result<Vec<Answer>, String> {
        super::read_decisions(column)
    }

    fn reading(&self) -> ModelReading {
        ModelReading::Decision(|answer, _| Answer::Bool(answer))
    }

    /// Each pair is drawn on its own: error diffusion over pairs that come
    /// anchor by anchor, partners always in one order, is periodic and hits
    /// the same few partners again and again (FEV-8's first join matched 42
    /// distinct passages where the labels match 225), and the distinct rows
    /// that match decide the next operator's questions.
    fn drawn(&self, _call: &AiCall, sample: SampleSoFar<'_>, u: f64) -> Answer {
        Answer::Bool(u < sample.selectivity)
    }

    /// TRUE for 45 % of hashes.
    fn hashed(&self, _call: &AiCall, h: u64) -> Answer {
        Answer::Bool(h % 100 < 45)
    }
}
