//! `ai_classify`: one label for a document or a pair, the best summed label
//! log-probability.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, StringBuilder};
use datafusion::arrow::datatypes::DataType;

use super::{AnswerKind, ModelReading, SampleSoFar, TableColumn, wrong};
use crate::error::{EngineError, Result};
use crate::inference::call::{AiCall, Answer};
use crate::inference::prompt::{PromptFormat, PromptPieces, classify_pieces, pair_classify_pieces};

/// See the module header.
#[derive(Debug)]
pub struct Classify;

/// Index of the best score; ties go to the earlier label (SPEC §B.5).
pub fn best_label(scores: &[f32]) -> usize {
    let mut best = 0;
    for (i, &s) in scores.iter().enumerate() {
        if s > scores[best] {
            best = i;
        }
    }
    best
}

/// A classification's or label probabilities' pieces: the classification
/// prompt over one document or a pair.
pub(super) fn label_pieces(
    format: PromptFormat,
    template: &str,
    pair: bool,
    labels: &[String],
    descriptions: &[String],
) -> Result<PromptPieces> {
    if pair {
        Ok(pair_classify_pieces(format, template, labels, descriptions))
    } else {
        classify_pieces(format, template, labels, descriptions)
    }
}

impl AnswerKind for Classify {
    fn name(&self) -> &'static str {
        "classify"
    }

    fn has_labels(&self) -> bool {
        true
    }

    fn return_type(&self, _fields: &[String], _size: u32) -> DataType {
        DataType::Utf8
    }

    fn fits(&self, answer: &Answer, labels: &[String], _size: u32) -> bool {
        matches!(answer, Answer::Label(i) if (*i as usize) < labels.len())
    }

    fn cache_code(&self) -> u8 {
        b'c'
    }

    fn answer_column(&self) -> &'static str {
        "label"
    }

    fn projection_node(&self) -> &'static str {
        "AiClassify"
    }

    fn pieces(
        &self,
        format: PromptFormat,
        template: &str,
        pair: bool,
        labels: &[String],
        descriptions: &[String],
    ) -> Result<PromptPieces> {
        label_pieces(format, template, pair, labels, descriptions)
    }

    fn column(
        &self,
        labels: &[String],
        _size: u32,
        answers: &[Option<&Answer>],
    ) -> Result<ArrayRef> {
        let mut b = StringBuilder::with_capacity(answers.len(), 0);
        for a in answers {
            match a {
                None => b.append_null(),
                Some(Answer::Label(i)) => {
                    b.append_value(labels.get(*i as usize).ok_or_else(|| {
                        EngineError::Inference(format!(
                            "label index {i} of {} labels",
                            labels.len()
                        ))
                    })?)
                }
                Some(other) => return Err(wrong(self, other)),
            }
        }
        Ok(Arc::new(b.finish()))
    }

    fn read_column(
        &self,
        column: &TableColumn<'_>,
        labels: &mut Vec<String>,
    ) -> std::result::Result<Vec<Answer>, String> {
        Ok(column
            .strings("label")?
            .into_iter()
            .map(|label| {
                let i = match labels.iter().position(|l| *l == label) {
                    Some(i) => i,
                    None => {
                        labels.push(label);
                        labels.len() - 1
                    }
                };
                Answer::Label(i as u32)
            })
            .collect())
    }

    fn reading(&self) -> ModelReading {
        ModelReading::Labels(|scores| Answer::Label(best_label(scores) as u32))
    }

    /// Each label's share of the sample, with half a question each.
    fn drawn(&self, call: &AiCall, sample: SampleSoFar<'_>, u: f64) -> Answer {
        let n = call.labels.len().max(1);
        let total = sample.label_counts.iter().sum::<usize>() as f64 + 0.5 * n as f64;
        let mut at = u * total;
        for i in 0..n {
            at -= sample.label_counts.get(i).copied().unwrap_or(0) as f64 + 0.5;
            if at < 0.0 {
                return Answer::Label(i as u32);
            }
        }
        Answer::Label((n - 1) as u32)
    }

    /// The hash modulo the labels.
    fn hashed(&self, call: &AiCall, h: u64) -> Answer {
        Answer::Label((h % call.labels.len().max(1) as u64) as u32)
    }
}
