//! `ai_filter` over one document: TRUE/FALSE, one next-token decision
//! (SPEC §B.5).

use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::datatypes::DataType;

use super::{AnswerKind, ModelReading, SampleSoFar, TableColumn};
use crate::error::Result;
use crate::inference::call::{AiCall, Answer};
use crate::inference::prompt::{PromptFormat, PromptPieces, filter_pieces, join_pieces};

/// See the module header.
#[derive(Debug)]
pub struct Filter;

impl AnswerKind for Filter {
    fn name(&self) -> &'static str {
        "filter"
    }

    fn is_decision(&self) -> bool {
        true
    }

    fn documents(&self) -> Option<usize> {
        Some(1)
    }

    fn return_type(&self, _fields: &[String], _size: u32) -> DataType {
        DataType::Boolean
    }

    fn fits(&self, answer: &Answer, _labels: &[String], _size: u32) -> bool {
        matches!(answer, Answer::Bool(_))
    }

    fn cache_code(&self) -> u8 {
        b'f'
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

    /// Error diffusion: drawn decisions come out TRUE at the selectivity's
    /// exact rate, not by independent draws whose own noise would add to the
    /// sample's.
    fn drawn(&self, _call: &AiCall, sample: SampleSoFar<'_>, u: f64) -> Answer {
        let p = sample.selectivity;
        // The first owed fraction is the question's own draw.
        let owed = sample.carry.get_or_insert(u);
        *owed += p;
        Answer::Bool(if *owed >= 1.0 {
            *owed -= 1.0;
            true
        } else {
            false
        })
    }

    /// TRUE for 45 % of hashes.
    fn hashed(&self, _call: &AiCall, h: u64) -> Answer {
        Answer::Bool(h % 100 < 45)
    }
}
