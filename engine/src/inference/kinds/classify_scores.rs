//! `ai_classify_scores`: one probability per label, the softmax of the
//! labels' summed log-probabilities, from the pass a classification reads.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, Float64Builder, ListBuilder, StringBuilder, StructBuilder,
};
use datafusion::arrow::datatypes::{DataType, Field};

use super::{AnswerKind, ModelReading, SampleSoFar, wrong};
use crate::error::Result;
use crate::inference::call::{AiCall, Answer, label_score_fields};
use crate::inference::prompt::{PromptFormat, PromptPieces};

/// See the module header.
#[derive(Debug)]
pub struct ClassifyScores;

/// The probability of each label: the softmax of their summed
/// log-probabilities (`ai_classify_scores`), in f64.
pub fn label_probabilities(scores: &[f32]) -> Box<[f64]> {
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let exp: Vec<f64> = scores.iter().map(|&s| (s as f64 - max).exp()).collect();
    let sum: f64 = exp.iter().sum();
    exp.iter().map(|e| e / sum).collect()
}

impl AnswerKind for ClassifyScores {
    fn name(&self) -> &'static str {
        "classify_scores"
    }

    fn has_labels(&self) -> bool {
        true
    }

    /// A list of `{label, probability}` in label order.
    fn return_type(&self, _fields: &[String], _size: u32) -> DataType {
        DataType::List(Arc::new(Field::new(
            "item",
            DataType::Struct(label_score_fields()),
            true,
        )))
    }

    fn fits(&self, answer: &Answer, labels: &[String], _size: u32) -> bool {
        matches!(answer, Answer::LabelScores(p)
            if p.len() == labels.len() && p.iter().all(|p| (0.0..=1.0).contains(p)))
    }

    fn cache_code(&self) -> u8 {
        b'p'
    }

    fn answer_column(&self) -> &'static str {
        "scores"
    }

    fn projection_node(&self) -> &'static str {
        "AiClassifyScores"
    }

    /// The classification's prompt.
    fn pieces(
        &self,
        format: PromptFormat,
        template: &str,
        pair: bool,
        labels: &[String],
        descriptions: &[String],
    ) -> Result<PromptPieces> {
        super::classify::label_pieces(format, template, pair, labels, descriptions)
    }

    fn column(
        &self,
        labels: &[String],
        _size: u32,
        answers: &[Option<&Answer>],
    ) -> Result<ArrayRef> {
        let fields = label_score_fields();
        let mut b = ListBuilder::new(StructBuilder::new(
            fields.clone(),
            vec![
                Box::new(StringBuilder::new()),
                Box::new(Float64Builder::new()),
            ],
        ))
        .with_field(Arc::new(Field::new("item", DataType::Struct(fields), true)));
        for a in answers {
            match a {
                None => b.append_null(),
                Some(Answer::LabelScores(p)) if p.len() == labels.len() => {
                    let entries = b.values();
                    for (label, p) in labels.iter().zip(p.iter()) {
                        entries
                            .field_builder::<StringBuilder>(0)
                            .expect("label field")
                            .append_value(label);
                        entries
                            .field_builder::<Float64Builder>(1)
                            .expect("probability field")
                            .append_value(*p);
                        entries.append(true);
                    }
                    b.append(true);
                }
                Some(other) => return Err(wrong(self, other)),
            }
        }
        Ok(Arc::new(b.finish()))
    }

    fn reading(&self) -> ModelReading {
        ModelReading::Labels(|scores| Answer::LabelScores(label_probabilities(scores)))
    }

    /// One of the sample's answers, else every label alike.
    fn drawn(&self, call: &AiCall, sample: SampleSoFar<'_>, u: f64) -> Answer {
        sample.example(u).unwrap_or_else(|| {
            let n = call.labels.len().max(1);
            Answer::LabelScores(vec![1.0 / n as f64; call.labels.len()].into())
        })
    }

    /// Half the probability on the label the hash picks.
    fn hashed(&self, call: &AiCall, h: u64) -> Answer {
        let n = call.labels.len().max(1) as u64;
        let chosen = (h % n) as usize;
        let rest = 0.5 / (n as f64 - 1.0).max(1.0);
        Answer::LabelScores(
            (0..n as usize)
                .map(|j| if j == chosen { 0.5 } else { rest })
                .collect(),
        )
    }
}
